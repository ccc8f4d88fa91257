"""Worker -> head: ``register`` (the node's resources), ``heartbeat``, ``started``,
``finished`` and ``samples`` (GPU telemetry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...model import NodeInfo
from ..fields import (MAX_ID, MAX_NAME, MessageError, any_int, any_text, integer, is_int, is_number, items, number,
                      obj, pairs, text)
from .body import MAX_ALLOCS, MAX_GPUS, Body, _job, _pairs_body

MAX_EXTRAS = 16384                 # MIG slices, processes, accounting rows in one sample
MAX_SAMPLE_INTERVAL = 3600.0       # a sample never stands for more than this many seconds


# -- worker -> head: the node and its allocations -------------------------------------------------------

def _node_info(v: Any) -> NodeInfo:
    d = obj(v, "node")
    text(d, "name", most=MAX_NAME)
    integer(d, "cpus", 0, 1 << 24)
    integer(d, "mem_mb", 0, MAX_ID)
    gpus = d.get("gpus", [])
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise MessageError(f"node gpus must be a list of at most {MAX_GPUS}")
    for g in gpus:
        g = obj(g, "each of node gpus")
        integer(g, "index", 0, MAX_GPUS - 1)
        integer(g, "memory_mb", 0, MAX_ID)
        text(g, "uuid", most=MAX_NAME)
        text(g, "model", most=MAX_NAME)
    labels = d.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > 1024 or not all(
            isinstance(k, str) and isinstance(x, str) and len(k) <= MAX_NAME and len(x) <= 65536
            for k, x in labels.items()):
        raise MessageError("node labels must map names to strings")
    try:
        return NodeInfo.from_dict(d)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise MessageError(f"malformed node info ({e})"[:300]) from None


@dataclass(frozen=True)
class Register(Body):
    """``register``: this node's resources and labels, as they are now."""

    KIND: ClassVar[str] = "register"

    node: NodeInfo

    def to_body(self) -> dict[str, Any]:
        return {"node": self.node.to_dict()}

    @classmethod
    def from_body(cls, d: Any) -> "Register":
        return cls(_node_info(obj(d).get("node")))


@dataclass(frozen=True)
class Heartbeat(Body):
    """``heartbeat``: what runs here and what ended unacknowledged; ``seq`` asks for a lease."""

    KIND: ClassVar[str] = "heartbeat"

    seq: int | None          # None: a worker from before leases
    running: tuple[tuple[int, int], ...] = ()
    done: tuple[tuple[int, int], ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"seq": self.seq, "running": _pairs_body(self.running), "done": _pairs_body(self.done)}

    @classmethod
    def from_body(cls, d: Any) -> "Heartbeat":
        d = obj(d)
        return cls(integer(d, "seq", default=None), pairs(d, "running", MAX_ALLOCS, ()),
                   pairs(d, "done", MAX_ALLOCS, ()))


@dataclass(frozen=True)
class Started(Body):
    """``started``: the allocation's script (or holder) runs, as process ``pid``."""

    KIND: ClassVar[str] = "started"

    job: int
    attempt: int
    pid: int | None = None
    time: float | None = None      # the worker's clock

    def to_body(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "pid": self.pid, "time": self.time}

    @classmethod
    def from_body(cls, d: Any) -> "Started":
        d = obj(d)
        return cls(*_job(d), integer(d, "pid", 0, 1 << 32, None), number(d, "time", -1e12, 1e12, None))


@dataclass(frozen=True)
class Finished(Body):
    """``finished``: how the allocation ended; repeated until the head's ``ack``.

    The exit code, signal, reason and message are taken as they come, whatever their size:
    the head clamps them, because a report it refused would be repeated for ever and its
    job never end (``gpud.head.outcomes``)."""

    KIND: ClassVar[str] = "finished"

    job: int
    attempt: int
    exit_code: int | None
    signal: int | None
    reason: str = "exited"
    time: float | None = None     # the worker's clock
    message: str | None = None
    max_rss: int | None = None    # peak memory of the job's cgroup, bytes; None: not measured
    cpu_usec: int | None = None   # CPU time of the job's cgroup, microseconds

    def to_body(self) -> dict[str, Any]:
        body = {"job": self.job, "attempt": self.attempt, "exit_code": self.exit_code, "signal": self.signal,
                "reason": self.reason, "time": self.time, "message": self.message}
        if self.max_rss is not None or self.cpu_usec is not None:
            body.update(max_rss=self.max_rss, cpu_usec=self.cpu_usec)
        return body

    @classmethod
    def from_body(cls, d: Any) -> "Finished":
        d = obj(d)
        reason = d.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise MessageError(f"reason must be a string, not {reason!r:.40}")
        return cls(*_job(d), any_int(d, "exit_code"), any_int(d, "signal"), reason or "exited",
                   number(d, "time", -1e12, 1e12, None), any_text(d, "message"),
                   any_int(d, "max_rss"), any_int(d, "cpu_usec"))


# -- worker -> head: telemetry ------------------------------------------------------------------------

def _opt(v: Any, lo: float, hi: float) -> bool:
    return v is None or (is_number(v) and lo <= v <= hi)


def _index(v: Any, hi: int = MAX_GPUS) -> bool:
    return is_int(v) and 0 <= v < hi


_READINGS = (("util", 0, 100), ("mem_mb", 0, 1 << 31), ("power_w", 0, 100_000), ("temp_c", -100, 300),
             ("energy_j", 0, 1e12))


def _gpu_row(r: Any) -> tuple | None:
    """[index, util %, MiB used, watts, deg C, joules since the last sample]; unknown: null."""
    if not isinstance(r, list) or len(r) != 6 or not _index(r[0]):
        return None
    for v, (what, lo, hi) in zip(r[1:], _READINGS):
        if not _opt(v, lo, hi):
            raise MessageError(f"{what} out of range: {v!r:.40}")
    return tuple(r)


def _job_row(r: Any) -> tuple | None:
    """[job, attempt, [gpu indices]]."""
    if isinstance(r, list) and len(r) == 3 and _index(r[0], 1 << 62) and _index(r[1], 1 << 62) \
            and isinstance(r[2], list) and len(r[2]) <= MAX_GPUS and all(_index(i) for i in r[2]):
        return r[0], r[1], tuple(r[2])
    return None


def _slice_row(r: Any) -> tuple | None:
    """[gpu index, MIG slice UUID, MiB used]."""
    if isinstance(r, list) and len(r) == 3 and _index(r[0]) and isinstance(r[1], str) and len(r[1]) <= 128 \
            and _index(r[2], 1 << 31):
        return tuple(r)
    return None


def _proc_row(r: Any) -> tuple | None:
    """[gpu index, pid, MiB used]."""
    if isinstance(r, list) and len(r) == 3 and _index(r[0]) and _index(r[1], 1 << 31) and _index(r[2], 1 << 31):
        return tuple(r)
    return None


def _usage_row(r: Any) -> tuple | None:
    """[job, attempt, step ("" for the whole job), peak bytes, CPU microseconds]."""
    if isinstance(r, list) and len(r) == 5 and _index(r[0], 1 << 62) and _index(r[1], 1 << 62) \
            and isinstance(r[2], str) and len(r[2]) <= 32 and all(v is None or _index(v, 1 << 62) for v in r[3:]):
        return tuple(r)
    return None


@dataclass(frozen=True)
class Samples(Body):
    """``samples``: one reading of every GPU of the node (gpud.worker.telemetry)."""

    KIND: ClassVar[str] = "samples"

    t: float                  # the worker's clock
    iv: float                 # seconds the sample stands for
    gpus: tuple[tuple, ...] = ()          # _gpu_row
    jobs: tuple[tuple[int, int, tuple[int, ...]], ...] | None = ()   # None: a worker that sent none
    slices: tuple[tuple, ...] = ()        # _slice_row
    procs: tuple[tuple, ...] = ()         # _proc_row
    usage: tuple[tuple, ...] = ()         # _usage_row (sent only when there is some)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"t": self.t, "iv": self.iv, "gpus": [list(r) for r in self.gpus]}
        if self.jobs is not None:
            body["jobs"] = [[j, a, list(g)] for j, a, g in self.jobs]
        body.update(slices=[list(r) for r in self.slices], procs=[list(r) for r in self.procs])
        if self.usage:
            body["usage"] = [list(r) for r in self.usage]
        return body

    @classmethod
    def from_body(cls, d: Any) -> "Samples":
        d = obj(d)
        iv = number(d, "iv", 0, MAX_SAMPLE_INTERVAL, above=True)
        gpus = items(d, "gpus", MAX_GPUS, _gpu_row, "[index, util, mem_mb, power_w, temp_c, energy_j]")
        jobs = None if "jobs" not in d else items(d, "jobs", MAX_GPUS, _job_row, "[job, attempt, [gpu indices]]")
        return cls(number(d, "t", -1e12, 1e12, 0.0), iv, gpus, jobs,
                   items(d, "slices", MAX_EXTRAS, _slice_row, "[gpu, uuid, mem_mb]", ()),
                   items(d, "procs", MAX_EXTRAS, _proc_row, "[gpu, pid, mem_mb]", ()),
                   items(d, "usage", MAX_EXTRAS, _usage_row, "[job, attempt, step, max_rss, cpu_usec]", ()))
