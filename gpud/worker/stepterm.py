"""What a step's stream needs beside its tasks: the checked bodies of ``step_ack``,
``step_input`` and ``step_resize``, and a terminal's side (controlling terminal, window
size, writes that must not block the loop).  See gpud.worker.steps."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import termios
from typing import Any, Callable

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


MAX_INPUT_CHUNK = 64 << 10    # characters of input in one step_input


def parse_stream(kind: str, body: Any) -> dict:
    """A ``step_ack``, ``step_input`` or ``step_resize`` body, checked; ValueError otherwise."""
    if not isinstance(body, dict):
        raise ValueError("body is not an object")
    out: dict[str, Any] = {}
    for key in ("job", "attempt", "step"):
        v = body.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
            raise ValueError(f"{key} must be a non-negative integer")
        out[key] = v
    ints = {"step_ack": (("next", 2**63 - 1),), "step_input": (("seq", 2**63 - 1),),
            "step_resize": (("rows", 65535), ("cols", 65535))}[kind]
    for key, hi in ints:
        v = body.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise ValueError(f"{key} must be an integer from 0 to {hi}")
        out[key] = v
    if kind == "step_ack":
        out["resend"] = body.get("resend") is True
    elif kind == "step_input":
        writer, data, eof = body.get("writer"), body.get("data", ""), body.get("eof", False)
        if not isinstance(writer, str) or not 0 < len(writer) <= 64:
            raise ValueError("writer must be a short string")
        if not isinstance(data, str) or len(data) > MAX_INPUT_CHUNK or not isinstance(eof, bool):
            raise ValueError(f"data must be text of at most {MAX_INPUT_CHUNK} characters, eof true or false")
        if any(ord(c) > 255 for c in data):
            raise ValueError("data must be bytes as latin-1 text")
        out.update(writer=writer, data=data, eof=eof)
    elif not (out["rows"] and out["cols"]):
        raise ValueError("rows and cols must be positive")
    return out
