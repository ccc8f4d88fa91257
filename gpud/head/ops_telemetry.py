"""Socket operations on telemetry: ``report`` (usage and cost), ``seff`` (one job's
efficiency) and ``telemetry`` (the live view ``gpuctl top`` draws).

Like ``jobs`` and ``nodes`` these are open to every user: the queue is public on a gpud
cluster, and so is who uses the GPUs.  Arguments are checked here and refused with one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ctlsocket import Caller, RequestError
from .ops_jobs import op_nodes
from .reports import GROUPINGS, JobShares, allocation_fields, build_report
from .telemetry import JobUsage

if TYPE_CHECKING:
    from .daemon import Head

DEFAULT_REPORT_DAYS = 30


async def op_report(head: "Head", caller: Caller, args: dict) -> dict:
    now = head.clock()
    until = _time(args.get("until"), "until", now)
    since = _time(args.get("since"), "since", until - DEFAULT_REPORT_DAYS * 86400)
    if since >= until:
        raise RequestError("the report window is empty: --since must be earlier than --until")
    by = args.get("by", "account")
    if by not in GROUPINGS:
        raise RequestError(f"cannot group a report by {by!r}; use one of {', '.join(GROUPINGS)}")
    live = {j: _shares(u) for j, u in head.telemetry.usage.items() if u.gpu_s > 0}
    return await build_report(head.store, head.cfg.sched, since=since, until=until, now=now, by=by, live=live)


async def op_seff(head: "Head", caller: Caller, args: dict) -> dict:
    job_id = args.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise RequestError("job_id must be a positive integer")
    found = await head.store.find_jobs(job_ids=[job_id])
    if not found:
        raise RequestError(f"Invalid job id specified: {job_id}")
    job = found[0]
    usage = head.telemetry.usage.get(job_id) or await head.telemetry.load_usage(job_id)
    model, memory = None, None
    rec = head.store.nodes.get(job.node) if job.node else None
    if rec is not None:
        by_index = {g.get("index"): g for g in rec.info.get("gpus", [])}
        models = sorted({str(by_index[i].get("model")) for i in job.gpu_indices if i in by_index})
        model = ",".join(models) or None
        mems = [int(by_index[i].get("memory_mb", 0)) for i in job.gpu_indices if i in by_index]
        memory = max(mems) if mems else None
    return {
        "job": job.to_public(), "now": head.clock(), "cluster": head.cfg.cluster, "gpu_model": model, "gpu_memory_mb": memory,
        "alloc_gpu_s": await _allocated_gpu_seconds(head, job_id), "sampled_s": usage.sampled_s,
        "gpus_held": allocation_fields(head.store, head.cfg.sched, job)["gpus_held"],
        "gpu_s": usage.gpu_s, "util_gpu_s": usage.util_gpu_s, "idle_gpu_s": usage.idle_gpu_s,
    }


async def op_telemetry(head: "Head", caller: Caller, args: dict) -> dict:
    now = head.clock()
    nodes = (await op_nodes(head, caller, {}))["nodes"]
    running = [j for j in head.store.active.values() if j.state.active]
    owners = {j.job_id: j for j in running}
    for node in nodes:
        sample = head.telemetry.latest.get(node["name"])
        node["sampled_at"] = sample.time if sample is not None else None
        for g in node["gpus"]:
            reading = sample.gpus.get(g["index"]) if sample is not None else None
            for k in ("util", "mem_used_mb", "power_w", "temp_c"):
                g[k] = getattr(reading, k) if reading is not None else None
            g["users"] = [owners[j].user for j in g["job_ids"] if j in owners]
            g["slices"] = [{"uuid": u, "mem_used_mb": m} for i, u, m in (sample.slices if sample else ())
                           if i == g["index"]]
    queue: dict[str, dict[str, int]] = {}
    for j in head.store.active.values():
        q = queue.setdefault(j.partition, {"pending": 0, "running": 0, "completing": 0, "pending_gpus": 0})
        q[j.state.value.lower()] = q.get(j.state.value.lower(), 0) + 1
        if j.state.value == "PENDING":
            q["pending_gpus"] += j.gpus
    jobs = [{"job_id": j.job_id, "display_id": j.display_id, "user": j.user, "account": j.account, "partition": j.partition,
             "name": j.name, "node": j.node, "gpus": len(j.gpu_indices), "state": j.state.value,
             "reason": j.reason, "start_time": j.start_time, "gpu_util_mean": j.gpu_util_mean}
            for j in sorted(running, key=lambda j: j.job_id)]
    return {"now": now, "cluster": head.cfg.cluster, "nodes": nodes, "queue": queue, "jobs": jobs}


async def _allocated_gpu_seconds(head: "Head", job_id: int) -> float:
    from .reports import allocated_gpu_seconds   # over all nodes, slices by fraction

    return await allocated_gpu_seconds(head.store, job_id, head.clock())


def _shares(u: JobUsage) -> JobShares:
    return JobShares(util=u.util_gpu_s / u.gpu_s, idle=u.idle_gpu_s / u.gpu_s)


def _time(v: Any, name: str, default: float) -> float:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) > 1e11:
        raise RequestError(f"{name} must be a time in epoch seconds")
    return float(v)


async def op_sstat(head: "Head", caller: Caller, args: dict) -> dict:
    """A running job's usage from its cgroup, per step, as the worker last sampled it."""
    job_id = args.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise RequestError("job_id must be a positive integer")
    job = head.store.active.get(job_id)
    if job is None or not job.state.active:
        raise RequestError(f"Job {job_id} is not running: sstat shows running jobs only; "
                           f"use sacct -j {job_id} for a finished one")
    steps = head.telemetry.steps.get(job_id, {})
    return {"job": job.to_public(), "now": head.clock(),
            "steps": [{"step": name, "sampled_at": t, "max_rss": rss, "cpu_usec": cpu}
                      for name, (t, rss, cpu) in sorted(steps.items(), key=lambda kv: (kv[0] != "total", kv[0]))]}


OPS = {"report": op_report, "seff": op_seff, "telemetry": op_telemetry, "sstat": op_sstat}
