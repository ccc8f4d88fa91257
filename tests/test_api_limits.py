"""gpud.ctlsocket's per-user limits, on a real Unix socket with tiny limits."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpud import protocol
from gpud import ctlsocket as api
from gpud.ctlsocket import Limits, RateLimitedLog, SocketServer


async def echo(caller, args):
    if args.get("wait"):
        await asyncio.sleep(args["wait"])
    return {"uid": caller.uid}


@pytest.fixture
async def server(tmp_path):
    s = SocketServer(str(tmp_path / "s.sock"), {"ping": echo},
                     limits=Limits(connections_per_user=3, requests_per_user=2, line_timeout=0.3))
    await s.start()
    yield s
    await s.close()


async def connect(server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(server.path, limit=protocol.MAX_LINE)


async def answer(reader) -> dict:
    return json.loads(await asyncio.wait_for(reader.readline(), 5))


async def test_a_connection_past_the_users_limit_gets_one_line_and_is_closed(server):
    conns = [await connect(server) for _ in range(3)]
    for r, w in conns:   # the first three are served
        w.write(protocol.request("ping"))
        assert (await answer(r))["ok"]
    r, w = await connect(server)
    refused = await answer(r)
    assert refused == {"ok": False, "error": "too many connections from this user (3 open, the limit is 3); "
                                             "close some and try again"}
    assert await r.read() == b""
    conns[0][1].close()
    await conns[0][1].wait_closed()
    for _ in range(100):   # a closed one makes room
        r, w = await connect(server)
        w.write(protocol.request("ping"))
        if (await answer(r))["ok"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("no room after a connection closed")


async def test_an_unfinished_line_is_cut_off_at_the_deadline(server):
    r, w = await connect(server)
    w.write(b'{"v":1,"op":"ping"')
    assert (await answer(r))["error"] == "request line not finished within 0.3s"
    assert await r.read() == b""


async def test_a_large_line_is_refused_unless_it_carries_a_script(server):
    r, w = await connect(server)
    w.write(b'{"v":1,"op":"ping","args":{"x":"' + b"x" * (api.SMALL_LINE + 10))
    assert (await answer(r))["error"] == "request too large (over 1 MiB)"
    r, w = await connect(server)
    w.write(b'{"v":1,"op":"submit","args":{"x":"' + b"x" * (2 * api.SMALL_LINE) + b'"}}\n')
    assert (await answer(r))["error"] == "operation 'submit' is not available on this head"   # read whole


async def test_a_users_requests_past_the_limit_wait_and_are_all_answered(server):
    r, w = await connect(server)
    w.write(protocol.request("ping", wait=0.2) * 5)   # two at a time; the rest wait their turn
    answers = [await answer(r) for _ in range(5)]
    assert all(a["ok"] for a in answers)


def test_rate_limited_log_keeps_a_few_lines_per_period_and_counts_the_rest(caplog):
    now = [0.0]
    quiet = RateLimitedLog(api.log, period=60, burst=2, clock=lambda: now[0])
    with caplog.at_level("INFO", logger="gpud.api"):
        for i in range(10):
            quiet.log(20, "k", "event %d", i)
        now[0] = 61
        quiet.log(20, "k", "event %d", 10)
    assert [r.getMessage() for r in caplog.records] == [
        "event 0", "event 1", "event 10 (8 more like it in the last 60s were not logged)"]


async def test_json_nested_a_thousand_deep_is_answered_and_the_connection_goes_on(server):
    r, w = await connect(server)
    w.write(b'{"v":1,"op":"ping","args":{"x":' + b"[" * 1000 + b"]" * 1000 + b"}}\n" + protocol.request("ping"))
    assert (await answer(r)) == {"ok": False, "error": "request is nested more than 32 levels deep"}
    assert (await answer(r))["ok"]
