"""Time one scheduler pass on big synthetic clusters: ``python bench/bench_sched.py``.

Scenarios (each the median of ``--runs`` passes over the same snapshot; wall time, and the
CPU time of this process, which a busy shared machine inflates less):

* ``full``: every GPU busy with jobs ending over the next day; the queue waits (steady state
  of a saturated cluster: priorities, limits, reservations for the top of the queue);
* ``churn``: a tenth of the GPUs free, scattered; the pass starts what fits and reserves;
* ``empty``: an idle cluster and a queue bigger than it; the pass fills it.

Jobs are 1, 2, 4 or 8 GPUs (mostly small), from 40 users in 8 accounts with recorded usage;
a quarter are high QOS that may preempt the low-QOS third of running jobs, so a pass also
spends its preemption budget (30 a minute) on victim searches.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpud.sched.config import sched_config_from_dict  # noqa: E402
from gpud.sched.core import schedule  # noqa: E402
from gpud.sched.snapshot import GpuView, NodeView, PendingJob, RunningJob, Snapshot  # noqa: E402

NOW = 1_000_000.0
ACCOUNTS = [f"acct{k}" for k in range(8)]
CFG = sched_config_from_dict({
    "qos": {"normal": {}, "high": {"priority": 100, "preempt": ["low"]}, "low": {}},
    "accounts": {a: {"shares": 1 + k % 3, "users": ["*"]} for k, a in enumerate(ACCOUNTS)},
}, "<bench>")


def build(nodes: int, pending: int, busy: float, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    node_views = tuple(
        NodeView(name=f"n{i:05d}", cpus=128, mem_mb=2048 * 1024,
                 gpus=tuple(GpuView(g, f"GPU-{i}-{g}", "H100-80GB", 81920) for g in range(8)))
        for i in range(nodes))
    running: list[RunningJob] = []
    job_id = 1
    for n in node_views:
        free = [g for g in range(8) if rng.random() >= busy]
        busy_gpus = [g for g in range(8) if g not in free]
        while busy_gpus:
            size = min(len(busy_gpus), rng.choice([1, 1, 2, 4, 8]))
            take, busy_gpus = busy_gpus[:size], busy_gpus[size:]
            acct = rng.choice(ACCOUNTS)
            running.append(RunningJob(
                job_id=job_id, user=f"u{rng.randrange(40)}", account=acct, partition="gpu",
                qos=rng.choice(["normal", "normal", "low"]), node=n.name, gpu_indices=tuple(take),
                cpus=4 * size, mem_mb=32768 * size, start_time=NOW - rng.uniform(0, 3600),
                time_limit=rng.choice([3600.0, 4 * 3600.0, 86400.0])))
            job_id += 1
    pend: list[PendingJob] = []
    for _ in range(pending):
        size = rng.choice([1, 1, 1, 2, 2, 4, 8])
        k = rng.randrange(40)
        pend.append(PendingJob(
            job_id=job_id, user=f"u{k}", account=ACCOUNTS[k % 8], partition="gpu",
            qos=rng.choice(["normal", "normal", "low", "high"]), gpus=size, cpus=4 * size,
            mem_mb=32768 * size, time_limit=rng.choice([1800.0, 3600.0, 4 * 3600.0]),
            submit_time=NOW - rng.uniform(0, 86400), nice=0))
        job_id += 1
    usage = {(ACCOUNTS[k % 8], f"u{k}"): rng.uniform(0, 1e7) for k in range(40)}
    return Snapshot(nodes=node_views, pending=tuple(pend), running=tuple(running), config=CFG, usage=usage,
                    recent_preemptions=())


def time_pass(snap: Snapshot, runs: int) -> tuple[float, float, int, int, int]:
    """(median wall seconds, median CPU seconds of this process, starts, reservations, preemptions)."""
    walls, cpus = [], []
    plan = None
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        plan = schedule(snap, NOW)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    assert plan is not None
    return (statistics.median(walls), statistics.median(cpus), len(plan.starts), len(plan.expected_starts),
            len(plan.preemptions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="only the 10,000-job cases")
    args = ap.parse_args()
    cases = [(1000, 10_000, "full", 1.0), (1000, 10_000, "churn", 0.9), (1000, 10_000, "empty", 0.0)]
    if not args.quick:
        cases += [(2000, 100_000, "full", 1.0), (2000, 100_000, "churn", 0.9)]
    print(f"{'nodes':>6} {'GPUs':>6} {'pending':>8} {'running':>8} {'scenario':>8} "
          f"{'wall ms':>8} {'cpu ms':>8} {'starts':>7} {'reserved':>8} {'preempted':>9}")
    for nodes, pending, name, busy in cases:
        snap = build(nodes, pending, busy)
        wall, cpu, starts, reserved, preempted = time_pass(
            snap, args.runs if pending <= 10_000 else max(1, args.runs // 2))
        print(f"{nodes:>6} {nodes * 8:>6} {pending:>8} {len(snap.running):>8} {name:>8} "
              f"{wall * 1000:>8.1f} {cpu * 1000:>8.1f} {starts:>7} {reserved:>8} {preempted:>9}", flush=True)


if __name__ == "__main__":
    main()
