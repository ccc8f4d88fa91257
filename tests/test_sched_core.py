"""The pass as a whole: reasons, ordering, determinism, purity."""

from __future__ import annotations

import ast
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.sched.core import schedule

from .sched_builders import check_plan, config, node, nodes, pending, running, snapshot

CFG = config(partition=[{"name": "gpu", "max_time": "1d", "nodes": ["n*"]},
                        {"name": "down", "nodes": ["x*"]}],
             qos={"normal": {}}, accounts={"a": {"users": ["*"]}})


@pytest.mark.parametrize("job, reason", [
    (pending(1, held=True, account="a"), "Held"),
    (pending(1, blocked_reason="Dependency", account="a"), "Dependency"),
    (pending(1, blocked_reason="BeginTime", account="a"), "BeginTime"),
    (pending(1, partition="nope", account="a"), "InvalidPartition"),
    (pending(1, qos="gold", account="a"), "InvalidQOS"),
    (pending(1, account="zz"), "InvalidAccount"),
    (pending(1, time_limit=2 * 86400.0, account="a"), "PartitionTimeLimit"),
    (pending(1, time_limit=None, account="a"), "PartitionTimeLimit"),
    (pending(1, 9, account="a"), "BadConstraints"),
    (pending(1, 1, partition="down", account="a"), "ReqNodeNotAvail"),
])
def test_reasons_for_jobs_that_cannot_start(job, reason):
    snap = snapshot([*nodes(1), node("x1", up=False)], [job], cfg=CFG)
    plan = schedule(snap, 0.0)
    assert plan.starts == [] and plan.reasons == {1: reason}


def test_a_cluster_without_nodes_yet_waits():
    plan = schedule(snapshot([], [pending(1, 1)]), 0.0)
    assert plan.reasons == {1: "ReqNodeNotAvail"}


def test_resources_for_the_first_waiter_priority_behind_it():
    run = [running(100, "n001", range(8), time_limit=3600.0)]
    pend = [pending(1, 2, submit_time=0.0), pending(2, 2, submit_time=5.0)]
    plan = schedule(snapshot(nodes(1), pend, run), 10.0)
    assert plan.reasons == {1: "Resources", 2: "Priority"}


def test_queue_order_priority_then_submit_time_then_id():
    cfg = config(qos={"normal": {}, "high": {"priority": 10}})
    pend = [pending(3, 8, submit_time=0.0), pending(2, 8, submit_time=0.0), pending(1, 8, submit_time=5.0),
            pending(4, 8, qos="high", submit_time=9.0)]
    plan = schedule(snapshot(nodes(1), pend, cfg=cfg), 10.0)
    assert [s.job_id for s in plan.starts] == [4]
    assert plan.priorities[4] > plan.priorities[2] == plan.priorities[3] > plan.priorities[1]
    assert plan.expected_starts[2] < plan.expected_starts[3] < plan.expected_starts[1]


def test_same_snapshot_same_plan():
    pend = [pending(k, k % 5, submit_time=float(k % 7), user=f"u{k % 3}") for k in range(1, 60)]
    run = [running(100 + k, "n%03d" % (k + 1), range(k % 8), start_time=-k * 100.0) for k in range(4)]
    snap = snapshot(nodes(4), pend, run, usage={("default", "u1"): 5000.0})
    first = schedule(snap, 1000.0)
    check_plan(snap, first, 1000.0)
    assert schedule(snap, 1000.0) == first
    assert first.starts and first.reasons and first.expected_starts


def test_bad_running_records_do_not_crash_the_pass():
    run = [running(1, "ghost", (0,)), running(2, "n001", (99,))]   # unknown node, unknown GPU
    plan = schedule(snapshot(nodes(1), [pending(3, 8)], run), 0.0)
    assert plan.starts and plan.starts[0].gpu_indices == tuple(range(8))


def test_the_core_is_pure():
    """No clock, I/O, concurrency or GPU imports anywhere in gpud/sched."""
    allowed = {"__future__", "dataclasses", "math", "heapq", "bisect", "fnmatch", "itertools",
               "collections", "enum", "typing"}
    root = pathlib.Path(__file__).resolve().parents[1] / "gpud" / "sched"
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                if n.level:   # relative: gpud.sched itself, gpud.units or the MIG catalog (pure data)
                    assert (n.level == 1 or n.module in ("units", "gpu.mig")
                            or (n.module == "gpu" and [a.name for a in n.names] == ["mig"])), \
                        f"{path.name}: from {'.' * n.level}{n.module}"
                    continue
                names = [n.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


names = st.sampled_from(["n001", "n002", "ghost"])
odd_pending = st.builds(
    pending, st.integers(1, 6), st.integers(-1, 9), cpus=st.integers(-1, 80), mem_mb=st.integers(-5, 10**6),
    qos=st.sampled_from(["normal", "gold"]), partition=st.sampled_from(["gpu", "x"]),
    time_limit=st.one_of(st.none(), st.floats(-10, 1e6)), submit_time=st.floats(-1e6, 1e6),
    gpu_type=st.sampled_from([None, "H100-80GB", "T4"]), held=st.booleans(), preempt_count=st.integers(0, 5))
odd_running = st.builds(
    running, st.integers(10, 16), names, st.lists(st.integers(-1, 9), max_size=9), cpus=st.integers(0, 80),
    mem_mb=st.integers(0, 10**6), start_time=st.floats(-1e6, 1e6), time_limit=st.one_of(st.none(), st.floats(0, 1e6)),
    stopping=st.booleans(), borrowed=st.booleans(), qos=st.sampled_from(["normal", "gold"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(odd_pending, max_size=8), st.lists(odd_running, max_size=6), st.floats(-1e6, 1e6))
def test_odd_snapshots_never_crash_the_pass(pend, run, now):
    schedule(snapshot(nodes(2), pend, run), now)
