"""What the daemons need from a message bus, and the topics and messages they exchange.

Topics live under ``gpud/<cluster>/``; code passes only the suffix.

====================  ==========  ===========================================================
suffix                direction   kinds (body)
====================  ==========  ===========================================================
``head/events``       worker→head ``register`` {node: NodeInfo dict}
                                  ``heartbeat`` {seq, running: [[job, attempt]], done: [[job, attempt]]}
                                  ``started`` {job, attempt, pid, time}
                                  ``finished`` {job, attempt, exit_code, signal, reason,
                                  time, message}
                                  ``samples`` {t, iv, gpus: [[index, util, mem_mb, power_w,
                                  temp_c, energy_j]], jobs: [[job, attempt, [gpu]]], slices,
                                  procs}  (GPU telemetry; see gpud.worker.telemetry)
                                  ``step_output`` {job, attempt, step, seq, lines: [[rank,
                                  stream, text]]}  (gpuctl srun output; whole lines)
                                  ``step_exit`` {job, attempt, step, rank (null: every task
                                  of the node), exit_code, signal, message}
``head/status``       head→all    ``head_status`` {state: "online"|"offline", version, refresh}
                                  (retained, will; ``refresh``: the head's periodic
                                  re-publication, which outranks any older status)
``head/requests``     relay→head  ``request`` {id, part, parts, data, uid, gid, pid, user,
                                  deadline}  (a gpuctl request relayed from another host;
                                  senders ``relay:<name>`` and ``worker:<name>``; see
                                  gpud.relay)
``relay/<n>/replies`` head→relay  ``reply`` {id, part, parts, data}  (the response line)
``node/<n>/status``   worker→all  ``node_status`` {state: "online"|"offline"} (retained, will)
``node/<n>/cmd``      head→worker ``launch`` {job, attempt, lease: {seq}, ...see worker.executor.Launch}
                                  ``lease`` {seq, period, allocs: [[job, attempt]], limits:
                                  [[job, attempt, time_limit]]}  (the answer to heartbeat
                                  ``seq``: see gpud.worker.lease; limits repeat any lost
                                  ``time_limit``)
                                  ``signal`` {job, attempt, signal, grace, reason}
                                  ``kill`` {allocs: [[job, attempt]], reason}  (fencing)
                                  ``ack`` {done: [[job, attempt]]}  (head recorded these)
                                  ``hello`` {}  (head (re)started: please register)
                                  ``mig`` {gpu, destroy: [start], create: [{profile, start}],
                                  reason}  (re-lay a dynamic MIG GPU; a ``register`` with
                                  the new slices follows; see gpud.worker.gpumodes)
                                  ``step`` {job, attempt, step, argv, env, ntasks_per_node,
                                  node_rank, nnodes, nodelist, master_addr, master_port}
                                  (start gpuctl srun tasks; see gpud.worker.steps)
                                  ``step_kill`` {job, attempt, step}
                                  ``time_limit`` {job, attempt, time_limit}  (an operator's
                                  new limit for a running job; null: none)
====================  ==========  ===========================================================

Delivery is QoS 1, so at least once: every handler tolerates repeats.  Nothing relies on a
single message arriving: workers repeat ``finished`` until the head ``ack``s it, heartbeats
carry the full set of running allocations, and the head re-sends ``launch`` for allocations
a worker does not report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

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

    async def publish(self, topic: str, kind: str, body: dict[str, Any], *, retain: bool = False) -> None:
        """Sign and send at QoS 1; while disconnected, queue (bounded) and send on reconnect."""

    def messages(self) -> AsyncIterator[Message]:
        """Verified messages on the subscribed topics; bad ones are logged and dropped."""

    async def wait_connected(self) -> None:
        """Return once connected (immediately when already connected)."""
