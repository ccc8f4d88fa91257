"""Idle GPUs on a real cluster: head and sim workers as processes over Mosquitto, jobs that
declare their GPU utilization (GPUD_SIM_UTIL).  An idle job is flagged after the partition's
idle_period and a busy one is not; where the partition's policy says so, the idle one is requeued."""

from __future__ import annotations

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
POLICY = '''sample_interval = "0.3s"
[[partition]]
name = "gpu"
nodes = ["w1"]
default = true
idle_threshold = 5
idle_period = "3s"
idle_action = "requeue"
[[partition]]
name = "watch"
nodes = ["w2"]
idle_period = "3s"
'''


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, extra_toml=POLICY)
    yield c
    with c.client() as client:
        client.cancel(users=["root"])
    wait_for(lambda: all(j["state"] in TERMINAL for j in c.jobs().values()), 60, "jobs to end")
    c.close()


def test_idle_job_is_flagged_then_requeued_and_busy_job_is_left_alone(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    cluster.start_worker("w2", "2xA100-80GB")
    with cluster.client() as client:
        def submit(util: str, partition: str) -> int:
            return client.submit(wrap="sleep 300", gpus=1, partition=partition, stdout="/dev/null",
                                 work_dir=str(tmp_path), env={"GPUD_SIM_UTIL": util})

        idle, busy, watched = submit("0", "gpu"), submit("80", "gpu"), submit("1", "watch")

    # Flag only (partition "watch"): the job keeps running with reason GpuIdle, shown by squeue.
    flagged = wait_for(lambda: (j := cluster.jobs(all=False).get(watched)) and j["reason"] == "GpuIdle" and j,
                       60, "the idle job in 'watch' to be flagged")
    assert flagged["state"] == "RUNNING" and flagged["requeue_count"] == 0
    table = cluster.gpuctl("squeue", "-j", str(watched)).stdout
    assert "w2 (GpuIdle)" in table

    # Requeue policy (partition "gpu"): the idle job goes back to the queue and runs again.
    wait_for(lambda: (cluster.job(idle) or {}).get("requeue_count", 0) >= 1, 60, "the idle job to be requeued")
    jobs = cluster.jobs()
    assert jobs[busy]["state"] == "RUNNING"
    assert (jobs[busy]["requeue_count"], jobs[busy]["reason"]) == (0, None)
    assert jobs[busy]["gpu_util_mean"] == pytest.approx(80.0)
    assert jobs[idle]["state"] in ("PENDING", "RUNNING", "COMPLETING")     # requeued, not ended
    log = cluster.log("head")
    assert f"job {idle} (user root) on w1: GPUs idle: every GPU under 5% for" in log
    assert "GPUs idle" not in "\n".join(line for line in log.splitlines() if f"job {busy} " in line)
