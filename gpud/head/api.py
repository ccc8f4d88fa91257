"""The head's Unix socket: framing, kernel-proven identity, and dispatch.

The caller's uid and gid come from SO_PEERCRED, never from the request.  Every request
gets exactly one response line; a malformed one gets an error line and the connection
stays usable (a garbage line that cannot even be framed closes it).  No request can
crash the head: handler exceptions become one-line errors and are logged.

Requests on one connection may be pipelined: each is dispatched as soon as it is read (so
a client's submissions share group commits) and answered in request order.  Answers that
are ready together, as a group commit makes them, leave in one write: one system call and
one wake-up of the client for the batch, not one per answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import socket
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .. import protocol

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


def _done(answer: bytes) -> "asyncio.Future[bytes]":
    async def ready() -> bytes:
        return answer
    return asyncio.ensure_future(ready())


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


Handler = Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]


class SocketServer:
    def __init__(self, path: str, handlers: dict[str, Handler]) -> None:
        self.path = path
        self.handlers = handlers
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    async def start(self) -> None:
        d = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(d, exist_ok=True)
        if os.path.exists(self.path):
            if _socket_alive(self.path):
                raise RuntimeError(f"another gpud head is already serving {self.path}")
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=protocol.MAX_LINE)
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests may be pipelined; answers go back in request order.

        Each request is dispatched as soon as it is read, so a client that sends many
        submissions before reading lets them share group commits; at most
        ``MAX_IN_FLIGHT`` answers wait to be written before reading pauses.
        """
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        answers = _InOrder(MAX_IN_FLIGHT)
        writing = asyncio.create_task(self._write_answers(answers, writer))
        try:
            sock = writer.get_extra_info("socket")
            pid, uid, gid = peer_credentials(sock)
            caller = Caller(uid=uid, gid=gid, pid=pid, user=user_name(uid))
            while not writing.done():
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    await answers.put(_done(protocol.error("request too large")))
                    break
                if not line:
                    break
                await answers.put(asyncio.create_task(self.dispatch(caller, line)))
            answers.end()
            await writing
        except (ConnectionError, BrokenPipeError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writing.cancel()
            if task is not None:
                self._conns.discard(task)
            writer.close()

    @staticmethod
    async def _write_answers(answers: _InOrder, writer: asyncio.StreamWriter) -> None:
        """Write answers in request order, each as soon as it and those before it are made;
        the ones made at the same moment go out in one write."""
        ready: list[bytes] = []
        try:
            while True:
                if ready and not answers.next_is_ready():
                    writer.write(b"".join(ready))
                    ready.clear()
                    await writer.drain()
                pending = await answers.take()
                if pending is None:
                    break
                ready.append(pending.result() if pending.done() else await pending)
            if ready:
                writer.write(b"".join(ready))
                await writer.drain()
        except (ConnectionError, BrokenPipeError):
            pass

    async def dispatch(self, caller: Caller, line: bytes) -> bytes:
        try:
            op, args = protocol.decode_request(line)
        except protocol.ProtocolError as e:
            log.info("bad request from uid %d: %s", caller.uid, e)
            return protocol.error(str(e))
        handler = self.handlers.get(op)
        if handler is None:
            return protocol.error(f"operation {op!r} is not available on this head")
        try:
            return protocol.ok(await handler(caller, args))
        except RequestError as e:
            return protocol.error(str(e))
        except Exception:
            log.exception("request %s from uid %d failed", op, caller.uid)
            return protocol.error(f"internal error handling {op}; see the head's log")


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
