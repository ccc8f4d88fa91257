"""The scheduler's output: complete data the head applies in one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Start:
    job_id: int
    node: str
    gpu_indices: tuple[int, ...]
    cpus: int
    mem_mb: int
    borrowed: bool = False


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
