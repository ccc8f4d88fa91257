"""`gpud head`: build the real pieces (SQLite store, MQTT bus) around ``Head`` and run it."""

from __future__ import annotations

import asyncio
import logging
import signal

from ..bus.base import HEAD_EVENTS, HEAD_STATUS, Will
from ..config import Config
from ..keys import load_key
from .daemon import HEAD_SENDER, Head
from .store import Store

log = logging.getLogger("gpud.head")


def make_bus(cfg: Config, key: bytes):
    from ..bus.mqtt import MqttBus

    return MqttBus(
        cfg.broker.url, cfg.cluster, HEAD_SENDER, key,
        subscriptions=[HEAD_EVENTS, "node/+/status"],
        will=Will(HEAD_STATUS, "head_status", {"state": "offline"}),
        client_id=f"gpud-head-{cfg.cluster}", persistent=True,
        username=cfg.broker.username, password=cfg.broker.password, tls_ca=cfg.broker.ca_file,
    )


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


async def run_head(cfg: Config, *, on_ready=None) -> int:
    key = load_key(cfg.key_file)
    async with Store(cfg.database) as store:
        bus = make_bus(cfg, key)
        head = Head(cfg, bus, store)
        install_stop_handlers(head.stop)
        async with bus:
            runner = asyncio.create_task(head.run(), name="head")
            ready = asyncio.create_task(head.ready.wait())
            await asyncio.wait({runner, ready}, return_when=asyncio.FIRST_COMPLETED)
            if head.ready.is_set() and on_ready is not None:
                on_ready()
            await runner
    return 0
