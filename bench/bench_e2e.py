"""End-to-end short jobs on one box: ``python bench/bench_e2e.py [--jobs N] [--latency N]``.

``gpud standalone`` (head, worker and embedded broker in one process) with 8 simulated
GPUs.  Two measures:

* throughput: N trivial 1-GPU jobs (``true``) submitted through one connection as fast as
  the head acknowledges them, one request at a time (each waits for its commit, so the
  submission round trip bounds the rate) and then pipelined (``Client.submit_many``: what
  the cluster itself sustains); jobs/s from the first submission to the last job's end;
* submit-to-running latency: jobs submitted one at a time to an idle cluster, each
  writing the time it began; the latency is that time minus the moment before the
  submission request (same clock); the head's job event log splits it into stages.

``--confinement`` instead compares trivial-job throughput with the worker's job
confinement (``[worker] cgroups``, gpud.worker.cgroups) off and on, in turn, each on a fresh
standalone (run it as root: only a root worker confines jobs).

``--profile FILE`` writes a cProfile of the standalone process's event loop.  ``--cpu``
also prints the standalone process's CPU time (all its threads; not the jobs') per job
of each measure, on standard error.

Targets (docs/benchmarks.md): at least 100 trivial jobs/s end to end on 8 GPUs;
submit-to-running p50 under 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from common import ROOT, cpu_s, stamp, table, write_section

from gpuctl import Client  # noqa: E402
from gpuctl.script import api_settings, build_spec, wrap_script  # noqa: E402
from tests.cluster import env_for_children, wait_for  # noqa: E402


class ProcessCpu:
    """CPU seconds (user + system, every thread) a process has used, from /proc."""

    def __init__(self) -> None:
        self.pid: int | None = None

    def __call__(self) -> float:
        if self.pid is None:
            return 0.0
        return cpu_s(self.pid)


@contextlib.contextmanager
def standalone(d: Path, gpus: int = 8, profile: str | None = None,
               cpu: ProcessCpu | None = None, cgroups: str | None = None) -> Iterator[str]:
    sock = str(d / "gpud.sock")
    extra = []
    if cgroups is not None:
        (d / "gpud.toml").write_text(f'[worker]\ncgroups = "{cgroups}"\n')
        extra = ["--config", str(d / "gpud.toml")]
    key = str(d / "cluster.key")
    env = env_for_children()
    subprocess.run([sys.executable, "-m", "gpud.cli", "keygen", key], env=env, check=True,
                   capture_output=True)
    log = open(d / "standalone.log", "ab")
    if profile:  # cProfile of the event loop, written when it stops (gpud.standalone)
        env["GPUD_PROFILE"] = profile
    p = subprocess.Popen([sys.executable, "-m", "gpud.cli", "standalone", "--state-dir", str(d / "state"),
                          "--key-file", key, "--socket", sock, "--name", "bench",
                          "--sim", f"{gpus}xH100-80GB", "--log-level", "warning", *extra],
                         env=env, stdout=log, stderr=subprocess.STDOUT, cwd=d)
    if cpu is not None:
        cpu.pid = p.pid
    try:
        def ready() -> bool:
            if p.poll() is not None:
                raise RuntimeError(f"gpud standalone exited: {(d / 'standalone.log').read_text()[-2000:]}")
            try:
                with Client(sock, timeout=2) as c:
                    return any(n.get("state") not in ("DOWN", "UNKNOWN") for n in c.nodes())
            except Exception:
                return False
        wait_for(ready, 60, "gpud standalone with its node")
        yield sock
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


def throughput(sock: str, n: int, work: Path, pipelined: bool) -> float:
    opts = dict(gpus=1, stdout="/dev/null", work_dir=str(work))
    with Client(sock) as c:
        t0 = time.time()
        if pipelined:  # the head's job throughput, not one client's request round trip
            spec = build_spec(wrap_script("true"), api_settings(opts), default_name="wrap", args=[],
                              directives=False)
            ids = c.submit_many([spec] * n)
        else:
            ids = [c.submit(wrap="true", **opts) for _ in range(n)]
        # The last job first (a cheap request), then all: listing every active job five times
        # a second would load the head it measures.
        wait_for(lambda: not c.jobs(job_ids=ids[-1:]), 600, "the last job to end", interval=0.1)
        wait_for(lambda: not c.jobs(), 600, "every job to end", interval=0.2)
        done = {j["job_id"]: j for j in c.jobs(job_ids=ids, all=True)}
    assert all(done[i]["state"] == "COMPLETED" for i in ids), "some bench job did not complete"
    return n / (max(done[i]["end_time"] for i in ids) - t0)


def latency(sock: str, n: int, work: Path, ids: list[int]) -> list[float]:
    out = []
    with Client(sock) as c:
        for k in range(n):
            f = work / f"lat-{k}.out"
            t0 = time.time()
            jid = c.submit(wrap="date +%s.%N", gpus=1, stdout=str(f), work_dir=str(work))
            ids.append(jid)
            wait_for(lambda: c.jobs(job_ids=[jid], all=True)[0]["state"] == "COMPLETED", 60,
                     "the job", interval=0.02)
            out.append(float(f.read_text().split()[0]) - t0)
    return out


def stages(db: Path, ids: list[int]) -> list[tuple[str, float]]:
    """Median seconds between the job event log's steps of the ``ids``: submitted ->
    allocated -> started (the head heard it) -> finished (the head committed it)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(f"SELECT job_id, event, time FROM job_events WHERE job_id IN "
                           f"({','.join('?' * len(ids))}) ORDER BY id", ids).fetchall()
    finally:
        con.close()
    at: dict[int, dict[str, float]] = {}
    for jid, event, t in rows:
        at.setdefault(jid, {}).setdefault(event, t)
    steps = ["submitted", "allocated", "started", "finished"]
    out = []
    for a, b in zip(steps, steps[1:]):
        gaps = [e[b] - e[a] for e in at.values() if a in e and b in e]
        if gaps:
            out.append((f"{a} -> {b}", statistics.median(gaps)))
    return out


def confinement(n: int, no_doc: bool) -> None:
    """Throughput of ``n`` trivial jobs (pipelined, then one at a time) with confinement
    off, then on: each job's cgroup costs its creation, its limits and its removal."""
    from gpud.worker.cgroups import detect

    probe = detect("auto", "gpud-bench-probe")
    probe.close()
    rows = []
    for mode in ("off", "auto"):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            os.chmod(d, 0o755)
            cpu = ProcessCpu()
            with standalone(d, cgroups=mode, cpu=cpu) as sock:
                before = cpu()
                piped = throughput(sock, n, d, pipelined=True)
                single = throughput(sock, n, d, pipelined=False)
                per_job = (cpu() - before) / (2 * n)
        label = "off" if mode == "off" else f"on (cgroup {probe.kind})" if probe.active else f"none: {probe.reason}"
        rows.append([f"confinement {label}", f"{piped:.1f} jobs/s", f"{single:.1f} jobs/s",
                     f"{per_job * 1000:.1f} ms", "200 jobs/s" if mode != "off" else ""])
    md = "\n".join([
        "## End-to-end short jobs, confinement off and on",
        "",
        f"`python bench/bench_e2e.py --confinement --jobs {n}` as root: `gpud standalone` with 8 "
        f"simulated GPUs, {n:,} trivial 1-GPU jobs (`true`) pipelined and then one at a time, to "
        "the last end, first with `[worker] cgroups = \"off\"`, then with the default (each job in a "
        "cgroup of its own: created, limited, joined, drained and removed).",
        "",
        stamp(),
        "",
        table(["worker", "pipelined", "one at a time", "worker+head CPU a job", "target"], rows, "lrrrr"),
        "",
        "The CPU column is the standalone process's own CPU time (user and system, every "
        "thread: the cgroup files are written by its threads) per job, which a loaded host "
        "does not inflate the way it cuts jobs/s.",
    ])
    print(md)
    if not no_doc:
        write_section("e2e-confinement", md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--latency", type=int, default=50)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the standalone process into FILE")
    ap.add_argument("--cpu", action="store_true", help="print the standalone process's CPU time per job")
    ap.add_argument("--confinement", action="store_true",
                    help="compare throughput with [worker] cgroups off and on (as root)")
    a = ap.parse_args()
    if a.confinement:
        return confinement(a.jobs, a.no_doc)
    cpu = ProcessCpu()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)
        with standalone(d, profile=a.profile and os.path.abspath(a.profile), cpu=cpu if a.cpu else None) as sock:
            used = [cpu()]
            rate = throughput(sock, a.jobs, d, pipelined=False)
            used.append(cpu())
            piped = throughput(sock, a.jobs, d, pipelined=True)
            used.append(cpu())
            lat_ids: list[int] = []
            lat = sorted(latency(sock, a.latency, d, lat_ids))
            used.append(cpu())
        steps = stages(d / "state" / "head.db", lat_ids)
    if a.cpu:
        for name, n, before, after in zip(["one at a time", "pipelined", "latency"],
                                          [a.jobs, a.jobs, a.latency], used, used[1:]):
            print(f"standalone CPU, {name}: {(after - before) / n * 1000:.1f} ms a job", file=sys.stderr)
    p50, p95 = statistics.median(lat), lat[int(0.95 * (len(lat) - 1))]
    md = "\n".join([
        "## End-to-end short jobs",
        "",
        "`python bench/bench_e2e.py`: `gpud standalone` (head, worker, embedded broker in one "
        "process; the head and its worker speak in the process) with 8 simulated GPUs; jobs run "
        "as real processes.",
        "",
        stamp(),
        "",
        table(["measure", "result", "target"], [
            [f"{a.jobs:,} trivial 1-GPU jobs (`true`), submitted one at a time, to last end",
             f"{rate:.1f} jobs/s", "100 jobs/s"],
            [f"{a.jobs:,} trivial 1-GPU jobs (`true`), submitted pipelined, to last end",
             f"{piped:.1f} jobs/s", "100 jobs/s"],
            [f"submit to running, idle cluster ({a.latency} jobs): p50", f"{p50 * 1000:.0f} ms", "50 ms"],
            ["submit to running: p95", f"{p95 * 1000:.0f} ms", ""],
            *([f"idle cluster, head's event log: {name} (median)", f"{t * 1000:.0f} ms", ""]
              for name, t in steps),
        ], "lrr"),
    ])
    print(md)
    if not a.no_doc:
        write_section("e2e", md)
    return None


if __name__ == "__main__":
    sys.exit(main())
