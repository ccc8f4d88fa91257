"""The receiving end every bus shares: verify, queue, hand to one reader.

``MqttBus`` and ``MemoryBus`` differ in how bytes arrive; from there on they must behave
the same (the fake is only worth its tests if it does), so both hand each payload to an
``Inbox``: it opens the envelope (seal, epoch and sequence; retained messages and wills
by their rank), drops what fails with one log line, and queues the rest for ``messages()``.
Two buses may share one inbox (``gpud.bus.split``): one reader, one replay cache.  An
in-process broker's unsigned payloads (``MemoryBroker(signed=False)``) are only parsed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from .base import Message
from .envelope import EnvelopeError, KeysLike, Verifier, may_be_stale, open_unsigned

log = logging.getLogger("gpud.bus")

_CLOSED: Any = object()


class Inbox:
    def __init__(self, key: KeysLike, prefix: str, *, max_skew: float, limit: int | None = None) -> None:
        self.prefix = prefix
        self.verifier = Verifier(key, max_skew=max_skew)
        self.limit = limit              # None: unbounded (the in-memory fake)
        self.dropped = 0                # verified messages dropped because the reader lags
        self._queue: asyncio.Queue[Message] = asyncio.Queue()

    def accept(self, full_topic: str, payload: Any, retained: bool, now: float) -> None:
        """Verify one incoming payload and queue it; never raises."""
        if not full_topic.startswith(self.prefix):
            log.warning("bus: dropped message on %s: outside %s", full_topic, self.prefix)
            return
        topic = full_topic[len(self.prefix):]
        if not payload:
            return  # a retained message being cleared
        if not isinstance(payload, (bytes, bytearray)):
            payload = str(payload).encode()
        try:
            env = self.verifier.open(payload, now=now, topic=topic, allow_stale=may_be_stale(topic, retained))
        except EnvelopeError as e:
            # QoS 1 repeats are normal (redelivery, retained copies): not worth a warning.
            quiet = e.reason.startswith("replayed") or e.reason.startswith("older than the status")
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "bus: dropped message on %s: %s", topic, e.reason)
            return
        self._put(env.message(retained=retained))

    def accept_unsigned(self, full_topic: str, payload: bytes, retained: bool) -> None:
        """Queue one payload from an in-process sender (``MemoryBroker(signed=False)``, which
        nothing outside the process can reach): parsed, not verified; never raises."""
        if not payload:
            return  # a retained message being cleared
        try:
            env = open_unsigned(payload, full_topic[len(self.prefix):])
        except EnvelopeError as e:
            log.warning("bus: dropped message on %s: %s", full_topic, e.reason)
            return
        self._put(env.message(retained=retained))

    def _put(self, msg: Message) -> None:
        if self.limit is not None and self._queue.qsize() >= self.limit:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("bus: inbox full (reader too slow); dropped %s from %s (%d so far)",
                            msg.kind, msg.sender, self.dropped)
            return
        self._queue.put_nowait(msg)

    async def messages(self) -> AsyncIterator[Message]:
        """Verified messages until ``close``.  Meant for one reader."""
        while True:
            msg = await self._queue.get()
            if msg is _CLOSED:
                self._queue.put_nowait(_CLOSED)  # any other reader ends too
                return
            yield msg

    def close(self) -> None:
        self._queue.put_nowait(_CLOSED)

    def drain(self) -> list[Message]:
        """What is queued now, without waiting (tests)."""
        out = []
        while not self._queue.empty():
            msg = self._queue.get_nowait()
            if msg is not _CLOSED:
                out.append(msg)
        return out
