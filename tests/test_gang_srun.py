"""gpuctl srun when its job or the head goes away under it, and when it is interrupted
(against a fake head: the answers are scripted, srun is the real console command)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.fake_head import FakeHead

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHED = {"job_id": 5, "step": 0, "ntasks": 2, "nodes": 2, "nodelist": "w[1-2]"}


def poll(lines=(), offset=0, done=False, exit_code=None, message=None):
    return {"lines": [list(x) for x in lines], "offset": offset, "dropped": 0, "done": done,
            "exit_code": exit_code, "message": message, "bad_rank": None}


def srun_cmd(head_path: str, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": ROOT, "GPUD_JOB_ID": "5"}
    env.pop("GPUD_SOCKET", None)
    return [sys.executable, "-m", "gpuctl.main", "--socket", head_path, "srun", *args], env


def srun(head_path: str, *args: str) -> subprocess.CompletedProcess:
    cmd, env = srun_cmd(head_path, *args)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def head():
    with FakeHead() as h:
        h.reply("step_launch", LAUNCHED)
        yield h


def test_the_job_ending_while_srun_waits_exits_1_with_one_line(head):
    answers = iter([poll([(0, 1, "started\n")], offset=1),
                    poll(offset=1, done=True, exit_code=1, message="job 5 was cancelled; its tasks were killed")])
    head.handle("step_poll", lambda args, uid: next(answers))
    r = srun(head.path, "sleep", "600")
    assert r.returncode == 1
    assert r.stdout == "started\n"
    assert r.stderr == "srun: error: job 5 was cancelled; its tasks were killed\n"


def test_a_head_restart_under_srun_is_exit_1_in_one_line(head):
    head.refuse("step_poll", "srun: no step 5.0 (it ended more than 120s ago, or the head restarted; "
                             "its tasks are killed)")
    r = srun(head.path, "true")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "head restarted" in r.stderr


def test_the_head_hanging_up_mid_poll_is_survived_from_the_cursor(head):
    """A head restart: srun reconnects and asks again from where it was, nothing twice."""
    answers = iter([poll([(0, 1, "before\n")], offset=1) | {"cursor": {"w1": 1}, "epoch": "a"},
                    b"",
                    poll([(0, 1, "after\n")], offset=1, done=True, exit_code=0) | {"cursor": {"w1": 2}, "epoch": "b"}])
    head.handle("step_poll", lambda args, uid: next(answers))
    r = srun(head.path, "true")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "before\nafter\n"
    assert "lost the head" in r.stderr and "reconnected" in r.stderr
    assert head.last("step_poll")["cursor"] == {"w1": 1}   # the retry asked from the cursor


def test_an_interrupt_cancels_the_step_on_a_fresh_connection(head):
    """The interrupted poll's answer is still owed on the old connection: reading the
    cancel's answer there would wait for the poll, up to its long-poll time."""
    seen = {}

    def slow_poll(args, uid):   # runs holding the fake head's lock; wait() lets others in
        seen["cancel_while_polling"] = head._cond.wait_for(lambda: "step_cancel" in head.ops(), timeout=30)
        return poll(offset=0, done=True, exit_code=130)

    head.handle("step_poll", slow_poll)
    head.reply("step_cancel", {"cancelled": True})
    cmd, env = srun_cmd(head.path, "sleep", "600")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        head.wait_for(lambda: "step_poll" in head.ops(), timeout=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert seen.get("cancel_while_polling") is True
    assert head.last("step_cancel") == {"job_id": 5, "step": 0}
    assert proc.returncode == 1
    assert err.strip().splitlines() == ["srun: error: interrupted; the tasks of step 5.0 were killed"]
