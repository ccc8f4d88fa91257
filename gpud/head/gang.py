"""Multi-node (gang) jobs on the head: a job's nodes in rank order, their environment and launches.

Theory of operation
-------------------
A job that asks for ``nodes = N > 1`` is started by the scheduler on N nodes at once
(``Start.parts``).  Its record keeps rank 0 where a one-node job keeps its node
(``node``, ``gpu_indices``, ``cpus``, ``mem_mb``), and ranks 1..N-1 in ``parts``, each a
``part_dict``.  Everything that speaks to workers goes through ``job_nodes``: a launch,
a stop or a kill goes to every node of the job.

Rank 0 runs the batch script.  The other ranks run a *holder*: a script that only sleeps,
started by the worker exactly like a batch script (same user, same process group
handling, same GPUs), so the worker reports the part as running, fencing and stops work
on it unchanged, and ``gpuctl srun`` has somewhere to put its tasks.  Holders write no
output and get the job's time limit plus the kill grace and ``HOLDER_SLACK``: rank 0's
own limit ends the job, and the head then stops the holders; the slack only matters
when the head is away at that moment.

Every node learns the same facts without talking to the others: the node list (a
compressed hostlist), the node count, its own rank, rank 0's address (``labels["addr"]``,
from ``[worker] address``) and a port derived from the job id (``master_port``), sent in
the launch's ``extra_env``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable

from ..bus.messages import GpuAssignment, Launch
from ..hostlist import compress
from ..model import NodeInfo
from ..sched.snapshot import Part

if TYPE_CHECKING:
    from .store import JobRecord, Store

MASTER_PORT_BASE = 20000      # MASTER_PORT = base + job_id % span: every node agrees
MASTER_PORT_SPAN = 10000
HOLDER_SLACK = 60.0           # seconds a holder outlives rank 0's time limit (see above)
# The holder ignores the signals a job may be sent to tell it something (scancel --signal,
# --signal=USR1@60): only a stop (TERM, KILL) ends a part.
HOLDER_SCRIPT = ("#!/bin/bash\n"
                 "# gpud: holds this node's part of a multi-node job; gpuctl srun runs tasks here\n"
                 "trap '' HUP INT QUIT USR1 USR2 ALRM PIPE TSTP TTIN TTOU\n"
                 "exec sleep infinity\n")


def part_dict(node: str, gpu_indices: Iterable[int], gpu_uuids: Iterable[str], cpus: int,
              mem_mb: int) -> dict[str, Any]:
    return {"node": node, "gpu_indices": list(gpu_indices), "gpu_uuids": list(gpu_uuids),
            "cpus": cpus, "mem_mb": mem_mb}


def job_nodes(job: "JobRecord") -> list[str]:
    """The job's nodes in rank order (empty when it holds none)."""
    if job.node is None:
        return []
    return [job.node] + [str(p.get("node")) for p in job.parts]


def rank_of(job: "JobRecord", node: str) -> int | None:
    """The rank of ``node`` in the job's allocation, None when it holds nothing there."""
    try:
        return job_nodes(job).index(node)
    except ValueError:
        return None


def parts_view(job: "JobRecord") -> tuple[Part, ...]:
    """The scheduler's view of ranks 1..N-1; malformed entries are dropped."""
    out = []
    for p in job.parts:
        try:
            out.append(Part(node=str(p["node"]), gpu_indices=tuple(int(i) for i in p["gpu_indices"]),
                            cpus=int(p["cpus"]), mem_mb=int(p["mem_mb"])))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def master_port(job_id: int) -> int:
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def master_addr(store: "Store", job: "JobRecord") -> str:
    """Rank 0's address as its worker reported it, else its node name."""
    rec = store.nodes.get(job.node or "")
    labels = rec.info.get("labels") if rec is not None and isinstance(rec.info, dict) else None
    addr = labels.get("addr") if isinstance(labels, dict) else None
    return addr if isinstance(addr, str) and addr else (job.node or "")


def node_addr(info: NodeInfo) -> str:
    return info.labels.get("addr") or info.name


def nodelist_text(names: Iterable[str]) -> str:
    """A compressed hostlist (``w[1-3,7]``)."""
    return compress(list(names))


def ntasks_per_node(job: "JobRecord") -> int:
    return max(1, job.spec.ntasks_per_node)


def gang_env(job: "JobRecord", rank: int, addr: str, *, slurm: bool = False) -> dict[str, str]:
    """The environment every node of a job gets: node list, its rank, where rank 0 listens."""
    names = job_nodes(job)
    per_node = ntasks_per_node(job)
    env = {
        "GPUD_JOB_NODELIST": nodelist_text(names), "GPUD_NNODES": str(len(names)),
        "GPUD_NODEID": str(rank), "GPUD_NTASKS": str(per_node * len(names)),
        "GPUD_NTASKS_PER_NODE": str(per_node),
        "MASTER_ADDR": addr, "MASTER_PORT": str(master_port(job.job_id)),
    }
    if slurm:   # [head] slurm_compat_env: the one-node values batch_env sets are wrong here
        env.update({"SLURM_JOB_NODELIST": env["GPUD_JOB_NODELIST"], "SLURM_NODELIST": env["GPUD_JOB_NODELIST"],
                    "SLURM_JOB_NUM_NODES": env["GPUD_NNODES"], "SLURM_NNODES": env["GPUD_NNODES"],
                    "SLURM_NODEID": str(rank), "SLURM_NTASKS": env["GPUD_NTASKS"],
                    "SLURM_NPROCS": env["GPUD_NTASKS"], "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(names)})"})
    return env


def part_launch(launch: Launch, job: "JobRecord", rank: int) -> Launch:
    """Rank ``rank``'s launch from rank 0's: the holder, that node's GPUs and share."""
    if rank == 0:
        return launch
    p = job.parts[rank - 1]
    limit = job.time_limit
    return replace(
        launch, script=HOLDER_SCRIPT, stdout="/dev/null", stderr=None,
        gpus=tuple(GpuAssignment(int(i), str(u)) for i, u in zip(p.get("gpu_indices", []), p.get("gpu_uuids", []))),
        cpus=int(p.get("cpus", 1)), mem_mb=int(p.get("mem_mb", 0)),
        time_limit=None if limit is None else limit + launch.kill_grace + HOLDER_SLACK,
    )


def launches(launch: Launch, job: "JobRecord", addr: str, *, slurm: bool = False) -> list[tuple[str, Launch]]:
    """(node, launch) for every rank of ``job``; a one-node job gets its launch unchanged."""
    if not job.parts:
        return [(job.node or "", launch)]
    out = []
    for rank, node in enumerate(job_nodes(job)):
        one = part_launch(launch, job, rank)
        out.append((node, replace(one, extra_env={**one.extra_env, **gang_env(job, rank, addr, slurm=slurm)})))
    return out


def per_node(job: "JobRecord") -> list[tuple[str, "JobRecord"]]:
    """(node, the job as that node holds it) for each of its nodes: rank 0 is the job itself,
    later ranks a copy with that part's GPUs, CPUs and memory (sinfo, metrics)."""
    if job.node is None:
        return []
    out = [(job.node, job)]
    for p in job.parts:
        indices = tuple(int(i) for i in p.get("gpu_indices", ()))
        out.append((str(p.get("node")), replace(
            job, node=str(p.get("node")), gpu_indices=indices, gpu_uuids=tuple(p.get("gpu_uuids", ())),
            cpus=int(p.get("cpus", 0)), mem_mb=int(p.get("mem_mb", 0)), devices=(), parts=())))
    return out


def gpus_on(job: "JobRecord", node: str) -> tuple[int, ...] | None:
    """The GPU indices ``job`` holds on ``node``; None when it holds nothing there."""
    if job.node == node:
        return tuple(job.gpu_indices)
    for p in job.parts:
        if p.get("node") == node:
            return tuple(int(i) for i in p.get("gpu_indices", ()))
    return None
