"""What the daemons need from a message bus, and the topics they exchange messages on.

Topics live under ``gpud/<cluster>/``; code passes only the suffix.  What each kind's body
holds, and the one way to read one, is ``gpud.bus.messages``:

====================  ===========  ==========================================================
suffix                direction    kinds
====================  ===========  ==========================================================
``head/events``       worker→head  register, heartbeat, started, finished, samples (GPU
                                   telemetry), step_output, step_exit (gpuctl srun)
``head/status``       head→all     head_status (retained, will)
``head/requests``     relay→head   request (a gpuctl request relayed from another host;
                                   senders ``relay:<name>`` and ``worker:<name>``)
``relay/<n>/replies`` head→relay   reply
``node/<n>/status``   worker→all   node_status (retained, will)
``node/<n>/cmd``      head→worker  launch, lease (the answer to a heartbeat), signal, kill
                                   (fencing), ack, hello, mig (re-lay a dynamic MIG GPU),
                                   time_limit, step, step_kill, step_ack, step_input,
                                   step_resize
====================  ===========  ==========================================================

Delivery is QoS 1, so at least once: every handler tolerates repeats.  Nothing relies on a
single message arriving: workers repeat ``finished`` until the head ``ack``s it, heartbeats
carry the full set of running allocations, and the head re-sends ``launch`` for allocations
a worker does not report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, Union

from .messages import Body, encode

HEAD_EVENTS = "head/events"
HEAD_STATUS = "head/status"
HEAD_REQUESTS = "head/requests"


def topic_prefix(cluster: str) -> str:
    """What every topic of ``cluster`` starts with, before the suffix code passes."""
    return f"gpud/{cluster}/"


def node_status(node: str) -> str:
    return f"node/{node}/status"


def node_cmd(node: str) -> str:
    return f"node/{node}/cmd"


def relay_replies(name: str) -> str:
    return f"relay/{name}/replies"


@dataclass(frozen=True)
class Message:
    """A message whose seal (sender, topic, content), epoch and sequence have been verified."""

    topic: str          # suffix after gpud/<cluster>/
    kind: str
    sender: str
    msg_id: str
    ts: float
    body: dict[str, Any]
    retained: bool = False


@dataclass(frozen=True)
class Will:
    topic: str
    kind: str
    body: dict[str, Any]

    @classmethod
    def of(cls, topic: str, message: Body) -> "Will":
        return cls(topic, *encode(message))


# What ``publish`` takes: a message (what the daemons send), or a kind with a raw body for
# tests and tools that must put on the wire what no daemon would.
Sendable = Union[Body, str]


def wire(message: Sendable, body: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The (kind, body) to seal for what ``publish`` was given."""
    if isinstance(message, str):
        if body is None:
            raise TypeError(f"a raw {message} message needs its body")
        return message, body
    if body is not None:
        raise TypeError("a message object carries its own body")
    return encode(message)


class Bus(Protocol):
    """A connected, authenticated publish/subscribe channel.

    Implementations: ``gpud.bus.mqtt.MqttBus`` (aiomqtt; production and integration
    tests), ``gpud.bus.memory.MemoryBus`` (in-process: fast tests, and ``gpud standalone``'s
    worker) and ``gpud.bus.split.SplitBus`` (``gpud standalone``'s head: its own worker in
    the process, everyone else over MQTT).
    Use as ``async with bus:``; the bus reconnects by itself until closed.
    """

    # Set by the daemon: awaited (as its own task) after every successful (re)connect.
    on_connect: Callable[[], Awaitable[None]] | None

    async def __aenter__(self) -> "Bus": ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def publish(self, topic: str, message: Sendable, body: dict[str, Any] | None = None, *,
                      retain: bool = False) -> None:
        """Sign and send ``message`` at QoS 1 (``gpud.bus.messages.encode``; a kind and a raw
        body: see ``wire``); while disconnected, queue (bounded) and send on reconnect."""

    def messages(self) -> AsyncIterator[Message]:
        """Verified messages on the subscribed topics; bad ones are logged and dropped."""

    async def wait_connected(self) -> None:
        """Return once connected (immediately when already connected)."""
