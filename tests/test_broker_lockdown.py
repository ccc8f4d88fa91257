"""The shipped broker config, on a real Mosquitto started the way Debian 12 starts it:
it starts, refuses anonymous clients, confines each user to its topics, and a client that
sends the head's client id neither disconnects the head nor receives its messages."""

from __future__ import annotations

import asyncio
import re

import aiomqtt
import pytest

from gpud.bus.base import HEAD_EVENTS, HEAD_STATUS, node_cmd
from gpud.bus.mqtt import MqttBus
from tests.locked_broker import SHIPPED, STOCK, LockedMosquitto
from tests.mqtt_broker import require_mosquitto

KEY = b"k" * 32
CLUSTER = "lock"


@pytest.fixture
def broker(tmp_path):
    require_mosquitto()
    proc = LockedMosquitto(tmp_path / "mosquitto", cluster=CLUSTER, nodes=["n1", "n2"], relays=["login"])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def login_bus(broker, user, sender, subscriptions=(), **kw):
    return MqttBus(broker.url, CLUSTER, sender, KEY, subscriptions=subscriptions, username=user,
                   password=broker.passwords[user], reconnect_delay=(0.05, 0.2), **kw)


async def receive(bus, n=1, timeout=10.0):
    out = []
    async with asyncio.timeout(timeout):
        async for m in bus.messages():
            out.append(m)
            if len(out) == n:
                return out


def test_the_conf_d_file_repeats_nothing_the_stock_file_sets():
    def keys(text):
        return {m.group(1) for m in re.finditer(r"^\s*([a-z_]+)\s", text, re.M)}

    assert keys(SHIPPED.read_text()) & keys(STOCK) == set()
    text = SHIPPED.read_text()
    for line in ("allow_anonymous false", "password_file ", "acl_file ", "use_username_as_clientid true",
                 "max_queued_messages 100000", "#listener 8883"):
        assert line in text, line


async def test_starts_on_the_stock_config_and_refuses_anonymous_clients(broker):
    assert broker.running
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="anon"):
            pass
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client("127.0.0.1", broker.port, username="head", password="wrong"):
            pass


async def test_each_user_is_confined_to_its_topics(broker):
    async with login_bus(broker, "head", "head", [HEAD_EVENTS, "node/+/status"], persistent=True) as head, \
            login_bus(broker, "node-n1", "worker:n1", [node_cmd("n1"), node_cmd("n2")]) as n1:
        await head.wait_connected()
        await n1.wait_connected()
        await head.publish(node_cmd("n2"), "launch", {"job": 2})   # n1 may not read it
        await n1.publish(node_cmd("n2"), "kill", {"allocs": []})     # nor write it
        await n1.publish(HEAD_EVENTS, "heartbeat", {})
        await head.publish(node_cmd("n1"), "launch", {"job": 1})
        [m] = await receive(n1)
        assert (m.topic, m.kind) == (node_cmd("n1"), "launch")
        [m] = await receive(head)
        assert m.kind == "heartbeat"
        assert n1._inbox.drain() == [] and head._inbox.drain() == []


async def test_a_client_sending_the_heads_client_id_takes_nothing(broker):
    async with login_bus(broker, "head", "head", [HEAD_EVENTS], persistent=True) as head, \
            login_bus(broker, "node-n1", "worker:n1") as n1:
        await head.wait_connected()
        await n1.wait_connected()
        # Without a password it is refused; with another user's it is that user, not the head.
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier=head.client_id):
                pass
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier=head.client_id, username="relay-login",
                                  password=broker.passwords["relay-login"]) as thief:
            await thief.subscribe(f"gpud/{CLUSTER}/#", qos=1)
            for i in range(20):
                await n1.publish(HEAD_EVENTS, "heartbeat", {"i": i})
            got = await receive(head, 20)
            assert [m.body["i"] for m in got] == list(range(20))
            # A barrier the thief may read: the broker routed the heartbeats before it.
            await head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
            seen = []
            async with asyncio.timeout(10):
                async for m in thief.messages:
                    seen.append(m.topic.value)
                    if m.topic.value.endswith(HEAD_STATUS):
                        break
            assert seen == [f"gpud/{CLUSTER}/{HEAD_STATUS}"]
        assert head.connected and head.connects == 1


def test_broker_credentials_command_keeps_passwords_and_refuses_bad_names(tmp_path):
    from click.testing import CliRunner

    from gpud.cli import main

    args = ["broker-credentials", "--cluster", "c1", "--dir", str(tmp_path / "b"), "--passwd",
            str(tmp_path / "passwd"), "--acl", str(tmp_path / "acl")]
    r = CliRunner().invoke(main, [*args, "--node", "n1"])
    assert r.exit_code == 0, r.output
    before = (tmp_path / "b" / "node-n1").read_text()
    r = CliRunner().invoke(main, [*args, "--node", "n1,n2", "--relay", "login"])
    assert r.exit_code == 0 and "(3 new)" in r.output, r.output
    assert (tmp_path / "b" / "node-n1").read_text() == before
    users = [line.split(":")[0] for line in (tmp_path / "passwd").read_text().splitlines()]
    assert users == ["head", "node-n1", "node-n1-relay", "node-n2", "node-n2-relay", "relay-login"]
    assert all(oct(p.stat().st_mode)[-3:] == "600" for p in (tmp_path / "b").iterdir())
    acl = (tmp_path / "acl").read_text()
    assert "user node-n2\ntopic read gpud/c1/node/n2/cmd\n" in acl and "gpud/c1/node/n1/cmd" not in \
        acl.split("user node-n2\n")[1].split("\n\n")[0]
    for bad, words in ((["--node", "a/b"], "--node 'a/b'"), (["--node", "x", "--relay", "x"], "also a node's")):
        r = CliRunner().invoke(main, [*args, *bad])
        assert r.exit_code == 1 and words in r.output, r.output
