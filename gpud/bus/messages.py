"""The wire contract: one frozen dataclass per message kind, and the one place they are
encoded and decoded.

Theory of operation
-------------------
Every body on the bus is a JSON object.  ``encode(msg)`` gives the ``(kind, body)`` a bus
seals: the message's ``to_body()`` plus ``"v": VERSION``.  ``decode(kind, body)`` is the
only door back: it finds the class in ``KINDS``, checks the version and hands the body
to that class's ``from_body``, which checks every field.  Anything wrong (an unknown
kind, a field of the wrong type or range, a list past its bound, NaN, a negative id, a
newer major version) raises ``MessageError`` with one line; receivers log that line and
drop the message, never crash.  Two kinds bend this on purpose, because refusing them
would cost more than the bad field: a ``lease`` skips a malformed item (a lease refused is
a lease not renewed: the node would kill its jobs), and a ``finished`` takes exit codes
and texts of any size for the head to clamp (refused, it would be repeated for ever and
its job never end).

Versions.  ``v`` is the major version of the contract.  A body without one is from a peer
of before versions (a running older daemon during an upgrade) and reads as version 1.  A
newer major version is refused: its meaning may have changed.  Within a version, new
optional keys may appear, so keys a class does not know are ignored, and every key added
later has a default.  Body keys are those gpud always used, so older peers read what
newer ones send.

Senders build messages as these classes and hand them to ``Bus.publish``; no daemon
assembles a body by hand (``tests/test_import_rules.py`` checks).  Which kinds go on which
topic is the table in ``gpud.bus.base``.  What a receiver does with a well-formed message
(is this the right node, attempt, step?) is its own business: this module checks shapes
and bounds, nothing that needs state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..model import NodeInfo, SpecError, parse_rlimits
from ..protocol import MAX_LINE
from ..syntax import parse_signal
from .fields import (MAX_ID, MAX_NAME, MessageError, any_int, any_text, choice, env, flag, integer, is_int,
                     is_number, items, number, obj, pair, pairs, seconds, some, text)

VERSION = 1
MAX_UID = 2**32 - 2                # uid/gid: (uid_t)-1 means "no id"
MAX_ALLOCS = 100_000               # [job, attempt] pairs in one message
MAX_GPUS = 4096                    # GPUs of one node (or one sample); far beyond any real node
MAX_EXTRAS = 16384                 # MIG slices, processes, accounting rows in one sample
MAX_SAMPLE_INTERVAL = 3600.0       # a sample never stands for more than this many seconds
MAX_CHANGES = 16                   # slices one mig command may destroy or create
MAX_TASKS_PER_NODE = 256           # srun tasks one node starts for one step
MAX_INPUT_CHUNK = 64 << 10         # characters of one step_input
MAX_LINES = 1 << 17                # items in one step_output (the envelope's 1 MiB bounds it anyway)
MAX_WRITERS = 1024                 # input writers one step_output reports
MAX_STATUS = 255                   # a task's exit code as a shell sees it
MAX_SIGNAL = 127
STREAMS = (1, 2, 3)                # stdout, stderr, a terminal's bytes (latin-1)
DEVICE_KINDS = ("gpu", "mig", "mps", "timeslice")
STATES = ("online", "offline")
DEFAULT_KILL_GRACE = 30.0
CHUNK_CHARS = 128 * 1024           # relayed line parts: even escaped 6x (\uXXXX), under the 1 MiB envelope
MAX_PARTS = MAX_LINE // CHUNK_CHARS + 2
MAX_REQUEST_ID = 64
MAX_USER = 64


class Body:
    """A message: ``KIND``, its body (``to_body``) and the checked way back (``from_body``)."""

    KIND: ClassVar[str] = ""

    def to_body(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_body(cls, d: Any) -> "Body":
        raise NotImplementedError


# -- ids shared by many kinds ---------------------------------------------------------------------

def _job(d: dict) -> tuple[int, int]:
    return integer(d, "job"), integer(d, "attempt")


def _reason(d: dict, default: str) -> str:
    v = d.get("reason")
    if v is None:
        return default
    if not isinstance(v, str) or len(v) > 200:
        raise MessageError("reason must be a short string")
    return v


def _pairs_body(pairs_: tuple[tuple[int, int], ...]) -> list[list[int]]:
    return [[j, a] for j, a in pairs_]


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


def _rlimits(v: Any) -> dict[str, tuple[int, int]]:
    try:
        return parse_rlimits(v)
    except SpecError as e:
        raise MessageError(str(e)) from None


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
            rlimits=_rlimits(d.get("rlimits")), lease_seq=_lease_seq(d.get("lease")),
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


# -- head -> worker: steps (gpuctl srun) ------------------------------------------------------------

@dataclass(frozen=True)
class StepRef(Body):
    """What every step message names: the allocation and the step."""

    job: int
    attempt: int
    step: int

    def ref(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "step": self.step}

    @classmethod
    def read_ref(cls, d: Any) -> tuple[int, int, int]:
        d = obj(d)
        return integer(d, "job"), integer(d, "attempt"), integer(d, "step")


@dataclass(frozen=True, kw_only=True)
class StepStart(StepRef):
    """``step``: start ``ntasks_per_node`` tasks of a step here, at node rank ``node_rank``."""

    KIND: ClassVar[str] = "step"

    argv: tuple[str, ...]
    env: dict[str, str]         # srun's environment (the job's wins over it)
    ntasks_per_node: int
    node_rank: int
    nnodes: int
    nodelist: str
    master_addr: str
    master_port: int
    pty: bool = False           # one task on a terminal
    stdin: bool = False         # task 0 takes input (step_input)
    rows: int = 24
    cols: int = 80
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)   # srun's own (model.parse_rlimits)

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "argv": list(self.argv), "env": dict(self.env),
                "ntasks_per_node": self.ntasks_per_node, "node_rank": self.node_rank, "nnodes": self.nnodes,
                "nodelist": self.nodelist, "master_addr": self.master_addr, "master_port": self.master_port,
                "pty": self.pty, "stdin": self.stdin, "rows": self.rows, "cols": self.cols}
        if self.rlimits:   # absent: none (what older heads send)
            body["rlimits"] = {k: list(v) for k, v in self.rlimits.items()}
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepStart":
        ref = cls.read_ref(d)
        per_node, rank = integer(d, "ntasks_per_node", 1, MAX_TASKS_PER_NODE), integer(d, "node_rank", 0, 1 << 20)
        nnodes = integer(d, "nnodes", 1, 1 << 20)
        if rank >= nnodes:
            raise MessageError("node_rank must be below nnodes")
        argv = d.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv) \
                or not argv[0]:
            raise MessageError("argv must be a non-empty list of strings")
        pty = flag(d, "pty")
        if pty and per_node * nnodes != 1:
            raise MessageError("a step on a terminal has one task")
        return cls(*ref, argv=tuple(argv), env=env(d, "env"), ntasks_per_node=per_node, node_rank=rank,
                   nnodes=nnodes, nodelist=text(d, "nodelist", most=65536),
                   master_addr=text(d, "master_addr", most=65536), master_port=integer(d, "master_port", 0, 65535),
                   pty=pty, stdin=flag(d, "stdin"), rows=integer(d, "rows", 1, 65535, 24),
                   cols=integer(d, "cols", 1, 65535, 80), rlimits=_rlimits(d.get("rlimits")))


@dataclass(frozen=True)
class StepKill(StepRef):
    """``step_kill``: kill the step's tasks here (a task failed somewhere, or srun was interrupted)."""

    KIND: ClassVar[str] = "step_kill"

    def to_body(self) -> dict[str, Any]:
        return self.ref()

    @classmethod
    def from_body(cls, d: Any) -> "StepKill":
        return cls(*cls.read_ref(d))


@dataclass(frozen=True)
class StepAck(StepRef):
    """``step_ack``: the readers have every output item before ``next``; with ``resend``,
    send what is kept from there again."""

    KIND: ClassVar[str] = "step_ack"

    next: int = 0
    resend: bool = False

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "next": self.next, "resend": self.resend}

    @classmethod
    def from_body(cls, d: Any) -> "StepAck":
        return cls(*cls.read_ref(d), integer(d, "next"), flag(d, "resend"))


def _latin1(data: str) -> bool:
    return all(ord(c) <= 255 for c in data)


@dataclass(frozen=True)
class StepInput(StepRef):
    """``step_input``: chunk ``seq`` of ``writer``'s input for task 0 (bytes as latin-1 text)."""

    KIND: ClassVar[str] = "step_input"

    writer: str = ""
    seq: int = 0
    data: str = ""
    eof: bool = False

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "writer": self.writer, "seq": self.seq, "data": self.data, "eof": self.eof}

    @classmethod
    def from_body(cls, d: Any) -> "StepInput":
        ref = cls.read_ref(d)
        writer = text(d, "writer", most=64)
        data = any_text(d, "data", "")
        if len(data) > MAX_INPUT_CHUNK or not _latin1(data):
            raise MessageError(f"data must be bytes as latin-1 text, at most {MAX_INPUT_CHUNK} characters")
        return cls(*ref, writer, integer(d, "seq"), data, flag(d, "eof"))


@dataclass(frozen=True)
class StepResize(StepRef):
    """``step_resize``: a terminal step's new window size."""

    KIND: ClassVar[str] = "step_resize"

    rows: int = 24
    cols: int = 80

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "rows": self.rows, "cols": self.cols}

    @classmethod
    def from_body(cls, d: Any) -> "StepResize":
        return cls(*cls.read_ref(d), integer(d, "rows", 1, 65535), integer(d, "cols", 1, 65535))


# -- worker -> head: step output ----------------------------------------------------------------------

def _line(item: Any) -> tuple[int, int, str] | None:
    """[rank, stream, text]."""
    if isinstance(item, list) and len(item) == 3 and is_int(item[0]) and 0 <= item[0] <= MAX_ID \
            and is_int(item[1]) and item[1] in STREAMS and isinstance(item[2], str):
        return item[0], item[1], item[2]
    return None


def _step_extras(d: dict) -> tuple[int | None, bool]:
    """``tasks`` and ``pty``, which a worker adds so a restarted head can adopt the step."""
    return integer(d, "tasks", 1, MAX_TASKS_PER_NODE, None), flag(d, "pty")


@dataclass(frozen=True)
class StepOutput(StepRef):
    """``step_output``: items ``first``, ``first + 1``... of the node's output of a step,
    and how much of each writer's input task 0 has had."""

    KIND: ClassVar[str] = "step_output"

    first: int | None = None     # None: a worker from before the numbering
    lines: tuple[tuple[int, int, str], ...] = ()   # (rank, stream, text)
    seq: int = 0
    input: dict[str, int] = field(default_factory=dict)
    tasks: int | None = None     # the node's tasks (for a head adopting the step)
    pty: bool = False

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "seq": self.seq, "first": self.first, "lines": [list(x) for x in self.lines],
                "input": dict(self.input), "pty": self.pty}
        if self.tasks is not None:
            body["tasks"] = self.tasks
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepOutput":
        ref = cls.read_ref(d)
        got = d.get("input") or {}
        if not isinstance(got, dict) or len(got) > MAX_WRITERS or not all(
                isinstance(w, str) and 0 < len(w) <= 64 and is_int(n) and 0 <= n <= MAX_ID for w, n in got.items()):
            raise MessageError("input must map writers to counts")
        return cls(*ref, first=integer(d, "first", default=None),
                   lines=items(d, "lines", MAX_LINES, _line, "[rank, stream, text]"),
                   seq=integer(d, "seq", default=0), input=dict(got), tasks=_step_extras(d)[0], pty=flag(d, "pty"))


@dataclass(frozen=True)
class StepExit(StepRef):
    """``step_exit``: a task of the step ended here (``rank`` None: every task of the node,
    as when the node refused the step); ``next``: the output items sent before it."""

    KIND: ClassVar[str] = "step_exit"

    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None
    next: int | None = None
    tasks: int | None = None
    pty: bool = False

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "rank": self.rank, "exit_code": self.exit_code, "signal": self.signal,
                "message": self.message, "next": self.next, "pty": self.pty}
        if self.tasks is not None:
            body["tasks"] = self.tasks
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepExit":
        ref = cls.read_ref(d)
        tasks, pty = _step_extras(d)
        return cls(*ref, rank=integer(d, "rank", default=None),
                   exit_code=integer(d, "exit_code", 0, MAX_STATUS, None),
                   signal=integer(d, "signal", 0, MAX_SIGNAL, None), message=any_text(d, "message"),
                   next=integer(d, "next", default=None), tasks=tasks, pty=pty)


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


# -- statuses (retained, and the last wills) --------------------------------------------------------

@dataclass(frozen=True)
class HeadStatus(Body):
    """``head_status``: the head is online or offline; ``refresh``: its periodic
    re-publication, which outranks any older status."""

    KIND: ClassVar[str] = "head_status"

    state: str
    version: str | None = None
    refresh: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"state": self.state}
        if self.version is not None:
            body["version"] = self.version
        if self.refresh:
            body["refresh"] = True
        return body

    @classmethod
    def from_body(cls, d: Any) -> "HeadStatus":
        d = obj(d)
        state = d.get("state")
        if state not in STATES:
            raise MessageError(f"unknown head state {state!r:.40}")
        return cls(state, text(d, "version", None, most=64), flag(d, "refresh"))


@dataclass(frozen=True)
class NodeStatus(Body):
    """``node_status``: the worker is online or offline."""

    KIND: ClassVar[str] = "node_status"

    state: str

    def to_body(self) -> dict[str, Any]:
        return {"state": self.state}

    @classmethod
    def from_body(cls, d: Any) -> "NodeStatus":
        return cls(choice(obj(d), "state", STATES))


# -- relayed gpuctl requests (gpud.relay) -----------------------------------------------------------

def valid_name(name: Any) -> bool:
    """A relay's (or user's) name: short, printable, no spaces, nothing MQTT gives meaning."""
    return isinstance(name, str) and 0 < len(name) <= 64 and not any(c in name for c in "/+#\0") \
        and name.isprintable() and not any(c.isspace() for c in name)


@dataclass(frozen=True)
class RelayPart(Body):
    """One part of a line: ``data`` is its ``part``-th slice of ``parts``."""

    id: str
    part: int
    parts: int
    data: str

    def part_body(self) -> dict[str, Any]:
        return {"id": self.id, "part": self.part, "parts": self.parts, "data": self.data}

    @classmethod
    def read_part(cls, d: Any) -> tuple[str, int, int, str]:
        d = obj(d)
        rid = d.get("id")
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_REQUEST_ID or not rid.isprintable():
            raise MessageError("missing or invalid id")
        part, parts, data = d.get("part"), d.get("parts"), d.get("data")
        if not is_int(parts) or not 1 <= parts <= MAX_PARTS:
            raise MessageError(f"parts must be an integer from 1 to {MAX_PARTS}")
        if not is_int(part) or not 0 <= part < parts:
            raise MessageError("part must be an integer below parts")
        if not isinstance(data, str) or len(data) > CHUNK_CHARS:
            raise MessageError(f"data must be a string of at most {CHUNK_CHARS} characters")
        return rid, part, parts, data

    @classmethod
    def id_of(cls, d: Any) -> str | None:
        """The id of a body whose part is well formed, else None: a request refused for
        the rest can still be answered."""
        try:
            return cls.read_part(d)[0]
        except MessageError:
            return None


@dataclass(frozen=True)
class Reply(RelayPart):
    """``reply``: a part of the head's response line to relayed request ``id``."""

    KIND: ClassVar[str] = "reply"

    def to_body(self) -> dict[str, Any]:
        return self.part_body()

    @classmethod
    def from_body(cls, d: Any) -> "Reply":
        return cls(*cls.read_part(d))


@dataclass(frozen=True, kw_only=True)
class Request(RelayPart):
    """``request``: a part of a gpuctl request line, with who asked as the relay's kernel
    saw them (SO_PEERCRED) and when the relay stops waiting (its clock)."""

    KIND: ClassVar[str] = "request"

    uid: int
    gid: int
    pid: int
    user: str              # the relay host's name for uid ("" when none): logs only
    deadline: float

    def to_body(self) -> dict[str, Any]:
        return {**self.part_body(), "uid": self.uid, "gid": self.gid, "pid": self.pid, "user": self.user,
                "deadline": self.deadline}

    @classmethod
    def from_body(cls, d: Any) -> "Request":
        part = cls.read_part(d)
        uid, gid, pid = d.get("uid"), d.get("gid"), d.get("pid")
        for what, v in (("uid", uid), ("gid", gid)):
            if not is_int(v) or not 0 <= v <= MAX_UID:
                raise MessageError(f"{what} must be an integer from 0 to {MAX_UID}")
        if not is_int(pid) or not 0 <= pid <= MAX_ID:
            raise MessageError("pid must be a non-negative integer")
        user = d.get("user", "")
        if not isinstance(user, str) or len(user) > MAX_USER or (user and not valid_name(user)):
            raise MessageError("user must be a short name without spaces")
        deadline = d.get("deadline")
        if not is_number(deadline):
            raise MessageError("deadline must be a finite number")
        return cls(*part, uid=uid, gid=gid, pid=pid, user=user, deadline=float(deadline))


# -- the one table, the one door ---------------------------------------------------------------------

KINDS: dict[str, type[Body]] = {cls.KIND: cls for cls in (
    Launch, Lease, Signal, Kill, Ack, Hello, MigRelayout, TimeLimit,
    StepStart, StepKill, StepAck, StepInput, StepResize, StepOutput, StepExit,
    Register, Heartbeat, Started, Finished, Samples, HeadStatus, NodeStatus, Request, Reply,
)}


def encode(msg: Body) -> tuple[str, dict[str, Any]]:
    """The (kind, body) a bus seals for ``msg``."""
    if type(msg) not in KINDS.values():
        raise TypeError(f"not a message: {type(msg).__name__}")
    return msg.KIND, {"v": VERSION, **msg.to_body()}


def decode(kind: Any, body: Any) -> Body:
    """The message a (kind, body) from the bus is; MessageError when it is none."""
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message kind {kind!r:.40}")
    if not isinstance(body, dict):
        raise MessageError("body must be an object")
    version = body.get("v", 1)
    if not is_int(version) or version < 1:
        raise MessageError(f"v must be a positive integer, not {version!r:.20}")
    if version > VERSION:
        raise MessageError(f"from a newer gpud (message version {version}; this one reads {VERSION})")
    try:
        return cls.from_body(body)
    except MessageError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as e:
        # a shape no check above foresaw: still one line, never a crash
        raise MessageError(f"malformed {kind}: {type(e).__name__}: {e}"[:300]) from None
