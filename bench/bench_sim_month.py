"""How fast ``gpud simulate`` replays a month: ``python bench/bench_sim_month.py [--jobs N]``.

The ``mixed`` synthetic trace (seed 1) of ``--jobs`` jobs (100,000 by default) on 125
nodes of 8 GPUs, at its default load of 0.9 (about a month of arrivals), under the
``full`` policy, at the pass intervals given.  Wall and CPU time include generating the
trace.  Target: a month of a 1,000-GPU cluster in under a minute.
"""

from __future__ import annotations

import argparse
import time

from common import stamp, table, write_section

from gpud.sched.config import SchedConfig  # noqa: E402
from gpud.sim.cluster import parse_cluster  # noqa: E402
from gpud.sim.engine import Simulation  # noqa: E402
from gpud.sim.synthetic import generate  # noqa: E402
from gpud.sim.trace import TraceStats  # noqa: E402

SPEC = "125x8xH100-80GB"


def one(jobs: int, interval: float) -> list[str]:
    w0, c0 = time.perf_counter(), time.process_time()
    nodes = parse_cluster(SPEC)
    trace = generate("mixed", jobs, 1, gpus=1000, max_gpus=8)
    sim = Simulation(nodes, trace, SchedConfig(), pass_interval=interval,
                     trace_stats=TraceStats(rows=jobs, accepted=jobs))
    r = sim.run()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    passes = r["scheduler_passes"]
    row = [f"{interval:g} s", f"{r['simulated_s'] / 86400:.1f} d", f"{passes:,}",
           f"{wall:.0f} s", f"{cpu:.0f} s",
           f"{sim.core_cpu_s:.0f} s ({100 * sim.core_cpu_s / cpu:.0f} %), {1000 * sim.core_cpu_s / max(1, passes):.1f} ms a pass",
           f"{100 * (r['gpu_allocation'] or 0):.1f}%", f"{r['wait_s']['mean'] / 60:.1f} min"]
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--intervals", default="300,600")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    rows = [one(a.jobs, float(i)) for i in a.intervals.split(",")]
    md = "\n".join([
        "## Simulator speed",
        "",
        f"`python bench/bench_sim_month.py`: `gpud simulate --synthetic mixed --jobs {a.jobs:,} "
        f"--cluster {SPEC}` (1,000 GPUs, load 0.9) under the `full` policy, at the "
        "`--pass-interval`s. Target: a month of a 1,000-GPU cluster in under a minute.",
        "",
        stamp(),
        "",
        table(["pass interval", "simulated", "passes", "wall", "CPU", "of it in the core",
               "allocation while waiting", "mean wait"], rows),
    ])
    print(md)
    if not a.no_doc:
        write_section("sim-speed", md)


if __name__ == "__main__":
    main()
