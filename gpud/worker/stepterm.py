"""A terminal step's side of its stream: the controlling terminal, the window size, and
writes that must not block the loop.  See gpud.worker.steps."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import termios
from typing import Callable

log = logging.getLogger("gpud.worker.steps")


def terminal_child(gate: int) -> Callable[[], None]:
    """In the child, after the session is made: the gate as descriptor 3, the terminal on
    descriptor 0 as the controlling one (what login and sshd do for a session)."""
    def child() -> None:
        os.dup2(gate, 3)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    return child


def set_size(fd: int, rows: int, cols: int) -> None:
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    except OSError as e:
        log.debug("cannot set a terminal's size: %s", e)


async def write_all(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    """Write to a terminal's master side without blocking the loop (it may be full)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
            view = view[n:]
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                loop.remove_writer(fd)
