"""The executor's acknowledgements: tombstones written and directories removed off the loop.

The head acknowledges every outcome, so on a busy node acks come as fast as jobs end.  Each
one writes a tombstone and removes the allocation's directory (``JobStore.acknowledge`` and
``discard``), which is too slow for the event loop and too small for a thread of its own.
``AckWriter.add`` queues the key; the first key of a batch starts one thread, which writes
every key queued until the queue is empty (those added meanwhile too), all the tombstones
before the slow removals.  Until its tombstone is written an allocation's directory is still
there, so a repeated launch is refused either way.  Tombstones are pruned at most once per
``PRUNE_EVERY`` seconds of the injected clock, on the same thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from .jobstore import JobStore, Key

log = logging.getLogger("gpud.worker.executor")

PRUNE_EVERY = 3600.0            # seconds between tombstone prunes


class AckWriter:
    """Writes acknowledged allocations' tombstones on a thread, in batches."""

    def __init__(self, store: JobStore, clock: Callable[[], float]) -> None:
        self.store = store
        self._clock = clock
        self._last_prune = float("-inf")
        self._acked: deque[Key] = deque()   # acknowledged, tombstones not yet written
        self._writes: set[asyncio.Future] = set()   # threads writing them

    def pruned_now(self) -> None:
        """The store was just pruned (``JobStore.load`` does): the next prune is an hour away."""
        self._last_prune = self._clock()

    def add(self, key: Key) -> None:
        """Queue ``key``'s tombstone; written now when there is no event loop."""
        self._acked.append(key)
        if len(self._acked) > 1:   # a thread is on its way and takes this one too
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # no event loop: write it now
            self._write()
            return
        fut = loop.run_in_executor(None, self._write)
        self._writes.add(fut)
        fut.add_done_callback(self._writes.discard)

    async def settle(self) -> None:
        """Wait until every key added so far is on disk."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _write(self) -> None:
        """(thread) Tombstones for every key queued, including those added meanwhile,
        then the directories' files removed (the slow part, after all the tombstones)."""
        while self._acked:
            moved = []
            while self._acked:
                key = self._acked.popleft()
                try:
                    path = self.store.acknowledge(key)
                except Exception:  # noqa: BLE001 - the others still get theirs
                    log.exception("job %d.%d: cannot record its acknowledgement", *key)
                    continue
                if path is not None:
                    moved.append(path)
            for path in moved:
                self.store.discard(path)
        if self._clock() - self._last_prune >= PRUNE_EVERY:
            self._last_prune = self._clock()
            self.store.prune_tombstones()
