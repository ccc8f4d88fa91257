"""Fractions of GPUs in a scheduling pass: MIG slices, MPS shares and time-slice replicas.

Theory of operation
-------------------
Every GPU has a ``mode`` (gpud/sched/snapshot.py).  ``whole`` GPUs belong to the core's
``placement.Cluster`` and go to ``--gpus N`` jobs; every other GPU is tracked here, in a
``_Gpu`` that starts from what the node reports and what running jobs hold (their
``devices``) and is then mutated as the pass starts jobs, so it always says what is free
*now*.  Two jobs never get one slice, an MPS GPU never exceeds its clients, its memory
(the sum of the pinned shares) or its one user, and a time-sliced GPU never exceeds its
replicas (``check`` asserts it; the tests call it after random passes).

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

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..gpu import mig
from .placement import Cluster
from .plan import Relayout
from .snapshot import Device, GpuView, PendingJob, RunningJob, Snapshot

INF = math.inf
SHARED_MODES = ("mig", "mps", "timeslice")
_KIND_RANK = {"mig": 0, "mps": 1, "timeslice": 2, "gpu": 3}

NodeOk = Callable[[int, tuple[int, ...]], bool]   # (node, whole GPUs taken) -> may start there now


def nominal_mb(profile: str) -> int:
    """The memory a profile's name promises, in MiB (``3g.40gb`` -> 40960)."""
    size = profile.partition(".")[2].partition("gb")[0]
    return int(size) * 1024 if size.isdigit() else 0


def slice_capacity_mb(profile: str, memory_mb: int) -> int:
    return max(memory_mb, nominal_mb(profile))


def device_fraction(dev: Device, gpu: GpuView | None) -> float:
    """The share of one GPU a device stands for, as it is billed."""
    if dev.kind == "gpu":
        return 1.0
    if gpu is None:       # the node is gone: a slice by the compute in its name, else whole
        compute = (dev.profile or "").partition("g.")[0] if dev.kind == "mig" else ""
        return min(1.0, int(compute) / 7) if compute.isdigit() else 1.0
    if dev.kind == "mig":
        try:
            profile = dev.profile or next(s.profile for s in gpu.slices if s.start == dev.slice_start)
            return _catalog(gpu.model)[mig.parse_profile(profile)].fraction
        except (StopIteration, KeyError, mig.MigError):
            return 1.0 / 7
    if dev.kind == "mps":
        if dev.mem_mb and gpu.memory_mb > 0:
            return min(1.0, dev.mem_mb / gpu.memory_mb)
        return 1.0 / max(1, gpu.mps_max_clients)
    if dev.kind == "timeslice":
        return 1.0 / max(1, gpu.replicas)
    return 1.0


def is_shared(devices: Iterable[Device]) -> bool:
    return any(d.kind != "gpu" for d in devices)


@dataclass
class _Claim:
    job_id: int
    at: float              # when the claimant expects to start
    mask: int = 0          # MIG: the memory slots it needs (0: the whole GPU)


@dataclass
class _Gpu:
    """One shared GPU's state during the pass."""

    node: int
    view: GpuView
    layout_ok: bool = True                          # MIG: a known model with a valid layout
    slices: dict[int, mig.Slice] = field(default_factory=dict)   # start -> slice (canonical)
    used: dict[int, float] = field(default_factory=dict)         # slice start -> holder's end
    clients: list[tuple[float, str, int]] = field(default_factory=list)  # MPS/timeslice: (end, user, mem)
    busy: bool = False                              # re-layout in flight or planned: no starts
    claims: list[_Claim] = field(default_factory=list)
    incoming: Counter = field(default_factory=Counter)   # profile -> slices planned, not yet made
    # earliest-start answers; ``used`` and ``clients`` only grow in a pass, so their sizes
    # say whether an answer is still current
    memo: dict = field(default_factory=dict)

    @property
    def index(self) -> int:
        return self.view.index

    @property
    def model(self) -> str:
        return self.view.model

    def mask(self, s: mig.Slice) -> int:
        return mig.Placement(s.start, _catalog(self.model)[s.profile].memory_slices).mask

    def used_compute(self) -> int:
        if self.view.mode != "mig":
            return len(self.clients)
        cat = _catalog(self.model) if self.layout_ok else {}
        return sum(cat[self.slices[s].profile].compute_slices if s in self.slices and self.slices[s].profile in cat
                   else 1 for s in self.used)

    def allowed(self, job_id: int, end: float, mask: int = 0) -> bool:
        """Whether a job ending at ``end`` may use (part of) this GPU despite its claims."""
        for c in self.claims:
            if c.job_id == job_id or end <= c.at:
                continue
            if mask and c.mask and not (mask & c.mask):
                continue
            return False
        return True

    def mem_used(self) -> int:
        return sum(m for _, _, m in self.clients)

    def users(self) -> set[str]:
        return {u for _, u, _ in self.clients}


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
    gpu: _Gpu
    destroy: tuple[mig.Slice, ...]
    create: tuple[mig.Slice, ...]


class Sharing:
    """The fractional half of a pass (see the module docstring)."""

    def __init__(self, snap: Snapshot, cluster: Cluster, now: float) -> None:
        self.cluster, self.now, self.cfg = cluster, now, snap.config
        self.gpus: list[_Gpu] = []
        self.on_node: dict[int, list[_Gpu]] = {}
        by_key: dict[tuple[int, int], _Gpu] = {}
        for i, n in enumerate(cluster.nodes):
            for v in n.gpus:
                if v.mode not in SHARED_MODES:
                    continue
                g = _Gpu(i, v, busy=v.reconfiguring)
                if v.mode == "mig":
                    g.layout_ok = _load_layout(g)
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
        self._cands: dict[tuple, list[_Gpu]] = {}
        self._misfits: dict[tuple, str | None] = {}

    @property
    def active(self) -> bool:
        return bool(self.gpus)

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
                if g.view.mode == "mig" and g.layout_ok and _type_ok(job, g):
                    cat = _catalog(g.model)
                    if job.mig_profile not in cat:
                        continue
                    if g.view.dynamic:
                        n += cat[job.mig_profile].max_count
                    else:
                        n += sum(1 for s in g.slices.values() if s.profile == job.mig_profile)
            return n
        want = job.gpu_mem_mb or 0
        for g in self.on_node.get(i, ()):
            if _type_ok(job, g) and _most_memory(g) >= want:
                return 1
        node = self.cluster.nodes[i]
        return int(any(v.mode == "whole" and v.memory_mb >= want and _type_ok(job, v) for v in node.gpus))

    # -- one job --------------------------------------------------------------------------------

    def consider(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        self._considered(job)
        if job.mig_profile:
            return self._slices(job, end, node_ok, may_claim)
        return self._by_memory(job, end, node_ok, may_claim)

    def _candidates(self, job: PendingJob, kinds: tuple[str, ...]) -> list[_Gpu]:
        key = (job.partition, job.gpu_type, job.mig_profile, kinds)
        found = self._cands.get(key)
        if found is None:
            members = self.members(job.partition)
            found = self._cands[key] = [
                g for g in self.gpus if g.node in members and self.cluster.up[g.node]
                and g.view.mode in kinds and _type_ok(job, g)
                and (g.view.mode != "mig" or (g.layout_ok and _has_profile(g, job)))]
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
            by_node: dict[int, list[tuple[tuple, _Gpu, mig.Slice]]] = {}
            for g in cands:
                if g.busy:
                    continue
                busy = -g.used_compute()
                for s in g.slices.values():
                    if s.profile == p and s.start not in g.used and g.allowed(job.job_id, end, g.mask(s)):
                        by_node.setdefault(g.node, []).append(((busy, g.index, s.start), g, s))
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
                    v = next(x for x in g.view.slices if x.start == s.start)
                    devs.append(Device(g.index, "mig", v.uuid, s.start, v.memory_mb, s.profile))
                return Decision(node=i, devices=tuple(devs))
            self._failed.add(shape)
            if not any(not g.busy and any(sl.profile == p and sl.start not in g.used for sl in g.slices.values())
                       for g in cands):
                self._failed.add(coarse)           # no free slice of p at all, claims aside
        # 2. a slice already being cut in this pass
        for g in cands:
            if g.incoming.get(p, 0) >= k and self._node_fits(g.node, job):
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

    def _node_fits(self, i: int, job: PendingJob) -> bool:
        c = self.cluster
        return c.total_cpus[i] >= job.cpus and c.total_mem[i] >= job.mem_mb

    def _option(self, g: _Gpu, profiles: list[str], end: float, job_id: int,
                keep: frozenset[int] = frozenset()) -> _Option | None:
        """New slices for ``profiles`` on ``g``: in unused slots, else (past the minimum
        interval) in place of free slices; never touching a slice in use or in ``keep``
        (free slices the job itself will take)."""
        if g.busy or not g.view.dynamic or not g.layout_ok or not g.allowed(job_id, INF):
            return None
        existing = list(g.slices.values())
        new = _place(g.model, profiles, existing)
        if new is not None:
            return _Option(g, (), tuple(new))
        if not self._interval_over(g):
            return None
        in_use = [s for s in existing if s.start in g.used or s.start in keep]
        new = _place(g.model, profiles, in_use)
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

    def _interval_over(self, g: _Gpu) -> bool:
        return self._interval_end(g) <= self.now

    def _interval_end(self, g: _Gpu) -> float:
        """When a re-layout that destroys slices is next allowed on ``g``."""
        last = g.view.relaid_at
        return -INF if last is None else last + self.cfg.mig_min_interval

    def _relayout_for(self, job: PendingJob, p: str, k: int, cands: list[_Gpu], end: float) -> Decision | None:
        best: tuple[tuple, int, list[_Option], dict[int, frozenset[int]]] | None = None
        by_node: dict[int, list[_Gpu]] = {}
        for g in cands:
            by_node.setdefault(g.node, []).append(g)
        for i, gs in sorted(by_node.items()):
            if not any(g.view.dynamic for g in gs) or not self._node_ok_later(i, job):
                continue
            mine = {g.index: frozenset(s.start for s in g.slices.values() if not g.busy and s.profile == p
                                       and s.start not in g.used and g.allowed(job.job_id, end, g.mask(s)))
                    for g in gs}
            need = k - sum(len(v) for v in mine.values())
            if need <= 0:
                continue      # enough free slices, held back only by this instant's veto
            opts: list[_Option] = []
            for g in sorted(gs, key=lambda g: (-g.used_compute(), g.index)):
                for n in range(need, 0, -1):
                    o = self._option(g, [p] * n, end, job.job_id, mine[g.index])
                    if o is not None:
                        opts.append(o)
                        need -= n
                        break
                if need <= 0:
                    break
            if need > 0:
                continue
            key = (sum(len(o.destroy) for o in opts), -sum(o.gpu.used_compute() for o in opts), i)
            if best is None or key < best[0]:
                best = (key, i, opts, mine)
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
        create = tuple(sorted(list(o.create) + more, key=lambda s: (s.start, s.profile)))
        what = ", ".join(f"{s}" for s in create)
        return Relayout(node=self.cluster.nodes[g.node].name, gpu=g.index,
                        destroy=tuple(s.start for s in o.destroy), create=create,
                        reason=f"job {job.job_id} needs {profile or job.mig_profile}; cut {what}")

    def _extra_demand(self, g: _Gpu, job: PendingJob) -> dict[str, int]:
        """Slices later jobs that could use ``g`` want, less what free slices already cover."""
        cat = _catalog(g.model)
        want: Counter = Counter()
        for (p, part, gtype), n in self._later.items():
            if n > 0 and p in cat and g.node in self.members(part) and (gtype is None or gtype == g.model):
                want[p] += n
        if not want:
            return {}
        for h in self.gpus:
            if h.view.mode != "mig" or h.busy and not h.incoming:
                continue
            for p2, n in h.incoming.items():
                want[p2] -= n
            if not h.busy:
                for s in h.slices.values():
                    if s.start not in h.used:
                        want[s.profile] -= 1
        return {p: n for p, n in want.items() if n > 0}

    def _wait_for_slices(self, job: PendingJob, p: str, k: int, cands: list[_Gpu], may_claim: bool) -> Decision:
        best: tuple[float, int, int, _Gpu, int] | None = None
        reconfiguring = any(g.view.reconfiguring for g in cands)
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
        g.claims.append(_Claim(job.job_id, t, mask))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _earliest_slices(self, g: _Gpu, p: str, k: int) -> tuple[float, int]:
        """(when ``g`` could give ``k`` slices of ``p``, the memory slots they take)."""
        key = ("slices", p, k, len(g.used))
        hit = g.memo.get(key)
        if hit is None:
            hit = g.memo[key] = self._earliest_slices_now(g, p, k)
        return hit

    def _earliest_slices_now(self, g: _Gpu, p: str, k: int) -> tuple[float, int]:
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
                new = _place(g.model, [p] * k, still)
                if new is not None:
                    if step or _place(g.model, [p] * k, list(g.slices.values())) is None:
                        t = max(t, self._interval_end(g))      # free slices must go first
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
            for g in self._candidates(job, SHARED_MODES):
                if g.busy or not node_ok(g.node, ()):
                    continue
                v = g.view
                if v.mode == "mig":
                    for s in g.slices.values():
                        sv = next(x for x in v.slices if x.start == s.start)
                        cap = slice_capacity_mb(s.profile, sv.memory_mb)
                        if cap >= want and s.start not in g.used and g.allowed(job.job_id, end, g.mask(s)):
                            offer((max(0, sv.memory_mb - want), 0, 0, g.node, g.index, s.start),
                                  _start_slice(g, s, sv, end))
                elif self._share_fits(g, job, end):
                    waste = 0 if v.mode == "mps" else max(0, v.memory_mb // max(1, v.replicas) - want)
                    offer((waste, 0, _KIND_RANK[v.mode], g.node, g.index, 0), _start_share(g, job, end))
            for i in sorted(members):
                if not c.up[i]:
                    continue
                views = {v.index: v for v in c.nodes[i].gpus}
                for gi in c.free[i]:
                    v = views[gi]
                    if v.memory_mb >= want and _type_ok(job, v) and node_ok(i, (gi,)):
                        offer((v.memory_mb - want, 0, 3, i, gi, 0),
                              lambda i=i, v=v: Decision(node=i, gpu_indices=(v.index,),
                                                        devices=(Device(v.index, "gpu", v.uuid),)))
                        break          # the lowest free GPU of a node is as good as the others
        immediate = best is not None
        # new or incoming slices on dynamic GPUs
        for g in self._candidates(job, ("mig",)):
            if not self._node_ok_later(g.node, job):
                continue
            q = _profile_for_memory(g.model, want)
            if q is None:
                continue
            mem = _catalog(g.model)[q].memory_mb
            if g.incoming.get(q, 0) > 0:
                offer((max(0, mem - want), 1, 0, g.node, g.index, 0), _take_incoming(g, q))
            elif g.view.dynamic:
                o = self._option(g, [q], end, job.job_id)
                if o is not None:
                    offer((max(0, mem - want), 1, 0 if not o.destroy else 1, g.node, g.index, 0),
                          lambda o=o, q=q: Decision(reason="MigReconfig", relayouts=[self._commit(o, job, q)]))
        if best is not None:
            return best[1]()
        if not immediate:
            self._failed.add(shape)
        return self._wait_for_memory(job, want, may_claim)

    def _share_fits(self, g: _Gpu, job: PendingJob, end: float) -> bool:
        v, want = g.view, job.gpu_mem_mb or 0
        if not g.allowed(job.job_id, end):
            return False
        if v.mode == "mps":
            return (len(g.clients) < v.mps_max_clients and g.users() <= {job.user}
                    and g.mem_used() + want <= v.memory_mb)
        return len(g.clients) < v.replicas and want <= v.memory_mb

    def _wait_for_memory(self, job: PendingJob, want: int, may_claim: bool) -> Decision:
        best: tuple[float, int, int, _Gpu] | None = None
        reconfiguring = False
        for g in self._candidates(job, SHARED_MODES):
            if not self._node_fits(g.node, job) or _most_memory(g) < want:
                continue
            reconfiguring |= g.view.reconfiguring
            t = self._earliest_share(g, job, want)
            if t < INF and (best is None or (t, g.node, g.index) < best[:3]):
                best = (t, g.node, g.index, g)
        reason = "MigReconfig" if reconfiguring else "Resources"
        if best is None or not may_claim:
            return Decision(reason=reason)
        t, _, _, g = best
        g.claims.append(_Claim(job.job_id, t))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _earliest_share(self, g: _Gpu, job: PendingJob, want: int) -> float:
        key = ("share", job.user, want, len(g.used), len(g.clients))
        hit = g.memo.get(key)
        if hit is None:
            hit = g.memo[key] = self._earliest_share_now(g, job, want)
        return hit

    def _earliest_share_now(self, g: _Gpu, job: PendingJob, want: int) -> float:
        v = g.view
        if v.mode == "mig":
            ends = sorted(g.used.get(s.start, self.now) for s in g.slices.values()
                          if slice_capacity_mb(s.profile, _slice_mem(v, s.start)) >= want)
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

    # -- invariants, for tests --------------------------------------------------------------------

    def check(self) -> None:
        """AssertionError if any shared GPU is over-allocated (a bug, never input)."""
        for g in self.gpus:
            v = g.view
            if v.mode == "mps":
                assert len(g.clients) <= v.mps_max_clients, f"MPS clients over {v.mps_max_clients}"
                assert len(g.users()) <= 1, "two users on one MPS GPU"
            elif v.mode == "timeslice":
                assert len(g.clients) <= v.replicas, "time-slice replicas over-allocated"


# -- helpers -----------------------------------------------------------------------------------

# Placement searches repeat across jobs and passes (a few layouts, a few profiles): they are
# pure, so their answers are kept, up to a bound.
_PLACED: dict[tuple, tuple[mig.Slice, ...] | None] = {}
_LAYOUTS: dict[tuple, tuple[mig.Slice, ...] | None] = {}
_CATALOGS: dict[str, dict[str, mig.MigProfile]] = {}
_CACHE_MAX = 20000


def _catalog(model: str) -> dict[str, mig.MigProfile]:
    """``mig.catalog``, kept (MigError for a model without MIG, as there)."""
    cat = _CATALOGS.get(model)
    if cat is None:
        cat = _CATALOGS[model] = mig.catalog(model)
    return cat


def _place(model: str, profiles: list[str], used: Iterable[mig.Slice]) -> list[mig.Slice] | None:
    key = (model, tuple(profiles), tuple(sorted(used)))
    if key not in _PLACED:
        if len(_PLACED) > _CACHE_MAX:
            _PLACED.clear()
        found = mig.place(model, profiles, key[2])
        _PLACED[key] = None if found is None else tuple(found)
    hit = _PLACED[key]
    return None if hit is None else list(hit)


def _load_layout(g: _Gpu) -> bool:
    """Read a MIG GPU's reported slices; False (no MIG use) for an unknown model or bad layout."""
    key = (g.model, tuple((s.profile, s.start) for s in g.view.slices))
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > _CACHE_MAX:
            _LAYOUTS.clear()
        try:
            slices = [mig.Slice(mig.parse_profile(p, g.model), start) for p, start in key[1]]
            mig.validate_layout(g.model, slices)
            _LAYOUTS[key] = tuple(slices)
        except mig.MigError:
            _LAYOUTS[key] = None
    slices = _LAYOUTS[key]
    if slices is None:
        return False
    g.slices = {s.start: s for s in slices}
    return True


def _type_ok(job: PendingJob, g: _Gpu | GpuView) -> bool:
    return job.gpu_type is None or g.model == job.gpu_type


def _has_profile(g: _Gpu, job: PendingJob) -> bool:
    if job.mig_profile is None:
        return True
    try:
        return job.mig_profile in _catalog(g.model)
    except mig.MigError:
        return False


def _slice_mem(v: GpuView, start: int) -> int:
    return next((s.memory_mb for s in v.slices if s.start == start), 0)


def _most_memory(g: _Gpu) -> int:
    """The largest device this GPU could ever give one job."""
    v = g.view
    if v.mode != "mig":
        return v.memory_mb
    if not g.layout_ok:
        return 0
    if v.dynamic:
        return max((slice_capacity_mb(p.name, p.memory_mb) for p in _catalog(v.model).values()), default=0)
    return max((slice_capacity_mb(s.profile, _slice_mem(v, s.start)) for s in g.slices.values()), default=0)


def _profile_for_memory(model: str, want: int) -> str | None:
    """The smallest plain profile whose memory (real or nominal) holds ``want`` MiB."""
    fits = [p for p in _catalog(model).values()
            if not p.media_extensions and slice_capacity_mb(p.name, p.memory_mb) >= want]
    return min(fits, key=lambda p: (p.memory_mb, p.compute_slices)).name if fits else None


def _start_slice(g: _Gpu, s: mig.Slice, sv, end: float) -> Callable[[], Decision]:
    def act() -> Decision:
        g.used[s.start] = end
        return Decision(node=g.node, devices=(Device(g.index, "mig", sv.uuid, s.start, sv.memory_mb, s.profile),))
    return act


def _start_share(g: _Gpu, job: PendingJob, end: float) -> Callable[[], Decision]:
    def act() -> Decision:
        want = job.gpu_mem_mb or 0
        g.clients.append((end, job.user, want))
        return Decision(node=g.node, devices=(Device(g.index, g.view.mode, g.view.uuid, None, want),))
    return act


def _take_incoming(g: _Gpu, q: str) -> Callable[[], Decision]:
    def act() -> Decision:
        g.incoming[q] -= 1
        return Decision(reason="MigReconfig")
    return act

