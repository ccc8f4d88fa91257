"""`gpud head`: build the real pieces (SQLite store, MQTT bus) around ``Head`` and run it.

Signals: SIGTERM/SIGINT stop the head (a second one exits at once); SIGHUP re-reads the
config file and applies it without touching running jobs (``Head.reload``).
"""

from __future__ import annotations

import asyncio
import os
import logging
import signal
import sys
from typing import Callable

from .. import sdnotify
from ..bus.base import HEAD_EVENTS, HEAD_REQUESTS, HEAD_STATUS, Will
from ..bus.messages import HeadStatus
from ..config import Config, ConfigError
from ..keys import KeyFileError, load_keys
from .daemon import HEAD_SENDER, Head
from .store import Store

log = logging.getLogger("gpud.head")


def make_bus(cfg: Config, key: bytes, inbox=None):
    """The head's MQTT bus; ``inbox``: verify into this one (shared with another bus)."""
    from ..bus.credentials import HEAD_USER, login
    from ..bus.epoch import process_epoch
    from ..bus.mqtt import MqttBus

    username, password = login(cfg.broker, HEAD_USER)
    return MqttBus(
        cfg.broker.url, cfg.cluster, HEAD_SENDER, key,
        subscriptions=[HEAD_EVENTS, "node/+/status", HEAD_REQUESTS],
        will=Will.of(HEAD_STATUS, HeadStatus("offline")),
        persistent=True, epoch=process_epoch(_epoch_file(cfg)),
        username=username, password=password, tls_ca=cfg.broker.ca_file,
        tls=cfg.broker.tls, inbox=inbox,
    )


def _epoch_file(cfg: Config) -> str | None:
    """Where the head keeps its last bus epoch (gpud.bus.epoch); None before its first start."""
    return os.path.join(cfg.state_dir, "bus-epoch-head") if os.path.isdir(cfg.state_dir) else None


def install_stop_handlers(stop) -> None:
    """First SIGTERM/SIGINT stops gracefully; a second one exits at once."""
    loop = asyncio.get_running_loop()
    state = {"n": 0}

    def on_signal(signame: str) -> None:
        state["n"] += 1
        if state["n"] == 1:
            log.info("%s received: shutting down", signame)
            stop()
        else:
            log.warning("%s received again: exiting now", signame)
            raise SystemExit(1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)


def install_reload_handler(head: Head) -> None:
    """SIGHUP: reload the config; an invalid one is logged and the running one kept."""
    def on_hup() -> None:
        try:
            head.reload("SIGHUP")
        except ConfigError:
            pass  # Head.reload logged every problem

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)


async def run_head(cfg: Config, *, install_signals: bool = True,
                   on_head: Callable[[Head], None] | None = None,
                   loader: Callable[[], Config] | None = None, bus=None) -> int:
    """Build the real pieces around ``Head`` and run it; the exit code for ``gpud head``.

    ``install_signals=False``, ``on_head`` and ``bus`` serve a caller that runs more than the
    head in its process (``gpud standalone``): it gets the ``Head`` to wait on and to stop,
    and may give the bus (default: MQTT, ``make_bus``).
    ``loader`` re-reads the config for a reload, flags applied (default: the file alone).
    """
    try:
        key = load_keys(cfg.key_file)
        if bus is None:
            bus = make_bus(cfg, key)
    except KeyFileError as e:
        print(f"gpud head: error: {e}", file=sys.stderr)
        return 1
    async with Store(cfg.database) as store:
        head = Head(cfg, bus, store, loader=loader)
        if install_signals:
            install_stop_handlers(head.stop)
            install_reload_handler(head)
        if on_head is not None:
            on_head(head)
        # systemd (Type=notify) hears READY=1 once the socket accepts requests.
        async with bus, sdnotify.lifecycle(head.ready, what="gpud head", enabled=install_signals):
            await head.run()
    return 0
