"""The head's group commit of worker reports and its scheduler pacing (gpud.head.daemon)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpud.bus.base import HEAD_EVENTS, Message
from gpud.bus.messages import decode
from tests.slurm_head import ALICE, HeadKit, as_sent


@pytest.fixture
async def kit(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        kit.add_node("n2", gpus=4)
        kit.sent = []
        publish = kit.head.bus.publish

        async def record(topic, message, body=None, *, retain=False):
            kit.sent.append((topic, *as_sent(message, body)))
            await publish(topic, message, body, retain=retain)

        kit.head.bus.publish = record
        kit.commits = 0

        def counted(txn):
            kit.commits += 1

        kit.store.on_commit.append(counted)
        yield kit


async def running(kit, n):
    ids = [await kit.submit(ALICE, "true", gpus=1) for _ in range(n)]
    await kit.schedule()
    jobs = [kit.job(i) for i in ids]
    assert all(j.state.value == "RUNNING" for j in jobs)
    return jobs


async def ended(kit, job):
    return (await kit.record(job.job_id))


def fin(job, exit_code=0, reason="exited"):
    return {"job": job.job_id, "attempt": job.attempt, "exit_code": exit_code, "signal": None,
            "reason": reason, "message": f"exited with code {exit_code}"}


async def test_a_burst_of_reports_is_one_commit_and_one_ack_per_node(kit):
    jobs = await running(kit, 6)
    kit.commits, kit.sent[:] = 0, []
    reports = [("started", j.node, {"job": j.job_id, "attempt": j.attempt, "pid": 100 + k})
               for k, j in enumerate(jobs)]
    reports += [("finished", j.node, fin(j, exit_code=k)) for k, j in enumerate(jobs)]
    reports.append(("finished", jobs[0].node, fin(jobs[0])))  # a repeat, as workers send them
    await kit.head.reports.apply([(node, decode(kind, body)) for kind, node, body in reports])
    assert kit.commits == 1
    records = [await ended(kit, j) for j in jobs]
    assert [r.state.value for r in records] == ["COMPLETED"] + ["FAILED"] * 5
    assert [r.exit_code for r in records] == list(range(6))
    acks = {topic.split("/")[1]: body["done"] for topic, kind, body in kit.sent if kind == "ack"}
    assert len([1 for _, kind, _ in kit.sent if kind == "ack"]) == len(acks)  # one per node
    assert sorted(p for pairs in acks.values() for p in pairs) == sorted(
        [[j.job_id, j.attempt] for j in jobs] + [[jobs[0].job_id, jobs[0].attempt]])
    for j in jobs:  # each acked to the node that ran it
        assert [j.job_id, j.attempt] in acks[j.node]
    events = [e["event"] for e in await kit.store.job_events(jobs[1].job_id)]
    assert events[-2:] == ["started", "finished"]


async def test_bad_and_stale_reports_in_a_batch_leave_the_rest(kit, caplog):
    a, b = await running(kit, 2)
    other = "n2" if a.node == "n1" else "n1"
    reports = [
        (a.node, {"job": True, "attempt": a.attempt}),       # a bool is no job id
        (a.node, ["not", "an", "object"]),
        (a.node, fin(a) | {"attempt": a.attempt + 5}),        # a stale attempt
        (other, fin(a)),                                      # not where it runs
        (b.node, fin(b) | {"exit_code": 2 ** 80}),            # SQLite cannot hold it
    ]
    await arriving_together(kit, [bus_message(kit, "finished", node, body) for node, body in reports])
    assert f"dropped finished from {a.node}: job must be an integer" in caplog.text
    assert f"dropped finished from {a.node}: body must be an object" in caplog.text
    assert kit.job(a.job_id).state.value == "RUNNING"
    rec = await ended(kit, b)
    assert rec.state.value == "FAILED" and rec.exit_code is None  # ended, the code dropped


def bus_message(kit, kind, node, body):
    return Message(HEAD_EVENTS, kind, f"worker:{node}", "id", kit.clock(), body)


async def arriving_together(kit, messages):
    """The head's bus loop reading ``messages``, all waiting at once, until the bus closes."""
    async def burst():
        for m in messages:
            yield m

    kit.head.bus.messages = burst
    await asyncio.wait_for(kit.head.inbox.run(), 10)   # ends with the bus, as it does


async def test_reports_arriving_together_on_the_bus_are_applied_together(kit):
    a, b, c = await running(kit, 3)
    kit.commits = 0

    def msg(kind, node, body):
        return bus_message(kit, kind, node, body)

    # a heartbeat between two runs of reports
    await arriving_together(kit, [msg("finished", a.node, fin(a)), msg("finished", b.node, fin(b)),
                                  msg("heartbeat", a.node, {"running": [], "done": []}),
                                  msg("finished", c.node, fin(c))])
    assert kit.commits == 2    # a and b together, c after the heartbeat
    assert [(await ended(kit, j)).state.value for j in (a, b, c)] == ["COMPLETED"] * 3


async def test_a_kick_after_an_idle_spell_starts_a_pass_at_once(kit):
    kit.head.cfg = replace(kit.head.cfg, head=replace(kit.head.cfg.head, schedule_debounce=3600.0))
    job_id = await kit.submit(ALICE, "true", gpus=1)
    task = asyncio.create_task(kit.head._scheduler())
    try:
        kit.head.kick()
        for _ in range(1000):  # a pass within the debounce would need the hour
            if kit.head.passes:
                break
            await asyncio.sleep(0.01)
        assert kit.head.passes == 1 and kit.job(job_id).state.value == "RUNNING"
    finally:
        task.cancel()
