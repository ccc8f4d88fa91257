"""SplitBus: the standalone head's own worker in the process, everyone else over the broker."""

import asyncio

import pytest

from gpud.bus.base import HEAD_EVENTS, HEAD_REQUESTS, HEAD_STATUS, Will, node_cmd, node_status, relay_replies
from gpud.bus.broker import EmbeddedBroker
from gpud.bus.envelope import seal
from gpud.bus.epoch import process_epoch
from gpud.bus.inbox import Inbox
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.bus.mqtt import MqttBus
from gpud.bus.split import SplitBus
from gpud.config import BrokerConfig, Config, WorkerConfig
from gpud.standalone import local_buses

pytestmark = pytest.mark.timeout(60)

KEY = bytes(range(32))
CLUSTER = "c1"


async def next_message(bus, timeout=10.0):
    async with asyncio.timeout(timeout):
        return await anext(aiter(bus.messages()))


def split_over_memory():
    """A head's SplitBus whose remote side is a second in-memory broker (same routing)."""
    near, far = MemoryBroker(), MemoryBroker()
    inbox = Inbox(KEY, f"gpud/{CLUSTER}/", max_skew=120.0)
    local = MemoryBus(near, CLUSTER, "head", KEY, [HEAD_EVENTS, "node/+/status"], inbox=inbox)
    remote = MemoryBus(far, CLUSTER, "head", KEY, [HEAD_EVENTS, "node/+/status", HEAD_REQUESTS], inbox=inbox)
    return near, far, SplitBus(local, remote, inbox, local_topics=[node_cmd("box")])


async def test_topics_go_where_their_readers_are():
    near, far, head = split_over_memory()
    async with head, MemoryBus(near, CLUSTER, "worker:box", KEY, [node_cmd("box"), HEAD_STATUS]) as box, \
            MemoryBus(far, CLUSTER, "worker:other", KEY, [node_cmd("other"), HEAD_STATUS]) as other, \
            MemoryBus(far, CLUSTER, "relay:r", KEY, [relay_replies("r"), HEAD_STATUS]) as relay:
        await head.publish(node_cmd("box"), "launch", {"job": 1})
        await head.publish(node_cmd("other"), "launch", {"job": 2})
        await head.publish(relay_replies("r"), "reply", {"id": "x"})
        await head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
        assert [(m.kind, m.body) for m in box._inbox.drain()] == [
            ("launch", {"job": 1}), ("head_status", {"state": "online"})]
        assert [(m.kind, m.body) for m in other._inbox.drain()] == [
            ("launch", {"job": 2}), ("head_status", {"state": "online"})]
        assert [m.kind for m in relay._inbox.drain()] == ["reply", "head_status"]
        # The local worker's commands never reach the broker.
        assert not any(t.endswith(node_cmd("box")) for t, _, _ in far.published)


async def test_head_reads_both_sides_in_one_stream_with_one_replay_cache():
    near, far, head = split_over_memory()
    async with head, MemoryBus(near, CLUSTER, "worker:box", KEY) as box, \
            MemoryBus(far, CLUSTER, "relay:r", KEY) as relay:
        await box.publish(HEAD_EVENTS, "started", {"job": 1})
        await relay.publish(HEAD_REQUESTS, "request", {"id": "x"})
        assert [(await next_message(head)).kind for _ in range(2)] == ["started", "request"]
        # The same sealed message arriving both ways is one message.
        payload = seal(KEY, "worker:box", "finished", {"job": 1}, now=box._clock(), topic=HEAD_EVENTS,
                       epoch=process_epoch())
        near.inject(f"gpud/{CLUSTER}/{HEAD_EVENTS}", payload)
        far.inject(f"gpud/{CLUSTER}/{HEAD_EVENTS}", payload)
        assert [m.kind for m in head._inbox.drain()] == ["finished"]


async def test_on_connect_is_the_remote_sides_and_close_ends_messages():
    near, far, head = split_over_memory()
    calls = []

    async def hook():
        calls.append(1)

    head.on_connect = hook
    assert head.remote.on_connect is hook
    async with head:
        async with asyncio.timeout(5):
            while not calls:
                await asyncio.sleep(0.01)
        assert head.connected and head.connects == 1
        far.disconnect("head")
        assert not head.connected
        await head.publish(node_cmd("box"), "ack", {"done": []})   # the local side stays up
        far.reconnect("head")
        async with asyncio.timeout(5):
            while len(calls) < 2:
                await asyncio.sleep(0.01)
    assert [m async for m in head.messages()] == []


async def test_standalone_buses_keep_the_broker_for_outside_parties(tmp_path):
    """The head's own worker is reached in the process; a relay over the embedded broker
    still reaches the head and hears its replies and status."""
    async with EmbeddedBroker() as broker:
        cfg = Config(cluster=CLUSTER, state_dir=str(tmp_path), key_file=str(tmp_path / "cluster.key"),
                     worker=WorkerConfig(name="box"), broker=BrokerConfig(url=broker.url))
        head, worker = local_buses(cfg, KEY)
        relay = MqttBus(broker.url, CLUSTER, "relay:r", KEY, subscriptions=[relay_replies("r"), HEAD_STATUS])
        watcher = MqttBus(broker.url, CLUSTER, "watcher", KEY, subscriptions=["#"])
        async with head, worker, relay, watcher:
            await asyncio.gather(head.wait_connected(), relay.wait_connected(), watcher.wait_connected())
            await head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
            await head.publish(node_cmd("box"), "launch", {"job": 1})
            assert (await next_message(worker)).kind == "head_status"
            assert (await next_message(worker)).kind == "launch"
            await worker.publish(HEAD_EVENTS, "started", {"job": 1})
            got = await next_message(head)
            assert (got.kind, got.sender) == ("started", "worker:box")
            await relay.publish(HEAD_REQUESTS, "request", {"id": "q"})
            got = await next_message(head)
            assert (got.kind, got.sender) == ("request", "relay:r")
            await head.publish(relay_replies("r"), "reply", {"id": "q"})
            assert (await next_message(relay)).kind == "head_status"
            assert (await next_message(relay)).kind == "reply"
            seen = []
            async with asyncio.timeout(10):   # the broker's traffic, up to the relay's reply
                while "reply" not in seen:
                    seen.append((await next_message(watcher)).kind)
            assert "launch" not in seen and "started" not in seen
            assert {"head_status", "request"} <= set(seen)


async def test_an_unsigned_in_process_broker_keeps_the_wires_json_retained_messages_and_wills():
    hub = MemoryBroker(signed=False)
    async with MemoryBus(hub, CLUSTER, "head", KEY, [HEAD_EVENTS, "node/+/status"]) as head, \
            MemoryBus(hub, CLUSTER, "worker:box", KEY, [node_cmd("box")],
                      will=Will(node_status("box"), "node_status", {"state": "offline"})) as box:
        await head.publish(node_cmd("box"), "ack", {"done": [(1, 0)], 7: "x"})
        got = await next_message(box)
        assert (got.kind, got.sender, got.body) == ("ack", "head", {"done": [[1, 0]], "7": "x"})
        assert b'"sig"' not in hub.published[-1][1]
        await box.publish(node_status("box"), "node_status", {"state": "online"}, retain=True)
        assert (await next_message(head)).body == {"state": "online"}
        async with MemoryBus(hub, CLUSTER, "late", KEY, ["node/+/status"]) as late:
            got = await next_message(late)
            assert (got.body, got.retained) == ({"state": "online"}, True)
        hub.disconnect("worker:box")
        assert (await next_message(head)).body == {"state": "offline"}
        hub.inject(f"gpud/{CLUSTER}/{HEAD_EVENTS}", b"not json")   # dropped, logged
        await box.publish(HEAD_EVENTS, "started", {"job": 1})       # queued while away
        hub.reconnect("worker:box")
        assert (await next_message(head)).kind == "started"
