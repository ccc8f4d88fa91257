"""The worker daemon (``gpud worker``): one per GPU host, it runs what the head assigns.

Theory of operation
-------------------
The worker is a thin, stateless shell between the bus and the executor; the executor owns
the jobs and their outcomes (on disk), so the worker can stop and start again while jobs
keep running.  Four tasks share one TaskGroup:

``connection``  on every (re)connect to the broker: the retained ``node_status`` online,
                ``register`` with the node's resources, and a heartbeat at once.
``heartbeat``   every ``heartbeat_interval``: ``heartbeat`` {running, done}, then every
                outcome the head has not acknowledged goes out again as ``finished``.
                Results therefore survive any head or broker outage; the head's ``ack``
                ends the repeats.  While the head's retained status says offline the
                repeats pause (they would only fill the broker's queue), and its return
                brings a ``register`` and a full heartbeat.
``commands``    messages on ``node/<name>/cmd`` from the head: ``launch``, ``signal``,
                ``kill`` (fencing: allocations the head no longer gives this node), ``ack``,
                ``hello`` (the head wants a fresh ``register``) and ``mig`` (re-lay a
                dynamic MIG GPU; a ``register`` follows); plus ``head_status``, whose
                "online" also triggers a ``register``.
``lease``       the lease from the head (gpud.worker.lease, kept by gpud.worker.fencing):
                each heartbeat carries a number, the head's ``lease`` answer renews the
                lease from that heartbeat's send time; when it lapses every allocation is
                killed (self-fencing).  Launches are started only under a lease that
                holds, and after every (re)connect the launches that arrive are held
                until the head's first answer says which allocations are still this
                node's.
``outbox``      publishes what the executor reports (``started``, ``finished``) in the
                order it happened, so executor callbacks never wait on the network.

GPU sharing (gpud.worker.gpumodes): before the loops start, each GPU is brought to its
configured mode (MIG layouts, MIG off for the others), and ``register`` reports modes and
slices as they are.  A launch on MPS shares gets the MPS environment (the first job of a
user starts the GPU's control daemon); one the GPUs cannot take ends as launch_failed.
After every job end the daemons of GPUs left without jobs stop and layouts that waited for
busy slices are completed.

Multi-node jobs: the node reports ``labels["addr"]`` (``[worker] address``, else its primary
IPv4 address) for MASTER_ADDR; ranks after the first arrive as ordinary launches of a
holder script.  ``step`` and ``step_kill`` start and end ``gpuctl srun`` tasks
(gpud.worker.steps, reached through gpud.worker.steprelay); a job's stop signals reach its
tasks too, and the end of its allocation here kills them.  A step this node refuses is
answered with a ``step_exit`` (srun waits for one), and tasks a previous worker left are
killed at start.  The node's resources and address: gpud.worker.nodeinfo.

Every message is at-least-once, so every handler tolerates repeats, and nothing in a
message body is trusted: each is read with ``gpud.bus.messages.decode``, and one of the
wrong shape is logged in one line and dropped.  Only the sender ``head`` may command a
worker; the bus has already verified signatures.

Stopping: the first ``stop()`` flushes the outbox briefly, publishes ``node_status``
offline (the same message the last will would send) and leaves; jobs keep running and the
next worker on this host picks them up from the executor's state.  A second ``stop()``
skips the niceties.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Iterable

from ..bus.base import HEAD_EVENTS, HEAD_STATUS, Bus, Message, Will, node_cmd, node_status
from ..bus.messages import (Ack, Body, HeadStatus, Heartbeat, Hello, Kill, Launch, Lease, MessageError, MigRelayout,
                            NodeStatus, Register, Signal, Started, StepStart, TimeLimit, decode)
from ..config import Config
from ..gpu.backend import GpuBackend, GpuError
from . import gpumodes, lease as leases
from .fencing import Fencing
from .launch import Outcome, parse_signal
from .nodeinfo import build_node_info
from .steprelay import StepRelay

log = logging.getLogger("gpud.worker")

HEAD_SENDER = "head"
SHUTDOWN_FLUSH_TIMEOUT = 2.0   # seconds to spend sending the last messages at a graceful stop
MAX_RESENDS_PER_HEARTBEAT = 256  # unacked results repeated per heartbeat; the rest next time
_CANCEL_ROUNDS = 100           # see _cancel_all


def worker_sender(name: str) -> str:
    return f"worker:{name}"


def worker_subscriptions(name: str) -> list[str]:
    return [node_cmd(name), HEAD_STATUS]


def worker_will(name: str) -> Will:
    return Will.of(node_status(name), NodeStatus("offline"))


def default_executor_factory(state_dir: str, node: str, **kw: Any) -> Any:
    from .executor import Executor

    return Executor(state_dir, node, **kw)


class Worker:
    def __init__(self, cfg: Config, bus: Bus, backend: GpuBackend, *,
                 executor_factory: Callable[..., Any] = default_executor_factory,
                 clock: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.mono = mono      # the lease and every timeout; ``clock`` only for dates
        self.bus = bus
        self.backend = backend
        self.clock = clock
        self.node = build_node_info(cfg, backend)
        self.name = self.node.name
        self.state_dir = os.path.join(cfg.state_dir, "worker", self.name)
        self.gpus = gpumodes.from_config(cfg, backend, self.name, self.state_dir, clock=clock)
        self._background: set[asyncio.Task] = set()    # job-end clean-ups in flight
        self.executor: Any = None
        self.steps: Any = None                          # gpuctl srun tasks (gpud.worker.steps)
        self._executor_factory = executor_factory
        self._cmd_topic = node_cmd(self.name)
        self._users: dict[tuple[int, int], str] = {}   # for log lines only
        self._outbox: asyncio.Queue[Body] = asyncio.Queue()
        self._connected = asyncio.Event()   # set by the bus's on_connect hook
        self._in_flight: asyncio.Task | None = None   # the message being handled
        self._launching: set[asyncio.Task] = set()     # launches in flight, waited for on stop
        self._head_online: bool | None = None          # from head_status; None: not heard yet
        self.fencing = Fencing(self.name, self.state_dir, mono=lambda: self.mono(), executor=lambda: self.executor)
        self.step_relay = StepRelay(self.name, lambda: self.steps, lambda topic, msg: self._publish(topic, msg))
        self._commands: dict[type, Callable[[Any], Awaitable[None]]] = {
            Launch: self._cmd_launch, Lease: self._cmd_lease, Signal: self._cmd_signal, Kill: self._cmd_kill,
            Ack: self._cmd_ack, Hello: self._cmd_hello, MigRelayout: self._cmd_mig, TimeLimit: self._cmd_time_limit,
            **self.step_relay.handlers(),
        }
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self.ready = asyncio.Event()         # set once the executor runs and the tasks are up

    def _cpu_binder(self) -> Any:
        """Binds jobs to their GPUs' NUMA node's CPUs ([worker] cpu_bind); None: no binding."""
        from ..gpu.topology import SIM_NUMA_NODES
        from .cpubind import from_host

        sim_nodes = SIM_NUMA_NODES if self.backend.name == "sim" else None
        return from_host(self.cfg.worker.cpu_bind, sim_nodes, {g.index: g.numa_node for g in self.node.gpus})

    async def _confine(self) -> None:
        """Pick the cgroup hierarchy ([worker] cgroups), say once what jobs get, and hand it
        with the GPUs' device nodes to the executor; the node's labels say it too
        (``Confinement=`` in scontrol show node, the reason in sinfo -R)."""
        from .cgroups import detect, subtree_name

        if not hasattr(self.executor, "cgroups"):   # an executor without confinement (tests)
            return
        cg = await asyncio.to_thread(detect, self.cfg.worker.cgroups, subtree_name(self.name, self.state_dir))
        (log.info if cg.active else log.warning)("worker %s: %s", self.name, cg.describe())
        self.executor.cgroups = cg
        self.executor.max_tasks = self.cfg.worker.max_tasks_per_job or None
        devices = getattr(self.backend, "devices", None)
        if devices is not None:
            try:
                await asyncio.to_thread(devices)   # made (sim) and checked once at start
                self.executor.gpu_devices = devices
            except GpuError as e:
                log.warning("worker %s: GPU device nodes are not fenced: %s", self.name, e)
        labels = {k: v for k, v in self.node.labels.items() if not k.startswith("confinement")}
        labels["confinement"] = cg.kind
        if not cg.active:
            labels["confinement_reason"] = cg.reason
        self.node = replace(self.node, labels=labels)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until ``stop()``.  The caller owns the bus (``async with bus``)."""
        self.executor = self._executor_factory(
            self.state_dir, self.name, on_started=self._on_started,
            on_finished=self._on_finished, clock=self.clock)
        self.executor.cpu_binder = self._cpu_binder()   # before start(): adopted jobs keep their CPUs
        await self._confine()                           # before start(): adoption finds jobs by their cgroups
        self.executor.lease_file = os.path.join(self.state_dir, leases.FILE_NAME)   # the wrappers watch it
        await self.executor.start()
        self.fencing.resume()
        from .steps import StepTasks

        self.steps = StepTasks(self.name, getattr(self.executor, "task_setup", lambda job, attempt: None),
                               lambda msg: self._publish(HEAD_EVENTS, msg),
                               state_dir=os.path.join(self.state_dir, "steps"))
        await self.steps.recover()   # a previous worker's srun tasks: killed, reported (queued until connected)
        await self._apply_gpu_modes()
        # The bus calls this after every (re)connect; it only wakes the connection task.
        self.bus.on_connect = self._on_bus_connect  # type: ignore[attr-defined]
        log.info("worker %s up: %d GPUs (%s), %d CPUs, %d MB", self.name, len(self.node.gpus),
                 self.backend.name, self.node.cpus, self.node.mem_mb)
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [
                    tg.create_task(self._connection_loop(), name="connection"),
                    tg.create_task(self._heartbeat_loop(), name="heartbeat"),
                    tg.create_task(self._command_loop(), name="commands"),
                    tg.create_task(self._sampler().run(), name="telemetry"),
                    tg.create_task(self.fencing.run(), name="lease"),
                ]
                outbox = tg.create_task(self._outbox_loop(), name="outbox")
                self.ready.set()
                await self._stop.wait()
                await _cancel_all(loops)
                if self._in_flight is not None:
                    await self._wait_or_force(self._in_flight)
                for launching in list(self._launching):
                    await self._wait_or_force(launching)
                if not self._force.is_set():
                    await self._flush_and_say_goodbye()
                await _cancel_all([outbox])
        finally:
            await _cancel_all(self._background)
            if self.steps is not None:
                await self.steps.close()
            await self.executor.close()
            log.info("worker %s stopped; %d job(s) left running", self.name,
                     len(self.executor.running()))

    def stop(self) -> None:
        """First call: graceful stop.  Second call: stop without the goodbye messages."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    async def _on_bus_connect(self) -> None:
        self._connected.set()

    async def _flush_and_say_goodbye(self) -> None:
        async def goodbye() -> None:
            await self._outbox.join()
            await self._publish(node_status(self.name), NodeStatus("offline"), retain=True)

        await self._wait_or_force(asyncio.create_task(goodbye(), name="goodbye"), cancel=True)

    async def _wait_or_force(self, task: asyncio.Task, *, cancel: bool = False) -> None:
        """Wait for ``task`` until it ends, a second stop(), or SHUTDOWN_FLUSH_TIMEOUT."""
        force = asyncio.create_task(self._force.wait(), name="force")
        await asyncio.wait({task, force}, timeout=SHUTDOWN_FLUSH_TIMEOUT,
                           return_when=asyncio.FIRST_COMPLETED)
        await _cancel_all([task, force] if cancel else [force])

    # -- tasks --------------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        await self.bus.wait_connected()
        first, announced = True, None
        while True:
            self._connected.clear()
            # The hook also fires for the first connect, which may be the one just announced;
            # buses that count their connects let us skip that repeat.
            connects = getattr(self.bus, "connects", None)
            if first or connects is None or connects != announced:
                if not first:
                    log.info("worker %s reconnected to the broker", self.name)
                # Launches queued for us while we were away may be stale: hold what arrives
                # until the head answers this announcement's heartbeat.
                self.fencing.hold_launches()
                await self.announce()
                first, announced = False, connects
            await self._connected.wait()

    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.worker.heartbeat_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception as e:  # a bug here must not take the node's jobs offline
                log.error("worker %s: heartbeat failed: %s: %s", self.name, type(e).__name__, e,
                          exc_info=True)

    async def _command_loop(self) -> None:
        async for msg in self.bus.messages():
            # Shielded: a stop must not cut a launch or kill in half (a job started but not
            # recorded would be invisible to fencing).  run() waits for it instead.
            self._in_flight = asyncio.create_task(self.handle(msg), name=f"handle-{msg.kind}")
            await asyncio.shield(self._in_flight)
        log.warning("worker %s: the bus closed; stopping", self.name)
        self.stop()

    async def _outbox_loop(self) -> None:
        while True:
            msg = await self._outbox.get()
            try:
                await self._publish(HEAD_EVENTS, msg)
            finally:
                self._outbox.task_done()

    # -- what the worker says -----------------------------------------------------------------

    async def announce(self) -> None:
        await self._publish(node_status(self.name), NodeStatus("online"), retain=True)
        await self.register()
        await self.heartbeat()

    async def register(self) -> None:
        await self._publish(HEAD_EVENTS, Register(self.node))

    async def heartbeat(self) -> None:
        outcomes: list[Outcome] = list(self.executor.outcomes())
        await self._publish(HEAD_EVENTS, Heartbeat(
            seq=self.fencing.next_seq(), running=tuple((j, a) for j, a in self.executor.running()),
            done=tuple((o.job_id, o.attempt) for o in outcomes)))
        if self._head_online is False:
            return  # queued repeats would only pile up in the broker; "online" brings a resend
        for o in outcomes[:MAX_RESENDS_PER_HEARTBEAT]:  # until the head acks them
            await self._publish(HEAD_EVENTS, o.finished())

    async def _publish(self, topic: str, msg: Body, *, retain: bool = False) -> None:
        try:
            await self.bus.publish(topic, msg, retain=retain)
        except Exception as e:  # the bus queues while disconnected; anything else is logged
            log.warning("worker %s could not publish %s: %s", self.name, msg.KIND, e)

    # Executor callbacks: they must not block, so they only queue.

    def _on_started(self, job_id: int, attempt: int, pid: int, start_time: float) -> None:
        log.info("job %s.%s (user %s) started on %s: pid %s", job_id, attempt,
                 self._user(job_id, attempt), self.name, pid)
        self._outbox.put_nowait(Started(job_id, attempt, pid, start_time))

    def _on_finished(self, outcome: Any) -> None:
        log.info("job %s.%s (user %s) finished on %s: %s exit=%s signal=%s", outcome.job_id,
                 outcome.attempt, self._user(outcome.job_id, outcome.attempt), self.name,
                 outcome.reason, outcome.exit_code, outcome.signal)
        self._outbox.put_nowait(outcome.finished())
        if self.steps is not None:   # srun tasks end with the allocation
            self.steps.signal_job(outcome.job_id, outcome.attempt, signal.SIGKILL)
        task = asyncio.get_running_loop().create_task(self._after_job_end(), name="job-end")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _sampler(self) -> Any:
        from .telemetry import Sampler, assignments_from

        return Sampler(self.backend, self._publish, lambda: assignments_from(self.executor),
                       self.cfg.worker.sample_interval, clock=self.clock,
                       connected=lambda: getattr(self.bus, "connected", True),
                       usage=getattr(self.executor, "usage_rows", None))

    def _user(self, job: int, attempt: int) -> str:
        user = self._users.get((job, attempt))
        if user is None:   # a job adopted after a restart: its launch record says whose it is
            user = next((str(la.user) for la in self._launches() if (la.job_id, la.attempt) == (job, attempt)), "?")
        return user

    # -- GPU sharing (gpud.worker.gpumodes) ------------------------------------------------------

    def _launches(self) -> list[Any]:
        launches = getattr(self.executor, "launches", None)
        return list(launches()) if launches is not None else []

    async def _apply_gpu_modes(self) -> None:
        """At start: configured modes and layouts, and the MPS clients of surviving jobs."""
        launches = self._launches()
        await asyncio.to_thread(self.gpus.apply_at_start, gpumodes.devices_in_use(launches),
                                gpumodes.slices_needed(launches))
        self.gpus.adopt_launches(launches)
        await asyncio.to_thread(self.gpus.sync_mps, launches)
        self.node = replace(self.node, gpus=self.gpus.infos())

    async def _after_job_end(self) -> None:
        try:
            launches = self._launches()
            if self.gpus.mps is not None:
                await asyncio.to_thread(self.gpus.sync_mps, launches)
            # Whole GPUs and settled layouts (most job ends) need no trip to a thread.
            if self.gpus.anything_pending() and \
                    await asyncio.to_thread(self.gpus.converge, gpumodes.devices_in_use(launches)):
                self.node = replace(self.node, gpus=self.gpus.infos())
                await self.register()
        except Exception as e:  # a clean-up must never take the worker down
            log.error("worker %s: GPU clean-up after a job failed: %s: %s", self.name,
                      type(e).__name__, e)

    # -- what the worker hears ----------------------------------------------------------------

    async def handle(self, msg: Message) -> None:
        """One message from the bus.  Never raises: bad ones are logged and dropped."""
        try:
            if msg.sender != HEAD_SENDER:
                log.warning("worker %s dropped %s from %s: only the head may command workers",
                            self.name, msg.kind, msg.sender)
                return
            try:
                cmd = decode(msg.kind, msg.body)
            except MessageError as e:
                log.warning("worker %s dropped %s from %s: %s", self.name, msg.kind, msg.sender, e)
                if msg.topic == self._cmd_topic and msg.kind == StepStart.KIND:
                    await self.step_relay.refuse(msg.body, str(e))
                elif msg.topic == self._cmd_topic and msg.kind == MigRelayout.KIND:
                    await self.register()   # the head waits for the GPUs as they are
                return
            handler = self._commands.get(type(cmd))
            if msg.topic == self._cmd_topic and handler is not None:
                await handler(cmd)
            elif msg.topic == HEAD_STATUS and isinstance(cmd, HeadStatus):
                await self._on_head_status(cmd)
            else:
                log.warning("worker %s dropped %s on %s: unexpected", self.name, msg.kind, msg.topic)
        except Exception as e:
            log.error("worker %s failed to handle %s from %s: %s: %s", self.name, msg.kind,
                      msg.sender, type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))

    async def _on_head_status(self, status: HeadStatus) -> None:
        if status.refresh and status.state == "online" and self._head_online:
            return   # the head's periodic reminder (gpud.head.daemon): nothing changed
        log.info("worker %s: head is %s", self.name, status.state)
        self._head_online = status.state == "online"
        if self._head_online:
            await self.register()
            await self.heartbeat()

    async def _cmd_lease(self, lease: Lease) -> None:
        self.fencing.renewed(lease)
        held = getattr(self.executor, "held_time_limit", None)
        for job, attempt, limit in lease.limits if held is not None else ():
            now = held(job, attempt)
            if now is not None and now != (limit,):   # a time_limit command that was lost
                log.info("job %s.%s: time limit %s from the head's lease answer", job, attempt, limit)
                await self.executor.set_time_limit(job, attempt, limit)
        await self.fencing.release(lease, self._cmd_launch)

    async def _cmd_launch(self, launch: Launch) -> None:
        if not self.fencing.may_start(launch):
            return
        user = launch.user
        self._users[(launch.job_id, launch.attempt)] = user
        log.info("job %s.%s (user %s) launching on %s", launch.job_id, launch.attempt, user, self.name)
        try:
            prepared = self.gpus.prepare_launch_now(launch)
            launch = prepared if prepared is not None else \
                await asyncio.to_thread(self.gpus.prepare_launch, launch)
        except GpuError as e:
            log.warning("job %s.%s (user %s) refused on %s: %s", launch.job_id, launch.attempt,
                        user, self.name, e)
            refuse = getattr(self.executor, "refuse", None)
            if refuse is not None:
                await refuse(launch, str(e))
            return
        # Side by side: a burst of launches does not start one after another.  The executor
        # registers the allocation before its first wait, so a stop right behind finds it.
        task = asyncio.create_task(self._launch(launch), name=f"launch-{launch.job_id}")
        self._launching.add(task)
        task.add_done_callback(self._launching.discard)
        await asyncio.sleep(0)

    async def _launch(self, launch: Any) -> None:
        try:
            await self.executor.launch(launch)
            if self.gpus.mps is not None:   # a repeat of an ended job must not leave a daemon behind
                await asyncio.to_thread(self.gpus.sync_mps, self._launches())
        except Exception as e:  # as handle() does: logged, never fatal
            log.error("worker %s failed to handle launch from %s: %s: %s", self.name, HEAD_SENDER,
                      type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))

    async def _cmd_signal(self, cmd: Signal) -> None:
        job, attempt, sig, reason = cmd.job, cmd.attempt, cmd.signal, cmd.reason
        found = await self.executor.signal(job, attempt, sig=sig, grace=cmd.grace, reason=reason)
        signum = parse_signal(sig)
        if found and signum is not None and self.steps is not None:   # srun tasks hear it too
            self.steps.signal_job(job, attempt, signum)
        log.info("job %s.%s (user %s) on %s: signal %s (%s)%s", job, attempt, self._user(job, attempt),
                 self.name, sig, reason, "" if found else ": not running here")

    async def _cmd_time_limit(self, cmd: TimeLimit) -> None:
        await self.executor.set_time_limit(cmd.job, cmd.attempt, cmd.time_limit)

    async def _cmd_kill(self, cmd: Kill) -> None:
        reason = cmd.reason
        for job, attempt in cmd.allocs:
            found = await self.executor.kill(job, attempt, reason=reason)
            if self.steps is not None:
                self.steps.signal_job(job, attempt, signal.SIGKILL)
            log.info("job %s.%s (user %s) on %s: kill (%s)%s", job, attempt, self._user(job, attempt),
                     self.name, reason, "" if found else ": not running here")

    async def _cmd_ack(self, cmd: Ack) -> None:
        for job, attempt in cmd.done:
            self.executor.ack(job, attempt)
            self._users.pop((job, attempt), None)

    async def _cmd_hello(self, cmd: Hello) -> None:
        await self.register()
        await self.heartbeat()

    async def _cmd_mig(self, cmd: MigRelayout) -> None:
        in_use = gpumodes.devices_in_use(self._launches())
        result = await asyncio.to_thread(self.gpus.apply_command, cmd, in_use)
        reason = cmd.reason or "re-layout"
        (log.warning if result.refused else log.info)(
            "worker %s: mig (%s): %s", self.name, reason[:80], result.message)
        self.node = replace(self.node, gpus=self.gpus.infos())
        await self.register()   # applied or not, the head learns what is there


async def _cancel_all(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel and wait, re-cancelling: on Python 3.11 a cancel that lands inside aiomqtt's
    publish() can be lost (CPython gh-86296), which would hang shutdown forever."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(_CANCEL_ROUNDS):
        if not pending:
            return
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    log.error("%d task(s) would not stop: %s", len(pending), ", ".join(t.get_name() for t in pending))


# -- `gpud worker` ------------------------------------------------------------------------------

def make_bus(cfg: Config, name: str, key: bytes) -> Any:
    import os

    from ..bus.credentials import login, node_user
    from ..bus.epoch import process_epoch
    from ..bus.mqtt import MqttBus

    username, password = login(cfg.broker, node_user(name))
    epoch_file = os.path.join(cfg.state_dir, f"bus-epoch-worker-{name}") if os.path.isdir(cfg.state_dir) else None
    return MqttBus(
        cfg.broker.url, cfg.cluster, worker_sender(name), key,
        subscriptions=worker_subscriptions(name), will=worker_will(name),
        persistent=True, epoch=process_epoch(epoch_file),
        username=username, password=password, tls_ca=cfg.broker.ca_file, tls=cfg.broker.tls,
    )


def install_stop_handlers(worker: Worker) -> None:
    """SIGTERM/SIGINT: the first stops gracefully (jobs keep running), a second hurries."""
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        log.info("worker %s: %s received, stopping%s", worker.name, signame,
                 " now" if worker._stop.is_set() else "; jobs keep running")
        worker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    # systemd's `reload` sends SIGHUP; a worker's settings only change with a restart
    # (which keeps its jobs running), so say so instead of dying.
    loop.add_signal_handler(signal.SIGHUP, lambda: log.warning(
        "worker %s: SIGHUP received; the worker reads its config only at start: restart it to apply "
        "changes (running jobs are kept)", worker.name))


async def run_worker(cfg: Config, *, install_signals: bool = True, backend: GpuBackend | None = None,
                     executor_factory: Callable[..., Any] = default_executor_factory,
                     on_worker: Callable[[Worker], None] | None = None, bus: Any = None) -> int:
    """Build the real pieces around ``Worker`` and run it; the exit code for ``gpud worker``.

    ``install_signals=False`` leaves SIGTERM/SIGINT to a caller that runs more than the
    worker in its process (``gpud standalone``): ``on_worker`` hands it the ``Worker`` so
    it can call ``stop()`` (and wait on ``ready``), and ``bus``, when given, replaces the
    MQTT bus (standalone's in-process one).
    """
    from ..gpu.backend import GpuError, open_backend
    from ..keys import KeyFileError, load_keys

    name = cfg.worker_name()
    try:
        key = load_keys(cfg.key_file)
        if backend is None:
            backend = open_backend(cfg.worker.sim, name, sim_devices=cfg.worker.sim_devices)
        if bus is None:
            bus = make_bus(cfg, name, key)
    except (KeyFileError, GpuError) as e:
        print(f"gpud worker: error: {e}", file=sys.stderr)
        return 1
    try:
        worker = Worker(cfg, bus, backend, executor_factory=executor_factory)
        if install_signals:
            install_stop_handlers(worker)
        if on_worker is not None:
            on_worker(worker)
        from .. import sdnotify
        from ..relay import worker_relay

        # systemd (Type=notify) hears READY=1 once the worker runs; [worker] relay_socket, when
        # set, also serves gpuctl on this host (gpud.relay).
        async with bus, sdnotify.lifecycle(worker.ready, what=f"gpud worker {name}", enabled=install_signals), \
                worker_relay(cfg, name, key):
            await worker.run()
    except (GpuError, OSError, ValueError) as e:
        print(f"gpud worker: error: {e}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    return 0
