"""The head's side of leases and liveness, in process (real SQLite, in-memory bus, injected clocks):
leases and node states, monotonic liveness under wall-clock steps, idempotent submission,
and storage faults (a database that cannot grow: SQLite's own "database or disk is full").
"""

from __future__ import annotations

import sqlite3

import pytest

from gpud.head.liveness import lease_margin
from gpud.head.store import Store, Txn, storage_problem
from gpud.model import IllegalTransition, NodeState
from tests.slurm_head import ALICE, BOB, Clock, HeadKit, spec



@pytest.fixture
async def kit(tmp_path):
    async with HeadKit(tmp_path) as k:
        k.mono = Clock(1000.0)          # the head's monotonic clock, apart from its wall clock
        k.head.mono = k.mono
        k.head.submit_keys._mono = k.mono
        for name in ("n1", "n2"):
            k.add_node(name, gpus=4)
            k.head.liveness.heard[name] = k.head.liveness.granted[name] = k.mono()
        k.record_sent()
        yield k


def heartbeat(kit, node: str, seq: int, running=()) -> dict:
    return {"seq": seq, "running": [list(p) for p in running], "done": []}


async def beat_all(kit, seq: int) -> None:
    for name in ("n1", "n2"):
        running = [(j.job_id, j.attempt) for j in kit.store.jobs_on_node(name)]
        await kit.report(name, "heartbeat", heartbeat(kit, name, seq, running))


# -- node states -------------------------------------------------------------------------------

async def test_node_moves_go_through_the_table_and_leave_events(kit):
    rec = kit.store.nodes["n1"]
    txn = Txn(kit.store)
    txn.node_transition(rec, NodeState.DRAIN, reason="bad fan [root]", now=kit.clock(), event="drained")
    await kit.store.commit(txn)
    assert kit.store.nodes["n1"].state == "DRAIN"
    with pytest.raises(IllegalTransition):
        Txn(kit.store).node_transition(NodeRecord_new("n9"), NodeState.DOWN, reason=None, now=kit.clock(),
                                       event="x")
    events = await kit.store.node_events("n1")
    assert [(e["old_state"], e["state"], e["event"], e["reason"]) for e in events] == [
        ("UP", "DRAIN", "drained", "bad fan [root]")]


def NodeRecord_new(name):
    from gpud.head.store import NodeRecord

    return NodeRecord(name, {}, "UP", None, 0.0, 0.0)


# -- leases --------------------------------------------------------------------------------------

async def test_a_heartbeat_is_answered_with_a_lease_naming_the_nodes_allocations(kit):
    job_id = await kit.submit(ALICE, "sleep 60", gpus=1)
    await kit.schedule()
    node = kit.job(job_id).node
    kit.sent.clear()
    await kit.report(node, "heartbeat", heartbeat(kit, node, 77, [(job_id, 1)]))
    (where, body), = kit.sent_to("lease")
    assert where == node and body == {"seq": 77, "period": kit.cfg.head.lease, "allocs": [[job_id, 1]],
                                      "limits": [[job_id, 1, kit.job(job_id).time_limit]]}
    # and a launch names the heartbeat it was granted on
    assert kit.head.liveness.lease_seq[node] == 77


async def test_a_silent_node_goes_down_at_the_timeout_but_its_job_waits_for_the_lease(kit):
    job_id = await kit.submit(ALICE, "sleep 60", gpus=1)
    await kit.schedule()
    node = kit.job(job_id).node
    other = "n2" if node == "n1" else "n1"
    await beat_all(kit, 1)
    lease, timeout = kit.cfg.head.lease, kit.cfg.head.node_timeout
    kit.mono.advance(timeout + 1)
    kit.head.liveness.heard[other] = kit.mono()
    await kit.head.liveness.check_nodes()
    assert kit.store.nodes[node].state == "DOWN"
    assert kit.job(job_id).state.value == "RUNNING" and kit.job(job_id).attempt == 1   # not yet
    kit.mono.advance(lease + lease_margin(lease) - timeout - 2)        # just before the lease surely ended
    kit.head.liveness.heard[other] = kit.mono()
    await kit.head.liveness.check_nodes()
    assert kit.job(job_id).state.value == "RUNNING"
    kit.mono.advance(2)
    kit.head.liveness.heard[other] = kit.mono()
    await kit.head.liveness.check_nodes()
    assert kit.job(job_id).state.value == "PENDING" and kit.job(job_id).requeue_count == 1
    events = await kit.store.job_events(job_id)
    assert any(e["event"] == "node_fail" and "lease ended" in e["detail"] for e in events)
    node_events = await kit.store.node_events(node)
    assert node_events[-1]["state"] == "DOWN" and "no heartbeat" in node_events[-1]["reason"]


async def test_a_node_back_within_the_lease_loses_nothing(kit):
    job_id = await kit.submit(ALICE, "sleep 60", gpus=1)
    await kit.schedule()
    node = kit.job(job_id).node
    kit.mono.advance(kit.cfg.head.node_timeout + 1)
    await kit.head.liveness.check_nodes()
    assert kit.store.nodes[node].state == "DOWN"
    await kit.report(node, "heartbeat", heartbeat(kit, node, 5, [(job_id, 1)]))
    assert kit.store.nodes[node].state == "UP"
    assert kit.job(job_id).state.value == "RUNNING" and kit.job(job_id).requeue_count == 0
    assert not kit.sent_to("kill")


async def test_a_worker_confirming_the_attempt_dead_requeues_it_at_once(kit):
    job_id = await kit.submit(ALICE, "sleep 60", gpus=1)
    await kit.schedule()
    node = kit.job(job_id).node
    await kit.report(node, "finished", {"job": job_id, "attempt": 1, "exit_code": 0, "signal": 9,
                                        "reason": "lease_expired"})
    assert kit.job(job_id).state.value == "PENDING" and kit.job(job_id).requeue_count == 1


async def test_a_restarted_head_waits_a_whole_lease_before_replacing(kit, tmp_path):
    job_id = await kit.submit(ALICE, "sleep 60", gpus=1)
    await kit.schedule()
    node = kit.job(job_id).node
    # what run() does at start: every node may hold a lease granted just before a crash
    kit.head.liveness.heard[node] = kit.head.liveness.granted[node] = kit.mono()
    kit.mono.advance(kit.cfg.head.node_timeout + 1)
    await kit.head.liveness.check_nodes()
    assert kit.store.nodes[node].state == "DOWN" and kit.job(job_id).state.value == "RUNNING"


# -- the clocks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [30.0, -30.0, 3600.0, -3600.0])
async def test_a_wall_clock_step_takes_no_node_down_and_stops_no_job(kit, step):
    job_id = await kit.submit(ALICE, "sleep 6000", gpus=1, time_limit=3000)
    await kit.schedule()
    await beat_all(kit, 1)
    kit.clock.advance(step)               # the wall clock steps; the monotonic one does not
    kit.mono.advance(1.0)
    await kit.head.liveness.check_nodes()
    await kit.schedule()                  # the time-limit check runs before each pass
    await beat_all(kit, 2)
    assert {n.state for n in kit.store.nodes.values()} == {"UP"}
    job = kit.job(job_id)
    assert job.state.value == "RUNNING" and job.stop_reason is None and job.attempt == 1
    assert not kit.sent_to("signal") and not kit.sent_to("kill")


# -- idempotent submission ------------------------------------------------------------------------

async def test_a_repeated_key_returns_the_same_job(kit):
    first = await kit.call("submit", ALICE, spec=spec("true"), key="k" * 32)
    again = await kit.call("submit", ALICE, spec=spec("true"), key="k" * 32)
    assert again["job_id"] == first["job_id"] and again.get("repeat")
    other = await kit.call("submit", BOB, spec=spec("true"), key="k" * 32)   # keys are per user
    assert other["job_id"] != first["job_id"]
    array = await kit.call("submit", ALICE, spec=spec("true", array="0-3"), key="a" * 32)
    assert (await kit.call("submit", ALICE, spec=spec("true", array="0-3"), key="a" * 32))["job_id"] == array["job_id"]
    assert len(kit.store.active) == 1 + 1 + 4


async def test_keys_survive_a_head_restart(kit, tmp_path):
    first = await kit.call("submit", ALICE, spec=spec("true"), key="r" * 32)
    store = await Store(kit.db).open()
    try:
        from gpud.head.submitkeys import SubmitKeys

        keys = SubmitKeys(kit.mono)
        await keys.load(store, kit.clock())
        async def never():
            raise AssertionError("submitted twice")
        assert (await keys.once(ALICE.uid, "r" * 32, never))["job_id"] == first["job_id"]
    finally:
        await store.close()


async def test_a_malformed_key_is_refused(kit):
    assert "submission key" in await kit.refused("submit", ALICE, spec=spec("true"), key="short")


# -- storage faults ------------------------------------------------------------------------------

async def _fill(store: Store) -> None:
    """Let the database grow no further: SQLite then answers "database or disk is full"."""
    (pages,) = (await store.db.execute_fetchall("PRAGMA page_count"))[0]
    await store.db.execute(f"PRAGMA max_page_count={pages + 4}")
    for size in (500, 50, 1):   # then use up what is left, as a full filesystem would
        try:
            while True:
                await store.db.execute("INSERT INTO node_events(node, time, state, event, reason) "
                                       "VALUES ('f', 0, 'UP', 'f', ?)", ("f" * size,))
        except sqlite3.OperationalError as e:
            assert "full" in str(e)


async def test_a_full_disk_reaches_the_user_and_the_head_recovers(kit):
    big = "x" * 200_000
    await _fill(kit.store)
    message = await kit.refused("submit", ALICE, spec=spec(f"echo {big}"))
    assert "the head's disk is full" in message and "no transaction is active" not in message
    # a node goes DOWN while full: logged and retried, never fatal
    kit.mono.advance(kit.cfg.head.node_timeout + 1)
    for _ in range(2):
        await kit.head.liveness.tick()       # the commit fails; logged, nothing raised
    assert {n.state for n in kit.store.nodes.values()} == {"UP"}   # memory never ran ahead
    await kit.store.db.execute("PRAGMA max_page_count=1073741823")
    await kit.head.liveness.tick()
    assert {n.state for n in kit.store.nodes.values()} == {"DOWN"}
    job = await kit.call("submit", ALICE, spec=spec(f"echo {big}"))
    assert (await kit.record(job["job_id"])) is not None


async def test_a_failed_rollback_does_not_hide_the_error(kit):
    await _fill(kit.store)
    txn = Txn(kit.store)
    txn.execute("INSERT INTO preemptions(time) SELECT 1.0 FROM (WITH RECURSIVE c(x) AS "
                "(SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) SELECT x FROM c)")
    with pytest.raises(sqlite3.Error) as err:
        await kit.store.commit(txn)
    assert "full" in str(err.value)
    assert storage_problem(err.value, kit.db).startswith("the head's disk is full:")


async def test_below_the_free_space_floor_submissions_wait_for_room(kit, monkeypatch):
    from dataclasses import replace

    kit.head.cfg = replace(kit.head.cfg, head=replace(kit.head.cfg.head, min_free_disk=10 ** 9))
    message = await kit.refused("submit", ALICE, spec=spec("true"))
    assert "the head's disk has only" in message and "min_free_disk" in message
    kit.head.cfg = replace(kit.head.cfg, head=replace(kit.head.cfg.head, min_free_disk=1))
    kit.mono.advance(1.0)
    assert (await kit.call("submit", ALICE, spec=spec("true")))["job_id"] > 0


def test_a_lease_shorter_than_three_heartbeats_is_refused():
    from gpud.config import ConfigError, from_text

    with pytest.raises(ConfigError) as err:
        from_text('[head]\nlease = "10s"\n[worker]\nheartbeat_interval = "5s"\n')
    assert "head.lease: 10s is less than three heartbeats" in str(err.value.lines)
    assert from_text('[head]\nlease = "15s"\n[worker]\nheartbeat_interval = "5s"\n').head.lease == 15.0
