"""GPU telemetry at the head: worker samples in; per-job aggregates, a bounded per-node
series and idle-GPU flags out.

Theory of operation
-------------------
Every worker publishes a compact ``samples`` message every ``sample_interval`` seconds
(gpud/worker/telemetry.py): one row per GPU (utilization, memory, power, temperature and the
energy used since its previous sample) and which allocation holds which GPU.  The head's bus
loop decodes it (``gpud.bus.messages.Samples``: a bad one is dropped with one log line and
counted in ``dropped``), and ``ingest`` folds it into three things:

* the **latest reading** of every node, in memory, for ``/metrics`` and ``gpuctl top``;
* **per-job aggregates** (``JobUsage``).  A sample stands for ``iv`` seconds (the worker's
  interval), so a job on G GPUs gains ``G * iv`` sampled GPU-seconds, ``sum(util) * iv / 100``
  GPU-seconds of work, and idle GPU-seconds for each GPU under ``IDLE_UTIL``; the mean
  utilization is work over sampled GPU-seconds.  Samples are attributed with the head's own
  view (the job's node, attempt and GPUs), so a late sample of an ended attempt is ignored;
* the **per-node series**: samples are averaged into buckets of ``telemetry_resolution``
  seconds on the head's clock; a closed bucket becomes one ``node_series`` row, and rows
  older than ``telemetry_retention`` are deleted, so the table holds at most
  ``retention / resolution + 1`` rows per node however long the cluster runs.

``flush`` writes what changed in one transaction: aggregates to ``job_telemetry`` and to the
job's own columns (``gpu_util_mean`` ... which ``squeue``/``sacct`` read), closed buckets, and
the retention cut.  It runs every ``FLUSH_EVERY`` seconds; a head crash loses at most that
much telemetry, never a job.

Idle GPUs: a RUNNING job whose every GPU reads under its partition's ``idle_threshold``
for ``idle_period`` is flagged: reason ``GpuIdle`` and a ``gpu_idle`` event, through
``Txn.transition`` like any other change.  With ``idle_action = "requeue"`` or ``"cancel"``
the same transition moves it to COMPLETING (``stop_reason`` ``idle:requeue`` or
``idle:cancel``, which ``head.jobs.final_state`` turns into PENDING or CANCELLED) and the
worker is told to stop it.  A flagged job that gets busy again loses the flag.  A job that
asked for ``--no-requeue`` is only flagged by a requeue policy.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..bus.messages import Samples
from ..model import JobState, StopReason
from ..units import format_duration
from . import gang
from .store import JobRecord, Store
from .store_telemetry import USAGE_COLUMNS, TelemetryRepository

if TYPE_CHECKING:
    from ..config import Config
    from .change import Change
    from .daemon import Head

log = logging.getLogger("gpud.telemetry")

IDLE_UTIL = 5.0              # percent: a GPU under this is idle in reports and aggregates
FLUSH_EVERY = 10.0           # seconds between writes of aggregates and series
IDLE_REASON = "GpuIdle"      # the flag squeue shows as the job's reason

@dataclass(frozen=True)
class GpuReading:
    index: int
    util: float | None
    mem_used_mb: int | None
    power_w: float | None
    temp_c: float | None
    energy_j: float | None     # used since the worker's previous sample


@dataclass(frozen=True)
class NodeSample:
    """One validated ``samples`` message."""

    node: str
    time: float                                   # head clock at receipt
    interval: float                               # seconds the sample stands for
    gpus: dict[int, GpuReading]
    jobs: dict[tuple[int, int], tuple[int, ...]] | None   # (job, attempt) -> GPU indices
    slices: tuple[tuple[int, str, int], ...] = ()  # (GPU index, slice UUID, MiB used)
    procs: tuple[tuple[int, int, int], ...] = ()   # (GPU index, pid, MiB used)
    # (job, attempt, step or "" for the whole job, peak bytes or None, CPU microseconds or None)
    usage: tuple[tuple[int, int, str, int | None, int | None], ...] = ()


@dataclass
class JobUsage:
    """Aggregates of one job over all its attempts (the ``job_telemetry`` row)."""

    job_id: int
    sampled_s: float = 0.0     # wall seconds covered by samples
    gpu_s: float = 0.0         # GPU-seconds covered by samples
    util_gpu_s: float = 0.0    # GPU-seconds of work: sum of util/100 x seconds
    idle_gpu_s: float = 0.0    # GPU-seconds under IDLE_UTIL
    util_max: float | None = None
    mem_max_mb: int | None = None
    energy_j: float = 0.0
    last_sample: float | None = None
    # memory only: the idle streak of the current attempt
    attempt: int = 0
    idle_since: float | None = None

    @property
    def util_mean(self) -> float | None:
        return 100.0 * self.util_gpu_s / self.gpu_s if self.gpu_s > 0 else None

    def add(self, readings: list[GpuReading], interval: float, now: float) -> None:
        utils = [r.util for r in readings if r.util is not None]
        self.sampled_s += interval
        self.gpu_s += interval * len(utils)
        self.util_gpu_s += interval * sum(utils) / 100.0
        self.idle_gpu_s += interval * sum(1 for u in utils if u < IDLE_UTIL)
        if utils:
            self.util_max = max(utils + ([self.util_max] if self.util_max is not None else []))
        mems = [r.mem_used_mb for r in readings if r.mem_used_mb is not None]
        if mems:
            self.mem_max_mb = max(mems + ([self.mem_max_mb] if self.mem_max_mb is not None else []))
        self.energy_j += sum(r.energy_j for r in readings if r.energy_j is not None)
        self.last_sample = now

    def public(self) -> dict[str, Any]:
        """The JOB record's telemetry fields."""
        mean = self.util_mean
        return {"gpu_util_mean": None if mean is None else round(mean, 2), "gpu_util_max": self.util_max,
                "gpu_mem_max_mb": self.mem_max_mb, "energy_j": round(self.energy_j, 1)}


_USAGE_COLS = USAGE_COLUMNS


@dataclass
class _Bucket:
    """One node's samples within one series bucket."""

    start: float
    samples: int = 0
    gpus: int = 0
    gpus_alloc: int = 0
    util: list[float] = field(default_factory=list)     # per-sample mean over GPUs
    util_max: float | None = None
    mem: list[float] = field(default_factory=list)      # per-sample total MiB used
    power: list[float] = field(default_factory=list)    # per-sample total watts
    temp_max: float | None = None

    def row(self, node: str) -> tuple:
        return (node, self.start, self.gpus, self.gpus_alloc, _mean(self.util), self.util_max,
                _mean(self.mem), _mean(self.power), self.temp_max, self.samples)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


# -- reading ------------------------------------------------------------------------------------

def node_sample(node: str, msg: Samples, now: float) -> NodeSample:
    """A decoded ``samples`` message as the head keeps it, stamped with its own clock."""
    gpus = {r[0]: GpuReading(index=r[0], util=_float(r[1]), mem_used_mb=None if r[2] is None else int(r[2]),
                             power_w=_float(r[3]), temp_c=_float(r[4]), energy_j=_float(r[5]))
            for r in msg.gpus}
    jobs = None if msg.jobs is None else {(j, a): g for j, a, g in msg.jobs}
    return NodeSample(node=node, time=now, interval=float(msg.iv), gpus=gpus, jobs=jobs,
                      slices=msg.slices, procs=msg.procs, usage=msg.usage)


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


# -- the head side --------------------------------------------------------------------------------

class Telemetry:
    """The head's telemetry.  Given the store (read; its writes take the head's lock, its
    idle flags go through the change door) and getters for the live config and the wall
    clock (read at call time: a reload swaps the config, tests the clock)."""

    def __init__(self, store: Store, *, lock: asyncio.Lock, change: Callable[[], "Change"],
                 config: Callable[[], "Config"], clock: Callable[[], float]) -> None:
        self.store = store
        self._lock = lock
        self._change = change
        self._config = config
        self._clock = clock
        self.rows = TelemetryRepository(store)
        self.latest: dict[str, NodeSample] = {}        # node -> its last sample
        self.usage: dict[int, JobUsage] = {}           # jobs sampled and not yet flushed out
        # running jobs' cgroup accounting per step ("total", "batch", "step_0"...): (time, bytes, usec)
        self.steps: dict[int, dict[str, tuple[float, int | None, int | None]]] = {}
        self._dirty: set[int] = set()
        self._buckets: dict[str, _Bucket] = {}        # node -> its open bucket
        self._closed: list[tuple[str, _Bucket]] = []   # buckets waiting for the next flush
        self.dropped = 0                               # malformed samples, for /metrics
        self.energy_j: dict[tuple[str, int], float] = {}   # (node, GPU) -> joules sampled, for /metrics
        self._loaded = False                           # aggregates of the running jobs read back

    @classmethod
    def of(cls, head: "Head") -> "Telemetry":
        """The telemetry of ``head``, wired as ``Head.__init__`` wires it (a test's restarted
        head builds it the same way)."""
        return cls(head.store, lock=head.lock, change=head.change, config=lambda: head.cfg,
                   clock=lambda: head.clock())

    def count_dropped(self) -> None:
        """A malformed sample was dropped (the inbox logged it)."""
        self.dropped += 1

    @property
    def resolution(self) -> float:
        return self._config().head.telemetry_resolution

    @property
    def retention(self) -> float:
        return self._config().head.telemetry_retention

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            try:
                await self.flush()
            except Exception:  # the disk said no: keep the aggregates, try again later
                log.exception("telemetry flush failed; will retry")

    # -- samples in -------------------------------------------------------------------------

    async def ingest(self, node: str, msg: Samples) -> None:
        now = self._clock()
        sample = node_sample(node, msg, now)
        self.latest[node] = sample
        self._take_usage(sample)
        for r in sample.gpus.values():
            if r.energy_j is not None:
                self.energy_j[(node, r.index)] = self.energy_j.get((node, r.index), 0.0) + r.energy_j
        held = self._allocations(sample)
        self._add_to_bucket(sample, sum(len(g) for _, g in held))
        for job, gpus in held:
            readings = [sample.gpus[i] for i in gpus if i in sample.gpus]
            if not readings:
                continue
            usage = await self._usage(job.job_id)
            usage.add(readings, sample.interval, now)
            self._dirty.add(job.job_id)
            job = self.store.active.get(job.job_id, job)   # _usage may have awaited
            for k, v in usage.public().items():   # squeue and sacct see it at once
                setattr(job, k, v)
            if job.state is JobState.RUNNING:
                await self._check_idle(job, usage, readings, now)

    def _take_usage(self, sample: NodeSample) -> None:
        """A running job's cgroup accounting: the whole job's on its record (squeue, sacct
        see it at once; its end report makes it final), its steps' for sstat."""
        for job_id, attempt, step, rss, cpu_usec in sample.usage:
            job = self.store.active.get(job_id)
            if job is None or job.attempt != attempt or job.node != sample.node or not job.state.active:
                continue
            if step == "":
                job.max_rss = rss
                job.total_cpu = None if cpu_usec is None else cpu_usec / 1e6
            steps = self.steps.setdefault(job_id, {})
            steps[step or "total"] = (sample.time, rss, cpu_usec)
        for job_id in [j for j in self.steps if j not in self.store.active
                       or not self.store.active[j].state.active]:
            del self.steps[job_id]

    def _allocations(self, sample: NodeSample) -> list[tuple[JobRecord, tuple[int, ...]]]:
        """The head's jobs on this node with their GPUs, limited to what the worker runs.

        The worker's list names the candidates (no scan of every active job per sample); the
        head's record decides: same node, same attempt, still active, and only its GPUs."""
        if sample.jobs is None:
            return [(j, tuple(j.gpu_indices)) for j in self.store.jobs_on_node(sample.node)
                    if j.gpu_indices and j.node == sample.node]   # rank 0's node only (gang jobs)
        out = []
        for (job_id, attempt), reported in sample.jobs.items():
            job = self.store.active.get(job_id)
            held = gang.gpus_on(job, sample.node) if job is not None else None   # any node of a gang
            if job is None or held is None or job.attempt != attempt or not job.state.active:
                continue  # an old attempt, or one the head has not (or no longer) placed here
            gpus = tuple(i for i in held if i in reported)
            if gpus:
                out.append((job, gpus))
        return out

    async def _usage(self, job_id: int) -> JobUsage:
        if not self._loaded:
            await self._load_active()
        usage = self.usage.get(job_id)
        if usage is None:   # every active job's row was read back: this one has none yet
            usage = self.usage[job_id] = JobUsage(job_id)
        return usage

    async def _load_active(self) -> None:
        """Read back the aggregates of every active job once (after a head restart)."""
        for row in await self.rows.usage_rows(self.store.active):
            self.usage.setdefault(row[0], JobUsage(row[0], **dict(zip(_USAGE_COLS, row[1:]))))
        self._loaded = True

    async def load_usage(self, job_id: int) -> JobUsage:
        """A job's aggregates as last written (empty when never sampled)."""
        row = await self.rows.usage_row(job_id)
        return JobUsage(job_id, **dict(zip(_USAGE_COLS, row))) if row else JobUsage(job_id)

    def _add_to_bucket(self, sample: NodeSample, gpus_alloc: int) -> None:
        start = math.floor(sample.time / self.resolution) * self.resolution
        b = self._buckets.get(sample.node)
        if b is None or b.start != start:
            if b is not None:
                self._closed.append((sample.node, b))
            b = self._buckets[sample.node] = _Bucket(start)
        utils = [g.util for g in sample.gpus.values() if g.util is not None]
        b.samples += 1
        b.gpus = max(b.gpus, len(sample.gpus))
        b.gpus_alloc = max(b.gpus_alloc, gpus_alloc)
        if utils:
            b.util.append(sum(utils) / len(utils))
            b.util_max = _max(b.util_max, max(utils))
        mems = [g.mem_used_mb for g in sample.gpus.values() if g.mem_used_mb is not None]
        if mems:
            b.mem.append(float(sum(mems)))
        powers = [g.power_w for g in sample.gpus.values() if g.power_w is not None]
        if powers:
            b.power.append(sum(powers))
        temps = [g.temp_c for g in sample.gpus.values() if g.temp_c is not None]
        if temps:
            b.temp_max = _max(b.temp_max, max(temps))

    # -- idle GPUs --------------------------------------------------------------------------

    async def _check_idle(self, job: JobRecord, usage: JobUsage, readings: list[GpuReading],
                          now: float) -> None:
        part = self._config().sched.partitions.get(job.partition)
        if part is None or not part.idle_period:
            return
        if usage.attempt != job.attempt:
            usage.attempt, usage.idle_since = job.attempt, None
        utils = [r.util for r in readings if r.util is not None]
        if not utils:
            return  # nothing to judge by (MIG slices report no utilization)
        if max(utils) >= part.idle_threshold:
            usage.idle_since = None
            if job.reason == IDLE_REASON:
                await self._mark(job, None, None, now, "gpu_busy",
                                 f"GPUs busy again ({max(utils):g}%)")
            return
        if usage.idle_since is None:
            usage.idle_since = now
        if now - usage.idle_since < part.idle_period:
            return
        detail = f"every GPU under {part.idle_threshold:g}% for {format_duration(now - usage.idle_since)}"
        action = part.idle_action
        if action == "requeue" and not job.spec.requeue:
            action, detail = "none", detail + "; not requeued: the job asked for --no-requeue"
        if action == "none" and job.reason == IDLE_REASON:
            return   # flagged already (a policy turned on by a reload acts on it next sample)
        log.warning("job %d (user %s) on %s: GPUs idle: %s; action %s", job.job_id, job.user, job.node,
                    detail, action)
        await self._mark(job, IDLE_REASON, action, now, "gpu_idle", f"{detail}; action {action}")

    async def _mark(self, job: JobRecord, reason: str | None, action: str | None, now: float,
                    event: str, detail: str) -> None:
        """Flag (or unflag) a job, and stop it when ``action`` says so."""
        async with self._change() as ch:   # ``now`` is the sample's time, not the change's
            current = self.store.active.get(job.job_id)
            if current is None or current.state is not JobState.RUNNING or current.attempt != job.attempt:
                return
            if action in ("requeue", "cancel"):
                updated = ch.txn.transition(current, JobState.COMPLETING, now=now, event=event, detail=detail,
                                            reason=reason, stop_reason=StopReason.idle(action).value,
                                            stop_time=now)
                ch.signal(updated, "TERM", grace=self._config().head.kill_grace,
                          reason="cancelled" if action == "cancel" else "preempted")
                ch.wake()
            else:
                ch.txn.transition(current, JobState.RUNNING, now=now, event=event, detail=detail, reason=reason)

    # -- writes ----------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write changed aggregates and closed buckets, and cut the series to its retention."""
        now = self._clock()
        current = math.floor(now / self.resolution) * self.resolution
        for node, b in list(self._buckets.items()):
            if b.start < current:   # no later sample closed it: the node went quiet
                self._closed.append((node, b))
                del self._buckets[node]
        # Taken now: samples that arrive while the commit runs belong to the next flush.
        dirty, self._dirty = self._dirty, set()
        closed, self._closed = self._closed, []
        usages = [self.usage[j] for j in sorted(dirty)]
        rows = [(u.job_id, tuple(getattr(u, c) for c in _USAGE_COLS), tuple(u.public().values())) for u in usages]
        try:
            async with self._lock:   # one transaction at a time on the store's connection
                await self.rows.flush(rows, [b.row(node) for node, b in closed], cut_before=now - self.retention)
        except BaseException:
            self._dirty |= dirty
            self._closed = closed + self._closed
            raise
        for job_id in [j for j in self.usage if j not in self.store.active and j not in self._dirty]:
            del self.usage[job_id]     # ended and written: the table has it now
