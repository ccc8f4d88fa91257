"""Discrete-event simulation of a gpud cluster on a virtual clock, driving the real core.

Theory of operation
-------------------
The simulator plays the head's part: it keeps the cluster's state, builds a ``Snapshot``,
calls ``gpud.sched.core.schedule(snapshot, now)`` and applies the ``Plan`` the way the
head does: ``gpud.sched.apply`` re-checks it against what running jobs hold (kept in one
``Holdings`` for the whole run), then what holds starts, preemptions signal their victims
and re-layouts re-cut their GPUs.  No scheduling decision is made here.

Time moves only from event to event.  Events are trace arrivals (pulled one row at a time
from the streaming trace reader, so the trace is never all in memory), run ends
(completion or time limit), the ends of preemption grace periods, and wake-ups at the
expected starts the core reserved.  All events at one timestamp are applied together and
followed by at most one scheduler pass.  Stale events (a run end for an attempt that was
preempted) are recognised by attempt number.

Passes are the whole cost (the core rebuilds its working state from each snapshot), so a
pass runs only when it could act: some waiting job's request fits in the GPUs free on one
node, or the policy can preempt.  ``pass_interval`` further spaces passes out on the
virtual clock, trading later starts for speed on long traces.

A preempted job is signalled (its run becomes ``stopping``, the GPUs stay busy) and its
GPUs free when the grace time ends; as in the head, the stop decides over how the process
ended, so a job that finishes within its grace is still requeued (keeping its submit
time, with ``preempt_count`` + 1) or, in ``cancel`` mode, ends PREEMPTED.  A requeued job
runs its whole duration again.  A run lasts its trace duration or its time limit,
whichever is shorter (then it ends TIMEOUT).

A job asking for more whole GPUs than the largest node has (of its GPU type) becomes a
multi-node (gang) job, as a Slurm user would ask for it: ``N = ceil(gpus / largest)``
nodes of ``ceil(gpus / N)`` GPUs each, so its GPU count is rounded up to a multiple of
``N`` when it does not divide evenly (counted as ``rounded_up``).  The core starts it on
all N nodes at once (``Start.parts``); the engine takes every part's GPUs, CPUs and
memory in one step and gives them all back when the run ends.

Jobs that can never start are refused at arrival by the head's own submit-time check
(``gpud.sched.admission``: more GPUs than N nodes of the type can hold, a GPU type the
cluster lacks, a MIG profile or GPU memory no GPU offers, an unknown QOS, a time limit over
the partition's, ...) and counted by the kind of reason.  Trace accounts the config lacks
join the account tree with one share each, and trace users belong to their accounts, so
any trace runs under any config.

A background load (``--background``, gpud/sim/background.py) arrives merged into the one
stream of rows; its rows are marked, and with ``drain`` the run ends once every job of the
main stream has ended, cutting the background there (serving instances may run for weeks).

Fractions of a GPU (trace ``gpus`` below one, ``mig_profile``, ``gpu_mem``) become requests
for the core's GPU sharing (gpud/sim/sharing.py); the engine tracks whole GPUs itself and
counts a slice or share by its fraction, and runs a pass for waiting fractional jobs when
a slice or share may have come free.

Speed: the core is most of the time, so the engine's own work per event is constant:
nodes are built once; pending and running views are immutable and kept in dicts keyed by
job id, so a snapshot is two ``tuple(dict.values())`` copies; usage per (account, user)
and the report's per-account sums settle lazily, when their rates change.  Python's
collector is off during a run and collects the passes' cycles every ``GC_EVERY`` passes.
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator

from ..sched import admission, usage as sched_usage
from ..sched.admission import Resolved
from ..sched.apply import Held, Holdings, apply_plan, pieces
from ..sched.config import AccountConfig, PartitionConfig, SchedConfig
from ..sched.core import schedule as core_schedule
from ..sched.fragmentation import DEFAULT_SIZE
from ..sched.plan import Plan, Preemption, Relayout, Start
from ..sched.snapshot import NodeView, PendingJob, RunningJob, Snapshot, live_claims
from . import sharing as _sharing
from .estimates import Estimates
from .report import Tally, size_bucket
from .trace import TraceJob, TraceStats

__all__ = ["Simulation", "simulate"]

log = logging.getLogger("gpud.sim")

# Event kinds, in the order they apply within one timestamp.
_END, _GRACE, _WAKE = 0, 1, 2
# A core that keeps planning at one instant (zero grace, flip-flopping) must not hang us.
MAX_PASSES_PER_INSTANT = 100
# Preemption times handed to the core for its rate cap: the last minute, as the head does.
PREEMPT_WINDOW_S = 60.0
# Python's automatic collector is off during a run: passes leave reference cycles (the
# core's pass object and its helpers), collected every GC_EVERY passes, young objects only,
# and the next generation every GC_OLDER_EVERY of those.  Automatic full collections would
# instead scan every live job record several times a pass (about 10 % of a month's CPU).
GC_EVERY = 8
GC_OLDER_EVERY = 32
# Arrivals' admission answers kept by request shape, up to this many.
REFUSALS_KEPT = 4096


class _Job:
    """The simulator's mutable record of one admitted job."""

    __slots__ = ("trace", "account", "user", "qos", "submit", "limit", "attempt",
                 "preempt_count", "first_start", "node", "gpu_indices", "start",
                 "stop_mode", "weight", "bucket", "amount", "shared", "nodes")

    def __init__(self, trace: TraceJob, account: str, qos: str, submit: float,
                 limit: float | None) -> None:
        self.trace = trace
        self.account = account
        self.user = trace.user
        self.qos = qos
        self.submit = submit
        self.limit = limit
        self.attempt = 0
        self.preempt_count = 0
        self.first_start: float | None = None
        self.node: str | None = None
        self.gpu_indices: tuple[int, ...] = ()
        self.start = 0.0
        self.stop_mode: str | None = None   # set once preempted: "requeue" or "cancel"
        self.weight = 1.0                   # billing weight of the GPUs of the current run
        self.bucket = size_bucket(trace.gpus, trace.share)
        self.amount = 0.0                   # GPUs the current run occupies (a share: its fraction)
        self.shared = False                 # the current run holds slices or shares
        self.nodes = 1                      # a gang job: this many nodes, gpus // nodes on each


class _Usage:
    """Decayed, billed GPU-seconds per (account, user), on the virtual clock.

    Each key keeps its value as of its last change and its billing rate since (billed GPUs,
    fractions for shares).  A key is brought up to date only when its rate changes or a
    snapshot reads it, with the core's own ``gpud.sched.usage`` arithmetic (decay plus the
    decayed integral of the rate, exact for any step), so time passing costs nothing.
    """

    def __init__(self, config: SchedConfig) -> None:
        self._keys: dict[tuple[str, str], list[float]] = {}    # key -> [value, as of, rate]
        self.half_life = config.fairshare_half_life

    def _settle(self, cell: list[float], t: float) -> None:
        value, t0, rate = cell
        if t > t0:
            hl = self.half_life
            cell[0] = sched_usage.decay(value, t - t0, hl) + (
                sched_usage.decayed_integral(rate, t0, t, t, hl) if rate else 0.0)
            cell[1] = t

    def add_rate(self, key: tuple[str, str], rate: float, t: float) -> None:
        cell = self._keys.get(key)
        if cell is None:
            cell = self._keys[key] = [0.0, t, 0.0]
        self._settle(cell, t)
        r = cell[2] + rate
        cell[2] = 0.0 if abs(r) < 1e-9 else r

    def values(self, t: float) -> dict[tuple[str, str], float]:
        """Every key's usage as of ``t``."""
        for cell in self._keys.values():
            self._settle(cell, t)
        return {k: cell[0] for k, cell in self._keys.items()}


class Simulation:
    """One run of a trace on a cluster under a scheduling config."""

    def __init__(self, nodes: tuple[NodeView, ...], jobs: Iterable[TraceJob],
                 config: SchedConfig | None = None, *, until: float | None = None,
                 trace_stats: TraceStats | None = None, ignore_gpu_type: bool = False,
                 exact_limits: bool = False, pass_interval: float = 0.0,
                 estimates: Estimates | None = None, period: float = 7 * 86400.0,
                 series_step: float | None = None, record_starts: bool = False,
                 drain: bool = False,
                 schedule: Callable[[Snapshot, float], Plan] = core_schedule) -> None:
        self.nodes = tuple(sorted(nodes, key=lambda n: n.name))
        self.config = config if config is not None else SchedConfig()
        self.until = until
        # with ``until``: stop arrivals there but run on until every admitted job has ended
        self.drain = drain and until is not None
        self.trace_stats = trace_stats
        self.ignore_gpu_type = ignore_gpu_type
        self.estimates = estimates if estimates is not None else Estimates(
            "exact" if exact_limits else "user")
        self.pass_interval = max(0.0, float(pass_interval))
        self._last_pass = -math.inf
        self._schedule = schedule
        self._rows: Iterator[TraceJob] = iter(jobs)
        self._next_row: TraceJob | None = None
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._wakes: set[float] = set()
        self.clock = 0.0
        self.jobs: dict[int, _Job] = {}
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self._node_by_name = {n.name: n for n in self.nodes}
        # what running jobs hold, kept for the whole run: plans are re-checked against it
        # (gpud.sched.apply), and ``_free`` is each node's set of GPUs free to be given whole
        self._holdings = Holdings(self._node_by_name)
        self._free = {n.name: self._node(n.name).free for n in self.nodes}
        self._models = {n.name: {g.index: g.model for g in n.gpus} for n in self.nodes}
        self._node_model = {n.name: (n.gpus[0].model if len({g.model for g in n.gpus}) == 1
                                     else None) for n in self.nodes}
        # waiting whole-GPU requests: (GPU type, GPUs per node, nodes) -> jobs
        self._pending_shapes: Counter[tuple[str | None, int, int]] = Counter()
        # nodes by free GPUs, per model (None: any model): [model][k] = nodes with k free
        self._free_hist: dict[str | None, list[int]] = {}
        for n in self.nodes:
            for model, k in self._free_counts(n.name).items():
                hist = self._free_hist.setdefault(model, [0] * (len(n.gpus) + 1))
                if len(hist) <= k:
                    hist.extend([0] * (k + 1 - len(hist)))
                hist[k] += 1
        # whole GPUs of a model (None: any) per node, most first: which gangs could ever run
        self._node_gpus: dict[str | None, list[int]] = {None: []}
        for n in self.nodes:
            whole = [g for g in n.gpus if g.mode == "whole" or (g.mode == "mps" and g.dynamic)]
            self._node_gpus[None].append(len(whole))
            for model in {g.model for g in n.gpus}:
                self._node_gpus.setdefault(model, []).append(sum(1 for g in whole if g.model == model))
        for counts in self._node_gpus.values():
            counts.sort(reverse=True)
        # the most whole GPUs of a model (None: any) on one node
        self._max_gpus = {model: counts[0] if counts else 0 for model, counts in self._node_gpus.items()}
        self._fractions = _sharing.Fractions(self.nodes)
        self._refusals: dict[tuple, str | None] = {}     # _refusal's answers
        # fractional jobs waiting, and whether shared devices may have come free since the last pass
        self._shared_pending = 0
        self._shared_dirty = False
        self.total_gpus = sum(len(n.gpus) for n in self.nodes)
        self.allocated = 0.0               # GPUs occupied: whole ones, plus slices and shares by fraction
        self.tally = Tally(total_gpus=self.total_gpus, period=period, series_step=series_step,
                           frag_size=max(1, min(DEFAULT_SIZE, self._max_gpus[None])))
        # the fewest GPUs a job waiting for Resources wants, as of the last pass
        self._resources_need: int | None = None
        # (time, trace job id, node, GPU indices) of every start, when asked for
        self.start_log: list[tuple[float, str, str, tuple[int, ...]]] | None = (
            [] if record_starts else None)
        self.usage = _Usage(self.config)
        self.core_cpu_s = 0.0              # CPU seconds spent in the core (for benchmarks; not reported)
        self._recent_preemptions: deque[float] = deque()
        self._claims: dict[int, int] = {}  # victim -> the job it was preempted for, until that starts
        self._main_alive = 0               # admitted jobs of the main stream not yet ended
        self._started = False
        # A schedule function other than the core may do anything: give it every event.
        self._can_preempt = schedule is not core_schedule or _may_preempt(self.config)

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Simulate to the end of the trace (or ``until``) and return the report."""
        if self._started:
            raise RuntimeError("a Simulation runs once")
        self._started = True
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> dict[str, Any]:
        self._pull_row()
        instant_passes, last_instant = 0, None
        while True:
            t = self._next_time()
            if t is None or (self.until is not None and t > self.until and not self.drain):
                break
            if self._next_row is None and not self.pending and not self.running:
                break                  # all done: wake-ups left for reservations are moot
            if self.drain and self._next_row is None and self._main_alive == 0 \
                    and t > self.until:
                break                  # drained: a background load is cut there
            self._advance(t)
            if not self._apply_events(t):
                continue
            if t < self._last_pass + self.pass_interval:
                self._wake(self._last_pass + self.pass_interval)
                continue
            if t != last_instant:
                instant_passes, last_instant = 0, t
            if self.pending and instant_passes < MAX_PASSES_PER_INSTANT:
                instant_passes += 1
                self._last_pass = t
                self._pass(t)
            elif self.pending and instant_passes == MAX_PASSES_PER_INSTANT:
                instant_passes += 1
                log.warning("scheduler planned %d times at t=%s; waiting for the next event",
                            MAX_PASSES_PER_INSTANT, t)
        end = self.until if self.until is not None and not self.drain else self.clock
        self._advance(max(end, self.clock))
        stats = self.trace_stats
        trace = ({"rows": stats.rows, "accepted": stats.accepted,
                  "skipped": dict(sorted(stats.skipped.items()))} if stats else {})
        return self.tally.report(end=self.clock, pending=len(self.pending),
                                 running=len(self.running), trace=trace, nodes=len(self.nodes),
                                 config=self.config)

    def _next_time(self) -> float | None:
        times = []
        if self._heap:
            times.append(self._heap[0][0])
        if self._next_row is not None:
            times.append(max(self._next_row.submit_s, self.clock))
        return min(times) if times else None

    def _advance(self, t: float) -> None:
        dt = t - self.clock
        if dt > 0:
            free = stranded = 0
            if self.pending:       # gpud.sched.fragmentation's numbers, from the count of nodes by free GPUs
                size = self.tally.frag_size
                for k, n in enumerate(self._free_hist.get(None, ())):
                    free += k * n
                    stranded += (k % size) * n
            self.tally.advance(self.clock, t, self.allocated, len(self.pending),
                               self._resources_need if self.pending else None, free, stranded)
            self.clock = t

    def _apply_events(self, t: float) -> bool:
        """Apply every event due at ``t``; False when no pass could change anything."""
        heap = self._heap
        changed = False
        while heap and heap[0][0] <= t:
            _, kind, _, job_id, attempt = heapq.heappop(heap)
            if kind == _WAKE:          # a time the core asked for (a reservation, a re-layout done)
                self._wakes.discard(t)
                changed = self._shared_dirty = True
                continue
            job = self.jobs.get(job_id)
            if job is None or job.attempt != attempt or job_id not in self.running:
                continue  # stale: that run already ended
            if kind == _END:
                self._end_run(job, t, natural=True)
                changed = True
            elif kind == _GRACE and job.stop_mode is not None:
                self._end_run(job, t, natural=False)
                changed = True
        while self._next_row is not None and self._next_row.submit_s <= t:
            if self._arrive(self._next_row, t) is not None:
                changed = True
            self._pull_row()
        act = changed and self._pass_could_act()
        if not act and self.pending and self._resources_need is None:
            # no pass to say who waits for Resources: nothing fits, so the smallest waiter does
            self._resources_need = min((g * k for (_, g, k), n in self._pending_shapes.items()
                                        if n > 0), default=None)
        return act

    def _pass_could_act(self) -> bool:
        """Whether a pass now might start or preempt anything.

        Without preemption a pass can only start jobs where their GPUs are free now; when no
        waiting job's request (GPU count and type) fits in the GPUs free on any one node (a
        gang of N: on N nodes), a pass would start nothing and is skipped.  Reasons and reservations it would have
        refreshed are recomputed by the next pass that runs.
        """
        if not self.pending:
            return False
        if self._can_preempt or (self._shared_pending and self._shared_dirty):
            return True
        for (gpu_type, gpus, nodes), n in self._pending_shapes.items():
            if n <= 0:
                continue
            hist = self._free_hist.get(gpu_type)
            if hist is not None and (any(hist[gpus:]) if nodes == 1 else sum(hist[gpus:]) >= nodes):
                return True
        return False

    def _free_counts(self, node: str) -> dict[str | None, int]:
        """Free GPUs on ``node``: in all (key None) and per model."""
        free = self._free[node]
        model = self._node_model[node]
        if model is not None:
            return {None: len(free), model: len(free)}
        counts: dict[str | None, int] = {None: len(free)}
        models = self._models[node]
        for m in set(models.values()):
            counts[m] = 0
        for i in free:
            counts[models[i]] += 1
        return counts

    def _refile(self, node: str, before: dict[str | None, int]) -> None:
        for model, k in self._free_counts(node).items():
            hist = self._free_hist[model]
            hist[before[model]] -= 1
            hist[k] += 1

    def _push(self, t: float, kind: int, job_id: int = 0, attempt: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, job_id, attempt))

    def _pull_row(self) -> None:
        row = next(self._rows, None)
        if row is not None and self.drain and row.submit_s > self.until:
            row = None          # arrivals are over; the rest of the trace is never read
        self._next_row = row

    # -- arrivals and ends ------------------------------------------------------------

    def _arrive(self, row: TraceJob, t: float) -> int | None:
        cfg = self.config
        limit = self._limit(row)
        gang = self._gang_shape(row)
        refusal = self._refusal(row, limit, gang)
        if refusal is not None:
            self.tally.infeasible[refusal] += 1
            return None
        if gang is not None:
            nodes, per_node = gang
            self.tally.multi_node += 1
            if nodes * per_node != row.gpus:      # N nodes x G GPUs, as a Slurm user asks
                self.tally.rounded_up += 1
                row = replace(row, gpus=nodes * per_node, share=float(nodes * per_node))
        account = row.account or cfg.default_account
        self._ensure_account(account)
        # A row older than the clock (an unsorted trace) arrives now: waits never go negative.
        submit = max(row.submit_s, t)
        job = _Job(row, account, row.qos or cfg.default_qos, submit, limit)
        if gang is not None:
            job.nodes = gang[0]
        self.jobs[row.seq] = job
        run_for = row.duration_s if limit is None else min(row.duration_s, limit)
        self.tally.submit(account, submit, run_for * row.share, job.qos)
        if not row.background:
            self._main_alive += 1
        self._make_pending(job)
        return row.seq

    def _limit(self, row: TraceJob) -> float | None:
        """The job's time limit: the trace's, else one set by ``estimates``."""
        if row.time_limit_s is not None:
            return row.time_limit_s
        part = self._partition()
        return self.estimates.limit(row.seq, row.duration_s,
                                    part.max_time if part is not None else None)

    def _partition(self) -> PartitionConfig | None:
        return self.config.partitions.get(self.config.default_partition)

    def _refusal(self, row: TraceJob, limit: float | None, gang: tuple[int, int] | None) -> str | None:
        """The kind of reason the head would refuse this job for at submit (it could never
        run: ``gpud.sched.admission``), or None; ``gang``: its ``_gang_shape``.  The account
        and user are left out: every trace account and user is valid here."""
        cfg = self.config
        gpu_type = None if self.ignore_gpu_type else row.gpu_type
        nodes, per_node = gang if gang is not None else (1, row.gpus)
        fields = _sharing.pending_fields(row, self._fractions, gpu_type)
        qos = row.qos or cfg.default_qos
        # the answer depends on the request's shape and the nodes only (cleared when they change)
        key = (gpu_type, nodes, per_node, fields["mig_profile"], fields["gpu_mem_mb"], qos, limit)
        if key in self._refusals:
            return self._refusals[key]
        if len(self._refusals) >= REFUSALS_KEPT:
            self._refusals.clear()
        request = {"gpus": nodes * per_node, "cpus": 1, "gpu_type": gpu_type, "nodes": nodes, **fields}
        resolved = Resolved(account=row.account or cfg.default_account, partition=cfg.default_partition,
                            qos=qos, time_limit=limit, mem_mb=cfg.default_mem_mb)
        why = admission.infeasible(request, resolved, row.user, cfg, self.nodes, accounts=False)
        kind = self._refusals[key] = None if why is None else why.kind
        return kind

    def _gang_shape(self, row: TraceJob) -> tuple[int, int] | None:
        """(nodes, GPUs per node) for a whole-GPU job bigger than the largest node, when
        enough nodes of its GPU type could hold it; None for a one-node job or one that
        could never run."""
        gpu_type = None if self.ignore_gpu_type else row.gpu_type
        largest = self._max_gpus.get(gpu_type, 0)
        if row.gpus <= largest or largest < 1 or row.share < 1 or row.mig_profile or row.gpu_mem:
            return None
        nodes = -(-row.gpus // largest)
        per_node = -(-row.gpus // nodes)
        counts = self._node_gpus.get(gpu_type, ())
        if len(counts) < nodes or counts[nodes - 1] < per_node:
            return None
        return nodes, per_node

    def _ensure_account(self, account: str) -> None:
        """Trace accounts the config lacks join as top-level accounts with one share."""
        accounts = self.config.accounts
        if account in accounts:
            return
        added = AccountConfig(name=account, users=("*",))
        self.config = replace(self.config, accounts={**accounts, account: added})
        self.tally.accounts_added.append(account)

    def _make_pending(self, job: _Job) -> None:
        row = job.trace
        gpu_type = None if self.ignore_gpu_type else row.gpu_type
        self.tally.queue(job.account, row.share, job.qos)
        pend = PendingJob(
            job_id=row.seq, user=job.user, account=job.account,
            partition=self.config.default_partition, qos=job.qos, gpus=row.gpus, cpus=1,
            mem_mb=self.config.default_mem_mb, time_limit=job.limit, submit_time=job.submit,
            gpu_type=gpu_type, preempt_count=job.preempt_count, nodes=job.nodes,
            **_sharing.pending_fields(row, self._fractions, gpu_type))
        if pend.shared:
            self._shared_pending += 1
            self._shared_dirty = True
        else:
            self._pending_shapes[(gpu_type, row.gpus // job.nodes, job.nodes)] += 1
        self.pending[row.seq] = pend

    def _end_run(self, job: _Job, t: float, *, natural: bool) -> None:
        job_id = job.trace.seq
        run = self.running.pop(job_id)
        before = self._counts_before([run])             # a gang's nodes all free together
        self._holdings.release(run)
        for node, counts in before.items():
            self._refile(node, counts)
        self.allocated -= job.amount
        if abs(self.allocated) < 1e-9:
            self.allocated = 0.0           # no float residue once nothing runs
        if job.shared:
            self._shared_dirty = True
        self.usage.add_rate((job.account, job.user), -job.trace.share * job.weight, t)
        self.tally.run_stopped(job.account, job.trace.share, job.amount, t - job.start,
                               preempted=job.stop_mode is not None, qos=job.qos)
        if job.stop_mode == "requeue":
            job.stop_mode = None
            job.node, job.gpu_indices = None, ()
            self._make_pending(job)
            return
        if job.stop_mode == "cancel":
            state = "PREEMPTED"
        else:
            timed_out = job.limit is not None and job.limit < job.trace.duration_s
            state = "TIMEOUT" if natural and timed_out else "COMPLETED"
        self.tally.job_ended(job.account, state, t, job.submit, t - job.start, job.bucket)
        if not job.trace.background:
            self._main_alive -= 1
        del self.jobs[job_id]

    # -- one scheduler pass -----------------------------------------------------------

    def snapshot(self) -> Snapshot:
        recent = self._recent_preemptions
        while recent and recent[0] < self.clock - PREEMPT_WINDOW_S:
            recent.popleft()
        if self._claims:
            running = self.running
            self._claims = live_claims(self._claims, self.pending.__contains__,
                                       lambda v: v in running and not running[v].stopping)
        return Snapshot(nodes=self.nodes, pending=tuple(self.pending.values()),
                        running=tuple(self.running.values()), config=self.config,
                        usage=self.usage.values(self.clock), recent_preemptions=tuple(recent),
                        claims=tuple(self._claims.items()))

    def _pass(self, t: float) -> None:
        c0 = time.process_time()
        plan = self._schedule(self.snapshot(), t)
        self.core_cpu_s += time.process_time() - c0
        self.tally.passes += 1
        if self.tally.passes % GC_EVERY == 0:
            gc.collect(1 if self.tally.passes % (GC_EVERY * GC_OLDER_EVERY) == 0 else 0)
        self._shared_dirty = False
        before = self._counts_before(plan.starts)
        out = apply_plan(self._holdings, plan, self.pending, self.running)     # the head's re-check
        for refused in out.refused:
            what = refused.decision
            if isinstance(what, Start):
                log.warning("plan start of job %d on %s does not fit; skipped: %s", what.job_id,
                            ",".join(p[0] for p in pieces(what)), refused.reason)
            elif isinstance(what, Relayout):
                log.warning("planned re-layout of %s GPU %d skipped: %s", what.node, what.gpu, refused.reason)
        for node, counts in before.items():
            self._refile(node, counts)
        for s in out.starts:
            self._start(s, t)
        for p in out.preemptions:
            self._preempt(p, t)
        for r in out.relayouts:            # shared GPUs: re-cut now, start the waiting jobs soon
            nodes = _sharing.apply_relayout(self.nodes, r, self.running.values(), t)
            if nodes is not None:
                self.nodes = nodes
                self._refusals.clear()
                self._node_by_name[r.node] = view = next(n for n in nodes if n.name == r.node)
                self._holdings.renew(view)
                self._shared_dirty = True
                self._wake(t + _sharing.RELAYOUT_S)
        pending = self.pending
        self._resources_need = min(
            (pending[j].gpus for j, why in plan.reasons.items() if why == "Resources" and j in pending),
            default=None)
        later = [w for w in plan.expected_starts.values() if w > t and math.isfinite(w)]
        if later:
            self._wake(min(later))

    def _wake(self, w: float) -> None:
        if w not in self._wakes and (self.until is None or self.drain or w <= self.until):
            self._wakes.add(w)
            self._push(w, _WAKE)

    def _counts_before(self, held: Iterable[Start | RunningJob]) -> dict[str, dict[str | None, int]]:
        """Free GPU counts of the nodes of ``held``, before they change (for ``_refile``)."""
        return {p[0]: self._free_counts(p[0]) for x in held for p in pieces(x) if p[0] in self._free}

    def _node(self, name: str) -> Held:
        h = self._holdings.node(name)
        assert h is not None
        return h

    def _start(self, s: Start, t: float) -> None:
        """Book-keeping for a start the re-check let through (its resources are held)."""
        job = self.jobs[s.job_id]
        pend = self.pending.pop(s.job_id)
        shared = any(d.kind != "gpu" for d in s.devices)    # slices and shares: counted by fraction
        placed = pieces(s)
        if pend.shared:
            self._shared_pending -= 1
        else:
            self._pending_shapes[(pend.gpu_type, pend.gpus // pend.nodes, pend.nodes)] -= 1
        self.tally.queue(job.account, -job.trace.share, job.qos)
        if shared:
            job.amount = _sharing.device_amount(s.devices, tuple(s.gpu_indices), self._gpu_views(s.node))
            job.weight = self._weight([(s.node, set(s.gpu_indices) or {d.index for d in s.devices})])
        else:
            job.amount = float(sum(len(p[1]) for p in placed))
            job.weight = self._weight([(p[0], p[1]) for p in placed])
        job.shared = shared
        self.allocated += job.amount
        job.attempt += 1
        job.node, job.gpu_indices, job.start = s.node, tuple(s.gpu_indices), t
        self.usage.add_rate((job.account, job.user), job.trace.share * job.weight, t)
        wait = None
        if job.first_start is None:
            job.first_start = t
            wait = t - job.submit
        self.tally.start(job.account, wait, job.bucket, job.qos)
        self.tally.run_started(job.account, job.trace.share, job.amount, job.qos)
        if self.start_log is not None:
            self.start_log.append((t, job.trace.trace_id, s.node, tuple(s.gpu_indices)))
        self.running[s.job_id] = RunningJob(
            job_id=s.job_id, user=job.user, account=job.account, partition=pend.partition,
            qos=job.qos, node=s.node, gpu_indices=tuple(s.gpu_indices), cpus=s.cpus,
            mem_mb=s.mem_mb, start_time=t, time_limit=job.limit,
            preempt_count=job.preempt_count, borrowed=s.borrowed, submit_time=job.submit,
            devices=s.devices, parts=tuple(s.parts))
        run_for = job.trace.duration_s if job.limit is None else min(job.trace.duration_s, job.limit)
        self._push(t + run_for, _END, s.job_id, job.attempt)

    def _gpu_views(self, node: str) -> dict[int, Any]:
        return {g.index: g for g in self._node_by_name[node].gpus}

    def _weight(self, held: list[tuple[str, Iterable[int]]]) -> float:
        """Mean billing weight of the GPUs held (node, indices): a job is billed its share
        times it."""
        weight = self.config.billing_weight
        ws = [weight(self._models[node][i]) for node, gpus in held for i in gpus]
        return sum(ws) / len(ws) if ws else 1.0

    def _preempt(self, p: Preemption, t: float) -> None:
        """Book-keeping for a preemption the re-check let through (its victim runs)."""
        job, run = self.jobs[p.job_id], self.running[p.job_id]
        job.stop_mode = "cancel" if p.mode == "cancel" else "requeue"
        job.preempt_count += 1
        self.running[p.job_id] = replace(run, stopping=True, preempt_count=job.preempt_count)
        self.tally.preemptions += 1
        self._recent_preemptions.append(t)
        if p.for_job is not None:
            self._claims[p.job_id] = p.for_job
        self._push(t + max(0.0, float(p.grace_time)), _GRACE, p.job_id, job.attempt)


def _may_preempt(config: SchedConfig) -> bool:
    """Whether the policy can preempt at all: some QOS preempts another, or quotas reclaim."""
    return (any(q.preempt for q in config.qos.values())
            or any(a.gpu_quota is not None for a in config.accounts.values()))


def simulate(nodes: tuple[NodeView, ...], jobs: Iterable[TraceJob],
             config: SchedConfig | None = None, **kw: Any) -> dict[str, Any]:
    """Run ``jobs`` on ``nodes`` and return the report (see ``gpud.sim.report``)."""
    return Simulation(nodes, jobs, config, **kw).run()
