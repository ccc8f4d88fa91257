"""The scheduler's output: complete data the head applies in one transaction.

Every pending job of the snapshot appears in ``priorities`` and ``factors``; every pending
job that does not start appears in ``reasons`` (Slurm's names: ``Priority``, ``Resources``,
``AccountLimit``, ...).  A job that waits for preempted jobs to exit has reason
``Resources`` and an expected start of ``now``; it starts in a later pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..gpu.mig import Slice
from .snapshot import Device, Part


@dataclass(frozen=True)
class Start:
    job_id: int
    node: str
    gpu_indices: tuple[int, ...]
    cpus: int
    mem_mb: int
    borrowed: bool = False
    devices: tuple[Device, ...] = ()     # the slices or shares of a fractional request
    parts: tuple[Part, ...] = ()         # gang: nodes after the first, rank order (node = rank 0)

    def __init__(self, job_id: int, node: str, gpu_indices: tuple[int, ...], cpus: int, mem_mb: int,
                 borrowed: bool = False, devices: tuple[Device, ...] = (), parts: tuple[Part, ...] = ()) -> None:
        # set directly: the generated __init__ of a frozen class calls object.__setattr__ once
        # a field, twice as slow, and a pass that fills a cluster makes thousands of these
        d = self.__dict__
        d["job_id"], d["node"], d["gpu_indices"], d["cpus"], d["mem_mb"] = job_id, node, gpu_indices, cpus, mem_mb
        d["borrowed"], d["devices"], d["parts"] = borrowed, devices, parts


@dataclass(frozen=True)
class Relayout:
    """Re-cut one MIG GPU: destroy free slices (by start slot), then create new ones."""

    node: str
    gpu: int
    destroy: tuple[int, ...]
    create: tuple[Slice, ...]
    reason: str


@dataclass(frozen=True)
class Preemption:
    job_id: int
    mode: str                 # "requeue" or "cancel"
    grace_time: float         # seconds between the first signal and SIGKILL
    reason: str               # e.g. "QOS high preempts low", "quota reclaim for research"
    for_job: int | None = None


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)         # pending job -> reason
    priorities: dict[int, float] = field(default_factory=dict)    # pending job -> priority
    expected_starts: dict[int, float] = field(default_factory=dict)  # backfill reservations
    # pending job -> weighted priority factors ("age", "fairshare", "job_size", "qos",
    # "partition", "nice"), for ``gpuctl sprio``; they sum to the job's priority.  A read-only
    # mapping whose dicts are built when read (priority.Factors): only sprio looks at them
    factors: Mapping[int, dict[str, float]] = field(default_factory=dict)
    # pending job -> node its reservation is on (with expected_starts), for ``squeue --start``
    reserved_nodes: dict[int, str] = field(default_factory=dict)
    # MIG GPUs to re-cut for pending slice demand (jobs waiting on them: reason MigReconfig)
    relayouts: list[Relayout] = field(default_factory=list)
