"""Relayed gpuctl requests (gpud.relay): a ``request`` line and its ``reply``, each sent
in parts (``RelayPart``) that fit the envelope."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...protocol import MAX_LINE
from ..fields import MAX_ID, MessageError, is_int, is_number, obj
from .body import MAX_UID, Body

CHUNK_CHARS = 128 * 1024           # relayed line parts: even escaped 6x (\uXXXX), under the 1 MiB envelope
MAX_PARTS = MAX_LINE // CHUNK_CHARS + 2
MAX_REQUEST_ID = 64
MAX_USER = 64


# -- relayed gpuctl requests (gpud.relay) -----------------------------------------------------------

def valid_name(name: Any) -> bool:
    """A relay's (or user's) name: short, printable, no spaces, nothing MQTT gives meaning."""
    return isinstance(name, str) and 0 < len(name) <= 64 and not any(c in name for c in "/+#\0") \
        and name.isprintable() and not any(c.isspace() for c in name)


@dataclass(frozen=True)
class RelayPart(Body):
    """One part of a line: ``data`` is its ``part``-th slice of ``parts``."""

    id: str
    part: int
    parts: int
    data: str

    def part_body(self) -> dict[str, Any]:
        return {"id": self.id, "part": self.part, "parts": self.parts, "data": self.data}

    @classmethod
    def read_part(cls, d: Any) -> tuple[str, int, int, str]:
        d = obj(d)
        rid = d.get("id")
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_REQUEST_ID or not rid.isprintable():
            raise MessageError("missing or invalid id")
        part, parts, data = d.get("part"), d.get("parts"), d.get("data")
        if not is_int(parts) or not 1 <= parts <= MAX_PARTS:
            raise MessageError(f"parts must be an integer from 1 to {MAX_PARTS}")
        if not is_int(part) or not 0 <= part < parts:
            raise MessageError("part must be an integer below parts")
        if not isinstance(data, str) or len(data) > CHUNK_CHARS:
            raise MessageError(f"data must be a string of at most {CHUNK_CHARS} characters")
        return rid, part, parts, data

    @classmethod
    def id_of(cls, d: Any) -> str | None:
        """The id of a body whose part is well formed, else None: a request refused for
        the rest can still be answered."""
        try:
            return cls.read_part(d)[0]
        except MessageError:
            return None


@dataclass(frozen=True)
class Reply(RelayPart):
    """``reply``: a part of the head's response line to relayed request ``id``."""

    KIND: ClassVar[str] = "reply"

    def to_body(self) -> dict[str, Any]:
        return self.part_body()

    @classmethod
    def from_body(cls, d: Any) -> "Reply":
        return cls(*cls.read_part(d))


@dataclass(frozen=True, kw_only=True)
class Request(RelayPart):
    """``request``: a part of a gpuctl request line, with who asked as the relay's kernel
    saw them (SO_PEERCRED) and when the relay stops waiting (its clock)."""

    KIND: ClassVar[str] = "request"

    uid: int
    gid: int
    pid: int
    user: str              # the relay host's name for uid ("" when none): logs only
    deadline: float

    def to_body(self) -> dict[str, Any]:
        return {**self.part_body(), "uid": self.uid, "gid": self.gid, "pid": self.pid, "user": self.user,
                "deadline": self.deadline}

    @classmethod
    def from_body(cls, d: Any) -> "Request":
        part = cls.read_part(d)
        uid, gid, pid = d.get("uid"), d.get("gid"), d.get("pid")
        for what, v in (("uid", uid), ("gid", gid)):
            if not is_int(v) or not 0 <= v <= MAX_UID:
                raise MessageError(f"{what} must be an integer from 0 to {MAX_UID}")
        if not is_int(pid) or not 0 <= pid <= MAX_ID:
            raise MessageError("pid must be a non-negative integer")
        user = d.get("user", "")
        if not isinstance(user, str) or len(user) > MAX_USER or (user and not valid_name(user)):
            raise MessageError("user must be a short name without spaces")
        deadline = d.get("deadline")
        if not is_number(deadline):
            raise MessageError("deadline must be a finite number")
        return cls(*part, uid=uid, gid=gid, pid=pid, user=user, deadline=float(deadline))
