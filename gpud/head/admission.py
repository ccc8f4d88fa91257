"""Admission at submit time: fill in defaults, and refuse what can never run.

"Not now" is the scheduler's business (a pending reason); "never" is refused here, with a
message that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import JobSpec, NodeInfo
from ..sched.config import SchedConfig


class Refused(Exception):
    """A request that can never run; the message is for the user."""


@dataclass(frozen=True)
class Resolved:
    account: str
    partition: str
    qos: str
    time_limit: float | None
    mem_mb: int


def resolve(spec: JobSpec, user: str, cfg: SchedConfig, nodes: list[NodeInfo]) -> Resolved:
    resolved = Resolved(
        account=spec.account or cfg.default_account,
        partition=spec.partition or cfg.default_partition,
        qos=spec.qos or cfg.default_qos,
        time_limit=spec.time_limit,
        mem_mb=spec.mem_mb or cfg.default_mem_mb,
    )
    if nodes:
        candidates = [n for n in nodes if spec.gpu_type is None or any(g.model == spec.gpu_type for g in n.gpus)]
        if spec.gpu_type is not None and not candidates:
            models = sorted({g.model for n in nodes for g in n.gpus})
            raise Refused(f"no node has GPUs of type {spec.gpu_type!r} (available: {', '.join(models) or 'none'})")
        most = max(sum(1 for g in n.gpus if spec.gpu_type is None or g.model == spec.gpu_type) for n in candidates)
        if spec.gpus > most:
            raise Refused(f"Requested node configuration is not available: {spec.gpus} GPUs requested, "
                          f"the largest node has {most}")
        if spec.cpus > max(n.cpus for n in candidates):
            raise Refused(f"Requested node configuration is not available: {spec.cpus} CPUs requested, "
                          f"the largest node has {max(n.cpus for n in candidates)}")
        if resolved.mem_mb > max(n.mem_mb for n in candidates):
            raise Refused(f"Requested node configuration is not available: {resolved.mem_mb} MB of memory "
                          f"requested, the largest node has {max(n.mem_mb for n in candidates)} MB")
    return resolved
