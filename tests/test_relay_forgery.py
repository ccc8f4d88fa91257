"""Over a real Mosquitto: a raw MQTT request that claims a uid is dropped unless a relay signed
it with the cluster key (the head, the relay and the broker are real processes)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiomqtt
import pytest

from gpud import protocol
from gpud.bus.base import HEAD_REQUESTS
from gpud.bus.envelope import peek, seal
from gpud.keys import load_key
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def forged_body(rid: str, **over) -> dict:
    spec = {"script": "#!/bin/bash\ntrue\n", "name": rid, "work_dir": "/tmp", "env": {}, "hold": True}
    return {"id": rid, "part": 0, "parts": 1, "data": protocol.request("submit", spec=spec).decode(),
            "uid": 0, "gid": 0, "pid": 1, "user": "root", "deadline": time.time() + 60, **over}


async def test_forged_requests_over_real_mqtt_are_dropped(tmp_path, mosquitto):  # noqa: F811
    relay_sock = str(tmp_path / "login.sock")
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        relay = c._spawn(["relay", "--name", "login", "--socket", relay_sock], "relay")
        c.workers["relay"] = relay     # stopped with the cluster
        wait_for(lambda: gpuctl(c, relay_sock, "squeue").returncode == 0 or relay.poll() is not None, 30,
                 "the relay")
        assert relay.poll() is None, c.log("relay")

        key, now, topic = load_key(c.key_file), time.time(), f"gpud/test/{HEAD_REQUESTS}"
        unsigned = json.dumps({"v": 1, "kind": "request", "sender": "relay:login", "id": "u1", "ts": now,
                               "topic": HEAD_REQUESTS, "body": forged_body("forged-1"), "sig": "0" * 64})
        payloads = [
            unsigned.encode(),
            json.dumps(forged_body("forged-2")).encode(),                                          # no envelope
            seal(b"not the cluster key" * 2, "relay:login", "request", forged_body("forged-3"), now=now,
                 topic=HEAD_REQUESTS),
            seal(key, "user:mallory", "request", forged_body("forged-4"), now=now, topic=HEAD_REQUESTS),
            seal(key, "head", "request", forged_body("forged-5"), now=now, topic=HEAD_REQUESTS),
            seal(key, "relay:forger", "request", forged_body("forged-6", deadline=now - 300), now=now,
                 topic=HEAD_REQUESTS),
        ]
        replies: list[dict] = []
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe("gpud/test/relay/+/replies", qos=1)

            async def collect() -> None:
                async for m in client.messages:
                    replies.append(peek(key, m.payload, topic=m.topic.value.split("/", 2)[2]).body)

            reader = asyncio.create_task(collect())
            for p in payloads:
                await client.publish(topic, p, qos=1)
            # A real request through the relay, after the forged ones: once it is answered,
            # the head has read (and dropped) everything before it.
            r = await asyncio.to_thread(gpuctl, c, relay_sock, "sbatch", "--parsable", "--hold", "-J", "real",
                                        "--wrap", "true")
            assert r.returncode == 0, r.stderr
            barrier = int(r.stdout)
            await asyncio.to_thread(wait_for, lambda: replies, 10, "the relay's reply on the bus")
            reader.cancel()
        jobs = c.jobs()
        assert [j["name"] for j in jobs.values()] == ["real"] and barrier in jobs
        assert [r["id"] for r in replies if r["id"].startswith("forged-")] == []
        head_log = c.log("head")
        for reason in ("unknown key", "not a gpud envelope", "only relays and workers", "stopped waiting"):
            assert reason in head_log, reason


def gpuctl(c: Cluster, socket_path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", socket_path, *args], env=c.env,
                          capture_output=True, text=True, cwd=str(c.root), timeout=60)


def test_relay_start_errors_are_one_line(tmp_path, mosquitto):  # noqa: F811
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        cases = [
            (["--socket", c.socket], "is already served (by a gpud head or another relay)"),
            (["--socket", str(tmp_path / "r.sock"), "--key-file", str(tmp_path / "nokey")], "not found"),
            (["--socket", str(tmp_path / "r.sock"), "--name", "a/b"], "invalid relay name"),
        ]
        for args, message in cases:
            r = subprocess.run([sys.executable, "-m", "gpud.cli", "relay", "--config", str(c.config), *args],
                               env=c.env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 1, r.stderr
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gpud relay: error:")]
            assert len(lines) == 1 and message in lines[0], r.stderr
        assert c.head.poll() is None and c.gpuctl("squeue").returncode == 0   # the head's socket is intact
