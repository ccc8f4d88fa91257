"""``schedule(snapshot, now) -> Plan``: the one scheduling decision procedure.

First version: jobs in (priority: older first) order, first fit on schedulable nodes.
"""

from __future__ import annotations

from .plan import Plan, Start
from .snapshot import Snapshot


def schedule(snap: Snapshot, now: float) -> Plan:
    plan = Plan()
    free_gpus: dict[str, list[int]] = {}
    free_cpus: dict[str, int] = {}
    free_mem: dict[str, int] = {}
    for n in snap.nodes:
        free_gpus[n.name] = [g.index for g in n.gpus]
        free_cpus[n.name] = n.cpus
        free_mem[n.name] = n.mem_mb
    for r in snap.running:
        if r.node in free_gpus:
            free_gpus[r.node] = [i for i in free_gpus[r.node] if i not in r.gpu_indices]
            free_cpus[r.node] -= r.cpus
            free_mem[r.node] -= r.mem_mb
    models = {n.name: {g.index: g.model for g in n.gpus} for n in snap.nodes}
    for job in sorted(snap.pending, key=lambda j: (j.submit_time, j.job_id)):
        if job.held or job.blocked_reason:
            plan.reasons[job.job_id] = job.blocked_reason or "Held"
            continue
        for n in snap.nodes:
            if not n.schedulable:
                continue
            gpus = [i for i in free_gpus[n.name]
                    if job.gpu_type is None or models[n.name][i] == job.gpu_type]
            if len(gpus) >= job.gpus and free_cpus[n.name] >= job.cpus and free_mem[n.name] >= job.mem_mb:
                take = tuple(gpus[: job.gpus])
                free_gpus[n.name] = [i for i in free_gpus[n.name] if i not in take]
                free_cpus[n.name] -= job.cpus
                free_mem[n.name] -= job.mem_mb
                plan.starts.append(Start(job.job_id, n.name, take, job.cpus, job.mem_mb))
                break
        else:
            plan.reasons[job.job_id] = "Resources"
    return plan
