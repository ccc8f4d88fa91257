"""Fractions of GPUs in a scheduling pass: MIG slices, MPS shares and time-slice replicas.

Theory of operation
-------------------
Every GPU has a ``mode`` (gpud/sched/snapshot.py).  ``whole`` GPUs belong to the core's
``placement.Cluster`` and go to ``--gpus N`` jobs; every other GPU is tracked here, in a
``GpuState`` that starts from what the node reports and what running jobs hold (their
``devices``) and is then mutated as the pass starts jobs, so it always says what is free
*now*.  Two jobs never get one slice, an MPS GPU never exceeds its clients, its memory
(the sum of the pinned shares) or its one user, and a time-sliced GPU never exceeds its
replicas (tests/sharing_rig.py checks every pass of the tests for it).  The per-GPU state
and the device arithmetic live in gpud/sched/gpustate.py.

Requests.  ``--gpus 1g.10gb:2`` (``mig_profile``) wants that many slices of the profile
on one node.  ``--gpu-mem 20G`` (``gpu_mem_mb``) wants one device with that much memory:
an existing MIG slice, an MPS share, a time-slice replica or a whole GPU, whichever
wastes least memory (ties: MIG, MPS, time-slice, whole), or a new slice cut for it.  A
slice satisfies a memory request by its real memory or by the size in its name
(``1g.20gb`` holds a ``--gpu-mem 20G`` job although NVML reports 19968 MiB).

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
Among GPUs that can serve, the one that destroys nothing wins, then the busiest (so
idle GPUs stay whole for big slices), then node and GPU order.

Waiting.  A fractional job that cannot start, when ``backfill_depth`` allows, *claims*
the GPU where it can start earliest (from running jobs' time limits and the minimum
interval): lower jobs may use that GPU only if they end before the claimed time, or, on
MIG, on slices outside the memory slots the claim needs.  So a stream of small slices
does not starve a ``7g.80gb``, and one user's stream of MPS jobs does not starve another
user.  Claims last for one pass; the next pass, in priority order, makes them again.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..gpu import mig
from .gpustate import (SHARED_MODES, Claim, GpuState, catalog, has_profile, load_layout, most_memory, place,
                       profile_for_memory, slice_capacity_mb, slice_mem, type_ok)
from .placement import Cluster
from .plan import Relayout
from .shapes import ShapeIndex
from .snapshot import Device, PendingJob, Snapshot

INF = math.inf
_KIND_RANK = {"mig": 0, "mps": 1, "timeslice": 2, "gpu": 3}

NodeOk = Callable[[int, tuple[int, ...]], bool]   # (node, whole GPUs taken) -> may start there now


@dataclass
class Decision:
    """What the pass does with one fractional job."""

    node: int | None = None                         # set: start there now
    devices: tuple[Device, ...] = ()
    gpu_indices: tuple[int, ...] = ()               # a whole GPU, for a --gpu-mem job
    reason: str | None = None                       # else: why it waits
    expected: float | None = None                   # and when it expects to start (claimed)
    expected_node: int | None = None
    relayouts: list[Relayout] = field(default_factory=list)


@dataclass
class _Option:
    gpu: GpuState
    destroy: tuple[mig.Slice, ...]
    create: tuple[mig.Slice, ...]


class Sharing:
    """The fractional half of a pass (see the module docstring)."""

    def __init__(self, snap: Snapshot, cluster: Cluster, now: float) -> None:
        self.cluster, self.now, self.cfg = cluster, now, snap.config
        self.gpus: list[GpuState] = []
        self.on_node: dict[int, list[GpuState]] = {}
        by_key: dict[tuple[int, int], GpuState] = {}
        for i, n in enumerate(cluster.nodes):
            for v in n.gpus:
                if v.mode not in SHARED_MODES:
                    continue
                g = GpuState(i, v, busy=v.reconfiguring)
                if v.mode == "mig":
                    g.layout_ok = load_layout(g)
                self.gpus.append(g)
                self.on_node.setdefault(i, []).append(g)
                by_key[(i, v.index)] = g
        for r in snap.running:
            i = cluster.pos.get(r.node)
            if i is None:
                continue
            end = now if r.stopping else max(now, r.end_time())
            for d in r.devices:
                g = by_key.get((i, d.index))
                if g is None or d.kind == "gpu":
                    continue
                if d.kind == "mig" and d.slice_start is not None:
                    g.used[d.slice_start] = end
                elif d.kind in ("mps", "timeslice"):
                    g.clients.append((end, r.user, d.mem_mb or 0))
        self._members: dict[str, frozenset[int]] = {}
        self._later: Counter = Counter()           # (profile, partition, gpu_type) -> slices wanted
        # Pruning, by request shape.  Within a pass free slices and shares only go and claims
        # only come, so what found nothing once finds nothing again.
        self._failed: set[tuple] = set()           # nothing to start now
        self._no_relayout: set[tuple] = set()      # no re-layout possible now
        self._cands: dict[tuple, list[GpuState]] = {}
        self._cand_sets: dict[tuple, frozenset[GpuState]] = {}
        self._reconf: dict[int, bool] = {}         # id of a candidate list (kept in _cands) -> any in flight
        self._free_of: dict[tuple, list[tuple[GpuState, mig.Slice]]] = {}
        self._full: dict[str, set[GpuState]] = {}
        self._misfits: dict[tuple, str | None] = {}
        self._spares: dict[str, Counter] = {}
        self._cut: list[GpuState] = []             # GPUs re-laid in this pass
        self._slices_by_memory: list[tuple] | None = None
        self._whole_by_memory: list[tuple] | None = None
        self._no_room: dict[tuple[str, ...], set[GpuState]] = {}   # profiles -> GPUs with no unused slots for them
        self.scorer: ShapeIndex | None = None     # placement "shapes": where a share goes (shapes.py)

    # -- bookkeeping ----------------------------------------------------------------------------

    def members(self, partition: str) -> frozenset[int]:
        m = self._members.get(partition)
        if m is None:
            m = self._members[partition] = frozenset(self.cluster.members.get(partition, ()))
        return m

    def expect(self, queue: Sequence[PendingJob]) -> None:
        """The eligible slice jobs of the pass, for the demand a re-layout also serves."""
        for j in queue:
            if j.mig_profile and not j.held and not j.blocked_reason:
                self._later[(j.mig_profile, j.partition, j.gpu_type)] += max(1, j.gpus)

    def _considered(self, job: PendingJob) -> None:
        key = (job.mig_profile, job.partition, job.gpu_type)
        if job.mig_profile and self._later.get(key, 0) > 0:
            self._later[key] = max(0, self._later[key] - max(1, job.gpus))

    # -- feasibility ----------------------------------------------------------------------------

    def misfit(self, job: PendingJob) -> str | None:
        """"BadConstraints" when no node of the partition could ever hold the request,
        "ReqNodeNotAvail" when only nodes that are down could, else None."""
        key = (job.partition, job.mig_profile, job.gpu_mem_mb, job.gpus, job.cpus, job.mem_mb, job.gpu_type)
        if key not in self._misfits:
            self._misfits[key] = self._misfit(job)
        return self._misfits[key]

    def _misfit(self, job: PendingJob) -> str | None:
        c = self.cluster
        verdict = "BadConstraints"
        for i in sorted(self.members(job.partition)):
            if c.total_cpus[i] < job.cpus or c.total_mem[i] < job.mem_mb:
                continue
            if self._capacity(i, job) >= max(1, job.gpus):
                if c.up[i]:
                    return None
                verdict = "ReqNodeNotAvail"
        return verdict

    def _capacity(self, i: int, job: PendingJob) -> int:
        """How many of the job's devices node ``i`` could ever hold at once."""
        n = 0
        if job.mig_profile:
            for g in self.on_node.get(i, ()):
                if g.view.mode == "mig" and g.layout_ok and type_ok(job, g):
                    cat = catalog(g.model)
                    if job.mig_profile not in cat:
                        continue
                    if g.view.dynamic:
                        n += cat[job.mig_profile].max_count
                    else:
                        n += sum(1 for s in g.slices.values() if s.profile == job.mig_profile)
            return n
        want = job.gpu_mem_mb or 0
        for g in self.on_node.get(i, ()):
            if type_ok(job, g) and most_memory(g) >= want:
                return 1
        node = self.cluster.nodes[i]
        return int(any(v.mode == "whole" and v.memory_mb >= want and type_ok(job, v) for v in node.gpus))

    def least_fraction(self, job: PendingJob) -> float:
        """The smallest fraction of a GPU the request could take here (a limit's lower bound
        before it is placed): its slices' on the partition's MIG GPUs, else the least a share,
        replica, slice or whole GPU with room for its memory stands for."""
        key = ("least", job.partition, job.gpu_type, job.mig_profile, job.gpus, job.gpu_mem_mb)
        hit = self._misfits.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]
        fracs = []
        if job.mig_profile:
            for g in self._candidates(job, ("mig",)):
                fracs.append(catalog(g.model)[job.mig_profile].fraction * max(1, job.gpus))
        else:
            want = job.gpu_mem_mb or 0
            for g in self._candidates(job, SHARED_MODES):
                v = g.view
                if v.mode == "mps":
                    fracs.append(min(1.0, want / v.memory_mb) if v.memory_mb > 0 else 1.0)
                elif v.mode == "timeslice":
                    fracs.append(1.0 / max(1, v.replicas))
                else:
                    q = profile_for_memory(g.model, want) if g.layout_ok else None
                    if q is not None:
                        fracs.append(catalog(g.model)[q].fraction)
        least = min(fracs, default=1.0)
        self._misfits[key] = least  # type: ignore[assignment]
        return least

    # -- one job --------------------------------------------------------------------------------

    def consider(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        self._considered(job)
        if job.mig_profile:
            return self._slices(job, end, node_ok, may_claim)
        return self._by_memory(job, end, node_ok, may_claim)

    def _candidates(self, job: PendingJob, kinds: tuple[str, ...]) -> list[GpuState]:
        key = (job.partition, job.gpu_type, job.mig_profile, kinds)
        found = self._cands.get(key)
        if found is None:
            members = self.members(job.partition)
            found = self._cands[key] = [
                g for g in self.gpus if g.node in members and self.cluster.up[g.node]
                and g.view.mode in kinds and type_ok(job, g)
                and (g.view.mode != "mig" or (g.layout_ok and has_profile(g, job)))]
        return found

    # MIG slices of one profile -------------------------------------------------------------------

    def _slices(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        p, k = job.mig_profile, max(1, job.gpus)
        assert p is not None
        cands = self._candidates(job, ("mig",))
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
                    v = g.by_start[s.start]
                    devs.append(Device(g.index, "mig", v.uuid, s.start, v.memory_mb, s.profile))
                return Decision(node=i, devices=tuple(devs))
            self._failed.add(shape)
            if not self._free_slices(p, cands):
                self._failed.add(coarse)           # no free slice of p at all, claims aside
        # 2. a slice already being cut in this pass
        usable = self._candidate_set(job, ("mig",))
        for g in self._cut:
            if g.incoming.get(p, 0) >= k and g in usable and self._node_fits(g.node, job):
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

    def _node_fits(self, i: int, job: PendingJob) -> bool:
        c = self.cluster
        return c.total_cpus[i] >= job.cpus and c.total_mem[i] >= job.mem_mb

    def _option(self, g: GpuState, profiles: list[str], job_id: int, destroying: bool,
                keep: frozenset[int] = frozenset()) -> _Option | None:
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
                    keep: frozenset[int]) -> _Option | None:
        existing = list(g.slices.values())
        if not destroying:
            new = place(g.model, profiles, existing)
            if new is None:       # a GPU's slices stay as they are for the pass: no room stays none
                self._no_room.setdefault(tuple(profiles), set()).add(g)
            return None if new is None else _Option(g, (), tuple(new))
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
        return _Option(g, tuple(sorted(destroy)), tuple(new))

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
            return None if found is None else Decision(reason="MigReconfig", relayouts=[self._commit(found, job)])
        by_node: dict[int, list[GpuState]] = {}
        for g in cands:
            if g.view.dynamic and not g.busy:
                by_node.setdefault(g.node, []).append(g)
        usable = self._candidate_set(job, ("mig",))    # not a node's GPUs of another model
        # Nodes whose busiest dynamic GPU is busiest first: with nothing to destroy, the first
        # node that can cut the slices is the answer; destroying, the fewest slices win.
        order = sorted(by_node, key=lambda i: (-max(g.used_compute() for g in by_node[i]), i))
        best: tuple[tuple, int, list[_Option], dict[int, frozenset[int]]] | None = None
        for destroying in (False, True):
            for i in order:
                if not self._node_ok_later(i, job):
                    continue
                found = self._node_option(job, p, k, end, [g for g in self.on_node[i] if g in usable], destroying)
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
        for g in self.on_node.get(i, ()):
            for start in mine.get(g.index, ()):
                g.used[start] = end
        d = Decision(reason="MigReconfig")
        for o in opts:
            d.relayouts.append(self._commit(o, job))
        return d

    def _one_slice(self, job: PendingJob, p: str, gs: Sequence[GpuState]) -> _Option | None:
        """The re-layout cutting one ``p`` slice: on the busiest dynamic GPU where nothing need
        be destroyed, else where the fewest free slices go (then the busiest)."""
        full = self._full.setdefault(p, set())       # no room for p, once and for the pass
        order = sorted((g for g in gs if g.view.dynamic and not g.busy and g not in full
                        and self._node_ok_later(g.node, job)),
                       key=lambda g: (-g.used_compute(), g.node, g.index))
        no_room = self._no_room.get((p,), ())
        for g in order:
            if g in no_room:
                continue
            o = self._option(g, [p], job.job_id, False)
            if o is not None:
                return o
        best: tuple[tuple, _Option] | None = None
        for g in order:
            o = self._option(g, [p], job.job_id, True)
            if o is None and self._interval_over(g) and g.allowed(job.job_id, INF):
                full.add(g)                        # not even in place of its free slices
            if o is not None and (best is None or (len(o.destroy),) < best[0][:1]):
                best = ((len(o.destroy), -g.used_compute(), g.node, g.index), o)
        return None if best is None else best[1]

    def _node_option(self, job: PendingJob, p: str, k: int, end: float, gs: list[GpuState],
                     destroying: bool) -> tuple[list[_Option], dict[int, frozenset[int]]] | None:
        """Re-layouts on one node's dynamic GPUs that give ``k`` slices of ``p`` together with
        the free ones it has (which the job keeps), or None."""
        mine = {g.index: frozenset(s.start for s in g.slices.values() if not g.busy and s.profile == p
                                   and s.start not in g.used and g.allowed(job.job_id, end, g.mask(s)))
                for g in gs if g.view.mode == "mig"}
        need = k - sum(len(v) for v in mine.values())
        if need <= 0:
            return None       # enough free slices, held back only by this instant's veto
        opts: list[_Option] = []
        for g in sorted(gs, key=lambda g: (-g.used_compute(), g.index)):
            if g.view.mode != "mig":
                continue
            for n in range(need, 0, -1):
                o = self._option(g, [p] * n, job.job_id, destroying, mine[g.index])
                if o is not None:
                    opts.append(o)
                    need -= n
                    break
            if need <= 0:
                return opts, mine
        return None

    def _node_ok_later(self, i: int, job: PendingJob) -> bool:
        c = self.cluster
        return c.up[i] and c.cpus[i] >= job.cpus and c.mem[i] >= job.mem_mb

    def _commit(self, o: _Option, job: PendingJob, profile: str | None = None) -> Relayout:
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
        self._cut.append(g)
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
            if n > 0 and p in cat and g.node in self.members(part) and (gtype is None or gtype == g.model):
                want[p] += n
        if not want:
            return {}
        want.subtract(self._spare(g.model))
        for h in self._cut:                 # slices other re-layouts of this pass bring
            if h.model == g.model:
                want.subtract(h.incoming)
        return {p: n for p, n in want.items() if n > 0}

    def _spare(self, model: str) -> Counter:
        """Free slices on ``model``'s GPUs as of the first ask in the pass.  They only get
        fewer as the pass goes on, so a re-layout never cuts more than the queue needs."""
        spare = self._spares.get(model)
        if spare is None:
            spare = self._spares[model] = Counter()
            for h in self.gpus:
                if h.view.mode == "mig" and h.model == model and not h.busy:
                    spare.update(s.profile for s in h.slices.values() if s.start not in h.used)
        return spare

    def _wait_for_slices(self, job: PendingJob, p: str, k: int, cands: list[GpuState], may_claim: bool) -> Decision:
        best: tuple[float, int, int, GpuState, int] | None = None
        reconfiguring = self._reconfiguring(cands)
        if not may_claim:                  # past backfill_depth: the reason only
            return Decision(reason="MigReconfig" if reconfiguring else "Resources")
        for g in cands:
            if not self._node_fits(g.node, job):
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

    # one device with enough memory ---------------------------------------------------------------

    def _by_memory(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        want = job.gpu_mem_mb or 0
        shape = ("mem", want, job.user, job.partition, job.gpu_type, job.cpus, job.mem_mb, end)
        members = self.members(job.partition)
        c = self.cluster
        # (waste MiB, later?, kind rank, node, gpu, slot) -> what to do
        best: tuple[tuple, Callable[[], Decision]] | None = None

        def offer(key: tuple, act: Callable[[], Decision]) -> None:
            nonlocal best
            if best is None or key < best[0]:
                best = (key, act)

        if shape not in self._failed:
            # Each kind's least wasteful device: the indexes are sorted by memory, so the first
            # one still free (and allowed) is it.
            usable = self._candidate_set(job, SHARED_MODES)
            slices = self._slice_index()
            stale = 0
            for mem, _, _, _, g, sl in slices[bisect.bisect_left(slices, (want * 5 // 6,)):]:
                if g.busy or sl.start in g.used:
                    stale += 1
                    continue
                if (g in usable and slice_capacity_mb(sl.profile, mem) >= want
                        and g.allowed(job.job_id, end, g.mask(sl)) and node_ok(g.node, ())):
                    offer((max(0, mem - want), 0, 0, g.node, g.index, sl.start),
                          _start_slice(g, sl, g.by_start[sl.start], end))
                    break
            if stale > 64:                         # taken slices stay taken: drop them
                self._slices_by_memory = [e for e in slices if not e[4].busy and e[5].start not in e[4].used]
            scored = None
            if self.scorer is not None:
                shareable = self._candidate_set(job, ("mps", "timeslice"))
                scored = self.scorer.gpu_for_share(
                    want, job.cpus, job.mem_mb, job.gpu_type,
                    lambda g: (g in shareable and not g.busy and self._share_fits(g, job, end)
                               and node_ok(g.node, ())))
                if scored is not None:
                    offer((0, 0, _KIND_RANK["mps"], scored.node, scored.index, 0), _start_share(scored, job, end, c))
            for g in (() if scored is not None else self._candidates(job, ("mps", "timeslice"))):
                v = g.view
                if g.busy or not self._share_fits(g, job, end) or not node_ok(g.node, ()):
                    continue
                waste = 0 if v.mode == "mps" else max(0, v.memory_mb // max(1, v.replicas) - want)
                offer((waste, 0, _KIND_RANK[v.mode], g.node, g.index, 0), _start_share(g, job, end, c))
                if v.mode == "mps":
                    break          # waste 0 at MPS's rank: nothing later can do better
            for mem, i, gi, v in self._whole_index()[bisect.bisect_left(self._whole_index(), (want,)):]:
                if (i in members and gi in c.free[i] and type_ok(job, v) and node_ok(i, (gi,))):
                    offer((mem - want, 0, 3, i, gi, 0),
                          lambda i=i, v=v: Decision(node=i, gpu_indices=(v.index,),
                                                    devices=(Device(v.index, "gpu", v.uuid),)))
                    break
        immediate = best is not None
        # slices being cut in this pass, else a new one on a dynamic GPU
        mig_ok = self._candidate_set(job, ("mig",)) if self._cut else frozenset()
        fits: dict[str, str | None] = {}           # model -> the profile for ``want``
        for g in self._cut:
            if g not in mig_ok:
                continue
            q = fits[g.model] if g.model in fits else fits.setdefault(g.model, profile_for_memory(g.model, want))
            if q is not None and g.incoming.get(q, 0) > 0 and self._node_ok_later(g.node, job):
                offer((max(0, catalog(g.model)[q].memory_mb - want), 1, 0, g.node, g.index, 0),
                      _take_incoming(g, q))
        again = ("mem", want, job.partition, job.gpu_type, job.cpus, job.mem_mb)
        if again not in self._no_relayout:
            found = self._new_slice_for(job, want)
            if found is None:
                self._no_relayout.add(again)
            else:
                o, q = found
                offer((max(0, catalog(o.gpu.model)[q].memory_mb - want), 1, 1 if o.destroy else 0,
                       o.gpu.node, o.gpu.index, 0),
                      lambda: Decision(reason="MigReconfig", relayouts=[self._commit(o, job, q)]))
        if best is not None:
            return best[1]()
        if not immediate:
            self._failed.add(shape)
        return self._wait_for_memory(job, want, may_claim)

    def _candidate_set(self, job: PendingJob, kinds: tuple[str, ...]) -> frozenset[GpuState]:
        key = (job.partition, job.gpu_type, job.mig_profile, kinds)
        found = self._cand_sets.get(key)
        if found is None:
            found = self._cand_sets[key] = frozenset(self._candidates(job, kinds))
        return found

    def _slice_index(self) -> list[tuple]:
        """(memory, node, GPU, start, GpuState, slice) of every slice of a usable MIG GPU."""
        if self._slices_by_memory is None:
            self._slices_by_memory = sorted(
                ((g.by_start[sl.start].memory_mb, g.node, g.index, sl.start, g, sl)
                 for g in self.gpus if g.view.mode == "mig" and g.layout_ok for sl in g.slices.values()),
                key=lambda t: t[:4])
        return self._slices_by_memory

    def _whole_index(self) -> list[tuple]:
        """(memory, node, index, view) of every whole GPU on a schedulable node."""
        if self._whole_by_memory is None:
            c = self.cluster
            self._whole_by_memory = sorted(
                ((v.memory_mb, i, v.index, v) for i, n in enumerate(c.nodes) if c.up[i]
                 for v in n.gpus if v.mode == "whole"), key=lambda t: t[:3])
        return self._whole_by_memory

    def _new_slice_for(self, job: PendingJob, want: int) -> tuple[_Option, str] | None:
        """The re-layout that would cut the smallest slice holding ``want`` MiB: on the
        busiest dynamic GPU where nothing need be destroyed, else where the fewest are."""
        gs = sorted((g for g in self._candidates(job, ("mig",))
                     if g.view.dynamic and not g.busy and self._node_ok_later(g.node, job)),
                    key=lambda g: (-g.used_compute(), g.node, g.index))
        for destroying in (False, True):
            best: tuple[tuple, _Option, str] | None = None
            for g in gs:
                q = profile_for_memory(g.model, want)
                o = self._option(g, [q], job.job_id, destroying) if q is not None else None
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

    def _share_fits(self, g: GpuState, job: PendingJob, end: float) -> bool:
        v, want = g.view, job.gpu_mem_mb or 0
        if not g.allowed(job.job_id, end):
            return False
        if v.dynamic and not g.clients and v.index not in self.cluster.free[g.node]:
            return False           # an mps:dynamic GPU a whole-GPU job holds
        if v.mode == "mps":
            return (len(g.clients) < v.mps_max_clients and g.users() <= {job.user}
                    and g.mem_used() + want <= v.memory_mb)
        return len(g.clients) < v.replicas and want <= v.memory_mb

    def _wait_for_memory(self, job: PendingJob, want: int, may_claim: bool) -> Decision:
        best: tuple[float, int, int, GpuState] | None = None
        reconfiguring = False
        if not may_claim:              # the reason only: whether a GPU it could use is being re-laid
            key = ("reconf", job.partition, job.gpu_type, want, job.cpus, job.mem_mb)
            hit = self._misfits.get(key)
            if hit is None:
                hit = self._misfits[key] = "MigReconfig" if any(
                    g.view.reconfiguring for g in self._candidates(job, SHARED_MODES)
                    if self._node_fits(g.node, job) and most_memory(g) >= want) else "Resources"
            return Decision(reason=hit)
        for g in self._candidates(job, SHARED_MODES):
            if not self._node_fits(g.node, job) or most_memory(g) < want:
                continue
            reconfiguring |= g.view.reconfiguring
            t = self._earliest_share(g, job, want)
            if t < INF and (best is None or (t, g.node, g.index) < best[:3]):
                best = (t, g.node, g.index, g)
        reason = "MigReconfig" if reconfiguring else "Resources"
        if best is None or not may_claim:
            return Decision(reason=reason)
        t, _, _, g = best
        g.claims.append(Claim(job.job_id, t))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _earliest_share(self, g: GpuState, job: PendingJob, want: int) -> float:
        key = ("share", job.user, want, len(g.used), len(g.clients))
        hit = g.memo.get(key)
        if hit is None:
            hit = g.memo[key] = self._earliest_share_now(g, job, want)
        return hit

    def _earliest_share_now(self, g: GpuState, job: PendingJob, want: int) -> float:
        v = g.view
        if v.dynamic and v.mode == "mps" and not g.clients and v.index not in self.cluster.free[g.node]:
            return INF             # held whole: when it comes back is the timeline's to say
        if v.mode == "mig":
            ends = sorted(g.used.get(s.start, self.now) for s in g.slices.values()
                          if slice_capacity_mb(s.profile, slice_mem(v, s.start)) >= want)
            return ends[0] if ends else INF
        clients = sorted(g.clients)
        for k in range(len(clients) + 1):
            left = clients[k:]
            t = clients[k - 1][0] if k else self.now
            if v.mode == "timeslice":
                if len(left) < v.replicas:
                    return t
                continue
            others = any(u != job.user for _, u, _ in left)
            if (not others and len(left) < v.mps_max_clients
                    and sum(m for _, _, m in left) + want <= v.memory_mb):
                return t
        return INF


def _start_slice(g: GpuState, s: mig.Slice, sv, end: float) -> Callable[[], Decision]:
    def act() -> Decision:
        g.used[s.start] = end
        return Decision(node=g.node, devices=(Device(g.index, "mig", sv.uuid, s.start, sv.memory_mb, s.profile),))
    return act


def _start_share(g: GpuState, job: PendingJob, end: float, cluster: Cluster) -> Callable[[], Decision]:
    def act() -> Decision:
        want = job.gpu_mem_mb or 0
        if g.view.dynamic and not g.clients:     # an idle mps:dynamic GPU turns to shares
            cluster.allocate(g.node, (g.index,), 0, 0)
        g.clients.append((end, job.user, want))
        return Decision(node=g.node, devices=(Device(g.index, g.view.mode, g.view.uuid, None, want),))
    return act


def _take_incoming(g: GpuState, q: str) -> Callable[[], Decision]:
    def act() -> Decision:
        g.incoming[q] -= 1
        return Decision(reason="MigReconfig")
    return act

