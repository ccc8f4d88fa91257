"""The head daemon: wiring of the socket API, the store, the bus and the scheduler loop.

Theory of operation
-------------------
Four tasks in one TaskGroup:

``submitter``  gathers submissions from the socket and inserts them in one transaction
               per batch (group commit), then answers every caller: durable before
               acknowledged, thousands per second on one connection.
``bus``        handles worker messages (``inbox.py``): registration, heartbeats
               (``liveness.py``: liveness, fencing, launch re-sends), ``started`` and
               ``finished`` reports: those waiting together go in one group commit, then
               one ack per node.
``scheduler``  runs a pass when kicked (submit, finish, node change) or on a timer:
               snapshot -> pure core -> re-checked plan -> one commit -> messages.  A kick
               after an idle spell starts a pass at once; kicks soon after the last pass wait
               out the rest of ``schedule_debounce``, or of as long as the pass took
               (``schedule_max_share``), so a burst makes one pass and passes over a long
               queue leave the head time to answer between them.
``liveness``   marks nodes DOWN after ``node_timeout`` without a heartbeat (nothing new is
               scheduled there); their jobs are requeued (or NODE_FAIL with --no-requeue)
               only once the node's lease has surely ended.  Time while the head itself is
               cut off from the broker does not count against the nodes (``liveness.py``).
               It also keeps the database's WAL checkpointed.

Leases (no job runs twice at once): a worker runs allocations only while it holds a lease,
renewed by the head's ``lease`` answer to each heartbeat (``liveness.py`` says how the two
sides time it).  Launches, stop signals and kills go out through ``commands.py``.  Every
liveness judgement, lease, resend pacing and time limit reads ``self.mono``; ``self.clock``
(the wall clock) only stamps what is stored or shown as a date.

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
from ..bus.base import HEAD_STATUS, Bus
from ..bus.messages import HeadStatus
from .. import config as config_mod
from ..config import Config, ConfigError
from ..model import JobState
from ..units import format_size_kb
from .change import Change
from .commands import WorkerCommands
from ..ctlsocket import Limits, RequestError, SocketServer
from .inbox import Routes, WorkerInbox
from .jobcaps import SubmitCaps
from .ops_admin import OPS as ADMIN_OPS
from .metrics import HeadMetrics
from .cron import OPS as CRON_OPS, Cron
from .ops_jobs import OPS as JOB_OPS, node_infos
from .ops_sched import OPS as SCHED_OPS
from .liveness import Liveness
from .ops_slurm import OPS as SLURM_OPS
from .slurm import SlurmSupport
from .ops_telemetry import OPS as TELEMETRY_OPS
from .stepops import OPS as STEP_OPS
from .steps import Steps
from .interactive import OPS as ALLOC_OPS, Allocations
from .relayed import RelayedRequests
from .outcomes import WorkerReports
from ..sched.plan import Plan
from ..sched.snapshot import live_claims
from .scheduling import (Applied, JobViews, annotate, build_snapshot, node_view, pass_gap, plan_to_txn, run_core,
                         running_view)
from .gpusharing import MigCommands
from .store import WAL_CHECKPOINT_BYTES, JobRecord, Store, free_kb, storage_problem
from .submitkeys import SubmitKeys
from .telemetry import Telemetry
from .usage import UsageLedger

log = logging.getLogger("gpud.head")

HEAD_SENDER = "head"
CHECKPOINT_IDLE_AFTER = 10.0    # seconds between truncations of the WAL (at quiet moments)
MAX_SUBMIT_BATCH = 1000
STATUS_REFRESH = 60.0           # seconds between re-publications of the retained "online"
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
        self.run_since: dict[tuple[int, int], float] = {}   # allocation -> mono time it started
        self.usage = UsageLedger()           # fair-share usage, decayed, persisted
        self.last_plan: Plan | None = None   # factors and reasons for sprio
        self.ready = asyncio.Event()         # set once the socket accepts requests
        self.passes = 0
        # The parts, each given what it uses.  What the lambdas read is read at call time:
        # reloads swap the config, tests the clocks and parts (a restarted head's steps or
        # telemetry).
        self.relayed = RelayedRequests(       # gpuctl requests from relays (head/requests)
            bus, dispatch=lambda caller, line: self.server.dispatch(caller, line), config=lambda: self.cfg,
            clock=lambda: self.clock())
        self.telemetry = Telemetry.of(self)   # GPU samples: job aggregates, node series, idle GPUs
        self.metrics = HeadMetrics(           # /metrics, when [head] metrics_listen is set
            store, config=lambda: self.cfg, clock=lambda: self.clock(), telemetry=lambda: self.telemetry)
        self.slurm = SlurmSupport(            # holds, dependencies, arrays, scrontab, mail
            store, Cron(store, lock=self.lock, kick=self.kick, config=lambda: self.cfg, clock=lambda: self.clock(),
                        node_infos=lambda: node_infos(self)),
            config=lambda: self.cfg, ran_for=self.ran_for,
            send_signal=lambda job, sig, **kw: self.commands.send_signal(job, sig, **kw))
        self.mig = MigCommands(store, bus, config=lambda: self.cfg)   # MIG re-layouts sent, not yet answered
        self.steps = Steps.of(self)           # gpuctl srun steps inside running jobs
        self.allocs = Allocations(            # salloc keepalives (interactive jobs)
            store, change=self.change, config=lambda: self.cfg, admins=lambda: self.admins,
            sweep_steps=lambda now: self.steps.sweep(now))
        lease_seq: dict[str, int] = {}   # node -> the heartbeat its last lease answered
        # Launches, signals, kills (re-sent by liveness), each under the node's last lease.
        self.commands = WorkerCommands(
            bus, store, config=lambda: self.cfg, mono=lambda: self.mono(), clock=lambda: self.clock(),
            launch_fields=self.slurm.launch_fields, lease_seq=lease_seq,
            fail=lambda node, report: self.reports.apply([(node, report)]))
        # started/finished reports: group commits
        self.reports = WorkerReports(store, self.commands, change=self.change,
                                     job_ended=lambda job_id: self.steps.job_ended(job_id))
        # Registers, heartbeats, leases (granted into lease_seq), lost nodes.
        self.liveness = Liveness(
            store, bus, self.commands, config=lambda: self.cfg, mono=lambda: self.mono(), change=self.change,
            lease_seq=lease_seq, checkpoint=self.checkpoint, registered=self.mig.registered,
            job_ended=lambda job_id: self.steps.job_ended(job_id))
        # The bus loop: workers' messages to the parts above.
        self.inbox = WorkerInbox(bus, store, Routes(
            relayed=lambda msg: self.relayed.handle(msg),
            register=lambda node, m: self.liveness.on_register(node, m),
            heartbeat=lambda node, m: self.liveness.on_heartbeat(node, m),
            started=lambda node, m: self.allocs.started(node, m),
            reports=lambda run: self.reports.apply(run),
            samples=lambda node, m: self.telemetry.ingest(node, m),
            bad_samples=lambda: self.telemetry.count_dropped(),
            step=lambda node, m: self.steps.handle(node, m)))
        self.submit_keys = SubmitKeys(lambda: self.mono())   # idempotent submission (submitkeys.py)
        self._disk_checked = float("-inf")   # mono time of the last free-space check
        self._truncated = float("-inf")      # mono time of the WAL's last truncation
        self._free_kb: float | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self) -> None:
        now = self.clock()
        self.liveness.head_started()
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
                    tg.create_task(self.inbox.run(), name="bus"),
                    tg.create_task(self._scheduler(), name="scheduler"),
                    tg.create_task(self.liveness.run(), name="liveness"),
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
        self.liveness.bus_reconnected()
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
        await asyncio.gather(*(self.commands.send_launch(j) for j in applied.launches))
        await self.mig.send(applied.relayouts, now)
        for job, p in applied.stops:
            if p.for_job is not None:
                self.claims[job.job_id] = p.for_job
            log.info("job %d (user %s) preempted on %s: %s", job.job_id, job.user, job.node, p.reason)
            await self.commands.send_signal(job, job.spec.signal or "TERM", grace=p.grace_time, reason="preempted")
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

    def ran_for(self, job: JobRecord) -> float:
        """Seconds the job's allocation has run, on the monotonic clock.  An allocation from
        before this head started is dated once from its (wall-clock) start time."""
        key = (job.job_id, job.attempt)
        since = self.run_since.get(key)
        if since is None:
            since = self.run_since[key] = self.mono() - max(0.0, self.clock() - (job.start_time or self.clock()))
        return self.mono() - since

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

    def allocation_ended(self, job: JobRecord, end: float) -> None:
        """After an allocation's end is committed: bill the job (its allocation as it was)
        and stop re-sending its stop signal."""
        if job.node is not None:
            self.usage.job_ended(running_view(job), node_view(self.store, job.node), end, self.cfg.sched)
        key = (job.job_id, job.attempt)
        self.commands.forget(key)
        self.run_since.pop(key, None)

