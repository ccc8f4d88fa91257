"""Memory requests in a scheduling pass: one device with enough GPU memory for a ``--gpu-mem`` job.

Theory of operation
-------------------
``--gpu-mem 20G`` (``gpu_mem_mb``) wants one device with that much memory: an existing MIG
slice, an MPS share, a time-slice replica or a whole GPU, whichever wastes least memory
(ties: MIG, MPS, time-slice, whole), or a new slice cut for it on a ``mig:dynamic`` GPU
(gpud/sched/slices.py), or one a re-layout of this pass is already bringing.  A slice
satisfies a memory request by its real memory or by the size in its name (``1g.20gb`` holds
a ``--gpu-mem 20G`` job although NVML reports 19968 MiB).

An MPS GPU takes shares up to its client limit and its memory (the sum of the pinned
shares), from one user at a time; a time-sliced GPU takes up to its replicas, from anyone.
An idle ``mps:dynamic`` GPU may go whole to a ``--gpus N`` job, and once it has a share it
takes only shares.  Under placement ``shapes`` the MPS GPU a share goes to is the one whose
use leaves the least fragmentation (gpud/sched/shapes.py).

Waiting.  A memory job that cannot start claims the shared GPU where it can start earliest
(gpud/sched/shared.py), so one user's stream of MPS jobs does not starve another user.

Scale.  Slices and whole GPUs are indexed by memory (the first one still free that holds
the job wastes least), MPS GPUs are kept by the user whose shares they hold, and a waiting
request's earliest GPU is kept while that GPU is unchanged; tests/test_sched_sharing_fastpath.py
holds each to the plain computation.
"""

from __future__ import annotations

import bisect
from itertools import islice
from typing import Callable

from ..gpu import mig
from .gpustate import (SHARED_MODES, Claim, GpuState, catalog, most_memory, profile_for_memory, slice_capacity_mb,
                       slice_mem, type_ok)
from .shapes import ShapeIndex
from .shared import INF, Decision, NodeOk, SharedGpus, slice_device
from .slices import Slices
from .snapshot import Device, PendingJob

_KIND_RANK = {"mig": 0, "mps": 1, "timeslice": 2, "gpu": 3}


class Best:
    """The best of the ways to serve a request offered: the least key, first offered on a tie."""

    def __init__(self) -> None:
        self.key: tuple | None = None          # (waste MiB, later?, kind rank, node, gpu, slot)
        self.act: Callable[[], Decision] | None = None

    def offer(self, key: tuple, act: Callable[[], Decision]) -> None:
        if self.key is None or key < self.key:
            self.key, self.act = key, act


class Shares:
    """The ``--gpu-mem`` half of a pass's fractional requests (see the module docstring)."""

    def __init__(self, pool: SharedGpus, slices: Slices) -> None:
        self.pool, self.slices, self.cluster, self.now = pool, slices, pool.cluster, pool.now
        # Pruning, by request shape (as in slices.py): what found nothing once finds nothing again.
        self._failed: set[tuple] = set()           # nothing to start now
        self._no_relayout: set[tuple] = set()      # no new slice possible now
        self._reasons: dict[tuple, str] = {}       # the reason of a job past backfill_depth
        self._slices_by_memory: list[tuple] | None = None
        self._whole_by_memory: list[tuple] | None = None
        self._mps: dict[str | None, list[tuple[int, int, GpuState]]] | None = None   # see _first_mps
        self._mps_room: dict[str | None, int] = {}
        self._timeslice_of: dict[int, list[GpuState]] = {}
        self._earliest: dict[tuple, tuple[GpuState | None, tuple | None, bool]] = {}   # see _earliest_gpu
        self.scorer: ShapeIndex | None = None     # placement "shapes": where a share goes (shapes.py)

    def consider(self, job: PendingJob, end: float, node_ok: NodeOk, may_claim: bool) -> Decision:
        want = job.gpu_mem_mb or 0
        shape = ("mem", want, job.user, job.partition, job.gpu_type, job.cpus, job.mem_mb, end)
        pool, c = self.pool, self.cluster
        members = pool.members(job.partition)
        best = Best()
        offer = best.offer
        if shape not in self._failed:
            # Each kind's least wasteful device: the indexes are sorted by memory, so the first
            # one still free (and allowed) is it.
            usable = pool.candidate_set(job, SHARED_MODES)
            slices = self._slice_index()
            stale = 0
            for mem, _, _, _, g, sl in islice(slices, bisect.bisect_left(slices, (want * 5 // 6,)), None):
                if g.busy or sl.start in g.used:
                    stale += 1
                    continue
                if (g in usable and slice_capacity_mb(sl.profile, mem) >= want
                        and g.allowed(job.job_id, end, g.mask(sl)) and node_ok(g.node, ())):
                    offer((max(0, mem - want), 0, 0, g.node, g.index, sl.start), _start_slice(g, sl, end))
                    break
            if stale > 64:                         # taken slices stay taken: drop them
                self._slices_by_memory = [e for e in slices if not e[4].busy and e[5].start not in e[4].used]
            scored = None
            if self.scorer is not None:
                shareable = pool.candidate_set(job, ("mps", "timeslice"))
                scored = self.scorer.gpu_for_share(
                    want, job.cpus, job.mem_mb, job.gpu_type,
                    lambda g: (g in shareable and not g.busy and self._share_fits(g, job, end)
                               and node_ok(g.node, ())))
                if scored is not None:
                    offer((0, 0, _KIND_RANK["mps"], scored.node, scored.index, 0), self._start_share(scored, job, end))
            if scored is None:
                self._offer_share(job, end, node_ok, best)
            whole = self._whole_index()
            taken = 0
            for mem, i, gi, v in islice(whole, bisect.bisect_left(whole, (want,)), None):
                if gi not in c.free[i]:
                    taken += 1
                    continue
                if i in members and type_ok(job, v) and node_ok(i, (gi,)):
                    offer((mem - want, 0, 3, i, gi, 0),
                          lambda i=i, v=v: Decision(node=i, gpu_indices=(v.index,),
                                                    devices=(Device(v.index, "gpu", v.uuid),)))
                    break
            if taken > 64:                         # and so do whole GPUs taken
                self._whole_by_memory = [e for e in whole if e[2] in c.free[e[1]]]
        immediate = best.key is not None
        # slices being cut in this pass, else a new one on a dynamic GPU
        self._offer_incoming(job, want, best)
        again = ("mem", want, job.partition, job.gpu_type, job.cpus, job.mem_mb)
        if again not in self._no_relayout:
            found = self.slices.new_slice_for(job, want)
            if found is None:
                self._no_relayout.add(again)
            else:
                o, q = found
                offer((max(0, catalog(o.gpu.model)[q].memory_mb - want), 1, 1 if o.destroy else 0,
                       o.gpu.node, o.gpu.index, 0),
                      lambda: Decision(reason="MigReconfig", relayouts=(self.slices.commit(o, job, q),)))
        if best.act is not None:
            return best.act()
        if not immediate:
            self._failed.add(shape)
        return self._wait_for_memory(job, want, may_claim)

    def _slice_index(self) -> list[tuple]:
        """(memory, node, GPU, start, GpuState, slice) of every slice of a usable MIG GPU."""
        if self._slices_by_memory is None:
            self._slices_by_memory = sorted(
                ((g.by_start[sl.start].memory_mb, g.node, g.index, sl.start, g, sl)
                 for g in self.pool.gpus if g.view.mode == "mig" and g.layout_ok for sl in g.slices.values()),
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

    def _offer_share(self, job: PendingJob, end: float, node_ok: NodeOk, best: Best) -> None:
        """Offer the MPS share or time-slice replica that wastes least.  An MPS share wastes
        nothing, at MPS's rank: the first that fits beats any replica, which is then only
        looked at when no MPS GPU fits."""
        g = self._first_mps(job, end, node_ok)
        if g is not None:
            best.offer((0, 0, _KIND_RANK["mps"], g.node, g.index, 0), self._start_share(g, job, end))
            return
        want = job.gpu_mem_mb or 0
        for g in self._timesliced(job):
            if g.busy or not self._share_fits(g, job, end) or not node_ok(g.node, ()):
                continue
            waste = max(0, g.view.memory_mb // max(1, g.view.replicas) - want)
            best.offer((waste, 0, _KIND_RANK["timeslice"], g.node, g.index, 0), self._start_share(g, job, end))

    def _offer_incoming(self, job: PendingJob, want: int, best: Best) -> None:
        """Offer each slice a re-layout of this pass brings that holds ``want`` MiB."""
        pool = self.pool
        incoming = self.slices.incoming
        if not incoming:
            return
        mig_ok = pool.candidate_set(job, ("mig",))
        fits: dict[str, str | None] = {}       # model -> the profile for ``want``
        for q, gs in incoming.items():
            for g in gs:
                if g.model not in fits:
                    fits[g.model] = profile_for_memory(g.model, want)
                if fits[g.model] == q and g in mig_ok and pool.node_ok_later(g.node, job):
                    best.offer((max(0, catalog(g.model)[q].memory_mb - want), 1, 0, g.node, g.index, 0),
                               _take_incoming(self.slices, g, q))

    def _first_mps(self, job: PendingJob, end: float, node_ok: NodeOk) -> GpuState | None:
        """The first MPS GPU, in node and GPU order, where the job's share fits now.

        A share may go only where no other user's are, so the MPS GPUs are kept by the one
        user whose shares they hold (or none yet): two short lists to look through, each
        with the most memory a share could still get on one of its GPUs (shares only come in
        a pass, so a list without room for the job is passed over)."""
        if self._mps is None:
            self._mps, self._mps_room = {}, {}
            for g in self.pool.gpus:
                users = g.users()
                if g.view.mode == "mps" and len(users) <= 1:
                    self._mps.setdefault(next(iter(users), None), []).append((g.node, g.index, g))
        shareable = self.pool.candidate_set(job, ("mps", "timeslice"))
        want = job.gpu_mem_mb or 0
        best: tuple[int, int, GpuState] | None = None
        for owner in (None, job.user):
            filed = self._mps.get(owner, ())
            room = self._mps_room.get(owner)
            if room is None:
                room = self._mps_room[owner] = max(
                    (g.view.memory_mb - g.mem_used() for _, _, g in filed if len(g.clients) < g.view.mps_max_clients),
                    default=-1)
            if want > room:
                continue
            for entry in filed:
                if best is not None and entry[:2] > best[:2]:
                    break
                g = entry[2]
                if g in shareable and not g.busy and self._share_fits(g, job, end) and node_ok(g.node, ()):
                    best = entry
                    break
        return None if best is None else best[2]

    def _timesliced(self, job: PendingJob) -> list[GpuState]:
        cands = self.pool.candidates(job, ("mps", "timeslice"))
        found = self._timeslice_of.get(id(cands))
        if found is None:
            found = self._timeslice_of[id(cands)] = [g for g in cands if g.view.mode == "timeslice"]
        return found

    def _start_share(self, g: GpuState, job: PendingJob, end: float) -> Callable[[], Decision]:
        def act() -> Decision:
            want = job.gpu_mem_mb or 0
            if not g.clients:
                if g.view.dynamic:         # an idle mps:dynamic GPU turns to shares
                    self.cluster.allocate(g.node, (g.index,), 0, 0)
                if self._mps is not None and g.view.mode == "mps":     # it is this user's now
                    entry = (g.node, g.index, g)
                    self._mps[None].remove(entry)
                    bisect.insort(self._mps.setdefault(job.user, []), entry, key=lambda e: e[:2])
                    self._mps_room.pop(None, None)
            room = g.view.memory_mb - g.mem_used()
            g.add_client(end, job.user, want)
            if self._mps is not None and g.view.mode == "mps" and room >= self._mps_room.get(job.user, room):
                self._mps_room.pop(job.user, None)    # it may have been the roomiest: look again
            return Decision(node=g.node, devices=(Device(g.index, g.view.mode, g.view.uuid, None, want),))
        return act

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

    # -- waiting --------------------------------------------------------------------------------

    def _wait_for_memory(self, job: PendingJob, want: int, may_claim: bool) -> Decision:
        pool = self.pool
        if not may_claim:              # the reason only: whether a GPU it could use is being re-laid
            key = (job.partition, job.gpu_type, want, job.cpus, job.mem_mb)
            hit = self._reasons.get(key)
            if hit is None:
                hit = self._reasons[key] = "MigReconfig" if any(
                    g.view.reconfiguring for g in pool.candidates(job, SHARED_MODES)
                    if pool.node_fits(g.node, job) and most_memory(g) >= want) else "Resources"
            return Decision(reason=hit)
        g, reconfiguring = self._earliest_gpu(job, want)
        reason = "MigReconfig" if reconfiguring else "Resources"
        if g is None:
            return Decision(reason=reason)
        t = self._earliest_share(g, job, want)
        g.add_claim(Claim(job.job_id, t))
        return Decision(reason=reason, expected=t, expected_node=g.node)

    def _earliest_gpu(self, job: PendingJob, want: int) -> tuple[GpuState | None, bool]:
        """The shared GPU on a node big enough for the job where its share or slice comes
        earliest (then node and GPU order), and whether any it could use is being re-laid.

        As for slices (slices.py, ``Slices._earliest_gpu``): a GPU's earliest time only gets
        later in a pass, so the GPU found last time for the same request stays the answer
        while it is unchanged."""
        pool = self.pool
        cands = pool.candidates(job, SHARED_MODES)
        key = (job.user, want, job.cpus, job.mem_mb, id(cands))
        hit = self._earliest.get(key)
        if hit is not None and (hit[0] is None or self._version(hit[0]) == hit[1]):
            return hit[0], hit[2]
        best: tuple[float, int, int, GpuState] | None = None
        reconfiguring = False
        for g in cands:
            if not pool.node_fits(g.node, job) or most_memory(g) < want:
                continue
            reconfiguring |= g.view.reconfiguring
            t = self._earliest_share(g, job, want)
            if t < INF and (best is None or (t, g.node, g.index) < best[:3]):
                best = (t, g.node, g.index, g)
        g = None if best is None else best[3]
        self._earliest[key] = (g, None if g is None else self._version(g), reconfiguring)
        return g, reconfiguring

    def _version(self, g: GpuState) -> tuple:
        """What ``_earliest_share`` reads of ``g`` that a pass changes: its slices in use, its
        clients, and whether it is free as a whole GPU (an mps:dynamic one a job took whole
        is not to be had until the timeline says)."""
        return len(g.used), len(g.clients), g.view.index in self.cluster.free[g.node]

    def _earliest_share(self, g: GpuState, job: PendingJob, want: int) -> float:
        key = ("share", job.user, want, self._version(g))
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


def _start_slice(g: GpuState, s: mig.Slice, end: float) -> Callable[[], Decision]:
    def act() -> Decision:
        g.take(s.start, end)
        return Decision(node=g.node, devices=(slice_device(g, s),))
    return act


def _take_incoming(slices: Slices, g: GpuState, q: str) -> Callable[[], Decision]:
    def act() -> Decision:
        slices.take_incoming(g, q, 1)
        return Decision(reason="MigReconfig")
    return act
