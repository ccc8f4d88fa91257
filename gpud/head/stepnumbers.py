"""The numbers of a job's srun steps, the one durable part of a step.  See gpud.head.steps.

Each launch is a ``step`` event in the job's log, committed before anything starts
(``next``); a restarted head counts those events the first time it needs a job's numbers
(``count``), numbers on from there, and adopts only a step whose number was given out
(``issued``).  Workers ignore a step command they have already seen (same job, attempt and
step), so a number is never given out twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Iterable

from ..ctlsocket import Caller, RequestError
from .store import Txn

if TYPE_CHECKING:
    from .store import JobRecord, Store

log = logging.getLogger("gpud.steps")


class StepNumbers:
    """The next step number of each job this head has seen a step of.  Given the store (its
    job events read, the step events committed) and a getter for the wall clock."""

    def __init__(self, store: "Store", *, clock: Callable[[], float]) -> None:
        self.store = store
        self._clock = clock              # the head's, read at call time (tests swap it)
        self._next: dict[int, int] = {}        # job id -> next step id
        self._lock = asyncio.Lock()            # one step number read and recorded at a time

    def known(self, job_id: int) -> bool:
        return job_id in self._next

    def issued(self, job_id: int, step_id: int) -> bool:
        """Was ``step_id`` given out (by this head, or before it started)?  The job's step
        events are counted first (``count``)."""
        nxt = self._next.get(job_id)
        return nxt is not None and step_id < nxt

    async def count(self, job: "JobRecord") -> None:
        """Count the job's step events, unless this head knows its numbers already."""
        async with self._lock:
            if job.job_id not in self._next:
                events = await self.store.job_events(job.job_id)
                self._next[job.job_id] = sum(1 for e in events if e["event"] == "step")

    async def next(self, job: "JobRecord", caller: Caller, ntasks: int, argv: list[str]) -> int:
        """The job's next step number, recorded in its event log before anything starts."""
        async with self._lock:
            if job.job_id not in self._next:   # first step since this head started
                events = await self.store.job_events(job.job_id)
                self._next[job.job_id] = sum(1 for e in events if e["event"] == "step")
            step_id = self._next[job.job_id]
            txn = Txn(self.store)
            txn.event(job, self._clock(), "step",
                      f"{step_id}: {ntasks} task(s) by {caller.user}: {' '.join(argv)}"[:300])
            try:
                await self.store.commit(txn)
            except Exception as e:   # the disk said no: nothing was started
                log.exception("job %d: cannot record step %d", job.job_id, step_id)
                raise RequestError(f"srun: cannot record the step: database error: {e}") from None
            self._next[job.job_id] = step_id + 1
            return step_id

    def forget(self, live: Iterable[int]) -> None:
        """Drop the numbers of every job not in ``live``."""
        keep = set(live)
        for jid in [j for j in self._next if j not in keep]:
            del self._next[jid]
