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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..gpu import mig
from .gpustate import Claim, GpuState, catalog, place, profile_for_memory
from .plan import Relayout
from .shared import INF, Decision, NodeOk, SharedGpus, slice_device
from .snapshot import PendingJob


@dataclass
class Option:
    """A re-layout of one GPU: the free slices it destroys and the slices it creates."""

    gpu: GpuState
    destroy: tuple[mig.Slice, ...]
    create: tuple[mig.Slice, ...]


class Slices:
    """The MIG half of a pass's fractional requests (see the module docstring)."""

    def __init__(self, pool: SharedGpus, queue: Sequence[PendingJob]) -> None:
        self.pool, self.cluster, self.now, self.cfg = pool, pool.cluster, pool.now, pool.cfg
        self._later: Counter = Counter()           # (profile, partition, gpu_type) -> slices wanted
        # Pruning, by request shape.  Within a pass free slices only go and claims only come,
        # so what found nothing once finds nothing again.
        self._failed: set[tuple] = set()           # nothing to start now
        self._no_relayout: set[tuple] = set()      # no re-layout possible now
        self._reconf: dict[int, bool] = {}         # id of a candidate list (kept by the pool) -> any in flight
        self._free_of: dict[tuple, list[tuple[GpuState, mig.Slice]]] = {}
        self._full: dict[str, set[GpuState]] = {}
        self._spares: dict[str, Counter] = {}
        self.cut: list[GpuState] = []              # GPUs re-laid in this pass
        self._no_room: dict[tuple[str, ...], set[GpuState]] = {}   # profiles -> GPUs with no unused slots for them
        self.expect(queue)

    def expect(self, queue: Sequence[PendingJob]) -> None:
        """The eligible slice jobs of the pass, for the demand a re-layout also serves."""
        for j in queue:
            if j.mig_profile and not j.held and not j.blocked_reason:
                self._later[(j.mig_profile, j.partition, j.gpu_type)] += max(1, j.gpus)

    def _considered(self, job: PendingJob) -> None:
        key = (job.mig_profile, job.partition, job.gpu_type)
        if self._later.get(key, 0) > 0:
            self._later[key] = max(0, self._later[key] - max(1, job.gpus))

    # -- one job --------------------------------------------------------------------------------

    def consider(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        self._considered(job)
        p, k = job.mig_profile, max(1, job.gpus)
        assert p is not None
        cands = self.pool.candidates(job, ("mig",))
        shape = ("mig", p, k, job.partition, job.gpu_type, job.cpus, job.mem_mb, end)
        coarse = ("mig", p, job.partition, job.gpu_type)
        # 1. free slices now, packed onto the busiest GPUs
        if shape not in self._failed and coarse not in self._failed:
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
            if best is not None:
                _, i, chosen = best
                devs = []
                for _, g, s in chosen:
                    g.used[s.start] = end
                    devs.append(slice_device(g, s))
                return Decision(node=i, devices=tuple(devs))
            self._failed.add(shape)
            if not self._free_slices(p, cands):
                self._failed.add(coarse)           # no free slice of p at all, claims aside
        # 2. a slice already being cut in this pass
        usable = self.pool.candidate_set(job, ("mig",))
        for g in self.cut:
            if g.incoming.get(p, 0) >= k and g in usable and self.pool.node_fits(g.node, job):
                g.incoming[p] -= k
                return Decision(reason="MigReconfig")
        # 3. cut new slices
        again = (p, k, job.partition, job.gpu_type, job.cpus, job.mem_mb)
        if again not in self._no_relayout:
            d = self._relayout_for(job, p, k, cands, end)
            if d is not None:
                return d
            self._no_relayout.add(again)
        # 4. wait
        return self._wait_for_slices(job, p, k, cands, may_claim)

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
            g.memo[key] = self._option_now(g, profiles, destroying, keep)
        return g.memo[key]

    def _option_now(self, g: GpuState, profiles: list[str], destroying: bool,
                    keep: frozenset[int]) -> Option | None:
        existing = list(g.slices.values())
        if not destroying:
            new = place(g.model, profiles, existing)
            if new is None:       # a GPU's slices stay as they are for the pass: no room stays none
                self._no_room.setdefault(tuple(profiles), set()).add(g)
            return None if new is None else Option(g, (), tuple(new))
        if not self._interval_over(g):
            return None
        in_use = [s for s in existing if s.start in g.used or s.start in keep]
        new = place(g.model, profiles, in_use)
        if new is None:
            return None
        taken = 0
        for s in new:
            taken |= g.mask(s)
        free = [s for s in existing if s.start not in g.used and s.start not in keep]
        destroy = [s for s in free if g.mask(s) & taken]
        kept = [s for s in free if not g.mask(s) & taken]
        while kept and not mig.is_valid_layout(g.model, in_use + kept + new):
            destroy.append(kept.pop())          # compute or count limits: drop the highest free slice
        return Option(g, tuple(sorted(destroy)), tuple(new))

    def _interval_over(self, g: GpuState) -> bool:
        return self._interval_end(g) <= self.now

    def _interval_end(self, g: GpuState) -> float:
        """When a re-layout that destroys slices is next allowed on ``g``."""
        last, after = g.view.relaid_at, g.view.relayout_after
        end = -INF if last is None else last + self.cfg.mig_min_interval
        return end if after is None else max(end, after)

    def _relayout_for(self, job: PendingJob, p: str, k: int, cands: list[GpuState], end: float) -> Decision | None:
        if k == 1:           # one slice: the node's free ones do not matter, GPUs compete alone
            found = self._one_slice(job, p, cands)
            return None if found is None else Decision(reason="MigReconfig", relayouts=[self.commit(found, job)])
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
                g.used[start] = end
        d = Decision(reason="MigReconfig")
        for o in opts:
            d.relayouts.append(self.commit(o, job))
        return d

    def _one_slice(self, job: PendingJob, p: str, gs: Sequence[GpuState]) -> Option | None:
        """The re-layout cutting one ``p`` slice: on the busiest dynamic GPU where nothing need
        be destroyed, else where the fewest free slices go (then the busiest)."""
        full = self._full.setdefault(p, set())       # no room for p, once and for the pass
        order = sorted((g for g in gs if g.view.dynamic and not g.busy and g not in full
                        and self.pool.node_ok_later(g.node, job)),
                       key=lambda g: (-g.used_compute(), g.node, g.index))
        no_room = self._no_room.get((p,), ())
        for g in order:
            if g in no_room:
                continue
            o = self.option(g, [p], job.job_id, False)
            if o is not None:
                return o
        best: tuple[tuple, Option] | None = None
        for g in order:
            o = self.option(g, [p], job.job_id, True)
            if o is None and self._interval_over(g) and g.allowed(job.job_id, INF):
                full.add(g)                        # not even in place of its free slices
            if o is not None and (best is None or (len(o.destroy),) < best[0][:1]):
                best = ((len(o.destroy), -g.used_compute(), g.node, g.index), o)
        return None if best is None else best[1]

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
        gs = sorted((g for g in self.pool.candidates(job, ("mig",))
                     if g.view.dynamic and not g.busy and self.pool.node_ok_later(g.node, job)),
                    key=lambda g: (-g.used_compute(), g.node, g.index))
        for destroying in (False, True):
            best: tuple[tuple, Option, str] | None = None
            for g in gs:
                q = profile_for_memory(g.model, want)
                o = self.option(g, [q], job.job_id, destroying) if q is not None else None
                if o is None:
                    continue
                if not destroying:
                    return o, q
                key = (len(o.destroy), -g.used_compute(), g.node, g.index)
                if best is None or key < best[0]:
                    best = (key, o, q)
            if best is not None:
                return best[1], best[2]
        return None

    def commit(self, o: Option, job: PendingJob, profile: str | None = None) -> Relayout:
        """Record a re-layout (and the queue's other demand it can serve) on its GPU."""
        g = o.gpu
        layout = [s for s in g.slices.values() if s not in o.destroy] + list(o.create)
        extra = self._extra_demand(g, job)
        more: list[mig.Slice] = []
        if extra:
            more = mig.layouts_for_demand(g.model, extra, layout)
        for s in more:
            g.incoming[s.profile] += 1
        g.busy = True
        self.cut.append(g)
        create = tuple(sorted(list(o.create) + more, key=lambda s: (s.start, s.profile)))
        what = ", ".join(f"{s}" for s in create)
        return Relayout(node=self.cluster.nodes[g.node].name, gpu=g.index,
                        destroy=tuple(s.start for s in o.destroy), create=create,
                        reason=f"job {job.job_id} needs {profile or job.mig_profile}; cut {what}")

    def _extra_demand(self, g: GpuState, job: PendingJob) -> dict[str, int]:
        """Slices later jobs that could use ``g`` want, less what free slices already cover."""
        cat = catalog(g.model)
        want: Counter = Counter()
        for (p, part, gtype), n in self._later.items():
            if n > 0 and p in cat and g.node in self.pool.members(part) and (gtype is None or gtype == g.model):
                want[p] += n
        if not want:
            return {}
        want.subtract(self._spare(g.model))
        for h in self.cut:                  # slices other re-layouts of this pass bring
            if h.model == g.model:
                want.subtract(h.incoming)
        return {p: n for p, n in want.items() if n > 0}

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

    def _wait_for_slices(self, job: PendingJob, p: str, k: int, cands: list[GpuState], may_claim: bool) -> Decision:
        best: tuple[float, int, int, GpuState, int] | None = None
        reconfiguring = self._reconfiguring(cands)
        if not may_claim:                  # past backfill_depth: the reason only
            return Decision(reason="MigReconfig" if reconfiguring else "Resources")
        for g in cands:
            if not self.pool.node_fits(g.node, job):
                continue
            t, mask = self._earliest_slices(g, p, k)
            if t < INF and (best is None or (t, g.node, g.index) < best[:3]):
                best = (t, g.node, g.index, g, mask)
        reason = "MigReconfig" if reconfiguring else "Resources"
        if best is None:
            return Decision(reason=reason)
        t, _, _, g, mask = best
        if g.view.dynamic and not g.busy and t == self._interval_end(g):
            reason = "MigReconfig"        # only the minimum interval keeps the re-layout back
        g.claims.append(Claim(job.job_id, t, mask))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _reconfiguring(self, gs: list[GpuState]) -> bool:
        """Whether any of these GPUs has a re-layout in flight (fixed for the pass)."""
        hit = self._reconf.get(id(gs))
        if hit is None:
            hit = self._reconf[id(gs)] = any(g.view.reconfiguring for g in gs)
        return hit

    def _earliest_slices(self, g: GpuState, p: str, k: int) -> tuple[float, int]:
        """(when ``g`` could give ``k`` slices of ``p``, the memory slots they take)."""
        key = ("slices", p, k, len(g.used))
        hit = g.memo.get(key)
        if hit is None:
            hit = g.memo[key] = self._earliest_slices_now(g, p, k)
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
