"""Stopping a job: signals to its whole process group and cgroup, the grace, the SIGKILL.

A stop (time limit, cancel, preemption) sends a signal to the whole group, then SIGCONT so a
stopped job sees it, and SIGKILL when the grace runs out; fencing (``kill_now``) sends
SIGKILL at once.  The first reason given is the one reported.  ``--signal``'s warning goes
before the time limit, to the batch shell alone (``B:``) or to the whole group.  A signal
asked for before the wrapper exists is kept and sent once it does.

These change the ``Allocation`` in place; the executor saves its record after a stop or
kill (so a restarted worker still delivers the SIGKILL on time) and wakes its watcher.
Times are on the executor's monotonic clock.
"""

from __future__ import annotations

import logging
import os
import signal as signals
from typing import Callable

import psutil

from .allocation import Allocation, warning_time
from .cgroups import Cgroups, job_name
from .launch import parse_signal

log = logging.getLogger("gpud.worker.executor")


def signal_group(job: Allocation, sig: int, cgroups: Cgroups) -> None:
    """``sig`` to the job's process group, and to its cgroup when it is confined."""
    if job.pid is None:  # still spawning: sent as soon as the wrapper exists
        job.early.append(sig)
        return
    try:
        os.killpg(job.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        log.warning("job %d.%d: cannot signal its processes: %s", *job.key, e.strerror)
    if cgroups.active:   # also the ones in sessions and groups of their own
        try:
            if sig == signals.SIGKILL:
                cgroups.kill(job_name(*job.key))
            else:
                cgroups.signal(job_name(*job.key), sig)
        except OSError as e:
            log.warning("job %d.%d: cannot signal its cgroup: %s", *job.key, e.strerror or e)


def begin_stop(job: Allocation, sig: int, grace: float, reason: str, now: float, cgroups: Cgroups) -> None:
    """``sig`` (and SIGCONT) now, SIGKILL ``grace`` seconds after ``now`` (or sooner, when an
    earlier stop's grace ends first)."""
    job.stop_reason = job.stop_reason or reason
    kill_at = now + max(0.0, grace)
    job.kill_at = kill_at if job.kill_at is None else min(job.kill_at, kill_at)
    signal_group(job, sig, cgroups)
    if sig != signals.SIGCONT:
        signal_group(job, signals.SIGCONT, cgroups)  # a stopped job gets the signal now


def kill_now(job: Allocation, reason: str, cgroups: Cgroups) -> None:
    job.stop_reason = job.stop_reason or reason
    signal_group(job, signals.SIGKILL, cgroups)
    job.killed = True


def warn(job: Allocation, cgroups: Cgroups) -> None:
    """--signal's warning before the time limit: to the batch shell alone (B:), whose
    pid is the wrapper's one child, or to the job's whole group as a stop signal goes."""
    job.warned = True
    sig = parse_signal(job.launch.warn_signal or "")
    if sig is None or job.pid is None:
        return
    log.info("job %d.%d: %s %.0f s before its time limit", *job.key, sig.name, job.launch.warn_time)
    if not job.launch.warn_batch:
        signal_group(job, sig, cgroups)
        return
    try:
        for shell in psutil.Process(job.pid).children():
            os.kill(shell.pid, sig)
    except (psutil.Error, ProcessLookupError):
        pass


def enforce(job: Allocation, mono: Callable[[], float], cgroups: Cgroups) -> bool:
    """Do what is due now on ``mono``: the warning, the time limit's stop, the grace's
    SIGKILL.  True when a stop or kill began, so the job's record must be saved."""
    changed = False
    now = mono()
    warn_at = warning_time(job)
    if warn_at is not None and not job.warned and job.stop_reason is None and now >= warn_at:
        warn(job, cgroups)
    if job.stop_reason is None and job.deadline is not None and now >= job.deadline:
        log.info("job %d.%d: time limit reached", *job.key)
        begin_stop(job, signals.SIGTERM, job.launch.kill_grace, "timeout", mono(), cgroups)
        changed = True
    if job.kill_at is not None and not job.killed and now >= job.kill_at:
        log.info("job %d.%d: grace over, killing it", *job.key)
        kill_now(job, job.stop_reason or "killed", cgroups)
        changed = True
    return changed


def next_delay(job: Allocation, now: float, poll: float) -> float | None:
    """Seconds to the next deadline, at most ``poll``; None: no deadline."""
    due = [t for t, pending in ((job.deadline, job.stop_reason is None),
                                (warning_time(job), not job.warned and job.stop_reason is None),
                                (job.kill_at, not job.killed)) if t is not None and pending]
    if not due:
        return None
    return min(max(0.0, min(due) - now), poll)
