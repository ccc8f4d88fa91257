"""Placement ``shapes`` (gpud/sched/shapes.py) and ``mps:dynamic`` GPUs in the core."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

from gpud.sched.config import SchedConfig
from gpud.sched.core import schedule
from gpud.sched.placement import Cluster
from gpud.sched.shapes import Demand, Fragments, ShapeIndex
from gpud.sched.snapshot import Device, GpuView, NodeView, PendingJob, RunningJob, Snapshot

MB = 32000


def gnode(name: str, gpus: int, cpus: int = 64, mem: int = 256_000, mode: str = "mps", dynamic: bool = True,
          model: str = "G2") -> NodeView:
    return NodeView(name=name, cpus=cpus, mem_mb=mem, gpus=tuple(
        GpuView(i, f"GPU-{name}-{i}", model, MB, mode=mode, dynamic=dynamic) for i in range(gpus)))


def job(k: int, gpus: int = 1, cpus: int = 1, mem: int = 1000, share_mb: int | None = None,
        user: str = "u") -> PendingJob:
    return PendingJob(job_id=k, user=user, account="default", partition="gpu", qos="normal", gpus=gpus,
                      cpus=cpus, mem_mb=mem, time_limit=None, submit_time=float(k), gpu_mem_mb=share_mb)


def plan_of(nodes, pend, run=(), placement="binpack"):
    return schedule(Snapshot(tuple(nodes), tuple(pend), tuple(run), config=SchedConfig(placement=placement)), 0.0)


# -- mps:dynamic ----------------------------------------------------------------------------------

def test_idle_dynamic_gpu_serves_a_whole_job():
    p = plan_of([gnode("a", 1)], [job(1)])
    (s,) = p.starts
    assert s.gpu_indices == (0,) and not s.devices


def test_dynamic_gpu_takes_shares_then_no_whole_job_until_empty():
    p = plan_of([gnode("a", 1)], [job(1, share_mb=10_000), job(2, share_mb=10_000), job(3)])
    assert [s.job_id for s in p.starts] == [1, 2]
    assert all(d.kind == "mps" for s in p.starts for d in s.devices)
    assert p.reasons[3] == "Resources"


def test_dynamic_gpu_held_whole_takes_no_share_and_a_running_share_keeps_whole_jobs_off():
    whole = RunningJob(1, "u", "default", "gpu", "normal", "a", (0,), 1, 1000, 0.0, None)
    p = plan_of([gnode("a", 1)], [job(2, share_mb=1000)], [whole])
    assert not p.starts
    share = RunningJob(1, "u", "default", "gpu", "normal", "a", (), 1, 1000, 0.0, None,
                       devices=(Device(0, "mps", "GPU-a-0", None, 1000),))
    p = plan_of([gnode("a", 1)], [job(2), job(3, share_mb=1000)], [share])
    assert [s.job_id for s in p.starts] == [3]


def test_never_both_at_once_over_random_queues():
    rng = random.Random(7)
    for trial in range(30):
        ns = [gnode(f"n{i}", rng.choice([1, 2, 4])) for i in range(3)]
        pend = [job(k, gpus=rng.choice([1, 1, 2]), share_mb=rng.choice([None, 8000, 16000, 24000]))
                for k in range(1, 25)]
        for placement in ("binpack", "shapes"):
            p = plan_of(ns, pend, placement=placement)
            whole, shared, mem = set(), set(), {}
            for s in p.starts:
                for g in s.gpu_indices:
                    assert (s.node, g) not in whole
                    whole.add((s.node, g))
                for d in s.devices:
                    shared.add((s.node, d.index))
                    mem[(s.node, d.index)] = mem.get((s.node, d.index), 0) + (d.mem_mb or 0)
            assert not whole & shared, (trial, placement)
            assert all(v <= MB for v in mem.values())


# -- shapes ---------------------------------------------------------------------------------------

def test_shapes_keeps_a_cpu_poor_node_for_the_gpu_jobs_the_queue_holds():
    # "small" has 1 GPU and 8 CPUs; "big" 8 GPUs and 64.  On the small node the CPU-only job
    # would strand its GPU; shapes puts it where no GPU is lost.
    ns = [gnode("big", 8, cpus=64, mode="whole", dynamic=False), gnode("small", 1, cpus=8, mode="whole", dynamic=False)]
    pend = [job(1, gpus=0, cpus=6)] + [job(k, gpus=1, cpus=4) for k in range(2, 11)]
    sh = plan_of(ns, pend, placement="shapes")
    assert len(sh.starts) == 10
    assert next(s.node for s in sh.starts if s.job_id == 1) == "big"


def test_shapes_pairs_shares_so_a_gpu_stays_whole():
    # Two GPUs; shares of 20 and 12 GB arrive, then a whole job: the 12 GB share must join
    # the 20 GB one (shapes), leaving the other GPU whole.
    ns = [gnode("a", 2)]
    pend = [job(1, share_mb=20_000), job(2, share_mb=12_000), job(3)]
    p = plan_of(ns, pend, placement="shapes")
    assert {s.job_id for s in p.starts} == {1, 2, 3}


def _brute(idx: ShapeIndex, c: Cluster, gpus: int, cpus: int, mem: int):
    """The plain computation: every node's state from scratch, every score from scratch."""
    fresh = Fragments(idx.demand)
    best = None
    for i in range(len(c.nodes)):
        s = idx.state(i)
        after = idx.whole_after(s, gpus, cpus, mem, None)
        if after is None:
            continue
        score = (round(fresh.frag(after) - fresh.frag(s), 9), round(sum(e[1] / e[2] for e in after[2]), 9),
                 after[0], after[1])
        if best is None or score < best[0]:
            best = (score, s)
    return None if best is None else best[1]


def test_grouped_search_is_the_plain_computation():
    rng = random.Random(3)
    ns = [gnode(f"n{i:02d}", rng.choice([1, 2, 4, 8]), cpus=rng.choice([8, 32, 64]), mode="whole", dynamic=False)
          for i in range(12)]
    pend = [job(k, gpus=rng.choice([0, 1, 1, 2, 4]), cpus=rng.choice([1, 3, 6, 12])) for k in range(1, 60)]
    cfg = SchedConfig(placement="shapes")
    c = Cluster(ns, (), cfg)
    idx = ShapeIndex(c, {}, Demand.of(pend, (), 0.0, MB))
    c.watch = idx.touch
    for j in pend:
        ranked = idx.ranked_whole(j.gpus, j.cpus, j.mem_mb, None)
        plain = _brute(idx, c, j.gpus, j.cpus, j.mem_mb)
        assert (ranked[0][1] if ranked else None) == plain
        if ranked:
            i = next(iter(idx.groups[ranked[0][1]]))
            c.take(i, j.gpus, None, j.cpus, j.mem_mb)
        # the groups are exactly the nodes' states
        assert sorted(itertools.chain.from_iterable(idx.groups.values())) == list(range(len(ns)))
        assert all(idx.state(i) == s for s, g in idx.groups.items() for i in g)


def test_shapes_plans_only_what_fits():
    rng = random.Random(11)
    ns = [replace(gnode(f"n{i}", 4, cpus=24)) for i in range(4)]
    pend = [job(k, gpus=rng.choice([0, 1, 2]), cpus=rng.choice([2, 6, 10]),
                share_mb=rng.choice([None, None, 9000, 15000])) for k in range(1, 50)]
    p = plan_of(ns, pend, placement="shapes")
    cpus: dict[str, int] = {}
    for s in p.starts:
        cpus[s.node] = cpus.get(s.node, 0) + s.cpus
    assert all(v <= 24 for v in cpus.values())
