"""An in-process bus with MQTT's semantics: fast tests of head and worker logic, and the
hop between ``gpud standalone``'s head and its own worker (``gpud.bus.split``).

Theory of operation
-------------------
``MemoryBroker`` plays Mosquitto: it routes payloads between ``MemoryBus`` clients by
MQTT topic filters (``+``, ``#``), keeps retained messages, fires a client's last will
when the client is dropped (not when it closes cleanly), and keeps the sessions of
persistent clients, queueing their messages while they are away.  ``MemoryBus`` has the
API of ``MqttBus``: every payload is sealed and verified with ``gpud.bus.envelope``
exactly as on the wire, so forged, moved and replayed messages are dropped the same way,
and a test can inject raw bytes with ``MemoryBroker.inject``.

``MemoryBroker(signed=False)`` is for a broker no test injects into: ``gpud standalone``'s,
which only its own head and worker reach, from inside the process.  Its payloads are the
envelope's fields as plain JSON, neither sealed nor opened: a seal proves that a
message came from a key holder, and nothing outside the process can publish there at all.
What remains is the JSON round trip, so the receiver still gets exactly what the wire would
give it (lists for tuples, string keys).

Delivery is synchronous: when ``publish`` returns, every connected subscriber already
holds the message in its inbox, so tests need no waiting beyond reading ``messages()``.
Failures are under the test's control:

* ``broker.disconnect(name)``: drop a client abruptly; its will fires and it stays
  disconnected (publishes queue up) until ``broker.reconnect(name)``;
* ``broker.stop()`` / ``broker.start()``: a broker outage; every client is dropped (no
  wills: the broker itself went away) and reconnects when the broker is back.

``on_connect`` hooks run as tasks after each (re)connect, as with ``MqttBus``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

from .base import Message, Sendable, Will, topic_prefix, wire
from .envelope import RESEAL_AFTER, KeysLike, Keyring, Sealer, unsigned_payload
from .epoch import process_epoch
from .inbox import Inbox

log = logging.getLogger("gpud.bus")

MAX_QUEUED = 10_000          # per client, while disconnected (drop oldest past it)
MAX_SESSION_QUEUE = 100_000  # per persistent session, kept by the broker while away


def topic_matches(pattern: str, topic: str) -> bool:
    """MQTT filter matching: ``+`` is one level, a final ``#`` is any number (even zero)."""
    p_levels, t_levels = pattern.split("/"), topic.split("/")
    for i, p in enumerate(p_levels):
        if p == "#":
            return True
        if i >= len(t_levels):
            return False
        if p != "+" and p != t_levels[i]:
            return False
    return len(p_levels) == len(t_levels)


class _Session:
    """What the broker remembers about one client id."""

    def __init__(self, persistent: bool) -> None:
        self.persistent = persistent
        self.filters: list[str] = []
        self.queued: deque[tuple[str, bytes]] = deque(maxlen=MAX_SESSION_QUEUE)
        self.bus: MemoryBus | None = None       # connected client, if any


class MemoryBroker:
    """In-process stand-in for an MQTT broker.

    ``record=False`` keeps no ``published`` history: a long-lived process (``gpud
    standalone``) would otherwise keep every message.  ``signed=False``: see the module
    docstring.
    """

    def __init__(self, *, record: bool = True, signed: bool = True) -> None:
        self.up = True
        self.record = record
        self.signed = signed
        self.retained: dict[str, bytes] = {}        # full topic -> payload
        self._sessions: dict[str, _Session] = {}
        self._attached: list[MemoryBus] = []         # open buses, connected or not
        self.published: list[tuple[str, bytes, bool]] = []  # every routed (topic, payload, retain)

    # -- failure injection (synchronous, for tests) --------------------------------------------

    def clients(self) -> list[str]:
        """Client ids now connected."""
        return [cid for cid, s in self._sessions.items() if s.bus is not None]

    def disconnect(self, who: str) -> None:
        """Drop ``who`` (client id or sender) abruptly: its will fires; it stays down."""
        for bus in self._find(who):
            bus._held_down = True
            self._drop(bus, fire_will=True)

    def reconnect(self, who: str) -> None:
        """Let ``who`` connect again (after ``disconnect``)."""
        for bus in self._find(who):
            bus._held_down = False
            if self.up and not bus.connected:
                self._connect(bus)

    def stop(self) -> None:
        """The broker goes away: every client is dropped, without wills."""
        self.up = False
        for bus in list(self._attached):
            if bus.connected:
                self._drop(bus, fire_will=False)

    def start(self) -> None:
        """The broker is back: every open client reconnects."""
        self.up = True
        for bus in list(self._attached):
            if not bus.connected and not bus._held_down:
                self._connect(bus)

    def inject(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish raw bytes on a full topic, as an outsider could."""
        self._route(topic, payload, retain)

    # -- used by MemoryBus ---------------------------------------------------------------------

    def _find(self, who: str) -> list["MemoryBus"]:
        found = [b for b in self._attached if who in (b.client_id, b.sender)]
        if not found:
            raise KeyError(f"no client {who!r} on this broker")
        return found

    def _attach(self, bus: "MemoryBus") -> None:
        self._attached.append(bus)
        if self.up:
            self._connect(bus)

    def _detach(self, bus: "MemoryBus") -> None:
        """A clean close: no will; a persistent session stays."""
        if bus.connected:
            self._drop(bus, fire_will=False)
        if bus in self._attached:
            self._attached.remove(bus)

    def _connect(self, bus: "MemoryBus") -> None:
        session = self._sessions.get(bus.client_id)
        if session is not None and session.bus is not None and session.bus is not bus:
            # Takeover, as in MQTT: the older connection with this id is dropped.
            old = session.bus
            old._held_down = True
            self._drop(old, fire_will=True)
        if session is None or not (bus.persistent and session.persistent):
            session = self._sessions[bus.client_id] = _Session(bus.persistent)
        session.bus = bus
        session.filters = [bus.prefix + s for s in bus.subscriptions]
        will = bus._seal_will()
        bus._on_connected(will)
        for topic, payload in sorted(self.retained.items()):
            if any(topic_matches(f, topic) for f in session.filters):
                bus._deliver(topic, payload, retained=True)
        while session.queued:
            topic, payload = session.queued.popleft()
            bus._deliver(topic, payload, retained=False)
        bus._after_connect()

    def _drop(self, bus: "MemoryBus", *, fire_will: bool) -> None:
        session = self._sessions.get(bus.client_id)
        will = bus._will_payload
        bus._on_disconnected()
        if session is not None and session.bus is bus:
            session.bus = None
            if not session.persistent:
                del self._sessions[bus.client_id]
        if fire_will and will is not None:
            self._route(*will, retain=True)

    def _route(self, topic: str, payload: bytes, retain: bool) -> None:
        if not self.up:
            return
        if self.record:
            self.published.append((topic, payload, retain))
        if retain:
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)
        for session in list(self._sessions.values()):
            if not any(topic_matches(f, topic) for f in session.filters):
                continue
            if session.bus is not None:
                session.bus._deliver(topic, payload, retained=False)
            elif session.persistent:
                session.queued.append((topic, payload))


class MemoryBus:
    """The ``Bus`` protocol over a ``MemoryBroker``; same constructor shape as ``MqttBus``."""

    def __init__(
        self,
        broker: MemoryBroker,
        cluster: str,
        sender: str,
        key: KeysLike,
        subscriptions: Iterable[str] = (),
        will: Will | None = None,
        *,
        client_id: str | None = None,
        persistent: bool = False,
        clock: Callable[[], float] = time.time,
        epoch: int | None = None,
        max_skew: float = 120.0,
        max_queued: int = MAX_QUEUED,
        inbox: Inbox | None = None,
    ) -> None:
        self.broker = broker
        self.cluster = cluster
        self.sender = sender
        self.prefix = topic_prefix(cluster)
        self.subscriptions = list(subscriptions)
        self.will = will
        self.client_id = client_id or sender
        self.persistent = persistent
        self.on_connect: Callable[[], Awaitable[None]] | None = None
        self._key = Keyring.of(key)
        self._sealer = Sealer(self._key, sender, epoch=process_epoch() if epoch is None else epoch)
        self._clock = clock
        self._max_queued = max_queued
        self._outbox: deque[tuple[str, bytes, bool, float]] = deque()
        # A shared inbox (gpud.bus.split) belongs to the bus that shares it: it closes it.
        self._owns_inbox = inbox is None
        self._inbox = inbox if inbox is not None else Inbox(self._key, self.prefix, max_skew=max_skew)
        self._connected = asyncio.Event()
        self._will_payload: tuple[str, bytes] | None = None
        self._held_down = False
        self._open = False
        self._closed = False
        self._hooks: set[asyncio.Task] = set()
        self.dropped = 0
        self.connects = 0

    # -- the Bus protocol ----------------------------------------------------------------------

    async def __aenter__(self) -> "MemoryBus":
        if self._open or self._closed:
            raise RuntimeError("MemoryBus is not reentrant")
        self._open = True
        self.broker._attach(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, topic: str, message: Sendable, body: dict[str, Any] | None = None, *,
                      retain: bool = False) -> None:
        kind, body = wire(message, body)
        if self._closed:
            log.warning("bus: closed; dropped %s message for %s", kind, topic)
            return
        now = self._clock()
        self._send(topic, self._payload(kind, body, topic, now), retain, now)

    async def clear_retained(self, topic: str) -> None:
        if not self._closed:
            self._send(topic, b"", True, self._clock())

    def messages(self) -> AsyncIterator[Message]:
        return self._inbox.messages()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    # -- extras (as on MqttBus) ----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def pending(self) -> int:
        return len(self._outbox)

    async def flush(self, timeout: float | None = None) -> bool:
        """Delivery is synchronous: only messages queued while disconnected are pending."""
        return not self._outbox

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._open:
            self.broker._detach(self)
        self._connected.clear()
        hooks = {t for t in self._hooks if not t.done()}
        for _ in range(100):
            if not hooks:
                break
            for t in hooks:
                t.cancel()
            _, hooks = await asyncio.wait(hooks, timeout=0.05)
        if self._owns_inbox:
            self._inbox.close()

    # -- broker callbacks ----------------------------------------------------------------------

    def _payload(self, kind: str, body: dict[str, Any], topic: str, now: float) -> bytes:
        if self.broker.signed:
            return self._sealer.seal(kind, body, now=now, topic=topic)
        return unsigned_payload(self.sender, kind, body, now=now, topic=topic)

    def _seal_will(self) -> tuple[str, bytes] | None:
        if self.will is None:
            self._sealer.new_connection()
            return None
        w = self.will
        if not self.broker.signed:
            return self.prefix + w.topic, self._payload(w.kind, w.body, w.topic, self._clock())
        return self.prefix + w.topic, self._sealer.seal_will(w.kind, w.body, now=self._clock(), topic=w.topic)

    def _on_connected(self, will: tuple[str, bytes] | None) -> None:
        self._will_payload = will
        self._connected.set()
        self.connects += 1

    def _after_connect(self) -> None:
        while self._outbox and self.connected:
            topic, payload, retain, sealed_at = self._outbox.popleft()
            if payload and self.broker.signed and self._clock() - sealed_at > RESEAL_AFTER:
                payload = self._sealer.reseal(payload, now=self._clock(), topic=topic)
            self.broker._route(self.prefix + topic, payload, retain)
        if self.on_connect is not None:
            task = asyncio.get_running_loop().create_task(self._run_hook(self.on_connect))
            self._hooks.add(task)
            task.add_done_callback(self._hooks.discard)

    def _on_disconnected(self) -> None:
        self._connected.clear()
        self._will_payload = None

    def _send(self, topic: str, payload: bytes, retain: bool, sealed_at: float) -> None:
        if self.connected:
            self.broker._route(self.prefix + topic, payload, retain)
            return
        self._outbox.append((topic, payload, retain, sealed_at))
        while len(self._outbox) > self._max_queued:
            lost = self._outbox.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("bus: outbox full while disconnected; dropped the oldest message "
                            "(topic %s; %d dropped so far)", lost[0], self.dropped)

    def _deliver(self, full_topic: str, payload: bytes, *, retained: bool) -> None:
        if self._closed:
            return
        if self.broker.signed:
            self._inbox.accept(full_topic, payload, retained, self._clock())
        else:
            self._inbox.accept_unsigned(full_topic, payload, retained)

    async def _run_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        try:
            await hook()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("bus: on_connect hook failed")
