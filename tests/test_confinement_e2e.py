"""Confinement end to end: real head and worker processes, real cgroups, real gpuctl.

Root only (the worker confines jobs only as root); skipped where this host mounts no cgroup
v1 freezer or memory controller.  Kept few and short: the host has two cores shared with
other work, and the accounting test burns 20 CPU-seconds on purpose.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from gpud.worker import cgroups as cg
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

PY = sys.executable


def _confinable() -> str | None:
    if os.geteuid() != 0:
        return "confinement needs root"
    c = cg.detect("v1", "gpud-probe")
    if not c.active:
        return c.reason
    c.close()
    missing = {"freezer", "memory", "devices", "cpuacct"} & set(c.missing)
    return f"cgroup v1 controllers not mounted: {', '.join(sorted(missing))}" if missing else None


needs_cgroups = pytest.mark.skipif(_confinable() is not None, reason=str(_confinable()))


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, extra_toml='sample_interval = "0.5s"\ncgroups = "v1"\n')
    c.devices = tmp_path / "dev"
    c.start_head()
    p = c._spawn(["worker", "--name", "n1", "--sim", "4xH100-80GB", "--sim-devices", str(c.devices)], "worker-n1")
    c.workers["n1"] = p
    wait_for(lambda: c.node_state("n1") not in (None, "DOWN", "UNKNOWN") or p.poll() is not None, 30,
             "worker n1 to register")
    assert p.poll() is None, c.log("worker-n1")
    yield c
    c.close()


@needs_cgroups
def test_out_of_memory_and_device_fence_through_gpuctl(cluster, tmp_path):
    show = cluster.gpuctl("scontrol", "show", "node", "n1").stdout
    assert "Confinement=v1" in show
    work = tmp_path / "w"
    work.mkdir()
    os.chmod(work, 0o777)
    hog = cluster.sbatch("--mem=100M", "-D", str(work), "-o", "hog.out",
                         "--wrap", f"{PY} -c 'import time; b = b\"x\" * (1 << 30); time.sleep(60)'")
    nodes = " ".join(str(cluster.devices / f"nvidia{i}") for i in range(4))
    fence = cluster.sbatch("--gpus=2", "-D", str(work), "-o", "fence.out", "--wrap",
                           f"unset CUDA_VISIBLE_DEVICES; echo gpus=$GPUD_GPUS; {PY} -c '\n"
                           "import errno, os, sys\n"
                           "for p in sys.argv[1:]:\n"
                           "    try: os.close(os.open(p, os.O_RDWR)); r = \"ok\"\n"
                           "    except OSError as e: r = errno.errorcode[e.errno]\n"
                           f"    print(os.path.basename(p), r)' {nodes}")
    job = cluster.wait_job_state(hog, "OUT_OF_MEMORY", timeout=60)
    assert (job["exit_code"], job["signal"]) == (0, 125)
    row = cluster.gpuctl("sacct", "-j", str(hog), "-n", "-P", "-o", "JobID,State,ExitCode,ReqMem,MaxRSS").stdout
    fields = row.strip().split("|")
    assert fields[:4] == [str(hog), "OUT_OF_MEMORY", "0:125", "100M"] and fields[4].endswith(("K", "M"))
    cluster.wait_job_state(fence, "COMPLETED", timeout=60)
    out = (work / "fence.out").read_text().split()
    given = {int(i) for i in out[0].removeprefix("gpus=").split(",")}
    got = dict(zip(out[1::2], out[2::2]))
    assert len(given) == 2
    assert got == {f"nvidia{i}": ("ENXIO" if i in given else "EPERM") for i in range(4)}


@needs_cgroups
def test_usage_of_a_busy_job_in_sstat_sacct_and_seff(cluster, tmp_path):
    """Two processes burning 10 CPU-seconds each (their own CPU time, so a busy host only
    makes it take longer): sstat shows it while it runs, sacct and seff after it."""
    work = tmp_path / "w"
    work.mkdir()
    os.chmod(work, 0o777)
    burn = f"{PY} -c 'import time\nwhile time.process_time() < 10: pass'"
    jid = cluster.sbatch("-c", "2", "--mem=1G", "-D", str(work), "-o", "burn.out",
                         "--wrap", f"{burn} & {burn}; wait")
    cluster.wait_job_state(jid, "RUNNING")
    during = wait_for(lambda: (r := cluster.gpuctl("sstat", "-j", str(jid), "-n", "-P", "-o", "JobID,AveCPU,MaxRSS",
                                                   check=False)).returncode == 0 and r.stdout, 30, "sstat rows")
    ids = [line.split("|")[0] for line in during.splitlines()]
    assert ids[0] == str(jid) and f"{jid}.batch" in ids
    batch = json.loads(cluster.gpuctl("sstat", "-j", f"{jid}.batch", "--json").stdout)["steps"]
    assert [s["id"] for s in batch] == [f"{jid}.batch"]
    job = cluster.wait_job_state(jid, "COMPLETED", timeout=120)
    assert abs(job["total_cpu"] - 20.0) <= 2.0, job["total_cpu"]
    row = cluster.gpuctl("sacct", "-j", str(jid), "-n", "-P", "-o", "TotalCPU,AllocCPUS,CPUTime,MaxRSS").stdout
    total, alloc, cputime, rss = row.strip().split("|")
    assert total.startswith("00:") and alloc == "2" and cputime and rss
    seff = cluster.gpuctl("seff", str(jid)).stdout
    assert "CPU Utilized: 00:00:" in seff and "CPU Efficiency:" in seff and "core-walltime" in seff
    assert "Memory Utilized:" in seff and "Memory Efficiency:" in seff and "of 1.00 GB" in seff
    r = cluster.gpuctl("sstat", "-j", str(jid), check=False)
    assert r.returncode == 1 and "not running" in r.stderr


def test_an_unconfined_node_says_so(tmp_path, mosquitto):  # noqa: F811
    with Cluster(tmp_path / "c", mosquitto.url, extra_toml='cgroups = "off"\n') as c:
        c.start_head()
        c.start_worker("n1")
        assert "Confinement=none" in c.gpuctl("scontrol", "show", "node", "n1").stdout
        reasons = c.gpuctl("sinfo", "-R").stdout.splitlines()
        assert reasons[0].split() == ["REASON", "USER", "TIMESTAMP", "NODELIST"]
        assert reasons[1].startswith("Confinement=none")
        assert reasons[1].split()[-1] == "n1"
        jid = c.sbatch("--wrap", "true")
        job = c.wait_job_state(jid, "COMPLETED")
        assert job["max_rss"] is None and job["total_cpu"] is None
        assert "Memory Efficiency: not measured" in c.gpuctl("seff", str(jid)).stdout


@needs_cgroups
def test_a_restarted_worker_keeps_its_confined_jobs_and_kills_them_whole(cluster, tmp_path):
    from tests.test_confinement import ESCAPEES, alive

    work = tmp_path / "w"
    work.mkdir()
    os.chmod(work, 0o777)
    jid = cluster.sbatch("-D", str(work), "-o", "esc.out", "--wrap", ESCAPEES)
    wait_for(lambda: "ready" in ((work / "esc.out").read_text() if (work / "esc.out").exists() else ""), 60,
             "the job's escapees")
    pids = [int(p) for p in (work / "escapee.pids").read_text().split()]
    cluster.stop(cluster.workers["n1"])
    assert all(alive(p) for p in pids)
    p = cluster._spawn(["worker", "--name", "n1", "--sim", "4xH100-80GB", "--sim-devices", str(cluster.devices)],
                       "worker-n1")
    cluster.workers["n1"] = p
    wait_for(lambda: "watching it again" in cluster.log("worker-n1") or p.poll() is not None, 30, "re-adoption")
    assert cluster.job(jid)["state"] == "RUNNING"
    cluster.gpuctl("scancel", str(jid))
    cluster.wait_job_state(jid, "CANCELLED")
    assert not any(alive(p) for p in pids)
