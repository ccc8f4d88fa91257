"""MIG slices in a scheduling pass: free slices of one profile now, else new ones cut for the queue.

Theory of operation
-------------------
``--gpus 1g.10gb:2`` (``mig_profile``) wants that many slices of the profile on one node.
Free slices go first, packed onto the busiest GPUs (so idle GPUs stay whole for big slices).

Re-layout (``dynamic`` MIG GPUs).  A slice job that finds no free slice asks for new
ones, in priority order.  First the new slices are placed in unused memory slots
(``gpud.gpu.mig.place`` beside every existing slice: nothing is destroyed, always
allowed).  Else, once ``[scheduler] mig_min_interval`` has passed since the GPU's last
re-layout, free slices in the way are destroyed: the new slices are placed beside the
slices in use only, and exactly the free slices they overlap (and, rarely, a few more
to respect compute and count limits) go.  A slice in use is never destroyed.  The
re-layout also cuts slices for the rest of the queue's demand that fits beside it
(``layouts_for_demand``: most demand served, least memory used), less what free slices
elsewhere already cover.  The job waits with reason ``MigReconfig``, as does every later
job a slice of that re-layout is meant for; the GPU takes no other start in the pass.
Among GPUs that can serve, the one that destroys nothing wins, then the busiest, then node
and GPU order.  A ``--gpu-mem`` job may have a slice cut the same way (``new_slice_for``,
used by gpud/sched/shares.py).

Waiting.  A slice job that cannot start claims (gpud/sched/shared.py) the GPU where its
slices come earliest, from running jobs' time limits and the minimum interval, with the
memory slots they would take: lower jobs may still use the GPU's other slots.  So a stream
of small slices does not starve a ``7g.80gb``.

Scale.  A big queue repeats a few requests many times and a big cluster has few distinct
GPU states, so a pass keeps what it learns: per kind of request (``Request``) its GPUs,
that no free slice of its profile is left, that no re-layout serves it; free slices per
profile busiest first (``FreeSlices``); re-layout options per GPU state (relayout.py);
earliest times per GPU state; and a waiting request's earliest GPU while that GPU is
unchanged (a GPU's earliest time only gets later in a pass).  Each must give the plan the
plain computation gives: tests/test_sched_sharing_fastpath.py holds them to it.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from ..gpu import mig
from .gpustate import Claim, GpuState, catalog, layouts_for_demand, place, profile_for_memory
from .plan import Relayout
from .relayout import LayoutIndex, Option, interval_end, option_now
from .shared import INF, Decision, NodeOk, SharedGpus, slice_device
from .snapshot import PendingJob


class FreeSlices:
    """The MIG GPUs with free slices, per profile, busiest first (then node and GPU order):
    where a job asking for one slice starts (the first one allowed, lowest start first)."""

    def __init__(self, pool: SharedGpus) -> None:
        self.by_profile: dict[str, list[tuple[int, int, int, GpuState]]] = {}
        self._filed: dict[GpuState, tuple[tuple[int, int, int], set[str]]] = {}
        self._starts: dict[GpuState, dict[str, list[int]]] = {}      # profile -> its slices' starts, in order
        of_layout: dict[tuple, dict[str, list[int]]] = {}
        for g in pool.gpus:
            if g.view.mode == "mig" and g.layout_ok:
                starts = of_layout.get(g.layout_key)
                if starts is None:
                    starts = of_layout[g.layout_key] = {}
                    for start, profile in g.layout_key:
                        starts.setdefault(profile, []).append(start)
                self._starts[g] = starts
                self._file(g, append=True)
        for filed in self.by_profile.values():
            filed.sort(key=lambda e: e[:3])

    def touch(self, g: GpuState) -> None:
        """``g`` changed (a slice taken, a re-layout planned): file it again."""
        starts = self._starts.get(g)
        if starts is None:
            return
        old = self._filed.pop(g, None)
        if old is not None:
            key, profiles = old
            for p in profiles:
                filed = self.by_profile[p]
                del filed[bisect.bisect_left(filed, key)]
        self._file(g)

    def _file(self, g: GpuState, append: bool = False) -> None:
        if g.busy:
            return
        starts = self._starts[g]
        profiles = {p for p, ss in starts.items() if any(s not in g.used for s in ss)}
        key = (-g.used_compute(), g.node, g.index)
        for p in profiles:
            filed = self.by_profile.setdefault(p, [])
            if append:
                filed.append(key + (g,))
            else:
                bisect.insort(filed, key + (g,), key=lambda e: e[:3])
        self._filed[g] = (key, profiles)

    def first(self, p: str, job_id: int, end: float, usable: frozenset[GpuState],
              node_ok: NodeOk) -> tuple[GpuState, mig.Slice] | None:
        """The free ``p`` slice a job ending at ``end`` may take now: on the busiest GPU in
        ``usable`` (then node, GPU order) whose node passes ``node_ok``, lowest start first."""
        for _, node, _, g in self.by_profile.get(p, ()):
            if g not in usable or not node_ok(node, ()):
                continue
            for start in self._starts[g][p]:
                if start not in g.used:
                    s = g.slices[start]
                    if g.allowed(job_id, end, g.mask(s)):
                        return g, s
        return None


@dataclass(eq=False)
class Request:
    """What a pass has learnt of one kind of slice request: a profile, a count, a partition,
    a GPU type, CPUs and memory (the queue repeats a few of these many times)."""

    profile: str
    count: int
    cands: list[GpuState]                  # the MIG GPUs it may use
    usable: frozenset[GpuState]
    later: tuple                           # its key in Slices._later
    reason: str                            # while it waits: MigReconfig if one of them is being re-laid
    free_gone: bool = False                # no free slice of its profile on them, claims aside
    no_relayout: bool = False              # no re-layout can serve it (only ever stays so in a pass)


class Slices:
    """The MIG half of a pass's fractional requests (see the module docstring)."""

    def __init__(self, pool: SharedGpus, queue: Sequence[PendingJob]) -> None:
        self.pool, self.cluster, self.now, self.cfg = pool, pool.cluster, pool.now, pool.cfg
        self._later: dict[tuple, int] = {}         # (profile, partition, gpu_type) -> slices wanted
        # Pruning, by request.  Within a pass free slices only go and claims only come, so what
        # found nothing once finds nothing again.
        self._requests: dict[tuple, Request] = {}
        self._failed: set[tuple[Request, float]] = set()   # (request, end): nothing to start now
        self._reconf: dict[int, bool] = {}         # id of a candidate list (kept by the pool) -> any in flight
        self._earliest: dict[tuple, tuple[GpuState | None, int]] = {}   # see _earliest_gpu
        self._earliest_of: dict[tuple, tuple[float, int]] = {}          # GPU state -> _earliest_slices_now
        self._free_of: dict[tuple, list[tuple[GpuState, mig.Slice]]] = {}
        self._spares: dict[str, Counter] = {}
        self.cut: list[GpuState] = []              # GPUs re-laid in this pass
        # profile -> the re-laid GPUs still bringing slices of it no job has taken, in cut order
        self.incoming: dict[str, list[GpuState]] = {}
        self._incoming_total: dict[str, Counter] = {}   # model -> what all of those bring
        self.layouts = LayoutIndex(pool, self.cfg.mig_min_interval)   # where one new slice goes
        self._free = FreeSlices(pool)                                  # where one free slice is
        changed = self._changed
        for g in pool.gpus:
            if g.view.mode == "mig":
                g.on_change = changed
        self.expect(queue)

    def _changed(self, g: GpuState) -> None:
        self.layouts.touch(g)
        self._free.touch(g)

    def expect(self, queue: Sequence[PendingJob]) -> None:
        """The eligible slice jobs of the pass, for the demand a re-layout also serves."""
        later = self._later
        for j in queue:
            if j.mig_profile and not j.held and not j.blocked_reason:
                key = (j.mig_profile, j.partition, j.gpu_type)
                later[key] = later.get(key, 0) + (j.gpus if j.gpus > 1 else 1)

    def _request(self, job: PendingJob, k: int) -> Request:
        key = (job.mig_profile, k, job.partition, job.gpu_type, job.cpus, job.mem_mb)
        r = self._requests.get(key)
        if r is None:
            assert job.mig_profile is not None
            cands = self.pool.candidates(job, ("mig",))
            r = self._requests[key] = Request(
                job.mig_profile, k, cands, self.pool.candidate_set(job, ("mig",)),
                (job.mig_profile, job.partition, job.gpu_type),
                "MigReconfig" if self._reconfiguring(cands) else "Resources")
        return r

    # -- one job --------------------------------------------------------------------------------

    def consider(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        k = job.gpus if job.gpus > 1 else 1
        r = self._request(job, k)
        p, cands = r.profile, r.cands
        left = self._later.get(r.later, 0)         # the demand still to come, for re-layouts
        if left > 0:
            self._later[r.later] = max(0, left - k)
        # 1. free slices now, packed onto the busiest GPUs
        if not r.free_gone and (r, end) not in self._failed:
            chosen = self._free_now(job, p, k, end, node_ok, cands, r.usable)
            if chosen:
                for g, s in chosen:
                    g.take(s.start, end)
                return Decision(node=chosen[0][0].node, devices=tuple(slice_device(g, s) for g, s in chosen))
            self._failed.add((r, end))
            r.free_gone = not self._free_slices(p, cands)
        # 2. a slice already being cut in this pass
        if p in self.incoming:
            g = self._bringing(job, p, k, r.usable)
            if g is not None:
                self.take_incoming(g, p, k)
                return Decision(reason="MigReconfig")
        # 3. cut new slices
        if not r.no_relayout:
            d = self._relayout_for(job, p, k, cands, end)
            if d is not None:
                return d
            r.no_relayout = True
        # 4. wait
        if not may_claim:                  # past backfill_depth: the reason only
            return Decision(reason=r.reason)
        return self._wait_for_slices(job, p, k, cands, r.reason)

    def _free_now(self, job: PendingJob, p: str, k: int, end: float, node_ok: NodeOk, cands: list[GpuState],
                  usable: frozenset[GpuState]) -> list[tuple[GpuState, mig.Slice]]:
        """The free slices the job may take now: ``k`` of ``p`` on one node, on its busiest
        GPUs.  One slice (nearly every job) is the first the FreeSlices index allows."""
        if k == 1:
            found = self._free.first(p, job.job_id, end, usable, node_ok)
            return [] if found is None else [found]
        return self._free_on_a_node(job, p, k, end, node_ok, cands)

    def _free_on_a_node(self, job: PendingJob, p: str, k: int, end: float, node_ok: NodeOk,
                        cands: list[GpuState]) -> list[tuple[GpuState, mig.Slice]]:
        """``_free_now`` from every free slice: per node the allowed ones, busiest GPU first;
        the node whose busiest such GPU is busiest wins (then node order)."""
        by_node: dict[int, list[tuple[tuple, GpuState, mig.Slice]]] = {}
        for g, s in self._free_slices(p, cands):
            if g.allowed(job.job_id, end, g.mask(s)):
                by_node.setdefault(g.node, []).append(((-g.used_compute(), g.index, s.start), g, s))
        best = None
        for i, free in sorted(by_node.items()):
            if len(free) >= k and node_ok(i, ()):
                free.sort(key=lambda t: t[0])
                key = (free[0][0][0], i)
                if best is None or key < best[0]:
                    best = (key, i, free[:k])
        return [] if best is None else [(g, s) for _, g, s in best[2]]

    def _bringing(self, job: PendingJob, p: str, k: int, usable: frozenset[GpuState]) -> GpuState | None:
        """The first GPU re-laid in this pass (in the order they were) bringing ``k`` slices
        of ``p`` no job has taken yet, that the job may use."""
        for g in self.incoming.get(p, ()):
            if g.incoming[p] >= k and g in usable and self.pool.node_fits(g.node, job):
                return g
        return None

    def _free_slices(self, p: str, cands: list[GpuState]) -> list[tuple[GpuState, mig.Slice]]:
        """The free slices of profile ``p`` on GPUs in ``cands`` that take starts now.  Kept
        per pass and pruned as they are taken (slices only ever get taken in a pass)."""
        key = (p, id(cands))
        free = self._free_of.get(key)
        if free is None:
            free = [(g, s) for g in cands for s in g.slices.values() if s.profile == p]
        free = self._free_of[key] = [(g, s) for g, s in free if not g.busy and s.start not in g.used]
        return free

    # -- re-layouts -----------------------------------------------------------------------------

    def option(self, g: GpuState, profiles: list[str], job_id: int, destroying: bool,
               keep: frozenset[int] = frozenset()) -> Option | None:
        """New slices for ``profiles`` on ``g``: in unused slots, or with ``destroying`` (and
        past the minimum interval) in place of free slices; never touching a slice in use or
        in ``keep`` (free slices the job itself will take)."""
        if g.busy or not g.view.dynamic or not g.layout_ok or not g.allowed(job_id, INF):
            return None
        if g.view.relayout_after is not None and g.view.relayout_after > self.now:
            return None           # the worker refused the last one: backing off
        key = ("option", tuple(profiles), destroying, keep, len(g.used))
        if key not in g.memo:
            g.memo[key] = option_now(g, profiles, destroying, keep, self._interval_end(g) <= self.now)
        return g.memo[key]

    def _interval_end(self, g: GpuState) -> float:
        return interval_end(g, self.cfg.mig_min_interval)

    def _relayout_for(self, job: PendingJob, p: str, k: int, cands: list[GpuState], end: float) -> Decision | None:
        if k == 1:           # one slice: the node's free ones do not matter, GPUs compete alone
            found = self._new_slice(job, lambda model: p)
            return None if found is None else Decision(reason="MigReconfig", relayouts=(self.commit(found[0], job),))
        by_node: dict[int, list[GpuState]] = {}
        for g in cands:
            if g.view.dynamic and not g.busy:
                by_node.setdefault(g.node, []).append(g)
        usable = self.pool.candidate_set(job, ("mig",))    # not a node's GPUs of another model
        # Nodes whose busiest dynamic GPU is busiest first: with nothing to destroy, the first
        # node that can cut the slices is the answer; destroying, the fewest slices win.
        order = sorted(by_node, key=lambda i: (-max(g.used_compute() for g in by_node[i]), i))
        best: tuple[tuple, int, list[Option], dict[int, frozenset[int]]] | None = None
        for destroying in (False, True):
            for i in order:
                if not self.pool.node_ok_later(i, job):
                    continue
                found = self._node_option(job, p, k, end, [g for g in self.pool.on_node[i] if g in usable],
                                          destroying)
                if found is None:
                    continue
                opts, mine = found
                key = (sum(len(o.destroy) for o in opts), -sum(o.gpu.used_compute() for o in opts), i)
                if best is None or key < best[0]:
                    best = (key, i, opts, mine)
                if not destroying:
                    break
            if best is not None:
                break
        if best is None:
            return None
        _, i, opts, mine = best
        # the job's existing free slices on that node stay for it until the new ones are made
        for g in self.pool.on_node.get(i, ()):
            for start in mine.get(g.index, ()):
                g.take(start, end)
        return Decision(reason="MigReconfig", relayouts=tuple(self.commit(o, job) for o in opts))

    def _node_option(self, job: PendingJob, p: str, k: int, end: float, gs: list[GpuState],
                     destroying: bool) -> tuple[list[Option], dict[int, frozenset[int]]] | None:
        """Re-layouts on one node's dynamic GPUs that give ``k`` slices of ``p`` together with
        the free ones it has (which the job keeps), or None."""
        mine = {g.index: frozenset(s.start for s in g.slices.values() if not g.busy and s.profile == p
                                   and s.start not in g.used and g.allowed(job.job_id, end, g.mask(s)))
                for g in gs if g.view.mode == "mig"}
        need = k - sum(len(v) for v in mine.values())
        if need <= 0:
            return None       # enough free slices, held back only by this instant's veto
        opts: list[Option] = []
        for g in sorted(gs, key=lambda g: (-g.used_compute(), g.index)):
            if g.view.mode != "mig":
                continue
            for n in range(need, 0, -1):
                o = self.option(g, [p] * n, job.job_id, destroying, mine[g.index])
                if o is not None:
                    opts.append(o)
                    need -= n
                    break
            if need <= 0:
                return opts, mine
        return None

    def new_slice_for(self, job: PendingJob, want: int) -> tuple[Option, str] | None:
        """The re-layout that would cut the smallest slice holding ``want`` MiB (for a
        ``--gpu-mem`` job): on the busiest dynamic GPU where nothing need be destroyed, else
        where the fewest are."""
        return self._new_slice(job, lambda model: profile_for_memory(model, want))

    def _new_slice(self, job: PendingJob, profile_of: Callable[[str], str | None]) -> tuple[Option, str] | None:
        """The re-layout cutting one slice of ``profile_of(model)`` for the job (LayoutIndex.best)."""
        return self.layouts.best(job, self.pool.candidate_set(job, ("mig",)), profile_of)

    def commit(self, o: Option, job: PendingJob, profile: str | None = None) -> Relayout:
        """Record a re-layout (and the queue's other demand it can serve) on its GPU."""
        g = o.gpu
        gone = {s.start for s in o.destroy}
        layout = [s for s in g.slices.values() if s.start not in gone] + list(o.create)
        extra = self._extra_demand(g, job)
        more: list[mig.Slice] = []
        if extra:
            more = layouts_for_demand(g.model, extra, layout)
        total = self._incoming_total.setdefault(g.model, Counter())
        for s in more:
            if not g.incoming.get(s.profile):
                self.incoming.setdefault(s.profile, []).append(g)
            g.incoming[s.profile] = g.incoming.get(s.profile, 0) + 1
            total[s.profile] += 1
        g.set_busy()
        self.cut.append(g)
        create = tuple(sorted(list(o.create) + more, key=lambda s: (s.start, s.profile)))
        what = ", ".join([f"{s.profile}@{s.start}" for s in create])      # str(Slice), inlined
        return Relayout(node=self.cluster.nodes[g.node].name, gpu=g.index,
                        destroy=tuple(s.start for s in o.destroy), create=create,
                        reason=f"job {job.job_id} needs {profile or job.mig_profile}; cut {what}")

    def _extra_demand(self, g: GpuState, job: PendingJob) -> dict[str, int]:
        """Slices later jobs that could use ``g`` want, less what free slices already cover."""
        cat = catalog(g.model)
        want: dict[str, int] = {}
        for (p, part, gtype), n in self._later.items():
            if n > 0 and p in cat and g.node in self.pool.members(part) and (gtype is None or gtype == g.model):
                want[p] = want.get(p, 0) + n
        if not want:
            return {}
        spare = self._spare(g.model)
        brought = self._brought(g.model)           # slices other re-layouts of this pass bring
        extra = {}
        for p, n in want.items():
            n -= spare.get(p, 0) + brought.get(p, 0)
            if n > 0:
                extra[p] = n
        return extra

    def _brought(self, model: str) -> Counter:
        """The slices the re-layouts of this pass on ``model``'s GPUs bring, not yet promised."""
        return self._incoming_total.get(model, Counter())

    def take_incoming(self, g: GpuState, p: str, n: int) -> None:
        """A waiting job is promised ``n`` of the ``p`` slices ``g``'s re-layout brings."""
        g.incoming[p] -= n
        self._incoming_total[g.model][p] -= n
        if not g.incoming[p]:
            self.incoming[p].remove(g)

    def _spare(self, model: str) -> Counter:
        """Free slices on ``model``'s GPUs as of the first ask in the pass.  They only get
        fewer as the pass goes on, so a re-layout never cuts more than the queue needs."""
        spare = self._spares.get(model)
        if spare is None:
            spare = self._spares[model] = Counter()
            for h in self.pool.gpus:
                if h.view.mode == "mig" and h.model == model and not h.busy:
                    spare.update(s.profile for s in h.slices.values() if s.start not in h.used)
        return spare

    # -- waiting --------------------------------------------------------------------------------

    def _wait_for_slices(self, job: PendingJob, p: str, k: int, cands: list[GpuState], reason: str) -> Decision:
        """Claim the GPU where the slices come earliest (``reason``: the request's, waiting)."""
        found = self._earliest_gpu(job, p, k, cands)
        if found is None:
            return Decision(reason=reason)
        t, g, mask = found
        if g.view.dynamic and not g.busy and t == self._interval_end(g):
            reason = "MigReconfig"        # only the minimum interval keeps the re-layout back
        g.add_claim(Claim(job.job_id, t, mask))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _earliest_gpu(self, job: PendingJob, p: str, k: int, cands: list[GpuState]) -> tuple[float, GpuState, int] | None:
        """(when, where, which memory slots): the GPU of ``cands`` on a node big enough for the
        job where ``k`` slices of ``p`` come earliest, then node and GPU order.

        A GPU's earliest time only gets later in a pass (its slices only get taken), so the
        answer for the same request stays the GPU found last time while that one is unchanged
        (or none, when none had a time)."""
        key = (p, k, job.cpus, job.mem_mb, id(cands))
        hit = self._earliest.get(key)
        if hit is not None and (hit[0] is None or len(hit[0].used) == hit[1]):
            g = hit[0]
            if g is None:
                return None
            t, mask = self._earliest_slices(g, p, k)
            return t, g, mask
        best: tuple[float, int, int, GpuState, int] | None = None
        for g in cands:
            if not self.pool.node_fits(g.node, job):
                continue
            t, mask = self._earliest_slices(g, p, k)
            if t < INF and (best is None or (t, g.node, g.index) < best[:3]):
                best = (t, g.node, g.index, g, mask)
        if best is None:
            self._earliest[key] = (None, 0)
            return None
        t, _, _, g, mask = best
        self._earliest[key] = (g, len(g.used))
        return t, g, mask

    def _reconfiguring(self, gs: list[GpuState]) -> bool:
        """Whether any of these GPUs has a re-layout in flight (fixed for the pass)."""
        hit = self._reconf.get(id(gs))
        if hit is None:
            hit = self._reconf[id(gs)] = any(g.view.reconfiguring for g in gs)
        return hit

    def _earliest_slices(self, g: GpuState, p: str, k: int) -> tuple[float, int]:
        """(when ``g`` could give ``k`` slices of ``p``, the memory slots they take): kept per
        GPU while its slices in use stay the same, and shared by GPUs in the same state."""
        key = ("slices", p, k, len(g.used))
        hit = g.memo.get(key)
        if hit is None:
            v = g.view
            state = (p, k, g.model, g.layout_ok, g.layout_key, tuple(sorted(g.used.items())), v.dynamic,
                     self._interval_end(g), v.relayout_after)
            hit = self._earliest_of.get(state)
            if hit is None:
                hit = self._earliest_of[state] = self._earliest_slices_now(g, p, k)
            g.memo[key] = hit
        return hit

    def _earliest_slices_now(self, g: GpuState, p: str, k: int) -> tuple[float, int]:
        if not g.layout_ok:
            return INF, 0
        mine = sorted((g.used.get(s.start, self.now), s.start) for s in g.slices.values() if s.profile == p)
        best, mask = INF, 0
        if len(mine) >= k:
            best = mine[k - 1][0]
            for _, start in mine[:k]:
                mask |= g.mask(g.slices[start])
        if g.view.dynamic:
            holders = sorted((t, start) for start, t in g.used.items() if start in g.slices)
            still = [g.slices[s] for _, s in holders]
            t = self.now
            for step in range(len(holders) + 1):
                new = place(g.model, [p] * k, still)
                if new is not None:
                    if step or place(g.model, [p] * k, list(g.slices.values())) is None:
                        t = max(t, self._interval_end(g))      # free slices must go first
                    elif g.view.relayout_after is not None:
                        t = max(t, g.view.relayout_after)      # a refused re-layout backs off
                    if t < best:
                        best, mask = t, 0
                        for s in new:
                            mask |= g.mask(s)
                    break
                if step < len(holders):
                    t = max(t, holders[step][0])
                    still = [x for x in still if x.start != holders[step][1]]
        return best, mask
