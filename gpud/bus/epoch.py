"""This process's bus epoch: what makes its messages newer than its predecessor's.

Receivers compare a sender's epochs only with each other (``gpud.bus.envelope``), so the
epoch must grow from one run of a sender to the next, never go back.  It is the process's
start on its own wall clock in nanoseconds, and, when the daemon has a state directory,
at least one more than the epoch recorded there by the previous run: a clock stepped back
between two runs then still gives a newer epoch.  Without a writable file (a relay on a
login node) the clock alone decides, which holds unless the clock went back across a
restart by more than the previous run lasted.

One epoch per process: the buses of one process share it (and the sequence numbers).
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("gpud.bus")

_epoch: int | None = None


def process_epoch(state_file: str | None = None, *, clock_ns=time.time_ns) -> int:
    """The process's epoch, chosen at the first call; ``state_file`` keeps the floor."""
    global _epoch
    if _epoch is None:
        epoch = clock_ns()
        if state_file:
            epoch = max(epoch, _read(state_file) + 1)
            _write(state_file, epoch)
        _epoch = epoch
    return _epoch


def _read(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    except OSError as e:
        log.warning("bus: cannot read the epoch file %s (%s); using the clock alone", path, e.strerror)
        return 0
    with os.fdopen(fd, "rb") as f:
        text = f.read(64).strip()
    try:
        return max(0, int(text))
    except ValueError:
        log.warning("bus: ignoring the malformed epoch file %s", path)
        return 0


def _write(path: str, epoch: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning("bus: cannot record the epoch in %s (%s); a clock stepped back before the next "
                    "start could make peers refuse it", path, e.strerror)
        try:
            os.unlink(tmp)
        except OSError:
            pass
