"""Head -> worker, about jobs: ``launch`` (and its GPU assignments), ``lease``, ``signal``,
``kill``, ``ack``, ``hello``, ``time_limit`` and ``mig`` (a MIG re-layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...syntax import parse_signal
from ..fields import (MAX_ID, MAX_NAME, MessageError, env, flag, integer, is_int, is_number, number, obj, pair,
                      pairs, seconds, some, text)
from .body import MAX_ALLOCS, MAX_GPUS, MAX_UID, Body, _job, _pairs_body, read_rlimits

MAX_CHANGES = 16                   # slices one mig command may destroy or create
DEVICE_KINDS = ("gpu", "mig", "mps", "timeslice")
DEFAULT_KILL_GRACE = 30.0


def _reason(d: dict, default: str) -> str:
    v = d.get("reason")
    if v is None:
        return default
    if not isinstance(v, str) or len(v) > 200:
        raise MessageError("reason must be a short string")
    return v


# -- head -> worker: jobs --------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuAssignment:
    """One device of a launch: a whole GPU, a MIG slice, an MPS share or a time-slice replica."""

    index: int
    uuid: str   # a GPU or MIG device UUID, as CUDA_VISIBLE_DEVICES takes it
    kind: str = "gpu"                # one of DEVICE_KINDS (gpud.worker.gpumodes)
    slice_start: int | None = None   # mig: the slice's first memory slot
    mem_mb: int | None = None        # mps: the pinned memory limit; mig: the slice's memory
    profile: str | None = None       # mig: the slice's profile

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "kind": self.kind,
                "slice_start": self.slice_start, "mem_mb": self.mem_mb, "profile": self.profile}

    @classmethod
    def from_dict(cls, g: Any) -> "GpuAssignment":
        if not isinstance(g, dict):
            raise MessageError("each of gpus must be an object with index and uuid")
        index, uuid = g.get("index"), g.get("uuid")
        if not is_int(index) or not 0 <= index < MAX_GPUS:
            raise MessageError(f"gpu index must be a non-negative integer, not {index!r:.40}")
        if not isinstance(uuid, str) or not uuid or "," in uuid or "\x00" in uuid or len(uuid) > MAX_NAME:
            raise MessageError(f"gpu uuid must be a non-empty string without commas, not {uuid!r:.40}")
        kind = g.get("kind") or "gpu"
        if kind not in DEVICE_KINDS:
            raise MessageError(f"gpu kind must be one of {', '.join(DEVICE_KINDS)}, not {kind!r:.40}")
        start, mem, profile = g.get("slice_start"), g.get("mem_mb"), g.get("profile")
        if start is not None and (not is_int(start) or not 0 <= start < 16):
            raise MessageError(f"slice_start must be a memory slot 0-15, not {start!r:.40}")
        if kind == "mig" and start is None:
            raise MessageError("a mig device needs its slice_start")
        if mem is not None and (not is_int(mem) or not 0 < mem <= MAX_ID):
            raise MessageError(f"mem_mb must be a positive integer, not {mem!r:.40}")
        if profile is not None and (not isinstance(profile, str) or not 0 < len(profile) <= 32):
            raise MessageError(f"profile must be a short string, not {profile!r:.40}")
        return cls(index, uuid, kind, start, mem, profile)


def _gpus(v: Any) -> tuple[GpuAssignment, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > MAX_GPUS:
        raise MessageError("gpus must be a list")
    out = tuple(GpuAssignment.from_dict(g) for g in v)
    # Slices of one GPU share its index; only whole GPUs and UUIDs must be unique.
    whole = [g.index for g in out if g.kind != "mig"]
    if len(set(whole)) != len(whole):
        raise MessageError("gpus lists an index twice")
    if len({g.uuid for g in out}) != len(out):
        raise MessageError("gpus lists a UUID twice")
    return out


# Array and Slurm-environment facts of a launch; all optional (``head.slurm.launch_fields``).
_LAUNCH_EXTRAS = ("array_job_id", "array_task_id", "array_task_count", "array_task_min", "array_task_max",
                  "array_task_step", "open_mode", "slurm_compat_env", "partition", "account", "qos", "cluster",
                  "restart_count", "warn_signal", "warn_time", "warn_batch")


@dataclass(frozen=True)
class Launch(Body):
    """``launch``: run one allocation (one rank of a gang job) on this node."""

    KIND: ClassVar[str] = "launch"

    job_id: int
    attempt: int
    name: str
    user: str
    uid: int
    gid: int
    script: str
    work_dir: str
    stdout: str | None           # pattern; None: gpud-%j.out in work_dir
    stderr: str | None           # pattern; None: the stdout file
    env: dict[str, str]          # the submitter's exported environment
    gpus: tuple[GpuAssignment, ...]
    cpus: int
    mem_mb: int
    time_limit: float | None     # seconds from start; None: unlimited
    kill_grace: float            # seconds between the stop signal and SIGKILL
    submit_dir: str
    extra_env: dict[str, str] = field(default_factory=dict)  # applied last (MPS, MIG, gang, ...)
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)  # the submitter's (model.parse_rlimits)
    # job arrays: all None for an ordinary job
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_count: int | None = None
    array_task_min: int | None = None
    array_task_max: int | None = None
    array_task_step: int | None = None
    open_mode: str | None = None       # "append" or "truncate" (default) for the output files
    slurm_compat_env: bool = False     # also set Slurm's SLURM_* variables
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    cluster: str | None = None
    restart_count: int = 0
    # --signal: warn_signal goes warn_time seconds before the time limit, to the batch shell
    # alone with warn_batch, else to all the job's processes
    warn_signal: str | None = None
    warn_time: float = 60.0
    warn_batch: bool = False
    # the heartbeat whose lease granted it (gpud.worker.lease); None: the head named none
    lease_seq: int | None = None

    def to_body(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "attempt": self.attempt, "name": self.name, "user": self.user,
            "uid": self.uid, "gid": self.gid, "script": self.script, "work_dir": self.work_dir,
            "stdout": self.stdout, "stderr": self.stderr, "env": dict(self.env),
            "gpus": [g.to_dict() for g in self.gpus],
            "cpus": self.cpus, "mem_mb": self.mem_mb, "time_limit": self.time_limit,
            "kill_grace": self.kill_grace, "submit_dir": self.submit_dir,
            "extra_env": dict(self.extra_env),
            "rlimits": {k: list(v) for k, v in self.rlimits.items()},
            **{k: getattr(self, k) for k in _LAUNCH_EXTRAS},
            "lease": {"seq": self.lease_seq},
        }

    @classmethod
    def from_body(cls, d: Any) -> "Launch":
        if not isinstance(d, dict):
            raise MessageError("launch body must be an object")
        job_key = "job_id" if "job_id" in d else "job"   # the head says job_id, older docs job
        work_dir = text(d, "work_dir")
        if not work_dir.startswith("/"):
            raise MessageError(f"work_dir must be an absolute path, not {work_dir!r:.80}")
        return cls(
            job_id=integer(d, job_key), attempt=integer(d, "attempt"),
            name=text(d, "name", "job"), user=text(d, "user"),
            uid=integer(d, "uid", 0, MAX_UID), gid=integer(d, "gid", 0, MAX_UID),
            script=text(d, "script"), work_dir=work_dir,
            stdout=text(d, "stdout", None), stderr=text(d, "stderr", None),
            env=env(d, "env"), gpus=_gpus(d.get("gpus")),
            cpus=integer(d, "cpus", 1, 1 << 20, default=1), mem_mb=integer(d, "mem_mb", default=0),
            time_limit=seconds(d, "time_limit", None),
            kill_grace=seconds(d, "kill_grace", DEFAULT_KILL_GRACE, zero_ok=True),  # type: ignore[arg-type]
            submit_dir=text(d, "submit_dir", work_dir), extra_env=env(d, "extra_env"),
            rlimits=read_rlimits(d.get("rlimits")), lease_seq=_lease_seq(d.get("lease")),
            **_launch_extras(d),
        )


def _lease_seq(v: Any) -> int | None:
    if v is None:
        return None
    return integer(obj(v, "lease"), "seq", default=None)


def _launch_extras(d: dict) -> dict[str, Any]:
    out: dict[str, Any] = {key: integer(d, key, default=None) for key in _LAUNCH_EXTRAS[:6]}
    mode = d.get("open_mode")
    if mode not in (None, "append", "truncate"):
        raise MessageError(f"open_mode must be append or truncate, not {mode!r:.40}")
    out["open_mode"] = mode
    out["slurm_compat_env"] = flag(d, "slurm_compat_env")
    for key in ("partition", "account", "qos", "cluster"):
        out[key] = text(d, key, None, most=MAX_NAME)
    out["restart_count"] = integer(d, "restart_count", default=0)
    warn = text(d, "warn_signal", None, most=32)
    if warn is not None and parse_signal(warn) is None:
        raise MessageError(f"warn_signal must name a signal, not {warn!r:.40}")
    out["warn_signal"] = warn
    out["warn_time"] = seconds(d, "warn_time", 60.0, zero_ok=True)
    out["warn_batch"] = flag(d, "warn_batch")
    return out


def _limit(item: Any) -> tuple[int, int, float | None] | None:
    """[job, attempt, time limit or null]."""
    if isinstance(item, list) and len(item) == 3 and pair(item[:2]) is not None and (
            item[2] is None or (is_number(item[2]) and 0 < item[2])):
        return item[0], item[1], None if item[2] is None else float(item[2])
    return None


@dataclass(frozen=True)
class Lease(Body):
    """``lease``: the answer to heartbeat ``seq``: the node may run ``allocs`` for ``period``
    seconds from that heartbeat's send time; ``limits`` repeat each one's time limit.

    A malformed item of ``allocs`` or ``limits`` is skipped, not a reason to refuse the
    message: a lease refused is a lease not renewed, and the node would kill its jobs."""

    KIND: ClassVar[str] = "lease"

    seq: int
    period: float
    allocs: tuple[tuple[int, int], ...] = ()
    limits: tuple[tuple[int, int, float | None], ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"seq": self.seq, "period": self.period, "allocs": _pairs_body(self.allocs),
                "limits": [[j, a, t] for j, a, t in self.limits]}

    @classmethod
    def from_body(cls, d: Any) -> "Lease":
        d = obj(d)
        return cls(integer(d, "seq"), float(number(d, "period", 0, 1e7, above=True)),
                   some(d, "allocs", MAX_ALLOCS, pair, "[job, attempt]"),
                   some(d, "limits", MAX_ALLOCS, _limit, "[job, attempt, time limit]"))


@dataclass(frozen=True)
class Signal(Body):
    """``signal``: a signal to the allocation's processes; TERM with ``grace`` stops it."""

    KIND: ClassVar[str] = "signal"

    job: int
    attempt: int
    signal: str | int = "TERM"
    grace: float | None = None        # seconds before SIGKILL; None: the worker's own
    reason: str = "cancelled"

    def to_body(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "signal": self.signal, "grace": self.grace,
                "reason": self.reason}

    @classmethod
    def from_body(cls, d: Any) -> "Signal":
        d = obj(d)
        job, attempt = _job(d)
        sig = d.get("signal", "TERM")
        if not ((is_int(sig) and 0 <= sig < 1 << 16) or (isinstance(sig, str) and 0 < len(sig) <= 32)):
            raise MessageError(f"invalid signal {sig!r:.40}")
        grace = d.get("grace")
        if grace is not None and (not is_number(grace) or grace < 0):
            raise MessageError(f"invalid grace {grace!r:.40}")
        return cls(job, attempt, sig, grace, _reason(d, "cancelled"))


@dataclass(frozen=True)
class Kill(Body):
    """``kill``: SIGKILL these allocations now (fencing, a gang job's other parts)."""

    KIND: ClassVar[str] = "kill"

    allocs: tuple[tuple[int, int], ...]
    reason: str = "killed"

    def to_body(self) -> dict[str, Any]:
        return {"allocs": _pairs_body(self.allocs), "reason": self.reason}

    @classmethod
    def from_body(cls, d: Any) -> "Kill":
        d = obj(d)
        return cls(pairs(d, "allocs", MAX_ALLOCS), _reason(d, "killed"))


@dataclass(frozen=True)
class Ack(Body):
    """``ack``: the head recorded these allocations' ends; stop repeating them."""

    KIND: ClassVar[str] = "ack"

    done: tuple[tuple[int, int], ...]

    def to_body(self) -> dict[str, Any]:
        return {"done": _pairs_body(self.done)}

    @classmethod
    def from_body(cls, d: Any) -> "Ack":
        return cls(pairs(obj(d), "done", MAX_ALLOCS))


@dataclass(frozen=True)
class Hello(Body):
    """``hello``: the head (re)started or does not know this node: register."""

    KIND: ClassVar[str] = "hello"

    def to_body(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_body(cls, d: Any) -> "Hello":
        obj(d)
        return cls()


@dataclass(frozen=True)
class TimeLimit(Body):
    """``time_limit``: an operator's new limit for a running allocation (None: none)."""

    KIND: ClassVar[str] = "time_limit"

    job: int
    attempt: int
    time_limit: float | None

    def to_body(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "time_limit": self.time_limit}

    @classmethod
    def from_body(cls, d: Any) -> "TimeLimit":
        d = obj(d)
        limit = d.get("time_limit")
        if limit is not None and (not is_number(limit) or limit <= 0):
            raise MessageError(f"invalid time_limit {limit!r:.40}")
        return cls(*_job(d), None if limit is None else float(limit))


def _slot(item: Any) -> int | None:
    return item if is_int(item) and 0 <= item < 16 else None


def _new_slice(item: Any) -> tuple[str, int]:
    if not isinstance(item, dict):
        raise MessageError(f"a MIG slice must be an object, not {item!r:.40}")
    profile, start = item.get("profile"), item.get("start")
    if not isinstance(profile, str) or not 0 < len(profile) <= 32:
        raise MessageError(f"MIG slice without a profile name: {item!r:.60}")
    if not is_int(start) or not 0 <= start < 16:
        raise MessageError(f"MIG slice {profile}: start slot must be an integer from 0 to 15, not {start!r:.40}")
    return profile, start


@dataclass(frozen=True)
class MigRelayout(Body):
    """``mig``: re-lay a dynamic MIG GPU: destroy the slices at ``destroy``, create
    ``create`` ((profile, start slot)); a ``register`` with the result follows."""

    KIND: ClassVar[str] = "mig"

    gpu: int
    destroy: tuple[int, ...] = ()
    create: tuple[tuple[str, int], ...] = ()
    reason: str | None = None
    min_interval: float | None = None   # the head's; None: the worker's own (an older head)

    def to_body(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "destroy": list(self.destroy),
                "create": [{"profile": p, "start": s} for p, s in self.create],
                "reason": self.reason, "min_interval": self.min_interval}

    @classmethod
    def from_body(cls, d: Any) -> "MigRelayout":
        d = obj(d)
        gpu = d.get("gpu")
        if not is_int(gpu) or not 0 <= gpu < MAX_GPUS:
            raise MessageError(f"no GPU {gpu!r:.40} here")
        for key in ("destroy", "create"):
            if not isinstance(d.get(key, []), list) or len(d.get(key, [])) > MAX_CHANGES:
                raise MessageError("destroy and create must be short lists")
        destroy = tuple(d.get("destroy") or [])
        for s in destroy:
            if _slot(s) is None:
                raise MessageError(f"destroy: {s!r:.40} is not a memory slot")
        create = tuple(_new_slice(c) for c in d.get("create") or [])
        reason = d.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
            raise MessageError("reason must be a short string")
        interval = number(d, "min_interval", 0, 1e9, None)
        return cls(gpu, tuple(dict.fromkeys(destroy)), create, reason,
                   None if interval is None else float(interval))
