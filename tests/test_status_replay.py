"""A replayed old "offline" head status changes no relay's view (real Mosquitto, a broker
that lets anyone publish: the worst case; the shipped one lets only the head write there).

The attack from the field: the head's retained "offline", recorded when it stopped, is
published again (retained) while the next head process runs.  Before epochs, every relay
answered "head is offline" until the head reconnected.
"""

from __future__ import annotations

import asyncio

import aiomqtt

from gpud.bus.base import HEAD_STATUS, Will
from gpud.bus.mqtt import MqttBus
from gpud.relay import Relay
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

KEY = b"s" * 32
CLUSTER = "replay"
TOPIC = f"gpud/{CLUSTER}/{HEAD_STATUS}"
WILL = Will(HEAD_STATUS, "head_status", {"state": "offline"})


def head_bus(url, epoch):
    return MqttBus(url, CLUSTER, "head", KEY, will=WILL, persistent=True, epoch=epoch, reconnect_delay=(0.05, 0.2))


class RelayView:
    """A relay's bus and the relay's own judgement of head_status messages."""

    def __init__(self, url, tmp_path, name):
        self.bus = MqttBus(url, CLUSTER, f"relay:{name}", KEY, subscriptions=[HEAD_STATUS],
                           reconnect_delay=(0.05, 0.2))
        self.relay = Relay(self.bus, str(tmp_path / f"{name}.sock"), name)
        self.seen: list[str] = []

    async def __aenter__(self):
        await self.bus.__aenter__()
        self._task = asyncio.create_task(self._read())
        await self.bus.wait_connected()
        return self

    async def __aexit__(self, *exc):
        self._task.cancel()
        await self.bus.close()

    async def _read(self):
        async for msg in self.bus.messages():
            self.seen.append(msg.body.get("state"))
            self.relay.on_message(msg)

    async def wait_seen(self, n):
        async with asyncio.timeout(10):
            while len(self.seen) < n:
                await asyncio.sleep(0.01)


async def capture_retained(url):
    async with aiomqtt.Client("127.0.0.1", int(url.rsplit(":", 1)[1])) as c:
        await c.subscribe(TOPIC, qos=1)
        async with asyncio.timeout(10):
            async for m in c.messages:
                return bytes(m.payload)


async def republish(url, payload):
    async with aiomqtt.Client("127.0.0.1", int(url.rsplit(":", 1)[1])) as c:
        await c.publish(TOPIC, payload, qos=1, retain=True)


async def test_a_replayed_old_offline_changes_no_relays_view(mosquitto, tmp_path):  # noqa: F811
    url = mosquitto.url
    # The first head process: online, then its goodbye, which an eavesdropper records.
    async with head_bus(url, epoch=1_000) as old:
        await old.wait_connected()
        await old.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
        await old.publish(HEAD_STATUS, "head_status", {"state": "offline"}, retain=True)
        assert await old.flush(5)
    recorded_offline = await capture_retained(url)
    async with head_bus(url, epoch=2_000) as head, RelayView(url, tmp_path, "login") as early:
        await head.wait_connected()
        await head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
        assert await head.flush(5)
        async with asyncio.timeout(10):
            while early.relay.head_online is not True:
                await asyncio.sleep(0.01)
        seen_before = len(early.seen)
        # The replay, as a retained message.
        await republish(url, recorded_offline)
        # A barrier behind it: the head's next (periodic) "online" reaches the relay.
        await head.publish(HEAD_STATUS, "head_status", {"state": "online", "refresh": True}, retain=True)
        await early.wait_seen(seen_before + 1)
        assert early.seen[seen_before:] == ["online"], "the replayed offline reached the relay"
        assert early.relay.head_online is True

        # The head's refresh also outranks a replay that a relay meets before anything else.
        await republish(url, recorded_offline)
        async with RelayView(url, tmp_path, "late") as late:
            await late.wait_seen(1)
            assert late.seen == ["offline"] and late.relay.head_online is False
            await head.publish(HEAD_STATUS, "head_status", {"state": "online", "refresh": True}, retain=True)
            await late.wait_seen(2)
            assert late.relay.head_online is True
            # And once it has, the recorded offline is refused again.
            await republish(url, recorded_offline)
            await head.publish(HEAD_STATUS, "head_status", {"state": "online", "refresh": True}, retain=True)
            await late.wait_seen(3)
            assert late.seen == ["offline", "online", "online"] and late.relay.head_online is True



async def test_the_head_republishes_online_periodically(tmp_path):
    from tests.slurm_head import HeadKit

    async with HeadKit(tmp_path) as kit:
        kit.record_sent()
        kit.head.status_refresh = 0.01
        task = asyncio.create_task(kit.head._status_refresher())
        try:
            async with asyncio.timeout(10):
                while len([b for t, k, b in kit.sent if k == "head_status"]) < 3:
                    await asyncio.sleep(0.01)
        finally:
            task.cancel()
        statuses = [(t, b) for t, k, b in kit.sent if k == "head_status"]
        assert all(t == HEAD_STATUS and b["state"] == "online" and b["refresh"] for t, b in statuses)
        assert all(r for t, p, r in kit.broker.published if t.endswith(HEAD_STATUS))   # retained
