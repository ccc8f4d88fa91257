"""gpud and Slurm side by side on this machine: ``python bench/bench_slurm.py``.

Installs nothing.  When Slurm and munge are installed (Debian: ``apt-get install
slurm-wlm munge``), this starts munged (if it is not running) and a single-node Slurm
from a temporary directory: slurmctld and slurmd as root, select/cons_tres, 8 fake GPUs
declared in gres.conf over character devices made with ``mknod c 195 N`` (Slurm refuses
plain files), more CPUs than the host has so the GPUs bound concurrency, and the settings
of SchedMD's high-throughput guide (``batch_sched_delay=0``, ``sched_min_interval=0``,
no accounting or job completion logging, short ``MinJobAge``, quiet logs).  It measures
the same things on Slurm and on gpud, one after the other, and prints ratios:

* ``sbatch`` processes in a loop (jobs/s), and one submission's cost;
* 1,000 trivial 1-GPU jobs on 8 GPUs, submit to last end (jobs/s);
* submit-to-running latency of one job on an idle cluster (p50);
* ``squeue`` over 1,000 pending jobs.

Everything it started is stopped at the end (``scontrol shutdown``; munged only if this
script started it).  Without Slurm it says how to install it and writes that instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import head_cluster, stamp, table, write_section

import bench_e2e  # noqa: E402
import bench_submit  # noqa: E402
import bench_squeue_rss  # noqa: E402
from tests.cluster import wait_for  # noqa: E402

NEEDED = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged", "munge")
INSTALL = "apt-get install slurm-wlm munge"


def missing() -> list[str]:
    return [b for b in NEEDED if shutil.which(b) is None and not os.access(f"/usr/sbin/{b}", os.X_OK)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurm:
    """A single-node Slurm in ``d``; ``run`` calls its clients with SLURM_CONF set."""

    def __init__(self, d: Path, gpus: int = 8) -> None:
        self.d, self.gpus = d, gpus
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        self.started_munge = False

    def write_config(self) -> None:
        d = self.d
        (d / "state").mkdir()
        (d / "spool").mkdir()
        (d / "dev").mkdir()
        for i in range(self.gpus):
            os.mknod(d / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        cpus = max(64, 8 * self.gpus)
        (d / "slurm.conf").write_text(f"""\
ClusterName=bench
SlurmctldHost={self.host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldDebug=error
SlurmdDebug=error
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000
MaxJobCount=200000
MinJobAge=10
GresTypes=gpu
NodeName={self.host} CPUs={cpus} RealMemory=16000 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (d / "gres.conf").write_text(f"NodeName={self.host} Name=gpu File={d}/dev/nvidia[0-{self.gpus - 1}]\n")

    def start(self) -> None:
        self.write_config()
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
            self.started_munge = True
            wait_for(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
                     .returncode == 0, 30, "munged")
        subprocess.run(["slurmctld", "-c"], env=self.env, check=True)
        subprocess.run(["slurmd", "-c"], env=self.env, check=True)
        wait_for(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() in ("idle", "idle*"),
                 60, "the Slurm node to be idle")

    def run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check)

    def stop(self) -> None:
        self.run("scontrol", "shutdown")
        for name in ("slurmctld.pid", "slurmd.pid"):
            pid_file = self.d / name
            try:
                pid = int(pid_file.read_text())
                wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, name)
            except (OSError, ValueError, AssertionError):
                pass
        if self.started_munge:
            try:
                pid = int(Path("/run/munge/munged.pid").read_text())
                os.kill(pid, 15)
            except (OSError, ValueError):
                pass

    def idle(self) -> bool:
        return self.run("squeue", "-h", "-o", "%i").stdout.strip() == ""

    # -- the measures ------------------------------------------------------------------

    def sbatch_loop(self, n: int, work: Path) -> tuple[float, float]:
        xs = []
        t0 = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            self.run("sbatch", "-H", "--gres=gpu:1", "-o", "/dev/null", "-D", str(work), "--wrap", "true",
                     check=True)
            xs.append(time.perf_counter() - t)
        rate = n / (time.perf_counter() - t0)
        self.run("scancel", "-u", "root")
        wait_for(self.idle, 120, "Slurm's queue to empty")
        return rate, statistics.median(xs)

    def throughput(self, n: int, work: Path) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.run("sbatch", "--gres=gpu:1", "-o", "/dev/null", "-D", str(work), "--wrap", "true",
                     check=True)
        wait_for(self.idle, 1800, "Slurm to run every job", interval=0.2)
        return n / (time.perf_counter() - t0)

    def latency(self, n: int, work: Path) -> float:
        xs = []
        for k in range(n):
            f = work / f"slurm-lat-{k}.out"
            t0 = time.time()
            self.run("sbatch", "--gres=gpu:1", "-o", str(f), "-D", str(work), "--wrap", "date +%s.%N",
                     check=True)
            wait_for(lambda: f.exists() and f.read_text().strip(), 60, "the job's output", interval=0.02)
            xs.append(float(f.read_text().split()[0]) - t0)
            wait_for(self.idle, 60, "the job to leave the queue", interval=0.05)
        return statistics.median(xs)

    def squeue_ms(self, n: int, work: Path) -> float:
        for _ in range(n):
            self.run("sbatch", "-H", "--gres=gpu:1", "-o", "/dev/null", "-D", str(work), "--wrap", "true",
                     check=True)
        xs = []
        for _ in range(5):
            t = time.perf_counter()
            self.run("squeue")
            xs.append(time.perf_counter() - t)
        self.run("scancel", "-u", "root")
        return statistics.median(xs) * 1000


def gpud_measures(n_sbatch: int, n_jobs: int, n_lat: int, n_squeue: int, work: Path) -> dict:
    """gpuctl runs as users get it: the script of a ``pip install .`` venv (bench_submit)."""
    out: dict = {}
    with bench_submit.installed() as (python, gpuctl), head_cluster() as c:
        cmd = [*gpuctl, "--socket", c.socket, "sbatch", "-H", "-G", "1",
               "-o", "/dev/null", "--wrap", "true"]
        xs = []
        t0 = time.perf_counter()
        for _ in range(n_sbatch):
            t = time.perf_counter()
            subprocess.run(cmd, env=c.env, stdout=subprocess.DEVNULL, check=True)
            xs.append(time.perf_counter() - t)
        out["sbatch_rate"], out["sbatch_ms"] = n_sbatch / (time.perf_counter() - t0), statistics.median(xs) * 1000
        c.gpuctl("scancel", "-u", "root")
        with c.client() as client:
            for _ in range(n_squeue):
                client.submit_spec({**bench_squeue_rss.SPEC, "hold": True})
        out["squeue_ms"] = bench_squeue_rss.measure(c, "-r", python=python, gpuctl=gpuctl)[1]
    with bench_e2e.standalone(work) as sock:
        out["throughput"] = bench_e2e.throughput(sock, n_jobs, work, pipelined=False)
        out["latency_ms"] = statistics.median(bench_e2e.latency(sock, n_lat, work, [])) * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sbatch", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--latency", type=int, default=20)
    ap.add_argument("--squeue", type=int, default=1000)
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    head = ["## gpud and Slurm side by side", "",
            "`python bench/bench_slurm.py`: Slurm 22.05 (Debian's `slurm-wlm` with munge) as a "
            "single node with 8 fake GPUs (character devices in gres.conf) and the settings of "
            "SchedMD's high-throughput guide, then gpud (a head for `sbatch` and `squeue`, run by the "
            "`gpuctl` of a `pip install .` venv as `scripts/install` makes it, "
            "`gpud standalone` with 8 simulated GPUs for running jobs), the same measures one "
            "after the other. Ratio: gpud over Slurm (above 1 is gpud doing better, for rates; "
            "below 1 for times).", ""]
    gone = missing()
    if gone:
        md = "\n".join(head + [f"Not measured: {', '.join(gone)} not installed here "
                               f"(`{INSTALL}` installs them; this script installs nothing)."])
        print(md)
        if not a.no_doc:
            write_section("slurm", md)
        return
    if os.geteuid() != 0:
        sys.exit("bench_slurm.py: run it as root (it starts slurmctld, slurmd and munged)")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)
        (d / "work").mkdir()
        os.chmod(d / "work", 0o777)
        slurm = Slurm(d)
        try:
            slurm.start()
            version = slurm.run("sbatch", "--version").stdout.strip() or "version unknown"
            s_rate, s_ms = slurm.sbatch_loop(a.sbatch, d / "work")
            s_tp = slurm.throughput(a.jobs, d / "work")
            s_lat = slurm.latency(a.latency, d / "work") * 1000
            s_sq = slurm.squeue_ms(a.squeue, d / "work")
        finally:
            slurm.stop()
        g = gpud_measures(a.sbatch, a.jobs, a.latency, a.squeue, d / "work")
    rows = [
        [f"`sbatch` loop ({a.sbatch} processes)", f"{s_rate:.0f} jobs/s ({s_ms * 1000:.1f} ms)",
         f"{g['sbatch_rate']:.0f} jobs/s ({g['sbatch_ms']:.1f} ms)", f"{g['sbatch_rate'] / s_rate:.2f}"],
        [f"{a.jobs:,} trivial 1-GPU jobs on 8 GPUs", f"{s_tp:.1f} jobs/s", f"{g['throughput']:.1f} jobs/s",
         f"{g['throughput'] / s_tp:.2f}"],
        [f"submit to running, idle (p50 of {a.latency})", f"{s_lat:.0f} ms", f"{g['latency_ms']:.0f} ms",
         f"{g['latency_ms'] / s_lat:.2f}"],
        [f"`squeue` over {a.squeue:,} pending jobs", f"{s_sq:.0f} ms", f"{g['squeue_ms']:.0f} ms",
         f"{g['squeue_ms'] / s_sq:.2f}"],
    ]
    md = "\n".join(head + [f"{stamp()} Slurm: `{version}`.", "",
                           table(["measure", "Slurm", "gpud", "ratio"], rows)])
    print(md)
    if not a.no_doc:
        write_section("slurm", md)


if __name__ == "__main__":
    main()
