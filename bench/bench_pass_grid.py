"""Scheduler pass time over a grid of queue and cluster sizes:
``python bench/bench_pass_grid.py [--runs N] [--no-doc]``.

The snapshots are bench_sched.py's (8-GPU nodes, 1/2/4/8-GPU jobs from 40 users in 8
accounts, a quarter high QOS that may preempt), in its ``churn`` state: a tenth of the
GPUs free, scattered, so the pass starts, reserves and preempts.  Pending jobs 1,000,
10,000 and 100,000 against 10, 100, 1,000 and 2,000 nodes; median of ``--runs`` passes
(fewer for the 100,000-job row).  Target: one pass with 10,000 pending on 8,000 GPUs
under 100 ms.
"""

from __future__ import annotations

import argparse

from common import stamp, table, write_section

import bench_sched  # noqa: E402

PENDING = (1000, 10_000, 100_000)
NODES = (10, 100, 1000, 2000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    rows = []
    for pending in PENDING:
        cells = [f"{pending:,}"]
        for nodes in NODES:
            snap = bench_sched.build(nodes, pending, 0.9)
            wall, cpu, *_ = bench_sched.time_pass(snap, a.runs if pending < 100_000 else 1)
            cells.append(f"{wall * 1000:,.0f} ({cpu * 1000:,.0f})")
            print(pending, nodes, f"{wall * 1000:.1f} ms", flush=True)
        rows.append(cells)
    md = "\n".join([
        "## Scheduler pass over queue and cluster sizes",
        "",
        "`python bench/bench_pass_grid.py`: one `schedule(snapshot, now)` call on the snapshots "
        "of `bench/bench_sched.py` in its churn state (a tenth of the GPUs free, scattered). "
        "Milliseconds of wall time (CPU time of the process in brackets); median of 3 passes, "
        "one for 100,000 pending. Target: 10,000 pending on 1,000 nodes (8,000 GPUs) under 100 ms.",
        "",
        stamp(),
        "",
        table(["pending \\ nodes"] + [f"{n:,} ({8 * n:,} GPUs)" for n in NODES], rows),
    ])
    print(md)
    if not a.no_doc:
        write_section("pass-grid", md)


if __name__ == "__main__":
    main()
