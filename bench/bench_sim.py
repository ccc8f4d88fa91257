"""How fast the simulator replays a month: ``python bench/bench_sim.py [--profile]``.

Scenarios:

* ``synthetic``: a 1,000-GPU cluster (125 nodes of 8) and a month of about 100,000 jobs
  (seeded): 1, 2, 4 or 8 GPUs (mostly 1), run times from minutes to a day, from 40 users
  in 8 accounts with unequal shares, offered at about 95 % of the cluster.  The trace is
  written to a temporary CSV first, so reading it is part of the time.
* ``msft``: the first 30 days of ``shared/traces/msft_itp_2021/jobs.csv`` on 128 nodes of 8
  (skipped when the trace is not there).

Goal: a month of a 1,000-GPU cluster in about a minute on a 2-core machine.  Prints wall
time, scheduler passes, and the headline numbers of each report.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from gpud.sched.config import sched_config_from_dict  # noqa: E402
from gpud.sim.cluster import parse_cluster  # noqa: E402
from gpud.sim.engine import Simulation  # noqa: E402
from gpud.sim.trace import TraceStats, iter_trace, open_trace  # noqa: E402

MONTH = 30 * 86400.0
ACCOUNTS = [f"acct{k}" for k in range(8)]
CFG = sched_config_from_dict({
    "accounts": {a: {"shares": 1 + k % 3, "users": ["*"]} for k, a in enumerate(ACCOUNTS)},
}, "<bench>")
MSFT = os.path.join(ROOT, "..", "shared", "traces", "msft_itp_2021", "jobs.csv")


def write_synthetic(path: str, gpus: int, jobs: int, load: float, seed: int) -> None:
    rnd = random.Random(seed)
    sizes, weights = (1, 2, 4, 8), (70, 12, 10, 8)
    mean_gpus = sum(s * w for s, w in zip(sizes, weights)) / sum(weights)
    # mean GPU-seconds per job that makes ``jobs`` arrivals offer ``load`` of the cluster
    mean_run = load * gpus * MONTH / jobs / mean_gpus
    t = 0.0
    with open(path, "w") as f:
        f.write("job_id,submit_s,gpus,duration_s,user,group,gpu_type,status\n")
        for i in range(jobs):
            t += rnd.expovariate(jobs / MONTH)
            run = min(86400.0, max(60.0, rnd.expovariate(1 / mean_run)))
            k = rnd.randrange(40)
            f.write(f"s{i},{t:.0f},{rnd.choices(sizes, weights)[0]},{run:.0f},"
                    f"user{k},{ACCOUNTS[k % 8]},,\n")


def run(name: str, spec: str, path: str, until: float, interval: float, profile: bool) -> None:
    stats = TraceStats()
    t0 = time.perf_counter()
    with open_trace(path) as f:
        sim = Simulation(parse_cluster(spec), iter_trace(f, stats), CFG, until=until,
                         trace_stats=stats, pass_interval=interval)
        if profile:
            prof = cProfile.Profile()
            report = prof.runcall(sim.run)
        else:
            report = sim.run()
    wall = time.perf_counter() - t0
    jobs, wait = report["jobs"], report["wait_s"]
    print(f"{name:10s} {spec:16s} {until / 86400:4.0f} d  interval {interval:4.0f} s  "
          f"{wall:7.1f} s wall  {report['scheduler_passes']:7d} passes  "
          f"{jobs['submitted']:7d} jobs ({jobs['started']} started, {jobs['pending']} pending "
          f"at end)  allocation {report['gpu_allocation']}  utilization "
          f"{report['utilization']}  mean wait {wait['mean']} s", flush=True)
    if profile:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    ap.add_argument("--pass-interval", type=float, default=300.0,
                    help="at most one scheduler pass per this many simulated seconds "
                         "(default 300; 0: a pass after every event, as the head)")
    ap.add_argument("--only", choices=("synthetic", "msft"))
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile")
    args = ap.parse_args()
    if args.only in (None, "synthetic"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "synthetic.csv")
            write_synthetic(path, 1000, args.jobs, args.load, args.seed)
            run("synthetic", "125x8xH100-80GB", path, args.days * 86400, args.pass_interval,
                args.profile)
    if args.only in (None, "msft"):
        if os.path.exists(MSFT):
            run("msft", "128x8xH100-80GB", MSFT, args.days * 86400, args.pass_interval,
                args.profile)
        else:
            print(f"msft: skipped, {MSFT} not present")


if __name__ == "__main__":
    main()
