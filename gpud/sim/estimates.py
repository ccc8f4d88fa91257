"""Time limits for trace jobs that have none, set the way users set them.

Theory of operation
-------------------
Backfill plans with time limits, never with run times it cannot know, so how well it
works depends on how good the limits are.  Real traces rarely carry them; this module
gives each job without a ``time_limit_s`` one of three kinds of limit:

* ``user`` (the default): what people write in ``-t``.  They guess long, then round up
  to a value that looks right: the run time times an over-estimate factor, rounded up to
  the next of 5, 10, 15 or 30 minutes, 1, 2, 4, 8 or 12 hours, 1, 2, 3 or 7 days (then
  whole weeks).  The factor varies per job, evenly spread around ``overestimate`` (from
  1 to ``2 * overestimate - 1``), drawn from the job's position in the trace so that
  every run of one trace gets the same limits.
* ``exact``: the run time itself (a perfect guess, backfill's best case).
* ``max``: the partition's ``max_time`` (what a user who never sets ``-t`` gets when the
  site sets no default), or unlimited when there is none: backfill's worst case.

Any limit is capped at the partition's ``max_time``; a job longer than that then ends
``TIMEOUT``, as it would on the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Estimates", "MODES", "ROUND_LIMITS"]

MODES = ("user", "exact", "max")
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
ROUND_LIMITS = (5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE, HOUR, 2 * HOUR, 4 * HOUR,
                8 * HOUR, 12 * HOUR, DAY, 2 * DAY, 3 * DAY, 7 * DAY)
WEEK = 7 * DAY


@dataclass(frozen=True)
class Estimates:
    mode: str = "user"
    overestimate: float = 2.0     # mean factor between a user's limit and the run time

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown time limit model {self.mode!r}: use one of {', '.join(MODES)}")
        if not self.overestimate >= 1.0:
            raise ValueError(f"the over-estimate factor must be at least 1, not {self.overestimate!r}")

    def limit(self, seq: int, duration: float, max_time: float | None) -> float | None:
        """The limit of the ``seq``-th trace job that runs ``duration`` seconds."""
        if self.mode == "max":
            return max_time
        if self.mode == "exact":
            limit = max(duration, 1.0)
        else:
            limit = round_up(duration * self.factor(seq))
        return limit if max_time is None else min(limit, max_time)

    def factor(self, seq: int) -> float:
        # A fixed integer hash (Knuth's multiplicative): Python's hash() differs per process.
        u = ((seq * 2654435761) & 0xFFFFFFFF) / 2 ** 32
        return 1.0 + (self.overestimate - 1.0) * 2.0 * u


def round_up(seconds: float) -> float:
    """The first round value at or above ``seconds``: what people type after ``-t``."""
    for v in ROUND_LIMITS:
        if seconds <= v:
            return v
    weeks = -(-seconds // WEEK)
    return weeks * WEEK
