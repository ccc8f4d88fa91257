"""Submission throughput through the real socket and SQLite path:
``python bench/bench_submit.py [--sbatch N] [--loop N] [--array N] [--serial N] [--no-install] [--no-starts] [--no-doc]``.

Against a real head (its own process, SQLite in WAL with synchronous=FULL, Mosquitto on
loopback, no workers so nothing starts):

* ``gpuctl sbatch`` processes one after another, as a shell loop runs them, each next to
  the start of a bare ``python -I -c pass`` of the same environment (the two alternate, so
  both see the same load), ``gpuctl squeue`` (its listing skips click too, and it does not
  load the sbatch option table) and ``gpuctl --help`` (the click group, which every other
  verb starts through).  Twice: in this development environment (an editable install, whose
  ``site`` start-up loads setuptools' path finder), and in a fresh virtual environment with
  ``pip install .`` as ``scripts/install`` makes it (byte-compiled; ``--no-install`` skips
  it).  The source tree is byte-compiled first, since ``PYTHONDONTWRITEBYTECODE`` would
  otherwise make every start compile gpuctl again;
* one ``gpuctl.Client`` connection submitting in a loop, each acknowledged before the next;
* the same connection pipelining (``Client.submit_many``): many requests in flight, each
  still acknowledged only after its commit, so the head's group commit can share fsyncs;
* one job array of N tasks in one request.

``--no-starts`` leaves out the process starts (their rows) and ``--serial`` sets how many
go one at a time (default: ``--loop``), for comparing the head's side alone; the head process's CPU time per pipelined submission goes to stderr.

Targets (docs/benchmarks.md): a ``gpuctl sbatch`` process within 1.3x of a bare Python
start; at least 2,000 acknowledged submissions/s on one connection.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from common import ROOT, cpu_s, head_cluster, stamp, table, write_section

SPEC = {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {}, "gpus": 1}


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd="/tmp")
    return time.perf_counter() - t


def starts(python: str, gpuctl: list[str], socket: str, n: int, env: dict) -> dict:
    """Median seconds of a bare interpreter, ``gpuctl --help`` and ``gpuctl sbatch``, taken
    in turn so that all three share the machine's load; and sbatch's rate."""
    sbatch = [*gpuctl, "--socket", socket, "sbatch", "-G", "1", "--parsable", "-o", "/dev/null", "--wrap", "true"]
    squeue = [*gpuctl, "--socket", socket, "squeue", "-u", "nobody"]   # the request, not a long table
    bare, helps, xs, queues = [], [], [], []
    for i in range(n):
        bare.append(timed([python, "-I", "-c", "pass"], env))
        xs.append(timed(sbatch, env))
        if i % 4 == 0:
            helps.append(timed([*gpuctl, "--help"], env))
            queues.append(timed(squeue, env))
    return {"python": statistics.median(bare), "help": statistics.median(helps),
            "sbatch": statistics.median(xs), "rate": n / sum(xs), "squeue": statistics.median(queues)}


@contextlib.contextmanager
def installed() -> Iterator[tuple[str, list[str]]]:
    """A throw-away virtual environment with gpud installed from this tree, not editable,
    byte-compiled, as scripts/install makes it; (its python, its gpuctl)."""
    with tempfile.TemporaryDirectory() as d:
        venv = Path(d) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                        str(ROOT)], check=True, stderr=subprocess.DEVNULL)
        subprocess.run([python, "-m", "compileall", "-q", str(venv / "lib")], check=True,
                       stdout=subprocess.DEVNULL)
        yield python, [str(venv / "bin" / "gpuctl")]


def console_script() -> list[str]:
    """This environment's gpuctl (the console script), or ``python -m gpuctl``."""
    script = Path(sys.executable).parent / "gpuctl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuctl"]


def measure(n_sbatch: int, n_loop: int, n_array: int, install: bool, starts_too: bool = True,
            n_serial: int | None = None) -> dict:
    n_serial = n_loop if n_serial is None else n_serial
    r: dict = {}
    for tree in ("gpud", "gpuctl"):
        compileall.compile_dir(str(ROOT / tree), quiet=1)
    with head_cluster() as c:
        env = {k: v for k, v in c.env.items() if k != "PYTHONPATH"}   # each environment its own gpud
        if starts_too:
            r["dev"] = starts(sys.executable, console_script(), c.socket, n_sbatch, env)
        if install and starts_too:
            with installed() as (python, gpuctl):
                r["installed"] = starts(python, gpuctl, c.socket, n_sbatch, env)
        with c.client() as client:
            client.ping()
            lat = []
            t = time.perf_counter()
            for _ in range(n_serial):
                t1 = time.perf_counter()
                client.submit_spec(SPEC)
                lat.append(time.perf_counter() - t1)
            r["loop_rate"] = n_serial / (time.perf_counter() - t)
            lat.sort()
            r["loop_p50"], r["loop_p99"] = lat[len(lat) // 2], lat[int(0.99 * (len(lat) - 1))]
            t, cpu = time.perf_counter(), cpu_s(c.head.pid)
            ids = client.submit_many([SPEC] * n_loop)
            r["pipelined_rate"] = len(ids) / (time.perf_counter() - t)
            r["pipelined_head_cpu_us"] = (cpu_s(c.head.pid) - cpu) / len(ids) * 1e6
            t = time.perf_counter()
            client.submit_spec({**SPEC, "array": f"0-{n_array - 1}"})
            r["array_s"] = time.perf_counter() - t
    r.update(n_sbatch=n_sbatch, n_loop=n_loop, n_array=n_array, n_serial=n_serial)
    return r


def start_rows(label: str, s: dict, n: int) -> list[list[str]]:
    return [
        [f"{label}: `python -I -c pass` (bare interpreter start)", f"{s['python'] * 1000:.1f} ms", ""],
        [f"{label}: `gpuctl --help` (the click group)", f"{s['help'] * 1000:.1f} ms",
         f"{s['help'] / s['python']:.2f}x bare"],
        [f"{label}: `gpuctl sbatch` processes in a loop ({n})", f"{s['sbatch'] * 1000:.1f} ms",
         f"{s['rate']:.0f} jobs/s, **{s['sbatch'] / s['python']:.2f}x bare** (target 1.3x)"],
        [f"{label}: `gpuctl squeue -u nobody` (the fast path's listing, no rows)", f"{s['squeue'] * 1000:.1f} ms",
         f"{s['squeue'] / s['python']:.2f}x bare"],
    ]


def markdown(r: dict) -> str:
    rows = start_rows("development venv (editable)", r["dev"], r["n_sbatch"]) if "dev" in r else []
    if "installed" in r:
        rows += start_rows("`pip install .` venv", r["installed"], r["n_sbatch"])
    rows += [
        [f"one connection, submit after submit ({r['n_serial']:,})",
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
        "submission is acknowledged only after its commit. Median time per call. Process starts "
        "alternate with a bare interpreter's of the same environment, so each ratio is taken under "
        "one load; the development venv is an editable install (its `site` loads setuptools' "
        "finder, in the bare start too), the other a fresh `pip install .` as `scripts/install` "
        "makes, byte-compiled.",
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
    ap.add_argument("--no-install", action="store_true", help="skip the pip-installed environment")
    ap.add_argument("--serial", type=int, help="submissions one at a time (default: --loop)")
    ap.add_argument("--no-starts", action="store_true", help="skip the gpuctl process starts")
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    r = measure(a.sbatch, a.loop, a.array, not a.no_install, not a.no_starts, a.serial)
    print(f"head CPU per pipelined submission: {r['pipelined_head_cpu_us']:.0f} us", file=sys.stderr)
    md = markdown(r)
    print(md)
    if not a.no_doc:
        write_section("submit", md)


if __name__ == "__main__":
    main()
