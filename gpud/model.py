"""The nouns of gpud: jobs and their legal moves, job specs, nodes and GPUs.

Theory of operation
-------------------
A job's life is a walk through ``JobState`` along the edges in ``JOB_TRANSITIONS``; the
head's store is the only writer and calls ``check_job_transition`` before every move, so
an illegal move (say, COMPLETED -> RUNNING after a late duplicate message) raises instead
of corrupting history.  A requeue is the edge RUNNING/COMPLETING -> PENDING: the job keeps
its id and submit time and its next allocation gets a higher attempt number, which is what
workers fence on.  ``scontrol requeue`` of a finished job, as in Slurm, is the one way out of
a final state: back to PENDING.

A ``JobSpec`` is what a user asked for.  The head builds it from a socket request with
``JobSpec.from_request``, which refuses anything malformed with a one-line message; the
identity (uid, gid, user) never comes from the request but from the kernel.  ``gpus`` is
always the job's total (billing, quotas); a job on ``nodes`` nodes gets ``gpus // nodes``
GPUs on each, and ``cpus`` and ``mem_mb`` on each.  Where it may run is narrowed by
``nodelist``, ``exclude``, ``constraint`` (node features, ``parse_constraint``),
``exclusive`` and ``switches``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from operator import attrgetter
from typing import Any

from . import syntax
from .gpu import mig
from .hostlist import NODE_NAME
from .protocol import RLIMIT_NAMES
from .units import UnitError, parse_duration, parse_size_mb


class JobState(str, enum.Enum):
    PENDING = "PENDING"        # waiting for resources, priority, a hold or a dependency
    RUNNING = "RUNNING"        # allocated to a node; the worker has been told to run it
    COMPLETING = "COMPLETING"  # signalled to stop (cancel, preemption); waiting for the worker
    COMPLETED = "COMPLETED"    # exited 0
    FAILED = "FAILED"          # exited non-zero, or could not be started
    CANCELLED = "CANCELLED"    # cancelled by its owner or an admin
    TIMEOUT = "TIMEOUT"        # killed at its time limit
    NODE_FAIL = "NODE_FAIL"    # its node went down and it was not requeued
    PREEMPTED = "PREEMPTED"    # preempted with preempt_mode = "cancel"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # killed by the memory limit

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        return self in ACTIVE_STATES


TERMINAL_STATES = frozenset({
    JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
    JobState.NODE_FAIL, JobState.PREEMPTED, JobState.OUT_OF_MEMORY,
})
ACTIVE_STATES = frozenset({JobState.RUNNING, JobState.COMPLETING})
PENDING_STATES = frozenset({JobState.PENDING})

_ENDINGS = TERMINAL_STATES | {JobState.PENDING}
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.COMPLETING}) | _ENDINGS,
    JobState.COMPLETING: _ENDINGS,
    **{s: frozenset({JobState.PENDING}) for s in TERMINAL_STATES},   # scontrol requeue
}


class IllegalTransition(RuntimeError):
    pass


def check_job_transition(job_id: int, old: JobState, new: JobState) -> None:
    if new not in JOB_TRANSITIONS[old]:
        raise IllegalTransition(f"job {job_id}: illegal transition {old.value} -> {new.value}")


class NodeState(str, enum.Enum):
    """A node's state as the head stores it (squeue's IDLE/MIXED/ALLOCATED are derived from
    UP and what runs there)."""

    UP = "UP"                # heard from within node_timeout; takes jobs
    DRAIN = "DRAIN"          # up, takes no new jobs (admin)
    DOWN = "DOWN"            # not heard from within node_timeout; takes no jobs
    UNKNOWN = "UNKNOWN"      # in the database, not heard from since the head started


# None: a node the head has never seen (its first registration).  A move to the same state
# (a new drain reason, fresh resources) is always allowed and logged only when the reason changes.
NODE_TRANSITIONS: dict[NodeState | None, frozenset[NodeState]] = {
    None: frozenset({NodeState.UP}),
    NodeState.UP: frozenset({NodeState.DRAIN, NodeState.DOWN}),
    NodeState.DRAIN: frozenset({NodeState.UP, NodeState.DOWN}),
    NodeState.DOWN: frozenset({NodeState.UP, NodeState.DRAIN}),
    NodeState.UNKNOWN: frozenset({NodeState.UP, NodeState.DOWN, NodeState.DRAIN}),
}


def check_node_transition(node: str, old: NodeState | None, new: NodeState) -> None:
    if new != old and new not in NODE_TRANSITIONS[old]:
        raise IllegalTransition(f"node {node}: illegal transition {old.value if old else 'new'} -> {new.value}")


class StopReason(str, enum.Enum):
    """Why the head asked a running job to stop (``JobRecord.stop_reason``): the value is
    stored as is, and the part before ``:`` is the kind of stop, the part after what follows."""

    CANCELLED = "cancelled"                  # scancel
    REQUEUE = "requeue"                      # scontrol requeue
    TIMEOUT = "timeout"                      # time limit lowered below what it has run
    PREEMPTED_REQUEUE = "preempted:requeue"  # preempted; back to the queue
    PREEMPTED_CANCEL = "preempted:cancel"    # preempted; ends PREEMPTED
    IDLE_REQUEUE = "idle:requeue"            # its GPUs idle ([partition] idle_action)
    IDLE_CANCEL = "idle:cancel"
    RELEASED = "released"                    # an interactive allocation given back (salloc's end)

    @property
    def kind(self) -> str:
        """"cancelled", "requeue", "timeout", "preempted", "idle" or "released"."""
        return self.value.split(":")[0]

    @property
    def then(self) -> str | None:
        """What follows the stop, for preemptions and idle GPUs: "requeue" or "cancel"."""
        return self.value.split(":")[1] if ":" in self.value else None

    @classmethod
    def of(cls, text: str | None) -> "StopReason | None":
        """The stored text as a StopReason; None for none (or one this version does not know)."""
        try:
            return None if text is None else cls(text)
        except ValueError:
            return None

    @classmethod
    def preempted(cls, mode: str) -> "StopReason":
        return cls(f"preempted:{mode}")

    @classmethod
    def idle(cls, action: str) -> "StopReason":
        return cls(f"idle:{action}")


class SpecError(ValueError):
    """A job request that can never be valid; the message is shown to the user."""


# The resource limits a job inherits from its submitter (Slurm's PropagateResourceLimits=ALL):
# gpuctl sends its own, the job's wrapper applies them, never above the worker's own.
RLIM_UNLIMITED = -1


def parse_rlimits(value: Any) -> dict[str, tuple[int, int]]:
    """{"NOFILE": [soft, hard], ...} (-1: unlimited) -> the same, checked; SpecError otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > len(RLIMIT_NAMES):
        raise SpecError("rlimits must map resource names (NOFILE, NPROC, ...) to [soft, hard]")
    out = {}
    for name, pair in value.items():
        if name not in RLIMIT_NAMES or not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) and RLIM_UNLIMITED <= x < 2**63 for x in pair):
            raise SpecError(f"invalid resource limit {name!r}: give [soft, hard], -1 for unlimited"[:200])
        out[name] = (pair[0], pair[1])
    return out


_NAME = re.compile(r"^[^\x00-\x1f/]{1,200}$")
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
MAX_ENV_BYTES = 1024 * 1024


@dataclass(frozen=True)
class JobSpec:
    """What a user asked for: ``gpus`` in total; ``cpus`` and ``mem_mb`` on each of ``nodes``."""

    script: str
    name: str = "job"
    work_dir: str = "/"
    stdout: str | None = None      # pattern, default "gpud-%j.out" in work_dir
    stderr: str | None = None      # pattern, default: same file as stdout
    env: dict[str, str] = field(default_factory=dict)
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)   # the submitter's (parse_rlimits)
    gpus: int = 0
    gpu_type: str | None = None
    mig_profile: str | None = None  # MIG slices of this profile, e.g. "1g.10gb"; gpus = how many
    gpu_mem_mb: int | None = None   # one device (slice, MPS share or GPU) with this much memory
    cpus: int = 1
    mem_mb: int | None = None      # None: the partition's default
    time_limit: float | None = None  # seconds; None: the partition's default
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nice: int = 0
    requeue: bool = True
    signal: str | None = None      # --signal: sent signal_time s before the time limit, and at preemption
    signal_time: int | None = None  # --signal's @TIME (None: Slurm's 60 s)
    signal_batch: bool = False      # --signal=B:...: to the batch shell only, not all the job's processes
    hold: bool = False
    comment: str | None = None
    # Slurm compatibility (see gpud.syntax for the notations)
    array: str | None = None        # task indices and %limit, e.g. "0-99%10"
    dependency: str | None = None   # e.g. "afterok:12:13,singleton"
    begin_time: float | None = None  # epoch seconds: not eligible before
    deadline: float | None = None   # epoch seconds: cancelled if it cannot end by then
    open_mode: str | None = None    # "append" or "truncate" (default) for output files
    mail_type: str | None = None    # e.g. "END,FAIL"
    mail_user: str | None = None
    kill_on_invalid_dep: bool = False  # cancel, rather than keep, a never-satisfiable job
    skip_if_active: bool = False    # do not submit when a job of this name is pending/running
    test_only: bool = False         # only estimate the start; submit nothing
    interactive: bool = False       # salloc / srun outside a job: held by a client's keepalive
    # Big jobs: several nodes, and where they may be
    nodes: int = 1                  # -N: nodes, all started at once; each gets gpus // nodes
    ntasks_per_node: int = 1        # processes `gpuctl srun` starts on each node
    nodelist: tuple[str, ...] = ()  # -w: these nodes must all be in the allocation
    exclude: tuple[str, ...] = ()   # -x: never these nodes
    constraint: str | None = None   # -C: node features, "a&b" (all) or "a|b" (any)
    exclusive: bool = False         # --exclusive: no other job on its nodes
    switches: int | None = None     # --switches=N@TIME: at most N leaf switches ...
    switches_wait: float | None = None  # ... waiting at most this many seconds for that

    def __post_init__(self) -> None:
        # A spec read back from JSON carries lists; keep the frozen spec hashable and comparable.
        for key in ("nodelist", "exclude"):
            if not isinstance(getattr(self, key), tuple):
                object.__setattr__(self, key, tuple(getattr(self, key)))

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return _SPEC_FIELD_SET if cls is JobSpec else frozenset(f.name for f in fields(cls))

    @classmethod
    def from_request(cls, d: Any) -> "JobSpec":
        """Validate a socket request's ``spec`` object; raise SpecError with one line."""
        if not isinstance(d, dict):
            raise SpecError("job spec must be an object")
        unknown = set(d) - cls.field_names()
        if unknown:
            raise SpecError(f"unknown job option(s): {', '.join(sorted(unknown))}")
        script = d.get("script")
        if not isinstance(script, str) or not script.strip():
            raise SpecError("empty batch script")
        if len(script.encode("utf-8", "surrogateescape")) > MAX_SCRIPT_BYTES:
            raise SpecError(f"batch script larger than {MAX_SCRIPT_BYTES // 1048576} MiB")
        if "\x00" in script:
            raise SpecError("batch script contains NUL bytes")
        kw: dict[str, Any] = {"script": script}
        kw["name"] = _opt_str(d, "name", "job")
        if not _NAME.match(kw["name"]):
            raise SpecError(f"invalid job name {kw['name']!r}")
        wd = _opt_str(d, "work_dir", "/")
        if not wd.startswith("/"):
            raise SpecError(f"working directory must be absolute: {wd!r}")
        kw["work_dir"] = wd
        for key in ("stdout", "stderr", "gpu_type", "partition", "account", "qos", "signal", "comment"):
            v = d.get(key)
            if v is not None and (not isinstance(v, str) or "\x00" in v or not v):
                raise SpecError(f"invalid {key}: {v!r}")
            kw[key] = v
        env = d.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
            for k, v in env.items()
        ):
            raise SpecError("env must map variable names to strings")
        if sum(len(k) + len(v) for k, v in env.items()) > MAX_ENV_BYTES:
            raise SpecError("environment larger than 1 MiB")
        kw["env"] = dict(env)
        kw["rlimits"] = parse_rlimits(d.get("rlimits"))
        kw["gpus"] = _opt_int(d, "gpus", 0, lo=0, hi=4096)
        kw["cpus"] = _opt_int(d, "cpus", 1, lo=1, hi=100000)
        kw["nice"] = _opt_int(d, "nice", 0, lo=-10000, hi=10000)
        mem = d.get("mem_mb")
        if mem is not None:
            try:
                mem = parse_size_mb(mem)
            except UnitError as e:
                raise SpecError(str(e)) from None
            if mem < 0:   # 0: all the memory of each node (Slurm's --mem=0)
                raise SpecError("--mem must be positive, or 0 for all of each node's memory")
        kw["mem_mb"] = mem
        tl = d.get("time_limit")
        if tl is not None:
            try:
                tl = parse_duration(tl, default_unit="s")
            except UnitError as e:
                raise SpecError(str(e)) from None
            if tl is not None and tl <= 0:
                raise SpecError("time limit must be positive")
        kw["time_limit"] = tl
        st = d.get("signal_time")
        if st is not None and (isinstance(st, bool) or not isinstance(st, int) or not 0 <= st <= 65535):
            raise SpecError("--signal's time must be a whole number of seconds from 0 to 65535")
        kw["signal_time"] = st
        kw.update(_gpu_share(d, kw["gpus"]))
        for key, default in (("requeue", True), ("hold", False), ("kill_on_invalid_dep", False),
                             ("skip_if_active", False), ("test_only", False), ("exclusive", False),
                             ("signal_batch", False), ("interactive", False)):
            v = d.get(key, default)
            if not isinstance(v, bool):
                raise SpecError(f"{key} must be true or false")
            kw[key] = v
        kw.update(_slurm_fields(d))
        kw.update(_layout_fields(d, kw))
        if cls is not JobSpec:
            return cls(**kw)
        # Every value is checked and of its final type (nodelist and exclude are tuples), so
        # the frozen __init__'s forty guarded setattrs and __post_init__ have nothing to add.
        spec = object.__new__(JobSpec)
        spec.__dict__.update(_SPEC_DEFAULTS)
        spec.__dict__.update(kw)
        return spec

    def to_dict(self) -> dict[str, Any]:
        # A shallow walk (asdict deep-copies every value and was a quarter of a submission's
        # CPU): the other values are immutable, so only the environment and lists are copied.
        d = dict(zip(_SPEC_FIELDS, _spec_values(self)))
        d["env"] = dict(self.env)
        d["rlimits"] = {k: list(v) for k, v in self.rlimits.items()}
        d["nodelist"], d["exclude"] = list(self.nodelist), list(self.exclude)
        return d


_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))
_SPEC_FIELD_SET = frozenset(_SPEC_FIELDS)
_spec_values = attrgetter(*_SPEC_FIELDS)
# In field order; script, env and rlimits, which have no plain default, are always in from_request's kw.
_SPEC_DEFAULTS = {f.name: None if f.default is MISSING else f.default for f in fields(JobSpec)}

MAIL_TYPES = frozenset({"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND",
                        "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"})


def _slurm_fields(d: dict) -> dict[str, Any]:
    """Validate the Slurm-compatibility fields (arrays, dependencies, times, mail)."""
    kw: dict[str, Any] = {}
    try:
        array = d.get("array")
        if array is not None:
            kw["array"] = syntax.parse_array(array).format()
        dep = d.get("dependency")
        if dep is not None:
            parsed = syntax.parse_dependency(dep)
            kw["dependency"] = parsed.format() if parsed else None
    except syntax.SyntaxProblem as e:
        raise SpecError(str(e)) from None
    for key in ("begin_time", "deadline"):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e11):
            raise SpecError(f"{key} must be a time in epoch seconds, not {v!r}")
        kw[key] = None if v is None else float(v)
    mode = d.get("open_mode")
    if mode is not None and mode not in ("append", "truncate"):
        raise SpecError(f"open_mode must be append or truncate, not {mode!r}")
    kw["open_mode"] = mode
    mail = d.get("mail_type")
    if mail is not None:
        words = [w.strip().upper() for w in str(mail).split(",") if w.strip()] if isinstance(mail, str) else None
        if not words or any(w not in MAIL_TYPES for w in words):
            raise SpecError(f"invalid mail_type {mail!r}: use {', '.join(sorted(MAIL_TYPES))}")
        kw["mail_type"] = ",".join(words)
    user = d.get("mail_user")
    if user is not None:
        try:
            user = ",".join(syntax.parse_mail_users(user))
        except syntax.SyntaxProblem as e:
            raise SpecError(f"mail_user: {e}") from None
    kw["mail_user"] = user
    return kw


MAX_NODES = 4096
MAX_TASKS_PER_NODE = 1024
MAX_SWITCHES = 64
MAX_NODE_NAMES = 65536        # names in one nodelist or exclude list
FEATURE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")      # a node feature: "a100", "ib"


def parse_constraint(text: Any) -> tuple[str, tuple[str, ...]]:
    """``"a100&ib"`` -> ("&", ("a100", "ib")); ``"a|b"`` -> ("|", ...); SpecError otherwise.

    Only one operator per constraint: all of the features, or any of them."""
    bad = (f"invalid constraint {text!r}: give node features joined by & (all of them) or by | "
           "(any of them), e.g. a100&ib")
    if not isinstance(text, str) or not 0 < len(text) <= 1000:
        raise SpecError(bad)
    op = "|" if "|" in text else "&"
    words = tuple(text.split(op))
    if ("&" in text and "|" in text) or not all(FEATURE.match(w) for w in words):
        raise SpecError(bad)
    return op, words


def constraint_matches(constraint: str | None, features: Any) -> bool:
    """Whether a node with ``features`` (an iterable, or labels' comma-joined text) qualifies."""
    if not constraint:
        return True
    have = set(features.split(",") if isinstance(features, str) else features or ())
    op, words = parse_constraint(constraint)
    return all(w in have for w in words) if op == "&" else any(w in have for w in words)


def _node_names(d: dict, key: str, option: str) -> tuple[str, ...]:
    v = d.get(key)
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)) or len(v) > MAX_NODE_NAMES:
        raise SpecError(f"{key} must be a list of at most {MAX_NODE_NAMES} node names")
    for name in v:
        if not isinstance(name, str) or not NODE_NAME.match(name):
            raise SpecError(f"{option}: {name!r} is not a node name (letters, digits, '.', '_' and '-')")
    return tuple(dict.fromkeys(v))


def _layout_fields(d: dict, kw: dict[str, Any]) -> dict[str, Any]:
    """Validate how many nodes a job takes and which: nodes, tasks, lists, features, switches."""
    out: dict[str, Any] = {}
    nodes = out["nodes"] = _opt_int(d, "nodes", 1, lo=1, hi=MAX_NODES)
    out["ntasks_per_node"] = _opt_int(d, "ntasks_per_node", 1, lo=1, hi=MAX_TASKS_PER_NODE)
    gpus = kw["gpus"]
    if nodes > 1 and gpus % nodes:
        raise SpecError(f"{gpus} GPUs do not divide among {nodes} nodes: ask for a multiple of {nodes} "
                        "(or give --gpus-per-node)")
    if nodes > 1 and (kw.get("mig_profile") or kw.get("gpu_mem_mb")):
        raise SpecError("a job on several nodes takes whole GPUs: drop the MIG profile or --gpu-mem, "
                        "or use -N 1")
    nodelist = out["nodelist"] = _node_names(d, "nodelist", "--nodelist")
    exclude = out["exclude"] = _node_names(d, "exclude", "--exclude")
    if len(nodelist) > nodes:
        raise SpecError(f"--nodelist names {len(nodelist)} nodes but the job asks for {nodes}: every listed "
                        f"node is part of the allocation, so ask for -N {len(nodelist)}")
    both = [n for n in nodelist if n in set(exclude)]
    if both:
        raise SpecError(f"node {both[0]} is both in --nodelist and in --exclude: drop it from one of them")
    constraint = d.get("constraint")
    if constraint is not None:
        parse_constraint(constraint)
    out["constraint"] = constraint
    switches = d.get("switches")
    if switches is not None:
        switches = _opt_int(d, "switches", 0, lo=1, hi=MAX_SWITCHES)
    out["switches"] = switches
    wait = d.get("switches_wait")
    if wait is not None:
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
            raise SpecError(f"switches_wait must be seconds (0 or more), not {wait!r}")
        if switches is None:
            raise SpecError("switches_wait needs switches: write --switches=N@TIME")
        wait = float(wait)
    out["switches_wait"] = wait
    return out


def _gpu_share(d: dict, gpus: int) -> dict[str, Any]:
    """Validate a fractional GPU request: MIG slices of a profile, or a memory floor."""
    kw: dict[str, Any] = {"mig_profile": None, "gpu_mem_mb": None}
    profile, mem = d.get("mig_profile"), d.get("gpu_mem_mb")
    if profile is not None and mem is not None:
        raise SpecError("--gpu-mem cannot be combined with a MIG profile in --gpus; ask for one")
    if profile is not None:
        try:
            kw["mig_profile"] = mig.parse_profile(profile)
        except mig.MigError as e:
            raise SpecError(str(e)) from None
        kw["gpus"] = gpus or 1          # "--gpus 1g.10gb" means one slice
    if mem is not None:
        try:
            mem = parse_size_mb(mem)
        except UnitError as e:
            raise SpecError(f"--gpu-mem: {e}") from None
        if mem <= 0:
            raise SpecError("--gpu-mem must be positive")
        if gpus > 1:
            raise SpecError("--gpu-mem asks for one device; use --gpus N for several whole GPUs")
        kw["gpu_mem_mb"], kw["gpus"] = mem, 1
    return kw


def _opt_str(d: dict, key: str, default: str) -> str:
    v = d.get(key, default)
    if v is None:
        return default
    if not isinstance(v, str) or "\x00" in v:
        raise SpecError(f"invalid {key}: {v!r}")
    return v


def _opt_int(d: dict, key: str, default: int, *, lo: int, hi: int) -> int:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(f"{key} must be an integer, not {v!r}")
    if not lo <= v <= hi:
        raise SpecError(f"{key} must be between {lo} and {hi}, not {v}")
    return v


GPU_MODES = ("whole", "mig", "mps", "timeslice")
MPS_MAX_CLIENTS = 48        # CUDA MPS serves at most 48 client processes per GPU


@dataclass(frozen=True)
class SliceInfo:
    """One MIG GPU instance (with its compute instance) on a GPU."""

    profile: str        # canonical catalog name, e.g. "1g.10gb"
    start: int          # first memory slot of its placement
    uuid: str           # "MIG-..." as CUDA_VISIBLE_DEVICES takes it
    memory_mb: int

    @classmethod
    def from_dict(cls, d: dict) -> "SliceInfo":
        start, mem = d["start"], d["memory_mb"]
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < 16:
            raise ValueError(f"MIG slice start slot must be 0-15, not {start!r}")
        if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
            raise ValueError(f"MIG slice memory must be a whole number of MiB, not {mem!r}")
        return cls(profile=str(d["profile"]), start=start, uuid=str(d["uuid"]), memory_mb=mem)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as its node reports it, with how it is shared (see GPU_MODES)."""

    index: int
    uuid: str
    model: str          # e.g. "H100-80GB", matched against --gpu-type and billing weights
    memory_mb: int
    mode: str = "whole"             # "whole" | "mig" | "mps" | "timeslice"
    dynamic: bool = False           # mig: the scheduler may re-lay free slices
    slices: tuple[SliceInfo, ...] = ()
    mps_max_clients: int = MPS_MAX_CLIENTS
    mps_thread_percentage: int | None = None
    replicas: int = 1               # timeslice: jobs that may share the GPU
    relaid_at: float | None = None  # last re-layout (epoch seconds), for the minimum interval
    numa_node: int | None = None    # the NUMA node it hangs off; None: unknown (gpud.gpu.topology)
    nvlink_peers: tuple[int, ...] = ()   # indices of the GPUs it reaches over NVLink

    @classmethod
    def from_dict(cls, d: dict) -> "GpuInfo":
        """Build from a registration; ValueError/KeyError/TypeError on anything malformed."""
        mode = d.get("mode", "whole")
        if mode not in GPU_MODES:
            raise ValueError(f"GPU mode must be one of {', '.join(GPU_MODES)}, not {mode!r}")
        dynamic = d.get("dynamic", False)
        if not isinstance(dynamic, bool):
            raise ValueError(f"GPU dynamic must be true or false, not {dynamic!r}")
        clients = int(d.get("mps_max_clients", MPS_MAX_CLIENTS))
        if not 1 <= clients <= MPS_MAX_CLIENTS:
            raise ValueError(f"mps_max_clients must be 1-{MPS_MAX_CLIENTS}, not {clients}")
        pct = d.get("mps_thread_percentage")
        if pct is not None and not 1 <= int(pct) <= 100:
            raise ValueError(f"mps_thread_percentage must be 1-100, not {pct!r}")
        replicas = int(d.get("replicas", 1))
        if not 1 <= replicas <= 1024:
            raise ValueError(f"timeslice replicas must be 1-1024, not {replicas}")
        relaid = d.get("relaid_at")
        numa = d.get("numa_node")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
            raise ValueError(f"numa_node must be a NUMA node number or null, not {numa!r}")
        peers = d.get("nvlink_peers", ())
        if not isinstance(peers, (list, tuple)) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in peers):
            raise ValueError(f"nvlink_peers must be a list of GPU indices, not {peers!r}")
        index = int(d["index"])
        return cls(index=index, uuid=str(d["uuid"]), model=str(d["model"]),
                   memory_mb=int(d["memory_mb"]), mode=mode, dynamic=dynamic,
                   slices=tuple(SliceInfo.from_dict(s) for s in d.get("slices", ())),
                   mps_max_clients=clients, mps_thread_percentage=None if pct is None else int(pct),
                   replicas=replicas, relaid_at=None if relaid is None else float(relaid),
                   numa_node=numa, nvlink_peers=tuple(sorted(set(peers) - {index})))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["slices"] = [s.to_dict() for s in self.slices]
        d["nvlink_peers"] = list(self.nvlink_peers)
        return d


@dataclass(frozen=True)
class NodeInfo:
    """What a worker registers: its resources and labels."""

    name: str
    cpus: int
    mem_mb: int
    gpus: tuple[GpuInfo, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "NodeInfo":
        return cls(
            name=str(d["name"]), cpus=int(d["cpus"]), mem_mb=int(d["mem_mb"]),
            gpus=tuple(GpuInfo.from_dict(g) for g in d.get("gpus", ())),
            labels={str(k): str(v) for k, v in dict(d.get("labels", {})).items()},
        )

    def to_dict(self) -> dict:
        return {"name": self.name, "cpus": self.cpus, "mem_mb": self.mem_mb,
                "gpus": [g.to_dict() for g in self.gpus], "labels": dict(self.labels)}
