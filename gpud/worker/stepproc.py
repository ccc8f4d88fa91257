"""An srun task's process, outside its stream: the shell that waits at its gate, the record under ``state_dir`` and killing what a previous
worker left.  See gpud.worker.steps.

Tasks are children of the worker, each in a session of its own, so they are outside the
job's process group: the executor's end of the allocation would not reach them.  A file
per task under ``state_dir`` (pid and process start time, ``save_record``) outlives the
worker; a restarted worker reads them back (``read_record``) and kills what is left of
those tasks (``kill_left``), whose output nobody can read any more.  The file is written
before the task is started and again with its pid, and the task's shell waits on its
standard input (a terminal's task: descriptor 3) until then (``open_gate``,
``open_fd_gate``): a worker that dies in between leaves a record without a pid, and a
task that finds its input closed exits (125) without running the command, so no task
runs unrecorded and every recorded one is reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal as signals

import psutil

from . import procs
from .jobstore import read_json, write_file

log = logging.getLogger("gpud.worker.steps")

SHELL = "/bin/sh"
# A task's shell: wait at the gate (a line on its input), enter the work directory as the
# user, become the command with /dev/null for input.  End of input without the line: the
# worker died before recording the task's pid, so it does not run.
TASK_SHELL = 'read -r _ || exit 125; cd -- "$0" || exit 126; exec "$@" </dev/null'
# Task 0 of a step with input: the rest of the pipe is its standard input.
TASK_SHELL_STDIN = 'read -r _ || exit 125; cd -- "$0" || exit 126; exec "$@"'
# On a terminal the gate is descriptor 3, closed before the command.
TASK_SHELL_PTY = 'read -r _ <&3 || exit 125; exec 3<&-; cd -- "$0" || exit 126; exec "$@"'


# -- the gate and the process group ----------------------------------------------------------------

def open_gate(proc: asyncio.subprocess.Process, close: bool = True) -> None:
    """Let a started task's shell go on to its command (one line, then end of input, unless
    the rest of the pipe is the task's input)."""
    stdin = proc.stdin
    if stdin is None:
        return
    try:
        stdin.write(b"\n")
        if close:
            stdin.close()
    except (BrokenPipeError, ConnectionResetError):   # it was killed meanwhile
        pass


def open_fd_gate(fd: int) -> None:
    try:
        os.write(fd, b"\n")
    except OSError:   # it was killed meanwhile
        pass
    finally:
        os.close(fd)


def write_pid(path: str, pid: int) -> None:
    """Move ``pid`` into a cgroup (``path`` is its ``cgroup.procs`` or ``tasks``)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the records a later worker reads --------------------------------------------------------------

def save_record(state_dir: str, job: int, attempt: int, step: int, rank: int, pid: int | None) -> str | None:
    """Record a task for a worker that may come after this one: before it starts
    (no pid yet), then started.  Its path, or None when it could not be written."""
    path = os.path.join(state_dir, f"{job}.{attempt}.{step}.{rank}")
    rec = {"job": job, "attempt": attempt, "step": step, "rank": rank,
           "pid": pid, "create_time": procs.create_time(pid) if pid is not None else None}
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        write_file(path, json.dumps(rec).encode(), 0o600)
    except OSError as e:   # the task runs; only a worker restart would miss it
        log.warning("job %d step %d: cannot record task %d: %s", job, step, rank, e)
        return None
    return path


def read_record(path: str) -> dict | None:
    rec = read_json(path)
    if rec is None or not all(type(rec.get(k)) is int and rec[k] >= 0 for k in ("job", "attempt", "step", "rank")):
        return None
    if not (rec.get("pid") is None or (type(rec["pid"]) is int and rec["pid"] > 0)):
        return None
    if not isinstance(rec.get("create_time"), (int, float)):
        rec["create_time"] = None
    return rec


def kill_left(pid: int, create_time: float | None) -> bool:
    """SIGKILL a recorded task's process group, if it is still that task's (same start
    time, or younger members of the group when the leader is gone); True when any died."""
    try:
        leader = psutil.Process(pid)
        if create_time is not None and abs(leader.create_time() - create_time) < 0.1 \
                and leader.status() != psutil.STATUS_ZOMBIE:
            os.killpg(pid, signals.SIGKILL)
            return True
    except (psutil.Error, OSError):
        pass
    if create_time is None:
        return False
    return procs.sweep_group(pid, create_time, spare=pid)   # the leader exited; what it left behind


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
