"""The head with many pending jobs: ``python bench/bench_squeue_rss.py [--sizes 1000,100000] [--no-r] [--runs N]``.

A real head (own process, no workers) is filled with pending 1-GPU jobs through job
arrays of up to 10,000 tasks, then measured at each size: ``gpuctl squeue`` as a user
runs it (the ``gpuctl`` of a ``pip install .`` venv as scripts/install makes it, or
``python -m gpuctl`` here with ``--no-install``; a new process each time; median of 5), ``squeue -r`` (one line per array task, so every job is formatted), a bare
``python -I -c pass`` measured in between (this machine is shared: the ratio carries
over, the milliseconds do not), the ``jobs`` request squeue sends and a ``ping``, each
on one open connection (the head's side of squeue, and how long its event loop takes to
answer anything while scheduler passes over that queue run), and the head's resident
memory (VmRSS).

``--no-r`` skips ``squeue -r`` (seconds a run at 100,000); ``--runs`` sets how many of each
are taken.  The head process's CPU time while it is measured goes to stderr.

Targets (docs/benchmarks.md): ``squeue`` no slower than Slurm's at 1,000 jobs (bench_slurm.py
measures both side by side) and under 200 ms at 100,000; head RSS under 500 MB with 100,000 pending.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_submit
from common import cpu_s, head_cluster, stamp, table, write_section

from gpuctl.commands.squeue import Query

SPEC = {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {}, "gpus": 1}
ARRAY_MAX = 10_000
RUNS = 5          # --runs


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_ms(cmd: list[str], env: dict[str, str]) -> float:
    """Milliseconds of one process; RuntimeError with its last error line if it fails."""
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        raise RuntimeError((r.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1][:200])
    return ms


def measure(c, *args: str, python: str = sys.executable, gpuctl: list[str] | None = None
            ) -> tuple[str, float | None, float]:
    """(cell, median ms of ``gpuctl squeue ARGS`` or None, median ms of a bare python run
    interleaved with them); ``gpuctl``: the command (default ``python -m gpuctl``)."""
    cmd = [*(gpuctl or [python, "-m", "gpuctl"]), "--socket", c.socket, "squeue", *args]
    bare_cmd = [python, "-I", "-c", "pass"]
    xs, bare = [], []
    try:
        for _ in range(RUNS):
            bare.append(run_ms(bare_cmd, c.env))
            xs.append(run_ms(cmd, c.env))
    except RuntimeError as e:
        return f"fails: `{e}`", None, statistics.median(bare)
    ms = statistics.median(xs)
    return f"{ms:.0f} ms", ms, statistics.median(bare)


def call_ms(client, op: str, **args) -> float:
    """Median milliseconds of one request on an open connection."""
    xs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        client.call(op, **args)
        xs.append((time.perf_counter() - t) * 1000)
        time.sleep(0.2)
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--no-r", action="store_true", help="skip squeue -r")
    ap.add_argument("--runs", type=int, default=5, help="measurements of each (median)")
    ap.add_argument("--no-install", action="store_true",
                    help="run python -m gpuctl here instead of a pip-installed venv's gpuctl")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    with contextlib.ExitStack() as stack:
        python, gpuctl = ((sys.executable, None) if a.no_install
                          else stack.enter_context(bench_submit.installed()))
        report(a, python, gpuctl)


def report(a, python: str, gpuctl: list[str] | None) -> None:
    global RUNS
    RUNS = a.runs
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
                t, cpu = time.perf_counter(), cpu_s(c.head.pid)
                cell, ms, bare = measure(c, python=python, gpuctl=gpuctl)
                cell_r, _, bare_r = (("skipped", None, bare) if a.no_r
                                     else measure(c, "-r", python=python, gpuctl=gpuctl))
                ratio = f"{ms / bare:.1f}x" if ms is not None and bare else "-"
                asked = Query(refs=[], states=[], users=[], partitions=[], accounts=[]).request()
                rows.append([f"{size:,}", cell, cell_r, f"{statistics.median([bare, bare_r]):.0f} ms", ratio,
                             f"{call_ms(client, 'jobs', **asked):.0f} ms", f"{call_ms(client, 'ping'):.0f} ms",
                             f"{rss_mb(c.head.pid):.0f} MB"])
                print(f"{size:,} pending: head CPU {100 * (cpu_s(c.head.pid) - cpu) / (time.perf_counter() - t):.0f} %"
                      " of one CPU while measured", file=sys.stderr)
    md = "\n".join([
        "## squeue and head memory with many pending jobs",
        "",
        "`python bench/bench_squeue_rss.py`: a real head without workers holding N pending "
        "1-GPU jobs (submitted as arrays of up to 10,000 tasks). `squeue` prints a pending "
        "array as one line (the head folds it and sends only the table's fields), `squeue -r` "
        "one line per task; both are whole `gpuctl` processes, "
        + ("`python -m gpuctl` in this environment" if gpuctl is None else
           "the `gpuctl` of a `pip install .` venv as `scripts/install` makes it")
        + f" (median of {RUNS}). Bare python is `python -I -c pass` of the same environment, run between "
        "them, for the ratio. Head `jobs` is the request squeue sends, and head ping a `ping`, "
        "each on an open connection while scheduler passes over that queue run (median of "
        f"{RUNS}): what the head's side of squeue costs. The head's RSS before any job: {base:.0f} MB.",
        "",
        stamp(),
        "",
        table(["pending jobs", "`squeue`", "`squeue -r`", "bare python", "`squeue` / bare", "head `jobs`",
               "head ping", "head RSS"], rows),
        "",
        "Targets: `squeue` no slower than Slurm's at 1,000 jobs (Slurm's is measured beside gpud's "
        "in \"gpud and Slurm side by side\") and under 200 ms at 100,000; head RSS under 500 MB at 100,000.",
    ])
    print(md)
    if not a.no_doc:
        write_section("squeue-rss", md)


if __name__ == "__main__":
    main()
