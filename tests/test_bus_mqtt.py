"""MqttBus against a real Mosquitto (and the embedded amqtt broker)."""

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

import aiomqtt
import pytest

from gpud.bus.base import HEAD_EVENTS, HEAD_STATUS, Will, node_cmd, node_status
from gpud.bus.broker import EmbeddedBroker
from gpud.bus.envelope import seal
from gpud.bus.mqtt import MqttBus, parse_url
from tests.mqtt_broker import free_port, mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(60)

KEY = bytes(range(32))
WRONG_KEY = bytes(32)
CLUSTER = "t1"
REPO = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def bus(url, sender, subs=(), **kw):
    kw.setdefault("reconnect_delay", (0.02, 0.2))
    return MqttBus(url, CLUSTER, sender, KEY, subscriptions=list(subs), **kw)


async def receive(b, n=1, timeout=10.0):
    out = []
    async with asyncio.timeout(timeout):
        async for m in b.messages():
            out.append(m)
            if len(out) == n:
                return out
    return out


async def wait_until(cond, timeout=10.0, interval=0.01):
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(interval)


async def raw_publish(url, topic, payload, retain=False):
    host, port, _ = parse_url(url)
    async with aiomqtt.Client(host, port) as c:
        await c.publish(topic, payload, qos=1, retain=retain)


def test_parse_url():
    assert parse_url("mqtt://h:1") == ("h", 1, False)
    assert parse_url("mqtts://h") == ("h", 8883, True)
    assert parse_url("mqtt://127.0.0.1") == ("127.0.0.1", 1883, False)
    for bad in ("http://h:1", "mqtt://", "h:1", "mqtt://h:99999", "mqtt://h:1/x"):
        with pytest.raises(ValueError, match="invalid broker url"):
            parse_url(bad)


async def test_round_trip(mosquitto):
    async with bus(mosquitto.url, "head", [HEAD_EVENTS, "node/+/status"]) as head, bus(mosquitto.url, "n1") as n1:
        await head.wait_connected()
        await n1.publish(HEAD_EVENTS, "heartbeat", {"running": [[1, 0]]})
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        a, b = await receive(head, 2)
        assert (a.topic, a.kind, a.sender, a.body, a.retained) == (HEAD_EVENTS, "heartbeat", "n1", {"running": [[1, 0]]}, False)
        assert (b.topic, b.kind) == ("node/n1/status", "node_status")
        assert await n1.flush(5) and n1.pending == 0


async def test_forged_garbage_and_replayed_payloads_are_dropped(mosquitto, caplog):
    caplog.set_level(logging.DEBUG, "gpud.bus")
    topic = f"gpud/{CLUSTER}/{HEAD_EVENTS}"
    captured = []
    async with bus(mosquitto.url, "head", [HEAD_EVENTS]) as head, bus(mosquitto.url, "n1") as n1:
        await head.wait_connected()
        host, port, _ = parse_url(mosquitto.url)
        async with aiomqtt.Client(host, port) as spy:
            await spy.subscribe(topic, qos=1)
            await n1.publish(HEAD_EVENTS, "first", {})
            async with asyncio.timeout(10):
                async for m in spy.messages:
                    captured.append(m.payload)
                    break
        [first] = await receive(head)
        assert first.kind == "first"
        await raw_publish(mosquitto.url, topic, seal(WRONG_KEY, "n1", "forged", {}, now=time.time(), topic=HEAD_EVENTS))
        await raw_publish(mosquitto.url, topic, b"\xff not json at all")
        await raw_publish(mosquitto.url, topic, captured[0])   # a replay
        await n1.publish(HEAD_EVENTS, "after", {})
        [after] = await receive(head)
        assert after.kind == "after"   # nothing bad got through, and the bus still works
        assert head._inbox.drain() == []
    text = caplog.text
    assert "dropped message on head/events: sealed with an unknown key" in text
    assert "dropped message on head/events: not a gpud envelope" in text
    assert "dropped message on head/events: replayed" in text


async def test_retained_status_reaches_a_late_subscriber(mosquitto):
    old = Clock()
    old.offset = -3600  # retained messages may be old; they are still accepted
    async with bus(mosquitto.url, "n1", clock=old) as n1:
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        assert await n1.flush(5)
    async with bus(mosquitto.url, "head", ["node/+/status"]) as head:
        [m] = await receive(head)
        assert m.retained and m.body == {"state": "online"} and m.sender == "n1"


async def test_clear_retained(mosquitto):
    async with bus(mosquitto.url, "n1") as n1:
        await n1.publish(node_status("n1"), "node_status", {"state": "online"}, retain=True)
        await n1.clear_retained(node_status("n1"))
        assert await n1.flush(5)
    async with bus(mosquitto.url, "head", ["node/+/status", HEAD_EVENTS]) as head, bus(mosquitto.url, "n2") as n2:
        await head.wait_connected()
        await n2.publish(HEAD_EVENTS, "marker", {})
        [m] = await receive(head)
        assert m.kind == "marker"   # the cleared status was not delivered first


CHILD = """
import asyncio, sys
from gpud.bus.base import Will
from gpud.bus.mqtt import MqttBus

async def main():
    url, cluster, name = sys.argv[1:4]
    will = Will(f"node/{name}/status", "node_status", {"state": "offline"})
    async with MqttBus(url, cluster, name, bytes(range(32)), will=will, keepalive=60) as b:
        await b.wait_connected()
        await b.publish(f"node/{name}/status", "node_status", {"state": "online"}, retain=True)
        await b.flush()
        print("ready", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def start_child(url, name):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, url, CLUSTER, name,
                                                stdout=asyncio.subprocess.PIPE, env=env)
    async with asyncio.timeout(20):
        line = await proc.stdout.readline()
    assert line.strip() == b"ready", line
    return proc


async def check_will_on_kill(url):
    async with bus(url, "head", ["node/+/status"]) as head:
        await head.wait_connected()
        proc = await start_child(url, "n7")
        try:
            [online] = await receive(head, timeout=20)
            assert online.body == {"state": "online"}
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            [offline] = await receive(head, timeout=20)
            assert (offline.topic, offline.kind, offline.sender, offline.body) == (
                "node/n7/status", "node_status", "n7", {"state": "offline"})
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    # The will is retained: a head that starts later still learns the node is gone.
    async with bus(url, "head2", ["node/+/status"]) as late:
        [m] = await receive(late)
        assert m.retained and m.body == {"state": "offline"}


async def test_last_will_when_a_client_is_killed(mosquitto):
    await check_will_on_kill(mosquitto.url)


async def test_reconnect_after_broker_restart_delivers_queued_messages(mosquitto):
    clock = Clock()
    head_connects = []
    head = bus(mosquitto.url, "head", [HEAD_EVENTS], persistent=True, clock=clock)

    async def on_connect():
        head_connects.append(head.connected)

    head.on_connect = on_connect
    async with head, bus(mosquitto.url, "n1", clock=clock) as n1:
        await head.wait_connected()
        await n1.wait_connected()
        await wait_until(lambda: len(head_connects) == 1)
        mosquitto.stop()
        await wait_until(lambda: not n1.connected and not head.connected)
        for i in range(20):
            await n1.publish(HEAD_EVENTS, "queued", {"i": i})
        assert n1.pending == 20
        clock.offset = 300   # the outage outlasts max_skew: queued messages get re-signed
        mosquitto.start()
        got = await receive(head, 20, timeout=20)
        assert [m.body["i"] for m in got] == list(range(20))
        await wait_until(lambda: len(head_connects) == 2)
        assert head_connects == [True, True] and n1.connects == 2


async def check_persistent_session(url):
    async with bus(url, "head", [HEAD_EVENTS], persistent=True) as head:
        await head.wait_connected()
    async with bus(url, "n1") as n1:
        for i in range(50):
            await n1.publish(HEAD_EVENTS, "e", {"i": i})
        assert await n1.flush(10)
    async with bus(url, "head", [HEAD_EVENTS], persistent=True) as head:
        got = await receive(head, 50)
        assert sorted(m.body["i"] for m in got) == list(range(50))


async def test_persistent_session_receives_while_away(mosquitto):
    await check_persistent_session(mosquitto.url)


async def test_embedded_broker_keeps_persistent_sessions():
    async with EmbeddedBroker() as broker:
        await check_persistent_session(broker.url)


async def test_repeated_open_close_while_publishing(mosquitto):
    async with bus(mosquitto.url, "sink", [HEAD_EVENTS]) as sink:
        await sink.wait_connected()
        for cycle in range(10):
            b = bus(mosquitto.url, f"n{cycle}")
            async with asyncio.timeout(15):
                async with b:
                    await b.wait_connected()
                    for i in range(30):
                        await b.publish(HEAD_EVENTS, "e", {"cycle": cycle, "i": i})
            assert b._task.done() and b.pending == 0
        got = await receive(sink, 300, timeout=20)
        assert len(got) == 300


async def test_repeated_close_without_flush_cancels_publishes_in_flight(mosquitto, caplog):
    for cycle in range(10):
        b = bus(mosquitto.url, f"n{cycle}", close_timeout=0)
        async with asyncio.timeout(15):
            async with b:
                await b.wait_connected()
                for i in range(200):
                    await b.publish(HEAD_EVENTS, "e", {"i": i})
                await wait_until(lambda: b.pending < 190, interval=0)  # some acked, more in flight
        assert b._task.done()
    assert "would not stop" not in caplog.text


async def test_close_when_the_broker_is_unreachable():
    b = bus(f"mqtt://127.0.0.1:{free_port()}", "n1", max_queued=3)
    async with asyncio.timeout(15):
        async with b:
            for i in range(5):
                await b.publish(HEAD_EVENTS, "e", {"i": i})
            assert b.pending == 3 and not b.connected
    assert b._task.done()
    assert [m async for m in b.messages()] == []


async def test_publish_waits_instead_of_dropping_when_connected(mosquitto):
    async with bus(mosquitto.url, "sink", [HEAD_EVENTS]) as sink, bus(mosquitto.url, "n1", max_queued=5) as n1:
        await sink.wait_connected()
        await n1.wait_connected()
        for i in range(200):
            await n1.publish(HEAD_EVENTS, "e", {"i": i})
        got = await receive(sink, 200)
        assert sorted(m.body["i"] for m in got) == list(range(200))
        assert n1._outbox.dropped == 0


async def test_embedded_broker_round_trip_retained_and_will():
    async with EmbeddedBroker(port=0) as broker:
        assert broker.url.startswith("mqtt://127.0.0.1:")
        async with bus(broker.url, "head", [HEAD_EVENTS, node_cmd("n1")]) as head, bus(broker.url, "n1") as n1:
            await head.wait_connected()
            await n1.publish(HEAD_EVENTS, "heartbeat", {"running": []})
            await n1.publish(node_cmd("n1"), "hello", {})
            got = await receive(head, 2)
            assert [m.kind for m in got] == ["heartbeat", "hello"]
        await check_will_on_kill(broker.url)


async def test_embedded_broker_head_status_will():
    async with EmbeddedBroker() as broker:
        async with bus(broker.url, "n1", [HEAD_STATUS]) as n1:
            await n1.wait_connected()
            head = bus(broker.url, "head", will=Will(HEAD_STATUS, "head_status", {"state": "offline"}))
            async with head:
                await head.wait_connected()
                await head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
                [m] = await receive(n1)
                assert m.body == {"state": "online"}
            # A clean close does not fire the will.
            await head.publish(HEAD_STATUS, "x", {})  # after close: dropped, not raised
            assert n1._inbox.drain() == []


def test_constructor_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="invalid cluster name"):
        MqttBus("mqtt://h:1", "a/b", "n1", KEY)
    with pytest.raises(ValueError, match="cannot load broker CA file"):
        MqttBus("mqtts://h:1", "c", "n1", KEY, tls_ca=str(tmp_path / "missing.pem"))
    # A persistent session's id is stable, but only key holders can compute it.
    stable = MqttBus("mqtt://h:1", "c", "n1", KEY, persistent=True).client_id
    assert stable.startswith("gpud-c-n1-") and len(stable) == len("gpud-c-n1-") + 16
    assert MqttBus("mqtt://h:1", "c", "n1", KEY, persistent=True).client_id == stable
    assert MqttBus("mqtt://h:1", "c", "n1", WRONG_KEY, persistent=True).client_id != stable
    a, b = MqttBus("mqtt://h:1", "c", "n1", KEY), MqttBus("mqtt://h:1", "c", "n1", KEY)
    assert a.client_id != b.client_id
