"""The MQTT bus: gpud's only aiomqtt adapter.

Theory of operation
-------------------
``MqttBus`` owns one background task, the *connection loop*: connect, subscribe, run a
session, and when the session ends for any reason other than ``close``, wait (exponential
backoff with jitter) and connect again, forever.  A fresh aiomqtt client is built for each
attempt, so nothing from a broken connection leaks into the next one; with
``persistent=True`` the broker keeps the session (subscriptions and QoS 1 messages
published meanwhile) under a stable client id, and redelivers on reconnect.

A session runs three kinds of task until the first one fails:

* the *receiver* reads the client's messages, opens each (``envelope.Verifier``) and
  puts good ones on the inbox that ``messages()`` reads; bad ones are logged and dropped;
* ``SENDERS`` *senders* take messages from the outbox and publish them at QoS 1, each
  waiting for its PUBACK, so up to ``SENDERS`` messages are in flight at once;
* the ``on_connect`` hook, if the daemon set one (it re-announces itself).

``publish`` never touches the network: it seals the message (``envelope.Sealer``: encrypted,
with this process's epoch and next sequence number) and puts it in the outbox,
so a daemon's tasks never wait inside aiomqtt, where a cancellation can be lost on
Python 3.11 (CPython gh-86296).  A message leaves the outbox only when the broker has
acknowledged it; when a connection drops, the messages in flight go back to the front
of the queue in their original order and are sent again after reconnecting (QoS 1 is at
least once anyway; the ids let receivers drop repeats).  While connected and full the
outbox makes ``publish`` wait (back-pressure); while disconnected it keeps the newest
``max_queued`` messages and drops the oldest with a warning.  A message that waited
longer than ``RESEAL_AFTER`` is re-sealed with a new timestamp (same id and sequence number)
before sending, so a long outage does not make it stale to a receiver meeting its sender
for the first time.

The will is sealed at each connect (it starts the connection's numbering, so it outranks
this connection's statuses; see ``gpud.bus.envelope``) and published, retained, by the broker if the
connection drops without a DISCONNECT.  ``close`` first flushes the outbox (bounded by
``close_timeout``), then ends the session with a clean DISCONNECT, so a graceful exit
never fires the will: daemons publish their own "offline" status first.  Every task is
stopped with a bounded loop that re-cancels until it is done (the 3.11 bug again).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable
from urllib.parse import urlsplit

import aiomqtt

from .base import Message, Sendable, Will, topic_prefix, wire
from .envelope import RESEAL_AFTER, KeysLike, Keyring, Sealer
from .epoch import process_epoch
from .inbox import Inbox

log = logging.getLogger("gpud.bus")

SENDERS = 32                # messages in flight at once, each awaiting its PUBACK
MAX_QUEUED = 10_000         # outbox size; past it: back-pressure if connected, else drop oldest
MAX_INBOX = 100_000         # verified messages not yet read by messages(); past it: drop
PUBLISH_TIMEOUT = 15.0      # no PUBACK for this long: treat the connection as broken
KEEPALIVE = 15              # seconds; the broker fires the will after 1.5x this of silence
STOP_GRACE = 5.0            # seconds close() waits for a clean DISCONNECT before cancelling
_CANCEL_ROUNDS = 100
_CANCEL_INTERVAL = 0.05

OnConnect = Callable[[], Awaitable[None]]


def parse_url(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) from ``mqtt://host[:port]`` or ``mqtts://host[:port]``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid broker url {url!r}: use mqtt://host:port or mqtts://host:port") from None
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"invalid broker url {url!r}: use mqtt://host:port or mqtts://host:port")
    tls = parts.scheme == "mqtts"
    return parts.hostname, port or (8883 if tls else 1883), tls


async def cancel_and_wait(tasks: Iterable[asyncio.Task], *, rounds: int = _CANCEL_ROUNDS,
                          interval: float = _CANCEL_INTERVAL) -> set[asyncio.Task]:
    """Cancel ``tasks`` until they are done; on 3.11 one cancel can be lost.

    Returns the tasks still running after ``rounds`` tries (logged; normally none).
    """
    pending = {t for t in tasks if not t.done()}
    for _ in range(rounds):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=interval)
    if pending:
        log.error("bus: %d task(s) would not stop: %s", len(pending),
                  ", ".join(t.get_name() for t in pending))
    return pending


@dataclass
class _Pending:
    seq: int
    topic: str          # suffix
    payload: bytes
    retain: bool
    sealed_at: float
    raw: bool = False   # not an envelope (clear_retained's empty payload): never re-sealed


class _Outbox:
    """Messages not yet acknowledged by the broker: queued, then in flight."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queue: deque[_Pending] = deque()
        self._inflight: dict[int, _Pending] = {}
        self._seq = itertools.count()
        self._nonempty = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self.dropped = 0
        self._update()

    def __len__(self) -> int:
        return len(self._queue) + len(self._inflight)

    def next_seq(self) -> int:
        return next(self._seq)

    async def put(self, item: _Pending, connected: Callable[[], bool]) -> None:
        # Connected and full: the senders are draining it, so wait for them.
        while len(self._queue) >= self.limit and connected():
            await self._space.wait()
        self._queue.append(item)
        self._enforce_limit()
        self._update()

    async def get(self) -> _Pending:
        while not self._queue:
            await self._nonempty.wait()
        item = self._queue.popleft()
        self._inflight[item.seq] = item
        self._update()
        return item

    def done(self, item: _Pending) -> None:
        self._inflight.pop(item.seq, None)
        self._update()

    def requeue_inflight(self) -> None:
        """Put unacknowledged messages back at the front, in their original order."""
        if self._inflight:
            self._queue.extendleft(sorted(self._inflight.values(), key=lambda p: p.seq, reverse=True))
            self._inflight.clear()
            self._enforce_limit()
        self._update()

    def wake_writers(self) -> None:
        """Disconnected: writers waiting for space should drop the oldest instead."""
        self._space.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _enforce_limit(self) -> None:
        while len(self._queue) > self.limit:
            lost = self._queue.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("bus: outbox full while disconnected; dropped the oldest message "
                            "(topic %s; %d dropped so far)", lost.topic, self.dropped)

    def _update(self) -> None:
        _flag(self._nonempty, bool(self._queue))
        _flag(self._space, len(self._queue) < self.limit)
        _flag(self._idle, not self._queue and not self._inflight)


def _flag(event: asyncio.Event, value: bool) -> None:
    if value:
        event.set()
    else:
        event.clear()


class _SessionEnded(Exception):
    """Internal: the session is over (close() was called)."""


class MqttBus:
    """A ``gpud.bus.base.Bus`` over an MQTT 3.1.1 broker (Mosquitto, or the embedded amqtt).

    ``subscriptions`` are topic suffixes under ``gpud/<cluster>/`` (``+``/``#`` allowed).
    Set ``on_connect`` to an async callable to run after every (re)connect.  TLS is used
    for ``mqtts://`` urls, or when ``tls`` is true or a ``tls_ca`` file is given.
    """

    def __init__(
        self,
        url: str,
        cluster: str,
        sender: str,
        key: KeysLike,
        *,
        subscriptions: Iterable[str] = (),
        will: Will | None = None,
        client_id: str | None = None,
        persistent: bool = False,
        username: str | None = None,
        password: str | None = None,
        tls_ca: str | None = None,
        tls: bool = False,
        clock: Callable[[], float] = time.time,
        epoch: int | None = None,
        reconnect_delay: tuple[float, float] = (0.1, 5.0),
        max_skew: float = 120.0,
        max_queued: int = MAX_QUEUED,
        keepalive: int = KEEPALIVE,
        close_timeout: float = 5.0,
        inbox: Inbox | None = None,
    ) -> None:
        self.host, self.port, url_tls = parse_url(url)
        if not cluster or any(c in cluster for c in "/+#"):
            raise ValueError(f"invalid cluster name {cluster!r}: it must not contain '/', '+' or '#'")
        self.url = url
        self.cluster = cluster
        self.sender = sender
        self.prefix = topic_prefix(cluster)
        self.subscriptions = list(subscriptions)
        self.will = will
        self.persistent = persistent
        self._key = Keyring.of(key)
        self._sealer = Sealer(self._key, sender, epoch=process_epoch() if epoch is None else epoch)
        # A persistent session is found again by its id, so it must be stable, yet whoever
        # connects with a client id takes over its session and messages.  Key holders alone
        # can compute this one; a locked-down broker (use_username_as_clientid) replaces it
        # with the username anyway.  Otherwise a random part keeps two processes with the
        # same name from kicking each other off the broker.
        self.client_id = client_id or (
            f"gpud-{cluster}-{sender}-{self._key.client_tag(cluster + '/' + sender)}" if persistent
            else f"gpud-{cluster}-{sender}-{secrets.token_hex(8)}")
        self.on_connect: OnConnect | None = None
        self._username, self._password = username, password
        self._tls_context: ssl.SSLContext | None = None
        if url_tls or tls or tls_ca:
            try:
                self._tls_context = ssl.create_default_context(cafile=tls_ca)
            except OSError as e:
                raise ValueError(f"cannot load broker CA file {tls_ca}: {e.strerror or e}") from None
        self._clock = clock
        self._delay_min, self._delay_max = reconnect_delay
        self._keepalive = keepalive
        self._close_timeout = close_timeout
        self._outbox = _Outbox(max_queued)
        # A shared inbox (gpud.bus.split) belongs to the bus that shares it: it closes it.
        self._owns_inbox = inbox is None
        self._inbox = inbox if inbox is not None else Inbox(self._key, self.prefix, max_skew=max_skew,
                                                            limit=MAX_INBOX)
        self._connected = asyncio.Event()
        self._stop = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task | None = None
        self.connects = 0            # successful connects so far (for tests and metrics)

    # -- the Bus protocol -----------------------------------------------------------------------

    async def __aenter__(self) -> "MqttBus":
        if self._task is not None:
            raise RuntimeError("MqttBus is not reentrant")
        self._task = asyncio.create_task(self._connection_loop(), name=f"mqtt-bus-{self.client_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, topic: str, message: Sendable, body: dict[str, Any] | None = None, *,
                      retain: bool = False) -> None:
        """Sign and queue for sending at QoS 1; returns once queued (see ``flush``)."""
        kind, body = wire(message, body)
        if self._closed:
            log.warning("bus: closed; dropped %s message for %s", kind, topic)
            return
        now = self._clock()
        payload = self._sealer.seal(kind, body, now=now, topic=topic)
        item = _Pending(self._outbox.next_seq(), topic, payload, retain, now)
        await self._outbox.put(item, self._connected.is_set)

    async def clear_retained(self, topic: str) -> None:
        """Remove the broker's retained message on ``topic`` (an empty retained publish)."""
        if self._closed:
            return
        item = _Pending(self._outbox.next_seq(), topic, b"", True, self._clock(), raw=True)
        await self._outbox.put(item, self._connected.is_set)

    def messages(self) -> AsyncIterator[Message]:
        """Verified messages until the bus is closed.  Meant for one consumer."""
        return self._inbox.messages()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    # -- extras ---------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def pending(self) -> int:
        """Messages published but not yet acknowledged by the broker."""
        return len(self._outbox)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message published so far is acknowledged; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._outbox.wait_idle()
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        """Flush (bounded), disconnect cleanly, stop every task.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None and self._connected.is_set():
                if not await self.flush(self._close_timeout):
                    log.warning("bus: closing with %d message(s) unsent", len(self._outbox))
        finally:
            self._stop.set()
            self._outbox.wake_writers()
            if self._task is not None:
                # Ending the session and sending DISCONNECT takes milliseconds; the
                # re-cancel loop is for a task stuck on the 3.11 bug or a dead socket.
                await asyncio.wait({self._task}, timeout=STOP_GRACE)
                await cancel_and_wait([self._task])
            self._connected.clear()
            if self._owns_inbox:
                self._inbox.close()

    # -- connection loop ------------------------------------------------------------------------

    def _make_client(self) -> aiomqtt.Client:
        will = None
        if self.will is not None:
            w = self.will
            payload = self._sealer.seal_will(w.kind, w.body, now=self._clock(), topic=w.topic)
            will = aiomqtt.Will(self.prefix + w.topic, payload, qos=1, retain=True)
        else:
            self._sealer.new_connection()
        client = aiomqtt.Client(
            self.host, self.port,
            username=self._username, password=self._password,
            identifier=self.client_id,
            protocol=aiomqtt.ProtocolVersion.V311,   # the embedded amqtt broker speaks only 3.1.1
            will=will,
            clean_session=not self.persistent,
            keepalive=self._keepalive,
            timeout=PUBLISH_TIMEOUT,
            max_inflight_messages=SENDERS * 2,
            tls_context=self._tls_context,
            # Nagle + delayed ACK turn a 1 ms round trip into ~90 ms.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            logger=logging.getLogger("gpud.bus.mqtt"),
        )
        client.pending_calls_threshold = SENDERS + 8  # our senders' in-flight calls are expected
        return client

    async def _connection_loop(self) -> None:
        delay = self._delay_min
        failures = 0
        while not self._stop.is_set():
            connects_before = self.connects
            try:
                async with self._make_client() as client:
                    await self._session(client)
            except aiomqtt.MqttError as e:
                reason = str(e) or type(e).__name__
                if self.connects > connects_before:
                    log.warning("bus: lost connection to %s (%s); reconnecting", self.url, reason)
                else:
                    failures += 1
                    # Say it once, then now and then: a long outage must not flood the log.
                    level = logging.WARNING if failures == 1 or failures % 50 == 0 else logging.DEBUG
                    log.log(level, "bus: cannot connect to %s: %s; retrying (attempt %d)",
                            self.url, reason, failures)
            except Exception:  # a bug, not the network: keep the daemon's bus alive anyway
                log.exception("bus: unexpected error in the connection loop")
            finally:
                self._connected.clear()
                self._outbox.requeue_inflight()
                self._outbox.wake_writers()
            if self.connects > connects_before:
                failures, delay = 0, self._delay_min
            if self._stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay * random.uniform(0.5, 1.0)):
                    await self._stop.wait()
            delay = min(delay * 2, self._delay_max)

    async def _session(self, client: aiomqtt.Client) -> None:
        if self.subscriptions:
            codes = await client.subscribe([(self.prefix + s, 1) for s in self.subscriptions])
            refused = [s for s, c in zip(self.subscriptions, codes) if _refused(c)]
            if refused:
                log.error("bus: broker refused subscription(s) %s; check its ACL", ", ".join(refused))
        self.connects += 1
        self._connected.set()
        log.info("bus: connected to %s as %s", self.url, self.client_id)
        if self._username is None and self.connects == 1:
            log.warning("bus: the broker at %s let this daemon in without a user name, so it lets in "
                        "anyone who reaches it: they see topics and sizes (never contents) and can fill "
                        "its queues; on a shared cluster lock it down (etc/mosquitto/gpud.conf, "
                        "gpud broker-credentials)", self.url)
        tasks = [asyncio.create_task(self._receiver(client), name="mqtt-receiver")]
        tasks += [asyncio.create_task(self._sender(client), name=f"mqtt-sender-{i}") for i in range(SENDERS)]
        tasks.append(asyncio.create_task(self._stop_watch(), name="mqtt-stop"))
        hook = None
        if self.on_connect is not None:
            hook = asyncio.create_task(self._run_hook(self.on_connect), name="mqtt-on-connect")
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._connected.clear()
            await cancel_and_wait(tasks + ([hook] if hook else []))
        errors = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
        if any(isinstance(e, _SessionEnded) for e in errors):
            return
        for e in errors:
            if isinstance(e, aiomqtt.MqttError):
                raise e
        for e in errors:
            log.error("bus: session task failed: %r", e)
        raise aiomqtt.MqttError("session ended")

    async def _stop_watch(self) -> None:
        await self._stop.wait()
        raise _SessionEnded()

    async def _run_hook(self, hook: OnConnect) -> None:
        try:
            await hook()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("bus: on_connect hook failed")

    async def _sender(self, client: aiomqtt.Client) -> None:
        while True:
            item = await self._outbox.get()
            if not item.raw and self._clock() - item.sealed_at > RESEAL_AFTER:
                item.sealed_at = self._clock()
                item.payload = self._sealer.reseal(item.payload, now=item.sealed_at, topic=item.topic)
            await client.publish(self.prefix + item.topic, item.payload, qos=1, retain=item.retain)
            self._outbox.done(item)

    async def _receiver(self, client: aiomqtt.Client) -> None:
        async for m in client.messages:
            self._accept(m.topic.value, m.payload, m.retain)

    def _accept(self, full_topic: str, payload: Any, retained: bool) -> None:
        self._inbox.accept(full_topic, payload, retained, self._clock())


def _refused(code: Any) -> bool:
    value = getattr(code, "value", code)
    return isinstance(value, int) and value >= 0x80
