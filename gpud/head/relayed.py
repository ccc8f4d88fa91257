"""The head's side of relayed gpuctl requests (``head/requests``; see ``gpud.relay``).

Theory of operation
-------------------
A relay on a login node or a worker forwards each gpuctl request line, in one or more
parts, with the uid, gid and pid its kernel reported for the caller.  The bus has already
checked the envelope's signature, freshness and uniqueness, so the message comes from a
holder of the cluster key and is not a replay; here the head also insists on the sender's
role: only ``relay:<name>`` and ``worker:<name>`` may speak for users (the head itself,
or any other name, may not).  That is the whole trust decision, as with munge: a host that
has the key vouches for the uid its kernel saw.

Once every part is in, the line goes through ``head.server.dispatch`` exactly like a line
from the local socket, with a ``Caller`` built from the relayed uid and gid (the user name
the relay sent is ignored: the head resolves the uid itself, so a relay host's passwd file
cannot make anyone an admin), and the response
line goes back to ``relay/<name>/replies`` in parts.  Each request runs as its own task, so
a submission waiting for its group commit does not hold up the bus loop, and relayed
submissions share commits like local ones; at most ``MAX_IN_FLIGHT`` run at once, and at
most ``[head] max_requests_per_user`` of one uid over all relays (one user's ``step_poll``
loop cannot fill the slots everyone shares): a request past either is answered at once
with a one-line refusal.

A request whose deadline has passed is dropped unanswered: its relay has already told the
user it timed out, and carrying it out now (say, when a restarted head's persistent session
delivers it) would surprise them.  Malformed requests are logged in one line and, when they
can be addressed, answered with an error so the user is not left waiting.

It is given the bus, the socket server's ``dispatch``, and the live config and the wall
clock as getters.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Awaitable, Callable

from .. import protocol
from ..bus.base import Bus, Message, relay_replies
from ..bus.messages import CHUNK_CHARS, MessageError, RelayPart, Reply, Request, decode, valid_name
from ..relay import Parts, split_line
from ..ctlsocket import Caller, RateLimitedLog, user_name

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("gpud.head.relayed")

SENDER_ROLES = ("relay:", "worker:")
MAX_IN_FLIGHT = 512               # relayed requests being answered at once
MAX_BUFFERED_CHARS = 64 * 1024 * 1024   # parts of incomplete requests kept, all relays together
CLOCK_SLACK = 2.0                 # seconds a relay's deadline may trail the head's clock


def relay_name(sender: str) -> str | None:
    """The relay's name for a sender allowed to relay (``relay:NAME``, ``worker:NAME``)."""
    for role in SENDER_ROLES:
        if sender.startswith(role):
            name = sender[len(role):]
            return name if valid_name(name) else None
    return None


def identity(req: Request) -> tuple[int, int, int, str, float]:
    """Who asked, as the relay's kernel reported it, and until when the relay waits: every
    part of one request must say the same."""
    return req.uid, req.gid, req.pid, req.user, req.deadline


class _Incomplete:
    def __init__(self, first: Request) -> None:
        self.first = first
        self.parts = Parts(first.parts)


class RelayedRequests:
    """Answers ``request`` messages on ``head/requests`` for one ``Head``."""

    def __init__(self, bus: Bus, *, dispatch: Callable[[Caller, bytes], Awaitable[bytes]],
                 config: Callable[[], "Config"], clock: Callable[[], float]) -> None:
        self.bus = bus
        self._dispatch = dispatch        # a request line, answered as the local socket would
        self._config = config            # the live config: max_requests_per_user may change on reload
        self._clock = clock
        self._incomplete: dict[tuple[str, str], _Incomplete] = {}
        self._buffered = 0
        self._tasks: set[asyncio.Task] = set()
        self._per_uid: dict[int, int] = {}     # relayed requests in progress per uid
        self.quiet = RateLimitedLog(log)
        self.answered = 0

    async def handle(self, msg: Message) -> None:
        """One verified message on ``head/requests``; never raises."""
        name = relay_name(msg.sender)
        if name is None:
            log.warning("dropped %s on %s from %s: only relays and workers may relay requests",
                        msg.kind, msg.topic, msg.sender)
            return
        if msg.kind != Request.KIND:
            log.warning("dropped %s from %s: unknown kind on %s", msg.kind, msg.sender, msg.topic)
            return
        try:
            part = decode(msg.kind, msg.body)
        except MessageError as e:
            rid = RelayPart.id_of(msg.body)
            log.warning("dropped request %sfrom %s: %s", f"{rid} " if rid else "", msg.sender, e)
            if rid is not None:   # its relay waits: say why instead of letting it time out
                await self._reply(name, rid, protocol.error(f"malformed relayed request ({e}); "
                                                            "check that gpud versions agree"))
            return
        assert isinstance(part, Request)
        now = self._clock()
        self._expire(now)
        if part.deadline + CLOCK_SLACK < now:
            log.warning("dropped request %s from %s: its relay stopped waiting %.0fs ago "
                        "(if this repeats, check that the hosts' clocks agree)",
                        part.id, msg.sender, now - part.deadline)
            return
        line = self._collect(msg.sender, part)
        if line is None:
            return
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self.quiet.log(logging.WARNING, "busy", "refused request %s from %s: %d relayed requests in progress",
                           part.id, msg.sender, len(self._tasks))
            await self._reply(name, part.id, protocol.error("gpud head is busy; try again shortly"))
            return
        per_user = self._config().head.max_requests_per_user
        if self._per_uid.get(part.uid, 0) >= per_user:
            self.quiet.log(logging.WARNING, "user busy", "refused request %s from %s: uid %d has %d relayed "
                           "requests in progress", part.id, msg.sender, part.uid, per_user)
            await self._reply(name, part.id, protocol.error(
                f"too many requests from this user in progress ({per_user}, [head] max_requests_per_user); "
                "wait for some to finish and try again"))
            return
        self._per_uid[part.uid] = self._per_uid.get(part.uid, 0) + 1
        task = asyncio.create_task(self._answer(name, part, line), name=f"relayed {part.id}")
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._done, part.uid))

    def _done(self, uid: int, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        left = self._per_uid.pop(uid, 1) - 1
        if left:
            self._per_uid[uid] = left

    async def close(self) -> None:
        """Stop answering (for callers that keep the event loop running after the head)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _collect(self, sender: str, part: Request) -> bytes | None:
        """Add a part; the whole line once it is complete (or a one-part request)."""
        key = (sender, part.id)
        inc = self._incomplete.get(key)
        if inc is None:
            if part.parts == 1:
                return Parts(1).add(part)
            if self._buffered + CHUNK_CHARS > MAX_BUFFERED_CHARS:
                log.warning("dropped request %s from %s: too many large requests arriving at once",
                            part.id, sender)
                return None
            inc = self._incomplete[key] = _Incomplete(part)
        if identity(part) != identity(inc.first):
            log.warning("dropped request %s from %s: its parts disagree on who asked", part.id, sender)
            self._forget(key)
            return None
        before = inc.parts.size
        try:
            line = inc.parts.add(part)
        except MessageError as e:
            log.warning("dropped request %s from %s: %s", part.id, sender, e)
            self._forget(key)
            return None
        self._buffered += inc.parts.size - before
        if line is not None:
            self._forget(key)
        return line

    def _forget(self, key: tuple[str, str]) -> None:
        inc = self._incomplete.pop(key, None)
        if inc is not None:
            self._buffered -= inc.parts.size

    def _expire(self, now: float) -> None:
        for key in [k for k, inc in self._incomplete.items() if inc.first.deadline + CLOCK_SLACK < now]:
            log.warning("dropped request %s from %s: some of its parts never arrived", key[1], key[0])
            self._forget(key)

    async def _answer(self, name: str, req: Request, line: bytes) -> None:
        # The uid is what the relay's kernel vouched for; the name the relay sent is only its
        # host's view and is never trusted: admin checks, accounts and job records use the
        # head's own name for the uid.
        rid = req.id
        caller = Caller(uid=req.uid, gid=req.gid, pid=req.pid, user=user_name(req.uid))
        left = req.deadline + CLOCK_SLACK - self._clock()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                answer = await self._dispatch(caller, line)
        except TimeoutError:
            self.quiet.log(logging.WARNING, "late", "request %s from relay %s (uid %d) took longer than its "
                           "relay waits; no answer sent", rid, name, req.uid)
            return
        await self._reply(name, rid, answer)
        self.answered += 1

    async def _reply(self, name: str, rid: str, line: bytes) -> None:
        parts = split_line(line)
        topic = relay_replies(name)
        try:
            for i, data in enumerate(parts):
                await self.bus.publish(topic, Reply(rid, i, len(parts), data))
        except Exception as e:  # the bus queues while disconnected; anything else is logged
            log.warning("could not answer request %s from relay %s: %s", rid, name, e)
