"""Multi-node jobs and srun steps when things go wrong, on an in-process head (real SQLite,
in-memory bus, injected clock): restarts, lost nodes, stops, forged or stale messages, races."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from gpud.bus.base import HEAD_EVENTS, Message
from gpud.head import gang, steprecord, steps
from gpud.head.liveness import LAUNCH_RESEND_AFTER
from gpud.sched.config import PreemptionConfig, QosConfig
from tests.slurm_head import ALICE, BOB, HeadKit

NODES = [f"n{i}" for i in range(1, 5)]


async def open_kit(tmp_path, db=None) -> HeadKit:
    kit = HeadKit(tmp_path, db=db)
    await kit.__aenter__()
    for name in NODES:
        if name not in kit.store.nodes:   # a restarted head has them from its database
            kit.add_node(name, gpus=4)
    kit.label_nodes(switch="s1")
    for name in NODES:
        await kit.store.upsert_node(kit.store.nodes[name])
    kit.record_sent()
    return kit


@pytest.fixture
async def kit(tmp_path):
    k = await open_kit(tmp_path)
    yield k
    await k.__aexit__(None, None, None)


def fin(job, **over):
    return {"job": job.job_id, "attempt": job.attempt, "exit_code": 0, "signal": None, "reason": "exited", **over}


def busy_nodes(kit) -> dict[str, set[int]]:
    """GPU indices in use per node, by every active job's every rank."""
    used: dict[str, set[int]] = {}
    for j in kit.store.active.values():
        if j.state.active:
            for node, held in gang.per_node(j):
                assert not used.setdefault(node, set()) & set(held.gpu_indices), f"GPUs of {node} given twice"
                used[node] |= set(held.gpu_indices)
    return used


# -- 1. head restart ---------------------------------------------------------------------------------

async def test_a_restarted_head_reloads_the_parts_and_never_gives_their_gpus_away(tmp_path):
    kit = await open_kit(tmp_path)
    job = await kit.start_gang()
    db = kit.db
    await kit.__aexit__(None, None, None)

    kit = await open_kit(tmp_path, db=db)
    try:
        again = kit.job(job.job_id)
        assert again.state.value == "RUNNING" and again.parts == job.parts and again.attempt == job.attempt
        # The workers report in: both ranks are known, nothing is fenced or launched again.
        for node in gang.job_nodes(job):
            await kit.report(node, "heartbeat", {"running": [[job.job_id, job.attempt]], "done": []})
        assert not kit.sent_to("kill") and not kit.sent_to("launch")
        singles = [await kit.submit(ALICE, "sleep 60", gpus=4) for _ in range(3)]
        await kit.schedule()
        started = [j for j in singles if kit.job(j).state.value == "RUNNING"]
        assert len(started) == 2, "only the two nodes the gang does not hold are free"
        assert not {kit.job(j).node for j in started} & set(gang.job_nodes(job))
        busy_nodes(kit)
        # The job still ends properly: rank 0's report ends it and kills the part.
        kit.sent.clear()
        await kit.report(job.node, "finished", fin(job))
        assert (await kit.record(job.job_id)).state.value == "COMPLETED"
        assert [n for n, _ in kit.sent_to("kill")] == [job.parts[0]["node"]]
        await kit.schedule()
        assert all(kit.job(j).state.value == "RUNNING" for j in singles)
        busy_nodes(kit)
    finally:
        await kit.__aexit__(None, None, None)


async def test_step_ids_are_not_reused_after_a_head_restart(tmp_path):
    """Workers drop a step command they have seen (same job, attempt and step): a restarted
    head that numbered steps from 0 again would start nothing, and srun would wait forever."""
    kit = await open_kit(tmp_path)
    job = await kit.start_gang()
    first = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["true"])
    second = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["true"])
    assert (first["step"], second["step"]) == (0, 1)
    db = kit.db
    await kit.__aexit__(None, None, None)

    kit = await open_kit(tmp_path, db=db)
    try:
        assert "no step" in await kit.refused("step_poll", ALICE, job_id=job.job_id, step=5, offset=0)
        third = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["true"])
        assert third["step"] == 2
        # Output of a step from before the restart: the step is adopted for its srun (which
        # reconnects and resumes, gpud.head.steps); nobody reading it for READER_TIMEOUT
        # seconds gets its tasks killed.
        kit.sent.clear()
        await kit.report(job.node, "step_output", {"job": job.job_id, "attempt": job.attempt,
                                                   "step": 1, "first": 3, "lines": [[0, 1, "x\n"]]})
        assert (job.job_id, 1) in kit.head.steps.steps and kit.sent_to("step_kill") == []
        await kit.head.steps.sweep(kit.head.steps.monotonic() + steps.READER_TIMEOUT + 1)
        assert sorted(n for n, b in kit.sent_to("step_kill") if b["step"] == 1) == sorted(gang.job_nodes(job))
        got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=2, offset=0)
        assert got["lines"] == []
    finally:
        await kit.__aexit__(None, None, None)


# -- 2. worker restart on a part's node -----------------------------------------------------------------

async def test_a_restarted_worker_that_readopted_its_part_changes_nothing(kit):
    job = await kit.start_gang()
    part = job.parts[0]["node"]
    kit.sent.clear()
    info = dict(kit.store.nodes[part].info)
    await kit.report(part, "register", {"node": info})
    kit.clock.advance(LAUNCH_RESEND_AFTER + 1)
    await kit.report(part, "heartbeat", {"running": [[job.job_id, job.attempt]], "done": []})
    assert not kit.sent_to("kill") and not kit.sent_to("launch")
    assert kit.job(job.job_id).state.value == "RUNNING"


async def test_a_part_a_restarted_worker_lost_ends_the_job_and_kills_the_rest(kit):
    job = await kit.start_gang(nodes=3, gpus=12)
    part = job.parts[1]["node"]
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["sleep", "60"])
    poll = asyncio.create_task(kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0))
    kit.sent.clear()
    await kit.report(part, "heartbeat", {"running": [], "done": [[job.job_id, job.attempt]]})
    await kit.report(part, "finished", fin(job, exit_code=None, reason="lost",
                                           message="the worker's record of this job is unreadable"))
    done = await kit.record(job.job_id)
    assert done.state.value == "FAILED"
    assert sorted(n for n, _ in kit.sent_to("kill")) == sorted(n for n in gang.job_nodes(job) if n != part)
    assert kit.sent_to("ack") == [(part, {"done": [[job.job_id, job.attempt]]})]
    got = await asyncio.wait_for(poll, 5)
    assert got["done"] and got["exit_code"] == 1 and "ended" in got["message"]
    # The other parts' reports after the kill are only acknowledged.
    for node in gang.job_nodes(job):
        if node != part:
            await kit.report(node, "finished", fin(job, exit_code=0, signal=9, reason="killed"))
    assert (await kit.record(job.job_id)).state.value == "FAILED"


# -- 3. a part's node is lost ---------------------------------------------------------------------------

async def test_a_lost_parts_node_requeues_and_the_next_attempt_ignores_the_old_one(kit):
    job = await kit.start_gang()
    rank0, lost = job.node, job.parts[0]["node"]
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["sleep", "60"])
    kit.sent.clear()
    kit.clock.advance(kit.cfg.head.node_timeout + 1)
    for name in NODES:       # every node but the lost one keeps its heartbeats (and leases)
        if name != lost:
            kit.head.liveness.heard[name] = kit.head.liveness.granted[name] = kit.clock()
    await kit.head.liveness.check_nodes()
    assert kit.store.nodes[lost].state == "DOWN"
    assert kit.job(job.job_id).state.value == "RUNNING"   # until the lost node's lease has ended
    kit.clock.advance(kit.cfg.head.lease + 10)
    for name in NODES:
        if name != lost:
            kit.head.liveness.heard[name] = kit.head.liveness.granted[name] = kit.clock()
    await kit.head.liveness.check_nodes()
    requeued = kit.job(job.job_id)
    assert requeued.state.value == "PENDING" and requeued.parts == () and requeued.requeue_count == 1
    assert [n for n, _ in kit.sent_to("kill")] == [rank0]
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["done"] and got["exit_code"] == 1 and "requeued" in got["message"]
    assert not kit.head.commands.stop_sent

    await kit.schedule()
    second = kit.job(job.job_id)
    assert second.state.value == "RUNNING" and second.attempt == job.attempt + 1
    assert lost not in gang.job_nodes(second) and len(gang.job_nodes(second)) == 2
    kit.sent.clear()
    # Stale reports of the first attempt, from any node, change nothing.
    for node in (rank0, lost):
        await kit.report(node, "started", {"job": job.job_id, "attempt": job.attempt, "pid": 1})
        await kit.report(node, "finished", fin(job, exit_code=1, signal=9, reason="killed"))
    await kit.report(rank0, "step_exit", {"job": job.job_id, "attempt": job.attempt,
                                          "step": step["step"], "rank": 0, "exit_code": 9})
    now = kit.job(job.job_id)
    assert now.state.value == "RUNNING" and now.attempt == second.attempt and now.parts == second.parts
    assert sorted(n for n, _ in kit.sent_to("ack")) == sorted([rank0, lost])
    # The lost node comes back still running the old attempt: it is fenced.
    kit.sent.clear()
    await kit.report(lost, "heartbeat", {"running": [[job.job_id, job.attempt]], "done": []})
    assert kit.sent_to("kill") == [(lost, {"allocs": [[job.job_id, job.attempt]], "reason": "fenced"})]
    events = [e["event"] for e in await kit.store.job_events(job.job_id)]
    assert events.count("allocated") == 2 and "node_fail" in events


async def test_a_lost_parts_node_ends_a_no_requeue_job_node_fail(kit):
    job = await kit.start_gang(nodes=3, gpus=12, requeue=False)
    lost = job.parts[1]["node"]
    kit.sent.clear()
    await kit.head.liveness.node_down(kit.store.nodes[lost], "no heartbeat for 99s")
    await kit.head.liveness.node_failed(kit.store.nodes[lost])
    done = await kit.record(job.job_id)
    assert done.state.value == "NODE_FAIL"
    assert sorted(n for n, _ in kit.sent_to("kill")) == sorted(n for n in gang.job_nodes(job) if n != lost)


# -- 4. stops ------------------------------------------------------------------------------------------

async def test_time_limit_ends_the_job_and_every_part(kit):
    job = await kit.start_gang(nodes=3, gpus=12, time_limit=600)
    launches = dict(kit.sent_to("launch"))
    assert launches[job.node]["time_limit"] == 600
    assert all(launches[p["node"]]["time_limit"] > 600 for p in job.parts), "holders outlive rank 0's limit"
    kit.sent.clear()
    await kit.report(job.node, "finished", fin(job, exit_code=0, signal=15, reason="timeout"))
    assert (await kit.record(job.job_id)).state.value == "TIMEOUT"
    assert sorted(n for n, _ in kit.sent_to("kill")) == sorted(p["node"] for p in job.parts)


async def test_a_holder_that_reaches_its_limit_first_ends_the_job_timeout(kit):
    job = await kit.start_gang(time_limit=600)
    kit.sent.clear()
    await kit.report(job.parts[0]["node"], "finished", fin(job, exit_code=0, signal=9, reason="timeout"))
    assert (await kit.record(job.job_id)).state.value == "TIMEOUT"
    assert [n for n, _ in kit.sent_to("kill")] == [job.node]


async def test_a_lowered_time_limit_stops_every_part(kit):
    job = await kit.start_gang(time_limit=3600)
    assert (await kit.call("update_job", ALICE, job_ids=[job.job_id], changes={"TimeLimit": "10:00"}))["done"]
    kit.clock.advance(601 + 60)
    kit.sent.clear()
    await kit.schedule()
    assert kit.job(job.job_id).state.value == "COMPLETING"
    assert sorted(n for n, _ in kit.sent_to("signal")) == sorted(gang.job_nodes(job))
    await kit.report(job.node, "finished", fin(job, exit_code=0, signal=15, reason="timeout"))
    assert (await kit.record(job.job_id)).state.value == "TIMEOUT"


def preemptive(kit):
    sched = kit.head.cfg.sched
    qos = dict(sched.qos, high=QosConfig(name="high", priority=1000, preempt=("normal",)))
    kit.head.cfg = replace(kit.head.cfg, sched=replace(
        sched, qos=qos, preemption=PreemptionConfig(exempt_time=0, max_per_job=3, max_per_minute=30)))


async def test_a_gang_is_never_preempted_and_never_preempts(kit):
    preemptive(kit)
    # The rule is live: a one-node job of the high QOS preempts a one-node normal one.
    single = await kit.submit(ALICE, "sleep 600", gpus=4, nodelist=["n4"])
    gang_job = await kit.start_gang(nodes=3, gpus=12)
    assert kit.job(single).state.value == "RUNNING"
    kit.clock.advance(100)
    high = await kit.submit(BOB, "sleep 60", gpus=4, qos="high")
    await kit.schedule()
    assert kit.job(single).state.value == "COMPLETING", "the control: one-node jobs are preempted"
    assert kit.job(gang_job.job_id).state.value == "RUNNING", "a gang job is never a victim"
    await kit.report("n4", "finished", {"job": single, "attempt": 1, "exit_code": 0, "signal": 15,
                                        "reason": "cancelled"})
    await kit.schedule()
    assert kit.job(high).state.value == "RUNNING"
    # A high gang job waits for the normal jobs instead of preempting them.
    big = await kit.submit(BOB, "sleep 60", nodes=2, gpus=8, qos="high")
    await kit.schedule()
    assert kit.job(big).state.value == "PENDING"
    assert kit.job(gang_job.job_id).state.value == "RUNNING"


# -- 5. bad input ------------------------------------------------------------------------------------------

async def test_forged_and_malformed_worker_messages_are_dropped_and_logged(kit, caplog):
    job = await kit.start_gang(nodes=3, gpus=12)
    other = await kit.submit(ALICE, "sleep 60", gpus=4)
    await kit.schedule()
    outsider = kit.job(other).node
    n0, n1, n2 = gang.job_nodes(job)
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["sleep", "60"])
    base = {"job": job.job_id, "attempt": job.attempt, "step": step["step"]}
    caplog.set_level(logging.INFO)
    bad = [
        (n1, "step_output", {**base, "seq": 1, "lines": [[0, 1, "rank 0 is not n1's\n"]]}),
        (outsider, "step_output", {**base, "seq": 1, "lines": [[0, 1, "not in the job\n"]]}),
        (n0, "step_output", {**base, "step": [1], "seq": 1, "lines": []}),          # unhashable
        (n0, "step_output", {**base, "job": {"a": 1}, "seq": 1, "lines": []}),
        (n0, "step_output", {**base, "seq": "1", "lines": []}),
        (n0, "step_output", {**base, "seq": 1, "lines": "text"}),
        (n0, "step_output", {**base, "seq": 1, "lines": [[0, 4, "fd 4\n"], [0, 1, 5], "x", [True, 1, "b\n"]]}),
        (n0, "step_output", {**base, "attempt": job.attempt + 7, "seq": 1, "lines": [[0, 1, "wrong attempt\n"]]}),
        (n0, "step_output", {**base, "step": 99, "seq": 1, "lines": [[0, 1, "unknown step\n"]]}),
        (n2, "step_exit", {**base, "rank": 0, "exit_code": 1}),                      # rank 0 is n0's
        (n0, "step_exit", {**base, "rank": 0, "exit_code": 2 ** 80}),
        (n0, "step_exit", {**base, "rank": 0, "exit_code": "1"}),
        (n0, "step_exit", {**base, "rank": 0, "exit_code": None, "signal": -3}),
        (outsider, "step_exit", {**base, "rank": None, "exit_code": 1}),
    ]
    for node, kind, body in bad:
        await kit.head.inbox.handle(Message(HEAD_EVENTS, kind, f"worker:{node}", "x", kit.clock(), body))
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["lines"] == [] and not got["done"], got
    assert "handler failed" not in caplog.text
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) >= 10 and all("\n" not in r.getMessage() for r in dropped)
    # started/finished: forged for a part, from the wrong node, of the wrong shape.
    forged = [
        (outsider, "finished", fin(job, exit_code=1)),
        (n1, "finished", {**fin(job), "job": True}),
        (n1, "finished", {**fin(job), "attempt": str(job.attempt)}),
        (n0, "finished", {**fin(job, attempt=job.attempt - 1), "exit_code": 1}),
        (outsider, "started", {"job": job.job_id, "attempt": job.attempt, "pid": 1}),
        (n1, "started", {"job": [job.job_id], "attempt": job.attempt}),
    ]
    for node, kind, body in forged:
        await kit.head.inbox.handle(Message(HEAD_EVENTS, kind, f"worker:{node}", "x", kit.clock(), body))
    assert kit.job(job.job_id).state.value == "RUNNING"
    assert "handler failed" not in caplog.text


async def test_a_finished_report_with_absurd_fields_still_ends_the_job(kit):
    """Values SQLite cannot hold must not make the report fail forever (it is repeated
    until acknowledged, and the job would stay RUNNING)."""
    job = await kit.start_gang()
    await kit.report(job.parts[0]["node"], "finished", fin(job, exit_code=2 ** 70, signal=2 ** 70,
                                                            reason="x" * 100_000, message="m" * 100_000))
    done = await kit.record(job.job_id)
    assert done.state.value == "FAILED" and done.exit_code is None and done.signal is None
    events = await kit.store.job_events(job.job_id)
    assert len(events[-1]["detail"]) < 2000
    assert kit.sent_to("ack")[-1] == (job.parts[0]["node"], {"done": [[job.job_id, job.attempt]]})


async def test_step_launch_refuses_what_a_worker_would_drop(kit):
    job = await kit.start_gang()
    one_line = [
        ("argv", dict(argv=[""])),
        ("argv", dict(argv=["x" * (200 << 10)])),
        ("argv", dict(argv=["a"] * (100 << 10))),
        ("argv", dict(argv="true")),
        ("argv", dict(argv=["true", 5])),
        ("--ntasks-per-node", dict(argv=["true"], ntasks_per_node=10 ** 9)),
        ("--ntasks-per-node", dict(argv=["true"], ntasks_per_node=0)),
        ("--ntasks-per-node", dict(argv=["true"], ntasks_per_node=True)),
        ("--ntasks-per-node", dict(argv=["true"], ntasks_per_node=2.0)),
        ("env", dict(argv=["true"], env={"": "x"})),
        ("env", dict(argv=["true"], env={"A=B": "x"})),
        ("env", dict(argv=["true"], env={"A": 1})),
        ("env", dict(argv=["true"], env=["A"])),
        ("256 KiB", dict(argv=["true"], env={f"V{i}": "v" * 1000 for i in range(300)})),
        ("job_id", dict(job_id=True, argv=["true"])),
        ("job_id", dict(job_id="1", argv=["true"])),
    ]
    kit.sent.clear()
    for word, args in one_line:
        args = {"job_id": job.job_id, **args}
        why = await kit.refused("step_launch", ALICE, **args)
        assert word in why and "\n" not in why and why.startswith("srun: "), (args.keys(), why)
    assert not kit.sent_to("step")


async def test_srun_on_a_pending_completing_or_finished_job_is_refused(kit):
    job = await kit.start_gang()
    waiting = await kit.submit(ALICE, "true", nodes=4, gpus=16)
    await kit.schedule()
    assert "is PENDING, not RUNNING" in await kit.refused("step_launch", ALICE, job_id=waiting, argv=["true"])
    await kit.call("cancel", ALICE, job_ids=[job.job_id])
    assert "is COMPLETING, not RUNNING" in await kit.refused("step_launch", ALICE, job_id=job.job_id, argv=["x"])
    await kit.report(job.node, "finished", fin(job, signal=15, reason="cancelled"))
    assert "is not running" in await kit.refused("step_launch", ALICE, job_id=job.job_id, argv=["true"])


# -- 6. races ----------------------------------------------------------------------------------------------

async def test_the_job_ending_wakes_a_waiting_poll_at_once(kit, monkeypatch):
    monkeypatch.setattr(steps, "POLL_WAIT", 3600.0)   # only the job's end can answer it
    job = await kit.start_gang()
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["sleep", "600"])
    poll = asyncio.create_task(kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0))
    await asyncio.sleep(0)     # let it start waiting
    assert not poll.done()
    await kit.report(job.node, "finished", fin(job))
    got = await asyncio.wait_for(poll, 5)
    assert got["done"] and got["exit_code"] == 1 and got["message"] == f"job {job.job_id} ended; its tasks were killed"


async def test_a_cancel_ends_the_step_with_status_1_and_says_why(kit):
    """Tasks killed by the job's own stop are not the step's failure: srun exits 1 with the reason."""
    job = await kit.start_gang()
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["sleep", "600"])
    await kit.call("cancel", ALICE, job_ids=[job.job_id])
    base = {"job": job.job_id, "attempt": job.attempt, "step": step["step"]}
    for rank, node in enumerate(gang.job_nodes(job)):
        await kit.report(node, "step_exit", {**base, "rank": rank, "exit_code": None, "signal": 15})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["done"] and got["exit_code"] == 1 and "cancelled" in got["message"]


async def test_two_sruns_in_one_job_both_run(kit):
    job = await kit.start_gang()
    kit.sent.clear()
    a = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["echo", "a"])
    b = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["echo", "b"])
    assert a["step"] != b["step"]
    assert sorted((n, body["step"]) for n, body in kit.sent_to("step")) == sorted(
        (n, s["step"]) for n in gang.job_nodes(job) for s in (a, b))
    for s, word in ((a, "a"), (b, "b")):
        base = {"job": job.job_id, "attempt": job.attempt, "step": s["step"]}
        for rank, node in enumerate(gang.job_nodes(job)):
            await kit.report(node, "step_output", {**base, "seq": 1, "lines": [[rank, 1, word + "\n"]]})
    # b fails: only b's tasks are killed, a goes on.
    kit.sent.clear()
    await kit.report(job.node, "step_exit", {"job": job.job_id, "attempt": job.attempt,
                                             "step": b["step"], "rank": 0, "exit_code": 4})
    assert {body["step"] for _, body in kit.sent_to("step_kill")} == {b["step"]}
    got_a = await kit.call("step_poll", ALICE, job_id=job.job_id, step=a["step"], offset=0)
    assert [t for _, _, t in got_a["lines"]] == ["a\n", "a\n"] and not got_a["done"]


async def test_oversized_output_is_bounded_and_cancel_checks_its_arguments(kit):
    job = await kit.start_gang()
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["yes"])
    base = {"job": job.job_id, "attempt": job.attempt, "step": step["step"]}
    big = "y" * (900 << 10) + "\n"     # about what one signed message can carry
    for seq in range(1, 7):
        await kit.report(job.node, "step_output", {**base, "seq": seq, "lines": [[0, 1, big]]})
    kept = kit.head.steps.steps[(job.job_id, step["step"])]
    assert kept.size <= steprecord.MAX_STEP_OUTPUT
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["dropped"] == 6 - len(kept.lines) > 0
    assert len(got["lines"]) == 1, "a poll answer carries at most about 1 MiB"
    for bad in (dict(job_id=[1], step=0), dict(job_id=job.job_id, step=None), dict(job_id=True, step=0)):
        assert "must be a non-negative integer" in await kit.refused("step_cancel", ALICE, **bad)
    assert (await kit.call("step_cancel", ALICE, job_id=job.job_id, step=step["step"]))["cancelled"]
