"""One user cannot stall the head for everyone.

A real Head and a Relay (in this process, the in-memory broker between them) serve their
sockets; a forked child running as ``nobody`` holds 2,000 connections to the head's socket,
sends 40 large request lines slowly and never finishes them, and keeps 600 ``step_poll``
calls (each waits 10 s for output that never comes) in flight through the relay.  Meanwhile
root's ``squeue``, on both sockets, is answered; the latency is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import resource
import selectors
import shutil
import socket
import statistics
import tempfile
import time
from contextlib import contextmanager

import pytest

from gpud import protocol
from gpud.ctlsocket import USER_BUFFER, Caller
from gpud.head.store import NodeRecord
from gpuctl import Client
from tests.test_relay import running

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacker runs as another uid: needs root")

NOBODY = pwd.getpwnam("nobody")
IDLE, SLOW, POLLS, POLL_CONNS = 2_000, 40, 600, 10
LINE = 15 << 20


@contextmanager
def open_dir():
    """A directory ``nobody`` can reach sockets in (pytest's own are 0700)."""
    d = tempfile.mkdtemp(prefix="gpud-stall-")
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def attack(head_sock: str, relay_sock: str, job_id: int, ready_fd: int) -> None:
    """The child, as nobody: blocking-free sockets under one selector; runs until killed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    os.setgroups([])
    os.setgid(NOBODY.pw_gid)
    os.setuid(NOBODY.pw_uid)

    def connect(path: str) -> socket.socket | None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError:
            s.close()
            return None
        s.setblocking(False)
        return s

    keep = []
    slow = [c for c in (connect(head_sock) for _ in range(SLOW)) if c]
    sent = {c: 0 for c in slow}
    for c in slow:
        c.send(b'{"v":1,"op":"submit","args":{"spec":{"script":"')
    poll = protocol.request("step_poll", job_id=job_id, step=0, offset=0)
    sel = selectors.DefaultSelector()
    for _ in range(POLL_CONNS):
        c = connect(relay_sock)
        if c:
            c.sendall(poll * (POLLS // POLL_CONNS))
            sel.register(c, selectors.EVENT_READ)
    for _ in range(IDLE):
        c = connect(head_sock)
        if c:
            keep.append(c)
    os.write(ready_fd, b"x")
    chunk = b"x" * (256 << 10)
    while True:
        for c in list(sent):
            if sent[c] < LINE:
                try:
                    sent[c] += c.send(chunk)
                except BlockingIOError:
                    pass
                except OSError:
                    del sent[c]       # refused and closed by the head
        for key, _ in sel.select(0.02):
            try:
                data = key.fileobj.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                continue
            try:   # another poll for each answer: the loop never lets up
                key.fileobj.send(poll * data.count(b"\n"))
            except OSError:
                pass


def squeue_ms(path: str) -> float:
    t = time.perf_counter()
    with Client(path, timeout=30) as c:
        c.call("jobs")
    return (time.perf_counter() - t) * 1000


async def test_one_users_connections_slow_lines_and_poll_loop_leave_anothers_squeue_answered(tmp_path, caplog):
    with open_dir() as d:
        async with running(tmp_path) as w:
            for server in (w.head.server, w.relay.server):   # the sockets, where nobody can reach them
                await server.close()
                server.path = os.path.join(d, os.path.basename(server.path))
                await server.start()
            w.head.store.nodes["n1"] = NodeRecord("n1", {
                "name": "n1", "cpus": 64, "mem_mb": 512 * 1024, "labels": {},
                "gpus": [{"index": 0, "uuid": "GPU-0", "model": "H100-80GB", "memory_mb": 81559}]},
                "UP", None, time.time(), time.time())
            victim = Caller(uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, pid=1, user="nobody")
            handlers = w.head.server.handlers
            job_id = (await handlers["submit"](victim, {"spec": {
                "script": "#!/bin/bash\nsleep 600\n", "name": "j", "work_dir": "/tmp", "gpus": 1}}))["job_id"]
            for _ in range(100):
                await w.head.schedule_pass()
                if w.head.store.active[job_id].state.value == "RUNNING":
                    break
            await handlers["step_launch"](victim, {"job_id": job_id, "argv": ["sleep", "600"]})

            before = [await asyncio.to_thread(squeue_ms, s) for s in (w.head.server.path, w.relay.server.path)]
            r, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    attack(w.head.server.path, w.relay.server.path, job_id, wfd)
                finally:
                    os._exit(0)
            os.close(wfd)
            try:
                assert await asyncio.to_thread(os.read, r, 1) == b"x"
                for _ in range(150):       # let the slow lines grow and the polls pile up
                    if w.head.server.buffered > USER_BUFFER // 2:
                        break
                    await asyncio.sleep(0.1)
                head_ms = [await asyncio.to_thread(squeue_ms, w.head.server.path) for _ in range(20)]
                relay_ms = [await asyncio.to_thread(squeue_ms, w.relay.server.path) for _ in range(20)]
                held = w.head.server.connections
                buffered = w.head.server.buffered
                relayed = len(w.head.relayed._tasks)
            finally:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                os.close(r)
            print(f"\nsqueue before the attack: head {before[0]:.1f} ms, relay {before[1]:.1f} ms")
            print(f"squeue under attack (20 each): head median {statistics.median(head_ms):.1f} ms, max "
                  f"{max(head_ms):.1f} ms; relay median {statistics.median(relay_ms):.1f} ms, max "
                  f"{max(relay_ms):.1f} ms (target under 100 ms)")
            print(f"head: {held} connections held, {buffered >> 20} MiB of unfinished lines, "
                  f"{relayed} relayed requests in progress")
            # What the limits promise, not how fast: the attacker's share stayed bounded.
            assert held <= w.head.server.limits.connections_per_user + 1
            assert buffered <= USER_BUFFER
            assert relayed <= w.head.server.limits.requests_per_user
            # The refusals were logged in a few lines, none with a traceback.
            api = [rec for rec in caplog.records if rec.name == "gpud.api"]
            print(f"log lines from the socket: {len(api)}")
            assert api and len(api) <= 40 and not any(rec.exc_info for rec in caplog.records)
