"""`gpud relay`: the gpuctl socket on a host that is not the head (a login node, a worker).

Theory of operation
-------------------
Users work on login nodes, not on the head.  A relay serves the same Unix socket gpuctl
talks to (``/run/gpud/gpud.sock`` by default) and forwards each request line to the head
over MQTT, in a signed envelope, together with the uid, gid and pid the kernel reported
for the caller (SO_PEERCRED), the way munge vouches for Slurm's clients.  The head trusts
that identity because only holders of the cluster key can sign, and only from senders
named ``relay:<name>`` or ``worker:<name>`` (``gpud.head.relayed``).  The identity is never
read from the request, so a caller cannot claim anyone else's.

Wire format (topics under ``gpud/<cluster>/``; the bodies: ``gpud.bus.messages.Request``
and ``Reply``):

=========================  ============  =================================================
``head/requests``          relay→head    ``request`` {id, part, parts, data, uid, gid, pid,
                                         user, deadline}
``relay/<name>/replies``   head→relay    ``reply`` {id, part, parts, data}
=========================  ============  =================================================

``data`` is a slice of the request (or response) line, split so that no envelope passes
its size limit (a batch script may be megabytes, and so may sacct's answer); the receiver
joins the ``parts`` by index, since QoS 1 does not promise order.  ``deadline`` is when
the relay stops waiting (its clock): the head drops a request it reads after that, so a
request the user was told had timed out is not carried out later, when a restarted head's
persistent session delivers it.

The relay answers by itself, at once, when it cannot succeed: the head's retained status
says it is offline, too many requests are waiting, or nothing came back within
``timeout`` seconds (then: ``head did not answer within Ns``).  It never re-sends a
request: a submission must not run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from . import protocol, sdnotify
from .bus.base import HEAD_REQUESTS, HEAD_STATUS, Bus, Message, relay_replies
from .bus.envelope import new_id
from .bus.messages import CHUNK_CHARS, HeadStatus, MessageError, RelayPart, Reply, Request, decode, valid_name
from .config import Config
from .ctlsocket import Caller, Limits, SocketServer

log = logging.getLogger("gpud.relay")

DEFAULT_TIMEOUT = 20.0          # seconds; below gpuctl's own 30 s, so the user hears why
MAX_PENDING = 1024              # requests one relay waits on at once
STOP_TIMEOUT = 10.0             # seconds a worker waits for its relay to close


# -- lines in parts (sans-IO, used by both ends) --------------------------------------------------

def split_line(line: bytes) -> list[str]:
    """``line`` as text parts of at most CHUNK_CHARS; undecodable bytes survive the trip."""
    text = line.decode("utf-8", "surrogateescape")
    return [text[i:i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]


@dataclass
class Parts:
    """The parts of one line received so far."""

    total: int
    got: dict[int, str] = field(default_factory=dict)
    size: int = 0

    def add(self, p: RelayPart) -> bytes | None:
        """Record ``p``; the whole line once every part is in, else None; MessageError for a
        part that disagrees with the others on how many there are."""
        if p.parts != self.total:
            raise MessageError(f"part {p.part} says {p.parts} parts, not {self.total}")
        if p.part not in self.got:
            self.got[p.part] = p.data
            self.size += len(p.data)
        if len(self.got) < self.total:
            return None
        return "".join(self.got[i] for i in range(self.total)).encode("utf-8", "surrogateescape")


# -- the relay ----------------------------------------------------------------------------------

class _Server(SocketServer):
    """The gpuctl socket, with SO_PEERCRED identity; every line goes to the relay."""

    def __init__(self, path: str, relay: "Relay", limits: Limits) -> None:
        super().__init__(path, {}, limits=limits)
        self.relay = relay

    async def dispatch(self, caller: Caller, line: bytes) -> bytes:
        return await self.relay.forward(caller, line)


@dataclass
class _Waiting:
    future: asyncio.Future
    parts: Parts | None = None


class Relay:
    """Serves ``socket_path`` and forwards to the head over ``bus``.

    ``bus`` must be subscribed to ``relay_replies(name)`` and ``head/status``; the caller
    owns it (``async with bus``).  ``run()`` until ``stop()``.
    """

    def __init__(self, bus: Bus, socket_path: str, name: str, *, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.time, limits: Limits = Limits()) -> None:
        if not valid_name(name):
            raise ValueError(f"invalid relay name {name!r}: use letters, digits, '-', '_' or '.'")
        if not timeout > 0:
            raise ValueError("relay timeout must be positive")
        self.bus = bus
        self.name = name
        self.socket_path = socket_path
        self.timeout = timeout
        self.clock = clock
        self.reply_topic = relay_replies(name)
        self.server = _Server(socket_path, self, limits)
        self.head_online: bool | None = None     # from the head's retained status
        self.ready = asyncio.Event()             # set once the socket accepts requests
        self.forwarded = 0
        self._waiting: dict[str, _Waiting] = {}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        try:
            await self.server.start()
        except RuntimeError:
            raise RuntimeError(f"{self.socket_path} is already served (by a gpud head or another relay); "
                               "stop it or give this relay another --socket") from None
        try:
            listener = asyncio.create_task(self._listen(), name="relay-replies")
            self.ready.set()
            log.info("relay %s ready on %s", self.name, self.socket_path)
            stop = asyncio.create_task(self._stop.wait(), name="relay-stop")
            await asyncio.wait({listener, stop}, return_when=asyncio.FIRST_COMPLETED)
            for t in (listener, stop):
                t.cancel()
            await asyncio.gather(listener, stop, return_exceptions=True)
        finally:
            await self.server.close()
            for w in self._waiting.values():
                if not w.future.done():
                    w.future.set_result(protocol.error(f"gpud relay {self.name} is shutting down; try again"))

    def stop(self) -> None:
        self._stop.set()

    # -- requests out ---------------------------------------------------------------------------

    async def forward(self, caller: Caller, line: bytes) -> bytes:
        """Send one request line to the head; the response line (possibly an error of ours)."""
        if self.head_online is False:
            return protocol.error("gpud head is offline (its broker connection dropped); "
                                  "try again when it is back")
        if len(self._waiting) >= MAX_PENDING:
            return protocol.error(f"gpud relay {self.name} is busy ({MAX_PENDING} requests waiting); "
                                  "try again shortly")
        rid = new_id()
        waiting = _Waiting(asyncio.get_running_loop().create_future())
        self._waiting[rid] = waiting
        # The head may know this uid under another name (or the relay may know none): send
        # the name only when the relay host has one, and let the head look it up otherwise.
        user = caller.user if caller.user != str(caller.uid) and valid_name(caller.user) else ""
        sent = False
        try:
            async with asyncio.timeout(self.timeout):
                await self.bus.wait_connected()
                parts = split_line(line)
                deadline = self.clock() + self.timeout
                for i, data in enumerate(parts):
                    await self.bus.publish(HEAD_REQUESTS, Request(
                        rid, i, len(parts), data, uid=caller.uid, gid=caller.gid, pid=caller.pid, user=user,
                        deadline=deadline))
                sent = True
                self.forwarded += 1
                return await waiting.future
        except TimeoutError:
            if not sent:
                return protocol.error(f"gpud relay {self.name} cannot reach the MQTT broker; "
                                      "check that it runs and [broker] url in gpud.toml")
            self.server.quiet.log(logging.WARNING, "no answer", "relay %s: no answer from the head within %gs "
                                  "(uid %d)", self.name, self.timeout, caller.uid)
            return protocol.error(f"head did not answer within {self.timeout:g}s; the request may still "
                                  "have been carried out: check with gpuctl squeue")
        finally:
            self._waiting.pop(rid, None)

    # -- replies in -----------------------------------------------------------------------------

    async def _listen(self) -> None:
        async for msg in self.bus.messages():
            self.on_message(msg)
        log.warning("relay %s: the bus closed", self.name)

    def on_message(self, msg: Message) -> None:
        """One verified bus message; never raises."""
        if msg.sender != "head":
            log.warning("relay %s dropped %s from %s: only the head answers relays", self.name, msg.kind,
                        msg.sender)
            return
        try:
            got = decode(msg.kind, msg.body)
            if msg.topic == HEAD_STATUS and isinstance(got, HeadStatus):
                if (got.state == "online") != self.head_online:
                    log.info("relay %s: head is %s", self.name, got.state)
                self.head_online = got.state == "online"
            elif msg.topic == self.reply_topic and isinstance(got, Reply):
                self._on_reply(got)
            else:
                log.warning("relay %s dropped %s on %s: unexpected", self.name, msg.kind, msg.topic)
        except MessageError as e:
            log.warning("relay %s dropped %s from %s: %s", self.name, msg.kind, msg.sender, e)

    def _on_reply(self, p: Reply) -> None:
        waiting = self._waiting.get(p.id)
        if waiting is None or waiting.future.done():
            log.debug("relay %s: reply to %s, which no one waits for (timed out?)", self.name, p.id)
            return
        if waiting.parts is None:
            waiting.parts = Parts(p.parts)
        line = waiting.parts.add(p)
        if line is not None:
            waiting.future.set_result(line)


# -- `gpud relay` and the worker's relay ---------------------------------------------------------

def make_bus(cfg: Config, sender: str, name: str, key: bytes) -> Any:
    from .bus.credentials import login, node_relay_user, relay_user
    from .bus.mqtt import MqttBus

    # A worker's relay is that worker's second connection: a broker user of its own.
    on_worker = sender.startswith("worker:")
    username, password = login(cfg.broker, node_relay_user(name) if on_worker else relay_user(name),
                               suffix="-relay" if on_worker else "")
    # A clean session: replies to a relay that restarted are of no use to anyone.
    return MqttBus(
        cfg.broker.url, cfg.cluster, sender, key,
        subscriptions=[relay_replies(name), HEAD_STATUS], persistent=False,
        username=username, password=password, tls_ca=cfg.broker.ca_file,
        tls=cfg.broker.tls,
    )


async def run_relay(cfg: Config, *, socket_path: str | None = None, name: str | None = None,
                    timeout: float = DEFAULT_TIMEOUT) -> int:
    """``gpud relay``: serve gpuctl's socket here and forward to the head; the exit code."""
    from .keys import KeyFileError, load_keys

    name = name or socket.gethostname().split(".")[0]
    path = socket_path or cfg.head.socket
    try:
        key = load_keys(cfg.key_file)
        bus = make_bus(cfg, f"relay:{name}", name, key)
        relay = Relay(bus, path, name, timeout=timeout, limits=Limits.from_config(cfg.head))
    except (KeyFileError, ValueError) as e:
        print(f"gpud relay: error: {e}", file=sys.stderr)
        return 1
    _install_stop_handlers(relay)
    try:
        async with bus, sdnotify.lifecycle(relay.ready, what=f"gpud relay {name}"):
            await relay.run()
    except (RuntimeError, OSError) as e:
        print(f"gpud relay: error: {e}", file=sys.stderr)
        return 1
    return 0


@contextlib.asynccontextmanager
async def worker_relay(cfg: Config, name: str, key: bytes) -> AsyncIterator[Relay | None]:
    """Around a worker's run: serve ``[worker] relay_socket`` when it is set.

    A relay that cannot start is logged, not fatal: the node's jobs matter more than its
    gpuctl socket.
    """
    path = cfg.worker.relay_socket
    if not path:
        yield None
        return
    from .keys import KeyFileError

    try:
        bus = make_bus(cfg, f"worker:{name}", name, key)
    except (KeyFileError, ValueError) as e:
        log.error("worker %s: cannot serve gpuctl at %s: %s (jobs are not affected)", name, path, e)
        yield None
        return
    relay = Relay(bus, path, name, limits=Limits.from_config(cfg.head))

    async def serve() -> None:
        try:
            async with bus:
                await relay.run()
        except Exception as e:
            log.error("worker %s: cannot serve gpuctl at %s: %s (jobs are not affected)", name, path, e)

    task = asyncio.create_task(serve(), name="relay")
    try:
        yield relay
    finally:
        relay.stop()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT)
        if not done:
            from .bus.mqtt import cancel_and_wait

            await cancel_and_wait([task])


def _install_stop_handlers(relay: Relay) -> None:
    loop = asyncio.get_running_loop()
    count = {"n": 0}

    def on_signal(signame: str) -> None:
        count["n"] += 1
        if count["n"] > 1:
            log.warning("%s received again: exiting now", signame)
            raise SystemExit(1)
        log.info("%s received: shutting down", signame)
        relay.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
