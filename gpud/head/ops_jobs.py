"""Socket operations on jobs and nodes: submit, list, cancel, node list.

Each operation is ``async def op_x(head, caller, args) -> result`` and is listed in ``OPS``;
the caller's identity comes from the socket (SO_PEERCRED), never from ``args``.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections import defaultdict
from itertools import groupby
from operator import attrgetter, is_, itemgetter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import __version__, jsoncodec, protocol
from ..model import JobSpec, JobState, NodeInfo, SpecError, StopReason, parse_rlimits
from ..syntax import format_indices
from ..sched import admission
from . import gang, slurm, submitkeys
from .jobcaps import launch_refusal
from ..ctlsocket import Caller, RequestError
from .gpusharing import gpu_usage
from .jobs import may_modify
from .scheduling import UP, node_info
from .store import JobRecord
from .store_reports import earlier_attempts

if TYPE_CHECKING:
    from .daemon import Head

log = logging.getLogger("gpud.head")


def is_admin(head: "Head", caller: Caller) -> bool:
    return caller.uid in (0, os.geteuid()) or caller.user in head.admins


async def op_ping(head: "Head", caller: Caller, args: dict) -> dict:
    return {"cluster": head.cfg.cluster, "version": __version__, "uid": caller.uid,
            "user": caller.user, "admin": is_admin(head, caller)}


async def op_submit(head: "Head", caller: Caller, args: dict) -> dict:
    try:
        spec = JobSpec.from_request(args.get("spec"))
        if args.get("rlimits") is not None:   # the submitter's own limits, which the job inherits
            spec = replace(spec, rlimits=parse_rlimits(args["rlimits"]))
    except SpecError as e:
        raise RequestError(f"Batch job submission failed: {e}") from None
    too_large = launch_refusal(spec.script, spec.env)
    if too_large is not None:
        raise RequestError(too_large)
    key = submitkeys.check_key(args.get("key"))
    if spec.test_only:
        key = None          # nothing is created, nothing to repeat
    return await head.submit_keys.once(caller.uid, key, lambda: _submit(head, caller, spec, key))


async def _submit(head: "Head", caller: Caller, spec: JobSpec, key: str | None) -> dict:
    head.check_disk_space()
    now = head.clock()
    infos, models = registered(head)
    if spec.gpu_type is not None:   # the only field this may change: no copy of the spec otherwise
        gpu_type = slurm.resolve_gpu_type(spec.gpu_type, models)
        if gpu_type != spec.gpu_type:
            spec = replace(spec, gpu_type=gpu_type)
    try:
        resolved = admission.resolve(spec, caller.user, head.cfg.sched, infos)
    except admission.Refused as e:
        raise RequestError(f"Batch job submission failed: {e}") from None
    hold = "user" if spec.hold else None
    job = JobRecord(
        job_id=0, name=spec.name, user=caller.user, uid=caller.uid, gid=caller.gid,
        account=resolved.account, partition=resolved.partition, qos=resolved.qos,
        state=JobState.PENDING, spec=spec, gpus=spec.gpus, cpus=spec.cpus,
        mem_mb=resolved.mem_mb, time_limit=resolved.time_limit, submit_time=now,
        reason=slurm.HELD_REASONS[hold] if hold else None, dependency=spec.dependency,
        begin_time=spec.begin_time, deadline=spec.deadline, hold_kind=hold, submit_key=key,
    )
    # arrays, dependencies, --skip-if-active, --test-only; the group commit as before
    return await slurm.submit(head, caller, job)


async def op_jobs(head: "Head", caller: Caller, args: dict) -> dict:
    job_ids = _int_list(args.get("job_ids"), "job_ids")
    users = _str_list(args.get("users"), "users")
    states = _str_list(args.get("states"), "states")
    if states:
        bad = [s for s in states if s not in JobState.__members__]
        if bad:
            raise RequestError(f"invalid job state {bad[0]!r}; valid states: {', '.join(JobState.__members__)}")
    since = args.get("since")
    if since is not None and not isinstance(since, (int, float)):
        raise RequestError("since must be a number (epoch seconds)")
    if args.get("all"):
        jobs = await head.store.find_jobs(job_ids=job_ids, states=states, since=since, arrays=True)
    else:
        jobs = list(head.store.active.values())
        if not args.get("fold"):    # folding sorts in squeue's order itself
            jobs.sort(key=lambda j: j.job_id)
        if job_ids is not None:  # an array's id selects its tasks
            wanted = set(job_ids)
            jobs = [j for j in jobs if j.job_id in wanted or j.array_job_id in wanted]
        if states:
            jobs = [j for j in jobs if j.state.value in states]
    if users:
        us = set(users)
        jobs = [j for j in jobs if j.user in us or str(j.uid) in us]
    for key, attr in (("partitions", "partition"), ("accounts", "account")):
        names = _str_list(args.get(key), key)
        if names:
            keep = set(names)
            jobs = [j for j in jobs if getattr(j, attr) in keep]
    fields = _str_list(args.get("fields"), "fields")
    fold = bool(args.get("fold"))
    if fold and args.get("rows") and fields and all(f in _FIELD for f in fields):
        return {"fields": fields, "rows": fold_rows(jobs, fields), "folded": True}
    records = fold_arrays(jobs, fields) if fold else [public(j, fields) for j in jobs]
    if not fold and not fields:   # whole records (--json, sacct): what each job holds and bills
        from .reports import allocation_fields, models_from

        model_of = models_from(head.store)
        for r, j in zip(records, jobs):
            r.update(allocation_fields(head.store, head.cfg.sched, j, model_of))
        if args.get("attempts"):    # sacct --duplicates: the runs that ended in a requeue
            runs = await earlier_attempts(head.store, [j.job_id for j in jobs if j.requeue_count])
            for r, j in zip(records, jobs):
                if j.job_id in runs:
                    r["earlier_attempts"] = runs[j.job_id]
    return {"jobs": records, "folded": True} if fold else {"jobs": records}


async def op_jobs_listing(head: "Head", caller: Caller, args: dict) -> dict | protocol.Encoded:
    """``jobs``: squeue's folded table (``fold`` with ``fields`` from the table's
    columns) is kept, encoded, until a job changes, as many squeue runs between two passes
    over 100,000 pending jobs each folded them all again (and encoding 10,000 rows costs
    as much as folding them); anything else is answered afresh."""
    fields = args.get("fields")
    if not (args.get("fold") and not args.get("all") and isinstance(fields, list) and fields
            and all(isinstance(f, str) and f in _FIELD for f in fields)):
        return await op_jobs(head, caller, args)
    key = repr(sorted(args.items()))    # a JSON object's keys: strings, each once
    store = head.store
    kept = _LISTINGS.get(store)
    if kept is None or kept[0] != store.changes:
        kept = _LISTINGS[store] = (store.changes, {})
    reply = kept[1].get(key)
    if reply is None:
        reply = protocol.Encoded(jsoncodec.dumps(await op_jobs(head, caller, args)).encode())
        if kept[0] == store.changes and len(kept[1]) < _LISTINGS_KEPT:
            kept[1][key] = reply
    return reply


_LISTINGS: "weakref.WeakKeyDictionary[Any, tuple[int, dict[str, protocol.Encoded]]]" = weakref.WeakKeyDictionary()
_LISTINGS_KEPT = 16     # different questions answered from one state of the jobs


# JOB record fields cheap enough to read one by one (what squeue's table asks for); any
# other field in a ``fields`` list costs a whole to_public().  Kept equal to to_public by
# tests/test_squeue_scale.py.  Each changes only through a Store commit or insert or the
# scheduler's annotations, all counted in Store.changes, which op_jobs_listing relies on.
_ATTR = {f: "state.value" if f == "state" else f for f in (   # field -> attribute path
    "job_id", "display_id", "name", "user", "uid", "account", "partition", "qos", "state", "reason", "node",
    "nodelist", "gpus", "cpus", "mem_mb", "time_limit", "submit_time", "start_time", "end_time", "priority",
    "array_job_id", "array_task_id", "array_throttle")}
_FIELD = {f: attrgetter(path) for f, path in _ATTR.items()}


def public(j: JobRecord, fields: list[str] | None) -> dict:
    """The JOB record, or only ``fields`` of it (unknown names left out): 100,000 records
    in full are ~60 MB and seconds of to_public()."""
    if not fields:
        return j.to_public()
    if all(f in _FIELD for f in fields):
        return {f: _FIELD[f](j) for f in fields}
    full = j.to_public()
    return {f: full[f] for f in fields if f in full}


def fold_arrays(jobs: list[JobRecord], fields: list[str] | None = None) -> list[dict]:
    """JOB records in squeue's order, the pending tasks of each array folded into one record
    (``display_id`` ``123_[4-99%10]``; the rest is its lowest task's) where its first task
    in that order stood.  The same as gpuctl's squeue_order then collapse_arrays, done here
    so squeue over 100,000 pending tasks receives a few records instead of all of them."""
    out = []
    for j, shown in _folded(jobs):
        record = public(j, fields)
        if shown is not None and (not fields or "display_id" in fields):
            record["display_id"] = shown
        out.append(record)
    return out


def fold_rows(jobs: list[JobRecord], fields: list[str]) -> list[tuple | list]:
    """``fold_arrays`` as rows of ``fields`` (each a ``_FIELD`` name): for 10,000 separate
    jobs a fifth of the work and a third of the bytes of records, whose keys, repeated in
    every record, cost more than the values."""
    get = attrgetter(*(_ATTR[f] for f in fields))
    single = len(fields) == 1
    at = fields.index("display_id") if "display_id" in fields else None
    rows: list[tuple | list] = []
    for j, shown in _folded(jobs):
        row = (get(j),) if single else get(j)
        if shown is not None and at is not None:
            row = list(row)
            row[at] = shown
        rows.append(row)
    return rows


def _folded(jobs: list[JobRecord]) -> list[tuple[JobRecord, str | None]]:
    """(record, display id of its folded array or None) in squeue's order."""
    pending = JobState.PENDING
    others: list[JobRecord] = []
    by_array: dict[int, list[JobRecord]] = defaultdict(list)
    # The hot part (100,000 records): an array's tasks are mostly neighbours in the store's
    # order, so grouping runs of one array id keeps the per-record work in C.
    for array, run in groupby(jobs, key=_ARRAY_ID):
        if array is None:
            others.extend(run)
        else:
            by_array[array].extend(run)
    items: list[tuple[tuple, JobRecord, str | None]] = []
    for members in by_array.values():
        task_ids = list(map(_TASK_ID, members))
        states = list(map(_STATE, members))
        if None in task_ids or states.count(pending) != len(members):   # running tasks stay apart
            tasks = [m for m, t, st in zip(members, task_ids, states) if t is not None and st is pending]
            others += [m for m, t, st in zip(members, task_ids, states) if t is None or st is not pending]
            if not tasks:
                continue
            task_ids = list(map(_TASK_ID, tasks))
        else:
            tasks = members
        prios = list(map(_PRIORITY, tasks))
        if None in prios:
            prios = [p or 0 for p in prios]
        top = max(prios)
        if prios.count(top) == len(prios):
            first_id = min(map(_JOB_ID, tasks))
        else:
            first_id = min(t.job_id for t, p in zip(tasks, prios) if p == top)
        first = tasks[task_ids.index(min(task_ids))]
        shown = None
        if len(tasks) > 1:
            limit = f"%{first.array_throttle}" if first.array_throttle else ""
            shown = f"{first.array_job_id}_[{_task_ranges(task_ids)}{limit}]"
        items.append(((True, -top, first_id), first, shown))
    items += [(_squeue_key(j), j, None) for j in others]
    items.sort(key=_KEY)
    return [(j, shown) for _, j, shown in items]


_KEY = itemgetter(0)
_ARRAY_ID = attrgetter("array_job_id")
_TASK_ID = attrgetter("array_task_id")
_STATE = attrgetter("state")
_PRIORITY = attrgetter("priority")
_JOB_ID = attrgetter("job_id")


def _squeue_key(j: JobRecord) -> tuple:
    """squeue's order: running jobs by id, then pending ones by priority (highest first), id."""
    pending = j.state is JobState.PENDING
    return (pending, -(j.priority or 0) if pending else 0, j.job_id)


def _task_ranges(tasks: list[int]) -> str:
    """format_indices, with the common case (one unbroken range) without its loop."""
    lo, hi = min(tasks), max(tasks)
    if hi - lo + 1 == len(tasks) > 1 and len(set(tasks)) == len(tasks):
        return f"{lo}-{hi}"
    return format_indices(tasks)


async def op_cancel(head: "Head", caller: Caller, args: dict) -> dict:
    job_ids = _int_list(args.get("job_ids"), "job_ids")
    refs = slurm.parse_refs(args)   # job_ids, and array_tasks for 123_4
    users = _str_list(args.get("users"), "users")
    sig = args.get("signal")
    if sig is not None and (not isinstance(sig, str) or not sig):
        raise RequestError("signal must be a signal name such as TERM or USR1")
    if not refs and not users:
        raise RequestError("no job id or user given")
    cancelled: list[int] = []
    errors: list[str] = []
    async with head.change() as ch:
        now, txn = ch.now, ch.txn
        targets: list[JobRecord] = []
        if refs:
            found, missing = await slurm.resolve(head.store, refs)
            errors += [f"Kill job error on job id {m.removeprefix('job ')}" for m in missing]
            targets = [j for j in found if not users or j.user in users]
        else:
            targets = [j for j in head.store.active.values() if j.user in set(users)]
        for job in targets:
            if not may_modify(job.uid, caller.uid, caller.user, head.admins, os.geteuid()):
                errors.append(f"Kill job error on job id {job.job_id}: Access/permission denied")
                continue
            if sig is not None:
                if job.state.active and job.node:
                    ch.signal(job, sig, grace=None, reason="signal")
                    cancelled.append(job.job_id)
                else:
                    errors.append(f"Kill job error on job id {job.job_id}: job is not running")
                continue
            if job.state is JobState.PENDING:
                txn.transition(job, JobState.CANCELLED, now=now, event="cancelled",
                               detail=f"by {caller.user}", end_time=now, reason=None)
            elif job.state is JobState.RUNNING:
                job = txn.transition(job, JobState.COMPLETING, now=now, event="cancel", detail=f"by {caller.user}",
                                     stop_reason=StopReason.CANCELLED.value, stop_time=now)
                log.info("job %d (user %s) cancelled by %s on %s", job.job_id, job.user, caller.user, job.node)
                ch.signal(job, "TERM", grace=head.cfg.head.kill_grace, reason="cancelled")
            cancelled.append(job.job_id)
        if cancelled:
            ch.wake()
    return {"cancelled": cancelled, "errors": errors}


async def op_nodes(head: "Head", caller: Caller, args: dict) -> dict:
    alloc: dict[str, list[JobRecord]] = {}
    for j in head.store.active.values():
        if j.state.active and j.node:
            for node, held in gang.per_node(j):   # each node of a multi-node job
                alloc.setdefault(node, []).append(held)
    nodes = []
    for name in sorted(head.store.nodes):
        rec = head.store.nodes[name]
        info = rec.info
        jobs = alloc.get(name, [])
        by_gpu: dict[int, list[int]] = {}
        for j in jobs:
            for i in j.gpu_indices:
                by_gpu.setdefault(i, []).append(j.job_id)
        gpus = [dict(g, job_ids=by_gpu.get(g["index"], [])) for g in info.get("gpus", [])]
        gpus = gpu_usage(gpus, jobs)   # slices, shares and who holds them (sinfo -G)
        gpus_alloc = sum(1 for g in gpus if g["job_ids"])
        nodes.append({
            "name": name, "state": _display_state(rec.state, gpus_alloc, len(gpus), bool(jobs)),
            "reason": rec.reason, "cpus": info.get("cpus", 0), "cpus_alloc": sum(j.cpus for j in jobs),
            "mem_mb": info.get("mem_mb", 0), "mem_alloc_mb": sum(j.mem_mb for j in jobs),
            "gpus_total": len(gpus), "gpus_alloc": gpus_alloc, "labels": info.get("labels", {}),
            "last_seen": rec.last_seen, "gpus": gpus,
        })
    return {"nodes": nodes}


def node_infos(head: "Head") -> tuple[NodeInfo, ...]:
    """Every registered node's NodeInfo (malformed ones left out), each parsed once; the same
    tuple until a node registers anew, so that admission works a partition's nodes out once
    (gpud.sched.admission) rather than at every submission."""
    return registered(head)[0]


def registered(head: "Head") -> tuple[tuple[NodeInfo, ...], frozenset[str]]:
    """``node_infos`` and the GPU models among them, kept until a node registers anew."""
    store = head.store
    infos = [rec.info for rec in store.nodes.values()]   # replaced, never changed, on registration
    kept = _REGISTERED.get(store)
    if kept is None or len(kept[0]) != len(infos) or not all(map(is_, kept[0], infos)):
        nodes = tuple(info for info in (node_info(store, name) for name in store.nodes) if info is not None)
        kept = _REGISTERED[store] = (infos, (nodes, frozenset(g.model for n in nodes for g in n.gpus)))
    return kept[1]


_REGISTERED: "weakref.WeakKeyDictionary[Any, tuple[list[dict], tuple[tuple[NodeInfo, ...], frozenset[str]]]]" = (
    weakref.WeakKeyDictionary())


def _display_state(state: str, gpus_alloc: int, gpus_total: int, busy: bool) -> str:
    if state != UP:
        return state
    if not busy:
        return "IDLE"
    return "ALLOCATED" if gpus_total and gpus_alloc == gpus_total else "MIXED"


def _int_list(v: Any, name: str) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RequestError(f"{name} must be a list of integers")
    return v


def _str_list(v: Any, name: str) -> list[str] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RequestError(f"{name} must be a list of strings")
    return v


OPS = {"ping": op_ping, "submit": op_submit, "jobs": op_jobs_listing, "cancel": op_cancel, "nodes": op_nodes}
