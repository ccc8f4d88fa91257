"""The worker daemon over the in-memory bus, with sim GPUs and a recording fake executor."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pytest

from gpud.bus.base import HEAD_EVENTS, HEAD_STATUS, Message, node_cmd, node_status
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.bus.messages import encode
from gpud.bus.mqtt import MqttBus
from gpud.config import BrokerConfig, Config, WorkerConfig
from gpud.gpu.sim import SimBackend
from gpud.keys import generate_key, load_key
from gpud.worker.daemon import Worker, run_worker, worker_sender, worker_subscriptions, worker_will
from gpud.worker.nodeinfo import primary_address
from gpud.worker.executor import Outcome
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

NODE = "n1"
CLOCK = 1_700_000_000.0
SLOW = 3600.0  # a heartbeat interval that never fires during a test
WAIT = 10.0    # generous timeout for conditions that should hold almost at once
KEY = bytes(range(32))
CLUSTER = "test"


class FakeExecutor:
    """The executor's API, recording every call; tests decide when jobs finish."""

    def __init__(self, state_dir: str, node: str, *, on_started: Callable, on_finished: Callable,
                 clock: Callable[[], float]) -> None:
        self.state_dir, self.node = state_dir, node
        self.on_started, self.on_finished, self.clock = on_started, on_finished, clock
        self.calls: list[tuple] = []
        self.jobs: dict[tuple[int, int], Any] = {}
        self.done: dict[tuple[int, int], Outcome] = {}
        self.launch_gate: asyncio.Event | None = None   # when set by a test, launch() waits on it
        self.in_launch = asyncio.Event()

    async def start(self) -> None:
        self.calls.append(("start",))

    async def launch(self, launch: Any) -> None:
        key = (launch.job_id, launch.attempt)
        self.calls.append(("launch",) + key)
        self.in_launch.set()
        if self.launch_gate is not None:
            await self.launch_gate.wait()
        if key in self.jobs or key in self.done:
            return  # a repeat
        self.jobs[key] = launch
        self.on_started(launch.job_id, launch.attempt, 4000 + launch.job_id, self.clock())
        self.calls.append(("launched",) + key)

    async def signal(self, job: int, attempt: int, sig: str = "TERM", grace: float | None = None,
                     reason: str = "cancelled") -> bool:
        self.calls.append(("signal", job, attempt, sig, grace, reason))
        return (job, attempt) in self.jobs

    async def kill(self, job: int, attempt: int, reason: str = "killed") -> bool:
        self.calls.append(("kill", job, attempt, reason))
        return (job, attempt) in self.jobs

    def running(self) -> list[tuple[int, int]]:
        return sorted(self.jobs)

    def held_time_limit(self, job: int, attempt: int) -> tuple[float | None] | None:
        launch = self.jobs.get((job, attempt))
        return None if launch is None else (launch.time_limit,)

    async def set_time_limit(self, job: int, attempt: int, limit: float | None) -> bool:
        self.calls.append(("time_limit", job, attempt, limit))
        if (job, attempt) not in self.jobs:
            return False
        self.jobs[(job, attempt)] = replace(self.jobs[(job, attempt)], time_limit=limit)
        return True

    def outcomes(self) -> list[Outcome]:
        return list(self.done.values())

    def ack(self, job: int, attempt: int) -> None:
        self.calls.append(("ack", job, attempt))
        self.done.pop((job, attempt), None)

    async def close(self) -> None:
        self.calls.append(("close",))

    def finish(self, job: int, attempt: int, exit_code: int = 0) -> Outcome:
        self.jobs.pop((job, attempt))
        o = Outcome(job, attempt, exit_code, None, "exited", "", CLOCK, CLOCK + 5)
        self.done[(job, attempt)] = o
        self.on_finished(o)
        return o

    def commands(self) -> list[tuple]:
        return [c for c in self.calls if c[0] not in ("start", "close")]


def launch_body(job: int, attempt: int = 1) -> dict:
    """What the head sends in a ``launch``."""
    return {
        "job_id": job, "attempt": attempt, "name": f"job{job}", "user": "alice", "uid": 1000,
        "gid": 1000, "script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp", "stdout": None,
        "stderr": None, "env": {}, "gpus": [{"index": 0, "uuid": "GPU-x"}], "cpus": 1,
        "mem_mb": 1024, "time_limit": None, "kill_grace": 5.0, "submit_dir": "/tmp", "extra_env": {},
    }


@dataclass
class Rig:
    worker: Worker
    executor: FakeExecutor
    head: MemoryBus
    broker: MemoryBroker
    runner: asyncio.Task | None = None
    inbox: list[Message] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    # As the head does: every heartbeat is answered with a lease naming the allocations the
    # test launched (None: the test answers, or not, itself).
    lease_period: float | None = 3600.0
    launched: set[tuple[int, int]] = field(default_factory=set)

    async def received(self, m: Message) -> None:
        async with self.changed:
            self.inbox.append(m)
            self.changed.notify_all()
        if m.kind == "heartbeat" and self.lease_period is not None and "seq" in m.body:
            await self.command("lease", {"seq": m.body["seq"], "period": self.lease_period,
                                         "allocs": [list(k) for k in sorted(self.launched)]})

    async def leased(self) -> None:
        """Returns once the worker holds a lease and no longer holds launches back."""
        async def held():
            while self.worker.fencing.hold_from is not None or not self.worker.fencing.lease.held(self.worker.mono()):
                await asyncio.sleep(0.005)
        await asyncio.wait_for(held(), WAIT)

    def seen(self, kind: str, pred: Callable[[dict], bool] = lambda b: True) -> list[Message]:
        return [m for m in self.inbox if m.kind == kind and pred(m.body)]

    async def wait(self, kind: str, pred: Callable[[dict], bool] = lambda b: True, *, count: int = 1,
                   after: int = 0) -> list[Message]:
        """The first ``count`` matching messages among those received after index ``after``."""
        def found():
            hits = [m for m in self.inbox[after:] if m.kind == kind and pred(m.body)]
            return hits if len(hits) >= count else None

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(found), WAIT)
        return found()

    async def command(self, kind: str, body: dict) -> None:
        if kind == "launch" and isinstance(body, dict) and \
                all(type(body.get(k)) is int for k in ("job_id", "attempt")):
            self.launched.add((body["job_id"], body["attempt"]))
        await self.head.publish(node_cmd(NODE), kind, body)

    async def barrier(self) -> None:
        """Returns once the worker has handled every command sent before it (they are ordered)."""
        mark = len(self.inbox)
        await self.command("hello", {})
        await self.wait("register", after=mark)


def make_cfg(tmp_path, heartbeat: float = SLOW) -> Config:
    return Config(cluster=CLUSTER, state_dir=str(tmp_path), key_file=str(tmp_path / "cluster.key"),
                  worker=WorkerConfig(name=NODE, sim="2xH100-80GB", heartbeat_interval=heartbeat,
                                      cpus=8, mem_mb=64000))


async def answer_heartbeat(head: Any, m: Message, allocs: list[list[int]], period: float = 3600.0) -> None:
    """What the head does with a heartbeat: answer it with a lease."""
    if m.kind == "heartbeat" and "seq" in m.body:
        await head.publish(node_cmd(NODE), "lease", {"seq": m.body["seq"], "period": period, "allocs": allocs})


def worker_bus(broker: MemoryBroker, name: str = NODE) -> MemoryBus:
    return MemoryBus(broker, CLUSTER, worker_sender(name), KEY, subscriptions=worker_subscriptions(name),
                     will=worker_will(name))


def head_bus(broker: MemoryBroker, *subscriptions: str, sender: str = "head") -> MemoryBus:
    return MemoryBus(broker, CLUSTER, sender, KEY, subscriptions=subscriptions)


@pytest.fixture
def heartbeat() -> float:
    return SLOW


@pytest.fixture
async def rig(tmp_path, heartbeat):
    broker = MemoryBroker()
    head = head_bus(broker, HEAD_EVENTS, node_status(NODE))
    wbus = worker_bus(broker)
    executors: list[FakeExecutor] = []

    def factory(*a, **kw):
        executors.append(FakeExecutor(*a, **kw))
        return executors[-1]

    async with head, wbus:
        r = Rig(worker=None, executor=None, head=head, broker=broker)  # type: ignore[arg-type]

        async def collect():
            async for m in head.messages():
                await r.received(m)

        collector = asyncio.create_task(collect())
        r.worker = Worker(make_cfg(tmp_path, heartbeat), wbus, SimBackend("2xH100-80GB", NODE),
                          executor_factory=factory, clock=lambda: CLOCK)
        r.runner = runner = asyncio.create_task(r.worker.run(), name="worker")
        await asyncio.wait_for(r.worker.ready.wait(), WAIT)
        r.executor = executors[0]
        await r.wait("heartbeat")  # announced
        await r.leased()
        try:
            yield r
        finally:
            r.worker.stop()
            await asyncio.wait_for(runner, WAIT)
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)


# -- connecting ---------------------------------------------------------------------------------

async def test_announces_itself_on_connect(rig, tmp_path):
    kinds = [m.kind for m in rig.inbox]
    assert kinds[:3] == ["node_status", "register", "heartbeat"]
    status = rig.inbox[0]
    assert status.topic == node_status(NODE) and status.body == {"v": 1, "state": "online"}
    assert all(m.sender == worker_sender(NODE) for m in rig.inbox)
    node = rig.seen("register")[0].body["node"]
    sim = SimBackend("2xH100-80GB", NODE).discover()
    assert node == {
        "name": NODE, "cpus": 8, "mem_mb": 64000, "labels": {"addr": primary_address()},
        "gpus": [g.to_dict() for g in sim],
    }
    assert rig.executor.state_dir == str(tmp_path / "worker" / NODE)
    assert rig.executor.node == NODE


async def test_online_status_is_retained(rig):
    late = head_bus(rig.broker, node_status(NODE), sender="monitor")
    async with late:
        msg = await asyncio.wait_for(anext(aiter(late.messages())), WAIT)
    assert msg.kind == "node_status" and msg.body == {"v": 1, "state": "online"} and msg.retained


async def test_reconnect_announces_again(rig):
    rig.broker.disconnect(worker_sender(NODE))
    await rig.wait("node_status", lambda b: b["state"] == "offline")   # its last will
    mark = len(rig.inbox)
    rig.broker.reconnect(worker_sender(NODE))
    await rig.wait("heartbeat", after=mark)
    assert [(m.kind, m.body.get("state")) for m in rig.inbox[mark:mark + 2]] == [
        ("node_status", "online"), ("register", None)]


async def test_broker_restart_announces_again(rig):
    rig.broker.stop()
    rig.broker.start()
    mark = len(rig.inbox)
    await rig.wait("register", after=mark)
    await rig.wait("heartbeat", after=mark)


async def test_head_online_makes_it_register_again(rig):
    mark = len(rig.inbox)
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
    await rig.wait("register", after=mark)


async def test_hello_makes_it_register_and_heartbeat(rig):
    mark = len(rig.inbox)
    await rig.command("hello", {})
    await rig.wait("register", after=mark)
    await rig.wait("heartbeat", after=mark)


# -- commands -----------------------------------------------------------------------------------

async def test_launch_from_the_head_runs_and_reports_started(rig):
    await rig.command("launch", launch_body(7, 2))
    started = (await rig.wait("started"))[0]
    assert started.body == {"v": 1, "job": 7, "attempt": 2, "pid": 4007, "time": CLOCK}
    assert rig.executor.commands() == [("launch", 7, 2), ("launched", 7, 2)]


async def test_repeated_launch_is_passed_on_for_the_executor_to_ignore(rig):
    await rig.command("launch", launch_body(7))
    await rig.command("launch", launch_body(7))
    await rig.barrier()
    assert rig.executor.commands() == [("launch", 7, 1), ("launched", 7, 1), ("launch", 7, 1)]
    assert len(rig.seen("started")) == 1


async def test_commands_from_anyone_but_the_head_are_dropped(rig, caplog):
    rogue = head_bus(rig.broker, sender="worker:evil")
    async with rogue:
        await rogue.publish(node_cmd(NODE), "launch", launch_body(7))
        await rogue.publish(node_cmd(NODE), "kill", {"allocs": [[1, 1]], "reason": "x"})
        await rogue.publish(HEAD_STATUS, "head_status", {"state": "online"})
    await rig.barrier()
    assert rig.executor.commands() == []
    assert "dropped launch from worker:evil: only the head may command workers" in caplog.text


GARBAGE = [
    ("launch", {}),
    ("launch", {"job_id": "seven", "attempt": 1}),
    ("launch", {"job_id": 7}),
    ("signal", {}),
    ("signal", {"job": "1", "attempt": 1}),
    ("signal", {"job": 1, "attempt": -1}),
    ("signal", {"job": 1, "attempt": 1, "signal": ["TERM"]}),
    ("signal", {"job": 1, "attempt": 1, "signal": "TERM", "grace": -5}),
    ("signal", {"job": 1, "attempt": 1, "signal": "TERM", "grace": "soon"}),
    ("signal", {"job": True, "attempt": 1}),
    ("kill", {"allocs": "all"}),
    ("kill", {"allocs": [[1]]}),
    ("kill", {"allocs": [[1, 1]], "reason": {"why": 1}}),
    ("kill", {}),
    ("ack", {"done": [[1, None]]}),
    ("ack", {"done": {"1": 1}}),
    ("frobnicate", {"job": 1}),
    ("launch", {"job_id": 1, "attempt": 1, "script": {"nested": [[[[]]]]} }),
]


async def test_garbage_bodies_are_dropped_and_the_worker_keeps_running(rig, caplog):
    caplog.set_level(logging.WARNING, logger="gpud.worker")
    for kind, body in GARBAGE:
        await rig.command(kind, body)
    await rig.barrier()
    assert rig.executor.commands() == []
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == len(GARBAGE)
    assert all("\n" not in r.getMessage() and r.exc_info is None for r in dropped)
    # still alive and obeying
    await rig.command("launch", launch_body(3))
    await rig.wait("started")


async def test_handle_survives_bodies_the_bus_would_never_deliver(rig, caplog):
    for body in (None, [], "x", 5):
        for kind in ("launch", "signal", "kill", "ack", "hello"):
            await rig.worker.handle(Message(node_cmd(NODE), kind, "head", "id", CLOCK, body))  # type: ignore[arg-type]
        await rig.worker.handle(Message(HEAD_STATUS, "head_status", "head", "id", CLOCK, body))  # type: ignore[arg-type]
    await rig.worker.handle(Message("node/other/cmd", "launch", "head", "id", CLOCK, launch_body(1)))
    assert rig.executor.commands() == []


async def test_executor_failure_is_logged_not_fatal(rig, caplog):
    async def broken(launch):
        raise OSError("disk full")

    rig.executor.launch = broken
    await rig.command("launch", launch_body(1))
    await rig.barrier()
    assert "failed to handle launch from head: OSError: disk full" in caplog.text


async def test_signal_is_routed_to_the_executor(rig):
    await rig.command("launch", launch_body(1))
    await rig.command("signal", {"job": 1, "attempt": 1, "signal": "TERM", "grace": 5, "reason": "preempted"})
    await rig.command("signal", {"job": 2, "attempt": 1, "signal": "USR1", "grace": None, "reason": "time limit"})
    await rig.barrier()
    assert [c for c in rig.executor.commands() if c[0] == "signal"] == [
        ("signal", 1, 1, "TERM", 5, "preempted"), ("signal", 2, 1, "USR1", None, "time limit")]


async def test_kill_fences_every_listed_allocation(rig):
    await rig.command("kill", {"allocs": [[1, 1], [9, 3]], "reason": "fenced"})
    await rig.barrier()
    assert rig.executor.commands() == [("kill", 1, 1, "fenced"), ("kill", 9, 3, "fenced")]


# -- heartbeats and results ---------------------------------------------------------------------

async def test_heartbeat_reports_running_and_unacked_allocations(rig):
    for job in (1, 2):
        await rig.command("launch", launch_body(job))
    await rig.wait("started", count=2)
    rig.executor.finish(1, 1, exit_code=3)
    mark = len(rig.inbox)
    await rig.worker.heartbeat()
    hb = (await rig.wait("heartbeat", after=mark))[0]
    assert {k: v for k, v in hb.body.items() if k != "seq"} == {"v": 1, "running": [[2, 1]], "done": [[1, 1]]}


async def test_finished_is_published_when_the_job_ends(rig):
    await rig.command("launch", launch_body(1))
    await rig.wait("started")
    o = rig.executor.finish(1, 1, exit_code=3)
    msg = (await rig.wait("finished"))[0]
    assert msg.topic == HEAD_EVENTS and (msg.kind, msg.body) == encode(o.finished())


@pytest.mark.parametrize("heartbeat", [0.02])
async def test_finished_is_repeated_until_acked(rig):
    await rig.command("launch", launch_body(1))
    await rig.wait("started")
    rig.executor.finish(1, 1)
    is_job1 = lambda b: b.get("job") == 1
    await rig.wait("finished", is_job1, count=3)          # the first report and repeats
    await rig.command("ack", {"done": [[1, 1]]})
    mark = len(rig.inbox)
    # once a heartbeat shows the ack, no more repeats
    await rig.wait("heartbeat", lambda b: b["done"] == [], after=mark)
    settled = len(rig.inbox)
    await rig.wait("heartbeat", count=2, after=settled)
    assert not [m for m in rig.inbox[settled:] if m.kind == "finished"]
    assert ("ack", 1, 1) in rig.executor.calls


async def test_repeats_pause_while_the_head_is_offline(rig):
    await rig.command("launch", launch_body(1))
    await rig.wait("started")
    rig.executor.finish(1, 1)
    await rig.wait("finished")
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "offline"}, retain=True)
    await rig.barrier()
    mark = len(rig.inbox)
    await rig.worker.heartbeat()
    await rig.barrier()
    assert [m.kind for m in rig.inbox[mark:]] == ["heartbeat", "register", "heartbeat"]
    assert rig.inbox[mark].body["done"] == [[1, 1]]       # still reported, just not repeated
    mark = len(rig.inbox)
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
    await rig.wait("finished", after=mark)                 # the head is back: resent at once


@pytest.mark.parametrize("heartbeat", [0.02])
async def test_heartbeats_are_periodic(rig):
    await rig.wait("heartbeat", count=3, after=len(rig.inbox))


# -- stopping -----------------------------------------------------------------------------------

async def test_graceful_stop_leaves_jobs_running_and_says_offline(tmp_path):
    broker = MemoryBroker()
    head = head_bus(broker, node_status(NODE))
    executors: list[FakeExecutor] = []
    wbus = worker_bus(broker)
    async with head, wbus:
        worker = Worker(make_cfg(tmp_path), wbus, SimBackend("1xA30-24GB", NODE),
                        executor_factory=lambda *a, **kw: executors.append(FakeExecutor(*a, **kw)) or executors[-1])
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), WAIT)
        worker.stop()
        await asyncio.wait_for(runner, WAIT)
        statuses = []
        async for m in head.messages():
            statuses.append(m.body["state"])
            if m.body["state"] == "offline":
                break
    assert statuses[-1] == "offline"
    assert executors[0].calls[-1] == ("close",)
    assert not [c for c in executors[0].calls if c[0] == "kill"]


async def test_stop_waits_for_a_launch_in_progress(rig):
    rig.executor.launch_gate = asyncio.Event()
    await rig.command("launch", launch_body(5))
    await asyncio.wait_for(rig.executor.in_launch.wait(), WAIT)
    rig.worker.stop()
    commands = next(t for t in asyncio.all_tasks() if t.get_name() == "commands")
    await asyncio.wait_for(asyncio.wait({commands}), WAIT)   # the loop is gone ...
    rig.executor.launch_gate.set()                          # ... yet the launch completes
    await asyncio.wait_for(asyncio.wait({rig.runner}), WAIT)
    assert ("launched", 5, 1) in rig.executor.calls
    assert rig.executor.calls.index(("launched", 5, 1)) < rig.executor.calls.index(("close",))


async def test_second_stop_skips_the_goodbye(tmp_path):
    broker = MemoryBroker()
    wbus = worker_bus(broker)
    executors: list[FakeExecutor] = []
    async with wbus:
        worker = Worker(make_cfg(tmp_path), wbus, SimBackend("1xA30-24GB", NODE),
                        executor_factory=lambda *a, **kw: executors.append(FakeExecutor(*a, **kw)) or executors[-1])
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), WAIT)
        worker.stop()
        worker.stop()
        await asyncio.wait_for(runner, WAIT)
    assert executors[0].calls[-1] == ("close",)


# -- run_worker ---------------------------------------------------------------------------------

async def test_run_worker_without_a_key_is_a_one_line_error(tmp_path, capsys):
    cfg = make_cfg(tmp_path)
    assert await run_worker(cfg, install_signals=False) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"gpud worker: error: cluster key {cfg.key_file} not found")


async def test_run_worker_with_a_bad_sim_spec_is_a_one_line_error(tmp_path, capsys):
    cfg = make_cfg(tmp_path)
    generate_key(cfg.key_file)
    cfg = replace(cfg, worker=replace(cfg.worker, sim="eight H100s"))
    assert await run_worker(cfg, install_signals=False) == 1
    assert capsys.readouterr().err == (
        "gpud worker: error: invalid --sim spec 'eight H100s': use COUNTxMODEL[,COUNTxMODEL...], "
        "e.g. 8xH100-80GB\n")


async def test_run_worker_over_a_real_mosquitto(tmp_path, mosquitto):
    """The production wiring: MqttBus from the config, the key file, the sim backend."""
    cfg = replace(make_cfg(tmp_path), broker=BrokerConfig(url=mosquitto.url))
    generate_key(cfg.key_file)
    key = load_key(cfg.key_file)
    executors: list[FakeExecutor] = []
    workers: list[Worker] = []
    head = MqttBus(mosquitto.url, CLUSTER, "head", key, subscriptions=[HEAD_EVENTS, node_status(NODE)])
    async with head:
        await asyncio.wait_for(head.wait_connected(), WAIT)
        messages = aiter(head.messages())

        async def next_of(kind: str, pred: Callable[[dict], bool] = lambda b: True) -> Message:
            while True:
                m = await asyncio.wait_for(anext(messages), WAIT)
                await answer_heartbeat(head, m, [[11, 1]])
                if m.kind == kind and pred(m.body):
                    return m

        runner = asyncio.create_task(run_worker(
            cfg, install_signals=False, on_worker=workers.append,
            executor_factory=lambda *a, **kw: executors.append(FakeExecutor(*a, **kw)) or executors[-1]))
        register = await next_of("register")
        assert register.sender == worker_sender(NODE)
        assert len(register.body["node"]["gpus"]) == 2
        await next_of("heartbeat")                   # answered: the worker holds a lease
        await head.publish(node_cmd(NODE), "launch", launch_body(11))
        started = await next_of("started")
        assert started.body["job"] == 11
        workers[0].stop()
        await next_of("node_status", lambda b: b["state"] == "offline")
        assert await asyncio.wait_for(runner, WAIT) == 0
    assert executors[0].calls[-1] == ("close",)


async def test_a_real_job_with_the_real_executor(tmp_path):
    """Worker + real Executor + a real process: started, finished, repeated, acked."""
    import pwd

    me = pwd.getpwuid(os.getuid())
    broker = MemoryBroker()
    head = head_bus(broker, HEAD_EVENTS)
    async with head, worker_bus(broker) as wbus:
        worker = Worker(make_cfg(tmp_path, heartbeat=0.05), wbus, SimBackend("1xA30-24GB", NODE))
        runner = asyncio.create_task(worker.run())
        inbox = aiter(head.messages())

        async def next_of(kind: str) -> Message:
            while True:
                m = await asyncio.wait_for(anext(inbox), WAIT)
                await answer_heartbeat(head, m, [[21, 1]])
                if m.kind == kind:
                    return m

        await next_of("heartbeat")                   # answered: the worker holds a lease
        body = launch_body(21) | {"user": me.pw_name, "uid": me.pw_uid, "gid": me.pw_gid,
                                  "script": "#!/bin/sh\nexit 3\n", "work_dir": str(tmp_path)}
        await head.publish(node_cmd(NODE), "launch", body)
        assert (await next_of("started")).body["job"] == 21
        finished = await next_of("finished")
        assert finished.body["exit_code"] == 3 and finished.body["job"] == 21
        assert (await next_of("finished")).body["job"] == 21          # repeated ...
        await head.publish(node_cmd(NODE), "ack", {"done": [[21, 1]]})
        while (await next_of("heartbeat")).body["done"]:               # ... until acked
            pass
        worker.stop()
        await asyncio.wait_for(runner, WAIT)


async def test_the_heads_periodic_online_changes_nothing_once_known(rig):
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "online"}, retain=True)
    await rig.wait("register", after=len(rig.inbox))
    await rig.barrier()
    mark = len(rig.inbox)
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "online", "refresh": True}, retain=True)
    await rig.barrier()
    assert [m.kind for m in rig.inbox[mark:]].count("register") == 1   # the barrier's own
    # After an offline, a refresh is news: the head is back.
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "offline"}, retain=True)
    await rig.barrier()
    mark = len(rig.inbox)
    await rig.head.publish(HEAD_STATUS, "head_status", {"state": "online", "refresh": True}, retain=True)
    await rig.wait("register", after=mark)
