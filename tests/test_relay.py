"""gpuctl through a relay: a real Head and Store, a Relay, and the in-memory broker between them.

The client is the real ``gpuctl.Client`` on the relay's Unix socket, so identity comes from
SO_PEERCRED exactly as in production; forged, stale and misaddressed requests are injected
as raw payloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import time
from typing import Any

import pytest

from gpuctl import Client, RemoteError
from gpud import protocol
from gpud.bus.base import HEAD_EVENTS, HEAD_REQUESTS, HEAD_STATUS, relay_replies
from gpud.bus.envelope import peek, seal
from gpud.bus.epoch import process_epoch
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.config import Config
from gpud.head.daemon import Head
from gpud.head.store import Store
from gpud.bus.messages import CHUNK_CHARS, MessageError, Reply, Request
from gpud.relay import Parts, Relay, split_line

EPOCH = process_epoch()   # a key holder's seal in this process: the relay's own run
KEY = b"k" * 32
CLUSTER = "test"
REQUESTS = f"gpud/{CLUSTER}/{HEAD_REQUESTS}"


# -- the wire format ------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [b"", b"{}\n", "é€😀\n".encode() * 50_000, b"\xff\xfe bad utf-8 \x80\n"])
def test_lines_survive_splitting_and_joining_in_any_order(line):
    parts = split_line(line)
    assert all(len(p) <= CHUNK_CHARS for p in parts)
    joined = Parts(len(parts))
    out = None
    for i in reversed(range(len(parts))):
        out = joined.add(Reply.from_body({"id": "r", "part": i, "parts": len(parts), "data": parts[i]}))
    assert out == line


def test_a_worst_case_part_fits_in_an_envelope():
    data = "\udcff" * CHUNK_CHARS   # every character escaped as \\uXXXX
    seal(KEY, "relay:x", "request", {"id": "r" * 64, "part": 0, "parts": 1, "data": data, "uid": 1, "gid": 1,
                                     "pid": 1, "user": "u" * 64, "deadline": 1.0}, now=0)


@pytest.mark.parametrize("body, error", [
    ({"part": 0, "parts": 1, "data": ""}, "id"),
    ({"id": "r", "part": 1, "parts": 1, "data": ""}, "part"),
    ({"id": "r", "part": 0, "parts": 0, "data": ""}, "parts"),
    ({"id": "r", "part": True, "parts": 1, "data": ""}, "part"),
    ({"id": "r", "part": 0, "parts": 1, "data": 5}, "data"),
    ({"id": "r", "part": 0, "parts": 1, "data": "x" * (CHUNK_CHARS + 1)}, "data"),
])
def test_malformed_parts_are_refused(body, error):
    with pytest.raises(MessageError, match=error):
        Reply.from_body(body)


@pytest.mark.parametrize("changes, error", [
    ({"uid": -1}, "uid"), ({"uid": 2**32 - 1}, "uid"), ({"uid": "0"}, "uid"), ({"gid": None}, "gid"),
    ({"pid": -5}, "pid"), ({"user": "two words"}, "user"), ({"user": 7}, "user"),
    ({"deadline": float("nan")}, "deadline"), ({"deadline": "soon"}, "deadline"),
])
def test_malformed_identities_are_refused(changes, error):
    body = {"id": "r", "part": 0, "parts": 1, "data": "", "uid": 1000, "gid": 1000, "pid": 42, "user": "alice",
            "deadline": 1.0, **changes}
    with pytest.raises(MessageError, match=error):
        Request.from_body(body)


# -- a head and a relay -------------------------------------------------------------------------

class World:
    def __init__(self, tmp_path) -> None:
        self.tmp = tmp_path
        self.broker = MemoryBroker()
        self.head_socket = str(tmp_path / "head.sock")
        self.relay_socket = str(tmp_path / "login.sock")
        self.cfg = Config(cluster=CLUSTER, state_dir=str(tmp_path))
        self.head: Head | None = None
        self.relay: Relay | None = None

    def head_bus(self) -> MemoryBus:
        return MemoryBus(self.broker, CLUSTER, "head", KEY,
                         subscriptions=[HEAD_EVENTS, "node/+/status", HEAD_REQUESTS],
                         client_id="head", persistent=True)

    def relay_bus(self, name: str = "login", sender: str | None = None) -> MemoryBus:
        return MemoryBus(self.broker, CLUSTER, sender or f"relay:{name}", KEY,
                         subscriptions=[relay_replies(name), HEAD_STATUS])

    async def call(self, socket_path: str, op: str, **args: Any) -> dict:
        def go() -> dict:
            with Client(socket_path, timeout=30) as c:
                return c.call(op, **args)
        return await asyncio.to_thread(go)

    async def same_answer(self, op: str, **args: Any) -> dict:
        """The relay's answer, checked equal to the head's own (asked before and after, so a
        scheduler pass in between, which may update priorities, does not count as a difference)."""
        for _ in range(10):
            before = await self.call(self.head_socket, op, **args)
            relayed = await self.call(self.relay_socket, op, **args)
            after = await self.call(self.head_socket, op, **args)
            if before == after:
                assert relayed == before
                return relayed
        raise AssertionError(f"{op} kept changing under the test")

    def published_replies(self) -> list[dict]:
        return [{"body": peek(KEY, p, topic=t.split("/", 2)[2]).body}
                for t, p, _ in self.broker.published if "/replies" in t]


@contextlib.asynccontextmanager
async def running(tmp_path, *, head: bool = True, timeout: float = 10.0):
    w = World(tmp_path)
    tasks = []
    async with contextlib.AsyncExitStack() as stack:
        if head:
            store = await stack.enter_async_context(Store(str(tmp_path / "head.db")))
            hbus = await stack.enter_async_context(w.head_bus())
            w.head = Head(w.cfg, hbus, store, socket_path=w.head_socket)
            tasks.append(asyncio.create_task(w.head.run()))
            await asyncio.wait_for(w.head.ready.wait(), 10)
        rbus = await stack.enter_async_context(w.relay_bus())
        w.relay = Relay(rbus, w.relay_socket, "login", timeout=timeout)
        tasks.append(asyncio.create_task(w.relay.run()))
        await asyncio.wait_for(w.relay.ready.wait(), 10)
        try:
            yield w
        finally:
            w.relay.stop()
            if w.head is not None:
                w.head.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            if w.head is not None:
                await w.head.relayed.close()


def spec(**over: Any) -> dict:
    return {"script": "#!/bin/bash\ntrue\n", "name": "t", "gpus": 1, "work_dir": "/tmp", "env": {}, **over}


async def test_every_operation_answers_the_same_through_the_relay(tmp_path):
    async with running(tmp_path) as w:
        direct, relayed = await w.call(w.head_socket, "ping"), await w.call(w.relay_socket, "ping")
        assert relayed == direct
        assert relayed["uid"] == os.getuid()
        job = (await w.call(w.relay_socket, "submit", spec=spec(hold=True)))["job_id"]
        assert w.head.store.active[job].uid == os.getuid()
        assert w.head.store.active[job].gid == os.getgid()
        for op, args in [("jobs", {}), ("jobs", {"all": True}), ("nodes", {})]:
            await w.same_answer(op, **args)
        assert (await w.call(w.relay_socket, "cancel", job_ids=[job]))["cancelled"] == [job]
        assert w.head.relayed.answered >= 6     # ping, submit, jobs, jobs, nodes, cancel (and retries)


async def test_refusals_come_back_as_the_heads_one_line_reason(tmp_path):
    async with running(tmp_path) as w:
        with pytest.raises(RemoteError) as direct:
            await w.call(w.head_socket, "submit", spec={"script": ""})
        with pytest.raises(RemoteError) as relayed:
            await w.call(w.relay_socket, "submit", spec={"script": ""})
        assert str(relayed.value) == str(direct.value)
        with pytest.raises(RemoteError, match="unknown operation"):
            await w.call(w.relay_socket, "frobnicate")


async def test_large_requests_and_answers_travel_in_parts(tmp_path):
    async with running(tmp_path) as w:
        script = "#!/bin/bash\n" + "# é padding\n" * 30_000           # 360,000 characters, 3 parts
        job = (await w.call(w.relay_socket, "submit", spec=spec(script=script, hold=True)))["job_id"]
        assert w.head.store.active[job].spec.script == script
        with pytest.raises(RemoteError, match="more than one launch message carries"):   # ~3 MB: it
            await w.call(w.relay_socket, "submit", spec=spec(script=script * 6, hold=True))   # got there
        for i in range(250):
            await w.call(w.head_socket, "submit", spec=spec(name=f"job-{i:03d}-" + "n" * 100, hold=True))
        assert len(protocol.ok(await w.same_answer("jobs"))) > CHUNK_CHARS
        reply_parts = {(r["body"]["id"], r["body"]["parts"]) for r in w.published_replies()}
        assert max(n for _, n in reply_parts) >= 2


async def test_no_answer_within_the_timeout_is_a_one_line_error(tmp_path):
    async with running(tmp_path, head=False, timeout=0.3) as w:
        with pytest.raises(RemoteError) as e:
            await w.call(w.relay_socket, "ping")
        assert str(e.value).startswith("head did not answer within 0.3s")
        assert "\n" not in str(e.value)


async def test_a_head_known_to_be_offline_is_reported_at_once(tmp_path):
    async with running(tmp_path, head=False, timeout=30) as w:
        other = MemoryBus(w.broker, CLUSTER, "head", KEY, client_id="someone")
        async with other:
            await other.publish(HEAD_STATUS, "head_status", {"state": "offline"}, retain=True)
        while w.relay.head_online is not False:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(RemoteError, match="gpud head is offline"):
            await w.call(w.relay_socket, "ping")
        assert time.monotonic() - started < 30   # not the timeout


async def test_a_relay_cut_off_from_the_broker_says_so(tmp_path):
    async with running(tmp_path, timeout=0.3) as w:
        w.broker.disconnect("relay:login")
        with pytest.raises(RemoteError, match="cannot reach the MQTT broker"):
            await w.call(w.relay_socket, "ping")
        w.broker.reconnect("relay:login")
        assert (await w.call(w.relay_socket, "ping"))["uid"] == os.getuid()


# -- forgeries and misfits: dropped without an answer -------------------------------------------------

def request_body(**over: Any) -> dict:
    line = protocol.request("submit", spec=spec(hold=True)).decode()
    return {"id": "forged", "part": 0, "parts": 1, "data": line, "uid": 0, "gid": 0, "pid": 1, "user": "root",
            "deadline": time.time() + 60, **over}


async def answered_after(w: World, payloads: list[bytes]) -> list[dict]:
    """Inject ``payloads``, then a real request as a barrier; the replies to the injected ones."""
    for p in payloads:
        w.broker.inject(REQUESTS, p)
    await w.call(w.relay_socket, "ping")
    return [r for r in w.published_replies() if r["body"]["id"].startswith("forged")]


async def test_forged_and_misaddressed_requests_are_dropped(tmp_path, caplog):
    async with running(tmp_path) as w:
        now = time.time()
        body = request_body()
        payloads = [
            json.dumps({"v": 1, "kind": "request", "sender": "relay:login", "id": "a", "ts": now,
                        "topic": HEAD_REQUESTS, "body": body, "sig": "0" * 64}).encode(),      # unsigned
            seal(b"w" * 32, "relay:login", "request", body, now=now, topic=HEAD_REQUESTS),  # wrong key
            seal(KEY, "head", "request", body, now=now, epoch=EPOCH, topic=HEAD_REQUESTS),             # not a relay
            seal(KEY, "client:evil", "request", body, now=now, epoch=EPOCH, topic=HEAD_REQUESTS),
            seal(KEY, "relay:", "request", body, now=now, epoch=EPOCH, topic=HEAD_REQUESTS),           # no name
            seal(KEY, "relay:a/b", "request", body, now=now, epoch=EPOCH, topic=HEAD_REQUESTS),
            seal(KEY, "relay:login", "submit", body, now=now, epoch=EPOCH, topic=HEAD_REQUESTS),       # wrong kind
            seal(KEY, "relay:login", "request", request_body(deadline=now - 60), now=now, epoch=EPOCH,
                 topic=HEAD_REQUESTS),                                                     # too late
            seal(KEY, "relay:login", "request", body, now=now, epoch=EPOCH, topic=HEAD_EVENTS),        # wrong topic
        ]
        assert await answered_after(w, payloads) == []
        assert w.head.store.active == {}
        for reason in ("unknown key", "only relays and workers", "unknown kind", "stopped waiting",
                       "sealed for another topic"):
            assert reason in caplog.text


async def test_a_replayed_request_runs_once(tmp_path):
    async with running(tmp_path) as w:
        payload = seal(KEY, "relay:login", "request", request_body(id="forged-1"), now=time.time(), epoch=EPOCH,
                       topic=HEAD_REQUESTS)
        await answered_after(w, [payload, payload])
        while not [r for r in w.published_replies() if r["body"]["id"] == "forged-1"]:
            await asyncio.sleep(0.01)
        # A second submission through the relay commits after the first one; still one answer.
        await w.call(w.relay_socket, "submit", spec=spec(hold=True))
        assert len([r for r in w.published_replies() if r["body"]["id"] == "forged-1"]) == 1
        assert len(w.head.store.active) == 2


async def test_a_signed_request_with_a_bad_identity_gets_an_error_answer(tmp_path):
    async with running(tmp_path) as w:
        payload = seal(KEY, "relay:login", "request", request_body(id="forged-2", uid=-1), now=time.time(), epoch=EPOCH,
                       topic=HEAD_REQUESTS)
        (reply,) = await answered_after(w, [payload])
        assert "malformed relayed request" in json.loads(reply["body"]["data"])["error"]
        assert w.head.store.active == {}


async def test_parts_that_disagree_on_who_asked_are_dropped(tmp_path):
    async with running(tmp_path) as w:
        line = protocol.request("submit", spec=spec(hold=True)).decode()
        half = len(line) // 2
        now = time.time()
        first = request_body(id="forged-3", parts=2, part=0, data=line[:half], uid=1000)
        second = request_body(id="forged-3", parts=2, part=1, data=line[half:], uid=0)
        payloads = [seal(KEY, "relay:login", "request", b, now=now, epoch=EPOCH, topic=HEAD_REQUESTS) for b in (first, second)]
        assert await answered_after(w, payloads) == []
        assert w.head.store.active == {}


async def test_a_worker_may_relay_too(tmp_path):
    async with running(tmp_path) as w:
        async with w.relay_bus("n1", sender="worker:n1") as bus:
            relay = Relay(bus, str(tmp_path / "n1.sock"), "n1")
            task = asyncio.create_task(relay.run())
            await relay.ready.wait()
            assert (await w.call(relay.socket_path, "ping"))["uid"] == os.getuid()
            relay.stop()
            await task


async def test_a_relays_claimed_user_name_is_not_trusted(tmp_path):
    """A relay vouches for a uid; the name it sends is its host's and makes no one an admin."""
    async with running(tmp_path) as w:
        w.head.admins = frozenset({"alice"})
        nobody = pwd.getpwnam("nobody")
        for claimed in ("root", "alice"):
            body = request_body(id=f"forged-{claimed}", data=protocol.request("ping").decode(),
                                uid=nobody.pw_uid, gid=nobody.pw_gid, user=claimed)
            (reply,) = [r for r in await answered_after(w, [seal(KEY, "relay:login", "request", body,
                                                                  now=time.time(), epoch=EPOCH,
                                                                  topic=HEAD_REQUESTS)])
                        if r["body"]["id"] == f"forged-{claimed}"]
            answer = json.loads(reply["body"]["data"])["result"]
            assert (answer["uid"], answer["user"], answer["admin"]) == (nobody.pw_uid, "nobody", False)
