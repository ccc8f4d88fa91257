"""The scheduler's input: an immutable picture of the cluster at one moment.

The head builds a Snapshot from its database on every pass; the simulator builds one from
its virtual cluster; tests build them by hand.  Nothing here does I/O.  Times are epoch
seconds (virtual in the simulator); ``now`` is passed to ``schedule`` separately.

GPU sharing (see gpud/sched/shared.py): a GPU's ``mode`` says how it is handed out.
``whole`` GPUs go to ``--gpus N`` jobs; ``mig`` GPUs are cut into ``slices`` (MIG
instances); ``mps`` GPUs take up to ``mps_max_clients`` jobs of one user at a time, each
with a pinned memory share; ``timeslice`` GPUs take ``replicas`` jobs with no isolation.
A running job's ``devices`` say which slice or share it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from .config import SchedConfig


@dataclass(frozen=True)
class SliceView:
    """One MIG instance on a GPU: its profile, first memory slot, UUID and memory."""

    profile: str
    start: int
    uuid: str = ""
    memory_mb: int = 0


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    model: str
    memory_mb: int
    mode: str = "whole"                # "whole" | "mig" | "mps" | "timeslice"
    dynamic: bool = False              # mig: free slices may be re-laid to fit demand
    slices: tuple[SliceView, ...] = ()
    mps_max_clients: int = 48
    mps_thread_percentage: int | None = None
    replicas: int = 1                  # timeslice: jobs that may share it
    relaid_at: float | None = None     # last re-layout, for [scheduler] mig_min_interval
    reconfiguring: bool = False        # a re-layout is on its way to the worker: hands off
    relayout_after: float | None = None  # a re-layout was refused: none planned before this time
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Device:
    """What one job holds of one GPU (the launch body's ``gpus`` entries)."""

    index: int                         # the GPU's index on its node
    kind: str                          # "gpu" | "mig" | "mps" | "timeslice"
    uuid: str = ""                     # a slice's MIG-... UUID, else the GPU's
    slice_start: int | None = None     # mig: the slice's first memory slot
    mem_mb: int | None = None          # mps: the pinned memory limit; mig: the slice's memory
    profile: str | None = None         # mig: the slice's profile (billing, display)

    def to_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "kind": self.kind,
                "slice_start": self.slice_start, "mem_mb": self.mem_mb, "profile": self.profile}

    @classmethod
    def from_dict(cls, d: dict) -> "Device":
        """From a stored or sent entry; KeyError/TypeError/ValueError when malformed."""
        start, mem = d.get("slice_start"), d.get("mem_mb")
        return cls(index=int(d["index"]), kind=str(d["kind"]), uuid=str(d.get("uuid") or ""),
                   slice_start=None if start is None else int(start),
                   mem_mb=None if mem is None else int(mem),
                   profile=None if d.get("profile") is None else str(d["profile"]))


@dataclass(frozen=True)
class NodeView:
    name: str
    cpus: int
    mem_mb: int
    gpus: tuple[GpuView, ...]
    schedulable: bool = True          # False when DOWN, DRAIN or UNKNOWN
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Part:
    """One node of a multi-node (gang) job after the first: what that node gives it."""

    node: str
    gpu_indices: tuple[int, ...]
    cpus: int
    mem_mb: int


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
    mig_profile: str | None = None    # MIG slices of this profile; ``gpus`` = how many
    gpu_mem_mb: int | None = None     # one slice, MPS share or GPU with this much memory
    nodes: int = 1                    # gang: this many nodes, gpus // nodes GPUs on each
    nodelist: tuple[str, ...] = ()    # these nodes must all be in the allocation
    exclude: tuple[str, ...] = ()     # never these nodes
    constraint: str | None = None     # node features: "a&b" all, "a|b" any
    exclusive: bool = False           # no other job on its nodes
    switches: int | None = None       # at most this many leaf switches ...
    switches_wait: float | None = None  # ... waiting at most this many seconds for that
    # Derived once per job (the head and the simulator keep a job's view from pass to pass)
    # for the pass's per-job path: a plain job's verdict key (see core.consider_all), None
    # for a job that is held or blocked, asks for a fraction of a GPU, or for several nodes,
    # named nodes, features or whole nodes (those take their own paths).
    plain_key: tuple | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        plain = not (self.held or self.blocked_reason or self.mig_profile is not None or self.gpu_mem_mb is not None
                     or self.nodes != 1 or self.nodelist or self.exclude or self.constraint or self.exclusive)
        object.__setattr__(self, "plain_key", (self.partition, self.gpus, self.cpus, self.mem_mb, self.gpu_type,
                                               self.time_limit, self.qos, self.account) if plain else None)

    @property
    def shared(self) -> bool:
        """Asks for a fraction of a GPU (placed by gpud/sched/slices.py and shares.py)."""
        return self.mig_profile is not None or self.gpu_mem_mb is not None


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
    devices: tuple[Device, ...] = ()  # slices and shares held (gpu_indices is then empty)
    parts: tuple[Part, ...] = ()      # gang: the nodes after the first, in rank order
    exclusive: bool = False

    @property
    def gpus(self) -> int:
        if not self.parts:
            return len(self.gpu_indices)
        return len(self.gpu_indices) + sum(len(p.gpu_indices) for p in self.parts)

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
    # (victim, preemptor) job ids of earlier preemptions whose preemptor has not started
    # yet: it goes first in the queue, so what was stopped for it is not taken back (core.py)
    claims: tuple[tuple[int, int], ...] = ()


def live_claims(claims: Mapping[int, int], pending: Callable[[int], bool],
                restarted: Callable[[int], bool]) -> dict[int, int]:
    """The claims (victim -> preemptor) still in force: the preemptor has not started or
    left the queue, and the victim has not started again.  The head and the simulator
    keep their claims by this one rule."""
    return {v: b for v, b in claims.items() if pending(b) and not restarted(v)}
