"""The socket verbs of ``gpuctl srun`` and ``sattach`` (``OPS``: ``step_launch``,
``step_poll``, ``step_cancel``, ``step_input``, ``step_resize``), each handed to the head's
``Steps`` (gpud.head.steps), and the checks of the arguments they share: counts and a
reader's cursor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ctlsocket import Caller, RequestError
from ..protocol import is_int

if TYPE_CHECKING:
    from .daemon import Head


def is_count(v: Any) -> bool:
    """A non-negative integer (not a bool)."""
    return is_int(v) and v >= 0


def require_counts(**values: Any) -> None:
    """Refuse a request unless each of ``values`` is a non-negative integer."""
    for name, v in values.items():
        if not is_count(v):
            raise RequestError(f"srun: {name} must be a non-negative integer")


def parse_cursor(value: Any) -> dict[str, int]:
    """A reader's cursor: node -> the next item number it wants."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 4096 or not all(
            isinstance(k, str) and is_count(v) for k, v in value.items()):
        raise RequestError("srun: cursor must map node names to item numbers")
    return dict(value)


async def op_step_launch(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.launch(caller, args)


async def op_step_poll(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.poll(caller, args)


async def op_step_cancel(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.cancel(caller, args)


async def op_step_input(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.write(caller, args)


async def op_step_resize(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.resize(caller, args)


OPS = {"step_launch": op_step_launch, "step_poll": op_step_poll, "step_cancel": op_step_cancel,
       "step_input": op_step_input, "step_resize": op_step_resize}
