import asyncio
import logging

import pytest

from gpud.bus.base import HEAD_EVENTS, HEAD_STATUS, Will, node_cmd, node_status
from gpud.bus.envelope import Verifier, seal
from gpud.bus.memory import MemoryBroker, MemoryBus, topic_matches

KEY = bytes(range(32))
WRONG_KEY = bytes(32)


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def broker():
    return MemoryBroker()


def make(broker, sender, subs=(), clock=None, **kw):
    return MemoryBus(broker, "c1", sender, KEY, list(subs), clock=clock or Clock(), **kw)


async def next_message(bus, timeout=5.0):
    async with asyncio.timeout(timeout):
        return await anext(aiter(bus.messages()))


def drain(bus):
    """Messages already delivered (delivery is synchronous)."""
    return bus._inbox.drain()


@pytest.mark.parametrize("pattern, topic, expected", [
    ("a/b", "a/b", True), ("a/b", "a/c", False), ("a/+", "a/b", True), ("a/+", "a/b/c", False),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "x/y", True), ("+/+", "a", False),
    ("node/+/status", "node/n1/status", True), ("node/+/status", "node/n1/cmd", False),
    ("a/b/c", "a/b", False),
])
def test_topic_matches(pattern, topic, expected):
    assert topic_matches(pattern, topic) is expected


async def test_round_trip_and_wildcards(broker, clock):
    async with make(broker, "head", [HEAD_EVENTS, "node/+/status"], clock) as head, \
            make(broker, "n1", [node_cmd("n1")], clock) as n1:
        await n1.publish(HEAD_EVENTS, "heartbeat", {"running": []})
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        await head.publish(node_cmd("n1"), "hello", {})
        await head.publish(node_cmd("n2"), "hello", {})        # nobody subscribed
        got = drain(head)
        assert [(m.topic, m.kind, m.sender) for m in got] == [
            (HEAD_EVENTS, "heartbeat", "n1"), ("node/n1/status", "node_status", "n1")]
        assert got[0].body == {"running": []} and not got[0].retained
        assert [(m.topic, m.kind) for m in drain(n1)] == [("node/n1/cmd", "hello")]


async def test_messages_iterator_ends_on_close(broker):
    bus = make(broker, "x", ["t"])
    async with bus:
        await bus.publish("t", "k", {})
        reader = asyncio.create_task(collect(bus))
    async with asyncio.timeout(5):
        assert [m.kind for m in await reader] == ["k"]


async def collect(bus):
    return [m async for m in bus.messages()]


async def test_other_clusters_are_invisible(broker):
    async with make(broker, "a", ["#"]) as a, MemoryBus(broker, "c2", "b", KEY, ["#"]) as b:
        await b.publish("t", "k", {})
        assert drain(a) == [] and len(drain(b)) == 1


async def test_forged_garbage_stale_and_replayed_are_dropped(broker, clock, caplog):
    caplog.set_level(logging.DEBUG, "gpud.bus")
    async with make(broker, "head", [HEAD_EVENTS], clock) as head:
        topic = "gpud/c1/" + HEAD_EVENTS
        broker.inject(topic, seal(WRONG_KEY, "n1", "k", {}, now=clock(), topic=HEAD_EVENTS))
        broker.inject(topic, b"\x00garbage")
        broker.inject(topic, seal(KEY, "n1", "k", {}, now=clock() - 1000, topic=HEAD_EVENTS))
        broker.inject(topic, seal(KEY, "n1", "k", {}, now=clock(), topic=node_cmd("n1")))
        good = seal(KEY, "n1", "ok", {}, now=clock(), topic=HEAD_EVENTS)
        broker.inject(topic, good)
        broker.inject(topic, good)
        assert [m.kind for m in drain(head)] == ["ok"]
    text = caplog.text
    for reason in ("unknown key", "not a gpud envelope", "stale", "sealed for another topic", "replayed"):
        assert reason in text


async def test_retained_status_reaches_late_subscribers(broker, clock):
    async with make(broker, "n1", clock=clock) as n1:
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
    clock.t += 3600  # long after: retained messages are old by nature
    async with make(broker, "head", ["node/+/status"], clock) as head:
        [m] = drain(head)
        assert m.retained and m.body == {"state": "online"}


async def test_clear_retained(broker):
    async with make(broker, "n1") as n1:
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        await n1.clear_retained(node_status("n1"))
    assert broker.retained == {}


async def test_will_fires_on_drop_not_on_close(broker, clock):
    will = Will(node_status("n1"), "node_status", {"state": "offline"})
    async with make(broker, "head", ["node/+/status"], clock) as head:
        async with make(broker, "n1", clock=clock, will=will):
            pass
        assert drain(head) == []
        async with make(broker, "n1", clock=clock, will=will) as n1:
            clock.t += 500  # the will was sealed at connect time
            broker.disconnect("n1")
            assert not n1.connected
            [m] = drain(head)
            assert (m.kind, m.body, m.sender) == ("node_status", {"state": "offline"}, "n1")
            assert "gpud/c1/node/n1/status" in broker.retained


async def test_queue_while_disconnected_and_flush_on_reconnect(broker, clock):
    async with make(broker, "head", [HEAD_EVENTS], clock) as head, make(broker, "n1", clock=clock) as n1:
        broker.disconnect("n1")
        for i in range(3):
            await n1.publish(HEAD_EVENTS, "e", {"i": i})
        assert n1.pending == 3 and not await n1.flush()
        clock.t += 300  # longer than max_skew: queued messages are re-signed when sent
        broker.reconnect("n1")
        assert n1.connected and n1.pending == 0
        assert [m.body["i"] for m in drain(head)] == [0, 1, 2]


async def test_bounded_queue_drops_oldest(broker, caplog):
    async with make(broker, "head", [HEAD_EVENTS]) as head, make(broker, "n1", max_queued=3) as n1:
        broker.disconnect("n1")
        for i in range(5):
            await n1.publish(HEAD_EVENTS, "e", {"i": i})
        assert n1.pending == 3 and n1.dropped == 2
        broker.reconnect("n1")
        assert [m.body["i"] for m in drain(head)] == [2, 3, 4]
    assert "dropped the oldest" in caplog.text


async def test_on_connect_runs_after_every_connect(broker):
    calls = []
    bus = make(broker, "n1", [node_cmd("n1")])

    async def hook():
        calls.append(bus.connected)
        await bus.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)

    bus.on_connect = hook
    async with bus:
        await wait_until(lambda: len(calls) == 1)
        broker.stop()
        assert not bus.connected
        broker.start()
        await wait_until(lambda: len(calls) == 2)
    assert calls == [True, True]
    assert "gpud/c1/node/n1/status" in broker.retained


async def test_broken_hook_is_logged_not_raised(broker, caplog):
    bus = make(broker, "n1")

    async def hook():
        raise RuntimeError("boom")

    bus.on_connect = hook
    async with bus:
        await wait_until(lambda: "on_connect hook failed" in caplog.text)
        assert bus.connected


async def test_broker_outage_keeps_retained_and_persistent_sessions(broker, clock):
    head = make(broker, "head", [HEAD_EVENTS], clock, persistent=True)
    async with head, make(broker, "n1", clock=clock) as n1:
        broker.stop()
        await n1.publish(HEAD_EVENTS, "e", {"i": 1})
        broker.start()
        assert [m.body for m in drain(head)] == [{"i": 1}]


async def test_persistent_session_receives_while_away(broker, clock):
    async with make(broker, "head", [HEAD_EVENTS], clock, persistent=True):
        pass
    async with make(broker, "n1", clock=clock) as n1:
        for i in range(3):
            await n1.publish(HEAD_EVENTS, "e", {"i": i})
    async with make(broker, "head", [HEAD_EVENTS], clock, persistent=True) as head:
        assert [m.body["i"] for m in drain(head)] == [0, 1, 2]
    # A clean (non-persistent) session forgets.
    async with make(broker, "other", [HEAD_EVENTS], clock):
        pass
    async with make(broker, "n1", clock=clock) as n1:
        await n1.publish(HEAD_EVENTS, "e", {"i": 9})
    async with make(broker, "other", [HEAD_EVENTS], clock) as other:
        assert drain(other) == []


async def test_takeover_drops_the_older_connection(broker, clock):
    will = Will(node_status("n1"), "node_status", {"state": "offline"})
    async with make(broker, "head", ["node/+/status"], clock) as head:
        async with make(broker, "n1", clock=clock, will=will) as old, make(broker, "n1", clock=clock) as new:
            assert new.connected and not old.connected
            assert [m.body for m in drain(head)] == [{"state": "offline"}]


async def test_publish_after_close_is_dropped(broker, caplog):
    bus = make(broker, "n1")
    async with bus:
        pass
    await bus.publish("t", "k", {})
    assert "closed; dropped" in caplog.text


async def test_disconnect_unknown_client(broker):
    with pytest.raises(KeyError):
        broker.disconnect("ghost")


async def test_head_status_will_uses_stale_rules(broker, clock):
    """Wills on status topics arrive without the retained flag yet carry old timestamps."""
    will = Will(HEAD_STATUS, "head_status", {"state": "offline"})
    async with make(broker, "n1", [HEAD_STATUS], clock) as n1:
        async with make(broker, "head", clock=clock, will=will):
            clock.t += 1000
            broker.disconnect("head")
        [m] = drain(n1)
        assert m.kind == "head_status" and not m.retained
        retained = Verifier(KEY).open(broker.retained["gpud/c1/head/status"], now=clock(), topic=HEAD_STATUS,
                                      allow_stale=True)
        assert retained.body == {"state": "offline"} and retained.will


async def wait_until(cond, timeout=5.0):
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("step", [30.0, -30.0, 3600.0, -3600.0])
@pytest.mark.parametrize("stepped", ["head", "n1"])
async def test_one_hosts_clock_step_drops_no_message_and_admits_no_replay(broker, step, stepped):
    """Issue 18: +-30 s and +-1 h on either side, injected clocks, the buses as the daemons use them."""
    clocks = {"head": Clock(), "n1": Clock()}
    async with make(broker, "head", [HEAD_EVENTS, "node/+/status"], clocks["head"]) as head, \
            make(broker, "n1", [node_cmd("n1")], clocks["n1"],
                 will=Will(node_status("n1"), "node_status", {"state": "offline"})) as n1:
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        await n1.publish(HEAD_EVENTS, "heartbeat", {"i": 0})
        await head.publish(node_cmd("n1"), "launch", {"job": 1})
        assert [m.kind for m in drain(head)] == ["node_status", "heartbeat"]
        assert [m.kind for m in drain(n1)] == ["launch"]
        captured = [(t, p) for t, p, _ in broker.published]
        clocks[stepped].t += step
        for i in range(1, 4):
            for c in clocks.values():
                c.t += 5
            await n1.publish(HEAD_EVENTS, "heartbeat", {"i": i})
            await head.publish(node_cmd("n1"), "ack", {"done": []})
        assert [m.body["i"] for m in drain(head)] == [1, 2, 3]
        assert [m.kind for m in drain(n1)] == ["ack"] * 3
        for topic, payload in captured:            # everything recorded before the step
            broker.inject(topic, payload, retain=topic.endswith("/status"))
        assert drain(head) == [] and drain(n1) == []
        broker.disconnect("n1")                    # and the will still fires after the step
        assert [(m.kind, m.body["state"]) for m in drain(head)] == [("node_status", "offline")]
