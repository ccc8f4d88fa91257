"""A head and sim workers as separate processes over a real Mosquitto: the whole path.

Jobs record their own timestamps, so the tests check from the jobs' point of view that each
ran exactly once and that no GPU ever ran two jobs at once.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}

# Each job appends "<job> <attempt> <gpu uuids> <start> <end>" to the shared log (O_APPEND
# writes of one short line are atomic), from the job's own clock.
RECORD = ('s=$(date +%s.%N); sleep {sleep}; e=$(date +%s.%N); '
          'echo "$GPUD_JOB_ID $GPUD_JOB_ATTEMPT $CUDA_VISIBLE_DEVICES $s $e" >> {log}')


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url)
    yield c
    c.close()


def read_records(path: Path) -> list[tuple[int, int, tuple[str, ...], float, float]]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        job, attempt, gpus, start, end = line.split()
        out.append((int(job), int(attempt), tuple(gpus.split(",")), float(start), float(end)))
    return out


def assert_no_gpu_overlap(records) -> None:
    by_gpu = collections.defaultdict(list)
    for job, _, gpus, start, end in records:
        for g in gpus:
            by_gpu[g].append((start, end, job))
    for g, spans in by_gpu.items():
        spans.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"GPU {g} ran jobs {j1} and {j2} at once"


def test_200_jobs_two_workers_each_exactly_once(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    cluster.start_worker("w2", "4xA100-80GB")
    log = tmp_path / "runs.log"
    # A few through the CLI, the rest through one client connection (as a submitting script would).
    ids = [cluster.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", RECORD.format(sleep="0.05", log=log))
           for _ in range(5)]
    with cluster.client() as client:
        ids += [client.submit(wrap=RECORD.format(sleep="0.2", log=log), gpus=1, stdout="/dev/null",
                              work_dir=str(tmp_path)) for _ in range(195)]
    wait_for(lambda: len(read_records(log)) >= 200, 240, "200 jobs to run")
    jobs = wait_for(lambda: (js := cluster.jobs()) and all(js[i]["state"] in TERMINAL for i in ids) and js,
                    60, "all jobs to end")
    assert {jobs[i]["state"] for i in ids} == {"COMPLETED"}
    records = read_records(log)
    counts = collections.Counter(r[0] for r in records)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    assert all(len(r[2]) == 1 and r[2][0].startswith("GPU-") for r in records)
    assert_no_gpu_overlap(records)
    assert {jobs[i]["node"] for i in ids} == {"w1", "w2"}


def test_head_kill9_during_submissions_loses_nothing(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    log = tmp_path / "runs.log"
    long_id = cluster.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", RECORD.format(sleep="4", log=log))
    cluster.wait_job_state(long_id, "RUNNING", 30)
    accepted: list[int] = []
    stop = threading.Event()

    def submit_loop() -> None:
        while not stop.is_set():
            r = cluster.gpuctl("sbatch", "--parsable", "--gpus", "1", "-o", "/dev/null", "--wrap",
                               RECORD.format(sleep="0.01", log=log), check=False, timeout=30)
            if r.returncode == 0:
                accepted.append(int(r.stdout.strip()))

    t = threading.Thread(target=submit_loop)
    t.start()
    wait_for(lambda: len(accepted) >= 15, 60, "submissions to stream in")
    cluster.head.send_signal(signal.SIGKILL)
    cluster.head.wait(10)
    n_at_crash = len(accepted)
    cluster.start_head()
    wait_for(lambda: len(accepted) >= n_at_crash + 10, 60, "submissions to resume")
    stop.set()
    t.join(60)
    jobs = wait_for(lambda: (js := cluster.jobs()) and all(i in js and js[i]["state"] in TERMINAL
                                                           for i in accepted + [long_id]) and js,
                    120, "every accepted job to end")
    assert all(jobs[i]["state"] == "COMPLETED" for i in accepted + [long_id])
    counts = collections.Counter(r[0] for r in read_records(log))
    assert all(counts[i] == 1 for i in accepted + [long_id]), counts
    # The job running during the crash kept its first and only allocation.
    assert jobs[long_id]["attempt"] == 1


def test_worker_cut_off_is_fenced_before_its_job_runs_elsewhere(cluster, tmp_path):
    cluster.start_head()
    w1 = cluster.start_worker("w1", "2xH100-80GB")
    log = tmp_path / "runs.log"
    marker = tmp_path / "attempts"
    script = (f'echo "$GPUD_JOB_ATTEMPT $$" >> {marker}; ' + RECORD.format(sleep="8", log=log))
    job = cluster.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", f"sleep 0.5; {script}")
    norq = cluster.sbatch("--gpus", "1", "--no-requeue", "-o", "/dev/null", "--wrap", "sleep 30")
    wait_for(lambda: marker.exists(), 30, "first attempt to start")
    cluster.wait_job_state(norq, "RUNNING")
    first_pid = int(marker.read_text().split()[1])
    w1.send_signal(signal.SIGSTOP)  # cut off: no heartbeats, its jobs keep running until the lease ends
    try:
        wait_for(lambda: cluster.node_state("w1") == "DOWN", 30, "w1 to be declared DOWN")
        cluster.start_worker("w2", "2xH100-80GB")
        # only once w1's lease has ended (its wrapper killed the job) is it requeued
        cluster.wait_job_state(norq, "NODE_FAIL", 60)
        cluster.wait_job_state(job, {"RUNNING", "COMPLETED"}, 60)
        assert cluster.job(job)["attempt"] == 2
        assert not _alive(first_pid)
    finally:
        w1.send_signal(signal.SIGCONT)
    done = cluster.wait_job_state(job, TERMINAL, 60)
    assert done["state"] == "COMPLETED" and done["node"] == "w2" and done["attempt"] == 2
    records = {r[1]: r for r in read_records(log)}
    assert set(records) <= {1, 2} and 2 in records
    if 1 in records:   # the cut-off copy may have ended within its lease: then before the other began
        assert records[1][4] <= records[2][3]
    wait_for(lambda: cluster.node_state("w1") in ("IDLE", "MIXED"), 30, "w1 to come back")


def test_worker_death_requeues_and_restart_recovers(cluster, tmp_path):
    cluster.start_head()
    w1 = cluster.start_worker("w1", "1xH100-80GB")
    job = cluster.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", "sleep 1")
    cluster.wait_job_state(job, "RUNNING")
    cluster.stop(w1, signal.SIGKILL)
    wait_for(lambda: cluster.node_state("w1") == "DOWN", 30, "w1 DOWN")
    assert cluster.job(job)["state"] in ("PENDING", "RUNNING", "COMPLETED")
    cluster.start_worker("w1", "1xH100-80GB")
    done = cluster.wait_job_state(job, TERMINAL, 60)
    assert done["state"] == "COMPLETED"


def test_broker_restart_loses_no_transition(cluster, tmp_path, mosquitto):  # noqa: F811
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    log = tmp_path / "runs.log"
    ids = [cluster.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", RECORD.format(sleep="1.5", log=log))
           for _ in range(8)]
    wait_for(lambda: sum(1 for j in cluster.jobs().values() if j["state"] == "RUNNING") >= 4, 30,
             "jobs to run")
    mosquitto.stop()
    wait_for(lambda: len(read_records(log)) >= 4, 30, "jobs to finish while the broker is down")
    mosquitto.start()
    jobs = wait_for(lambda: (js := cluster.jobs()) and all(js[i]["state"] in TERMINAL for i in ids) and js,
                    90, "all jobs to end after the broker came back")
    assert all(jobs[i]["state"] == "COMPLETED" for i in ids)
    counts = collections.Counter(r[0] for r in read_records(log))
    assert all(counts[i] == 1 for i in ids)
    assert cluster.node_state("w1") in ("IDLE", "MIXED")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
