"""sd_notify: datagrams to $NOTIFY_SOCKET (path and abstract), watchdog pacing, no-ops without
systemd, and a real head that says READY=1 only once its socket answers."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket

import pytest

from gpuctl import Client
from gpud import sdnotify
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET: a Unix datagram socket that collects states."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.05)
        self.messages: list[list[str]] = []

    def poll(self) -> list[list[str]]:
        """Read whatever has arrived; every message so far."""
        while True:
            try:
                data = self.sock.recv(4096)
            except (socket.timeout, BlockingIOError):
                return self.messages
            self.messages.append(data.decode().split("\n"))

    def states(self) -> list[str]:
        return [s for m in self.poll() for s in m]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    sd = FakeSystemd(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", sd.address)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sd
    sd.close()


def test_ready_stopping_watchdog_reach_a_path_socket(fake_systemd):
    assert sdnotify.ready("head: ready")
    assert sdnotify.watchdog_ping()
    assert sdnotify.stopping()
    assert fake_systemd.poll() == [["READY=1", "STATUS=head: ready"], ["WATCHDOG=1"], ["STOPPING=1"]]


def test_abstract_namespace_address(monkeypatch):
    sd = FakeSystemd(f"@gpud-test-{secrets.token_hex(4)}")
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", sd.address)
        assert sdnotify.socket_address() == b"\0" + sd.address[1:].encode()
        assert sdnotify.notify("READY=1")
        assert sd.poll() == [["READY=1"]]
    finally:
        sd.close()


def test_without_notify_socket_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert sdnotify.socket_address() is None
    assert not sdnotify.ready()
    assert not sdnotify.stopping()
    assert not sdnotify.watchdog_ping()
    assert sdnotify.watchdog_interval() is None


@pytest.mark.parametrize("value", ["relative/path", "x"])
def test_a_malformed_address_is_ignored(monkeypatch, value):
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sdnotify.socket_address() is None
    assert not sdnotify.ready()


def test_a_vanished_socket_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert not sdnotify.ready()
    assert "could not notify systemd" in caplog.text


@pytest.mark.parametrize("env, expected", [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "<self>"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),     # someone else is watched
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
    ({"WATCHDOG_USEC": "junk"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "10"}, sdnotify.MIN_WATCHDOG_INTERVAL),
    ({}, None),
])
def test_watchdog_interval_is_half_the_period_for_this_process(env, expected):
    env = {k: str(os.getpid()) if v == "<self>" else v for k, v in env.items()}
    env["NOTIFY_SOCKET"] = "/run/systemd/notify"
    assert sdnotify.watchdog_interval(env) == expected


async def test_lifecycle_pings_then_says_ready_when_the_event_is_set_then_stopping(fake_systemd, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "100000")     # a ping every 50 ms
    ready = asyncio.Event()
    async with sdnotify.lifecycle(ready, what="gpud test"):
        while fake_systemd.states().count("WATCHDOG=1") < 2:
            await asyncio.sleep(0.01)
        assert "READY=1" not in fake_systemd.states()
        ready.set()
        while "READY=1" not in fake_systemd.states():
            await asyncio.sleep(0.01)
    states = fake_systemd.states()
    assert states[-2:] == ["STOPPING=1", "STATUS=gpud test: stopping"]
    assert "STATUS=gpud test: ready" in states


async def test_lifecycle_disabled_says_nothing(fake_systemd):
    ready = asyncio.Event()
    ready.set()
    async with sdnotify.lifecycle(ready, what="embedded", enabled=False):
        await asyncio.sleep(0)
    assert fake_systemd.poll() == []


@pytest.mark.slow
def test_head_sends_ready_only_once_its_socket_answers(tmp_path, mosquitto):  # noqa: F811
    sd = FakeSystemd(str(tmp_path / "notify"))
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.env.update(NOTIFY_SOCKET=sd.address, WATCHDOG_USEC="400000")
        c.env.pop("WATCHDOG_PID", None)
        head = c.start_head(wait=False)
        wait_for(lambda: "READY=1" in sd.states() or head.poll() is not None, 30, "READY=1 from the head")
        assert head.poll() is None, c.log("head")
        # The moment systemd hears READY=1, a client is answered on the first try.
        with c.client() as client:
            assert client.ping()["cluster"] == "test"
        wait_for(lambda: sd.states().count("WATCHDOG=1") >= 2, 30, "watchdog pings")
        head.send_signal(signal.SIGTERM)
        head.wait(30)
        assert "STOPPING=1" in sd.states()
        assert sd.states().index("READY=1") < sd.states().index("STOPPING=1")
    sd.close()


@pytest.mark.slow
def test_a_head_that_cannot_serve_its_socket_never_says_ready(tmp_path, mosquitto):  # noqa: F811
    sd = FakeSystemd(str(tmp_path / "notify"))
    with Cluster(tmp_path / "c", mosquitto.url) as c, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        squatter.bind(c.socket)     # someone else answers there already
        squatter.listen()
        c.env.update(NOTIFY_SOCKET=sd.address)
        head = c.start_head(wait=False)
        assert head.wait(30) == 1
        assert "already serving" in c.log("head")
        assert "READY=1" not in sd.states()
    sd.close()


@pytest.mark.slow
def test_worker_and_relay_say_ready_once_they_serve(tmp_path, mosquitto):  # noqa: F811
    worker_sd, relay_sd = FakeSystemd(str(tmp_path / "w.notify")), FakeSystemd(str(tmp_path / "r.notify"))
    relay_sock = str(tmp_path / "relay.sock")
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        c.env["NOTIFY_SOCKET"] = worker_sd.address
        c.start_worker("w1", wait=False)
        c.env["NOTIFY_SOCKET"] = relay_sd.address
        c.workers["relay"] = c._spawn(["relay", "--socket", relay_sock, "--name", "login"], "relay")
        del c.env["NOTIFY_SOCKET"]
        wait_for(lambda: "READY=1" in relay_sd.states(), 30, "READY=1 from the relay")
        with Client(relay_sock) as client:
            assert client.ping()["cluster"] == "test"
        wait_for(lambda: "READY=1" in worker_sd.states(), 30, "READY=1 from the worker")
        c.stop(c.workers["w1"])
        assert worker_sd.states()[-2:] == ["STOPPING=1", "STATUS=gpud worker w1: stopping"]
    worker_sd.close()
    relay_sd.close()
