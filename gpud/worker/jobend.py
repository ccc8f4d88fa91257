"""A job's end: its cgroup emptied and accounted, the wrapper's status read, the Outcome.

A job is over only when nothing of it runs any more: ``drain`` kills what is left in its
cgroup, waits until the cgroup is empty, takes the last accounting (peak memory, CPU time,
OOM kills) and removes it.  ``collect`` then reads the status file the wrapper wrote (the
job's exact wait status) and sweeps the group of a wrapper that was not our child and
wrote none.  ``outcome_of`` turns all that into the ``Outcome`` reported to the head: the
exit code or signal, the reason (a stop's reason first, then the lease's end, then a plain
exit), an OOM kill as Slurm's OUT_OF_MEMORY, and a one-line message for the user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal as signals
import time
from typing import Callable

from ..units import format_duration
from . import procs
from .allocation import Allocation
from .cgroups import Cgroups, Sampler, Usage
from .jobstore import JobStore
from .launch import OOM_SIGNAL, Outcome
from .wrappers import close_spent

log = logging.getLogger("gpud.worker.executor")


async def drain(cgroups: Cgroups, sampler: Sampler, name: str) -> Usage | None:
    """Kill what is left in a job's cgroup, wait until it is empty (a job is over only
    then), take its last accounting and remove it."""
    cg = cgroups
    try:   # the usual case in one trip to a thread: nothing left, or gone at the first kill
        usage = await asyncio.to_thread(_drain_now, cg, sampler, name)
        if usage is not False:
            return usage
    except OSError as e:
        log.warning("cgroup %s: %s", name, e.strerror or e)
    delay, waited, warned = 0.005, 0.0, False
    while True:
        try:
            busy = await asyncio.to_thread(cg.populated, name)
            if busy:
                await asyncio.to_thread(cg.kill, name)
        except OSError as e:
            log.warning("cgroup %s: %s", name, e.strerror or e)
            busy = False
        if not busy:
            break
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 1.0)
        if waited > 30 and not warned:
            log.warning("cgroup %s: processes survive SIGKILL (stuck in the kernel?); "
                        "the job ends once they are gone", name)
            warned = True
    try:
        usage = await asyncio.to_thread(sampler.sample, name)
    except OSError:
        usage = sampler.forget(name)
    sampler.forget(name)
    for _ in range(50):   # a cgroup is busy for a moment after its last process exits
        try:
            if await asyncio.to_thread(cg.remove, name):
                break
        except OSError as e:
            log.warning("cgroup %s: cannot remove it: %s", name, e.strerror or e)
            break
        await asyncio.sleep(0.02)
    return usage


def _drain_now(cg: Cgroups, sampler: Sampler, name: str) -> "Usage | None | bool":
    """(thread) ``drain`` without waiting: the usage once the cgroup is empty and
    removed, False while processes remain."""
    if cg.populated(name):
        cg.kill(name)
        for _ in range(20):   # SIGKILLed processes exit within milliseconds
            time.sleep(0.001)
            if not cg.populated(name):
                break
        else:
            return False
    usage = sampler.sample(name)
    sampler.forget(name)
    if not cg.remove(name):
        return False
    return usage


def collect(store: JobStore, job: Allocation, rc: int | None, usage: Usage | None,
            clock: Callable[[], float]) -> Outcome:
    """(thread) The ended wrapper's outcome (not yet saved).  A wrapper that was not our
    child and wrote no status may have left processes in its group: they are swept (one
    that wrote its status went on to SIGKILL its whole group itself).  ``rc``: the
    wrapper's exit status when it was our child."""
    close_spent(job)
    status = store.status(job.key)
    if status is None and job.popen is None and job.pid is not None:
        procs.sweep_group(job.pid, job.create_time)
    return outcome_of(job, status, rc, usage, lambda: store.wrapper_error(job.key), clock())


def outcome_of(job: Allocation, status: dict | None, rc: int | None, usage: Usage | None,
               wrapper_error: Callable[[], str], end_time: float) -> Outcome:
    """The outcome from the wrapper's status file (``status``), its exit status and the
    cgroup's last accounting; ``wrapper_error``: what the wrapper logged, asked for only
    when the job left no status."""
    outcome = _plain_outcome(job, status, rc, wrapper_error, end_time)
    if usage is None:
        return outcome
    if usage.oom_kills and job.stop_reason is None and outcome.reason in ("exited", "lost"):
        # Slurm's OUT_OF_MEMORY reads ExitCode 0:125
        limit = f"{job.launch.mem_mb} MB" if job.launch.mem_mb else "memory"
        outcome = dataclasses.replace(
            outcome, exit_code=0, signal=OOM_SIGNAL, reason="oom",
            message=f"out of memory: the job's memory limit ({limit}) was reached and the "
                    f"kernel killed {usage.oom_kills} of its processes")
    return dataclasses.replace(outcome, max_rss=usage.max_rss, cpu_usec=usage.cpu_usec)


def _plain_outcome(job: Allocation, status: dict | None, rc: int | None,
                   wrapper_error: Callable[[], str], end_time: float) -> Outcome:
    if status is not None and isinstance(status.get("error"), str):
        return outcome(job, None, None, "launch_failed", status["error"], end_time=end_time)
    reason = job.stop_reason or ("lease_expired" if status is not None and status.get("lease_expired")
                                 else "exited")
    if status is not None and isinstance(status.get("exit_code"), int):
        sig = status.get("signal") if isinstance(status.get("signal"), int) else None
        return outcome(job, status["exit_code"], sig, reason, core=status.get("core") is True, end_time=end_time)
    if rc is not None and rc < 0:  # the wrapper itself was killed, normally by our SIGKILL
        return outcome(job, 0, -rc, reason, end_time=end_time)
    if rc is None and job.killed:  # adopted, and our SIGKILL ended it
        return outcome(job, 0, signals.SIGKILL, reason, end_time=end_time)
    detail = wrapper_error()
    return outcome(job, None, None, job.stop_reason or "lost",
                   "the job ended without recording an exit status" + (f" ({detail})" if detail else ""),
                   end_time=end_time)


def outcome(job: Allocation, exit_code: int | None, sig: int | None, reason: str,
            message: str | None = None, *, core: bool = False, end_time: float) -> Outcome:
    """The Outcome of ``job``, with the message said for it unless one is given."""
    if message is None:
        if sig:
            try:
                name = signals.Signals(sig).name
            except ValueError:
                name = "unknown"
            message = f"killed by signal {sig} ({name})" + (", core dumped" if core else "")
        else:
            message = f"exited with code {exit_code}"
        if reason == "timeout":
            message = f"time limit of {format_duration(job.launch.time_limit)} reached; {message}"
        elif reason != "exited":
            message = f"{reason}; {message}"
    return Outcome(job.launch.job_id, job.launch.attempt, exit_code, sig, reason, message,
                   job.start_time, end_time)
