"""The worker's side of a launch: its batch environment, its output files, and what it
reports back (``Outcome``).

The launch itself is ``gpud.bus.messages.Launch``, the bus's type: the worker gets it from
``decode``, which refuses a malformed one in one line, so nothing malformed is ever run.
``Outcome.finished`` is the ``finished`` message of ``gpud.bus.messages``.

Exit codes follow Slurm's ``exit:signal``: a job killed by a signal has exit_code 0 and that
signal; exit_code is None only when there is no exit at all ("launch_failed", "lost").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bus.messages import Finished, GpuAssignment, Launch
from ..syntax import expand_output, parse_signal

__all__ = ["GpuAssignment", "Launch", "Outcome", "batch_env", "output_path", "parse_signal"]

REASONS = frozenset({"exited", "timeout", "cancelled", "preempted", "killed", "launch_failed", "lost", "oom"})
OOM_SIGNAL = 125   # Slurm reports an OUT_OF_MEMORY job's ExitCode as 0:125


def batch_env(launch: Launch, node: str) -> dict[str, str]:
    """GPUD_ARRAY_* for array tasks, and Slurm's SLURM_* names when slurm_compat_env is on."""
    env: dict[str, str] = {}
    array = launch.array_job_id is not None and launch.array_task_id is not None
    if array:
        env.update({"GPUD_ARRAY_JOB_ID": str(launch.array_job_id), "GPUD_ARRAY_TASK_ID": str(launch.array_task_id),
                    "GPUD_ARRAY_TASK_COUNT": str(launch.array_task_count or 1),
                    "GPUD_ARRAY_TASK_MIN": str(launch.array_task_min if launch.array_task_min is not None else
                                               launch.array_task_id),
                    "GPUD_ARRAY_TASK_MAX": str(launch.array_task_max if launch.array_task_max is not None else
                                               launch.array_task_id),
                    "GPUD_ARRAY_TASK_STEP": str(launch.array_task_step or 1)})
    if not launch.slurm_compat_env:
        return env
    gpus = ",".join(str(g.index) for g in launch.gpus)
    env.update({
        "SLURM_JOB_ID": str(launch.job_id), "SLURM_JOBID": str(launch.job_id), "SLURM_JOB_NAME": launch.name,
        "SLURM_JOB_USER": launch.user, "SLURM_JOB_UID": str(launch.uid), "SLURM_JOB_GID": str(launch.gid),
        "SLURM_SUBMIT_DIR": launch.submit_dir, "SLURM_JOB_NODELIST": node, "SLURM_NODELIST": node,
        "SLURMD_NODENAME": node, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1",
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_CPUS_PER_TASK": str(launch.cpus), "SLURM_CPUS_ON_NODE": str(launch.cpus),
        "SLURM_JOB_CPUS_PER_NODE": str(launch.cpus), "SLURM_MEM_PER_NODE": str(launch.mem_mb),
        "SLURM_JOB_GPUS": gpus, "SLURM_GPUS_ON_NODE": str(len(launch.gpus)),
        "SLURM_RESTART_COUNT": str(launch.restart_count),
    })
    for name, value in (("SLURM_JOB_PARTITION", launch.partition), ("SLURM_JOB_ACCOUNT", launch.account),
                        ("SLURM_JOB_QOS", launch.qos), ("SLURM_CLUSTER_NAME", launch.cluster)):
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

    def finished(self) -> Finished:
        """The ``finished`` message."""
        return Finished(self.job_id, self.attempt, self.exit_code, self.signal, self.reason, self.end_time,
                        self.message, self.max_rss, self.cpu_usec)

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
