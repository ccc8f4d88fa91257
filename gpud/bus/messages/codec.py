"""The one table of kinds and the one door each way: ``encode`` and ``decode``."""

from __future__ import annotations

from typing import Any

from ..fields import MessageError, is_int
from .body import VERSION, Body
from .commands import Ack, Hello, Kill, Launch, Lease, MigRelayout, Signal, TimeLimit
from .relay import Reply, Request
from .reports import Finished, Heartbeat, Register, Samples, Started
from .status import HeadStatus, NodeStatus
from .steps import StepAck, StepExit, StepInput, StepKill, StepOutput, StepResize, StepStart


# -- the one table, the one door ---------------------------------------------------------------------

KINDS: dict[str, type[Body]] = {cls.KIND: cls for cls in (
    Launch, Lease, Signal, Kill, Ack, Hello, MigRelayout, TimeLimit,
    StepStart, StepKill, StepAck, StepInput, StepResize, StepOutput, StepExit,
    Register, Heartbeat, Started, Finished, Samples, HeadStatus, NodeStatus, Request, Reply,
)}


def encode(msg: Body) -> tuple[str, dict[str, Any]]:
    """The (kind, body) a bus seals for ``msg``."""
    if type(msg) not in KINDS.values():
        raise TypeError(f"not a message: {type(msg).__name__}")
    return msg.KIND, {"v": VERSION, **msg.to_body()}


def decode(kind: Any, body: Any) -> Body:
    """The message a (kind, body) from the bus is; MessageError when it is none."""
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message kind {kind!r:.40}")
    if not isinstance(body, dict):
        raise MessageError("body must be an object")
    version = body.get("v", 1)
    if not is_int(version) or version < 1:
        raise MessageError(f"v must be a positive integer, not {version!r:.20}")
    if version > VERSION:
        raise MessageError(f"from a newer gpud (message version {version}; this one reads {VERSION})")
    try:
        return cls.from_body(body)
    except MessageError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as e:
        # a shape no check above foresaw: still one line, never a crash
        raise MessageError(f"malformed {kind}: {type(e).__name__}: {e}"[:300]) from None
