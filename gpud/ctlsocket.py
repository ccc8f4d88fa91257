"""The head's Unix socket: framing, kernel-proven identity, per-user limits, and dispatch.

The caller's uid and gid come from SO_PEERCRED, never from the request.  Every request
gets exactly one response line; a malformed one gets an error line and the connection
stays usable (a garbage line that cannot even be framed closes it).  No request can
crash the head: handler exceptions become one-line errors and are logged.

Requests on one connection may be pipelined: each is dispatched as soon as it is read (so
a client's submissions share group commits) and answered in request order.  Answers that
are ready together, as a group commit makes them, leave in one write: one system call and
one wake-up of the client for the batch, not one per answer.

One user cannot stall the others (``Limits``; the same code serves a relay's socket):

* at most ``connections_per_user`` connections per uid, and all users together leave a
  reserve of the process's descriptors: a connection past either is answered with a
  one-line refusal and closed;
* at most ``requests_per_user`` requests per uid being answered, over all its connections
  (and after they close): past it, that user's connections are read no further until one
  is answered (their own requests wait; nobody else's do);
* a request line must be complete within ``line_timeout`` seconds of its first byte, and
  an answer read within as long;
* a line may grow to ``SMALL_LINE`` bytes, or to ``protocol.MAX_LINE`` when it is an
  operation that carries a script (submit, scrontab_set, step_launch); unfinished lines
  may hold at most ``USER_BUFFER`` bytes per uid and ``TOTAL_BUFFER`` in all.

A client's fault (a refusal above, a reset connection) is logged in one line without a
traceback, and at most ``LOG_BURST`` such lines per ``LOG_PERIOD`` for each kind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import resource
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from . import protocol

log = logging.getLogger("gpud.api")


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int
    user: str


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


MAX_IN_FLIGHT = 1024   # pipelined requests per connection awaiting their answers
SMALL_LINE = 1024 * 1024             # any request line (squeue, scancel, ...)
LARGE_OPS = (b'"op":"submit"', b'"op":"scrontab_set"', b'"op":"step_launch"')   # may reach MAX_LINE
USER_BUFFER = 2 * protocol.MAX_LINE  # unfinished request lines of one uid, all connections
TOTAL_BUFFER = 8 * protocol.MAX_LINE  # unfinished request lines of everyone
FD_RESERVE = 256                     # descriptors kept for the database, the bus and the logs
READ_CHUNK = 64 * 1024
LOG_PERIOD = 60.0                    # seconds
LOG_BURST = 10                       # client-fault lines of one kind per LOG_PERIOD


@dataclass(frozen=True)
class Limits:
    """What one user may hold of a socket server (``[head]`` keys of the same names)."""

    connections_per_user: int = 256
    requests_per_user: int = 128
    line_timeout: float = 30.0       # seconds

    @classmethod
    def from_config(cls, head_cfg: Any) -> "Limits":
        return cls(head_cfg.max_connections_per_user, head_cfg.max_requests_per_user, head_cfg.client_timeout)


class RateLimitedLog:
    """At most ``burst`` lines of each kind per ``period`` seconds (monotonic clock); the
    next line after a quiet spell says how many were left out."""

    def __init__(self, logger: logging.Logger, *, period: float = LOG_PERIOD, burst: int = LOG_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.period, self.burst, self.clock = logger, period, burst, clock
        self._windows: dict[str, list] = {}    # kind -> [window start, lines in it, left out]

    def log(self, level: int, kind: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = self.clock()
        w = self._windows.get(kind)
        if w is None or now - w[0] >= self.period:
            left_out = w[2] if w is not None else 0
            w = self._windows[kind] = [now, 0, 0]
            if left_out:
                msg += f" ({left_out} more like it in the last {self.period:g}s were not logged)"
        if w[1] >= self.burst:
            w[2] += 1
            return
        w[1] += 1
        self.logger.log(level, msg, *args, exc_info=exc_info)


def _done(answer: bytes) -> "asyncio.Future[bytes]":
    future = asyncio.get_running_loop().create_future()
    future.set_result(answer)
    return future


class _InOrder:
    """One connection's answers in request order; ``put`` waits while ``limit`` are waiting
    to be written, so a client that reads no answers is read no further."""

    def __init__(self, limit: int) -> None:
        self._items: deque[asyncio.Future[bytes] | None] = deque()   # None: the end
        self._room = asyncio.Semaphore(limit)
        self._more = asyncio.Event()

    async def put(self, item: "asyncio.Future[bytes]") -> None:
        await self._room.acquire()
        self._items.append(item)
        self._more.set()

    def end(self) -> None:
        """No more requests: the writer stops after the answers already in line."""
        self._items.append(None)
        self._more.set()

    async def take(self) -> "asyncio.Future[bytes] | None":
        while not self._items:
            self._more.clear()
            await self._more.wait()
        self._room.release()
        return self._items.popleft()

    def next_is_ready(self) -> bool:
        """Whether the next answer in line is already made (or the end of the connection)."""
        return bool(self._items) and (self._items[0] is None or self._items[0].done())


class RequestError(Exception):
    """A refusal with a one-line reason for the user."""


class ClientFault(Exception):
    """A connection broke a limit: the one-line answer it gets before it is closed."""


Handler = Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class _User:
    """What one uid holds of the server."""

    requests: asyncio.Semaphore         # one per request being answered
    connections: int = 0
    active: int = 0                     # requests being answered, even for a connection gone
    buffered: int = 0                   # bytes of its unfinished request lines

    def idle(self) -> bool:
        return self.connections == 0 and self.active == 0 and self.buffered == 0


class _Lines:
    """Request lines from one connection, within the size, memory and time limits."""

    def __init__(self, server: "SocketServer", reader: asyncio.StreamReader, user: _User) -> None:
        self.server, self.reader, self.user = server, reader, user
        self._ready: deque[bytes] = deque()
        self._partial: list[bytes] = []     # the unfinished line, in pieces (joined once, at its end)
        self._size = 0
        self._large = False                 # the unfinished line may grow to MAX_LINE
        self._deadline = 0.0

    async def next(self) -> bytes | None:
        """The next line, b"\\n"-terminated; None at the end of the stream (an unfinished last
        line is dropped); ClientFault when the line breaks a limit."""
        while not self._ready:
            if self._partial:
                try:
                    async with asyncio.timeout(self._deadline - time.monotonic()):
                        chunk = await self.reader.read(READ_CHUNK)
                except TimeoutError:
                    raise ClientFault("request line not finished within "
                                      f"{self.server.limits.line_timeout:g}s") from None
            else:
                chunk = await self.reader.read(READ_CHUNK)
            if not chunk:
                return None
            self._add(chunk)
        return self._ready.popleft()

    def _add(self, chunk: bytes) -> None:
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            if self._partial:
                self._partial.append(piece)
                line = b"".join(self._partial) + b"\n"
                self.release()
            else:
                line = piece + b"\n"
            self._ready.append(line)
        last = pieces[-1]
        if last:
            if not self._partial:
                self._deadline = time.monotonic() + self.server.limits.line_timeout
            self._grow(last)

    def _grow(self, data: bytes) -> None:
        size = self._size + len(data)
        if size > SMALL_LINE and not self._large:
            start = b"".join(self._partial[:64] + [data])[:64]
            if not any(op in start for op in LARGE_OPS):
                raise ClientFault(f"request too large (over {SMALL_LINE >> 20} MiB)")
            self._large = True
        if size > protocol.MAX_LINE:
            raise ClientFault(f"request too large (over {protocol.MAX_LINE >> 20} MiB)")
        if self.user.buffered + len(data) > USER_BUFFER:
            raise ClientFault("request refused: this user's other unfinished requests already hold "
                              f"{USER_BUFFER >> 20} MiB of the head's memory; send one large request at a time")
        if self.server.buffered + len(data) > TOTAL_BUFFER:
            raise ClientFault("gpud head is busy receiving large requests; try again shortly")
        self._partial.append(data)
        self._size = size
        self.user.buffered += len(data)
        self.server.buffered += len(data)

    def release(self) -> None:
        """Forget the unfinished line (it is complete, or the connection is done)."""
        self.user.buffered -= self._size
        self.server.buffered -= self._size
        self._partial.clear()
        self._size = 0
        self._large = False


class SocketServer:
    def __init__(self, path: str, handlers: dict[str, Handler], *, limits: Limits = Limits()) -> None:
        self.path = path
        self.handlers = handlers
        self.limits = limits
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()
        self._users: dict[int, _User] = {}
        self.connections = 0
        self.max_connections = 1024 - FD_RESERVE
        self.buffered = 0
        self.quiet = RateLimitedLog(log)

    async def start(self) -> None:
        d = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(d, exist_ok=True)
        if os.path.exists(self.path):
            if _socket_alive(self.path):
                raise RuntimeError(f"another gpud head is already serving {self.path}")
            os.unlink(self.path)
        self.max_connections = max(16, raise_nofile_limit() - FD_RESERVE)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=READ_CHUNK)
        # Everyone may connect; what they may do is decided per request from SO_PEERCRED.
        os.chmod(self.path, 0o666)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _admit(self, uid: int) -> _User:
        """Count a new connection of ``uid``; ClientFault past a limit."""
        if self.connections >= self.max_connections:
            raise ClientFault(f"gpud head is busy ({self.connections} connections open); try again shortly")
        user = self._users.get(uid)
        if user is None:
            user = self._users[uid] = _User(asyncio.Semaphore(self.limits.requests_per_user))
        if user.connections >= self.limits.connections_per_user:
            raise ClientFault(f"too many connections from this user ({user.connections} open, the limit is "
                              f"{self.limits.connections_per_user}); close some and try again")
        user.connections += 1
        self.connections += 1
        return user

    def _leave(self, uid: int, user: _User) -> None:
        user.connections -= 1
        self.connections -= 1
        self._forget_if_idle(uid, user)

    def _forget_if_idle(self, uid: int, user: _User) -> None:
        if user.idle() and self._users.get(uid) is user:
            del self._users[uid]

    async def _start(self, uid: int, user: _User, caller: Caller, line: bytes) -> "asyncio.Future[bytes]":
        """Dispatch ``line`` once ``uid`` has a request slot free; the slot is held until the
        answer is made, even if the connection goes first (handlers are not cancelled: a
        submission or a transaction must not be cut in half)."""
        await user.requests.acquire()
        user.active += 1

        def done(_: object) -> None:
            user.active -= 1
            user.requests.release()
            self._forget_if_idle(uid, user)

        future = asyncio.ensure_future(self.dispatch(caller, line))
        future.add_done_callback(done)
        return future

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests may be pipelined; answers go back in request order.

        Each request is dispatched as soon as it is read, so a client that sends many
        submissions before reading lets them share group commits; at most
        ``MAX_IN_FLIGHT`` answers of this connection, and ``requests_per_user`` of its
        user, wait to be written before reading pauses.
        """
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        uid = -1
        user: _User | None = None
        lines: _Lines | None = None
        writing: asyncio.Task | None = None
        try:
            pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
            user = self._admit(uid)
            caller = Caller(uid=uid, gid=gid, pid=pid, user=user_name(uid))
            answers = _InOrder(MAX_IN_FLIGHT)
            writing = asyncio.create_task(self._write_answers(answers, writer))
            lines = _Lines(self, reader, user)
            try:
                while not writing.done():
                    line = await lines.next()
                    if line is None:
                        break
                    await answers.put(await self._start(uid, user, caller, line))
            except ClientFault as e:
                self.quiet.log(logging.WARNING, "fault", "closed a connection of uid %d: %s", uid, e)
                await answers.put(_done(protocol.error(str(e))))
            answers.end()
            await writing
        except ClientFault as e:   # refused at the door: one line, then closed
            self.quiet.log(logging.WARNING, "refused", "refused a connection of uid %d: %s", uid, e)
            writer.write(protocol.error(str(e)))
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as e:   # never a traceback per connection: one short line, rate-limited
            self.quiet.log(logging.WARNING, "error", "connection of uid %d ended: %s: %s", uid,
                           type(e).__name__, e)
        finally:
            if writing is not None:
                writing.cancel()
            if lines is not None:
                lines.release()
            if user is not None:
                self._leave(uid, user)
            if task is not None:
                self._conns.discard(task)
            writer.close()

    async def _write_answers(self, answers: _InOrder, writer: asyncio.StreamWriter) -> None:
        """Write answers in request order, each as soon as it and those before it are made;
        the ones made at the same moment go out in one write.  A client that takes longer
        than ``line_timeout`` to read what was written is disconnected."""
        ready: list[bytes] = []
        try:
            while True:
                if ready and not answers.next_is_ready():
                    await self._flush(writer, ready)
                pending = await answers.take()
                if pending is None:
                    break
                ready.append(pending.result() if pending.done() else await pending)
            if ready:
                await self._flush(writer, ready)
        except ConnectionError:
            pass
        except TimeoutError:   # answers unread: drop the connection, so its reader stops too
            writer.transport.abort()

    async def _flush(self, writer: asyncio.StreamWriter, ready: list[bytes]) -> None:
        writer.write(b"".join(ready))
        ready.clear()
        async with asyncio.timeout(self.limits.line_timeout):
            await writer.drain()

    async def dispatch(self, caller: Caller, line: bytes) -> bytes:
        try:
            op, args = protocol.decode_request(line)
        except protocol.ProtocolError as e:
            self.quiet.log(logging.INFO, "bad request", "bad request from uid %d: %s", caller.uid, e)
            return protocol.error(str(e))
        handler = self.handlers.get(op)
        if handler is None:
            return protocol.error(f"operation {op!r} is not available on this head")
        try:
            return protocol.ok(await handler(caller, args))
        except RequestError as e:
            return protocol.error(str(e))
        except Exception:   # a bug of ours, with its traceback, but not one per request of a loop
            self.quiet.log(logging.ERROR, f"failed {op}", "request %s from uid %d failed", op, caller.uid,
                           exc_info=True)
            return protocol.error(f"internal error handling {op}; see the head's log")


def raise_nofile_limit() -> int:
    """Raise this process's open-file limit to its hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _socket_alive(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
