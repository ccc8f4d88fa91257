"""Interactive allocations are jobs: they queue behind a full cluster with a pending reason,
take [scheduler] interactive_qos by default, are preempted and timed out like batch jobs
(a head and two 2-GPU workers over Mosquitto)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cluster import wait_for
from tests.interactive_rig import MqttRig, child_env, gpuctl_argv, gpus_allocated
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
POLICY = """
[scheduler]
interactive_qos = "low"

[preemption]
exempt_time = "0s"

[qos.normal]

[qos.high]
preempt = ["low"]

[qos.low]
grace_time = "1s"
"""


@pytest.fixture
def rig(tmp_path, mosquitto):  # noqa: F811
    r = MqttRig(tmp_path / "c", mosquitto.url, extra_toml=POLICY).up()
    try:
        yield r
    finally:
        r.close()


def queue(rig) -> dict[int, dict]:
    r = rig.gpuctl("squeue", "--json", check=False)
    return {j["job_id"]: j for j in json.loads(r.stdout)["jobs"]} if r.returncode == 0 else {}


def start(rig, verb: str, *args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(gpuctl_argv(rig.socket, verb, *args), env=child_env(rig.socket), stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(rig.root))


def test_a_queued_request_waits_with_a_reason_and_starts_when_gpus_free(rig):
    batch = [rig.sbatch("--gpus", "2", "--wrap", "sleep 600", "-o", "/dev/null") for _ in range(2)]
    wait_for(lambda: gpus_allocated(rig) == 4, 60, "the batch jobs to fill the cluster")
    srun = start(rig, "srun", "--gpus", "2", "printenv", "CUDA_VISIBLE_DEVICES")
    assert srun.stderr.readline().startswith("srun: job ")     # "srun: job N queued and waiting ..."
    job = wait_for(lambda: next((j for j in queue(rig).values() if j["job_id"] not in batch), None), 30)
    assert job["state"] == "PENDING" and job["reason"] and job["qos"] == "low"
    rig.gpuctl("scancel", str(batch[0]))
    out, err = srun.communicate(timeout=120)
    assert srun.returncode == 0, err
    assert len(out.strip().split(",")) == 2 and f"job {job['job_id']} has been allocated resources" in err
    rig.gpuctl("scancel", str(batch[1]))
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "every GPU free")


def test_a_preemptible_interactive_job_is_preempted_like_a_batch_job(rig):
    other = rig.sbatch("--gpus", "2", "--wrap", "sleep 600", "-o", "/dev/null")   # QOS normal: not preemptible
    wait_for(lambda: gpus_allocated(rig) == 2, 60, "the batch job")
    salloc = start(rig, "salloc", "--gpus", "2", "sleep", "600")
    wait_for(lambda: gpus_allocated(rig) == 4, 60, "the allocation (QOS low, by interactive_qos)")
    alloc = next(j for j in queue(rig).values() if j["job_id"] != other)
    assert alloc["qos"] == "low"
    high = rig.sbatch("--qos", "high", "--gpus", "2", "--wrap", "sleep 600", "-o", "/dev/null")
    wait_for(lambda: queue(rig).get(high, {}).get("state") == "RUNNING", 60, "the high-QOS job to preempt it")
    _, err = salloc.communicate(timeout=60)            # salloc hung up its command and ended
    assert f"Job allocation {alloc['job_id']} has been revoked" in err
    rig.gpuctl("scancel", str(high), str(other))


def test_the_time_limit_ends_an_allocation(rig):
    salloc = start(rig, "salloc", "--gpus", "1", "-t", "0:00:02", "sleep", "600")
    _, err = salloc.communicate(timeout=90)
    assert "has been revoked (" in err
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "the GPU free")
