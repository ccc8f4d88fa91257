"""Placement: bin-packing and spread, filters, and properties over random traffic."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpud.sched.core import schedule

from .sched_builders import GiB, ToyCluster, config, node, nodes, pending, running, snapshot


def test_binpack_keeps_a_whole_node_free_where_spread_does_not():
    for policy, big_starts in (("binpack", True), ("spread", False)):
        toy = ToyCluster(nodes(2), config(scheduler={"placement": policy}))
        for _ in range(4):
            toy.submit(1, duration=3600.0)
        toy.step()
        big = toy.submit(8, duration=3600.0)
        plan = toy.step()
        assert (big in {s.job_id for s in plan.starts}) is big_starts, policy
    spread = sorted(r.node for r in toy.running.values())
    assert spread == ["n001", "n001", "n002", "n002"]


def test_binpack_fills_the_fullest_node_that_fits():
    run = [running(1, "n001", range(6)), running(2, "n002", range(3))]
    plan = schedule(snapshot(nodes(3), [pending(9, 2)], run), 0.0)
    assert (plan.starts[0].node, plan.starts[0].gpu_indices) == ("n001", (6, 7))
    plan = schedule(snapshot(nodes(3), [pending(9, 3)], run), 0.0)
    assert plan.starts[0].node == "n002"


def test_partition_placement_override():
    cfg = config(partition=[{"name": "gpu", "placement": "spread"}])
    run = [running(1, "n001", range(6))]
    assert schedule(snapshot(nodes(2), [pending(9, 1)], run, cfg=cfg), 0.0).starts[0].node == "n002"


def test_gpu_type_cpus_memory_and_state_filters():
    ns = [node("a1", model="A100-80GB"), node("h1", cpus=4), node("h2", mem_mb=64 * GiB),
          node("h3", up=False), node("m1", models=["A100-80GB"] * 4 + ["H100-80GB"] * 4)]
    plan = schedule(snapshot(ns, [pending(1, 2, gpu_type="A100-80GB", cpus=8)]), 0.0)
    assert plan.starts[0].node == "m1"                   # best fit: 4 A100s free beats 8
    plan = schedule(snapshot(ns, [pending(1, 5, gpu_type="A100-80GB", cpus=8)]), 0.0)
    assert plan.starts[0].node == "a1"
    plan = schedule(snapshot(ns, [pending(1, 5, gpu_type="H100-80GB", cpus=8, mem_mb=100 * GiB)]), 0.0)
    assert plan.reasons[1] == "ReqNodeNotAvail"          # only the down node h3 could
    plan = schedule(snapshot(ns, [pending(1, 4, gpu_type="H100-80GB", cpus=8, mem_mb=100 * GiB)]), 0.0)
    assert plan.starts[0].node == "m1" and plan.starts[0].gpu_indices == (4, 5, 6, 7)
    plan = schedule(snapshot(ns, [pending(1, 1, gpu_type="T4")]), 0.0)
    assert plan.reasons[1] == "BadConstraints"


def test_partition_node_globs():
    cfg = config(partition=[{"name": "gpu", "nodes": ["n*"]}, {"name": "debug", "nodes": ["d00[12]"]}])
    ns = [*nodes(1), node("d001", gpus=1), node("d002", gpus=1), node("d003", gpus=8)]
    plan = schedule(snapshot(ns, [pending(1, 1, partition="debug"), pending(2, 1, partition="debug"),
                                  pending(3, 1, partition="debug")], cfg=cfg), 0.0)
    assert sorted(s.node for s in plan.starts) == ["d001", "d002"] and plan.reasons[3] == "Resources"


def test_cpu_only_jobs_pack_onto_busy_nodes():
    run = [running(1, "n002", range(8))]
    plan = schedule(snapshot(nodes(2), [pending(9, 0, cpus=4)], run), 0.0)
    assert plan.starts[0].node == "n002" and plan.starts[0].gpu_indices == ()


# -- properties over random traffic ------------------------------------------------------------

CFG = config(
    qos={"normal": {}, "high": {"priority": 100, "preempt": ["low"]}, "low": {"grace_time": "0s"},
         },
    accounts={"a": {"gpu_quota": 6, "gpu_limit": 12, "users": ["*"]},
              "b": {"gpu_quota": 4, "users": ["*"]},
              "c": {"parent": "a", "gpu_limit": 4, "users": ["*"]}},
    preemption={"exempt_time": "2m", "max_per_minute": 4},
    scheduler={"backfill_depth": 5},
)
CLUSTER = (node("n001", gpus=4, cpus=8, mem_mb=64 * GiB),
           node("n002", gpus=4, cpus=16, mem_mb=32 * GiB),
           node("n003", gpus=2, cpus=8, mem_mb=64 * GiB, model="A100-80GB"),
           node("n004", gpus=4, cpus=8, mem_mb=64 * GiB, up=False))

def random_ops(rng: random.Random, count: int) -> list[tuple]:
    """A random submit/finish/fail/wait sequence that keeps the small cluster contended."""
    ops: list[tuple] = []
    for _ in range(count):
        kind = rng.choices(["submit", "finish", "fail", "wait"], [5, 1, 1, 3])[0]
        if kind == "submit":
            ops.append(("submit", rng.randint(0, 4), rng.randint(1, 8), rng.choice([1, 8, 24, 48]),
                        rng.choice("abc"), rng.choice(["normal", "high", "low", "low"]),
                        rng.choice([None, None, None, "A100-80GB"]), rng.randint(1, 6)))
        elif kind in ("finish", "fail"):
            ops.append((kind, rng.randint(0, 1000)))
        else:
            ops.append(("wait", rng.randint(1, 900)))
    return ops


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(20, 80))
def test_random_traffic_never_over_allocates_or_breaks_limits(seed, count):
    """ToyCluster.step checks every plan (GPUs, CPUs, memory, gpu_limit, caps); we add
    determinism: the same snapshot, in any order, gives the same plan."""
    toy = ToyCluster(CLUSTER, CFG)
    shuffle = random.Random(seed)
    for o in random_ops(random.Random(seed), count):
        if o[0] == "submit":
            _, g, cpus, mem_g, acct, qos, gtype, minutes = o
            toy.submit(g, duration=minutes * 300.0, time_limit=minutes * 400.0, cpus=cpus, mem_mb=mem_g * GiB,
                       account=acct, user=f"u{acct}", qos=qos, gpu_type=gtype)
        elif o[0] in ("finish", "fail") and toy.running:
            ids = sorted(toy.running)
            toy.end(ids[o[1] % len(ids)], "COMPLETED" if o[0] == "finish" else "FAILED")
        elif o[0] == "wait":
            toy.advance(toy.now + o[1])
        snap = toy.snapshot()
        plan = toy.step()
        again = schedule(replace(snap, pending=tuple(shuffle.sample(snap.pending, len(snap.pending))),
                                 running=tuple(reversed(snap.running)), nodes=tuple(reversed(snap.nodes))),
                         snap_now := toy.now)
        assert again == plan, f"plan changed with input order at {snap_now}"
