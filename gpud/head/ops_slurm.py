"""Slurm's controls on the head, as socket operations: hold, release, requeue, update, show.

Theory of operation
-------------------
Operations (``OPS``) name jobs the way gpuctl does: ``job_ids`` (an array's id means all
of its tasks) and ``array_tasks`` (``[[array id, task], ...]`` for ``123_4``), resolved by
``slurm.resolve``.  Each changes jobs through ``Txn.transition`` in one ``head.change()``
(head/change.py), so every hold, release, requeue and update is checked, logged in the
job's event log and committed before the caller, or any worker, hears about it.  A refusal for one job is one line in
``errors``; the others still happen (as with scancel).

Who may do what (Slurm's rules): the owner, root or an admin may act on a job; owners may
only lower limits (a shorter time limit, a higher nice, a QOS of no higher priority, a
lower array throttle) and cannot release a job an admin held; only admins change nodes.
``plan_update`` holds every rule of ``update_job`` in one place.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from .. import hostlist
from ..model import JobState, StopReason
from ..syntax import SyntaxProblem, parse_dependency, parse_time
from ..units import UnitError, format_duration, parse_duration
from . import arrays, deps
from ..ctlsocket import Caller, RequestError
from .jobcaps import SubmitCaps
from .jobs import may_modify, requeue_changes
from .metrics import cluster_fragmentation, fragmentation_fields
from .scheduling import DOWN, DRAIN, UP
from .slurm import (HELD_REASONS, dependency_of, is_admin, missing_targets, parse_or_refuse, parse_refs, ref_text,
                    resolve)
from .store import JobRecord, Txn

if TYPE_CHECKING:
    from .daemon import Head

log = logging.getLogger("gpud.head")


def _owner_or_admin(head: "Head", caller: Caller, job: JobRecord) -> bool:
    return may_modify(job.uid, caller.uid, caller.user, head.admins, os.geteuid())


# -- hold, release, requeue ---------------------------------------------------------------------

# act(job, txn, now) -> an error line for that job, or None when it was done
JobAction = Callable[[JobRecord, Txn, float], "str | None"]


async def _for_each_job(head: "Head", caller: Caller, args: dict, act: JobAction, *,
                        wake: bool = False) -> tuple[list[str], list[str]]:
    """Resolve the jobs ``args`` name and apply ``act`` to each one the caller may change, all in
    one change (``wake``: a pass follows when any was done); (ids done, error lines)."""
    done: list[str] = []
    async with head.change() as ch:
        jobs, errors = await resolve(head.store, parse_refs(args))
        for job in jobs:
            error = ("Access/permission denied" if not _owner_or_admin(head, caller, job)
                     else act(job, ch.txn, ch.now))
            if error:
                errors.append(f"job {job.display_id}: {error}")
            else:
                done.append(job.display_id)
        if done and wake:
            ch.wake()
    return done, errors


async def op_hold(head: "Head", caller: Caller, args: dict) -> dict:
    """{"job_ids"|"array_tasks", "user": bool?} -> {"done": [str], "errors": [str]}.

    An admin's hold is an admin hold (JobHeldAdmin) unless ``user``; anyone else's is a user hold.
    """
    kind = "admin" if is_admin(head, caller) and not args.get("user") else "user"

    def hold(job: JobRecord, txn: Txn, now: float) -> str | None:
        if job.state is not JobState.PENDING:
            return "Job is no longer pending execution"
        txn.transition(job, JobState.PENDING, now=now, event="held", detail=f"by {caller.user} ({kind})",
                       hold_kind=kind, spec=replace(job.spec, hold=True), reason=HELD_REASONS[kind])
        return None

    done, errors = await _for_each_job(head, caller, args, hold)
    return {"done": done, "errors": errors}


async def op_release(head: "Head", caller: Caller, args: dict) -> dict:
    """{"job_ids"|"array_tasks"} -> {"done", "errors"}: release held jobs."""
    admin = is_admin(head, caller)

    def release(job: JobRecord, txn: Txn, now: float) -> str | None:
        kind = job.hold_kind or ("user" if job.spec.hold else None)
        if job.state is not JobState.PENDING or kind is None:
            return "Job is not held"
        if kind == "admin" and not admin:
            return "held by an administrator; only root or an admin may release it"
        txn.transition(job, JobState.PENDING, now=now, event="released", detail=f"by {caller.user}",
                       hold_kind=None, spec=replace(job.spec, hold=False), reason=None)
        return None

    done, errors = await _for_each_job(head, caller, args, release, wake=True)
    return {"done": done, "errors": errors}


async def op_requeue(head: "Head", caller: Caller, args: dict) -> dict:
    """{"job_ids"|"array_tasks"} -> {"done", "errors"}: stop running jobs and queue them again;
    finished ones go straight back to the queue (Slurm: "Requeue a running, suspended or
    finished Slurm batch job into pending state")."""
    refs = parse_refs(args)
    done: list[str] = []
    errors: list[str] = []
    async with head.change() as ch:
        now, txn = ch.now, ch.txn
        jobs, missing = await resolve(head.store, refs)
        finished, found_refs = await _finished_jobs(head, refs)
        errors += [m for m in missing if m.partition(":")[0] not in found_refs]
        for job in sorted([*jobs, *finished], key=lambda j: j.job_id):
            if not _owner_or_admin(head, caller, job):
                errors.append(f"job {job.display_id}: Access/permission denied")
            elif job.state is JobState.PENDING:
                errors.append(f"job {job.display_id}: Job is pending execution; nothing to requeue")
            elif job.state.terminal:
                txn.transition(job, JobState.PENDING, now=now, event="requeued", detail=f"by {caller.user}",
                               **requeue_changes(job))
                done.append(job.display_id)
            elif job.state is not JobState.RUNNING:
                errors.append(f"job {job.display_id}: Job is already stopping")
            else:
                job = txn.transition(job, JobState.COMPLETING, now=now, event="requeue", detail=f"by {caller.user}",
                                     stop_reason=StopReason.REQUEUE.value, stop_time=now)
                log.info("job %s (user %s) requeued by %s", job.display_id, job.user, caller.user)
                ch.signal(job, "TERM", grace=head.cfg.head.kill_grace, reason="cancelled")
                done.append(job.display_id)
        if finished:
            ch.wake()
    return {"done": done, "errors": errors}


async def _finished_jobs(head: "Head", refs: list[tuple[int, int | None]]) -> tuple[list[JobRecord], set[str]]:
    """The finished jobs ``refs`` name (all of an array's finished tasks for its id), and the
    refs (as ``job 11_2``) that named some."""
    out: dict[int, JobRecord] = {}
    named: set[str] = set()
    for job_id, task in refs:
        for j in await head.store.find_jobs(job_ids=[job_id], arrays=True):
            if j.state.terminal and j.job_id not in head.store.active and (
                    task is None or (j.array_job_id == job_id and j.array_task_id == task)):
                out[j.job_id] = j
                named.add(f"job {ref_text(job_id, task)}")
    return list(out.values()), named


# -- update job ---------------------------------------------------------------------------------

_UPDATE_KEYS = {k.lower(): k for k in (
    "TimeLimit", "Nice", "Partition", "QOS", "Account", "Dependency", "Comment", "JobName",
    "StartTime", "Deadline", "ArrayTaskThrottle")}
_ALIASES = {"name": "JobName", "begintime": "StartTime", "begin": "StartTime"}


def update_keys(changes: Any) -> dict[str, str]:
    """Slurm's ``Key=Value`` names, case-insensitive, to their canonical spelling."""
    if not isinstance(changes, dict) or not changes:
        raise RequestError("nothing to update: give Key=Value pairs such as TimeLimit=1:00:00")
    out = {}
    for k, v in changes.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise RequestError("updates must map names to text values")
        name = _UPDATE_KEYS.get(k.lower()) or _ALIASES.get(k.lower())
        if name is None:
            raise RequestError(f"cannot update {k!r} of a job; updatable: {', '.join(sorted(_UPDATE_KEYS.values()))}")
        out[name] = v
    return out


class Refusal(Exception):
    """One job's update is refused; the message says why."""


def plan_update(head: "Head", caller: Caller, job: JobRecord, changes: dict[str, str], admin: bool,
                now: float) -> dict[str, Any]:
    """The column changes that apply ``changes`` to ``job``, or Refusal with the rule it breaks.

    Owners may only lower limits; root and admins may set anything, a running job's time
    limit too (its workers are told: ``time_limit_changed``).
    """
    cfg = head.cfg.sched
    out: dict[str, Any] = {}
    spec = job.spec
    pending = job.state is JobState.PENDING

    def need_pending(key: str) -> None:
        if not pending:
            raise Refusal(f"{key} can only change while the job is pending")

    for key, value in changes.items():
        if key == "TimeLimit":
            try:
                limit = parse_duration(value)
            except UnitError as e:
                raise Refusal(f"TimeLimit: {e}") from None
            raising = limit is None if job.time_limit is not None else False
            if job.time_limit is not None and limit is not None and limit > job.time_limit:
                raising = True
            if raising and not admin:
                raise Refusal(f"only root or an admin may raise a time limit "
                              f"(from {format_duration(job.time_limit)} to {format_duration(limit)})")
            out["time_limit"] = limit
            spec = replace(spec, time_limit=limit)
        elif key == "Nice":
            try:
                nice = int(value)
            except ValueError:
                raise Refusal(f"Nice must be a whole number, not {value!r}") from None
            if not -10000 <= nice <= 10000:
                raise Refusal("Nice must be between -10000 and 10000")
            if nice < spec.nice and not admin:
                raise Refusal(f"only root or an admin may lower a nice value (from {spec.nice} to {nice})")
            spec = replace(spec, nice=nice)
        elif key == "Partition":
            need_pending(key)
            part = cfg.partitions.get(value)
            if part is None:
                raise Refusal(f"no partition {value!r}; partitions: {', '.join(sorted(cfg.partitions))}")
            if not admin and part.max_time is not None and (out.get("time_limit", job.time_limit) or float("inf")) > part.max_time:
                raise Refusal(f"the job's time limit exceeds partition {value}'s MaxTime")
            out["partition"] = value
            spec = replace(spec, partition=value)
        elif key == "QOS":
            need_pending(key)
            new = cfg.qos.get(value)
            if new is None:
                raise Refusal(f"no QOS {value!r}; QOS: {', '.join(sorted(cfg.qos))}")
            old = cfg.qos.get(job.qos)
            if not admin and old is not None and new.priority > old.priority:
                raise Refusal(f"only root or an admin may move a job to a QOS of higher priority ({job.qos} -> {value})")
            out["qos"] = value
            spec = replace(spec, qos=value)
        elif key == "Account":
            need_pending(key)
            if value not in cfg.accounts:
                raise Refusal(f"no account {value!r}")
            if not admin and not cfg.user_in_account(job.user, value):
                raise Refusal(f"user {job.user} is not a member of account {value}")
            out["account"] = value
            spec = replace(spec, account=value)
        elif key == "Dependency":
            need_pending(key)
            try:
                dep = parse_dependency(value)
            except SyntaxProblem as e:
                raise Refusal(str(e)) from None
            if dep is not None and deps.creates_cycle(job.job_id, dep, _depends_on(head)):
                raise Refusal("Job dependency problem: the dependency would make the job wait for itself")
            text = dep.format() if dep else None
            out["dependency"] = text
            spec = replace(spec, dependency=text)
        elif key == "Comment":
            spec = replace(spec, comment=value or None)
        elif key == "JobName":
            if not value or len(value) > 200 or re.search(r"[\x00-\x1f/]", value):
                raise Refusal(f"invalid job name {value!r}")
            out["name"] = value
            spec = replace(spec, name=value)
        elif key in ("StartTime", "Deadline"):
            need_pending(key)
            try:
                t = parse_time(value, now) if value.lower() not in ("", "none", "n/a") else None
            except SyntaxProblem as e:
                raise Refusal(f"{key}: {e}") from None
            col = "begin_time" if key == "StartTime" else "deadline"
            out[col] = t
            spec = replace(spec, **{col: t})
        elif key == "ArrayTaskThrottle":
            if job.array_job_id is None:
                raise Refusal("ArrayTaskThrottle applies to array jobs only")
            try:
                limit = int(value)
            except ValueError:
                raise Refusal(f"ArrayTaskThrottle must be a whole number, not {value!r}") from None
            if limit < 0:
                raise Refusal("ArrayTaskThrottle must not be negative (0: no limit)")
            old = job.array_throttle or 0
            if not admin and old and (limit == 0 or limit > old):
                raise Refusal(f"only root or an admin may raise an array's task limit (from {old} to {limit or 'none'})")
            out["array_throttle"] = limit or None
    out["spec"] = spec
    return out


def _depends_on(head: "Head"):
    def depends_on(job_id: int) -> list[int]:
        j = head.store.active.get(job_id)
        if j is None or not j.dependency:
            return []
        dep = dependency_of(j.dependency)
        return sorted(dep.job_ids()) if dep else []
    return depends_on


async def op_update_job(head: "Head", caller: Caller, args: dict) -> dict:
    """{"job_ids"|"array_tasks", "changes": {Key: text}} -> {"done", "errors"}."""
    changes = update_keys(args.get("changes"))
    admin = is_admin(head, caller)
    done = []
    caps: SubmitCaps | None = None
    async with head.change() as ch:
        now, txn = ch.now, ch.txn
        jobs, errors = await resolve(head.store, parse_refs(args))
        if "Dependency" in changes:
            dep = parse_or_refuse(changes["Dependency"])
            missing = await missing_targets(head.store, dep)
            if missing:
                raise RequestError(f"Job dependency problem: no job {missing[0]}")
        for job in jobs:
            if not _owner_or_admin(head, caller, job):
                errors.append(f"job {job.display_id}: Access/permission denied")
                continue
            if job.state not in (JobState.PENDING, JobState.RUNNING):
                errors.append(f"job {job.display_id}: Job is already stopping")
                continue
            try:
                cols = plan_update(head, caller, job, changes, admin, now)
            except Refusal as e:
                errors.append(f"job {job.display_id}: {e}")
                continue
            if not admin and ("qos" in cols or "account" in cols):   # where it goes holds no more than it allows
                caps = caps or SubmitCaps(head.store.active, head.cfg)
                refusal = caps.move(job, cols.get("qos", job.qos), cols.get("account", job.account))
                if refusal:
                    errors.append(f"job {job.display_id}: {refusal}")
                    continue
            detail = " ".join(f"{k}={v}" for k, v in changes.items())
            updated = txn.transition(job, job.state, now=now, event="updated",
                                     detail=f"by {caller.user}: {detail}"[:500], **cols)
            if "time_limit" in cols and job.state is JobState.RUNNING:
                ch.then(time_limit_changed, head, updated)
            done.append(job.display_id)
        if done:
            ch.wake()
    return {"done": done, "errors": errors}


async def time_limit_changed(head: "Head", job: JobRecord) -> None:
    """Tell every node of a running job its new time limit: the batch script's on rank 0,
    a holder's (the limit, the kill grace and gang.HOLDER_SLACK) on the others."""
    from ..bus.base import node_cmd
    from ..bus.messages import TimeLimit
    from .gang import job_nodes

    log.info("job %s (user %s): time limit now %s", job.display_id, job.user, format_duration(job.time_limit))
    for rank, node in enumerate(job_nodes(job)):
        limit = node_time_limit(job, rank, head.cfg.head.kill_grace)
        await head.bus.publish(node_cmd(node), TimeLimit(job.job_id, job.attempt, limit))


def node_time_limit(job: JobRecord, rank: int, kill_grace: float) -> float | None:
    """The limit a node of ``job`` enforces: the batch script's on rank 0, a holder's (the
    limit, ``kill_grace`` and gang.HOLDER_SLACK) on the others."""
    from .gang import HOLDER_SLACK

    if rank and job.time_limit is not None:
        return job.time_limit + kill_grace + HOLDER_SLACK
    return job.time_limit


# -- nodes ----------------------------------------------------------------------------------------

def expand_hostlist(text: str) -> list[str]:
    """``gpu[01-03,07],cpu1`` -> gpu01, gpu02, gpu03, gpu07, cpu1."""
    try:
        return hostlist.expand(text)
    except ValueError as e:
        raise RequestError(f"invalid node list: {e}") from None


SHOW_EVENTS_FOR = 64     # scontrol show: history read for at most this many jobs or nodes


async def op_update_node(head: "Head", caller: Caller, args: dict) -> dict:
    """{"nodes": "gpu[01-02]", "state": "DRAIN"|"RESUME", "reason": str?} -> {"done", "errors"}."""
    if not is_admin(head, caller):
        raise RequestError("Access/permission denied: only root and the users in [head] admins may change nodes")
    names = args.get("nodes")
    state = str(args.get("state") or "").upper()
    reason = args.get("reason")
    if not isinstance(names, str) or not names:
        raise RequestError("name the node(s) to update, e.g. NodeName=gpu01")
    if state not in ("DRAIN", "RESUME", "UNDRAIN"):
        raise RequestError(f"invalid node state {state or None!r}: use State=DRAIN or State=RESUME")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
        raise RequestError("Reason must be text of at most 500 characters")
    if state == "DRAIN" and not reason:
        raise RequestError("draining a node needs a Reason=... (say why, for the other admins)")
    done, errors = [], []
    async with head.change() as ch:   # every node named, in one transaction
        for name in expand_hostlist(names):
            rec = head.store.nodes.get(name)
            if rec is None:
                errors.append(f"node {name}: no such node")
                continue
            if state == "DRAIN":
                rec = ch.txn.node_transition(rec, DRAIN, reason=f"{reason} [{caller.user}]", now=ch.now,
                                             event="drained")
            elif rec.state in (DRAIN, DOWN):
                rec = ch.txn.node_transition(rec, UP, reason=None, now=ch.now, event=f"resumed by {caller.user}")
                head.liveness.heard[name] = head.mono()   # a DOWN node gets a full timeout to prove itself
            else:
                errors.append(f"node {name}: not drained or down; nothing to resume")
                continue
            log.info("node %s %s by %s%s", name, rec.state, caller.user, f": {reason}" if reason else "")
            done.append(name)
        if done:
            ch.wake()
    return {"done": done, "errors": errors}


# -- show -------------------------------------------------------------------------------------------

async def op_show(head: "Head", caller: Caller, args: dict) -> dict:
    """{"kind": "job"|"node"|"partition", ...} -> {"jobs"|"nodes"|"partitions": [...]}."""
    kind = args.get("kind")
    if kind == "job":
        refs = parse_refs(args)
        if refs:
            ids = sorted({j for j, _ in refs})
            rows = await head.store.find_jobs(job_ids=ids, arrays=True)
            wanted = [r for r in rows if any(
                (t is None and (r.job_id == j or r.array_job_id == j)) or (r.array_job_id == j and r.array_task_id == t)
                for j, t in refs)]
            if not wanted:
                raise RequestError(f"Invalid job id specified: {', '.join(ref_text(j, t) for j, t in refs)}")
        else:
            wanted = sorted(head.store.active.values(), key=lambda j: j.job_id)
        out = [job_details(j, head) for j in wanted]
        if refs and len(out) <= SHOW_EVENTS_FOR:   # why it was requeued (a node's failure, ...)
            for d, j in zip(out, wanted):
                if j.requeue_count:
                    requeues = [e for e in await head.store.job_events(j.job_id)
                                if e["event"] in ("node_fail", "requeued") and e["state"] == "PENDING"]
                    d["last_requeue"] = requeues[-1]["detail"] if requeues else None
        return {"jobs": out}
    if kind == "node":
        from .ops_jobs import op_nodes

        nodes = (await op_nodes(head, caller, {}))["nodes"]
        names = args.get("names")
        if names:
            wanted_names = set(expand_hostlist(",".join(str(n) for n in names)))
            nodes = [n for n in nodes if n["name"] in wanted_names]
            if not nodes:
                raise RequestError(f"Node {', '.join(sorted(wanted_names))} not found")
        parts = partitions(head)
        for n in nodes:
            n["partitions"] = [p["name"] for p in parts if n["name"] in p["node_names"]]
        if len(nodes) <= SHOW_EVENTS_FOR:   # the node's last state changes and why
            for n in nodes:
                n["events"] = await head.store.node_events(n["name"], 5)
        return {"nodes": nodes}
    if kind == "partition":
        parts = partitions(head)
        names = args.get("names")
        if names:
            parts = [p for p in parts if p["name"] in names]
            if not parts:
                raise RequestError(f"Partition {', '.join(map(str, names))} not found")
        return {"partitions": parts}
    raise RequestError(f"cannot show {kind!r}: use job, node, partition or config")


def job_details(job: JobRecord, head: "Head | None" = None) -> dict[str, Any]:
    """A JOB record plus the request's details, for ``scontrol show job``."""
    d = job.to_public()
    s = job.spec
    # "signal" stays the signal that ended the job (ExitCode's second half); the request is apart
    d.update({"requeue": s.requeue, "signal_request": signal_request(s), "gpu_type": s.gpu_type, "array": s.array,
              "open_mode": s.open_mode, "mail_type": s.mail_type, "mail_user": s.mail_user,
              "kill_on_invalid_dep": s.kill_on_invalid_dep, "array_summary": arrays.array_summary(job)})
    d.update({"constraint": s.constraint, "exclusive": s.exclusive,
              "req_nodelist": hostlist.compress(s.nodelist) if s.nodelist else None,
              "exc_nodelist": hostlist.compress(s.exclude) if s.exclude else None})
    if head is not None:
        from .reports import allocation_fields

        d.update(allocation_fields(head.store, head.cfg.sched, job))
    d["stdout_path"] = output_file(job, s.stdout)
    d["stderr_path"] = output_file(job, s.stderr) if s.stderr else d["stdout_path"]
    return d


def output_file(job: JobRecord, pattern: str | None) -> str:
    """The file the worker writes for ``pattern`` (None: the default), as scontrol shows it;
    an array's tasks not yet split off keep %a (and every task %N until it has a node)."""
    from ..syntax import DEFAULT_ARRAY_OUTPUT, expand_output

    if job.spec.array is not None and job.array_task_id is None:
        return os.path.normpath(os.path.join(job.spec.work_dir, pattern or DEFAULT_ARRAY_OUTPUT))
    return expand_output(pattern, work_dir=job.spec.work_dir, job_id=job.job_id, name=job.name, user=job.user,
                         node=job.node, array_job_id=job.array_job_id, array_task_id=job.array_task_id)


def signal_request(s: Any) -> str | None:
    """--signal as sbatch takes it: ``[B:]SIG@TIME`` (SIG without its SIG prefix), or None."""
    if not s.signal:
        return None
    name = s.signal[3:] if s.signal.startswith("SIG") else s.signal
    return f"{'B:' if s.signal_batch else ''}{name}@{60 if s.signal_time is None else s.signal_time}"


def partitions(head: "Head") -> list[dict[str, Any]]:
    """PARTITION records: the configured partitions with their nodes and job counts."""
    cfg = head.cfg.sched
    nodes = sorted(head.store.nodes.values(), key=lambda n: n.name)
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for j in head.store.active.values():
        bucket = pending if j.state is JobState.PENDING else running
        bucket[j.partition] = bucket.get(j.partition, 0) + 1
    frag = cluster_fragmentation(head.store, cfg)
    out = []
    for name in sorted(cfg.partitions):
        p = cfg.partitions[name]
        members = [n for n in nodes if "*" in p.nodes or any(fnmatch.fnmatchcase(n.name, pat) for pat in p.nodes)]
        out.append({
            "name": name, "default": p.default or name == cfg.default_partition, "state": "UP",
            "nodes": list(p.nodes), "node_names": [n.name for n in members],
            "default_time": p.default_time, "max_time": p.max_time, "priority": p.priority,
            "gpus_total": sum(len(n.info.get("gpus", [])) for n in members),
            "cpus_total": sum(int(n.info.get("cpus", 0)) for n in members),
            "jobs_pending": pending.get(name, 0), "jobs_running": running.get(name, 0),
            **fragmentation_fields(frag.by_partition[name]),
        })
    return out


OPS = {"hold": op_hold, "release": op_release, "requeue": op_requeue, "update_job": op_update_job,
       "update_node": op_update_node, "show": op_show}
