"""The step stream: numbered output, cursors, acknowledgements, resends, adoption by a new
head, input in order (the head with a fake bus and a real store; the worker's StepTasks
with real processes)."""

from __future__ import annotations

import asyncio
import os

import pytest

from gpud.head import steps
from gpud.head.steps import Steps
from gpud.worker.jobsetup import TaskSetup
from gpud.bus.messages import MessageError, StepAck, StepStart, decode
from gpud.worker.steps import StepTasks
from gpud.worker.stepstream import WINDOW
from tests.slurm_head import ALICE, BOB, HeadKit


@pytest.fixture
async def kit(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        kit.record_sent()
        yield kit


async def one_node_step(kit, **launch):
    job_id = await kit.submit(ALICE, "sleep 600", gpus=1)
    await kit.schedule()
    job = kit.job(job_id)
    step = await kit.call("step_launch", ALICE, job_id=job_id, argv=["cat"], **launch)
    base = {"job": job_id, "attempt": job.attempt, "step": step["step"]}
    return job, step, base


async def test_a_gap_is_asked_for_again_and_repeats_are_dropped(kit):
    job, step, base = await one_node_step(kit)
    await kit.report("n1", "step_output", {**base, "first": 0, "lines": [[0, 1, "a\n"]]})
    kit.sent.clear()
    await kit.report("n1", "step_output", {**base, "first": 2, "lines": [[0, 1, "c\n"]]})   # 1 is missing
    assert kit.sent_to("step_ack") == [("n1", {**base, "next": 1, "resend": True})]
    await kit.report("n1", "step_output", {**base, "first": 0, "lines": [[0, 1, "a\n"], [0, 1, "b\n"],
                                                                         [0, 1, "c\n"]]})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert [t for _, _, t in got["lines"]] == ["a\n", "b\n", "c\n"] and got["cursor"] == {"n1": 3}


async def test_a_restarted_head_adopts_the_step_and_resumes_from_the_readers_cursor(kit):
    job, step, base = await one_node_step(kit, stdin=True)
    await kit.report("n1", "step_output", {**base, "first": 0, "lines": [[0, 1, "old\n"]]})
    kit.head.steps = Steps.of(kit.head)          # what a restarted head knows of steps: nothing
    kit.sent.clear()
    got_task = asyncio.ensure_future(kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=1,
                                              epoch="another head", cursor={"n1": 1}, ntasks_per_node=1))
    await asyncio.sleep(0.05)
    assert kit.sent_to("step_ack") == [("n1", {**base, "next": 1, "resend": True})]
    # The node sends what it kept from 1 on (and, being unsure, 0 again: dropped).
    await kit.report("n1", "step_output", {**base, "first": 0, "tasks": 1,
                                           "lines": [[0, 1, "old\n"], [0, 1, "new\n"]]})
    got = await got_task
    assert got["lines"] == [[0, 1, "new\n"]] and got["cursor"] == {"n1": 2}
    assert "not yours" in await kit.refused("step_poll", BOB, job_id=job.job_id, step=step["step"], offset=0)


async def test_a_step_number_never_given_out_is_not_adopted(kit):
    job, step, base = await one_node_step(kit)
    kit.head.steps = Steps.of(kit.head)
    assert "no step" in await kit.refused("step_poll", ALICE, job_id=job.job_id, step=7, offset=0)
    await kit.report("n1", "step_output", {**base, "step": 7, "first": 0, "lines": [[0, 1, "x\n"]]})
    assert (job.job_id, 7) not in kit.head.steps.steps


async def test_done_waits_for_the_output_sent_before_the_exit(kit):
    job, step, base = await one_node_step(kit)
    await kit.report("n1", "step_exit", {**base, "rank": 0, "exit_code": 0, "signal": None, "next": 1})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert not got["done"]                     # line 0 is still on its way
    await kit.report("n1", "step_output", {**base, "first": 0, "lines": [[0, 1, "last\n"]]})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["done"] and got["lines"] == [[0, 1, "last\n"]]


async def test_input_is_passed_on_in_order_with_a_window(kit, monkeypatch):
    monkeypatch.setattr(steps, "POLL_WAIT", 0.05)
    job, step, base = await one_node_step(kit, stdin=True)
    args = {"job_id": job.job_id, "step": step["step"], "writer": "w"}
    assert (await kit.call("step_input", ALICE, seq=0, data="hi\n", **args))["written"]
    assert kit.sent_to("step_input")[-1] == ("n1", {**base, "writer": "w", "seq": 0, "data": "hi\n", "eof": False})
    assert (await kit.call("step_input", ALICE, seq=steps.INPUT_WINDOW, data="x", **args)).get("retry")
    await kit.report("n1", "step_output", {**base, "first": 0, "lines": [], "input": {"w": 1}})
    assert (await kit.call("step_input", ALICE, seq=steps.INPUT_WINDOW, data="x", **args))["written"]
    assert "latin-1" in await kit.refused("step_input", ALICE, seq=1, data="\u20ac", **args)
    assert "not yours" in await kit.refused("step_input", BOB, seq=1, data="x", **args)


async def test_pty_needs_one_task(kit):
    job_id = await kit.submit(ALICE, "sleep 600", gpus=1, ntasks_per_node=2)
    await kit.schedule()
    assert "--pty runs one task" in await kit.refused("step_launch", ALICE, job_id=job_id, argv=["bash"],
                                                      pty=True, ntasks_per_node=2)


def test_stream_commands_are_checked():
    base = {"job": 1, "attempt": 1, "step": 0}
    assert decode("step_ack", {**base, "next": 3}) == StepAck(1, 1, 0, 3, resend=False)
    for kind, bad in (("step_ack", {**base, "next": -1}), ("step_input", {**base, "seq": 0, "writer": ""}),
                      ("step_input", {**base, "seq": 0, "writer": "w", "data": "\u20ac"}),
                      ("step_resize", {**base, "rows": 0, "cols": 80}), ("step_resize", "x")):
        with pytest.raises(MessageError):
            decode(kind, bad)


# -- the worker side -----------------------------------------------------------------------------

def body(argv, **over):
    b = {"job": 5, "attempt": 1, "step": 0, "argv": argv, "env": {}, "ntasks_per_node": 1, "node_rank": 0,
         "nnodes": 1, "nodelist": "w1", "master_addr": "10.0.0.1", "master_port": 20005}
    b.update(over)
    return StepStart.from_body(b)


async def worker_step(tmp_path, b):
    sent: list[tuple[str, dict]] = []

    async def emit(msg):
        sent.append((msg.KIND, msg.to_body()))

    setup = TaskSetup(os.getuid(), os.getgid(), [], False, str(tmp_path), {"PATH": os.environ["PATH"]})
    tasks = StepTasks("w1", lambda job, attempt: setup, emit)
    await tasks.start(b)
    return sent, tasks


async def until(cond, what="condition"):
    for _ in range(400):
        if cond():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


def items(sent):
    return [(m["first"] + i, x[2]) for k, m in sent if k == "step_output" for i, x in enumerate(m["lines"])]


async def test_the_worker_stops_reading_past_its_window_until_acknowledged(tmp_path):
    sent, tasks = await worker_step(tmp_path, body(["sh", "-c", "yes 0123456789012345678901234567890123456789"]))
    try:
        await until(lambda: sum(len(t) for _, t in items(sent)) >= WINDOW - (64 << 10), "a window of output")
        await asyncio.sleep(0.3)
        stalled = len(items(sent))
        await asyncio.sleep(0.3)
        assert len(items(sent)) == stalled     # nothing read while unacknowledged
        assert sum(len(t) for _, t in items(sent)) <= WINDOW + (64 << 10)
        await tasks.ack(5, 1, 0, stalled, False)
        await until(lambda: len(items(sent)) > stalled, "more output once acknowledged")
        assert [i for i, _ in items(sent)] == list(range(len(items(sent))))   # numbered without gaps
        n = len(sent)
        await tasks.ack(5, 1, 0, stalled - 2, True)     # a resend from an earlier number
        await until(lambda: any(m.get("first") == stalled for k, m in sent[n:] if k == "step_output"), "the resend")
    finally:
        tasks.kill_step(5, 1, 0)
        await until(lambda: any(k == "step_exit" for k, _ in sent), "the exit")
        await tasks.close()


async def test_input_reaches_task_0_once_and_in_order(tmp_path):
    sent, tasks = await worker_step(tmp_path, body(["cat"], stdin=True))
    try:
        await tasks.write_input(5, 1, 0, "a", 1, "two\n", False)      # early: held for 0
        await tasks.write_input(5, 1, 0, "a", 0, "one\n", False)
        await tasks.write_input(5, 1, 0, "a", 0, "one\n", False)      # a repeat
        await tasks.write_input(5, 1, 0, "a", 2, "", True)
        await until(lambda: any(k == "step_exit" for k, _ in sent), "cat to end at end of input")
        assert "".join(t for _, t in items(sent)) == "one\ntwo\n"
        assert sent[-2][1]["input"] == {"a": 3} or any(m.get("input") == {"a": 3} for _, m in sent)
    finally:
        await tasks.close()


async def test_sruns_limits_go_to_the_nodes_and_bad_ones_are_refused(kit):
    job_id = await kit.submit(ALICE, "sleep 600", gpus=1)
    await kit.schedule()
    await kit.call("step_launch", ALICE, job_id=job_id, argv=["true"], rlimits={"NOFILE": [321, 4096]})
    [(node, body)] = kit.sent_to("step")
    assert node == "n1" and body["rlimits"] == {"NOFILE": [321, 4096]}
    await kit.call("step_launch", ALICE, job_id=job_id, argv=["true"])   # an older srun: none
    assert "rlimits" not in kit.sent_to("step")[-1][1]
    for bad, words in (({"NOFILE": [1]}, "srun: invalid resource limit 'NOFILE'"),
                       ({"LOTS": [1, 1]}, "srun: invalid resource limit 'LOTS'"),
                       ("all", "srun: rlimits must map resource names")):
        why = await kit.refused("step_launch", ALICE, job_id=job_id, argv=["true"], rlimits=bad)
        assert why.startswith(words) and "\n" not in why, why
    assert len(kit.sent_to("step")) == 2
