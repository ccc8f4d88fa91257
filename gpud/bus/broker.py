"""An MQTT broker inside the current event loop, for ``gpud standalone``.

A single GPU box should not need a system Mosquitto to try gpud, so standalone mode runs
amqtt (an asyncio MQTT 3.1.1 broker) in its own process for everyone outside it: relays
(``gpud relay``, the worker's ``relay_socket``) and any other worker pointed at it.  The
head and its own worker speak inside the process (``gpud.bus.split``) and never use it.
It keeps retained messages and fires last wills, which is all gpud needs;
it also keeps QoS 1 messages for persistent sessions while their client is away.  It
keeps nothing on disk, so a restart forgets retained statuses and sessions (the daemons
re-announce themselves on reconnect anyway).  Production clusters use Mosquitto
(``etc/mosquitto/gpud.conf``).

Usage::

    async with EmbeddedBroker(port=0) as broker:   # 0: any free port
        bus = MqttBus(broker.url, ...)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from amqtt.broker import Broker
from amqtt.plugins.base import BaseAuthPlugin

log = logging.getLogger("gpud.bus")

# amqtt and its state-machine library log every connection and packet at INFO.
_CHATTY_LOGGERS = ("amqtt", "transitions")


def quiet_amqtt_logging(level: int = logging.WARNING) -> None:
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(level)


class OpenAuth(BaseAuthPlugin):
    """Admit every client.  Messages are sealed (encrypted and authenticated) with keys from
    the cluster key, so what this broker routes is opaque to everyone else on it.

    amqtt's own anonymous plugin marks sessions anonymous, and amqtt then keeps no
    messages for a persistent session while its client is away.
    """

    @dataclass
    class Config:
        pass

    async def authenticate(self, *, session: Any) -> bool:
        return True


class EmbeddedBroker:
    """amqtt on ``host:port`` for as long as the ``async with`` block runs."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._broker: Any = None

    @property
    def url(self) -> str:
        if self._broker is None:
            raise RuntimeError("the embedded broker is not running")
        return f"mqtt://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._broker is not None

    async def start(self) -> "EmbeddedBroker":
        if self._broker is not None:
            return self
        quiet_amqtt_logging()
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            # Only this: the default plugins add packet loggers and a $SYS publisher.
            "plugins": {f"{__name__}.OpenAuth": {}},
        }
        broker = Broker(config)
        try:
            await broker.start()
        except Exception as e:
            raise OSError(f"cannot start the embedded MQTT broker on {self.host}:{self.port}: "
                          f"{_root_cause(e)}") from None
        sockets = broker._servers["default"].instance.sockets  # the only way to learn port 0's port
        self.port = sockets[0].getsockname()[1]
        self._broker = broker
        log.info("embedded MQTT broker listening on %s", self.url)
        return self

    async def stop(self) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            try:
                await broker.shutdown()
            except Exception:
                log.exception("embedded MQTT broker: error while shutting down")

    async def __aenter__(self) -> "EmbeddedBroker":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _root_cause(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return str(e) or type(e).__name__
