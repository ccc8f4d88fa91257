"""One scheduler pass: snapshot from the head's memory, the pure core, then the plan applied.

The core (``gpud.sched.core.schedule``) decides; this module only translates.  A plan is
re-checked against the current state before it is committed (a job cancelled or a node
lost while the core ran is skipped), applied in one transaction, and only then turned
into messages for the workers.

A multi-node (gang) start carries ``parts`` (rank 1..N-1); every part is re-checked like
rank 0 and the job starts on all its nodes in the same transaction, or not at all
(``gpud.head.gang``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from ..model import GpuInfo, JobState, NodeInfo
from ..sched.core import schedule
from ..sched.plan import Plan, Preemption, Relayout, Start
from ..sched.gpustate import is_shared
from ..sched.snapshot import Device, NodeView, PendingJob, RunningJob, Snapshot
from . import gang
from .gpusharing import SharedUse, gpu_view, job_devices, start_changes
from .store import JobRecord, Store, Txn

log = logging.getLogger("gpud.sched")

UP = "UP"
DOWN = "DOWN"
DRAIN = "DRAIN"
UNKNOWN = "UNKNOWN"


def node_info(store: Store, name: str) -> NodeInfo | None:
    rec = store.nodes.get(name)
    if rec is None:
        return None
    try:
        return NodeInfo.from_dict(rec.info)
    except (KeyError, TypeError, ValueError):
        return None


def node_view(store: Store, name: str) -> NodeView | None:
    info = node_info(store, name)
    if info is None:
        return None
    return NodeView(
        name=info.name, cpus=info.cpus, mem_mb=info.mem_mb,
        gpus=tuple(gpu_view(g) for g in info.gpus),
        schedulable=store.nodes[name].state == UP,
        labels=tuple(sorted(info.labels.items())),
    )


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
                   blocked: dict[int, str] | None = None) -> Snapshot:
    """``blocked``: why pending jobs may not start now (slurm.SlurmSupport.before_pass)."""
    blocked = blocked or {}
    nodes = [v for v in (node_view(store, name) for name in store.nodes) if v is not None]
    pending, running = [], []
    for j in store.active.values():
        if j.state is JobState.PENDING:
            pending.append(PendingJob(
                job_id=j.job_id, user=j.user, account=j.account, partition=j.partition,
                qos=j.qos, gpus=j.gpus, cpus=j.cpus, mem_mb=j.mem_mb, time_limit=j.time_limit,
                submit_time=j.submit_time, gpu_type=j.spec.gpu_type, nice=j.spec.nice,
                preempt_count=j.preempt_count, held=j.spec.hold, blocked_reason=blocked.get(j.job_id),
                mig_profile=j.spec.mig_profile, gpu_mem_mb=j.spec.gpu_mem_mb,
                **_gang_request(j),
            ))
        elif j.state.active and j.node is not None:
            running.append(running_view(j))
    nodes.sort(key=lambda n: n.name)
    pending.sort(key=lambda p: p.job_id)
    running.sort(key=lambda r: r.job_id)
    return Snapshot(nodes=tuple(nodes), pending=tuple(pending), running=tuple(running),
                    config=config, usage=dict(usage), recent_preemptions=recent_preemptions)


def _gang_request(j: JobRecord) -> dict:
    """PendingJob's multi-node fields, as the spec has them."""
    spec = j.spec
    return dict(nodes=spec.nodes, nodelist=tuple(spec.nodelist), exclude=tuple(spec.exclude),
                constraint=spec.constraint, exclusive=spec.exclusive, switches=spec.switches,
                switches_wait=spec.switches_wait)


def run_core(snap: Snapshot, now: float) -> Plan:
    return schedule(snap, now)


@dataclass
class Applied:
    """What a committed plan asks the workers to do."""

    launches: list[JobRecord] = field(default_factory=list)
    stops: list[tuple[JobRecord, Preemption]] = field(default_factory=list)
    relayouts: list[Relayout] = field(default_factory=list)     # MIG re-layouts to send


def _in_use(store: Store) -> dict[str, tuple[set[int], int, int]]:
    used: dict[str, tuple[set[int], int, int]] = {}
    for j in store.active.values():
        if j.state.active and j.node is not None:
            for node, indices, c, m in [(j.node, j.gpu_indices, j.cpus, j.mem_mb)] + [
                    (p.node, p.gpu_indices, p.cpus, p.mem_mb) for p in gang.parts_view(j)]:
                gpus, cpus, mem = used.get(node, (set(), 0, 0))
                used[node] = (gpus | set(indices), cpus + c, mem + m)
    return used


def plan_to_txn(store: Store, plan: Plan, now: float) -> tuple[Txn, Applied]:
    """Re-check ``plan`` against the store and turn what still holds into one transaction."""
    txn = Txn(store)
    applied = Applied()
    used = _in_use(store)
    shared = SharedUse(store.active.values())
    for s in plan.starts:
        job = store.active.get(s.job_id)
        if job is None or job.state is not JobState.PENDING or job.spec.hold:
            continue
        info = node_info(store, s.node)
        rec = store.nodes.get(s.node)
        if info is None or rec is None or rec.state != UP:
            continue
        if not _fits(info, used.get(s.node, (set(), 0, 0)), s):
            log.warning("plan start of job %d on %s no longer fits; skipped", s.job_id, s.node)
            continue
        why = shared.fits(info, job.user, s.devices)
        if why:
            log.warning("plan start of job %d on %s skipped: %s", s.job_id, s.node, why)
            continue
        parts = _check_parts(store, used, shared, job.user, s)
        if parts is None:
            continue
        shared.add(s.node, job.user, s.devices)
        for p in (s, *s.parts):
            gpus, cpus, mem = used.get(p.node, (set(), 0, 0))
            used[p.node] = (gpus | set(p.gpu_indices), cpus + p.cpus, mem + p.mem_mb)
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
        txn.execute(
            "INSERT OR REPLACE INTO allocations(job_id, attempt, node, gpu_indices, gpu_uuids, cpus, mem_mb, "
            "start_time, devices, parts) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (job.job_id, attempt, s.node, _json(list(updated.gpu_indices)), _json(list(updated.gpu_uuids)),
             s.cpus, s.mem_mb, now, _json(list(updated.devices)), _json(parts) if parts else None),
        )
        applied.launches.append(updated)
    for r in plan.relayouts:
        info = node_info(store, r.node)
        rec = store.nodes.get(r.node)
        if info is None or rec is None or rec.state != UP:
            continue
        why = shared.relayout_ok(info, r)
        if why:
            log.warning("planned re-layout of %s GPU %d skipped: %s", r.node, r.gpu, why)
            continue
        applied.relayouts.append(r)
    for p in plan.preemptions:
        job = store.active.get(p.job_id)
        if job is None or job.state is not JobState.RUNNING:
            continue
        updated = txn.transition(
            job, JobState.COMPLETING, now=now, event="preempted", detail=p.reason,
            stop_reason=f"preempted:{p.mode}", stop_time=now, preempt_count=job.preempt_count + 1,
        )
        txn.execute("INSERT INTO preemptions(time) VALUES (?)", (now,))
        applied.stops.append((updated, p))
    return txn, applied


def _shown(alloc: dict) -> str:
    """GPU indices, with the slice or share kind for fractions (the event log's detail)."""
    devices = alloc.get("devices") or ()
    if not any(d.get("kind") != "gpu" for d in devices):
        return str(list(alloc["gpu_indices"]))
    return "[" + ", ".join(f"{d['index']}:{d.get('profile') or d['kind']}" for d in devices) + "]"


def _check_parts(store: Store, used: dict[str, tuple[set[int], int, int]], shared: SharedUse,
                 user: str, s: Start) -> list[dict] | None:
    """Ranks 1..N-1 of a gang start, re-checked like rank 0 (whole GPUs only), as
    gang.part_dict entries; None when any of them no longer fits."""
    out: list[dict] = []
    seen = {s.node}
    for p in s.parts:
        info = node_info(store, p.node)
        rec = store.nodes.get(p.node)
        if info is None or rec is None or rec.state != UP or p.node in seen:
            log.warning("plan start of job %d: part on %s is unavailable; skipped", s.job_id, p.node)
            return None
        seen.add(p.node)
        by_index = {g.index: g for g in info.gpus}
        probe = Start(s.job_id, p.node, p.gpu_indices, p.cpus, p.mem_mb)
        why = None if _fits(info, used.get(p.node, (set(), 0, 0)), probe) else "no longer fits"
        why = why or shared.fits(info, user, [Device(i, "gpu", by_index[i].uuid) for i in p.gpu_indices])
        if why:
            log.warning("plan start of job %d: part on %s skipped: %s", s.job_id, p.node, why)
            return None
        out.append(gang.part_dict(p.node, p.gpu_indices, [by_index[i].uuid for i in p.gpu_indices],
                                  p.cpus, p.mem_mb))
    return out


def _fits(info: NodeInfo, used: tuple[set[int], int, int], s: Start) -> bool:
    gpus, cpus, mem = used
    indices = {g.index for g in info.gpus}
    if any(i in gpus or i not in indices for i in s.gpu_indices) or len(set(s.gpu_indices)) != len(s.gpu_indices):
        return False
    return cpus + s.cpus <= info.cpus and mem + s.mem_mb <= info.mem_mb


def annotate(store: Store, plan: Plan) -> None:
    """Copy the plan's reasons, priorities and expected starts onto pending jobs (memory only)."""
    for job in store.active.values():
        if job.state is JobState.PENDING:
            job.reason = plan.reasons.get(job.job_id, job.reason if job.spec.hold else None)
            job.priority = plan.priorities.get(job.job_id, job.priority)
            job.expected_start = plan.expected_starts.get(job.job_id)


def _json(v) -> str:
    return json.dumps(v)


def gpu_infos(info: NodeInfo) -> dict[int, GpuInfo]:
    return {g.index: g for g in info.gpus}
