"""The retained statuses: ``head_status`` and ``node_status`` (also the workers' last will)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..fields import MessageError, choice, flag, obj, text
from .body import Body

STATES = ("online", "offline")


# -- statuses (retained, and the last wills) --------------------------------------------------------

@dataclass(frozen=True)
class HeadStatus(Body):
    """``head_status``: the head is online or offline; ``refresh``: its periodic
    re-publication, which outranks any older status."""

    KIND: ClassVar[str] = "head_status"

    state: str
    version: str | None = None
    refresh: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"state": self.state}
        if self.version is not None:
            body["version"] = self.version
        if self.refresh:
            body["refresh"] = True
        return body

    @classmethod
    def from_body(cls, d: Any) -> "HeadStatus":
        d = obj(d)
        state = d.get("state")
        if state not in STATES:
            raise MessageError(f"unknown head state {state!r:.40}")
        return cls(state, text(d, "version", None, most=64), flag(d, "refresh"))


@dataclass(frozen=True)
class NodeStatus(Body):
    """``node_status``: the worker is online or offline."""

    KIND: ClassVar[str] = "node_status"

    state: str

    def to_body(self) -> dict[str, Any]:
        return {"state": self.state}

    @classmethod
    def from_body(cls, d: Any) -> "NodeStatus":
        return cls(choice(obj(d), "state", STATES))
