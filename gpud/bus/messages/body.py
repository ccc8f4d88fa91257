"""The base of every message, and the pieces many kinds share.

``Body`` is what each kind is (``KIND``, ``to_body``, ``from_body``); ``VERSION`` is the
contract's major version; the bounds here hold for every kind that carries those fields.
The field readers themselves, and ``MessageError``, are ``gpud.bus.fields``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...model import SpecError, parse_rlimits
from ..fields import MessageError, integer

VERSION = 1
MAX_UID = 2**32 - 2                # uid/gid: (uid_t)-1 means "no id"
MAX_ALLOCS = 100_000               # [job, attempt] pairs in one message
MAX_GPUS = 4096                    # GPUs of one node (or one sample); far beyond any real node


class Body:
    """A message: ``KIND``, its body (``to_body``) and the checked way back (``from_body``)."""

    KIND: ClassVar[str] = ""

    def to_body(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_body(cls, d: Any) -> "Body":
        raise NotImplementedError


# -- ids shared by many kinds ---------------------------------------------------------------------

def _job(d: dict) -> tuple[int, int]:
    return integer(d, "job"), integer(d, "attempt")


def _pairs_body(pairs_: tuple[tuple[int, int], ...]) -> list[list[int]]:
    return [[j, a] for j, a in pairs_]


def read_rlimits(v: Any) -> dict[str, tuple[int, int]]:
    """Resource limits ``{NAME: [soft, hard]}`` a launch or a step carries (absent: none)."""
    try:
        return parse_rlimits(v)
    except SpecError as e:
        raise MessageError(str(e)) from None
