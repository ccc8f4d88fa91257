"""One scheduler pass: snapshot from the head's memory, the pure core, then the plan applied.

The core (``gpud.sched.core.schedule``) decides; this module only translates.  A plan is
re-checked against the current state before it is committed (``gpud.sched.apply``, the
re-check the simulator makes too: a job cancelled or a node lost while the core ran, or a
GPU, slice or share taken meanwhile, is skipped), what holds is applied in one
transaction, and only then turned into messages for the workers.

A multi-node (gang) start carries ``parts`` (rank 1..N-1); every part is re-checked like
rank 0 and the job starts on all its nodes in the same transaction, or not at all
(``gpud.head.gang``).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterable

from ..model import GpuInfo, JobState, NodeInfo, StopReason
from ..sched.apply import Holdings, Outcome, apply_plan
from ..sched.core import schedule
from ..sched.plan import Plan, Preemption, Relayout, Start
from ..sched.gpustate import is_shared
from ..sched.snapshot import NodeView, Part, PendingJob, RunningJob, Snapshot
from . import gang
from .gpusharing import gpu_view, job_devices, start_changes
from .store import JobRecord, Store, Txn

log = logging.getLogger("gpud.sched")

UP = "UP"
DOWN = "DOWN"
DRAIN = "DRAIN"
UNKNOWN = "UNKNOWN"


def node_info(store: Store, name: str) -> NodeInfo | None:
    """A registered node's NodeInfo (None if unknown or malformed).  Parsed once per
    registration: a node's ``info`` dict is replaced, never changed, when it registers again,
    and parsing every node for every pass, submission and job end cost more than their work."""
    rec = store.nodes.get(name)
    if rec is None:
        return None
    cached = _PARSED.get(name)
    if cached is None or cached[0] is not rec.info:
        try:
            info: NodeInfo | None = NodeInfo.from_dict(rec.info)
        except (KeyError, TypeError, ValueError):
            info = None
        cached = _PARSED[name] = (rec.info, info, {})
    return cached[1]


def node_view(store: Store, name: str) -> NodeView | None:
    info = node_info(store, name)
    if info is None:
        return None
    state = store.nodes[name].state          # changed in place: part of the key
    views = _PARSED[name][2]
    view = views.get(state)
    if view is None:
        view = views[state] = NodeView(
            name=info.name, cpus=info.cpus, mem_mb=info.mem_mb,
            gpus=tuple(gpu_view(g) for g in info.gpus),
            schedulable=state == UP,
            labels=tuple(sorted(info.labels.items())),
        )
    return view


# node name -> (its info dict, parsed NodeInfo, NodeView by node state); frozen values only
_PARSED: dict[str, tuple[dict, NodeInfo | None, dict[str, NodeView]]] = {}


def running_view(j: JobRecord) -> RunningJob:
    assert j.node is not None
    devices = job_devices(j)
    return RunningJob(
        job_id=j.job_id, user=j.user, account=j.account, partition=j.partition,
        qos=j.qos, node=j.node, gpu_indices=() if is_shared(devices) else j.gpu_indices,
        cpus=j.cpus, mem_mb=j.mem_mb, devices=devices,
        start_time=j.start_time or j.launched_at or j.submit_time,
        time_limit=j.time_limit, preempt_count=j.preempt_count, borrowed=j.borrowed,
        requeue=j.spec.requeue, stopping=j.state is JobState.COMPLETING,
        submit_time=j.submit_time, nice=j.spec.nice,
        parts=gang.parts_view(j), exclusive=j.spec.exclusive,
    )


def build_snapshot(store: Store, config, usage: dict, recent_preemptions: tuple[float, ...],
                   blocked: dict[int, str] | None = None, views: "JobViews | None" = None) -> Snapshot:
    """``blocked``: why pending jobs may not start now (slurm.SlurmSupport.before_pass).
    ``views``: the jobs' views kept from the last pass (a fresh set without it)."""
    blocked = blocked or {}
    nodes = [v for v in (node_view(store, name) for name in store.nodes) if v is not None]
    views = views if views is not None else JobViews()
    pending, others = views.pending(store, blocked)
    running = views.running(others)
    nodes.sort(key=lambda n: n.name)
    pending.sort(key=_JOB_ID)
    running.sort(key=_JOB_ID)
    return Snapshot(nodes=tuple(nodes), pending=tuple(pending), running=tuple(running),
                    config=config, usage=dict(usage), recent_preemptions=recent_preemptions)


_JOB_ID = attrgetter("job_id")


def pending_view(j: JobRecord, blocked_reason: str | None) -> PendingJob:
    return PendingJob(
        job_id=j.job_id, user=j.user, account=j.account, partition=j.partition,
        qos=j.qos, gpus=j.gpus, cpus=j.cpus, mem_mb=j.mem_mb, time_limit=j.time_limit,
        submit_time=j.submit_time, gpu_type=j.spec.gpu_type, nice=j.spec.nice,
        preempt_count=j.preempt_count, held=j.spec.hold, blocked_reason=blocked_reason,
        mig_profile=j.spec.mig_profile, gpu_mem_mb=j.spec.gpu_mem_mb,
        **_gang_request(j),
    )


class JobViews:
    """Each unfinished job's view (``PendingJob``, or ``RunningJob`` for one that holds
    resources), kept from one pass to the next.

    A view is made again only when its job's record is another object or (pending) its
    blocked reason changed: every change of a job's columns replaces its record
    (``Txn.transition``; only the pass's own annotations and telemetry are written in place),
    so the same record means the same view.  Making 100,000 views took over a second of the
    head's loop per pass, and the views of running jobs are wanted twice a pass: for the
    snapshot and for the re-check of its plan.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[JobRecord, PendingJob]] = {}
        self._running: dict[int, tuple[JobRecord, RunningJob]] = {}

    def pending(self, store: Store, blocked: dict[int, str]) -> tuple[list[PendingJob], list[JobRecord]]:
        """The pending jobs' views, and the records of the other unfinished jobs."""
        kept, fresh, views, others = self._kept, {}, [], []
        pending_state = JobState.PENDING
        for j in store.active.values():
            if j.state is not pending_state:
                others.append(j)
                continue
            why = blocked.get(j.job_id)
            entry = kept.get(j.job_id)
            if entry is None or entry[0] is not j or entry[1].blocked_reason != why:
                entry = (j, pending_view(j, why))
            fresh[j.job_id] = entry
            views.append(entry[1])
        self._kept = fresh     # ended and started jobs drop out
        return views, others

    def running(self, jobs: Iterable[JobRecord]) -> list[RunningJob]:
        """The views of those of ``jobs`` that hold resources (all of them, each call)."""
        kept, fresh, views = self._running, {}, []
        for j in jobs:
            if j.node is None or not j.state.active:
                continue
            entry = kept.get(j.job_id)
            if entry is None or entry[0] is not j:
                entry = (j, running_view(j))
            fresh[j.job_id] = entry
            views.append(entry[1])
        self._running = fresh  # ended and requeued jobs drop out
        return views

    def eligible(self, j: JobRecord) -> PendingJob:
        """Pending job ``j``'s view as a job free to start (its kept one when that is it)."""
        entry = self._kept.get(j.job_id)
        if entry is not None and entry[0] is j and entry[1].blocked_reason is None:
            return entry[1]
        return pending_view(j, None)


def _gang_request(j: JobRecord) -> dict:
    """PendingJob's multi-node fields, as the spec has them."""
    spec = j.spec
    return dict(nodes=spec.nodes, nodelist=tuple(spec.nodelist), exclude=tuple(spec.exclude),
                constraint=spec.constraint, exclusive=spec.exclusive, switches=spec.switches,
                switches_wait=spec.switches_wait)


def pass_gap(took: float, head_cfg) -> float:
    """The least time from the end of a pass that took ``took`` seconds to the start of the
    next: ``schedule_debounce``, or longer so that passes run back to back take at most
    ``schedule_max_share`` of the head's time (as Slurm's sched_min_interval paces them)."""
    share = head_cfg.schedule_max_share
    return max(head_cfg.schedule_debounce, took * (1 - share) / share)


def run_core(snap: Snapshot, now: float) -> Plan:
    """The pure core, with the cyclic garbage collector paused while it runs (as the
    simulator runs it): what it allocates is freed by reference counting when the pass
    ends, and collections during a pass over 100,000 pending jobs scanned its temporaries
    again and again (a sixth of the pass)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return schedule(snap, now)
    finally:
        if paused:
            gc.enable()


@dataclass
class Applied:
    """What a committed plan asks the workers to do."""

    launches: list[JobRecord] = field(default_factory=list)
    stops: list[tuple[JobRecord, Preemption]] = field(default_factory=list)
    relayouts: list[Relayout] = field(default_factory=list)     # MIG re-layouts to send


def recheck(store: Store, plan: Plan, views: JobViews | None = None) -> Outcome:
    """What of ``plan`` still holds against the store (``gpud.sched.apply``); ``views``: the
    jobs' views kept by the pass.  What running jobs hold is counted only when something is
    to start or be re-laid: most passes over a long queue start nothing, and then nothing
    needs it."""
    active = store.active
    views = views if views is not None else JobViews()
    checking = bool(plan.starts or plan.relayouts)
    nodes = {name: v for name in store.nodes if (v := node_view(store, name)) is not None} if checking else {}
    holding = views.running(active.values()) if checking else []
    pending = {}
    for s in plan.starts:
        j = active.get(s.job_id)
        if j is not None and j.state is JobState.PENDING:
            pending[s.job_id] = views.eligible(j)
    victims = {}
    for p in plan.preemptions:
        j = active.get(p.job_id)
        if j is not None and j.node is not None and j.state.active:
            victims[p.job_id] = running_view(j)
    return apply_plan(Holdings(nodes, holding), plan, pending, victims)


def plan_to_txn(store: Store, plan: Plan, now: float, views: JobViews | None = None) -> tuple[Txn, Applied]:
    """Re-check ``plan`` against the store and turn what still holds into one transaction;
    ``views``: the jobs' views kept by the pass (``build_snapshot``'s)."""
    txn = Txn(store)
    applied = Applied()
    out = recheck(store, plan, views)
    for refused in out.refused:
        if refused.gone:       # cancelled, held, ended or lost while the core ran: the next pass knows
            continue
        what = refused.decision
        if isinstance(what, Start):
            log.warning("plan start of job %d on %s skipped: %s", what.job_id, what.node, refused.reason)
        elif isinstance(what, Relayout):
            log.warning("planned re-layout of %s GPU %d skipped: %s", what.node, what.gpu, refused.reason)
    for s in out.starts:
        job = store.active[s.job_id]
        info = node_info(store, s.node)
        assert info is not None        # the re-check found the node
        parts = [_part(store, p) for p in s.parts]
        alloc = start_changes(s, info)
        attempt = job.attempt + 1
        where = s.node if not parts else gang.nodelist_text([s.node] + [p["node"] for p in parts])
        updated = txn.transition(
            job, JobState.RUNNING, now=now, event="allocated", detail=f"{where} gpus={_shown(alloc)}"
            + "".join(f" {p['node']}:{p['gpu_indices']}" for p in parts),
            attempt=attempt, node=s.node, **alloc, cpus=s.cpus, mem_mb=s.mem_mb,
            start_time=now, end_time=None, launched_at=now, reason=None, borrowed=s.borrowed,
            exit_code=None, signal=None, stop_reason=None, stop_time=None, parts=tuple(parts),
        )
        txn.start_allocation(updated, now=now)
        applied.launches.append(updated)
    applied.relayouts.extend(out.relayouts)
    for p in out.preemptions:
        job = store.active[p.job_id]
        updated = txn.transition(
            job, JobState.COMPLETING, now=now, event="preempted", detail=p.reason,
            stop_reason=StopReason.preempted(p.mode).value, stop_time=now, preempt_count=job.preempt_count + 1,
        )
        txn.record_preemption(now)
        applied.stops.append((updated, p))
    return txn, applied


def _shown(alloc: dict) -> str:
    """GPU indices, with the slice or share kind for fractions (the event log's detail)."""
    devices = alloc.get("devices") or ()
    if not any(d.get("kind") != "gpu" for d in devices):
        return str(list(alloc["gpu_indices"]))
    return "[" + ", ".join(f"{d['index']}:{d.get('profile') or d['kind']}" for d in devices) + "]"


def _part(store: Store, p: Part) -> dict:
    """A gang start's rank 1..N-1 on one node, as a gang.part_dict entry (with GPU UUIDs)."""
    info = node_info(store, p.node)
    assert info is not None        # the re-check found the node
    uuids = {g.index: g.uuid for g in info.gpus}
    return gang.part_dict(p.node, p.gpu_indices, [uuids[i] for i in p.gpu_indices], p.cpus, p.mem_mb)


def annotate(store: Store, plan: Plan) -> None:
    """Copy the plan's reasons, priorities and expected starts onto pending jobs (memory only)."""
    reasons, priorities, starts = plan.reasons, plan.priorities, plan.expected_starts
    pending = JobState.PENDING
    for job in store.active.values():
        if job.state is pending:
            job_id = job.job_id
            job.reason = reasons.get(job_id, job.reason if job.spec.hold else None)
            job.priority = priorities.get(job_id, job.priority)
            job.expected_start = starts.get(job_id)
    store.changed()


def gpu_infos(info: NodeInfo) -> dict[int, GpuInfo]:
    return {g.index: g for g in info.gpus}
