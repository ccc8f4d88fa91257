"""Socket operations that explain scheduling: ``sprio`` (priority factors) and ``sshare``.

Both read what the last pass computed or the usage ledger; neither changes anything, so
anyone may ask (as in Slurm).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from ..model import JobState
from ..sched.priority import fairshare_table
from ..ctlsocket import Caller, RequestError

if TYPE_CHECKING:
    from .daemon import Head


async def op_sprio(head: "Head", caller: Caller, args: dict) -> dict:
    job_ids = args.get("job_ids")
    users = args.get("users")
    if job_ids is not None and not (isinstance(job_ids, list) and all(type(j) is int for j in job_ids)):
        raise RequestError("job_ids must be a list of integers")
    if users is not None and not (isinstance(users, list) and all(isinstance(u, str) for u in users)):
        raise RequestError("users must be a list of strings")
    plan = head.last_plan
    factors = plan.factors if plan is not None else {}
    rows = []
    for job in sorted(head.store.active.values(), key=lambda j: j.job_id):
        if job.state is not JobState.PENDING:
            continue
        if job_ids is not None and job.job_id not in job_ids:
            continue
        if users is not None and job.user not in users:
            continue
        f = factors.get(job.job_id, {})
        rows.append({
            "job_id": job.job_id, "user": job.user, "account": job.account, "partition": job.partition,
            "qos": job.qos, "priority": plan.priorities.get(job.job_id, 0.0) if plan else 0.0,
            "factors": dict(f), "reason": job.reason,
        })
    weights = asdict(head.cfg.sched.weights)
    return {"jobs": rows, "weights": weights}


async def op_sshare(head: "Head", caller: Caller, args: dict) -> dict:
    users = args.get("users")
    if users is not None and not (isinstance(users, list) and all(isinstance(u, str) for u in users)):
        raise RequestError("users must be a list of strings")
    members = {(j.account, j.user) for j in head.store.active.values()}
    rows = fairshare_table(head.cfg.sched, head.usage.usage, members)
    out = []
    for r in rows:
        if users is not None and r.user is not None and r.user not in users:
            continue
        out.append({
            "account": r.account, "user": r.user, "depth": r.depth, "shares": r.shares,
            "norm_shares": r.norm_shares, "raw_usage": r.raw_usage, "effective_usage": r.effective_usage,
            "level_fs": r.level_fs, "fairshare": r.fairshare,
        })
    return {"rows": out, "half_life": head.cfg.sched.fairshare_half_life}


OPS = {"sprio": op_sprio, "sshare": op_sshare}
