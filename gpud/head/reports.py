"""Where the GPU-hours went: usage reports by account, user, partition or GPU type.

Theory of operation
-------------------
A report covers a window ``[since, until)``.  Its unit is the **allocation** (one attempt
of a job on its GPUs, a row of ``allocations``): the part of it inside the window, times its
GPUs, is what the job's group was given.  For each GPU model in it (read from the node's
registered GPUs):

* GPU-hours        overlap seconds x GPUs / 3600, a MIG slice, MPS share or time-slice
                   replica counting its fraction of the GPU (``gpustate.device_fraction``,
                   what the fair-share usage bills: ``held_gpus``), each node of a
                   multi-node job its own GPUs;
* billed units     GPU-hours x ``[billing] weights`` of the model (1 when unset), as the
                   fair-share usage counts them;
* cost             GPU-hours x ``[billing] prices`` of the model (0 when unset);
* utilization      the job's sampled mean (``job_telemetry``: GPU-seconds of work over
                   sampled GPU-seconds), weighted by the allocation's GPU-hours in the window;
* idle GPU-hours   GPU-hours x the fraction of the job's sampled GPU-seconds under 5 %.

Telemetry is kept per job, not per hour, so a job that straddles the window edge is assumed
to have worked evenly over its life; allocations never sampled (telemetry off, or too short
for one sample) count in GPU-hours, billing and cost, and not in utilization or idle time.

``compute`` is pure (rows, prices, window in; rows out) so the arithmetic is tested by
hand-computed numbers; ``build_report`` reads the store and calls it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from ..sched.config import SchedConfig
from ..sched.gpustate import device_fraction
from ..sched.snapshot import Device
from .store import JobRecord, Store
from .store_reports import allocation_rows
from .store_telemetry import TelemetryRepository

GROUPINGS = ("account", "user", "partition", "gpu-type")
UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class Allocation:
    job_id: int
    attempt: int
    user: str
    account: str
    partition: str
    node: str
    gpu_indices: tuple[int, ...]
    start: float
    end: float | None          # None: still running
    shares: tuple[float, ...] = ()   # the share of each of gpu_indices held (); () all whole


@dataclass(frozen=True)
class JobShares:
    """A job's sampled fractions: utilization (0-1) and idle share of its GPU-time."""

    util: float
    idle: float


@dataclass
class ReportRow:
    key: str
    gpu_hours: float = 0.0
    billed: float = 0.0
    cost: float = 0.0
    util_mean: float | None = None      # percent
    idle_gpu_hours: float = 0.0
    jobs: int = 0
    # accumulators, not shown
    _sampled_h: float = 0.0
    _work_h: float = 0.0

    def public(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        for k in ("gpu_hours", "billed", "cost", "idle_gpu_hours"):
            d[k] = round(d[k], 6)
        if d["util_mean"] is not None:
            d["util_mean"] = round(d["util_mean"], 6)
        return d


def compute(allocations: Iterable[Allocation], shares: dict[int, JobShares],
            model_of: Callable[[str, int], str], sched: SchedConfig, *, since: float, until: float,
            now: float, by: str) -> tuple[list[ReportRow], ReportRow]:
    """Rows grouped ``by`` (sorted by key) and the total; see the module docstring."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot group by {by!r}; use one of {', '.join(GROUPINGS)}")
    rows: dict[str, ReportRow] = {}
    total = ReportRow("TOTAL")
    jobs: dict[str, set[int]] = {}
    all_jobs: set[int] = set()
    for a in allocations:
        end = min(a.end if a.end is not None else now, until)
        overlap = end - max(a.start, since)
        if overlap <= 0:
            continue
        per_model: dict[str, float] = {}
        for k, i in enumerate(a.gpu_indices):
            m = model_of(a.node, i)
            per_model[m] = per_model.get(m, 0.0) + (a.shares[k] if a.shares else 1.0)
        share = shares.get(a.job_id)
        for model, count in per_model.items():
            key = {"account": a.account, "user": a.user, "partition": a.partition, "gpu-type": model}[by]
            hours = overlap * count / 3600.0
            for row in (rows.setdefault(key, ReportRow(key)), total):
                row.gpu_hours += hours
                row.billed += hours * sched.billing_weight(model)
                row.cost += hours * sched.price(model)
                if share is not None:
                    row._sampled_h += hours
                    row._work_h += hours * share.util
                    row.idle_gpu_hours += hours * share.idle
            jobs.setdefault(key, set()).add(a.job_id)
            all_jobs.add(a.job_id)
    for row in list(rows.values()) + [total]:
        row.util_mean = 100.0 * row._work_h / row._sampled_h if row._sampled_h > 0 else None
    for key, row in rows.items():
        row.jobs = len(jobs[key])
    total.jobs = len(all_jobs)
    return [rows[k] for k in sorted(rows)], total


async def build_report(store: Store, sched: SchedConfig, *, since: float, until: float, now: float,
                       by: str, live: dict[int, JobShares] | None = None) -> dict[str, Any]:
    """The ``report`` op's result: rows, total and the window.  ``live``: fresher shares of
    jobs whose telemetry is not written yet."""
    allocations = await load_allocations(store, since, until)
    shares = await load_shares(store, {a.job_id for a in allocations})
    shares.update(live or {})
    rows, total = compute(allocations, shares, models_from(store), sched, since=since, until=until,
                          now=now, by=by)
    return {"by": by, "since": since, "until": until, "rows": [r.public() for r in rows],
            "total": total.public(), "prices": dict(sched.prices)}


async def load_allocations(store: Store, since: float, until: float, job_id: int | None = None) -> list[Allocation]:
    """The allocations (one per node of each) that overlap ``[since, until)``; of one job with ``job_id``."""
    out = []
    for row in await allocation_rows(store, since, until, job_id):
        job_id, attempt, user, account, partition, node, gpus, start, end, parts, devices = row
        job = store.active.get(job_id)
        if end is None and (job is None or job.attempt != attempt or not job.state.active):
            continue  # an allocation the head never closed (a crash mid-way): not running now
        shared = shared_devices(json.loads(devices or "[]"))
        if shared:      # slices and shares, each its fraction of its GPU
            out.append(Allocation(job_id, attempt, user, account, partition, node,
                                  tuple(d.index for d in shared), start, end,
                                  tuple(device_share(store, node, d) for d in shared)))
            continue
        out.append(Allocation(job_id, attempt, user, account, partition, node,
                              tuple(json.loads(gpus)), start, end))
        for p in json.loads(parts or "[]"):   # the other nodes of a multi-node job
            out.append(Allocation(job_id, attempt, user, account, partition, str(p["node"]),
                                  tuple(p["gpu_indices"]), start, end))
    return out


async def load_shares(store: Store, job_ids: set[int]) -> dict[int, JobShares]:
    out: dict[int, JobShares] = {}
    for job_id, gpu_s, util_gpu_s, idle_gpu_s in await TelemetryRepository(store).shares(job_ids):
        out[job_id] = JobShares(util=util_gpu_s / gpu_s, idle=idle_gpu_s / gpu_s)
    return out


async def allocated_gpu_seconds(store: Store, job_id: int, now: float) -> float:
    """A job's GPU-walltime over all its attempts and nodes, slices and shares by fraction,
    as report bills it (seff's "GPU-walltime")."""
    total = 0.0
    for a in await load_allocations(store, float("-inf"), float("inf"), job_id):
        held = sum(a.shares) if a.shares else len(a.gpu_indices)
        total += max(0.0, (a.end if a.end is not None else now) - a.start) * held
    return total


def shared_devices(entries: Iterable[Any]) -> list[Device]:
    """The MIG slices, MPS shares and time-slice replicas among recorded device entries
    (malformed ones dropped); [] for a job of whole GPUs."""
    out = []
    for d in entries:
        try:
            dev = Device.from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if dev.kind != "gpu":
            out.append(dev)
    return out


def device_share(store: Store, node: str, dev: Device) -> float:
    """The share of its GPU ``dev`` is billed, as the fair-share usage bills it."""
    from .scheduling import node_view   # the scheduler's view of the node's GPUs

    view = node_view(store, node) if node in store.nodes else None
    gpu = next((g for g in view.gpus if g.index == dev.index), None) if view is not None else None
    return device_fraction(dev, gpu)


def held_gpus(store: Store, job: JobRecord) -> float:
    """GPUs a running job holds, over all its nodes, a slice or share by its fraction: what
    sacct, seff, report and /metrics count (a 1g.10gb slice of an A100 is 1/7)."""
    shared = shared_devices(job.devices)
    if shared and job.node is not None:
        return sum(device_share(store, job.node, d) for d in shared)
    return float(len(job.gpu_indices) + sum(len(p.get("gpu_indices", ())) for p in job.parts))


def allocation_fields(store: Store, sched: SchedConfig, job: JobRecord,
                      model_of: Callable[[str, int], str] | None = None) -> dict[str, float]:
    """``gpus_held`` (held_gpus, 0 before the job starts) and ``billing`` (the same, each GPU
    by its model's billing weight: billed GPU-seconds a second, what sshare's usage grows by)
    for a JOB record, so that scontrol, squeue --json, sacct --json, report and sshare agree."""
    if job.node is None or job.start_time is None:
        return {"gpus_held": 0.0, "billing": 0.0}
    model_of = model_of or models_from(store)   # a listing passes one for all its jobs
    shared = shared_devices(job.devices)
    if shared:
        held = [(job.node, d.index, device_share(store, job.node, d)) for d in shared]
    else:
        held = [(job.node, i, 1.0) for i in job.gpu_indices]
        held += [(str(p.get("node")), int(i), 1.0) for p in job.parts for i in p.get("gpu_indices", ())]
    billing = sum(share * sched.billing_weight(model_of(node, i)) for node, i, share in held)
    return {"gpus_held": round(sum(s for _, _, s in held), 6), "billing": round(billing, 6)}


def models_from(store: Store) -> Callable[[str, int], str]:
    """GPU (node, index) -> model, from what the nodes registered."""
    table: dict[tuple[str, int], str] = {}
    for rec in store.nodes.values():
        for g in rec.info.get("gpus", []):
            table[(rec.name, g.get("index"))] = str(g.get("model", UNKNOWN_MODEL))
    return lambda node, index: table.get((node, index), UNKNOWN_MODEL)
