"""Process facts the executor and srun's tasks share: start times and group sweeps.

A process group id outlives its leader and may be reused, so a sweep kills only members
that started at or after the time recorded for the job or task."""

from __future__ import annotations

import os

import psutil


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def sweep_group(pgid: int, since: float | None, *, spare: int | None = None) -> bool:
    """SIGKILL the members of process group ``pgid`` that started at or after ``since``
    (every member when None), except pid ``spare``; True when any was killed."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    killed = False
    for p in psutil.process_iter(["create_time"]):
        try:
            if p.pid != spare and os.getpgid(p.pid) == pgid and (since is None or p.info["create_time"] >= since - 0.1):
                p.kill()
                killed = True
        except (OSError, psutil.Error):
            pass
    return killed
