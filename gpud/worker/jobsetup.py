"""What a job starts with: its user, its environment, its cgroup's limits, the wrapper's spec.

The executor writes the allocation's directory (jobstore.py) from these before it starts
the wrapper (jobwrap.py), which reads ``wrapper_spec``'s dict as ``spec.json``.  A
``gpuctl srun`` task of a running allocation starts from the same user, groups, working
directory and environment (``TaskSetup``, for gpud.worker.steps).

Running as root, the job's user must exist here under the head's name and uid; anything
else is a ``LaunchError``, whose message is the reason the user is given.  Not root, jobs
run as ourselves.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any, Callable

from .cgroups import Limits
from .cpubind import format_cpulist
from .launch import Launch, batch_env, output_path


class LaunchError(Exception):
    """The job cannot start; the message is the user-facing reason."""


@dataclass(frozen=True)
class TaskSetup:
    """How to start a process of a running allocation as its job (gpud.worker.steps)."""

    uid: int
    gid: int
    groups: list[int]
    switch_user: bool
    work_dir: str
    env: dict[str, str]
    step_cgroup: Callable[[int], list[str]] | None = None   # step -> the cgroup files its tasks join


def identity(launch: Launch, node: str) -> tuple[str, str, list[int], bool]:
    """(user, home, groups, switch_user): the job's user when root, else ourselves."""
    if os.geteuid() != 0:
        try:
            pw = pwd.getpwuid(os.getuid())
            return pw.pw_name, pw.pw_dir, [], False
        except KeyError:
            return launch.user, os.environ.get("HOME", "/"), [], False
    try:
        pw = pwd.getpwuid(launch.uid)
    except KeyError:
        raise LaunchError(f"user {launch.user} (uid {launch.uid}) does not exist on node "
                          f"{node}; add the user there or fix its user database") from None
    if pw.pw_name != launch.user:
        raise LaunchError(f"uid {launch.uid} is {pw.pw_name} on node {node} but "
                          f"{launch.user} on the head; make the user databases agree")
    try:
        groups = os.getgrouplist(pw.pw_name, launch.gid)
    except OSError as e:
        raise LaunchError(f"cannot read the groups of {pw.pw_name}: {e.strerror}") from None
    return pw.pw_name, pw.pw_dir, groups, True


def environment(launch: Launch, node: str, user: str, home: str) -> dict[str, str]:
    """The job's environment: the submitter's, then gpud's variables, Slurm's and the extras."""
    env = dict(launch.env)
    env.update({
        "GPUD_JOB_ID": str(launch.job_id), "GPUD_JOB_NAME": launch.name,
        "GPUD_NODENAME": node, "GPUD_SUBMIT_DIR": launch.submit_dir,
        "GPUD_GPUS": ",".join(str(i) for i in dict.fromkeys(g.index for g in launch.gpus)),
        "GPUD_JOB_ATTEMPT": str(launch.attempt),
        # UUIDs survive any renumbering; an empty value hides every GPU.
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in launch.gpus),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "USER": user, "LOGNAME": user, "HOME": home,
    })
    env.update(batch_env(launch, node))   # GPUD_ARRAY_*, SLURM_* (slurm_compat_env)
    env.update(launch.extra_env)
    return env


def wrapper_spec(launch: Launch, node: str, job_dir: str, cpus: tuple[int, ...], shell: str) -> dict[str, Any]:
    """What the wrapper runs (its ``spec.json``), but for the cgroup files its batch step
    joins and the lease file, which the caller adds last.  LaunchError when the user
    cannot be resolved."""
    user, home, groups, switch = identity(launch, node)
    env = environment(launch, node, user, home)
    if cpus:
        env["GPUD_JOB_CPUS"] = format_cpulist(cpus)
    stdout = output_path(launch.stdout, launch, node)
    stderr = output_path(launch.stderr, launch, node) if launch.stderr else stdout
    return {"user": user, "uid": launch.uid, "gid": launch.gid, "groups": groups,
            "switch_user": switch, "work_dir": launch.work_dir, "stdout": stdout,
            "stderr": stderr, "shell": shell, "script": os.path.join(job_dir, "script"),
            "env": env, "open_mode": launch.open_mode, "cpus": list(cpus),
            "rlimits": {k: list(v) for k, v in launch.rlimits.items()}}


def limits(launch: Launch, cpus: tuple[int, ...], node_devices: Any, max_tasks: int | None) -> Limits:
    """What the job's cgroup allows: its CPUs, memory, tasks and GPU device nodes
    (``node_devices``: the node's gpud.gpu.devices.GpuDevices, or None)."""
    devices, known = None, ()
    if node_devices is not None:
        held = [(g.index, g.slice_start if g.kind == "mig" else None) for g in launch.gpus]
        devices, known = node_devices.allowed(held), tuple(node_devices.known())
    return Limits(cpus=cpus, mem_bytes=launch.mem_mb * (1 << 20) if launch.mem_mb else None,
                  pids_max=max_tasks or None, devices=devices, known_devices=known)
