"""gpuctl srun against a fake head, and the worker's step tasks with real processes."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys

import pytest

from gpud.worker.jobsetup import TaskSetup
from gpud.bus.messages import MessageError, StepStart
from gpud.worker.stepenv import task_env
from gpud.worker.steps import StepTasks
from tests.fake_head import FakeHead

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def srun(head_path: str, *args: str, job: str | None = "5") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("GPUD_SOCKET", None)
    env.pop("GPUD_JOB_ID", None)
    if job is not None:
        env["GPUD_JOB_ID"] = job
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", head_path, "srun", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def test_outside_a_job_it_makes_an_allocation_runs_the_step_and_releases_it(head):
    head.reply("alloc_status", {"job_id": 1, "state": "RUNNING", "reason": None, "nodelist": "w1", "nodes": 1,
                                "env": {"GPUD_JOB_ID": "1"}, "keepalive_every": 5.0})
    head.reply("step_launch", {"job_id": 1, "step": 0, "ntasks": 1, "nodes": 1, "nodelist": "w1"})
    head.reply("step_poll", {"lines": [[0, 1, "w1\n"]], "offset": 1, "cursor": {"w1": 1}, "dropped": 0,
                             "done": True, "exit_code": 0, "message": None, "bad_rank": None})
    head.reply("alloc_release", {"released": True})
    r = srun(head.path, "--gpus", "1", "-t", "10", "hostname", job=None)
    assert (r.returncode, r.stdout, r.stderr) == (0, "w1\n", "")
    spec = head.last("submit")["spec"]
    assert spec["interactive"] is True and spec["gpus"] == 1 and spec["requeue"] is False
    assert head.last("step_launch")["env"]["GPUD_JOB_ID"] == "1"
    assert head.ops()[-1] == "alloc_release"


def test_resource_options_inside_a_job_are_ignored_with_a_warning(head):
    head.reply("step_launch", {"job_id": 5, "step": 0, "ntasks": 1, "nodes": 1, "nodelist": "w1"})
    head.reply("step_poll", {"lines": [], "offset": 0, "done": True, "exit_code": 0, "message": None,
                             "bad_rank": None})
    r = srun(head.path, "--gpus", "3", "true")
    assert r.returncode == 0
    assert r.stderr == "srun: warning: --gpus is ignored inside a job: the step uses job 5's allocation\n"
    assert "submit" not in head.ops()


def test_srun_sends_its_own_resource_limits(head):
    head.reply("step_launch", {"job_id": 5, "step": 0, "ntasks": 1, "nodes": 1, "nodelist": "w1"})
    head.reply("step_poll", {"lines": [], "offset": 0, "done": True, "exit_code": 0, "message": None,
                             "bad_rank": None})
    assert srun(head.path, "true").returncode == 0
    sent = head.last("step_launch")["rlimits"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)   # the srun child inherits this test's
    assert sent["NOFILE"] == [-1 if v == resource.RLIM_INFINITY else v for v in (soft, hard)]
    assert set(sent) == {"AS", "CORE", "CPU", "DATA", "FSIZE", "MEMLOCK", "NOFILE", "NPROC", "RSS", "STACK"}


def test_someone_elses_job_is_refused(head):
    head.refuse("step_launch", "srun: Access/permission denied: job 5 belongs to bob; only its owner or root may run tasks in it")
    r = srun(head.path, "hostname")
    assert r.returncode == 1
    assert r.stderr.strip() == "srun: error: srun: Access/permission denied: job 5 belongs to bob; only its owner or root may run tasks in it"
    assert r.stdout == ""


def test_prints_labelled_output_and_exits_with_the_failed_tasks_status(head):
    polls = iter([
        {"lines": [[0, 1, "zero\n"], [1, 2, "one err\n"]], "offset": 2, "dropped": 0, "done": False,
         "exit_code": None, "message": None, "bad_rank": None},
        {"lines": [[1, 1, "one\n"]], "offset": 3, "dropped": 0, "done": True, "exit_code": 3,
         "message": "task 1 on w2: exited with code 3", "bad_rank": 1},
    ])
    head.reply("step_launch", {"job_id": 5, "step": 0, "ntasks": 2, "nodes": 2, "nodelist": "w[1-2]"})
    head.handle("step_poll", lambda args, uid: next(polls))
    r = srun(head.path, "--label", "--ntasks-per-node", "1", "python", "-c", "x")
    assert r.returncode == 3
    assert r.stdout == "0: zero\n1: one\n"
    assert r.stderr == "1: one err\nsrun: error: task 1 on w2: exited with code 3\n"
    launch = head.last("step_launch")
    assert launch["job_id"] == 5 and launch["argv"] == ["python", "-c", "x"] and launch["ntasks_per_node"] == 1
    assert launch["env"]["GPUD_JOB_ID"] == "5"
    assert [head.last("step_poll")["offset"]] == [2]


def test_bad_ntasks_is_a_usage_error(head):
    assert srun(head.path, "--ntasks-per-node", "0", "true").returncode == 2


# -- the worker side -------------------------------------------------------------------------------

def test_task_env_gives_each_task_its_place():
    env = task_env({"CUDA_VISIBLE_DEVICES": "GPU-a", "SLURM_JOB_ID": "5"}, rank=9, local=1, per_node=8,
                   node_rank=1, nnodes=4, step=2, master_addr="10.0.0.1", master_port=20005, nodelist="w[1-4]")
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["NODE_RANK"]) == ("9", "1", "32", "1")
    assert (env["GPUD_PROCID"], env["GPUD_LOCALID"], env["GPUD_NTASKS"]) == ("9", "1", "32")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["SLURM_PROCID"]) == ("10.0.0.1", "20005", "9")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a"


def step_body(argv, **over):
    body = {"job": 5, "attempt": 1, "step": 0, "argv": argv, "env": {"FROM_SRUN": "s", "CUDA_VISIBLE_DEVICES": "x"},
            "ntasks_per_node": 2, "node_rank": 1, "nnodes": 2, "nodelist": "w[1-2]", "master_addr": "10.0.0.1",
            "master_port": 20005}
    body.update(over)
    return StepStart.from_body(body)


def test_a_bad_step_command_is_refused():
    with pytest.raises(MessageError):
        step_body([])
    with pytest.raises(MessageError):
        step_body(["true"], node_rank=2)
    with pytest.raises(MessageError):
        step_body(["true"], ntasks_per_node=0)


async def run_step(tmp_path, body, *, until):
    sent: list[tuple[str, dict]] = []

    async def emit(msg):
        sent.append((msg.KIND, msg.to_body()))

    setup = TaskSetup(os.getuid(), os.getgid(), [], False, str(tmp_path),
                      {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "GPU-mine", "GPUD_JOB_ID": "5"})
    tasks = StepTasks("w2", lambda job, attempt: setup if (job, attempt) == (5, 1) else None, emit)
    await tasks.start(body)
    for _ in range(400):
        if until(sent, tasks):
            break
        await asyncio.sleep(0.025)
    return sent, tasks


def exits(sent):
    return {b["rank"]: (b["exit_code"], b["signal"]) for k, b in sent if k == "step_exit"}


def lines(sent):
    return [tuple(x) for k, b in sent if k == "step_output" for x in b["lines"]]


async def test_tasks_run_with_their_ranks_and_report_output_then_exit(tmp_path):
    body = step_body(["sh", "-c", 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $CUDA_VISIBLE_DEVICES $FROM_SRUN $PWD"; '
                      'echo err >&2; exit $LOCAL_RANK'])
    sent, _ = await run_step(tmp_path, body, until=lambda s, t: len(exits(s)) == 2)
    assert exits(sent) == {2: (0, None), 3: (1, None)}
    out = sorted(lines(sent))
    assert (2, 1, f"2 0 4 GPU-mine s {tmp_path}\n") in out and (3, 1, f"3 1 4 GPU-mine s {tmp_path}\n") in out
    assert (2, 2, "err\n") in out
    # A task's output goes out before its exit.
    for rank in (2, 3):
        exit_at = next(i for i, (k, b) in enumerate(sent) if k == "step_exit" and b["rank"] == rank)
        assert all(i < exit_at for i, (k, b) in enumerate(sent)
                   if k == "step_output" and any(x[0] == rank for x in b["lines"]))


async def test_kill_step_and_missing_allocation(tmp_path):
    body = step_body(["sleep", "60"])
    sent, tasks = await run_step(tmp_path, body, until=lambda s, t: t.running() == 2)
    assert tasks.kill_step(5, 1, 0)
    for _ in range(400):
        if len(exits(sent)) == 2:
            break
        await asyncio.sleep(0.025)
    assert exits(sent) == {2: (0, 9), 3: (0, 9)}
    sent2, _ = await run_step(tmp_path, step_body(["true"], attempt=7), until=lambda s, t: s)
    assert sent2[0][0] == "step_exit" and sent2[0][1]["rank"] is None and "does not run" in sent2[0][1]["message"]


async def test_a_command_that_does_not_exist_exits_127(tmp_path):
    sent, _ = await run_step(tmp_path, step_body(["no-such-command-here"]), until=lambda s, t: len(exits(s)) == 2)
    assert exits(sent) == {2: (127, None), 3: (127, None)}
    assert any("no-such-command-here" in text and fd == 2 for _, fd, text in lines(sent))


async def test_a_working_directory_the_task_cannot_enter_is_an_error(tmp_path):
    body = step_body(["true"])
    sent, _ = await run_step(tmp_path / "missing", body, until=lambda s, t: len(exits(s)) == 2)
    assert exits(sent) == {2: (126, None), 3: (126, None)}


async def test_tasks_run_under_sruns_limits_never_above_the_workers(tmp_path):
    """srun's NOFILE, lowered, reaches both tasks; a hard limit above the worker's own is
    clamped to it (the worker runs these tasks as it would as root)."""
    _, node_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    body = step_body(["sh", "-c", "echo $(ulimit -Sn) $(ulimit -Hn)"], rlimits={"NOFILE": [321, 10**9]})
    assert body.rlimits == {"NOFILE": (321, 10**9)}
    sent, _ = await run_step(tmp_path, body, until=lambda s, t: len(exits(s)) == 2)
    assert exits(sent) == {2: (0, None), 3: (0, None)}
    hard = "unlimited" if node_hard == resource.RLIM_INFINITY else str(node_hard)
    assert sorted(lines(sent)) == [(2, 1, f"321 {hard}\n"), (3, 1, f"321 {hard}\n")]


async def test_a_task_on_a_terminal_runs_under_sruns_limits_too(tmp_path):
    body = step_body(["sh", "-c", "ulimit -Sn"], rlimits={"NOFILE": [321, 321]}, pty=True, ntasks_per_node=1,
                     nnodes=1, node_rank=0)
    sent, _ = await run_step(tmp_path, body, until=lambda s, t: len(exits(s)) == 1)
    assert exits(sent) == {0: (0, None)}
    assert "".join(text for _, fd, text in lines(sent) if fd == 3).split() == ["321"]
