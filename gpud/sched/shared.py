"""A pass's shared GPUs: what is free on them now, and whether a fractional request could ever fit.

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

Two kinds of request use these GPUs.  ``--gpus 1g.10gb:2`` (``mig_profile``) wants slices
of one MIG profile on one node: gpud/sched/slices.py, which also re-lays ``mig:dynamic``
GPUs.  ``--gpu-mem 20G`` (``gpu_mem_mb``) wants one device with that much memory, a MIG
slice, an MPS share, a time-slice replica or a whole GPU: gpud/sched/shares.py.  Both
answer with a ``Decision``: start now on these devices, or wait, with a reason and, when
``backfill_depth`` allows, a *claim* on the GPU where the job can start earliest (lower
jobs may use a claimed GPU only if they end before the claimed time or, on MIG, on slices
outside the memory slots the claim needs).  Claims last for one pass; the next pass, in
priority order, makes them again.

This module holds what both need: the GPUs by node, the GPUs a request may use
(``candidates``), and whether a request could ever be served here (``misfit``) and the
least fraction of a GPU it would count (``least_fraction``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..gpu import mig
from .gpustate import (SHARED_MODES, GpuState, catalog, has_profile, load_layout, most_memory, profile_for_memory,
                       type_ok)
from .placement import Cluster
from .plan import Relayout
from .snapshot import Device, PendingJob, Snapshot

INF = math.inf

NodeOk = Callable[[int, tuple[int, ...]], bool]   # (node, whole GPUs taken) -> may start there now


@dataclass(slots=True)
class Decision:
    """What the pass does with one fractional job."""

    node: int | None = None                         # set: start there now
    devices: tuple[Device, ...] = ()
    gpu_indices: tuple[int, ...] = ()               # a whole GPU, for a --gpu-mem job
    reason: str | None = None                       # else: why it waits
    expected: float | None = None                   # and when it expects to start (claimed)
    expected_node: int | None = None
    relayouts: tuple[Relayout, ...] = ()


class SharedGpus:
    """The shared GPUs of one pass (see the module docstring)."""

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
                    g.add_client(end, r.user, d.mem_mb or 0)
        self._members: dict[str, frozenset[int]] = {}
        self._cands: dict[tuple, list[GpuState]] = {}
        self._cand_sets: dict[tuple, frozenset[GpuState]] = {}
        self._misfits: dict[tuple, str | None] = {}
        self._least: dict[tuple, float] = {}

    def members(self, partition: str) -> frozenset[int]:
        m = self._members.get(partition)
        if m is None:
            m = self._members[partition] = frozenset(self.cluster.members.get(partition, ()))
        return m

    def candidates(self, job: PendingJob, kinds: tuple[str, ...]) -> list[GpuState]:
        """The GPUs of these kinds the job may use: its partition's, on nodes that are up, of
        its type, and for a MIG GPU a known layout with the job's profile in the catalog."""
        key = (job.partition, job.gpu_type, job.mig_profile, kinds)
        found = self._cands.get(key)
        if found is None:
            members = self.members(job.partition)
            found = self._cands[key] = [
                g for g in self.gpus if g.node in members and self.cluster.up[g.node]
                and g.view.mode in kinds and type_ok(job, g)
                and (g.view.mode != "mig" or (g.layout_ok and has_profile(g, job)))]
        return found

    def candidate_set(self, job: PendingJob, kinds: tuple[str, ...]) -> frozenset[GpuState]:
        key = (job.partition, job.gpu_type, job.mig_profile, kinds)
        found = self._cand_sets.get(key)
        if found is None:
            found = self._cand_sets[key] = frozenset(self.candidates(job, kinds))
        return found

    def node_fits(self, i: int, job: PendingJob) -> bool:
        """Whether node ``i`` is big enough for the job's CPUs and memory, when empty."""
        c = self.cluster
        return c.total_cpus[i] >= job.cpus and c.total_mem[i] >= job.mem_mb

    def node_ok_later(self, i: int, job: PendingJob) -> bool:
        """Whether node ``i`` is up with the job's CPUs and memory free now."""
        c = self.cluster
        return c.up[i] and c.cpus[i] >= job.cpus and c.mem[i] >= job.mem_mb

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
        key = (job.partition, job.gpu_type, job.mig_profile, job.gpus, job.gpu_mem_mb)
        hit = self._least.get(key)
        if hit is not None:
            return hit
        fracs = []
        if job.mig_profile:
            for g in self.candidates(job, ("mig",)):
                fracs.append(catalog(g.model)[job.mig_profile].fraction * max(1, job.gpus))
        else:
            want = job.gpu_mem_mb or 0
            for g in self.candidates(job, SHARED_MODES):
                v = g.view
                if v.mode == "mps":
                    fracs.append(min(1.0, want / v.memory_mb) if v.memory_mb > 0 else 1.0)
                elif v.mode == "timeslice":
                    fracs.append(1.0 / max(1, v.replicas))
                else:
                    q = profile_for_memory(g.model, want) if g.layout_ok else None
                    if q is not None:
                        fracs.append(catalog(g.model)[q].fraction)
        least = self._least[key] = min(fracs, default=1.0)
        return least


def slice_device(g: GpuState, s: mig.Slice) -> Device:
    """The device a job gets for slice ``s`` of ``g``."""
    v = g.by_start[s.start]
    return Device(g.index, "mig", v.uuid, s.start, v.memory_mb, s.profile)
