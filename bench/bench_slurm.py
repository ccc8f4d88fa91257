"""What the Slurm features cost: ``python bench/bench_slurm.py``.

* submitting an array (one request, one group commit for all its tasks) against the same
  number of single submissions, on a head in this process with a real SQLite file;
* ``before_pass``: the blocked reasons of a big queue (dependencies on live and finished
  jobs, arrays with throttles, begin times), computed before every scheduler pass;
* the gpuctl side: collapsing 10,000 array tasks for squeue and rendering a ``-o`` format.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpuctl import columns  # noqa: E402
from tests.slurm_head import ALICE, HeadKit, spec  # noqa: E402


async def submissions(n: int) -> tuple[float, float]:
    """(seconds for an array of n tasks, seconds for n single jobs submitted at once)."""
    with tempfile.TemporaryDirectory() as d:
        async with HeadKit(Path(d)) as kit:
            t = time.perf_counter()
            await kit.call("submit", ALICE, spec=spec("true", array=f"0-{n - 1}"))
            array = time.perf_counter() - t
            t = time.perf_counter()
            await asyncio.gather(*(kit.call("submit", ALICE, spec=spec("true")) for _ in range(n)))
            single = time.perf_counter() - t
    return array, single


async def before_pass(pending: int, runs: int) -> tuple[float, float]:
    """(median ms of before_pass, of a whole pass) over ``pending`` jobs of every kind."""
    with tempfile.TemporaryDirectory() as d:
        async with HeadKit(Path(d)) as kit:
            for i in range(8):
                kit.add_node(f"n{i}", gpus=8)
            parents = [await kit.submit(gpus=1) for _ in range(50)]
            await kit.schedule()
            for job_id in parents[:25]:
                await kit.finish(job_id, exit_code=0 if job_id % 2 else 1)
            quarter = pending // 4
            for k in range(quarter // 100):
                await kit.call("submit", ALICE, spec=spec("true", array="0-99%5", gpus=1))
            await asyncio.gather(*(kit.call("submit", ALICE, spec=spec(
                "true", dependency=f"afterok:{parents[i % 50]}" if i % 3 else f"afterany:{parents[i % 50]}?singleton"))
                for i in range(quarter)))
            await asyncio.gather(*(kit.call("submit", ALICE, spec=spec("true", begin_time=kit.clock() + 3600))
                                   for _ in range(quarter)))
            await asyncio.gather(*(kit.call("submit", ALICE, spec=spec("true", gpus=1)) for _ in range(quarter)))
            hooks, passes = [], []
            for _ in range(runs):
                async with kit.head.lock:
                    t = time.perf_counter()
                    await kit.head.slurm.before_pass(kit.clock())
                    hooks.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await kit.schedule()
                passes.append((time.perf_counter() - t) * 1000)
    return statistics.median(hooks), statistics.median(passes)


def squeue_side(n: int) -> float:
    jobs = [{"job_id": 1000 + i, "display_id": f"1000_{i}", "array_job_id": 1000, "array_task_id": i,
             "array_throttle": 10, "state": "PENDING" if i >= 10 else "RUNNING", "name": "sweep", "user": "alice",
             "partition": "gpu", "reason": "JobArrayTaskLimit", "node": None if i >= 10 else "n1",
             "start_time": None if i >= 10 else 0.0, "time_limit": 3600.0, "gpus": 1, "cpus": 1}
            for i in range(n)]
    layout = columns.parse_percent(columns.SQUEUE_LONG, columns.SQUEUE, "-o")
    t = time.perf_counter()
    rows = columns.collapse_arrays(jobs)
    columns.render(layout, rows, 100.0)
    columns.render(layout, jobs, 100.0)
    return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    for n in (100, 1000, 10000):
        array, single = asyncio.run(submissions(n))
        print(f"submit {n:>6}: one array {array * 1000:8.1f} ms ({n / array:9.0f} tasks/s); "
              f"{n} single jobs at once {single * 1000:8.1f} ms ({n / single:7.0f} jobs/s)")
    for pending in (2000, 10000):
        hook, whole = asyncio.run(before_pass(pending, args.runs))
        print(f"before_pass over {pending:>6} pending: {hook:7.1f} ms; whole pass {whole:7.1f} ms")
    print(f"squeue: collapse + render 10,000 array tasks (-l), then all of them with -r: "
          f"{squeue_side(10000):.1f} ms")


if __name__ == "__main__":
    main()
