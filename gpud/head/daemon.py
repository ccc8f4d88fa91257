"""The head daemon: wiring of the socket API, the store, the bus and the scheduler loop.

Theory of operation
-------------------
Four tasks in one TaskGroup:

``submitter``  gathers submissions from the socket and inserts them in one transaction
               per batch (group commit), then answers every caller: durable before
               acknowledged, thousands per second on one connection.
``bus``        handles worker messages: registration, heartbeats (liveness, fencing,
               launch re-sends), ``started`` and ``finished`` reports: those waiting
               together go in one group commit, then one ack per node.
``scheduler``  runs a pass when kicked (submit, finish, node change) or on a timer:
               snapshot -> pure core -> re-checked plan -> one commit -> messages.  A kick
               after an idle spell starts a pass at once; kicks soon after the last pass wait
               out the rest of ``schedule_debounce``, or of as long as the pass took
               (``schedule_max_share``), so a burst makes one pass and passes over a long
               queue leave the head time to answer between them.
``liveness``   marks nodes DOWN after ``node_timeout`` without a heartbeat (nothing new is
               scheduled there); their jobs are requeued (or NODE_FAIL with --no-requeue)
               only once the node's lease has surely ended.  Time while the head itself is
               cut off from the broker does not count against the nodes.  It also keeps
               the database's WAL checkpointed.

Leases (no job runs twice at once): a worker runs allocations only while it holds a lease,
renewed by the head's ``lease`` answer to each heartbeat.  The worker times the lease from
when it *sent* that heartbeat, the head from when it *answered* it, each on its own
monotonic clock, so the worker's lease always ends before the head's idea of it; the head
starts a lost job's replacement only ``lease + lease_margin(lease)`` after its last answer
to the node, or as soon as the worker reports the attempt ended.  A launch carries the
heartbeat it was granted on (``lease.seq``): a worker never starts one whose lease lapsed.
Every liveness judgement, lease, resend pacing and time limit here reads ``self.mono``;
``self.clock`` (the wall clock) only stamps what is stored or shown as a date.

Reload (SIGHUP or the ``reconfigure`` op): ``reconfigure`` swaps in the new scheduling
policy, admins, timeouts and log level between two passes; running jobs are not touched and
settings that cannot change live are reported, not applied (``config.apply_live``).

Multi-node (gang) jobs (``gang.py``): launches, stops and kills go to every node of a job;
the job ends when rank 0's script ends (its exit code is the job's) and the other parts
are then killed; a part other than rank 0 that ends on its own ends the job FAILED and
kills the rest; a lost node ends the whole job as it would a one-node job.  ``gpuctl
srun`` steps inside a job live in ``steps.py``.

Nothing here trusts a message to arrive once: launches are re-sent for allocations a worker
does not report, ``finished`` is repeated by workers until acked, and a worker reporting a
(job, attempt) the head no longer assigns to it is told to kill it (fencing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import sqlite3
import sys
import time
from typing import Callable

from .. import __version__
from ..bus.base import HEAD_EVENTS, HEAD_REQUESTS, HEAD_STATUS, Bus, Message, node_cmd
from ..bus.messages import (Finished, GpuAssignment, HeadStatus, Heartbeat, Hello, Kill, Launch, Lease,
                            MessageError, Register, Samples, Signal, Started, StepExit, StepOutput, decode)
from .. import config as config_mod
from ..config import Config, ConfigError
from ..model import JobState, NodeState, StopReason
from ..units import format_size_kb
from . import gang
from .change import Change
from ..ctlsocket import Limits, RequestError, SocketServer
from .jobcaps import SubmitCaps
from .jobs import requeue_changes
from .ops_admin import OPS as ADMIN_OPS
from .metrics import HeadMetrics
from .cron import OPS as CRON_OPS
from .ops_jobs import OPS as JOB_OPS
from .ops_sched import OPS as SCHED_OPS
from .ops_slurm import OPS as SLURM_OPS, node_time_limit
from .slurm import SlurmSupport
from .ops_telemetry import OPS as TELEMETRY_OPS
from .steps import OPS as STEP_OPS, Steps
from .interactive import OPS as ALLOC_OPS, Allocations
from .relayed import RelayedRequests
from .outcomes import WorkerReports
from ..sched.plan import Plan
from ..sched.snapshot import live_claims
from .scheduling import (DOWN, DRAIN, UP, Applied, JobViews, annotate, build_snapshot, node_view, pass_gap,
                         plan_to_txn, run_core, running_view)
from .gpusharing import MigCommands, launch_devices
from .store import WAL_CHECKPOINT_BYTES, JobRecord, NodeRecord, Store, Txn, free_kb, storage_problem
from .submitkeys import SubmitKeys
from .telemetry import Telemetry
from .usage import UsageLedger

log = logging.getLogger("gpud.head")

HEAD_SENDER = "head"
LEASE_MARGIN = 1.0              # seconds, plus LEASE_MARGIN_SHARE of the lease: see lease_margin
LEASE_MARGIN_SHARE = 0.005      # monotonic clocks may run this much apart (NTP slews 0.05% at most)
CHECKPOINT_IDLE_AFTER = 10.0    # seconds between truncations of the WAL (at quiet moments)
LAUNCH_RESEND_AFTER = 3.0       # seconds before an unreported allocation's launch is re-sent
STOP_RESEND_AFTER = 5.0         # seconds before a stop signal is re-sent
MAX_SUBMIT_BATCH = 1000
STATUS_REFRESH = 60.0           # seconds between re-publications of the retained "online"
MAX_REPORT_BATCH = 1000         # worker messages taken from the bus at once
CORE_SWITCH_INTERVAL = 0.001    # seconds: the GIL hand-over while the core's thread runs


class Head:
    def __init__(self, cfg: Config, bus: Bus, store: Store, *, clock: Callable[[], float] = time.time,
                 socket_path: str | None = None, loader: Callable[[], Config] | None = None,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.mono = mono                      # every timeout, liveness judgement and lease
        self.loader = loader or (lambda: config_mod.load(cfg.path))
        self.bus = bus
        self.store = store
        self.clock = clock
        self.socket_path = socket_path or cfg.head.socket
        self.admins = frozenset(cfg.head.admins)
        self.server = SocketServer(self.socket_path, {
            op: functools.partial(fn, self) for op, fn in {**JOB_OPS, **ADMIN_OPS, **TELEMETRY_OPS,
                                                 **SLURM_OPS, **CRON_OPS, **SCHED_OPS, **STEP_OPS,
                                                 **ALLOC_OPS}.items()
        }, limits=Limits.from_config(cfg.head))
        self._kick = asyncio.Event()
        self.status_refresh = STATUS_REFRESH
        self._last_pass = float("-inf")       # time.monotonic() at the end of the last pass
        self._gap = 0.0                       # the least time from it to the next pass
        self.views = JobViews()               # jobs' snapshot views, kept between passes
        # victim -> the job it was preempted for, until that one starts (Snapshot.claims);
        # memory only: after a restart the queue order alone decides, as before
        self.claims: dict[int, int] = {}
        self._stop = asyncio.Event()
        # (the jobs of one submission: one, or an array's tasks; its future)
        self.submissions: asyncio.Queue[tuple[list[JobRecord], asyncio.Future]] = asyncio.Queue()
        self.lock = asyncio.Lock()          # one writer of job state at a time
        self._stop_sent: dict[tuple[int, int], float] = {}   # mono time of the last stop sent
        self._launch_sent: dict[tuple[int, int], float] = {}  # mono time of the last launch sent
        self.heard: dict[str, float] = {}     # node -> mono time of its last heartbeat or register
        self.granted: dict[str, float] = {}   # node -> mono time of the last lease granted to it
        self.lease_seq: dict[str, int] = {}   # node -> the heartbeat its last lease answered
        self.run_since: dict[tuple[int, int], float] = {}   # allocation -> mono time it started
        self.usage = UsageLedger()           # fair-share usage, decayed, persisted
        self.last_plan: Plan | None = None   # factors and reasons for sprio
        self.ready = asyncio.Event()         # set once the socket accepts requests
        self.passes = 0
        self.relayed = RelayedRequests(self)  # gpuctl requests from relays (head/requests)
        self.telemetry = Telemetry(self)      # GPU samples: job aggregates, node series, idle GPUs
        self.metrics = HeadMetrics(self)      # /metrics, when [head] metrics_listen is set
        self.slurm = SlurmSupport(self)       # holds, dependencies, arrays, scrontab, mail
        self.mig = MigCommands(self)          # MIG re-layouts sent and not yet answered
        self.steps = Steps(self)              # gpuctl srun steps inside running jobs
        self.allocs = Allocations(self)       # salloc keepalives (interactive jobs)
        self.reports = WorkerReports(self)    # started/finished reports: group commits
        self.submit_keys = SubmitKeys(self.mono)   # idempotent submission (submitkeys.py)
        self._disk_checked = float("-inf")   # mono time of the last free-space check
        self._truncated = float("-inf")      # mono time of the WAL's last truncation
        self._free_kb: float | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self) -> None:
        # Nodes get a full timeout from our start to report in: the head being down is not
        # the nodes' fault.  And any of them may hold a lease granted just before a crash:
        # their jobs are replaced no earlier than a whole lease from now.
        now, mono = self.clock(), self.mono()
        for name in self.store.nodes:
            self.heard[name] = self.granted[name] = mono
        self.bus.on_connect = self._on_bus_connect  # type: ignore[attr-defined]
        await self.usage.load(self.store, now)
        await self.submit_keys.load(self.store, now)
        if self.cfg.head.metrics_listen:   # first: a bad address stops the head before it serves
            await self.metrics.start(self.cfg.head.metrics_listen)
        await self.server.start()
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._submitter(), name="submitter"),
                    tg.create_task(self._bus_loop(), name="bus"),
                    tg.create_task(self._scheduler(), name="scheduler"),
                    tg.create_task(self._liveness(), name="liveness"),
                    tg.create_task(self.telemetry.run(), name="telemetry"),
                    tg.create_task(self.slurm.run(), name="scrontab"),
                    tg.create_task(self._status_refresher(), name="status-refresh"),
                    tg.create_task(self.allocs.run(), name="interactive"),
                ]
                self.ready.set()
                log.info("head ready on %s (cluster %s)", self.socket_path, self.cfg.cluster)
                await self._stop.wait()
                for t in tasks:
                    t.cancel()
        finally:
            await self.metrics.close()
            await self.server.close()
            try:  # relays answer "head offline" at once instead of waiting out their timeout
                await self.bus.publish(HEAD_STATUS, HeadStatus("offline"), retain=True)
            except Exception:
                log.exception("could not announce that the head is stopping")
            try:
                await self.usage.maybe_save(self.store, self.clock(), force=True)
            except Exception:
                log.exception("could not save fair-share usage")
            try:
                await self.telemetry.flush()
            except Exception:
                log.exception("telemetry: last flush failed")

    def stop(self) -> None:
        self._stop.set()

    def check_disk_space(self) -> None:
        """Refuse a submission while the database's filesystem is below [head] min_free_disk
        (checked at most once a second); taken again by itself once space returns."""
        mono = self.mono()
        if mono - self._disk_checked >= 1.0:
            self._disk_checked, self._free_kb = mono, free_kb(self.store.path)
        need = self.cfg.head.min_free_disk
        if self._free_kb is not None and self._free_kb < need:
            where = os.path.dirname(os.path.abspath(self.store.path))
            raise RequestError(
                f"Batch job submission failed: the head's disk has only {format_size_kb(self._free_kb)} free, below "
                f"[head] min_free_disk = {format_size_kb(need)}; nothing was submitted.  Free space under {where}: "
                "the head takes submissions again by itself once there is room")

    def kick(self) -> None:
        self._kick.set()

    def change(self) -> Change:
        """The one door for a change of jobs or nodes: ``async with head.change() as ch``
        (lock, clock, transaction; commit, then what it tells: head/change.py)."""
        return Change(self)

    def reconfigure(self, new_cfg: Config) -> list[str]:
        """Apply what can change live; the lines say which changes need a restart."""
        old_level = self.cfg.log_level
        self.cfg, notes = config_mod.apply_live(self.cfg, new_cfg)
        self.admins = frozenset(self.cfg.head.admins)
        if self.cfg.log_level != old_level:
            logging.getLogger().setLevel(self.cfg.log_level.upper())
        log.info("configuration reloaded from %s", self.cfg.path or "defaults")
        for note in notes:
            log.warning("reload: %s", note)
        self.kick()
        return notes

    def reload(self, source: str) -> list[str]:
        """Re-read the config (``source`` says who asked); ConfigError keeps the running one."""
        log.info("configuration reload requested by %s", source)
        try:
            new_cfg = self.loader()
        except ConfigError as e:
            for line in e.lines:
                log.error("reload refused: %s", line)
            log.error("reload refused: the running configuration is kept")
            raise
        return self.reconfigure(new_cfg)

    async def _status_refresher(self) -> None:
        """Re-publish the retained "online" now and then: it outranks any older status, so
        a replayed old "offline" that a relay started after it saw (and took) is undone
        within ``status_refresh`` seconds.  Receivers that already know the head is online
        ignore a refresh."""
        while True:
            await asyncio.sleep(self.status_refresh)
            if getattr(self.bus, "connected", True):
                await self.bus.publish(HEAD_STATUS, HeadStatus("online", __version__, refresh=True), retain=True)

    async def _on_bus_connect(self) -> None:
        # Reconnected: whatever time we were away does not count against the nodes (their
        # leases went on ending meanwhile: ``granted`` stays as it was).
        mono = self.mono()
        for name in self.store.nodes:
            self.heard[name] = mono
        await self.bus.publish(HEAD_STATUS, HeadStatus("online", __version__), retain=True)

    # -- socket operations ------------------------------------------------------------------

    # -- group commit of submissions ----------------------------------------------------------

    async def _submitter(self) -> None:
        while True:
            batch = [await self.submissions.get()]
            while not self.submissions.empty() and len(batch) < MAX_SUBMIT_BATCH:
                batch.append(self.submissions.get_nowait())
            try:
                async with self.lock:
                    caps = SubmitCaps(self.store.active, self.cfg)
                    admitted = []
                    for jobs, fut in batch:
                        refusal = caps.admit(jobs)
                        if refusal is None:
                            admitted.append((jobs, fut))
                        elif not fut.done():
                            fut.set_exception(RequestError(refusal))
                    batch = admitted
                    if not batch:   # every one refused: no empty transaction
                        continue
                    saved = await self.store.insert_jobs([j for js, _ in batch for j in js], self.clock())
            except Exception as e:  # the disk said no: every caller hears it, nothing half-done
                log.error("could not record %d submissions: %s", len(batch), e,
                          exc_info=not isinstance(e, (sqlite3.Error, OSError)))
                problem = storage_problem(e, self.store.path)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(RequestError(f"Batch job submission failed: {problem}"))
                continue
            at = 0
            for jobs, fut in batch:
                if not fut.done():
                    fut.set_result(saved[at:at + len(jobs)])
                at += len(jobs)
            self.kick()

    # -- scheduler loop -----------------------------------------------------------------------

    async def _scheduler(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.cfg.head.schedule_interval)
            except asyncio.TimeoutError:
                pass
            # Idle (no pass within the gap): start at once, the latency of a lone job.
            # Busy: wait out the gap since the last pass, so a burst of submissions and ends
            # is gathered into one pass instead of one pass each, and long passes leave the
            # loop time for requests between them.
            wait = self._last_pass + self._gap - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._kick.clear()
            started = time.monotonic()
            try:
                await self.schedule_pass()
            except Exception:
                log.exception("scheduler pass failed; will retry")
                await asyncio.sleep(1)
            self._last_pass = time.monotonic()
            self._gap = pass_gap(self._last_pass - started, self.cfg.head)

    async def schedule_pass(self) -> Applied:
        async with self.lock:
            started = time.perf_counter()
            now = self.clock()
            recent = tuple(await self.store.recent_preemptions(now - 60))
            snap = build_snapshot(self.store, self.cfg.sched, {}, recent,
                                  await self.slurm.before_pass(now), self.views)
            if self.claims:
                active = self.store.active
                self.claims = live_claims(
                    self.claims, lambda b: b in active and active[b].state is JobState.PENDING,
                    lambda v: v in active and active[v].state is JobState.RUNNING)
            snap = dataclasses.replace(snap, usage=self.usage.advance(snap.running, snap.nodes,
                                                                        self.cfg.sched, now),
                                       claims=tuple(self.claims.items()))
            snap = self.mig.adjust(snap, now)
        # The pure core runs on a thread, outside the lock: submissions, cancels and worker
        # reports go on meanwhile, and plan_to_txn re-checks every decision against what
        # changed before anything is committed.
        plan = await self._core(snap, now)
        async with self.lock:
            txn, applied = plan_to_txn(self.store, plan, now, self.views)
            await self.store.commit(txn)
            annotate(self.store, plan)
            self.last_plan = plan
            self.passes += 1
            await self.usage.maybe_save(self.store, now)
        self.metrics.observe_pass(time.perf_counter() - started)
        started_mono = self.mono()
        for job in applied.launches:
            self.run_since[(job.job_id, job.attempt)] = started_mono
            log.info("job %d (user %s) allocated on %s gpus=%s attempt %d", job.job_id, job.user,
                     job.nodelist, list(job.gpu_indices) + [i for p in job.parts for i in p.get("gpu_indices", ())],
                     job.attempt)
        await asyncio.gather(*(self._send_launch(j) for j in applied.launches))
        await self.mig.send(applied.relayouts, now)
        for job, p in applied.stops:
            if p.for_job is not None:
                self.claims[job.job_id] = p.for_job
            log.info("job %d (user %s) preempted on %s: %s", job.job_id, job.user, job.node, p.reason)
            await self.send_signal(job, job.spec.signal or "TERM", grace=p.grace_time, reason="preempted")
        return applied

    async def _core(self, snap, now: float) -> Plan:
        """``run_core`` on a thread.  Meanwhile the loop gets the GIL back within
        CORE_SWITCH_INTERVAL instead of Python's default 5 ms after each of its system
        calls: a request answered while the core ran over a long queue waited that long
        at every read, write and poll (ping 15 ms median instead of 1-3)."""
        before = sys.getswitchinterval()
        sys.setswitchinterval(min(before, CORE_SWITCH_INTERVAL))
        try:
            return await asyncio.to_thread(run_core, snap, now)
        finally:
            sys.setswitchinterval(before)

    # -- messages to workers ------------------------------------------------------------------

    def launch_message(self, job: JobRecord) -> Launch:
        """Rank 0's launch of ``job`` (``gang.launches`` makes the other ranks')."""
        spec = job.spec
        return Launch(
            job_id=job.job_id, attempt=job.attempt, name=job.name, user=job.user, uid=job.uid, gid=job.gid,
            script=spec.script, work_dir=spec.work_dir, stdout=spec.stdout, stderr=spec.stderr, env=dict(spec.env),
            rlimits=dict(spec.rlimits), gpus=tuple(GpuAssignment.from_dict(d) for d in launch_devices(job)),
            cpus=job.cpus, mem_mb=job.mem_mb, time_limit=job.time_limit, kill_grace=self.cfg.head.kill_grace,
            submit_dir=spec.work_dir, **self.slurm.launch_fields(job))

    async def _send_launch(self, job: JobRecord, node: str | None = None) -> None:
        """The launch of every node of ``job`` (a gang job has one per rank), or of ``node``."""
        assert job.node is not None
        slurm_env = bool(getattr(self.cfg.head, "slurm_compat_env", False))
        self._launch_sent[(job.job_id, job.attempt)] = self.mono()
        try:
            launches = gang.launches(self.launch_message(job), job, gang.master_addr(self.store, job), slurm=slurm_env)
        except MessageError as e:   # a recorded device the worker would refuse
            await self._launch_failed(job, node or job.node, str(e))
            return
        for where, launch in launches:
            if node is None or where == node:
                # the lease it is granted under: the worker never starts it once that lapsed
                launch = dataclasses.replace(launch, lease_seq=self.lease_seq.get(where))
                try:
                    await self.bus.publish(node_cmd(where), launch)
                except (ValueError, TypeError) as e:   # the bus cannot carry it (too large)
                    await self._launch_failed(job, where, str(e))
                    return

    async def _launch_failed(self, job: JobRecord, node: str, why: str) -> None:
        """A launch that cannot be sent fails its job, as a worker's failed launch would; the
        node and everything else go on (it must not stall the pass or the node's heartbeats)."""
        log.error("job %d (user %s): cannot send its launch to %s: %s; the job fails", job.job_id, job.user,
                  node, why)
        await self.reports.apply([(node, Finished(
            job.job_id, job.attempt, None, None, "launch_failed", self.clock(),
            f"the head could not send the launch to {node}: {why}"[:300]))])

    def ran_for(self, job: JobRecord) -> float:
        """Seconds the job's allocation has run, on the monotonic clock.  An allocation from
        before this head started is dated once from its (wall-clock) start time."""
        key = (job.job_id, job.attempt)
        since = self.run_since.get(key)
        if since is None:
            since = self.run_since[key] = self.mono() - max(0.0, self.clock() - (job.start_time or self.clock()))
        return self.mono() - since

    async def send_signal(self, job: JobRecord, sig: str, *, grace: float | None, reason: str,
                          nodes: list[str] | None = None) -> None:
        """``sig`` to the job on every node it holds (or on ``nodes``)."""
        if job.node is None:
            return
        self._stop_sent[(job.job_id, job.attempt)] = self.mono()
        for node in nodes if nodes is not None else gang.job_nodes(job):
            await self.bus.publish(node_cmd(node), Signal(job.job_id, job.attempt, sig, grace, reason))

    async def kill_parts(self, job: JobRecord, reason: str, *, besides: str | None = None) -> None:
        """SIGKILL what a gang job still runs on its nodes (all but ``besides``)."""
        for node in gang.job_nodes(job):
            if node != besides:
                await self.bus.publish(node_cmd(node), Kill(((job.job_id, job.attempt),), reason))

    # -- messages from workers ----------------------------------------------------------------

    async def _bus_loop(self) -> None:
        """Messages in arrival order; a run of ``started``/``finished`` reports waiting
        together is applied as one batch (one commit, one ack per node)."""
        inbox: asyncio.Queue[Message | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for m in self.bus.messages():
                    inbox.put_nowait(m)
            finally:
                inbox.put_nowait(None)

        reader = asyncio.create_task(read(), name="bus-reader")
        try:
            while True:
                msgs = [await inbox.get()]
                while not inbox.empty() and len(msgs) < MAX_REPORT_BATCH:
                    msgs.append(inbox.get_nowait())
                run: list[tuple[str, Started | Finished]] = []
                for msg in msgs:
                    report = self._report(msg) if msg is not None else None
                    if report is not None:
                        run.append(report)
                        continue
                    await self._reports_or_log(run)
                    run = []
                    if msg is None:
                        await reader  # the bus closed: end as it ended (an error propagates)
                        return
                    try:
                        await self.handle(msg)
                    except Exception:
                        log.exception("dropped %s message from %s: handler failed", msg.kind, msg.sender)
                await self._reports_or_log(run)
        finally:
            reader.cancel()

    def _report(self, msg: Message) -> tuple[str, Started | Finished] | None:
        """(node, report) for a well-formed ``started``/``finished`` of a known node, which
        the bus loop batches; None for anything else (``handle`` takes it, and logs it if bad)."""
        if not (msg.topic == HEAD_EVENTS and msg.kind in (Started.KIND, Finished.KIND)
                and msg.sender.startswith("worker:") and msg.sender[len("worker:"):] in self.store.nodes):
            return None
        try:
            report = decode(msg.kind, msg.body)
        except MessageError:
            return None
        assert isinstance(report, (Started, Finished))
        return msg.sender[len("worker:"):], report

    async def _reports_or_log(self, run: list[tuple[str, Started | Finished]]) -> None:
        if not run:
            return
        for node, report in run:
            if isinstance(report, Started):   # salloc is granted once every node's holder runs
                self.allocs.started(node, report)
        try:
            await self.reports.apply(run)
        except Exception:
            log.exception("dropped %d started/finished reports: handler failed", len(run))

    async def handle(self, msg: Message) -> None:
        if msg.topic == HEAD_REQUESTS:
            return await self.relayed.handle(msg)
        if msg.topic != HEAD_EVENTS:
            return  # node status topics: liveness is judged by heartbeats
        if not msg.sender.startswith("worker:"):
            log.warning("dropped %s message from %s: not a worker", msg.kind, msg.sender)
            return
        node = msg.sender[len("worker:"):]
        try:
            report = decode(msg.kind, msg.body)
        except MessageError as e:
            if msg.kind == Samples.KIND:
                self.telemetry.dropped += 1
            log.warning("dropped %s from %s: %s", msg.kind, node, e)
            return
        if isinstance(report, Register):
            await self._on_register(node, report)
        elif node not in self.store.nodes:
            # A worker we do not know yet (e.g. the head lost its database): ask it to register.
            await self.bus.publish(node_cmd(node), Hello())
        elif isinstance(report, Heartbeat):
            await self._on_heartbeat(node, report)
        elif isinstance(report, Started):
            await self._on_started(node, report)
        elif isinstance(report, Finished):
            await self._on_finished(node, report)
        elif isinstance(report, Samples):
            await self.telemetry.ingest(node, report)
        elif isinstance(report, (StepOutput, StepExit)):
            await self.steps.handle(node, report)
        else:
            log.warning("dropped %s from %s: not a worker's message", msg.kind, msg.sender)

    async def _on_register(self, node: str, msg: Register) -> None:
        info = msg.node
        if info.name != node:
            log.warning("dropped register from %s: claims to be %s", node, info.name)
            return
        now = self.clock()
        self.heard[node] = self.mono()
        self.granted.setdefault(node, self.heard[node])
        old = self.store.nodes.get(node)
        back = old is None or old.state in (DOWN, NodeState.UNKNOWN.value)
        state = UP if back else old.state
        if back:
            log.info("node %s up: %d GPUs, %d CPUs, %d MB", node, len(info.gpus), info.cpus, info.mem_mb)
        async with self.lock:
            txn = Txn(self.store)
            txn.node_transition(
                old or NodeRecord(name=node, info={}, state=UP, reason=None, last_seen=now, registered=now),
                state, reason=None if back else old.reason, now=now,
                event="registered" if old is None else "returned" if back else "registered again",
                info=info.to_dict(), last_seen=now)
            await self.store.commit(txn)
        self.mig.registered(node, info.to_dict(), now)
        self.kick()

    async def _on_heartbeat(self, node: str, hb: Heartbeat) -> None:
        running, done, seq = hb.running, hb.done, hb.seq
        rec = self.store.nodes[node]
        mono = self.heard[node] = self.mono()
        if rec.state == DOWN:
            async with self.lock:
                txn = Txn(self.store)
                txn.node_transition(rec, UP, reason=None, now=self.clock(), event="returned",
                                    last_seen=self.clock())
                await self.store.commit(txn)
            log.info("node %s is back", node)
            self.kick()
        # The lease: granted (and recorded) before it is sent, so the head's idea of when it
        # ends is never earlier than the worker's.
        here = list(self.store.jobs_on_node(node))
        if seq is not None:
            self.granted[node] = mono
            self.lease_seq[node] = seq
            # Each allocation's time limit rides along, so a lost ``time_limit`` command (an
            # operator raising it) reaches the node with the next answer.
            await self.bus.publish(node_cmd(node), Lease(
                seq, self.cfg.head.lease, tuple((j.job_id, j.attempt) for j in here),
                tuple((j.job_id, j.attempt, node_time_limit(self, j, gang.rank_of(j, node) or 0)) for j in here)))
        # Fencing: kill whatever this node runs that the head no longer assigns to it.
        stale = []
        for jid, attempt in running:
            job = self.store.active.get(jid)
            if job is None or job.attempt != attempt or not job.state.active or gang.rank_of(job, node) is None:
                stale.append((jid, attempt))
        if stale:
            log.warning("node %s runs allocations no longer assigned to it, killing: %s", node,
                        [list(p) for p in stale])
            await self.bus.publish(node_cmd(node), Kill(tuple(stale), "fenced"))
        reported = set(running) | set(done)
        for job in list(self.store.jobs_on_node(node)):
            key = (job.job_id, job.attempt)
            if key in reported:
                if job.state is JobState.COMPLETING and key in set(running):
                    sent = self._stop_sent.get(key, float("-inf"))
                    if mono - sent > STOP_RESEND_AFTER:
                        await self.send_signal(job, "TERM", grace=self.cfg.head.kill_grace,
                                                reason=_stop_kind(job), nodes=[node])
                continue
            sent = self._launch_sent.setdefault(key, mono)
            if job.launched_at is not None and mono - sent > LAUNCH_RESEND_AFTER:
                log.info("re-sending launch of job %d attempt %d to %s", job.job_id, job.attempt, node)
                await self._send_launch(job, node)

    async def _on_started(self, node: str, report: Started) -> None:
        self.allocs.started(node, report)
        await self.reports.apply([(node, report)])

    async def _on_finished(self, node: str, report: Finished) -> None:
        await self.reports.apply([(node, report)])

    # -- liveness --------------------------------------------------------------------------

    async def _liveness(self) -> None:
        while True:  # node_timeout may change on reload
            await asyncio.sleep(max(0.05, min(1.0, self.cfg.head.node_timeout / 4)))
            await self.liveness_tick()

    async def liveness_tick(self) -> None:
        """Judge the nodes and keep the WAL small; a failure (a full disk, say) is logged and
        the next tick tries again: never fatal."""
        try:
            await self.check_nodes()
        except Exception as e:
            log.error("liveness: could not record node changes (will retry): %s", e,
                      exc_info=not isinstance(e, (sqlite3.Error, OSError)))
        try:
            await self.checkpoint()
        except Exception as e:
            log.warning("could not checkpoint the database's WAL: %s", e)

    async def checkpoint(self) -> None:
        """Keep the WAL small: passive once it grows past WAL_CHECKPOINT_BYTES; truncated to
        nothing every CHECKPOINT_IDLE_AFTER seconds at a quiet moment (no write for a
        second), so a small disk never fills with an old WAL."""
        size = self.store.wal_bytes()
        if size > WAL_CHECKPOINT_BYTES:
            await self.store.checkpoint("PASSIVE")
        elif size > 0 and self.mono() - self._truncated >= CHECKPOINT_IDLE_AFTER and \
                time.monotonic() - self.store.last_write >= 1.0:
            self._truncated = self.mono()
            await self.store.checkpoint("TRUNCATE")

    def lease_ends(self, node: str) -> float:
        """Mono time by which the node's worker has surely stopped what it ran for us."""
        lease = self.cfg.head.lease
        return self.granted.get(node, float("-inf")) + lease + lease_margin(lease)

    async def check_nodes(self) -> None:
        mono, timeout = self.mono(), self.cfg.head.node_timeout
        for rec in list(self.store.nodes.values()):
            heard = self.heard.get(rec.name)
            if rec.state in (UP, DRAIN) and heard is not None and mono - heard > timeout:
                await self._node_down(rec, f"no heartbeat for {mono - heard:.0f}s")
        for rec in list(self.store.nodes.values()):
            if rec.state == DOWN and mono >= self.lease_ends(rec.name) and \
                    next(self.store.jobs_on_node(rec.name), None) is not None:
                await self._node_failed(rec)

    async def _node_down(self, rec: NodeRecord, reason: str) -> None:
        """No more jobs for the node; what runs there is kept until its lease has ended."""
        async with self.lock:
            txn = Txn(self.store)
            txn.node_transition(rec, DOWN, reason=reason, now=self.clock(), event="node_down")
            await self.store.commit(txn)
        jobs = list(self.store.jobs_on_node(rec.name))
        wait = max(0.0, self.lease_ends(rec.name) - self.mono())
        log.warning("node %s DOWN: %s%s", rec.name, reason,
                    f"; its {len(jobs)} job(s) are requeued once its lease has ended, in {wait:.0f}s, "
                    "unless it returns" if jobs else "")
        self.kick()

    async def _node_failed(self, rec: NodeRecord) -> None:
        """The DOWN node's lease has ended: its jobs are surely dead there; requeue them."""
        async with self.change() as ch:
            now, txn = ch.now, ch.txn
            reason = f"node {rec.name} DOWN ({rec.reason or 'no heartbeat'}); its lease ended"
            lost = list(self.store.jobs_on_node(rec.name))
            for job in lost:
                txn.end_allocation(job.job_id, job.attempt, end=now, outcome="node_fail")
                if job.spec.requeue and job.stop_reason != StopReason.CANCELLED:
                    txn.transition(job, JobState.PENDING, now=now, event="node_fail",
                                   detail=f"{reason}; requeued", **requeue_changes(job))
                    log.info("job %d (user %s) requeued: %s", job.job_id, job.user, reason)
                else:
                    new = JobState.CANCELLED if job.stop_reason == StopReason.CANCELLED else JobState.NODE_FAIL
                    txn.transition(job, new, now=now, event="node_fail", detail=reason, end_time=now)
                    log.info("job %d (user %s) %s: %s", job.job_id, job.user, new.value, reason)
                ch.ended(job, now)
                if job.parts:   # a gang job's other parts hold nothing now
                    ch.then(self.kill_parts, job, "node_fail", besides=rec.name)
                ch.then(self.steps.job_ended, job.job_id)
            ch.wake()

    def allocation_ended(self, job: JobRecord, end: float) -> None:
        """After an allocation's end is committed: bill the job (its allocation as it was)
        and stop re-sending its stop signal."""
        if job.node is not None:
            self.usage.job_ended(running_view(job), node_view(self.store, job.node), end, self.cfg.sched)
        key = (job.job_id, job.attempt)
        self._stop_sent.pop(key, None)
        self._launch_sent.pop(key, None)
        self.run_since.pop(key, None)


def lease_margin(lease: float) -> float:
    """How long after a lease's end the head waits before it counts the worker's jobs dead:
    the worker's kill and the two monotonic clocks' different rates."""
    return LEASE_MARGIN + LEASE_MARGIN_SHARE * lease


def _stop_kind(job: JobRecord) -> str:
    stop = StopReason.of(job.stop_reason)
    return "preempted" if stop is not None and stop.kind == "preempted" else "cancelled"
