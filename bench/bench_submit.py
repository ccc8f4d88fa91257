"""Submission throughput through the real socket and SQLite path:
``python bench/bench_submit.py [--sbatch N] [--loop N] [--array N] [--no-doc]``.

Against a real head (its own process, SQLite in WAL with synchronous=FULL, Mosquitto on
loopback, no workers so nothing starts):

* ``gpuctl sbatch`` processes one after another, as a shell loop runs them, next to the
  start of a bare ``python -I -c pass`` and of ``gpuctl --version`` (the start-up floor);
* one ``gpuctl.Client`` connection submitting in a loop, each acknowledged before the next;
* the same connection pipelining (``Client.submit_many``): many requests in flight, each
  still acknowledged only after its commit, so the head's group commit can share fsyncs;
* one job array of N tasks in one request.

Targets (docs/benchmarks.md): a ``gpuctl sbatch`` process within 1.3x of a bare Python
start; at least 2,000 acknowledged submissions/s on one connection.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from common import head_cluster, stamp, table, write_section

SPEC = {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {}, "gpus": 1}


def proc_times(cmd: list[str], n: int, env: dict) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t)
    return out


def measure(n_sbatch: int, n_loop: int, n_array: int) -> dict:
    r: dict = {}
    with head_cluster() as c:
        env = c.env
        r["python"] = statistics.median(proc_times([sys.executable, "-I", "-c", "pass"], 30, env))
        r["version"] = statistics.median(proc_times([sys.executable, "-m", "gpuctl.main", "--version"], 30, env))
        sbatch = [sys.executable, "-m", "gpuctl.main", "--socket", c.socket, "sbatch", "-G", "1",
                  "--parsable", "-o", "/dev/null", "--wrap", "true"]
        t = time.perf_counter()
        xs = proc_times(sbatch, n_sbatch, env)
        r["sbatch_rate"] = n_sbatch / (time.perf_counter() - t)
        r["sbatch_ms"] = statistics.median(xs)
        with c.client() as client:
            client.ping()
            lat = []
            t = time.perf_counter()
            for _ in range(n_loop):
                t1 = time.perf_counter()
                client.submit_spec(SPEC)
                lat.append(time.perf_counter() - t1)
            r["loop_rate"] = n_loop / (time.perf_counter() - t)
            lat.sort()
            r["loop_p50"], r["loop_p99"] = lat[len(lat) // 2], lat[int(0.99 * (len(lat) - 1))]
            t = time.perf_counter()
            ids = client.submit_many([SPEC] * n_loop)
            r["pipelined_rate"] = len(ids) / (time.perf_counter() - t)
            t = time.perf_counter()
            client.submit_spec({**SPEC, "array": f"0-{n_array - 1}"})
            r["array_s"] = time.perf_counter() - t
    r.update(n_sbatch=n_sbatch, n_loop=n_loop, n_array=n_array)
    return r


def markdown(r: dict) -> str:
    ratio = r["sbatch_ms"] / r["python"]
    rows = [
        ["`python -I -c pass` (bare interpreter start)", f"{r['python'] * 1000:.1f} ms", ""],
        ["`gpuctl --version` (start-up, no request)", f"{r['version'] * 1000:.1f} ms",
         f"{r['version'] / r['python']:.2f}x bare"],
        [f"`gpuctl sbatch` processes in a loop ({r['n_sbatch']})", f"{r['sbatch_ms'] * 1000:.1f} ms",
         f"{r['sbatch_rate']:.0f} jobs/s, {ratio:.2f}x bare (target 1.3x)"],
        [f"one connection, submit after submit ({r['n_loop']:,})",
         f"{r['loop_p50'] * 1000:.2f} ms (p99 {r['loop_p99'] * 1000:.2f})",
         f"{r['loop_rate']:,.0f} jobs/s"],
        [f"one connection, pipelined (`Client.submit_many`, {r['n_loop']:,})", "",
         f"{r['pipelined_rate']:,.0f} jobs/s (target 2,000)"],
        [f"one job array of {r['n_array']:,} tasks", f"{r['array_s'] * 1000:.0f} ms",
         f"{r['n_array'] / r['array_s']:,.0f} tasks/s"],
    ]
    return "\n".join([
        "## Submission throughput",
        "",
        "`python bench/bench_submit.py`: a real head (own process, SQLite WAL with "
        "synchronous=FULL, Mosquitto on loopback) without workers, so nothing starts; every "
        "submission is acknowledged only after its commit. Median time per call.",
        "",
        stamp(),
        "",
        table(["what", "per call", "rate"], rows, "lrr"),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sbatch", type=int, default=200)
    ap.add_argument("--loop", type=int, default=5000)
    ap.add_argument("--array", type=int, default=10_000)
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    md = markdown(measure(a.sbatch, a.loop, a.array))
    print(md)
    if not a.no_doc:
        write_section("submit", md)


if __name__ == "__main__":
    main()
