"""An in-process head for tests of its Slurm features: a real SQLite store, the in-memory bus,
an injected clock, and pretend workers that finish jobs when the test says so.

    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        job_id = (await kit.call("submit", ALICE, spec=spec("true", array="0-9%2")))["job_id"]
        await kit.schedule()                     # one scheduler pass
        await kit.finish(job_id, exit_code=0)    # the worker reports the job ended
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpud.bus.base import HEAD_EVENTS, Message
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.config import Config
from gpud.ctlsocket import Caller, RequestError
from gpud.head.daemon import Head
from gpud.head.store import NodeRecord, Store

KEY = bytes(range(32))
T0 = 1_700_000_000.0
ALICE = Caller(uid=50001, gid=50001, pid=1, user="alice")
BOB = Caller(uid=50002, gid=50002, pid=1, user="bob")
ROOT = Caller(uid=0, gid=0, pid=1, user="root")


def as_sent(message: Any, body: dict | None = None) -> tuple[str, Any]:
    """(kind, body) of what was published: a message's own body (without the bus's version
    key), or a raw kind and body as given."""
    if isinstance(message, str):
        return message, body
    return message.KIND, message.to_body()


def spec(command: str = "true", **fields: Any) -> dict[str, Any]:
    return {"script": f"#!/bin/bash\n{command}\n", "name": "job", "work_dir": "/tmp", **fields}


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class HeadKit:
    def __init__(self, root: Path, *, admins: tuple[str, ...] = (), cron_tick: float = 60.0,
                 db: str | None = None) -> None:
        self.root = Path(root)
        self.db = db or str(self.root / "head.db")
        self.clock = Clock()
        cfg = Config()
        self.cfg = replace(cfg, cluster="test", head=replace(cfg.head, admins=admins, cron_tick=cron_tick,
                                                             socket=str(self.root / "head.sock")))
        self.broker = MemoryBroker()
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> "HeadKit":
        self.store = await Store(self.db).open()
        self.bus = MemoryBus(self.broker, "test", "head", KEY, clock=self.clock)
        await self.bus.__aenter__()
        self.head = Head(self.cfg, self.bus, self.store, clock=self.clock, mono=self.clock)
        self._tasks.append(asyncio.create_task(self.head._submitter()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.bus.close()
        await self.store.close()

    # -- the cluster ----------------------------------------------------------------------------
    def add_node(self, name: str, gpus: int = 4, model: str = "H100-80GB", cpus: int = 64,
                 mem_mb: int = 512 * 1024) -> None:
        info = {"name": name, "cpus": cpus, "mem_mb": mem_mb, "labels": {},
                "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_mb": 81559}
                         for i in range(gpus)]}
        self.store.nodes[name] = NodeRecord(name, info, "UP", None, self.clock(), self.clock())
        self.head.liveness.heard[name] = self.head.liveness.granted[name] = self.clock()   # as a heartbeat would

    def label_nodes(self, **labels: str) -> None:
        """Give every node ``labels`` plus an ``addr`` (10.0.0.<its number>), as gang jobs need."""
        for name, rec in self.store.nodes.items():
            rec.info["labels"] = {"addr": f"10.0.0.{name.lstrip('abcdefghijklmnopqrstuvwxyz')}", **labels}

    # -- what the head publishes -------------------------------------------------------------------
    def record_sent(self) -> None:
        """From now on keep every message the head publishes in ``self.sent``."""
        self.sent: list[tuple[str, str, Any]] = []
        publish = self.head.bus.publish

        async def record(topic, message, body=None, *, retain=False):
            self.sent.append((topic, *as_sent(message, body)))
            await publish(topic, message, body, retain=retain)

        self.head.bus.publish = record

    def sent_to(self, kind: str) -> list[tuple[str, Any]]:
        """(node, body) of each recorded message of ``kind``."""
        return [(topic.split("/")[1], body) for topic, k, body in self.sent if k == kind]

    # -- requests --------------------------------------------------------------------------------
    async def call(self, op: str, caller: Caller = ALICE, **args: Any) -> dict[str, Any]:
        return await self.head.server.handlers[op](caller, args)

    async def refused(self, op: str, caller: Caller = ALICE, **args: Any) -> str:
        try:
            await self.call(op, caller, **args)
        except RequestError as e:
            return str(e)
        raise AssertionError(f"{op} was not refused")

    async def submit(self, caller: Caller = ALICE, command: str = "true", **fields: Any) -> int:
        return int((await self.call("submit", caller, spec=spec(command, **fields)))["job_id"])

    async def start_gang(self, command: str = "sleep 600", nodes: int = 2, gpus: int = 8, **fields: Any):
        """Submit ALICE's ``nodes``-node job, run a pass, and return it RUNNING."""
        job_id = await self.submit(ALICE, command, nodes=nodes, gpus=gpus, **fields)
        await self.schedule()
        job = self.job(job_id)
        assert job.state.value == "RUNNING", job.reason
        return job

    # -- the head's loops, one step at a time ------------------------------------------------------
    async def schedule(self):
        return await self.head.schedule_pass()

    async def finish(self, job_id: int, exit_code: int = 0, reason: str = "exited") -> None:
        job = self.store.active[job_id]
        assert job.node is not None, f"job {job_id} is not running"
        await self.report(job.node, "finished", {"job": job_id, "attempt": job.attempt, "exit_code": exit_code,
                                                 "signal": None, "reason": reason})

    async def report(self, node: str, kind: str, body: Any) -> None:
        """A message from ``node``'s worker, through the head's door for them: decoded (a
        malformed one is dropped with a log line), then handled."""
        await self.head.inbox.handle(Message(HEAD_EVENTS, kind, f"worker:{node}", "x", self.clock(), body))

    def job(self, job_id: int):
        return self.store.active.get(job_id)

    async def record(self, job_id: int):
        rows = await self.store.find_jobs(job_ids=[job_id])
        return rows[0] if rows else None

    def states(self) -> dict[int, str]:
        return {j.job_id: j.state.value for j in self.store.active.values()}

    def running(self) -> list[int]:
        return sorted(j.job_id for j in self.store.active.values() if j.state.active)
