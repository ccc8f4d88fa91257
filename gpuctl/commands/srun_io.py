"""A step's stream on the client side (srun, sattach): output out, input in, terminal size.

Output: long polls (``step_poll``) with the reader's cursor, the next item number it wants
from each node (gpud.head.steps).  The head may go away (a restart, a full socket backlog):
the reader reconnects for up to ``RECONNECT_FOR`` seconds and asks again from its cursor,
so nothing is lost or printed twice.  Lines of streams 1 and 2 go to standard output and
error; stream 3 is a terminal's raw bytes (latin-1 text), written as they are.

Input: a thread reads standard input and sends it in numbered chunks (``step_input``)
under a writer id of its own; a chunk the head did not take (it was away, or asked to
retry because task 0 is not reading) is sent again with the same number, and the worker
writes each number once.  On a terminal (``--pty``) the local terminal is put in raw
mode, so Ctrl-C, Ctrl-Z and Ctrl-D travel as bytes to the remote terminal, whose line
discipline makes them signals for its foreground job; SIGWINCH sends the new size
(``step_resize``), and so does a reconnect.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Any

from gpud.protocol import RemoteError

from ..client import Client, HeadUnavailable
from .common import CommandFailed

RECONNECT_FOR = 300.0      # seconds a reader keeps trying to reach a head that went away
RETRY_EVERY = 0.2          # seconds between tries
INPUT_CHUNK = 16 << 10     # bytes of input read and sent at a time


def window_size(fd: int) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size.lines, size.columns


class StepStream:
    """Print a step's output until it is done; forward input and window size if asked to."""

    def __init__(self, socket_path: str, job_id: int, step: int, *, verb: str = "srun", label: bool = False,
                 pty: bool = False, forward_input: bool | str = False, hints: dict[str, Any] | None = None) -> None:
        self.socket_path = socket_path
        self.job_id, self.step = job_id, step
        self.verb, self.label, self.pty = verb, label, pty
        self.forward_input = forward_input
        self.hints = dict(hints or {})
        self.cursor: dict[str, int] = {}
        self.offset, self.epoch = 0, None
        self.writer = os.urandom(8).hex()
        self._stop = threading.Event()
        self._resize = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._eol = "\r\n" if pty else "\n"   # a terminal in raw mode does not add the \r
        self.out = sys.stdout.buffer
        self.err = sys.stderr.buffer

    # -- output ---------------------------------------------------------------------------

    def run(self, client: Client) -> dict[str, Any]:
        """Read until the step is done; its last answer.  KeyboardInterrupt passes through."""
        if self.forward_input is True:
            threading.Thread(target=self._input, name="stdin", daemon=True).start()
        old = signal.signal(signal.SIGWINCH, self._on_winch) if self.pty else None
        raw: RawTerminal | None = None
        try:
            while True:
                answer = self._poll(client)
                if self.forward_input == "auto":   # sattach: as the step takes input
                    self.forward_input = bool(answer.get("stdin"))
                    if self.forward_input:
                        if answer.get("pty"):
                            raw = RawTerminal().__enter__()
                        threading.Thread(target=self._input, name="stdin", daemon=True).start()
                if answer.get("dropped"):
                    self.err.write(f"{self.verb}: warning: {answer['dropped']} line(s) of output were dropped "
                                   "(the head keeps 4 MiB per step)\n".encode())
                self._write(answer["lines"])
                self.cursor.update(answer.get("cursor") or {})
                self.offset, self.epoch = answer["offset"], answer.get("epoch")
                if answer["done"]:
                    return answer
        finally:
            self._stop.set()
            os.write(self._wake_w, b"x")
            if raw is not None:
                raw.__exit__()
            if old is not None:
                signal.signal(signal.SIGWINCH, old)

    def _poll(self, client: Client) -> dict[str, Any]:
        gone_since: float | None = None
        while True:
            try:
                answer = client.call("step_poll", job_id=self.job_id, step=self.step, offset=self.offset,
                                     epoch=self.epoch, cursor=self.cursor, **self.hints)
            except HeadUnavailable as e:
                client.close()
                now = time.monotonic()
                if gone_since is None:
                    gone_since = now
                    self.err.write(f"{self.verb}: warning: lost the head ({e}); reconnecting{self._eol}".encode())
                    self.err.flush()
                if now - gone_since > RECONNECT_FOR:
                    raise CommandFailed(f"the head did not come back within {RECONNECT_FOR:.0f}s; "
                                        f"step {self.job_id}.{self.step} may still run") from None
                time.sleep(RETRY_EVERY)
                continue
            if gone_since is not None:
                self.err.write(f"{self.verb}: reconnected to the head{self._eol}".encode())
                self.err.flush()
                self._resize.set()   # the size may have changed meanwhile
                os.write(self._wake_w, b"x")
            return answer

    def _write(self, lines: list) -> None:
        run: list[bytes] = []
        stream = 1
        for rank, fd, text in lines:
            if fd == 3:   # a terminal's bytes
                data, fd = text.encode("latin-1", errors="replace"), 1
            else:
                data = (f"{rank}: {text}" if self.label else text).encode("utf-8", errors="replace")
            if fd != stream and run:
                self._emit(stream, run)
                run = []
            stream = fd
            run.append(data)
        if run:
            self._emit(stream, run)

    def _emit(self, stream: int, run: list[bytes]) -> None:
        f = self.out if stream == 1 else self.err
        f.write(b"".join(run))
        f.flush()

    # -- input ----------------------------------------------------------------------------

    def _on_winch(self, signum: int, frame: Any) -> None:
        self._resize.set()
        os.write(self._wake_w, b"x")

    def _input(self) -> None:
        client = Client(self.socket_path)
        seq = 0
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([0, self._wake_r], [], [])
                if self._wake_r in ready:
                    os.read(self._wake_r, 512)
                if self._resize.is_set() and self.pty:
                    self._resize.clear()
                    size = window_size(0)
                    if size is not None:
                        self._send(client, "step_resize", rows=size[0], cols=size[1])
                if 0 not in ready or self._stop.is_set():
                    continue
                try:
                    data = os.read(0, INPUT_CHUNK)
                except OSError:
                    data = b""
                if not self._send(client, "step_input", writer=self.writer, seq=seq,
                                  data=data.decode("latin-1"), eof=not data):
                    return
                seq += 1
                if not data:
                    return
        finally:
            client.close()

    def _send(self, client: Client, op: str, **args: Any) -> bool:
        """One input or resize request, again until the head takes it; False: give up."""
        while not self._stop.is_set():
            try:
                answer = client.call(op, job_id=self.job_id, step=self.step, **args)
            except HeadUnavailable:
                client.close()
                time.sleep(RETRY_EVERY)
                continue
            except RemoteError:   # the step is gone or takes no input: reading stdin is moot
                return False
            if not answer.get("retry"):
                return True
        return False


class RawTerminal:
    """The local terminal in raw mode while a --pty step runs (restored however it ends)."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.saved: list | None = None

    def __enter__(self) -> "RawTerminal":
        import termios
        import tty

        if os.isatty(self.fd):
            self.saved = termios.tcgetattr(self.fd)
            tty.setraw(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        import termios

        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def stdin_is_null() -> bool:
    """No input worth forwarding: standard input is closed or /dev/null."""
    try:
        st = os.fstat(0)
        null = os.stat(os.devnull)
    except OSError:
        return True
    return (st.st_rdev, st.st_ino, st.st_dev) == (null.st_rdev, null.st_ino, null.st_dev)
