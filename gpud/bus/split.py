"""The bus of a head whose worker shares its process (``gpud standalone``).

Theory of operation
-------------------
Every job costs four messages between the head and the worker that runs it (``launch``,
``started``, ``finished``, ``ack``).  Through a broker each one is sealed, written to a
socket, routed, acknowledged and read back, and in ``gpud standalone`` all of that runs on
the one event loop that also schedules and runs the jobs.  When the worker is in the same
process, nothing outside it needs to see those messages, so ``SplitBus`` gives the head
two transports that feed one ``Inbox``:

* ``local``: a ``MemoryBus`` on the process's own ``MemoryBroker``, where the worker's
  ``MemoryBus`` is too; delivery is a function call;
* ``remote``: the ``MqttBus`` to the broker, for everyone outside the process: relays
  (``gpud relay``, a worker's ``relay_socket``) and other workers pointed at the broker.

What the head publishes goes by topic: the local worker's ``node/<name>/cmd`` only in the
process, ``head/status`` both ways (relays and the local worker both follow it), the rest
(replies to relays, other nodes' commands) only over MQTT.  The head reads one stream with
one replay cache whichever way a message came.

In the process, messages are neither sealed nor opened (``MemoryBroker(signed=False)``):
only the head and the worker of this process can reach that broker, and they hold the
same key anyway.  Sealing and opening a launch costs about 80-140 us (docs/benchmarks.md),
against 25 us for the plain JSON round trip that stays, so the receiver still sees exactly
what the wire would carry.  What comes over MQTT is opened and checked as always.  ``connected``, ``on_connect`` and ``flush`` are
the MQTT side's: the local side is connected while the bus is open.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

from .base import HEAD_STATUS, Message, Sendable
from .inbox import Inbox


class SplitBus:
    """A ``gpud.bus.base.Bus`` over a local ``MemoryBus`` and a remote ``MqttBus``.

    Both must have been built with ``inbox=inbox``; the split bus owns that inbox and
    closes it.  ``local_topics``: topic suffixes only in-process parties read.
    """

    BOTH = frozenset({HEAD_STATUS})

    def __init__(self, local: Any, remote: Any, inbox: Inbox, local_topics: Iterable[str]) -> None:
        self.local = local
        self.remote = remote
        self._inbox = inbox
        self.local_topics = frozenset(local_topics)

    @property
    def on_connect(self) -> Callable[[], Awaitable[None]] | None:
        return self.remote.on_connect

    @on_connect.setter
    def on_connect(self, hook: Callable[[], Awaitable[None]] | None) -> None:
        self.remote.on_connect = hook

    async def __aenter__(self) -> "SplitBus":
        await self.local.__aenter__()
        try:
            await self.remote.__aenter__()
        except BaseException:
            await self.local.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, topic: str, message: Sendable, body: dict[str, Any] | None = None, *,
                      retain: bool = False) -> None:
        if topic in self.local_topics:
            await self.local.publish(topic, message, body, retain=retain)
            return
        if topic in self.BOTH:
            await self.local.publish(topic, message, body, retain=retain)
        await self.remote.publish(topic, message, body, retain=retain)

    async def clear_retained(self, topic: str) -> None:
        if topic in self.local_topics or topic in self.BOTH:
            await self.local.clear_retained(topic)
        if topic not in self.local_topics:
            await self.remote.clear_retained(topic)

    def messages(self) -> AsyncIterator[Message]:
        return self._inbox.messages()

    async def wait_connected(self) -> None:
        await self.remote.wait_connected()

    @property
    def connected(self) -> bool:
        return self.remote.connected

    @property
    def connects(self) -> int:
        return self.remote.connects

    @property
    def pending(self) -> int:
        return self.remote.pending

    async def flush(self, timeout: float | None = None) -> bool:
        return await self.remote.flush(timeout)

    async def close(self) -> None:
        try:
            await self.remote.close()
        finally:
            await self.local.close()
            self._inbox.close()
