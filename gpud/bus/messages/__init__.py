"""The wire contract: one frozen dataclass per message kind, and the one place they are
encoded and decoded.

Theory of operation
-------------------
Every body on the bus is a JSON object.  ``encode(msg)`` gives the ``(kind, body)`` a bus
seals: the message's ``to_body()`` plus ``"v": VERSION``.  ``decode(kind, body)`` is the
only door back: it finds the class in ``KINDS``, checks the version and hands the body
to that class's ``from_body``, which checks every field.  Anything wrong (an unknown
kind, a field of the wrong type or range, a list past its bound, NaN, a negative id, a
newer major version) raises ``MessageError`` with one line; receivers log that line and
drop the message, never crash.  Two kinds bend this on purpose, because refusing them
would cost more than the bad field: a ``lease`` skips a malformed item (a lease refused is
a lease not renewed: the node would kill its jobs), and a ``finished`` takes exit codes
and texts of any size for the head to clamp (refused, it would be repeated for ever and
its job never end).

Versions.  ``v`` is the major version of the contract.  A body without one is from a peer
of before versions (a running older daemon during an upgrade) and reads as version 1.  A
newer major version is refused: its meaning may have changed.  Within a version, new
optional keys may appear, so keys a class does not know are ignored, and every key added
later has a default.  Body keys are those gpud always used, so older peers read what
newer ones send.

Senders build messages as these classes and hand them to ``Bus.publish``; no daemon
assembles a body by hand (``tests/test_import_rules.py`` checks).  Which kinds go on which
topic is the table in ``gpud.bus.base``.  What a receiver does with a well-formed message
(is this the right node, attempt, step?) is its own business: this module checks shapes
and bounds, nothing that needs state.

The kinds live by direction and purpose: ``body`` (the base ``Body``, the version and the
bounds many kinds share), ``commands`` (head -> worker about jobs), ``steps`` (gpuctl srun
steps, both ways), ``reports`` (worker -> head: the node, its allocations, telemetry),
``status`` (the retained statuses), ``relay`` (relayed gpuctl requests) and ``codec`` (the
table of kinds, ``encode`` and ``decode``).  Everything is imported from this package:
``from gpud.bus.messages import Launch``.
"""


from __future__ import annotations

from ..fields import MessageError
from .body import MAX_ALLOCS, MAX_GPUS, MAX_UID, VERSION, Body
from .codec import KINDS, decode, encode
from .commands import (DEFAULT_KILL_GRACE, DEVICE_KINDS, MAX_CHANGES, Ack, GpuAssignment, Hello, Kill, Launch, Lease,
                       MigRelayout, Signal, TimeLimit)
from .relay import CHUNK_CHARS, MAX_PARTS, MAX_REQUEST_ID, MAX_USER, RelayPart, Reply, Request, valid_name
from .reports import MAX_EXTRAS, MAX_SAMPLE_INTERVAL, Finished, Heartbeat, Register, Samples, Started
from .status import STATES, HeadStatus, NodeStatus
from .steps import (MAX_INPUT_CHUNK, MAX_LINES, MAX_SIGNAL, MAX_STATUS, MAX_TASKS_PER_NODE, MAX_WRITERS, STREAMS,
                    StepAck, StepExit, StepInput, StepKill, StepOutput, StepRef, StepResize, StepStart)

__all__ = [
    "VERSION", "MAX_UID", "MAX_ALLOCS", "MAX_GPUS", "MAX_EXTRAS", "MAX_SAMPLE_INTERVAL", "MAX_CHANGES",
    "MAX_TASKS_PER_NODE", "MAX_INPUT_CHUNK", "MAX_LINES", "MAX_WRITERS", "MAX_STATUS", "MAX_SIGNAL", "STREAMS",
    "DEVICE_KINDS", "STATES", "DEFAULT_KILL_GRACE", "CHUNK_CHARS", "MAX_PARTS", "MAX_REQUEST_ID", "MAX_USER",
    "MessageError", "Body",
    "GpuAssignment", "Launch", "Lease", "Signal", "Kill", "Ack", "Hello", "TimeLimit", "MigRelayout",
    "StepRef", "StepStart", "StepKill", "StepAck", "StepInput", "StepResize", "StepOutput", "StepExit",
    "Register", "Heartbeat", "Started", "Finished", "Samples",
    "HeadStatus", "NodeStatus",
    "valid_name", "RelayPart", "Reply", "Request",
    "KINDS", "encode", "decode",
]
