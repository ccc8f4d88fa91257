"""Job wrappers (jobwrap.py) as processes: started, told apart from recycled pids, watched.

A wrapper is forked by the executor's wrapper server (forkserver.py), which hands back a
pidfd for exactly that process; where the kernel has no pidfds, or the server fails, the
wrapper is exec'd directly as the leader of a new session.  Either way it never sees the
job's environment: it may run as root.

``exited`` resolves once a wrapper has exited (a zombie counts): on its pidfd, opened on
the pid of an adopted wrapper after checking that the pid is still that wrapper (so it
cannot be recycled between the check and the watch), or by polling where there are no
pidfds.  An exited wrapper's pidfds are closed by whoever reads its outcome
(``close_spent``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys

import psutil

from .allocation import Allocation
from .forkserver import ForkServer
from .jobsetup import LaunchError
from .jobstore import Key

log = logging.getLogger("gpud.worker.executor")

WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobwrap.py")
# The wrapper may run as root: it never sees the job's environment (LD_PRELOAD, PYTHON*...).
WRAPPER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

# Wrappers still running when their executor closed; polled later so that a process that
# keeps running (an in-process restart, tests) reaps them.
_DETACHED: list[subprocess.Popen] = []


class Wrappers:
    """Starts one executor's wrappers and tells when each has exited."""

    def __init__(self) -> None:
        self.use_pidfd = hasattr(os, "pidfd_open")   # False: poll instead (and after a failed open)
        self.python = sys.executable or shutil.which("python3") or "/usr/bin/python3"
        # Wrappers forked by one server (see forkserver.py) where the kernel has pidfds
        self.server = ForkServer(self.python, WRAPPER, WRAPPER_ENV) if self.use_pidfd else None

    def start(self, key: Key, job_dir: str) -> tuple[subprocess.Popen | None, int, int | None]:
        """(thread) Start the wrapper of ``job_dir``: (its Popen, or None when the fork
        server made it; its pid; the server's pidfd of it, or None)."""
        popen, pidfd = None, None
        if self.server is not None:
            try:
                pid, pidfd = self.server.spawn(job_dir)
            except OSError as e:  # the server cannot: exec the wrapper as before
                log.warning("job %d.%d: the job wrapper server failed (%s); starting the wrapper "
                            "directly", *key, e)
        if pidfd is None:
            popen = self._exec(job_dir)
            pid = popen.pid
        return popen, pid, pidfd

    def _exec(self, job_dir: str) -> subprocess.Popen:
        """(thread) Start the wrapper as the leader of a new session."""
        try:
            log_fd = os.open(os.path.join(job_dir, "wrapper.log"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                return subprocess.Popen(
                    [self.python, "-I", "-S", WRAPPER, job_dir], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=log_fd, cwd="/", env=WRAPPER_ENV,
                    start_new_session=True, close_fds=True)
            finally:
                os.close(log_fd)
        except OSError as e:
            raise LaunchError(f"cannot start the job wrapper {self.python}: {e.strerror}") from None

    def close(self) -> None:
        """Stop asking the server; what it leaves to reap is reaped later."""
        if self.server is not None:
            _DETACHED.extend(self.server.close())

    def exited(self, job: Allocation, job_dir: str, poll: float) -> asyncio.Future:
        """Resolves once the wrapper has exited (a zombie counts)."""
        loop = asyncio.get_running_loop()
        if job.pidfd is not None:  # from the fork server: exactly this wrapper, exited or not
            fd, job.pidfd = job.pidfd, None
            return _pidfd_future(loop, fd, job, job_dir, checked=True)
        if self.use_pidfd and job.pid is not None:
            try:
                fd = os.pidfd_open(job.pid)
            except ProcessLookupError:
                fut = loop.create_future()
                fut.set_result(None)
                return fut
            except OSError:
                self.use_pidfd = False  # a kernel without pidfds: poll instead
            else:
                return _pidfd_future(loop, fd, job, job_dir)
        return asyncio.ensure_future(_poll_exit(job, job_dir, poll))


def _pidfd_future(loop: asyncio.AbstractEventLoop, fd: int, job: Allocation, job_dir: str, *,
                  checked: bool = False) -> asyncio.Future:
    fut = loop.create_future()
    # Checked with the pidfd open, so the pid cannot be recycled between check and watch.
    if job.popen is None and not checked and not alive(job.pid, job.create_time, job_dir):
        os.close(fd)
        fut.set_result(None)
        return fut
    loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))

    def release(done: asyncio.Future) -> None:
        loop.remove_reader(fd)
        if done.cancelled():   # no longer watched: nothing else will close it
            os.close(fd)
        else:   # the wrapper exited: closed on the thread that reads its outcome
            job.spent_fds.append(fd)

    fut.add_done_callback(release)
    return fut


async def _poll_exit(job: Allocation, job_dir: str, poll: float) -> None:
    while (job.popen.poll() is None if job.popen is not None
           else alive(job.pid, job.create_time, job_dir)):
        await asyncio.sleep(poll)


def alive(pid: int | None, create_time: float | None, job_dir: str) -> bool:
    """Is ``pid`` still this job's wrapper (running, and not a recycled pid)?"""
    if pid is None:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None:
            return abs(p.create_time() - create_time) < 0.1
        # Only the wrapper's pid file was left: a wrapper started on this directory, or one
        # the fork server forked (its command line) that existed when the file was written.
        cmdline = p.cmdline()
        if job_dir in cmdline:
            return True
        return (WRAPPER in cmdline
                and p.create_time() <= os.stat(os.path.join(job_dir, "wrapper.pid")).st_mtime + 0.1)
    except (psutil.Error, OSError):
        return False


def close_spent(job: Allocation) -> None:
    """Close the exited wrapper's pidfds (from the loop or a thread: each is popped once)."""
    while True:
        try:
            fd = job.spent_fds.pop()
        except IndexError:
            return
        os.close(fd)


def detach(popen: subprocess.Popen) -> None:
    """A wrapper of ours no longer watched: reaped once it exits."""
    _DETACHED.append(popen)


def reap_detached() -> None:
    _DETACHED[:] = [p for p in _DETACHED if p.poll() is None]
