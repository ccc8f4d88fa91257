"""No job runs twice at once, whatever fails, with real daemons over Mosquitto.

A 20 s job writes a timestamp every 100 ms into a file of its attempt; the tests cut its
worker off (the daemon SIGSTOPped, or its broker connection severed by a proxy the test
controls) and check from those files that the cut-off copy's last stamp comes before the
replacement's first.  Short leases (a few seconds) stand in for the default 300 s.
The proxy between gpuctl and the head drops answers after the commit: gpuctl still prints
the one job's id.
"""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path

import pytest

from tests.cluster import Cluster, wait_for
from tests.faultproxy import AnswerDropper, TcpProxy
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
LEASE = 5.0
STAMPS = ('for i in $(seq 200); do date +%s.%N >> {dir}/$GPUD_JOB_ATTEMPT; sleep 0.1; done')


def stamps(d: Path, attempt: int) -> list[float]:
    f = d / str(attempt)
    return [float(x) for x in f.read_text().split()] if f.exists() else []


def submit_stamper(c: Cluster, d: Path, *extra: str) -> int:
    d.mkdir(exist_ok=True)
    return c.sbatch("--gpus", "1", "-o", "/dev/null", *extra, "--wrap", STAMPS.format(dir=d))


def assert_never_overlapped(d: Path) -> None:
    first, second = stamps(d, 1), stamps(d, 2)
    assert first and second, (len(first), len(second))
    assert max(first) < min(second), f"the copies overlapped by {max(first) - min(second):.2f}s"


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, node_timeout=2.0, heartbeat=0.3, lease=LEASE)
    yield c
    c.close()


@pytest.fixture
def proxy(mosquitto):  # noqa: F811
    p = TcpProxy(mosquitto.port)
    yield p
    p.close()


def test_a_stopped_worker_daemon_never_runs_its_job_beside_the_replacement(cluster, tmp_path):
    cluster.start_head()
    w1 = cluster.start_worker("w1", "1xH100-80GB")
    d = tmp_path / "stamps"
    job = submit_stamper(cluster, d)
    wait_for(lambda: stamps(d, 1), 30, "the first copy to run")
    w1.send_signal(signal.SIGSTOP)            # its jobs run on; nothing renews the lease
    try:
        wait_for(lambda: cluster.node_state("w1") == "DOWN", 30, "w1 DOWN")
        j = cluster.job(job)
        assert j["state"] == "RUNNING" and j["attempt"] == 1   # DOWN, but the lease still holds
        cluster.start_worker("w2", "1xH100-80GB")
        wait_for(lambda: stamps(d, 2), 60, "the replacement to run on w2")
        assert_never_overlapped(d)
    finally:
        w1.send_signal(signal.SIGCONT)
    done = cluster.wait_job_state(job, TERMINAL, 90)
    assert done["state"] == "COMPLETED" and done["node"] == "w2" and done["attempt"] == 2
    assert_never_overlapped(d)
    wait_for(lambda: cluster.node_state("w1") in ("IDLE", "MIXED"), 30, "w1 to come back")
    assert "lease" in cluster.log("worker-w1")
    # why, as scontrol tells it: the job's requeue and the node's history
    shown = cluster.gpuctl("scontrol", "show", "job", str(job)).stdout
    assert "Restarts=1" in shown and "LastRequeue=node w1 DOWN" in shown and "lease ended" in shown
    node = cluster.gpuctl("scontrol", "show", "node", "w1").stdout
    assert "UP->DOWN node_down: no heartbeat" in node and "DOWN->UP returned" in node
    # and as sacct tells it: the first run NODE_FAIL on w1 with its cause, the last COMPLETED on w2
    rows = cluster.gpuctl("sacct", "-D", "-j", str(job), "-P", "-n",
                          "-o", "JobID,State,NodeList,Reason").stdout.splitlines()
    assert len(rows) == 2 and rows[0].startswith(f"{job}|NODE_FAIL|w1|node w1 DOWN") and "lease ended" in rows[0]
    assert rows[1].startswith(f"{job}|COMPLETED|w2|")
    assert len(cluster.gpuctl("sacct", "-j", str(job), "-P", "-n").stdout.splitlines()) == 1   # the last run only
    runs = json.loads(cluster.gpuctl("sacct", "-D", "-j", str(job), "--json").stdout)["jobs"][0]["earlier_attempts"]
    assert [(r["attempt"], r["state"], r["node"]) for r in runs] == [(1, "NODE_FAIL", "w1")]


def test_a_worker_cut_from_the_broker_longer_than_its_lease(cluster, proxy, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "1xH100-80GB", args=("--broker", proxy.url))
    d = tmp_path / "stamps"
    job = submit_stamper(cluster, d)
    wait_for(lambda: stamps(d, 1), 30, "the first copy to run")
    proxy.cut()
    try:
        wait_for(lambda: cluster.node_state("w1") == "DOWN", 30, "w1 DOWN")
        assert cluster.job(job)["attempt"] == 1
        cluster.start_worker("w2", "1xH100-80GB")
        wait_for(lambda: stamps(d, 2), 60, "the replacement to run on w2")
        assert_never_overlapped(d)
    finally:
        proxy.restore()
    done = cluster.wait_job_state(job, TERMINAL, 90)
    assert done["state"] == "COMPLETED" and done["attempt"] == 2
    assert_never_overlapped(d)
    events = cluster.gpuctl("sacct", "--json", "-j", str(job)).stdout
    assert "lease ended" in events or cluster.job(job)["requeue_count"] == 1


def test_a_cut_shorter_than_the_lease_kills_and_requeues_nothing(tmp_path, mosquitto, proxy):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, node_timeout=2.0, heartbeat=0.3, lease=20.0)
    try:
        c.start_head()
        c.start_worker("w1", "1xH100-80GB", args=("--broker", proxy.url))
        d = tmp_path / "stamps"
        job = submit_stamper(c, d)
        wait_for(lambda: stamps(d, 1), 30, "the job to run")
        proxy.cut()
        wait_for(lambda: c.node_state("w1") == "DOWN", 30, "w1 DOWN")   # no new jobs there ...
        proxy.restore()
        wait_for(lambda: c.node_state("w1") in ("IDLE", "MIXED"), 30, "w1 back")
        done = c.wait_job_state(job, TERMINAL, 90)
        assert done["state"] == "COMPLETED" and done["attempt"] == 1 and done["requeue_count"] == 0
        assert not stamps(d, 2) and len(stamps(d, 1)) == 200      # ... and the job ran on, whole
    finally:
        c.close()


def test_a_launch_sent_while_the_worker_is_cut_off_is_never_started(tmp_path, mosquitto, proxy):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, node_timeout=4.0, heartbeat=0.3, lease=LEASE)
    try:
        c.start_head()
        c.start_worker("w1", "1xH100-80GB", args=("--broker", proxy.url))
        d = tmp_path / "marks"
        d.mkdir()
        proxy.cut()
        # w1 still counts as UP: the head places the job there and its launch waits in the broker
        job = c.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", f"touch {d}/$GPUD_JOB_ATTEMPT")
        wait_for(lambda: (j := c.job(job)) and j["state"] == "RUNNING" and j["node"] == "w1", 30,
                 "the job to be placed on w1")
        wait_for(lambda: c.node_state("w1") == "DOWN", 30, "w1 DOWN")
        c.start_worker("w2", "1xH100-80GB")
        done = c.wait_job_state(job, TERMINAL, 60)     # requeued once w1's lease ended, run on w2
        assert done["state"] == "COMPLETED" and done["node"] == "w2"
        proxy.restore()                                 # w1 gets the queued, stale launch
        wait_for(lambda: c.node_state("w1") in ("IDLE", "MIXED"), 30, "w1 back")
        # Whether the broker hands the queued launch over or not, w1 must not run it: held
        # after the reconnect, its lease lapsed, and not among the allocations the head names.
        # (tests/test_lease_worker.py shows the worker turning such a launch down.)
        wait_for(lambda: c.log("worker-w1").count("reconnected to the broker") >= 1, 30, "w1 to reconnect")
        c.sbatch("--gpus", "1", "-w", "w1", "-o", "/dev/null", "--wrap", f"touch {d}/w1-after")
        wait_for(lambda: (d / "w1-after").exists(), 30, "a fresh job on w1 (its queue is drained)")
        assert not (d / "1").exists() and (d / "2").exists()
    finally:
        c.close()


def test_answers_dropped_after_the_commit_still_give_one_job_each(cluster, tmp_path):
    cluster.start_head()
    lost = collections.Counter()

    def drop(line: bytes) -> bool:       # every submission's first answer is lost
        req = json.loads(line)
        if req.get("op") != "submit":
            return False
        key = req.get("args", {}).get("key")
        lost[key] += 1
        return lost[key] == 1

    proxy = AnswerDropper(cluster.socket, str(tmp_path / "proxy.sock"), drop)
    try:
        printed = []
        for _ in range(100):
            r = cluster.gpuctl("--socket", proxy.path, "sbatch", "--parsable", "-o", "/dev/null",
                               "--hold", "--wrap", "true")
            printed.append(int(r.stdout.strip()))
        assert proxy.dropped == 100
        jobs = cluster.jobs()
        assert len(jobs) == 100 and sorted(jobs) == sorted(printed) and len(set(printed)) == 100
    finally:
        proxy.close()


# -- a full filesystem under the head's database -----------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    import subprocess

    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, leave_kb: int) -> Path:
    """Take the filesystem's space, leaving about ``leave_kb``."""
    import os

    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = mnt / f"filler{len(list(mnt.glob('filler*')))}"
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave_kb * 1024))
        except OSError:
            pass
    return filler


def test_a_full_disk_is_reported_survived_and_recovered_from(tmp_path, mosquitto, small_fs):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, node_timeout=2.0, heartbeat=0.3, lease=LEASE)
    c.config.write_text(c.config.read_text().replace(
        "[head]\n", f'[head]\ndatabase = "{small_fs}/head.db"\nmin_free_disk = "100K"\n'))
    try:
        c.start_head()
        w1 = c.start_worker("w1", "1xH100-80GB")
        accepted = [c.sbatch("--hold", "-o", "/dev/null", "--wrap", "true") for _ in range(5)]
        fillers = [fill(small_fs, 400)]
        big = tmp_path / "big.sh"       # one launch carries it (640 KiB); the disk does not
        big.write_text("#!/bin/bash\n#" + "x" * 600_000 + "\ntrue\n")
        r = c.gpuctl("sbatch", "--export=NONE", str(big), check=False)
        assert r.returncode != 0 and "the head's disk is full" in r.stderr, r.stderr
        assert "no transaction is active" not in r.stderr
        fillers.append(fill(small_fs, 0))

        def refused() -> str | None:   # the head looks at the free space at most once a second
            r = c.gpuctl("sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true", check=False)
            if r.returncode == 0:
                accepted.append(int(r.stdout.strip()))
                return None
            return r.stderr
        message = wait_for(refused, 30, "submissions to be refused")
        assert "the head's disk has only" in message or "disk is full" in message, message
        # a node goes DOWN while the disk is full: the head lives on (and retries)
        c.stop(w1, signal.SIGKILL)
        wait_for(lambda: "could not record node changes" in c.log("head") or c.node_state("w1") == "DOWN", 30,
                 "the head to try to mark w1 DOWN")
        assert c.head.poll() is None and c.gpuctl("squeue", check=False).returncode == 0
        for f in fillers:                              # space returns
            f.unlink()
        wait_for(lambda: c.node_state("w1") == "DOWN", 30, "w1 DOWN once space returned")
        c.start_worker("w1", "1xH100-80GB")
        wait_for(lambda: c.gpuctl("sbatch", "--hold", "-o", "/dev/null", "--wrap", "true",
                                  check=False).returncode == 0, 30, "submissions to be taken again")
        jobs = c.jobs()
        assert all(j in jobs for j in accepted)       # nothing accepted was lost
        assert c.head.poll() is None
        wal = small_fs / "head.db-wal"
        wait_for(lambda: not wal.exists() or wal.stat().st_size == 0, 60, "the WAL to be truncated when idle")
    finally:
        c.close()
