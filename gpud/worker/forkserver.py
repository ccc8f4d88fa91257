"""The executor's side of the job wrapper's fork server (``jobwrap.py --serve``).

Theory of operation
-------------------
Starting a Python interpreter for every job's wrapper costs tens of milliseconds of CPU,
which on a busy node is most of what a short job costs.  Instead the executor starts one
wrapper server per executor, the first time it launches a job, and asks it for each wrapper
over a SOCK_SEQPACKET socket pair: the job directory goes out, the wrapper's pid and a pidfd
for it come back.  The server runs the same file with the same clean environment, in a
session of its own, so the wrappers it forks are what ``python jobwrap.py <dir>`` would have
been: session and group leaders that outlive the worker and write their status file.

One request at a time (a lock: launches run on threads).  A server that died is started
again once per request; when it still cannot answer, ``spawn`` raises OSError and the
executor execs the wrapper as before.  ``close`` only closes the socket: the server sees
the end of it and exits, and the wrappers it forked run on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading


class ForkServer:
    """Forks job wrappers from one long-lived ``jobwrap.py --serve`` process."""

    def __init__(self, python: str, wrapper: str, env: dict[str, str]) -> None:
        self._argv = [python, "-I", "-S", wrapper, "--serve"]
        self._env = env
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self._retired: list[subprocess.Popen] = []   # servers dropped, reaped once they exit

    def spawn(self, job_dir: str) -> tuple[int, int]:
        """(thread) A wrapper for ``job_dir``: (its pid, a pidfd the caller must close)."""
        with self._lock:
            for again in (False, True):
                try:
                    if self._sock is None:
                        self._start()
                    assert self._sock is not None
                    self._sock.send(os.fsencode(job_dir))
                    msg, fds, _, _ = socket.recv_fds(self._sock, 4096, 1)
                except OSError:
                    self._drop()
                    if again:
                        raise
                    continue
                if not msg:  # the server is gone
                    self._drop()
                    if again:
                        raise ConnectionError("the job wrapper server exited")
                    continue
                text = msg.decode(errors="replace")
                if not fds:
                    raise OSError(text.removeprefix("error: "))
                for extra in fds[1:]:
                    os.close(extra)
                return int(text), fds[0]
        raise AssertionError("unreachable")

    def close(self) -> list[subprocess.Popen]:
        """Stop asking; returns the server processes still to reap (they exit on their own)."""
        with self._lock:
            self._drop()
            procs, self._retired = self._retired, []
            return [p for p in procs if p.poll() is None]

    def _start(self) -> None:
        self._retired = [p for p in self._retired if p.poll() is None]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                self._argv, stdin=theirs, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd="/", env=self._env, start_new_session=True, close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is not None:
            self._retired.append(self.proc)
        self.proc = None
