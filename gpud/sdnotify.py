"""Tell systemd how a daemon is doing: READY=1, STOPPING=1, WATCHDOG=1 (``sd_notify``).

Theory of operation
-------------------
A unit with ``Type=notify`` starts its process with ``$NOTIFY_SOCKET`` set: the address
of a Unix datagram socket (a path, or ``@name`` for the abstract namespace).  The daemon
sends ``READY=1`` when it is really ready (for the head: its socket accepts requests),
which is when ``systemctl start`` returns and units ordered after it start.  With
``WatchdogSec=`` set, systemd also passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``) and
restarts the service when no ``WATCHDOG=1`` arrives within that time; pinging at half the
period from the event loop proves the loop still runs.

Without ``$NOTIFY_SOCKET`` (a shell, tests, ``gpud standalone``) every call is a no-op,
so the daemons call these unconditionally.  A failure to notify is logged and never
raised: telling systemd is not worth a daemon.

Stdlib only; this is the whole protocol (one datagram of ``KEY=value`` lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import AsyncIterator, Mapping

log = logging.getLogger("gpud.sdnotify")

MIN_WATCHDOG_INTERVAL = 0.05   # seconds; guards against a nonsensical WATCHDOG_USEC


def socket_address(env: Mapping[str, str] | None = None) -> str | bytes | None:
    """The notify socket's address from ``$NOTIFY_SOCKET``, or None when there is none.

    ``@name`` is a socket in the abstract namespace (a leading NUL byte on the wire).
    """
    env = os.environ if env is None else env
    addr = env.get("NOTIFY_SOCKET", "")
    if not addr:
        return None
    if addr.startswith("@"):
        return b"\0" + addr[1:].encode()
    if addr.startswith("/"):
        return addr
    log.warning("ignoring NOTIFY_SOCKET=%r: not an absolute path or @abstract name", addr)
    return None


def notify(*states: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``states`` (``"READY=1"``, ``"STATUS=..."``) in one datagram; False if not sent."""
    addr = socket_address(env)
    if addr is None or not states:
        return False
    payload = "\n".join(states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(payload)
    except OSError as e:
        log.warning("could not notify systemd (%s): %s", states[0], e.strerror or e)
        return False
    return True


def ready(status: str | None = None) -> bool:
    states = ["READY=1"]
    if status:
        states.append(f"STATUS={_one_line(status)}")
    return notify(*states)


def stopping(status: str | None = None) -> bool:
    return notify("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))


def watchdog_ping() -> bool:
    return notify("WATCHDOG=1")


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of ``$WATCHDOG_USEC``); None when not asked.

    ``$WATCHDOG_PID``, when set, names the process systemd watches: a child that
    inherited the variables (it should not, but) must not ping on its parent's behalf.
    """
    env = os.environ if env is None else env
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec or socket_address(env) is None:
        return None
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            log.warning("ignoring WATCHDOG_PID=%r: not a number", pid)
            return None
    try:
        period = int(usec) / 1e6
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number", usec)
        return None
    if period <= 0:
        return None
    return max(MIN_WATCHDOG_INTERVAL, period / 2)


async def watchdog(interval: float) -> None:
    """Ping every ``interval`` seconds until cancelled."""
    while True:
        watchdog_ping()
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def lifecycle(ready_event: asyncio.Event, *, what: str, enabled: bool = True) -> AsyncIterator[None]:
    """Around a daemon's main loop: watchdog pings from the start, ``READY=1`` once
    ``ready_event`` is set, ``STOPPING=1`` when the loop ends.

    ``enabled=False`` (a daemon embedded in a bigger process, e.g. ``gpud standalone``)
    makes it do nothing, so only the process's own service speaks for it.
    """
    if not enabled or socket_address() is None:
        yield
        return
    interval = watchdog_interval()
    tasks = [asyncio.create_task(_announce(ready_event, what), name="sd-ready")]
    if interval is not None:
        tasks.append(asyncio.create_task(watchdog(interval), name="sd-watchdog"))
    try:
        yield
    finally:
        stopping(f"{what}: stopping")
        for t in tasks:
            t.cancel()
        # No awaits inside these tasks can swallow a cancel (no aiomqtt), so one round is enough.
        await asyncio.gather(*tasks, return_exceptions=True)


async def _announce(ready_event: asyncio.Event, what: str) -> None:
    await ready_event.wait()
    ready(f"{what}: ready")


def _one_line(text: str) -> str:
    return " ".join(text.split())
