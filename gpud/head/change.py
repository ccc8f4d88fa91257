"""One door for changing the head's state: ``async with head.change() as ch``.

Every change of jobs or nodes made outside a scheduler pass has the same shape: take the
head's lock, read the clock, build one transaction, commit it, then act on what was
committed: bill ended allocations, signal or tell workers, wake the scheduler.  Written
out by hand that sequence is easy to get subtly wrong (a message sent before its commit,
a wake-up forgotten on one path, a lock held across a publish); a ``Change`` does it in
one place.  The caller only *records* what should follow (``tell``, ``signal``, ``ended``,
``wake``, ``then``); ``__aexit__`` commits and then runs it, in that order:

1. commit ``ch.txn`` under the lock; an exception in the block or
   in the commit leaves nothing done, nothing told, and propagates;
2. still under the lock, the bookkeeping that must not race the next change
   (``ended``: fair-share billing and the resend timers of ended allocations);
3. the lock released, the messages in the order they were recorded (``tell``,
   ``signal``, ``then``), then the scheduler's wake-up.

A message that cannot be published is logged and the rest still go: the change is
committed, and every message the head sends is re-sent or reconciled by its own timer
(launch and stop resends, lease renewals, acks on re-report).
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .store import Txn

if TYPE_CHECKING:
    from ..bus.messages import Body
    from .daemon import Head
    from .store import JobRecord

log = logging.getLogger("gpud.head")


class Change:
    def __init__(self, head: "Head") -> None:
        self._head = head
        self.now = 0.0
        self.txn = Txn(head.store)
        self._ended: list[tuple["JobRecord", float]] = []
        self._after: list[Callable[[], Awaitable[Any]]] = []
        self._wake = False

    async def __aenter__(self) -> "Change":
        await self._head.lock.acquire()
        self.now = self._head.clock()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        head = self._head
        try:
            if exc_type is not None:
                return
            await head.store.commit(self.txn)   # nothing to do for an empty one
            for job, end in self._ended:
                head.allocation_ended(job, end)
        finally:
            head.lock.release()
        for act in self._after:
            try:
                await act()
            except Exception:   # committed: its own timer re-sends or reconciles it
                log.exception("after a committed change: could not send")
        if self._wake:
            head.kick()

    # -- what follows the commit -----------------------------------------------------------

    def tell(self, topic: str, message: "Body", *, retain: bool = False) -> None:
        """Publish ``message`` (a ``gpud.bus.messages`` class) on ``topic`` once committed."""
        self._after.append(lambda: self._head.bus.publish(topic, message, retain=retain))

    def signal(self, job: "JobRecord", sig: str, *, grace: float | None, reason: str,
               nodes: list[str] | None = None) -> None:
        """``sig`` to ``job`` on its nodes once committed (``WorkerCommands.send_signal``)."""
        self._after.append(lambda: self._head.commands.send_signal(job, sig, grace=grace, reason=reason, nodes=nodes))

    def then(self, act: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Any other step that must follow the commit, after the lock is released:
        ``act(*args, **kwargs)``, awaited if it is a coroutine function."""
        async def run() -> None:
            result = act(*args, **kwargs)
            if inspect.isawaitable(result):
                await result
        self._after.append(run)

    def ended(self, job: "JobRecord", end: float) -> None:
        """``job``'s allocation ended at ``end`` (bill it, stop its resend timers)."""
        self._ended.append((job, end))

    def wake(self) -> None:
        """Run a scheduler pass soon: resources were freed or jobs became eligible."""
        self._wake = True
