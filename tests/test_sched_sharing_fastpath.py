"""The fractional pass's shortcuts give what the plain computation gives.

Each shortcut of slices.py, relayout.py and shares.py (free slices kept per profile busiest
first, re-layout options searched per GPU state, the earliest GPU of a waiting request kept
while it is unchanged, earliest times shared by GPUs in one state, MPS GPUs kept by user,
re-laid GPUs kept per profile they bring, ``layouts_for_demand`` answers kept) is replaced
here by the straightforward way of computing the same thing (``PlainSlices``,
``PlainShares``), and whole plans must come out the same on random snapshots and on passes
of random traffic.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

import gpud.sched.core as core
from gpud.gpu import mig
from gpud.sched import gpustate
from gpud.sched.core import schedule
from gpud.sched.gpustate import most_memory, profile_for_memory
from gpud.sched.placement import Cluster
from gpud.sched.plan import Plan
from gpud.sched.shared import SharedGpus
from gpud.sched.shares import _KIND_RANK, Best, Shares, _take_incoming
from gpud.sched.slices import Slices
from gpud.sched.snapshot import Snapshot

from .sched_builders import pending
from .sharing_rig import GiB, ShareRig, config, mig_gpu, mps_gpu, shared_node, timeslice_gpu, whole_gpu
from .test_sched_sharing_plans import NOW, _Builder, bench_like


class Forgetful(dict):
    """A cache that never keeps anything: every lookup misses."""

    def __setitem__(self, key, value) -> None:
        pass


class PlainSlices(Slices):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._earliest = Forgetful()
        self._earliest_of = Forgetful()

    def _free_now(self, job, p, k, end, node_ok, cands, usable):
        return self._free_on_a_node(job, p, k, end, node_ok, cands)

    def _bringing(self, job, p, k, usable):
        return next((g for g in self.cut if g.incoming.get(p, 0) >= k and g in usable
                     and self.pool.node_fits(g.node, job)), None)

    def _brought(self, model):
        total: Counter = Counter()
        for h in self.cut:
            if h.model == model:
                total.update(h.incoming)
        return total

    def _new_slice(self, job, profile_of):
        """Every dynamic GPU the job may use, busiest first: the first that cuts the slice
        without destroying any, else the one destroying fewest."""
        pool = self.pool
        gs = sorted((g for g in pool.candidates(job, ("mig",))
                     if g.view.dynamic and not g.busy and pool.node_ok_later(g.node, job)),
                    key=lambda g: (-g.used_compute(), g.node, g.index))
        for destroying in (False, True):
            best = None
            for g in gs:
                q = profile_of(g.model)
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


class PlainShares(Shares):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._earliest = Forgetful()

    def _offer_share(self, job, end, node_ok, best: Best) -> None:
        want = job.gpu_mem_mb or 0
        for g in self.pool.candidates(job, ("mps", "timeslice")):
            v = g.view
            if g.busy or not self._share_fits(g, job, end) or not node_ok(g.node, ()):
                continue
            waste = 0 if v.mode == "mps" else max(0, v.memory_mb // max(1, v.replicas) - want)
            best.offer((waste, 0, _KIND_RANK[v.mode], g.node, g.index, 0), self._start_share(g, job, end))

    def _offer_incoming(self, job, want, best: Best) -> None:
        mig_ok = self.pool.candidate_set(job, ("mig",))
        for g in self.slices.cut:
            q = profile_for_memory(g.model, want)
            if (g in mig_ok and q is not None and g.incoming.get(q, 0) > 0
                    and self.pool.node_ok_later(g.node, job)):
                best.offer((max(0, gpustate.catalog(g.model)[q].memory_mb - want), 1, 0, g.node, g.index, 0),
                           _take_incoming(self.slices, g, q))

    def _share_fits(self, g, job, end) -> bool:
        assert g.mem_used() == sum(m for _, _, m in g.clients)
        assert g.users() == {u for _, u, _ in g.clients}
        return super()._share_fits(g, job, end)


def plain_schedule(snap: Snapshot, now: float) -> Plan:
    saved = core.Slices, core.Shares, gpustate._DEMANDED
    core.Slices, core.Shares, gpustate._DEMANDED = PlainSlices, PlainShares, Forgetful()
    try:
        return schedule(snap, now)
    finally:
        core.Slices, core.Shares, gpustate._DEMANDED = saved


def assert_plain_agrees(snap: Snapshot, now: float) -> Plan:
    plan = schedule(snap, now)
    assert plain_schedule(snap, now) == plan
    return plan


@pytest.mark.parametrize("seed", range(0, 150, 10))
def test_random_snapshots_plan_as_the_plain_computation(seed):
    plans = [assert_plain_agrees(_Builder(s).snapshot(s), NOW) for s in range(seed + 1000, seed + 1010)]
    assert any(p.starts for p in plans) and any(p.relayouts for p in plans)


@pytest.mark.parametrize("seed", [30, 31, 32, 33])
def test_big_shared_clusters_plan_as_the_plain_computation(seed):
    plan = assert_plain_agrees(bench_like(seed), NOW)
    assert len(plan.starts) > 100 and len(plan.relayouts) > 20


def _traffic_rig(seed: int) -> ShareRig:
    rnd = random.Random(seed)
    nodes = []
    for n in range(rnd.randint(1, 3)):
        name = f"n{n}"
        gpus = []
        for i in range(rnd.randint(1, 4)):
            kind = rnd.choice(["mig", "mig", "mps", "timeslice", "whole"])
            if kind == "mig":
                gpus.append(mig_gpu(i, rnd.choice(["A100-80GB", "H100-80GB"]), node=name,
                                    layout=rnd.choice([None, "all-1g.10gb", "all-balanced", "all-3g.40gb"]),
                                    dynamic=rnd.random() < 0.8, relaid_at=rnd.choice([None, -3600.0, -60.0])))
            elif kind == "mps":
                gpus.append(mps_gpu(i, clients=rnd.randint(1, 6), node=name))
            elif kind == "timeslice":
                gpus.append(timeslice_gpu(i, replicas=rnd.randint(1, 4), node=name))
            else:
                gpus.append(whole_gpu(i, node=name))
        nodes.append(shared_node(name, gpus, cpus=rnd.choice([8, 64])))
    rig = ShareRig.of(*nodes, cfg=config(scheduler={"mig_min_interval": "2m",
                                                    "backfill_depth": rnd.choice([1, 100])}))
    profiles = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    for _ in range(rnd.randint(5, 40)):
        kind = rnd.choice(["mig"] * 4 + ["mem"] * 3 + ["whole"])
        user, duration = rnd.choice(["a", "b", "c"]), rnd.randint(60, 3600)
        if kind == "mig":
            rig.submit(mig_profile=rnd.choice(profiles), gpus=rnd.choice([1, 1, 1, 2, 3]), user=user,
                       duration=duration, cpus=rnd.choice([1, 4]))
        elif kind == "mem":
            rig.submit(gpu_mem_mb=rnd.choice([5, 10, 20, 40, 80]) * GiB, user=user, duration=duration)
        else:
            rig.submit(gpus=rnd.choice([1, 2]), user=user, duration=duration)
    return rig


@pytest.mark.parametrize("seed", range(12))
def test_passes_of_random_traffic_plan_as_the_plain_computation(seed):
    """Pass after pass (slices re-laid, jobs ending, the interval running out), each plan is
    the one the plain computation gives."""
    rig = _traffic_rig(seed)
    for _ in range(40):
        assert_plain_agrees(rig.snapshot(), rig.now)
        rig.step()
        if not rig.pending:
            break
        rig.advance(min(rig.now + 300.0, max(rig.now + 1.0, rig.next_end())))


def test_kept_layouts_for_demand_are_the_catalogs():
    """Counts past what one GPU can hold give the answer the catalog gives for them."""
    rnd = random.Random(7)
    for model in ("A100-80GB", "H100-80GB", "A30-24GB"):
        names = [p for p in mig.catalog(model) if not p.endswith("+me")]
        for _ in range(200):
            used: list[mig.Slice] = []
            for _ in range(rnd.randint(0, 3)):
                used += mig.place(model, [rnd.choice(names)], used) or []
            demand = {p: rnd.choice([1, 2, 5, 9, 300]) for p in rnd.sample(names, rnd.randint(1, len(names)))}
            assert gpustate.layouts_for_demand(model, demand, used) == mig.layouts_for_demand(model, demand, used)


# -- the earliest-GPU answers kept while that GPU is unchanged -------------------------------------

def _pass_state(seed: int):
    """A pass's shared GPUs on a random snapshot, with its slice and share halves."""
    snap = _Builder(seed).snapshot(seed)
    pool = SharedGpus(snap, Cluster(snap.nodes, snap.running, snap.config), NOW)
    slices = Slices(pool, snap.pending)
    return snap, pool, slices, Shares(pool, slices)


def _mutate(rnd: random.Random, pool: SharedGpus) -> None:
    """Something a pass does to a shared GPU: a slice taken, a share or replica added, an
    idle mps:dynamic GPU given whole (claims aside: the answers must hold whatever starts)."""
    g = rnd.choice(pool.gpus)
    end = NOW + rnd.choice([60.0, 600.0, 5000.0, float("inf")])
    if g.view.mode == "mig":
        free = [s for s in g.slices if s not in g.used]
        if free:
            g.take(rnd.choice(free), end)
    elif g.view.dynamic and not g.clients:      # idle mps:dynamic: whole, or its first share
        if g.index in pool.cluster.free[g.node]:
            pool.cluster.allocate(g.node, (g.index,), 0, 0)
            if rnd.random() < 0.5:
                g.add_client(end, rnd.choice(["u0", "u1"]), rnd.choice([0, 5, 20]) * GiB)
    else:
        g.add_client(end, rnd.choice(["u0", "u1"]), rnd.choice([0, 5, 20]) * GiB)


@pytest.mark.parametrize("seed", range(20))
def test_the_earliest_gpu_kept_for_a_request_is_a_fresh_scans(seed):
    """Earliest times only get later as a pass goes on, so the GPU found last time for the same
    request stays the answer while it is unchanged: after any mix of changes, the kept answer
    is the one a scan of every GPU, computing every time afresh, gives."""
    rnd = random.Random(seed)
    snap, pool, slices, shares = _pass_state(seed)
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.6gb", "4g.24gb"]
    for step in range(60):
        p, k, want = rnd.choice(profiles), rnd.choice([1, 1, 2]), rnd.choice([5, 10, 20, 40, 80]) * GiB
        job = pending(step + 1, k, mig_profile=p, cpus=rnd.choice([1, 16]))
        cands = pool.candidates(job, ("mig",))
        fresh = [(t, g.node, g.index, g, mask) for g in cands if pool.node_fits(g.node, job)
                 for t, mask in [slices._earliest_slices_now(g, p, k)] if t < float("inf")]
        t, _, _, g, mask = min(fresh) if fresh else (None, 0, 0, None, 0)
        assert slices._earliest_gpu(job, p, k, cands) == (None if g is None else (t, g, mask))
        mem_job = pending(step + 1, gpu_mem_mb=want, user=rnd.choice(["u0", "u1"]), cpus=rnd.choice([1, 16]))
        near = [(shares._earliest_share_now(g, mem_job, want), g.node, g.index, g)
                for g in pool.candidates(mem_job, ("mig", "mps", "timeslice"))
                if pool.node_fits(g.node, mem_job) and most_memory(g) >= want]
        near = [n for n in near if n[0] < float("inf")]
        assert shares._earliest_gpu(mem_job, want)[0] is (min(near)[3] if near else None)
        for _ in range(rnd.randint(0, 3)):
            _mutate(rnd, pool)
