"""What a worker does with array and Slurm facts: environment, output names, open mode."""

from __future__ import annotations

import os

import pytest

from gpud.worker import jobwrap
from gpud.worker.launch import Launch, batch_env, output_path

BODY = {
    "job_id": 57, "attempt": 1, "name": "sweep", "user": "alice", "uid": 1000, "gid": 1000,
    "script": "#!/bin/sh\ntrue\n", "work_dir": "/data/w", "env": {"A": "1"},
    "gpus": [{"index": 2, "uuid": "GPU-2"}, {"index": 3, "uuid": "GPU-3"}], "cpus": 8, "mem_mb": 4096,
    "time_limit": 60, "kill_grace": 5, "submit_dir": "/data/w",
}
TASK = {"array_job_id": 50, "array_task_id": 7, "array_task_count": 10, "array_task_min": 0,
        "array_task_max": 9, "array_task_step": 1}


def launch(**extra) -> Launch:
    return Launch.from_body({**BODY, **extra})


def test_the_new_fields_round_trip_and_old_heads_still_work():
    full = launch(**TASK, open_mode="append", slurm_compat_env=True, partition="gpu", account="phys",
                  qos="normal", cluster="c1", restart_count=2)
    assert Launch.from_body(full.to_body()) == full
    plain = launch()
    assert (plain.array_job_id, plain.open_mode, plain.slurm_compat_env, plain.restart_count) == (None, None, False, 0)


@pytest.mark.parametrize("field, value, message", [
    ("open_mode", "sideways", "open_mode must be append or truncate"),
    ("slurm_compat_env", "yes", "slurm_compat_env must be true or false"),
    ("array_task_id", -1, "array_task_id must be an integer"),
])
def test_bad_fields_are_refused(field, value, message):
    with pytest.raises(ValueError) as e:
        launch(**{field: value})
    assert message in str(e.value)


@pytest.mark.parametrize("pattern, expected", [
    (None, "/data/w/gpud-50_7.out"),
    ("out-%A_%a.txt", "/data/w/out-50_7.txt"),
    ("%x-%j-%3a.log", "/data/w/sweep-57-007.log"),
    ("/logs/%u/%N/%A.%a", "/logs/alice/n1/50.7"),
    ("100%%-%s-%t-%n", "/data/w/100%-batch-0-0"),
])
def test_output_names_for_array_tasks(pattern, expected):
    assert output_path(pattern, launch(**TASK), "n1") == expected


def test_output_names_outside_arrays():
    assert output_path(None, launch(), "n1") == "/data/w/gpud-57.out"
    assert output_path("x-%A_%a", launch(), "n1") == "/data/w/x-57_0"


def test_array_environment_always_slurm_names_only_when_asked():
    env = batch_env(launch(**TASK), "n1")
    assert env == {"GPUD_ARRAY_JOB_ID": "50", "GPUD_ARRAY_TASK_ID": "7", "GPUD_ARRAY_TASK_COUNT": "10",
                   "GPUD_ARRAY_TASK_MIN": "0", "GPUD_ARRAY_TASK_MAX": "9", "GPUD_ARRAY_TASK_STEP": "1"}
    assert batch_env(launch(), "n1") == {}


def test_slurm_compat_environment():
    env = batch_env(launch(**TASK, slurm_compat_env=True, partition="gpu", account="phys", qos="high", cluster="c1",
                           restart_count=1), "n1")
    assert {k: env[k] for k in (
        "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_SUBMIT_DIR",
        "SLURM_JOB_NODELIST", "SLURMD_NODENAME", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_JOB_GPUS",
        "SLURM_GPUS_ON_NODE", "SLURM_MEM_PER_NODE", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT",
        "SLURM_JOB_QOS", "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")} == {
        "SLURM_JOB_ID": "57", "SLURM_JOBID": "57", "SLURM_JOB_NAME": "sweep", "SLURM_JOB_USER": "alice",
        "SLURM_SUBMIT_DIR": "/data/w", "SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1", "SLURM_NTASKS": "1",
        "SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_GPUS": "2,3", "SLURM_GPUS_ON_NODE": "2",
        "SLURM_MEM_PER_NODE": "4096", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ACCOUNT": "phys",
        "SLURM_JOB_QOS": "high", "SLURM_CLUSTER_NAME": "c1", "SLURM_RESTART_COUNT": "1",
        "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "10"}
    plain = batch_env(launch(slurm_compat_env=True), "n1")
    assert "SLURM_ARRAY_TASK_ID" not in plain and plain["SLURM_JOB_ID"] == "57"


def test_open_mode_append_keeps_what_was_there(tmp_path):
    path = str(tmp_path / "out")
    with open(path, "w") as f:
        f.write("first run\n")
    fd = jobwrap.open_output(path, append=True)
    os.write(fd, b"second run\n")
    os.close(fd)
    assert open(path).read() == "first run\nsecond run\n"
    fd = jobwrap.open_output(path)
    os.write(fd, b"fresh\n")
    os.close(fd)
    assert open(path).read() == "fresh\n"
