"""Saved plans: twenty seeded snapshots and a seeded toy-cluster run, against a JSON fixture.

Each snapshot is built from the builders by ``random.Random(seed)``: whole, MIG (fixed and
dynamic), MPS (plain and dynamic) and time-sliced GPUs, whole, gang, exclusive, typed and
fractional requests, QOS that preempt and accounts with quotas; the running jobs are the
starts of an earlier pass over the same nodes.  The summary of every plan (starts with
their devices and parts, preemptions, re-layouts, reasons, priorities, reservations) and
the event log of a toy cluster driven for six hours must equal tests/data/sched_golden.json.
A change to the core or to how plans are applied that moves any decision fails here.

The fixture is written by ``python -m tests.test_sched_golden`` (only when a change of
decisions is meant).
"""

from __future__ import annotations

import json
import math
import pathlib
import random
from typing import Any

from gpud.gpu import mig
from gpud.sched.core import schedule
from gpud.sched.plan import Plan
from gpud.sched.snapshot import GpuView, NodeView, PendingJob, RunningJob, Snapshot

from .sched_builders import GiB, ToyCluster, config, node, pending
from .sharing_rig import slice_views

FIXTURE = pathlib.Path(__file__).parent / "data" / "sched_golden.json"
SNAPSHOTS = 20
QOS = {"normal": {}, "high": {"priority": 1000, "preempt": ["low"], "grace_time": "30s"},
       "low": {"preempt_mode": "requeue", "grace_time": "30s"}}
ACCOUNTS = {"a": {"shares": 2, "gpu_quota": 6, "users": ["*"]}, "b": {"shares": 1, "gpu_quota": 4, "users": ["*"]},
            "c": {"shares": 1, "gpu_limit": 10, "users": ["*"]}}
USERS = ("alice", "bob", "carol", "dave")


def _gpu(rnd: random.Random, name: str, i: int, whole: bool) -> GpuView:
    kind = "whole" if whole else rnd.choice(("whole", "mig", "migdyn", "mps", "mpsdyn", "timeslice"))
    if kind == "whole":
        return GpuView(i, f"GPU-{name}-{i}", rnd.choice(("H100-80GB", "A100-80GB")), 80 * GiB)
    if kind in ("mig", "migdyn"):
        layout = mig.named_layout("A100-80GB", rnd.choice(("all-1g.10gb", "all-balanced", "all-3g.40gb")))
        return GpuView(i, f"GPU-{name}-{i}", "A100-80GB", 80 * GiB, mode="mig", dynamic=kind == "migdyn",
                       slices=slice_views("A100-80GB", layout, name, i))
    if kind in ("mps", "mpsdyn"):
        return GpuView(i, f"GPU-{name}-{i}", "H100-80GB", 80 * GiB, mode="mps", dynamic=kind == "mpsdyn",
                       mps_max_clients=rnd.choice((2, 4, 48)))
    return GpuView(i, f"GPU-{name}-{i}", "H100-80GB", 80 * GiB, mode="timeslice", replicas=rnd.choice((2, 4)))


def _nodes(rnd: random.Random) -> tuple[NodeView, ...]:
    out = []
    for k in range(rnd.randint(3, 6)):
        name = f"n{k + 1:03d}"
        whole = rnd.random() < 0.5       # a node of whole GPUs only, else a mix of every mode
        gpus = tuple(_gpu(rnd, name, i, whole) for i in range(rnd.choice((4, 8))))
        out.append(NodeView(name, rnd.choice((32, 64)), rnd.choice((256, 512)) * GiB, gpus,
                            schedulable=rnd.random() > 0.1, labels=(("rack", f"r{k % 2}"),)))
    return tuple(out)


def _request(rnd: random.Random, job_id: int, now: float, nodes: tuple[NodeView, ...]) -> PendingJob:
    kind = rnd.choice(("whole", "whole", "whole", "gang", "typed", "exclusive", "mig", "mem"))
    kw: dict[str, Any] = dict(user=rnd.choice(USERS), account=rnd.choice(tuple(ACCOUNTS)),
                              qos=rnd.choice(("normal", "normal", "high", "low")),
                              cpus=rnd.choice((1, 2, 8)), mem_mb=rnd.choice((1, 4, 32)) * GiB,
                              time_limit=rnd.choice((600.0, 3600.0, 4 * 3600.0, None)),
                              submit_time=now - rnd.randrange(0, 7200), nice=rnd.choice((0, 0, 100)))
    gpus = rnd.choice((1, 1, 2, 4))
    if kind == "gang":
        count = rnd.choice((2, 3))
        return pending(job_id, gpus * count, nodes=count, **kw)
    if kind == "typed":
        return pending(job_id, gpus, gpu_type=rnd.choice(("H100-80GB", "A100-80GB")), **kw)
    if kind == "exclusive":
        return pending(job_id, gpus, exclusive=True, **kw)
    if kind == "mig":
        return pending(job_id, rnd.choice((1, 1, 2)), mig_profile=rnd.choice(("1g.10gb", "2g.20gb", "3g.40gb")), **kw)
    if kind == "mem":
        return pending(job_id, 1, gpu_mem_mb=rnd.choice((5, 10, 20, 40)) * GiB, **kw)
    return pending(job_id, gpus, **kw)


def _running(p: PendingJob, s: Any, start: float, rnd: random.Random) -> RunningJob:
    return RunningJob(job_id=p.job_id, user=p.user, account=p.account, partition=p.partition, qos=p.qos,
                      node=s.node, gpu_indices=s.gpu_indices if not any(d.kind != "gpu" for d in s.devices) else (),
                      cpus=s.cpus, mem_mb=s.mem_mb, start_time=start, time_limit=p.time_limit,
                      borrowed=s.borrowed, submit_time=p.submit_time, nice=p.nice, devices=s.devices,
                      parts=s.parts, exclusive=p.exclusive, stopping=rnd.random() < 0.1)


def golden_snapshot(seed: int) -> tuple[Snapshot, float]:
    """Snapshot ``seed`` and the time of its pass."""
    rnd = random.Random(seed)
    ns = _nodes(rnd)
    cfg = config(qos=QOS, accounts=ACCOUNTS, preemption={"exempt_time": "0s"},
                 scheduler={"placement": rnd.choice(("binpack", "spread", "shapes")), "mig_min_interval": "0s"})
    first = [_request(rnd, k, 0.0, ns) for k in range(1, rnd.randint(4, 14))]
    plan = schedule(Snapshot(ns, tuple(first), (), cfg), 0.0)
    by_id = {p.job_id: p for p in first}
    run = tuple(_running(by_id[s.job_id], s, -rnd.randrange(0, 3600), rnd) for s in plan.starts)
    now = 7200.0
    later = [_request(rnd, k, now, ns) for k in range(100, 100 + rnd.randint(3, 16))]
    usage = {(a, u): float(rnd.randrange(0, 10 ** 6)) for a in ACCOUNTS for u in USERS if rnd.random() < 0.5}
    return Snapshot(ns, tuple(later), run, cfg, usage=usage), now


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def summary(plan: Plan) -> dict[str, Any]:
    """A plan as JSON data, every decision in it."""
    return {
        "starts": [[s.job_id, s.node, list(s.gpu_indices), s.cpus, s.mem_mb, s.borrowed,
                    [d.to_dict() for d in s.devices],
                    [[p.node, list(p.gpu_indices), p.cpus, p.mem_mb] for p in s.parts]] for s in plan.starts],
        "preemptions": [[p.job_id, p.mode, p.grace_time, p.reason, p.for_job] for p in plan.preemptions],
        "relayouts": [[r.node, r.gpu, list(r.destroy), [str(c) for c in r.create], r.reason] for r in plan.relayouts],
        "reasons": {str(k): v for k, v in sorted(plan.reasons.items())},
        "priorities": {str(k): _num(v) for k, v in sorted(plan.priorities.items())},
        "expected_starts": {str(k): _num(v) for k, v in sorted(plan.expected_starts.items())},
        "reserved_nodes": {str(k): v for k, v in sorted(plan.reserved_nodes.items())},
    }


def toy_run() -> list[list[Any]]:
    """Six hours of seeded traffic on a toy cluster: its event log."""
    rnd = random.Random(7)
    toy = ToyCluster(tuple(node(f"n{k:03d}", gpus=4, cpus=32) for k in range(1, 5)),
                     config(qos=QOS, accounts=ACCOUNTS, preemption={"exempt_time": "5m"}))
    while toy.now < 6 * 3600:
        for _ in range(rnd.randint(0, 3)):
            gpus, count = rnd.choice(((1, 1), (1, 1), (2, 1), (4, 1), (8, 2), (4, 2)))
            toy.submit(gpus, duration=rnd.choice((300.0, 1200.0, 3600.0)), nodes=count,
                       qos=rnd.choice(("normal", "high", "low", "low")), account=rnd.choice(tuple(ACCOUNTS)),
                       user=rnd.choice(USERS), time_limit=rnd.choice((1800.0, 7200.0)))
        toy.step()
        toy.advance(toy.now + rnd.choice((60.0, 300.0, 900.0)))
    return [[t, kind, job] for t, kind, job in toy.log]


def golden() -> dict[str, Any]:
    out: dict[str, Any] = {"plans": []}
    for seed in range(SNAPSHOTS):
        snap, now = golden_snapshot(seed)
        out["plans"].append(summary(schedule(snap, now)))
    out["toy_log"] = toy_run()
    return out


def test_the_plans_of_the_saved_snapshots_are_unchanged():
    saved = json.loads(FIXTURE.read_text())
    now = golden()
    assert len(saved["plans"]) == SNAPSHOTS
    for seed, (want, got) in enumerate(zip(saved["plans"], json.loads(json.dumps(now["plans"])))):
        assert got == want, f"snapshot {seed}: its plan changed"
    assert json.loads(json.dumps(now["toy_log"])) == saved["toy_log"], "the toy cluster's run changed"


def test_the_saved_snapshots_exercise_every_kind_of_decision():
    saved = json.loads(FIXTURE.read_text())
    plans = saved["plans"]
    devices = {d["kind"] for p in plans for s in p["starts"] for d in s[6]}
    assert {"mig", "mps", "timeslice"} <= devices
    assert any(s[7] for p in plans for s in p["starts"]), "no gang start"
    assert any(p["preemptions"] for p in plans) and any(p["relayouts"] for p in plans)
    assert {k for t, k, j in saved["toy_log"]} >= {"start", "preempt", "requeued", "completed"}


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(golden(), indent=None, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
