"""The head with many pending jobs: ``python bench/bench_squeue_rss.py [--sizes 1000,100000]``.

A real head (own process, no workers) is filled with pending 1-GPU jobs through job
arrays of up to 10,000 tasks, then measured at each size: ``gpuctl squeue`` as a user
runs it (a new process each time; median of 5), ``squeue -r`` (one line per array task,
so every job is formatted), and the head's resident memory (VmRSS).

Targets (docs/benchmarks.md): ``squeue`` no slower than Slurm's at 1,000 jobs (32-45 ms
measured here) and under 200 ms at 100,000; head RSS under 500 MB with 100,000 pending.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import head_cluster, stamp, table, write_section

SPEC = {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {}, "gpus": 1}
ARRAY_MAX = 10_000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def squeue_ms(c, *args: str, runs: int = 5) -> float:
    """Median milliseconds of ``gpuctl squeue ARGS``; RuntimeError with its message if it fails."""
    cmd = [sys.executable, "-m", "gpuctl.main", "--socket", c.socket, "squeue", *args]
    xs = []
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(cmd, env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        xs.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.decode(errors="replace").strip().splitlines()[-1][:200])
    return statistics.median(xs) * 1000


def squeue_cell(c, *args: str) -> str:
    try:
        return f"{squeue_ms(c, *args):.0f} ms"
    except RuntimeError as e:
        return f"fails: `{e}`"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    sizes = sorted(int(s) for s in a.sizes.split(","))
    rows = []
    with head_cluster() as c:
        assert c.head is not None
        base = rss_mb(c.head.pid)
        have = 0
        with c.client() as client:
            client.ping()
            for size in sizes:
                while have < size:
                    k = min(ARRAY_MAX, size - have)
                    client.submit_spec({**SPEC, "array": f"0-{k - 1}"})
                    have += k
                client.ping()
                time.sleep(2)     # not a synchronisation: lets a scheduler pass or two run first
                rows.append([f"{size:,}", squeue_cell(c), squeue_cell(c, "-r"),
                             f"{rss_mb(c.head.pid):.0f} MB"])
    md = "\n".join([
        "## squeue and head memory with many pending jobs",
        "",
        "`python bench/bench_squeue_rss.py`: a real head without workers holding N pending "
        "1-GPU jobs (submitted as arrays of up to 10,000 tasks). `squeue` prints a pending "
        "array as one line, `squeue -r` one line per task; both are whole `gpuctl` processes "
        f"(median of 5). The head's RSS before any job: {base:.0f} MB.",
        "",
        stamp(),
        "",
        table(["pending jobs", "`squeue`", "`squeue -r`", "head RSS"], rows),
        "",
        "Targets: `squeue` no slower than Slurm's at 1,000 jobs (32-45 ms measured on this "
        "kind of machine) and under 200 ms at 100,000; head RSS under 500 MB at 100,000.",
    ])
    print(md)
    if not a.no_doc:
        write_section("squeue-rss", md)


if __name__ == "__main__":
    main()
