"""A worker's side of multi-node jobs when it restarts or is sent a step it cannot run:
real executor and processes for the holder and srun tasks, the in-memory bus for the daemon."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import psutil

from gpud.bus.base import HEAD_EVENTS
from gpud.head import gang
from gpud.bus.messages import StepStart
from gpud.worker.stepproc import SHELL, TASK_SHELL
from gpud.worker.steps import StepTasks
from tests.test_executor import Harness, until
from tests.test_worker_daemon import heartbeat, rig  # noqa: F401  (fixtures)


def step_body(argv, **over):
    body = {"job": 1, "attempt": 0, "step": 3, "argv": argv, "env": {}, "ntasks_per_node": 2, "node_rank": 1,
            "nnodes": 2, "nodelist": "w[1-2]", "master_addr": "10.0.0.1", "master_port": 20001}
    body.update(over)
    return body


def collector():
    """(what was sent, an emit that records it) for a StepTasks."""
    sent: list[tuple[str, dict]] = []

    async def emit(msg):
        sent.append((msg.KIND, msg.to_body()))
    return sent, emit


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


async def test_a_restarted_worker_readopts_the_holder_and_ends_the_orphaned_srun_tasks(tmp_path):
    h = Harness(tmp_path)
    steps_dir = str(tmp_path / "state" / "steps")
    sent, emit = collector()

    try:
        ex = h.executor()
        await ex.start()
        await ex.launch(h.launch(gang.HOLDER_SCRIPT, stdout="/dev/null"))
        holder = await until(lambda: h.started and h.pid(1), what="the holder")
        tasks = StepTasks("w2", ex.task_setup, emit, state_dir=steps_dir)
        await tasks.start(StepStart.from_body(step_body(["sh", "-c", "echo $$ > task.$RANK; exec sleep 600"])))
        pids = await until(lambda: all((h.work_dir / f"task.{r}").exists() and (h.work_dir / f"task.{r}").read_text()
                                       for r in (2, 3)) and
                           [int((h.work_dir / f"task.{r}").read_text()) for r in (2, 3)], what="the tasks")
        await until(lambda: os.path.isdir(steps_dir) and sorted(os.listdir(steps_dir)) == ["1.0.3.2", "1.0.3.3"],
                    what="a record of each task")
        # The worker stops (or dies): the holder and the tasks keep running, nobody reads the tasks.
        await tasks.close()
        await ex.close()
        assert not any(gone(p) for p in [holder, *pids])

        again = h.executor()
        await again.start()
        assert again.running() == [(1, 0)], "the holder is the node's part: it is adopted again"
        sent.clear()
        assert await StepTasks("w2", again.task_setup, emit, state_dir=steps_dir).recover() == 2
        await until(lambda: all(gone(p) for p in pids), what="the orphaned tasks to die")
        exits = {b["rank"]: b for k, b in sent if k == "step_exit"}
        assert sorted(exits) == [2, 3]
        assert all(b["signal"] == signal.SIGKILL and "restarted" in b["message"] and (b["job"], b["step"]) == (1, 3)
                   for b in exits.values())
        assert os.listdir(steps_dir) == []
        assert not gone(holder), "the holder is not a task"
        # The holder ignores the signals a job is told things with; a stop ends it.
        await again.signal(1, 0, "USR1", reason="signal")
        await again.kill(1, 0)
        outcome = await h.outcome(1)
        assert outcome.signal == signal.SIGKILL
    finally:
        await h.cleanup()


async def test_recover_skips_records_it_cannot_trust(tmp_path):
    sent, emit = collector()
    d = tmp_path / "steps"
    d.mkdir()
    (d / "garbage").write_text("{not json")
    (d / "1.0.0.0").write_text(json.dumps({"job": 1, "attempt": 0, "step": 0, "rank": 0, "pid": os.getpid(),
                                           "create_time": 12.0}))   # a recycled pid: not the task's
    assert await StepTasks("w1", lambda j, a: None, emit, state_dir=str(d)).recover() == 2
    assert [b["rank"] for _, b in sent] == [0] and sent[0][1]["signal"] is None
    assert "status is lost" in sent[0][1]["message"]
    assert os.listdir(d) == []


async def test_a_step_the_worker_refuses_is_answered_so_srun_does_not_wait(rig):  # noqa: F811
    mark = len(rig.inbox)
    await rig.command("step", step_body([""], node_rank=0))
    [exit_msg] = await rig.wait("step_exit", after=mark)
    assert exit_msg.topic == HEAD_EVENTS
    assert (exit_msg.body["job"], exit_msg.body["step"], exit_msg.body["rank"]) == (1, 3, None)
    assert "refused the step" in exit_msg.body["message"]
    # No readable ids: nothing to answer, only dropped.
    await rig.command("step", {"job": "x"})
    await rig.barrier()
    assert len(rig.seen("step_exit")) == 1


async def test_a_task_recorded_but_never_started_is_reported_and_its_shell_never_runs_it(tmp_path):
    # The record is written before the task starts; a worker that dies before recording the
    # pid leaves a record without one, and the task's shell finds its input closed.
    sent, emit = collector()
    d = tmp_path / "steps"
    d.mkdir()
    (d / "1.0.2.5").write_text(json.dumps({"job": 1, "attempt": 0, "step": 2, "rank": 5, "pid": None,
                                           "create_time": None}))
    assert await StepTasks("w1", lambda j, a: None, emit, state_dir=str(d)).recover() == 1
    ((kind, body),) = sent
    assert (kind, body["rank"], body["signal"]) == ("step_exit", 5, None) and "did not run" in body["message"]
    assert os.listdir(d) == []

    marker = tmp_path / "ran"
    proc = await asyncio.create_subprocess_exec(SHELL, "-c", TASK_SHELL, str(tmp_path), "touch", str(marker),
                                                stdin=asyncio.subprocess.PIPE)
    proc.stdin.close()                      # the worker is gone: no line at the gate
    assert await proc.wait() == 125 and not marker.exists()
    proc = await asyncio.create_subprocess_exec(SHELL, "-c", TASK_SHELL, str(tmp_path), "sh", "-c",
                                                f"cat > {marker}", stdin=asyncio.subprocess.PIPE)
    proc.stdin.write(b"\nleft over\n")     # past the gate the command reads /dev/null
    proc.stdin.close()
    assert await proc.wait() == 0 and marker.read_text() == ""
