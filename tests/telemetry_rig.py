"""A head in-process for telemetry tests: real SQLite store, in-memory bus, a fake clock, and
sim GPUs whose samples come from what the head's running jobs declare (GPUD_SIM_UTIL)."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator

from gpud.bus.base import HEAD_EVENTS, Message, node_cmd
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.bus.messages import Samples, decode
from gpud.config import Config, HeadConfig
from gpud.gpu.backend import Assignment
from gpud.gpu.sim import SimBackend
from gpud.head.daemon import Head
from gpud.head.store import JobRecord, NodeRecord, Store
from gpud.model import JobSpec, JobState, NodeInfo
from gpud.sched.config import PartitionConfig, SchedConfig
from gpud.worker.telemetry import Sampler

T0 = 1_700_000_000.0
KEY = bytes(range(32))


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def config(*, idle_period: float | None = 60.0, idle_action: str = "none", idle_threshold: float = 5.0,
           resolution: float = 60.0, retention: float = 3600.0, **sched: Any) -> Config:
    part = PartitionConfig("gpu", default=True, default_time=None, idle_period=idle_period,
                           idle_action=idle_action, idle_threshold=idle_threshold)
    return Config(head=HeadConfig(telemetry_resolution=resolution, telemetry_retention=retention),
                  sched=SchedConfig(partitions={"gpu": part}, **sched))


class Rig:
    def __init__(self, head: Head, clock: Clock, worker_bus: MemoryBus) -> None:
        self.head, self.clock, self.worker_bus = head, clock, worker_bus
        self.store = head.store
        self.backends: dict[str, SimBackend] = {}
        self.samplers: dict[str, Sampler] = {}

    async def add_node(self, name: str, spec: str = "4xH100-80GB") -> SimBackend:
        backend = self.backends[name] = SimBackend(spec, name, clock=self.clock)
        info = NodeInfo(name=name, cpus=64, mem_mb=1 << 20, gpus=tuple(backend.discover()))
        await self.store.upsert_node(NodeRecord(name, info.to_dict(), "UP", None, self.clock(), self.clock()))
        self.samplers[name] = Sampler(backend, self._publish, lambda: [], 5.0, clock=self.clock)
        return backend

    async def _publish(self, topic: str, msg: Any) -> None:
        pass

    async def submit(self, *, gpus: int = 1, user: str = "alice", account: str = "default",
                     util: str | None = None, requeue: bool = True, name: str = "job",
                     gpu_type: str | None = None) -> int:
        env = {"GPUD_SIM_UTIL": util} if util is not None else {}
        spec = JobSpec(script="#!/bin/sh\ntrue\n", name=name, gpus=gpus, env=env, requeue=requeue,
                       gpu_type=gpu_type, account=account)
        job = JobRecord(job_id=0, name=name, user=user, uid=1000, gid=1000, account=account, partition="gpu",
                        qos="normal", state=JobState.PENDING, spec=spec, gpus=gpus, cpus=1, mem_mb=1024,
                        time_limit=None, submit_time=self.clock())
        (saved,) = await self.store.insert_jobs([job], self.clock())
        return saved.job_id

    async def schedule(self) -> None:
        await self.head.schedule_pass()

    def job(self, job_id: int) -> JobRecord:
        return self.store.active[job_id]

    def assignments(self, node: str) -> list[Assignment]:
        return [Assignment(j.job_id, j.attempt, tuple(j.gpu_indices), dict(j.spec.env))
                for j in self.store.jobs_on_node(node)]

    def body(self, node: str, interval: float = 5.0) -> dict:
        sampler = self.samplers[node]
        sampler.interval = interval
        assigned = self.assignments(node)
        return sampler.message(self.backends[node].sample(assigned), assigned, self.clock()).to_body()

    async def sample(self, node: str, interval: float = 5.0) -> dict:
        body = self.body(node, interval)
        await self.ingest(node, body)
        return body

    async def ingest(self, node: str, body: dict) -> None:
        """A ``samples`` body from ``node``, decoded as the head's bus loop does."""
        await self.head.telemetry.ingest(node, Samples.from_body(body))

    async def run_for(self, seconds: float, every: float = 5.0, nodes: tuple[str, ...] = ()) -> None:
        """Advance the clock, sampling every node each ``every`` seconds."""
        end = self.clock.t + seconds
        while self.clock.t + every <= end + 1e-9:
            self.clock.t += every
            for n in nodes or tuple(self.backends):
                await self.sample(n, every)

    async def finish(self, job_id: int, exit_code: int = 0, reason: str = "exited") -> None:
        job = self.job(job_id)
        await self.head.inbox.handle(Message(HEAD_EVENTS, "finished", f"worker:{job.node}", "x", self.clock(), {
            "job": job_id, "attempt": job.attempt, "exit_code": exit_code, "signal": None, "reason": reason}))

    def commands(self) -> list:
        """What the head told the workers so far (kind, body as the worker decodes it), in order."""
        return [(m.kind, decode(m.kind, m.body).to_body()) for m in self.worker_bus._inbox.drain()]


@contextlib.asynccontextmanager
async def rig(tmp_path: Path, cfg: Config | None = None) -> AsyncIterator[Rig]:
    clock = Clock()
    cfg = replace(cfg or config(), state_dir=str(tmp_path))
    broker = MemoryBroker()
    async with Store(str(tmp_path / "head.db")) as store, \
            MemoryBus(broker, "test", "head", KEY, subscriptions=[HEAD_EVENTS]) as bus, \
            MemoryBus(broker, "test", "worker:watch", KEY, subscriptions=[node_cmd("+")]) as worker_bus:
        head = Head(cfg, bus, store, clock=clock, mono=clock, socket_path=str(tmp_path / "gpud.sock"))
        yield Rig(head, clock, worker_bus)
