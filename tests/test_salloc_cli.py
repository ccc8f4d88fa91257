"""gpuctl salloc and sattach against a fake head: usage mistakes, refusals, messages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fake_head import FakeHead

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpuctl(head_path: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    for k in ("GPUD_SOCKET", "GPUD_JOB_ID"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", head_path, *args],
                          capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


@pytest.mark.parametrize("option", [["--wrap", "true"], ["--array", "1-3"], ["-o", "out.txt"]])
def test_batch_only_options_are_usage_errors(head, option):
    r = gpuctl(head.path, "salloc", *option, "true")
    assert r.returncode == 2 and "salloc: error: salloc does not take" in r.stderr
    assert "submit" not in head.ops()


def test_a_refused_request_is_one_line_and_exit_1(head):
    head.refuse("submit", "Batch job submission failed: invalid partition 'x'")
    r = gpuctl(head.path, "salloc", "-p", "x", "true")
    assert r.returncode == 1
    assert r.stderr == "salloc: error: Batch job submission failed: invalid partition 'x'\n"


def test_an_allocation_revoked_while_pending_is_exit_1(head):
    head.reply("alloc_status", {"job_id": 1, "state": "CANCELLED", "reason": None, "nodelist": None,
                                "keepalive_every": 5.0})
    r = gpuctl(head.path, "salloc", "--gpus", "1", "true")
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["salloc: Pending job allocation 1",
                                     "salloc: error: Job allocation 1 has been revoked (cancelled)"]


def test_the_command_gets_the_jobs_environment_and_its_status_is_salloc_s(head):
    head.reply("alloc_status", {"job_id": 1, "state": "RUNNING", "reason": None, "nodelist": "w1", "nodes": 1,
                                "env": {"GPUD_JOB_ID": "1", "SLURM_JOB_ID": "1"}, "keepalive_every": 5.0})
    head.reply("alloc_release", {"released": True})
    r = gpuctl(head.path, "salloc", "sh", "-c", 'echo "$GPUD_JOB_ID $SLURM_JOB_ID $GPUD_SOCKET"; exit 6')
    assert r.returncode == 6
    assert r.stdout == f"1 1 {head.path}\n"
    assert r.stderr.splitlines()[-1] == "salloc: Relinquishing job allocation 1"
    assert head.ops()[-1] == "alloc_release"
    assert head.last("submit")["spec"]["interactive"] is True


@pytest.mark.parametrize("ref", ["5", "x.1", "5.", "0.1", "5.1.2"])
def test_sattach_needs_jobid_dot_step(head, ref):
    r = gpuctl(head.path, "sattach", ref)
    assert r.returncode == 2 and "use JOBID.STEP" in r.stderr


def test_sattach_prints_the_step_and_exits_with_its_status(head):
    head.reply("step_poll", {"lines": [[0, 1, "hello\n"]], "offset": 1, "cursor": {"w1": 1}, "dropped": 0,
                             "done": True, "exit_code": 3, "message": "task 0 on w1: exited with code 3",
                             "bad_rank": 0, "stdin": False})
    r = gpuctl(head.path, "sattach", "5.2")
    assert (r.returncode, r.stdout) == (3, "hello\n")
    assert r.stderr == "sattach: error: task 0 on w1: exited with code 3\n"
    assert head.last("step_poll")["job_id"] == 5 and head.last("step_poll")["step"] == 2
