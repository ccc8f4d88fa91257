"""The worker's self-fencing: it runs jobs only while it holds the head's lease.

``Fencing`` keeps the lease (gpud.worker.lease) and acts on it:

* at start it resumes the lease a previous worker on this boot held, so adopted jobs
  live exactly as long as they would have (an upgrade from a worker without leases, with
  jobs running, gets a provisional one), and it keeps the lease file the job wrappers
  watch up to date;
* its loop kills every allocation once the lease lapses;
* it decides whether a launch may start: never under a lapsed lease, and after every
  (re)connect the launches that arrive are held until the head's answer to the
  announcement's heartbeat says which allocations are still this node's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from . import lease as leases

if TYPE_CHECKING:
    from ..bus.messages import Launch, Lease

log = logging.getLogger("gpud.worker")

LEASE_EXPIRED = "lease_expired"    # the end reason of a job killed because the lease lapsed
ADOPTED_LEASE = 300.0          # s: jobs found with no lease file (an upgrade) get this long to hear the head
MAX_PARKED = 10_000            # launches held after a reconnect, waiting for the head's answer


class Fencing:
    def __init__(self, name: str, state_dir: str, *, mono: Callable[[], float],
                 executor: Callable[[], Any]) -> None:
        self.name = name
        self.state_dir = state_dir
        self.mono = mono
        self._executor = executor         # made when the worker runs
        self.lease = leases.Lease()
        # After a (re)connect, launches wait here until the answer to a heartbeat numbered
        # at least ``hold_from`` says which allocations are still ours; None: not holding.
        self.hold_from: int | None = None
        self.parked: dict[tuple[int, int], "Launch"] = {}
        self.changed = asyncio.Event()    # the lease moved: the loop looks again

    def resume(self) -> None:
        """At start: the lease a previous worker on this boot held, so adopted jobs live
        exactly as long as they would have; none on record and jobs found (an upgrade from a
        worker without leases): a provisional one."""
        saved = leases.load(self.state_dir)
        if saved is not None:
            self.lease.until = saved
        elif self._executor().running():
            self.lease.until = self.mono() + ADOPTED_LEASE
            self._save()

    def _save(self) -> None:
        try:
            os.makedirs(self.state_dir, exist_ok=True)
            leases.save(self.state_dir, self.lease.until)
        except OSError as e:   # the daemon still fences; the wrappers keep the last lease they saw
            log.error("worker %s: cannot save its lease: %s", self.name, e)

    async def run(self) -> None:
        """Self-fencing: once the lease lapses, nothing runs here."""
        while True:
            now = self.mono()
            if not self.lease.held(now):
                self.parked.clear()
                executor = self._executor()
                running = list(executor.running())
                if running:
                    log.error("worker %s: no lease from the head for %s; killing its %d job(s)", self.name,
                              f"{self.lease.period:g}s" if self.lease.period else "too long", len(running))
                for job, attempt in running:
                    try:
                        await executor.kill(job, attempt, reason=LEASE_EXPIRED)
                    except Exception as e:  # noqa: BLE001 - one failure must not spare the others
                        log.error("worker %s: could not kill job %s.%s: %s", self.name, job, attempt, e)
            self.changed.clear()
            wait = self.lease.until - now if self.lease.held(now) else 1.0
            try:
                await asyncio.wait_for(self.changed.wait(), min(1.0, max(0.01, wait)))
            except asyncio.TimeoutError:
                pass

    def next_seq(self) -> int:
        """The number for a heartbeat sent now."""
        return self.lease.next_seq(self.mono())

    def hold_launches(self) -> None:
        """Just (re)connected: launches queued for us while we were away may be stale; hold
        what arrives until the head answers the heartbeat that is about to go out."""
        self.hold_from = self.lease.last_seq + 1

    def renewed(self, lease: "Lease") -> None:
        """The head's answer to a heartbeat: the lease runs on from that heartbeat's send."""
        if self.lease.renewed(lease.seq, lease.period):
            self._save()
            self.changed.set()

    async def release(self, lease: "Lease", launch: Callable[["Launch"], Awaitable[None]]) -> None:
        """The answer the held launches waited for: ``launch`` those still ours, drop the rest."""
        if self.hold_from is not None and lease.seq >= self.hold_from:
            self.hold_from = None
            ours = set(lease.allocs)
            parked, self.parked = self.parked, {}
            for key, held in parked.items():
                if key in ours:
                    await launch(held)
                else:
                    log.warning("job %s.%s: a launch queued while %s was away is no longer ours; "
                                "not started", *key, self.name)

    def may_start(self, launch: "Launch") -> bool:
        """Whether ``launch`` may start now; one that arrived while holding is parked."""
        key = (launch.job_id, launch.attempt)
        if self.hold_from is not None:   # just reconnected: ask the head first
            if len(self.parked) < MAX_PARKED:
                self.parked[key] = launch
            return False
        if not self.lease.launch_ok(launch.lease_seq, self.mono()):
            log.warning("job %s.%s: launch under a lapsed lease; not started (the head re-sends "
                        "launches that are still valid)", *key)
            return False
        return True
