"""What the head asks a worker to run (``Launch``) and what the worker reports back (``Outcome``).

``Launch.from_body`` is the only door for a ``launch`` message body: anything malformed is a
``ValueError`` with a one-line reason, so a bad message is dropped and logged, never run.
Unknown keys are ignored (a newer head may send more).  ``Outcome.to_body`` is the
``finished`` message body of ``gpud.bus.base``.

Exit codes follow Slurm's ``exit:signal``: a job killed by a signal has exit_code 0 and that
signal; exit_code is None only when there is no exit at all ("launch_failed", "lost").
"""

from __future__ import annotations

import math
import re
import signal as signals
from dataclasses import dataclass, field
from typing import Any

from ..syntax import expand_output

REASONS = frozenset({"exited", "timeout", "cancelled", "preempted", "killed", "launch_failed", "lost", "oom"})
OOM_SIGNAL = 125   # Slurm reports an OUT_OF_MEMORY job's ExitCode as 0:125
MAX_ID = 2**63 - 1
MAX_UID = 2**32 - 2
DEFAULT_KILL_GRACE = 30.0
_ENV_NAME = re.compile(r"^[^=\x00]+$")


DEVICE_KINDS = ("gpu", "mig", "mps", "timeslice")


@dataclass(frozen=True)
class GpuAssignment:
    index: int
    uuid: str   # a GPU or MIG device UUID, as CUDA_VISIBLE_DEVICES takes it
    kind: str = "gpu"                # "gpu" | "mig" | "mps" | "timeslice" (gpud.worker.gpumodes)
    slice_start: int | None = None   # mig: the slice's first memory slot
    mem_mb: int | None = None        # mps: the pinned memory limit; mig: the slice's memory
    profile: str | None = None       # mig: the slice's profile

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "kind": self.kind,
                "slice_start": self.slice_start, "mem_mb": self.mem_mb, "profile": self.profile}


@dataclass(frozen=True)
class Launch:
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
    extra_env: dict[str, str] = field(default_factory=dict)  # applied last (MPS, MIG, ...)
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

    @classmethod
    def from_body(cls, d: dict) -> "Launch":
        """Validate a ``launch`` body; ValueError with a one-line reason otherwise."""
        if not isinstance(d, dict):
            raise ValueError("launch body must be an object")
        job_key = "job_id" if "job_id" in d else "job"   # the head says job_id, bus docs say job
        work_dir = _text(d, "work_dir")
        if not work_dir.startswith("/"):
            raise ValueError(f"work_dir must be an absolute path, not {work_dir!r:.80}")
        return cls(
            job_id=_int(d, job_key, 0, MAX_ID),
            attempt=_int(d, "attempt", 0, MAX_ID),
            name=_text(d, "name", "job"),
            user=_text(d, "user"),
            uid=_int(d, "uid", 0, MAX_UID),
            gid=_int(d, "gid", 0, MAX_UID),
            script=_text(d, "script"),
            work_dir=work_dir,
            stdout=_text(d, "stdout", None),
            stderr=_text(d, "stderr", None),
            env=_env(d, "env"),
            gpus=_gpus(d.get("gpus")),
            cpus=_int(d, "cpus", 1, 1 << 20, default=1),
            mem_mb=_int(d, "mem_mb", 0, MAX_ID, default=0),
            time_limit=_seconds(d, "time_limit", None),
            kill_grace=_seconds(d, "kill_grace", DEFAULT_KILL_GRACE, zero_ok=True),
            submit_dir=_text(d, "submit_dir", work_dir),
            extra_env=_env(d, "extra_env"),
            rlimits=_rlimits(d.get("rlimits")),
            **_slurm_fields(d),
        )

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
            **{k: getattr(self, k) for k in _SLURM_FIELDS},
        }

    def batch_env(self, node: str) -> dict[str, str]:
        """GPUD_ARRAY_* for array tasks, and Slurm's SLURM_* names when slurm_compat_env is on."""
        env: dict[str, str] = {}
        array = self.array_job_id is not None and self.array_task_id is not None
        if array:
            env.update({"GPUD_ARRAY_JOB_ID": str(self.array_job_id), "GPUD_ARRAY_TASK_ID": str(self.array_task_id),
                        "GPUD_ARRAY_TASK_COUNT": str(self.array_task_count or 1),
                        "GPUD_ARRAY_TASK_MIN": str(self.array_task_min if self.array_task_min is not None else
                                                   self.array_task_id),
                        "GPUD_ARRAY_TASK_MAX": str(self.array_task_max if self.array_task_max is not None else
                                                   self.array_task_id),
                        "GPUD_ARRAY_TASK_STEP": str(self.array_task_step or 1)})
        if not self.slurm_compat_env:
            return env
        gpus = ",".join(str(g.index) for g in self.gpus)
        env.update({
            "SLURM_JOB_ID": str(self.job_id), "SLURM_JOBID": str(self.job_id), "SLURM_JOB_NAME": self.name,
            "SLURM_JOB_USER": self.user, "SLURM_JOB_UID": str(self.uid), "SLURM_JOB_GID": str(self.gid),
            "SLURM_SUBMIT_DIR": self.submit_dir, "SLURM_JOB_NODELIST": node, "SLURM_NODELIST": node,
            "SLURMD_NODENAME": node, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
            "SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1",
            "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_CPUS_PER_TASK": str(self.cpus), "SLURM_CPUS_ON_NODE": str(self.cpus),
            "SLURM_JOB_CPUS_PER_NODE": str(self.cpus), "SLURM_MEM_PER_NODE": str(self.mem_mb),
            "SLURM_JOB_GPUS": gpus, "SLURM_GPUS_ON_NODE": str(len(self.gpus)),
            "SLURM_RESTART_COUNT": str(self.restart_count),
        })
        for name, value in (("SLURM_JOB_PARTITION", self.partition), ("SLURM_JOB_ACCOUNT", self.account),
                            ("SLURM_JOB_QOS", self.qos), ("SLURM_CLUSTER_NAME", self.cluster)):
            if value:
                env[name] = value
        if array:
            env.update({k.replace("GPUD_", "SLURM_"): v for k, v in env.items() if k.startswith("GPUD_ARRAY_")})
        return env


@dataclass(frozen=True)
class Outcome:
    job_id: int
    attempt: int
    exit_code: int | None
    signal: int | None
    reason: str        # one of REASONS
    message: str       # one line for people
    start_time: float | None
    end_time: float
    max_rss: int | None = None     # peak memory of the job's cgroup, bytes; None: not measured
    cpu_usec: int | None = None    # CPU time of the job's cgroup, microseconds

    def to_body(self) -> dict[str, Any]:
        """The ``finished`` message body."""
        body = {"job": self.job_id, "attempt": self.attempt, "exit_code": self.exit_code,
                "signal": self.signal, "reason": self.reason, "time": self.end_time,
                "message": self.message}
        if self.max_rss is not None or self.cpu_usec is not None:
            body.update(max_rss=self.max_rss, cpu_usec=self.cpu_usec)
        return body

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "exit_code": self.exit_code,
                "signal": self.signal, "reason": self.reason, "message": self.message,
                "start_time": self.start_time, "end_time": self.end_time,
                "max_rss": self.max_rss, "cpu_usec": self.cpu_usec}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Outcome":
        def opt_int(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(int(d["job_id"]), int(d["attempt"]), opt_int(d["exit_code"]),
                   opt_int(d["signal"]), str(d["reason"]), str(d["message"]),
                   None if d["start_time"] is None else float(d["start_time"]),
                   float(d["end_time"]), opt_int(d.get("max_rss")), opt_int(d.get("cpu_usec")))


def output_path(pattern: str | None, launch: Launch, node: str) -> str:
    """An output file's absolute path, relative to work_dir, with Slurm's %-sequences expanded."""
    return expand_output(pattern, work_dir=launch.work_dir, job_id=launch.job_id, name=launch.name,
                         user=launch.user, node=node, array_job_id=launch.array_job_id,
                         array_task_id=launch.array_task_id)


def parse_signal(sig: str | int) -> signals.Signals | None:
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` -> SIGTERM; None when it is no signal."""
    if isinstance(sig, bool):
        return None
    try:
        if isinstance(sig, int) or (isinstance(sig, str) and sig.strip().isdigit()):
            return signals.Signals(int(sig))
        name = sig.strip().upper()
        return signals.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError, AttributeError):
        return None


_MISSING: Any = object()


def _int(d: dict, key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
    v = d.get(key)
    if v is None:
        if default is _MISSING:
            raise ValueError(f"{key} is missing")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer from {lo} to {hi}, not {v!r:.40}")
    return v


def _text(d: dict, key: str, default: Any = _MISSING) -> Any:
    v = d.get(key)
    if v is None:
        if default is _MISSING:
            raise ValueError(f"{key} is missing")
        return default
    if not isinstance(v, str) or not v or "\x00" in v:
        raise ValueError(f"{key} must be a non-empty string without NUL, not {v!r:.40}")
    return v


def _seconds(d: dict, key: str, default: float | None, zero_ok: bool = False) -> float | None:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{key} must be a {'non-negative' if zero_ok else 'positive'} "
                         f"number of seconds, not {v!r:.40}")
    return float(v)


def _rlimits(value: Any) -> dict[str, tuple[int, int]]:
    from ..model import SpecError, parse_rlimits

    try:
        return parse_rlimits(value)
    except SpecError as e:
        raise ValueError(str(e)) from None


def _env(d: dict, key: str) -> dict[str, str]:
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{key} must be an object")
    for k, val in v.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k) or not isinstance(val, str) or "\x00" in val:
            raise ValueError(f"{key} must map variable names to strings (bad entry {k!r:.40})")
    return dict(v)


_SLURM_FIELDS = ("array_job_id", "array_task_id", "array_task_count", "array_task_min", "array_task_max",
                 "array_task_step", "open_mode", "slurm_compat_env", "partition", "account", "qos", "cluster",
                 "restart_count", "warn_signal", "warn_time", "warn_batch")


def _slurm_fields(d: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _SLURM_FIELDS[:6]:
        out[key] = _int(d, key, 0, MAX_ID, default=None)
    mode = d.get("open_mode")
    if mode not in (None, "append", "truncate"):
        raise ValueError(f"open_mode must be append or truncate, not {mode!r:.40}")
    out["open_mode"] = mode
    flag = d.get("slurm_compat_env", False)
    if not isinstance(flag, bool):
        raise ValueError("slurm_compat_env must be true or false")
    out["slurm_compat_env"] = flag
    for key in ("partition", "account", "qos", "cluster"):
        out[key] = _text(d, key, None)
    out["restart_count"] = _int(d, "restart_count", 0, MAX_ID, default=0)
    warn = _text(d, "warn_signal", None)
    if warn is not None and parse_signal(warn) is None:
        raise ValueError(f"warn_signal must name a signal, not {warn!r:.40}")
    out["warn_signal"] = warn
    out["warn_time"] = _seconds(d, "warn_time", 60.0, zero_ok=True)
    batch = d.get("warn_batch", False)
    if not isinstance(batch, bool):
        raise ValueError("warn_batch must be true or false")
    out["warn_batch"] = batch
    return out


def _gpus(v: Any) -> tuple[GpuAssignment, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError("gpus must be a list")
    out = []
    for g in v:
        if not isinstance(g, dict):
            raise ValueError("each of gpus must be an object with index and uuid")
        index, uuid = g.get("index"), g.get("uuid")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"gpu index must be a non-negative integer, not {index!r:.40}")
        if not isinstance(uuid, str) or not uuid or "," in uuid or "\x00" in uuid:
            raise ValueError(f"gpu uuid must be a non-empty string without commas, not {uuid!r:.40}")
        out.append(_device(g, index, uuid))
    # Slices of one GPU share its index; only whole GPUs and UUIDs must be unique.
    whole = [g.index for g in out if g.kind != "mig"]
    if len(set(whole)) != len(whole):
        raise ValueError("gpus lists an index twice")
    if len({g.uuid for g in out}) != len(out):
        raise ValueError("gpus lists a UUID twice")
    return tuple(out)


def _device(g: dict, index: int, uuid: str) -> GpuAssignment:
    kind = g.get("kind") or "gpu"
    if kind not in DEVICE_KINDS:
        raise ValueError(f"gpu kind must be one of {', '.join(DEVICE_KINDS)}, not {kind!r:.40}")
    start, mem, profile = g.get("slice_start"), g.get("mem_mb"), g.get("profile")
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < 16):
        raise ValueError(f"slice_start must be a memory slot 0-15, not {start!r:.40}")
    if kind == "mig" and start is None:
        raise ValueError("a mig device needs its slice_start")
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int) or not 0 < mem <= MAX_ID):
        raise ValueError(f"mem_mb must be a positive integer, not {mem!r:.40}")
    if profile is not None and (not isinstance(profile, str) or not 0 < len(profile) <= 32):
        raise ValueError(f"profile must be a short string, not {profile!r:.40}")
    return GpuAssignment(index, uuid, kind, start, mem, profile)
