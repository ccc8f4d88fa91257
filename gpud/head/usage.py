"""The head's ledger of fair-share usage: accrued every pass, persisted, surviving restarts.

The arithmetic (billing weights, exponential decay, exact integrals) is the pure core's
(``gpud.sched.usage``); this keeps the numbers between passes.  Usage is valued "as of"
``self.as_of``: every pass decays it to now and adds what the running jobs spent since; a
job that ended between two passes is charged at the next pass for the part of its run
after ``as_of``.  The dict is written to SQLite at most every ``save_interval`` seconds and
on shutdown, so a crash loses at most that much accrual, never a job.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sched.config import SchedConfig
from ..sched.snapshot import NodeView, RunningJob
from ..sched.usage import UsageKey, accrue, billing_rate, charge, prune
from .store import Store


@dataclass(frozen=True)
class _Ended:
    key: UsageKey
    rate: float
    start: float
    end: float


class UsageLedger:
    def __init__(self, save_interval: float = 30.0) -> None:
        self.usage: dict[UsageKey, float] = {}
        self.as_of: float | None = None
        self.save_interval = save_interval
        self._ended: list[_Ended] = []
        self._saved_at: float | None = None

    async def load(self, store: Store, now: float) -> None:
        usage, updated = await store.load_usage()
        self.usage = usage
        self.as_of = updated if updated is not None else now

    def job_ended(self, job: RunningJob, node: NodeView | None, end: float, cfg: SchedConfig) -> None:
        """Remember a job that stopped since the last pass, to charge it at the next one."""
        self._ended.append(_Ended((job.account, job.user), billing_rate(job, node, cfg), job.start_time, end))

    def advance(self, running: tuple[RunningJob, ...], nodes: tuple[NodeView, ...], cfg: SchedConfig,
                now: float) -> dict[UsageKey, float]:
        """Usage as of ``now``: decayed, plus what running and recently ended jobs spent."""
        t0 = self.as_of if self.as_of is not None else now
        if now < t0:  # the clock stepped back: keep the numbers, restart from here
            t0 = now
        usage = accrue(self.usage, running, nodes, cfg, t0, now)
        for e in self._ended:
            usage = charge(usage, e.key, e.rate, max(t0, e.start), e.end, now, cfg.fairshare_half_life)
        self._ended.clear()
        self.usage, self.as_of = prune(usage), now
        return self.usage

    async def maybe_save(self, store: Store, now: float, *, force: bool = False) -> None:
        if force or self._saved_at is None or now - self._saved_at >= self.save_interval:
            await store.save_usage(self.usage, self.as_of if self.as_of is not None else now)
            self._saved_at = now
