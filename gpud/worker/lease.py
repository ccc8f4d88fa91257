"""The worker's lease from the head: how long it may go on running jobs without hearing it.

Theory of operation
-------------------
Each heartbeat carries a sequence number; the head answers it with ``lease`` {seq, period,
allocs}.  The lease then runs to *the time that heartbeat was sent* plus ``period``, on this
host's monotonic clock.  The head counts its own copy from when it *answered*, which is
later, on its own monotonic clock, and waits a margin more before it starts a job elsewhere:
no two clocks are ever compared, and the worker's lease always ends first.

While the lease holds, jobs run.  When it lapses the worker kills every allocation
(self-fencing), and each job's wrapper does the same on its own from ``lease`` in the state
directory, so a stopped or hung worker daemon cannot leave a job running past it.  A launch
names the heartbeat its lease was granted on: one whose lease has lapsed is never started.

The file holds the monotonic time the lease ends, one number, written atomically.  The
monotonic clock counts from boot, so the value holds for a restarted worker on the same boot
(it adopts its jobs under the lease they had) and for the wrappers, which read it directly.

Pure bookkeeping, ``now`` passed in; the daemon does the I/O.
"""

from __future__ import annotations

import os
import secrets

SENT_KEPT = 256          # heartbeats remembered for matching answers (a few minutes' worth)
FILE_NAME = "lease"


class Lease:
    def __init__(self, until: float = float("-inf")) -> None:
        self.until = until                       # monotonic time the lease ends
        self.period: float | None = None         # the head's lease, once heard
        self._next = secrets.randbits(40)        # a fresh range per process: old answers match nothing
        self._sent: dict[int, float] = {}        # seq -> monotonic time sent

    def next_seq(self, now: float) -> int:
        """The number for a heartbeat sent at ``now``."""
        seq = self._next
        self._next += 1
        self._sent[seq] = now
        if len(self._sent) > SENT_KEPT:
            del self._sent[next(iter(self._sent))]
        return seq

    @property
    def last_seq(self) -> int:
        """The number the next heartbeat will carry, less one."""
        return self._next - 1

    def renewed(self, seq: int, period: float) -> bool:
        """The head answered heartbeat ``seq``: the lease runs to its send time plus
        ``period``.  False for an answer to no heartbeat of ours (or one that adds nothing)."""
        sent = self._sent.get(seq)
        if sent is None:
            return False
        self.period = period
        if sent + period <= self.until:
            return False
        self.until = sent + period
        return True

    def held(self, now: float) -> bool:
        return now < self.until

    def launch_ok(self, seq: int | None, now: float) -> bool:
        """May a launch granted on heartbeat ``seq`` (None: the head named none) start now?"""
        if not self.held(now):
            return False
        if seq is None:
            return True
        sent = self._sent.get(seq)
        return sent is not None and self.period is not None and now < sent + self.period


def load(state_dir: str) -> float | None:
    """The lease end saved in ``state_dir``; None when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(state_dir, FILE_NAME), encoding="ascii") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def save(state_dir: str, until: float) -> None:
    path = os.path.join(state_dir, FILE_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{until:.6f}\n")
    os.replace(tmp, path)
