"""gpuctl salloc end to end: real daemons (standalone, and a head with two workers over
Mosquitto), real gpuctl processes, the keepalive timeout of a killed salloc."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.cluster import wait_for
from tests.interactive_rig import TIMEOUT, child_env, gpuctl_argv, gpus_allocated, rig  # noqa: F401 (fixture)
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def salloc(rig, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(gpuctl_argv(rig.socket, "salloc", *args), env=child_env(rig.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(rig.root), **kw)


def test_salloc_runs_steps_on_its_node_and_releases_the_gpus(rig):
    p = salloc(rig, "--gpus", "2", "bash", "-c",
               "echo job=$GPUD_JOB_ID; gpuctl srun printenv CUDA_VISIBLE_DEVICES; gpuctl srun hostname; exit 4")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4, err
    job_id = int(out.split("job=")[1].split()[0])
    lines = out.splitlines()
    assert len(lines[1].split(",")) == 2 and lines[1].startswith("GPU-")
    assert err.splitlines()[0] == f"salloc: Pending job allocation {job_id}"
    assert f"salloc: Granted job allocation {job_id}" in err
    assert err.splitlines()[-1] == f"salloc: Relinquishing job allocation {job_id}"
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "both GPUs to be free again (sinfo)")
    job = wait_for(lambda: (j := _job(rig, job_id)) and j["state"] not in ("RUNNING", "COMPLETING") and j, 30)
    assert job["state"] == "COMPLETED"


def test_a_command_that_ends_at_once_still_leaves_the_job_completed(rig):
    p = salloc(rig, "--gpus", "1", "true")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    job_id = int(err.split("Granted job allocation ")[1].split()[0])
    assert wait_for(lambda: (j := _job(rig, job_id)) and j["state"] not in ("RUNNING", "COMPLETING") and j,
                    30)["state"] == "COMPLETED"


def _nodes(rig) -> int:
    import json

    return len(json.loads(rig.gpuctl("sinfo", "--json").stdout)["nodes"])


def _job(rig, job_id):
    import json

    r = rig.gpuctl("sacct", "--json", "-j", str(job_id), check=False)
    jobs = json.loads(r.stdout)["jobs"] if r.returncode == 0 else []
    return jobs[0] if jobs else None


def test_a_killed_salloc_releases_its_gpus_after_the_timeout(rig):
    p = salloc(rig, "--gpus", "2", "sleep", "600")
    wait_for(lambda: gpus_allocated(rig) == 2, 60, "the allocation to be granted")
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    # The holder outlives salloc until the head has not heard from it for TIMEOUT seconds.
    wait_for(lambda: gpus_allocated(rig) == 0, 1.5 * TIMEOUT + 30, "the head to release the silent allocation")
    log = rig.log("head")
    assert "no keepalive from its salloc/srun" in log


def test_ctrl_c_while_pending_withdraws_the_request(rig):
    nodes = _nodes(rig)
    blocker = salloc(rig, "-N", str(nodes), "--gpus-per-node", "2", "sleep", "600")   # every GPU
    wait_for(lambda: gpus_allocated(rig) == 2 * nodes, 60, "the first allocation")
    waiting = salloc(rig, "--gpus", "2", "true")
    err = ""
    while "queued and waiting for resources" not in err:
        err += waiting.stderr.readline()
        assert waiting.poll() is None or "queued" in err, err
    assert "(reason: " in err    # a pending reason, as squeue shows it
    waiting.send_signal(signal.SIGINT)
    rest = waiting.communicate(timeout=30)[1]
    assert waiting.returncode == 1
    job_id = int(err.split("Pending job allocation ")[1].split()[0])
    assert f"Job allocation {job_id} has been revoked." in rest
    assert wait_for(lambda: (j := _job(rig, job_id)) and j["state"] == "CANCELLED", 30)
    blocker.send_signal(signal.SIGTERM)   # salloc passes it to sleep, which ends; salloc releases
    blocker.communicate(timeout=30)
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "the first allocation to be released")


def test_a_two_node_allocation_is_granted_once_both_holders_run(tmp_path, mosquitto):  # noqa: F811
    from tests.interactive_rig import MqttRig

    rig = MqttRig(tmp_path / "c", mosquitto.url).up()
    try:
        p = salloc(rig, "-N", "2", "--gpus-per-node", "2", "--ntasks-per-node", "2", "bash", "-c",
                   "gpuctl srun -l printenv CUDA_VISIBLE_DEVICES")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        gpus = dict(line.split(": ") for line in out.splitlines())
        assert sorted(gpus) == ["0", "1", "2", "3"] and gpus["0"] == gpus["1"] != gpus["2"] == gpus["3"]
        assert "Nodes w[1-2] are ready for job" in err
        wait_for(lambda: gpus_allocated(rig) == 0, 30, "all four GPUs free")
    finally:
        rig.close()
