"""The worker's side of leases: the wrapper kills a job whose lease lapsed (even with no
worker to do it), a renewal keeps it, a stale launch is never started, launches queued
while the worker was away wait for the head's word, and clock steps kill nothing.

Real wrappers and bash jobs for the executor parts; the daemon parts over the in-memory bus
with an injected monotonic clock that the test advances.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from gpud.bus.base import HEAD_EVENTS, node_status
from gpud.bus.memory import MemoryBroker
from gpud.gpu.sim import SimBackend
from gpud.worker import lease as leases
from gpud.worker.daemon import Worker
from gpud.worker.fencing import LEASE_EXPIRED
from tests.test_executor import FakeClock, group_members, h, until  # noqa: F401  (fixture)
from tests.test_worker_daemon import (CLOCK, NODE, WAIT, FakeExecutor, Rig, head_bus, launch_body, make_cfg,
                                      worker_bus)


# -- the wrapper enforces the lease by itself ---------------------------------------------------

async def test_the_wrapper_kills_its_job_when_the_lease_file_is_not_renewed(h, tmp_path):
    lease_dir = tmp_path / "lease"
    lease_dir.mkdir()
    leases.save(str(lease_dir), time.monotonic() + 1.0)
    ex = h.executor()
    ex.lease_file = str(lease_dir / leases.FILE_NAME)
    await ex.start()
    await ex.launch(h.launch("echo ready; sleep 600 & wait"))
    await h.output("gpud-1.out", "ready")
    pid = h.pid(1)
    outcome = await h.outcome(1)          # nobody killed it but its own wrapper
    assert outcome.reason == "lease_expired" and outcome.signal == signal.SIGKILL
    assert time.monotonic() >= leases.load(str(lease_dir))
    await until(lambda: group_members(pid) == [], what="the job's group to be gone")


async def test_a_renewed_lease_keeps_the_job(h, tmp_path):
    lease_dir = tmp_path / "lease"
    lease_dir.mkdir()
    leases.save(str(lease_dir), time.monotonic() + 0.6)
    ex = h.executor()
    ex.lease_file = str(lease_dir / leases.FILE_NAME)
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 5"))
    await h.output("gpud-1.out", "ready")
    end = time.monotonic() + 2.0
    while time.monotonic() < end:         # renewed, as heartbeats' answers do, past the first end
        leases.save(str(lease_dir), time.monotonic() + 0.6)
        await asyncio.sleep(0.1)
    assert ex.running() == [(1, 0)]
    (h.work_dir / "go").touch()
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code) == ("exited", 5)


async def test_a_wall_clock_step_times_out_nothing(h):
    wall = FakeClock()
    ex = h.executor(clock=wall, mono=time.monotonic)
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 0", time_limit=600))
    await h.output("gpud-1.out", "ready")
    wall.advance(3600)                    # +1 h on the worker's wall clock
    await asyncio.sleep(0.2)              # several of the executor's 0.05 s checks
    assert ex.running() == [(1, 0)]
    (h.work_dir / "go").touch()
    assert (await h.outcome(1)).reason == "exited"


# -- the daemon --------------------------------------------------------------------------------

class Mono:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


async def daemon_rig(tmp_path, mono: Mono, *, answer: bool = True):
    broker = MemoryBroker()
    head = head_bus(broker, HEAD_EVENTS, node_status(NODE))
    wbus = worker_bus(broker)
    executors: list[FakeExecutor] = []
    await head.__aenter__()
    await wbus.__aenter__()
    r = Rig(worker=None, executor=None, head=head, broker=broker)  # type: ignore[arg-type]
    r.lease_period = 60.0 if answer else None

    async def collect():
        async for m in head.messages():
            await r.received(m)

    r.collector = asyncio.create_task(collect())  # type: ignore[attr-defined]
    r.worker = Worker(make_cfg(tmp_path), wbus, SimBackend("2xH100-80GB", NODE),
                      executor_factory=lambda *a, **kw: executors.append(FakeExecutor(*a, **kw)) or executors[-1],
                      clock=lambda: CLOCK, mono=mono)
    r.runner = asyncio.create_task(r.worker.run())
    await asyncio.wait_for(r.worker.ready.wait(), WAIT)
    r.executor = executors[0]
    await r.wait("heartbeat")
    return r


async def close_rig(r) -> None:
    r.worker.stop()
    await asyncio.wait_for(r.runner, WAIT)
    r.collector.cancel()
    await asyncio.gather(r.collector, return_exceptions=True)
    await r.head.__aexit__(None, None, None)


async def test_no_launch_starts_before_the_head_answers_and_stale_ones_never(tmp_path):
    mono = Mono()
    r = await daemon_rig(tmp_path, mono)
    try:
        await r.leased()
        seq = r.seen("heartbeat")[-1].body["seq"]
        assert os.path.exists(os.path.join(r.worker.state_dir, leases.FILE_NAME))
        # granted on that heartbeat and still within its lease: started
        await r.command("launch", launch_body(1) | {"lease": {"seq": seq}})
        await r.wait("started")
        # the same grant once its lease has lapsed (sent 61 s ago, 60 s lease): never started
        mono.t += 61
        await r.command("launch", launch_body(2) | {"lease": {"seq": seq}})
        await r.barrier()
        assert ("launch", 2, 1) not in r.executor.calls
    finally:
        await close_rig(r)


async def test_the_worker_kills_its_jobs_when_the_lease_lapses(tmp_path):
    mono = Mono()
    r = await daemon_rig(tmp_path, mono)
    try:
        await r.leased()
        await r.command("launch", launch_body(1))
        await r.wait("started")
        r.lease_period = None              # the head goes silent
        mono.t += 59                        # within the lease: nothing happens
        r.worker.fencing.changed.set()
        await asyncio.sleep(0.05)
        assert not [c for c in r.executor.calls if c[0] == "kill"]
        mono.t += 2                         # past it
        r.worker.fencing.changed.set()
        await until(lambda: ("kill", 1, 1, LEASE_EXPIRED) in r.executor.calls, WAIT, "the self-fencing kill")
    finally:
        await close_rig(r)


async def test_a_lost_time_limit_command_arrives_with_the_next_lease_answer(tmp_path):
    """An operator raised the limit and the ``time_limit`` command was lost: the head's next
    answer to a heartbeat lists every allocation's limit, and the worker takes the new one."""
    mono = Mono()
    r = await daemon_rig(tmp_path, mono)
    try:
        await r.leased()
        await r.command("launch", launch_body(1) | {"time_limit": 600.0})
        await r.wait("started")
        seq = r.seen("heartbeat")[-1].body["seq"]
        await r.command("lease", {"seq": seq, "period": 60.0, "allocs": [[1, 1]], "limits": [[1, 1, 600.0]]})
        await r.barrier()
        assert not [c for c in r.executor.calls if c[0] == "time_limit"]     # the same: nothing to do
        await r.command("lease", {"seq": seq, "period": 60.0, "allocs": [[1, 1]],
                                  "limits": [[1, 1, 7200.0], [9, 1, 5.0], ["bad"], [1, 1, -3]]})
        await until(lambda: ("time_limit", 1, 1, 7200.0) in r.executor.calls, WAIT, "the new limit")
        assert [c for c in r.executor.calls if c[0] == "time_limit"] == [("time_limit", 1, 1, 7200.0)]
    finally:
        await close_rig(r)


async def test_launches_queued_while_away_wait_for_the_heads_word(tmp_path):
    mono = Mono()
    r = await daemon_rig(tmp_path, mono, answer=False)
    try:
        # connected, but the head has not answered: launches are held, not started
        await r.command("launch", launch_body(1))
        await r.command("launch", launch_body(2))
        await r.barrier()
        assert not [c for c in r.executor.calls if c[0] == "launch"]
        # the head's answer names job 1 only (job 2 ended elsewhere meanwhile)
        hb = r.seen("heartbeat")[-1].body
        await r.command("lease", {"seq": hb["seq"], "period": 60.0, "allocs": [[1, 1]]})
        await r.wait("started")
        await r.barrier()
        assert ("launch", 1, 1) in r.executor.calls and ("launch", 2, 1) not in r.executor.calls
    finally:
        await close_rig(r)


async def test_a_wall_clock_step_on_the_worker_keeps_its_lease(tmp_path):
    wall = [CLOCK]
    mono = Mono()
    broker = MemoryBroker()
    head = head_bus(broker, HEAD_EVENTS, node_status(NODE))
    async with head, worker_bus(broker) as wbus:
        r = Rig(worker=None, executor=None, head=head, broker=broker)  # type: ignore[arg-type]

        async def collect():
            async for m in head.messages():
                await r.received(m)

        collector = asyncio.create_task(collect())
        ex: list[FakeExecutor] = []
        r.worker = Worker(make_cfg(tmp_path), wbus, SimBackend("2xH100-80GB", NODE),
                          executor_factory=lambda *a, **kw: ex.append(FakeExecutor(*a, **kw)) or ex[-1],
                          clock=lambda: wall[0], mono=mono)
        runner = asyncio.create_task(r.worker.run())
        await asyncio.wait_for(r.worker.ready.wait(), WAIT)
        r.executor = ex[0]
        await r.leased()
        await r.command("launch", launch_body(1))
        await r.wait("started")
        wall[0] += 3600                      # +1 h on the wall clock
        r.worker.fencing.changed.set()
        await r.worker.heartbeat()
        await r.barrier()
        assert r.worker.fencing.lease.held(mono()) and not [c for c in r.executor.calls if c[0] == "kill"]
        r.worker.stop()
        await asyncio.wait_for(runner, WAIT)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
