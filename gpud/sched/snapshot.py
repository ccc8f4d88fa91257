"""The scheduler's input: an immutable picture of the cluster at one moment.

The head builds a Snapshot from its database on every pass; the simulator builds one from
its virtual cluster; tests build them by hand.  Nothing here does I/O.  Times are epoch
seconds (virtual in the simulator); ``now`` is passed to ``schedule`` separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import SchedConfig


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    model: str
    memory_mb: int


@dataclass(frozen=True)
class NodeView:
    name: str
    cpus: int
    mem_mb: int
    gpus: tuple[GpuView, ...]
    schedulable: bool = True          # False when DOWN, DRAIN or UNKNOWN
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PendingJob:
    job_id: int
    user: str
    account: str
    partition: str
    qos: str
    gpus: int
    cpus: int
    mem_mb: int
    time_limit: float | None          # seconds; None = unlimited
    submit_time: float
    gpu_type: str | None = None
    nice: int = 0
    preempt_count: int = 0
    held: bool = False                # the head already knows it cannot start
    blocked_reason: str | None = None  # e.g. "Dependency", "BeginTime": not eligible now


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    user: str
    account: str
    partition: str
    qos: str
    node: str
    gpu_indices: tuple[int, ...]
    cpus: int
    mem_mb: int
    start_time: float
    time_limit: float | None
    preempt_count: int = 0
    borrowed: bool = False            # runs beyond its account's quota
    requeue: bool = True
    stopping: bool = False            # already signalled (COMPLETING): its resources free soon
    submit_time: float | None = None  # for its priority as a preemption victim; default start_time
    nice: int = 0

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)

    def end_time(self) -> float:
        """When its time limit runs out (inf when unlimited)."""
        return float("inf") if self.time_limit is None else self.start_time + self.time_limit


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    config: SchedConfig = field(default_factory=SchedConfig)
    # decayed, billed GPU-seconds per (account, user), as of ``now``
    usage: dict[tuple[str, str], float] = field(default_factory=dict)
    # times of recent preemptions, for the cluster-wide rate cap
    recent_preemptions: tuple[float, ...] = ()
