"""One allocation the executor runs or watches: its launch, its wrapper process, its timers.

An ``Allocation`` lives on the event-loop thread and is changed in place as the job starts,
is stopped and ends.  ``record()`` is what the job's directory keeps of it (jobstore.py), so
that a restarted worker finds the wrapper again (pid *and* process start time) and still
delivers a stop's SIGKILL on time; ``from_saved`` reads it back.  Timers (the time limit,
the end of a stop's grace) are on the monotonic clock, so a step of the wall clock kills
nothing.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from .jobstore import Key, Saved
from .launch import Launch


@dataclass(eq=False)
class Allocation:
    """One allocation this executor runs or watches (mutable; event-loop thread only)."""

    launch: Launch
    pid: int | None = None           # the wrapper's pid, which is also the job's pgid
    create_time: float | None = None  # the wrapper's start time as psutil reports it
    start_time: float | None = None
    deadline: float | None = None    # monotonic time of the time limit
    stop_reason: str | None = None
    kill_at: float | None = None     # monotonic time of the SIGKILL that ends a stop's grace
    killed: bool = False             # SIGKILL sent
    popen: subprocess.Popen | None = None   # None when adopted or forked by the server
    pidfd: int | None = None         # the fork server's pidfd of the wrapper, until watched
    task: asyncio.Task | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    early: list[int] = field(default_factory=list)  # signals asked for before the spawn
    cpus: tuple[int, ...] = ()       # the CPUs it is bound to (gpud.worker.cpubind); (): unbound
    spent_fds: list[int] = field(default_factory=list)  # pidfds of the exited wrapper, to close
    warned: bool = False             # --signal's warning sent

    @property
    def key(self) -> Key:
        return (self.launch.job_id, self.launch.attempt)

    def record(self) -> dict[str, Any]:
        return {"version": 1, "timers": "monotonic", "pid": self.pid, "create_time": self.create_time,
                "start_time": self.start_time, "deadline": self.deadline,
                "stop_reason": self.stop_reason, "kill_at": self.kill_at, "killed": self.killed,
                "cpus": list(self.cpus),
                "launch": self.launch.to_body()}

    @classmethod
    def from_saved(cls, saved: Saved) -> "Allocation":
        """Raises ValueError (or KeyError, TypeError) when the record is unusable."""
        rec = saved.record
        if rec is None:
            raise ValueError("no record")
        job = cls(Launch.from_body(rec["launch"]))
        for name in ("create_time", "start_time", "deadline", "kill_at"):
            value = rec.get(name)
            setattr(job, name, float(value) if isinstance(value, (int, float)) else None)
        if rec.get("timers") != "monotonic":   # written by a worker that timed on the wall clock
            shift = time.monotonic() - time.time()
            job.deadline = None if job.deadline is None else job.deadline + shift
            job.kill_at = None if job.kill_at is None else job.kill_at + shift
        job.stop_reason = rec["stop_reason"] if isinstance(rec.get("stop_reason"), str) else None
        job.killed = rec.get("killed") is True
        cpus = rec.get("cpus")
        job.cpus = tuple(c for c in cpus if type(c) is int) if isinstance(cpus, list) else ()
        pid = rec.get("pid")
        # No pid: the worker died between the spawn and the record; the wrapper wrote its own.
        job.pid = pid if isinstance(pid, int) and pid > 0 else saved.wrapper_pid
        return job


def time_limit_deadline(launch: Launch, started: float) -> float | None:
    """The monotonic time of the limit of a job started at monotonic time ``started``."""
    return None if launch.time_limit is None else started + launch.time_limit


def warning_time(job: Allocation) -> float | None:
    """When --signal's warning is due: warn_time seconds before the deadline."""
    if job.launch.warn_signal is None or job.deadline is None:
        return None
    return job.deadline - job.launch.warn_time
