"""Field readers for message bodies: each checks one key and raises ``MessageError``.

``gpud.bus.messages`` builds every ``from_body`` from these, so a malformed field reads the
same whatever the message: ``<key> must be ...``, one line, the value cut short.  A key that
is absent or null takes its default; with none given it is missing, which is an error.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, TypeVar

MAX_ID = 2**63 - 1          # job ids, attempts, step ids, sequence numbers: what SQLite holds
MAX_NAME = 256              # node names, writers, reasons and other short texts
_ENV_NAME = re.compile(r"^[^=\x00]+$")

T = TypeVar("T")


class MessageError(ValueError):
    """A message body gpud would never send: malformed, of an unknown kind, or of a newer
    major version.  The text says what, in one line."""

    def __init__(self, reason: str) -> None:
        reason = " ".join(str(reason).splitlines())
        super().__init__(reason)
        self.reason = reason


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def obj(d: Any, what: str = "body") -> dict:
    if not isinstance(d, dict):
        raise MessageError(f"{what} must be an object")
    return d


def is_int(v: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def _get(d: dict, key: str, default: Any) -> tuple[bool, Any]:
    """(absent, the value or the default): absent or null takes the default."""
    v = d.get(key)
    if v is None:
        if default is MISSING:
            raise MessageError(f"{key} is missing")
        return True, default
    return False, v


def integer(d: dict, key: str, lo: int = 0, hi: int = MAX_ID, default: Any = MISSING) -> Any:
    absent, v = _get(d, key, default)
    if absent:
        return v
    if not is_int(v) or not lo <= v <= hi:
        raise MessageError(f"{key} must be an integer from {lo} to {hi}, not {v!r:.40}")
    return v


def any_int(d: dict, key: str) -> int | None:
    """An integer of any size, or None (values the receiver clamps itself)."""
    v = d.get(key)
    if v is not None and not is_int(v):
        raise MessageError(f"{key} must be an integer or null, not {v!r:.40}")
    return v


def number(d: dict, key: str, lo: float, hi: float, default: Any = MISSING, *, above: bool = False) -> Any:
    """A finite number in [lo, hi] (``above``: in (lo, hi]), as given (int or float)."""
    absent, v = _get(d, key, default)
    if absent:
        return v
    if not is_number(v) or not (lo < v if above else lo <= v) or not v <= hi:
        raise MessageError(f"{key} must be a number from {lo:g} {'(excluded) ' if above else ''}to {hi:g}, "
                           f"not {v!r:.40}")
    return v


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def seconds(d: dict, key: str, default: float | None, *, zero_ok: bool = False) -> float | None:
    v = d.get(key)
    if v is None:
        return default
    if not is_number(v) or v < 0 or (v == 0 and not zero_ok):
        raise MessageError(f"{key} must be a {'non-negative' if zero_ok else 'positive'} "
                           f"number of seconds, not {v!r:.40}")
    return float(v)


def text(d: dict, key: str, default: Any = MISSING, *, most: int | None = None) -> Any:
    """A non-empty string without NUL (of at most ``most`` characters)."""
    absent, v = _get(d, key, default)
    if absent:
        return v
    if not isinstance(v, str) or not v or "\x00" in v or (most is not None and len(v) > most):
        limit = f" of at most {most} characters" if most is not None else ""
        raise MessageError(f"{key} must be a non-empty string{limit} without NUL, not {v!r:.40}")
    return v


def any_text(d: dict, key: str, default: Any = None) -> Any:
    """Any string (the empty one too), or the default when absent or null."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise MessageError(f"{key} must be a string, not {v!r:.40}")
    return v


def flag(d: dict, key: str, default: bool = False) -> bool:
    v = d.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise MessageError(f"{key} must be true or false, not {v!r:.40}")
    return v


def choice(d: dict, key: str, options: Iterable[str], default: Any = MISSING) -> Any:
    options = tuple(options)
    absent, v = _get(d, key, default)
    if absent:
        return v
    if v not in options:
        raise MessageError(f"{key} must be one of {', '.join(options)}, not {v!r:.40}")
    return v


def env(d: dict, key: str) -> dict[str, str]:
    """Environment variables: names without '=' or NUL, string values without NUL."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise MessageError(f"{key} must be an object")
    for k, val in v.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k) or not isinstance(val, str) or "\x00" in val:
            raise MessageError(f"{key} must map variable names to strings (bad entry {k!r:.40})")
    return dict(v)


def items(d: dict, key: str, most: int, read: Callable[[Any], T], shape: str,
          default: Any = MISSING) -> Any:
    """A list of at most ``most`` items, each read by ``read`` (which returns None for a
    bad one): a tuple of what it read."""
    absent, v = _get(d, key, default)
    if absent:
        return v
    if not isinstance(v, list) or len(v) > most:
        raise MessageError(f"{key} must be a list of at most {most} {shape}")
    out = []
    for item in v:
        got = read(item)
        if got is None:
            raise MessageError(f"{key} must be a list of {shape}, not with {item!r:.40}")
        out.append(got)
    return tuple(out)


def some(d: dict, key: str, most: int, read: Callable[[Any], T], shape: str) -> tuple[T, ...]:
    """Like ``items``, but an item ``read`` refuses is skipped (absent or null: none)."""
    v = d.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > most:
        raise MessageError(f"{key} must be a list of at most {most} {shape}")
    return tuple(got for got in map(read, v) if got is not None)


def pair(item: Any) -> tuple[int, int] | None:
    """[job, attempt], both non-negative."""
    if isinstance(item, list) and len(item) == 2 and all(is_int(x) and 0 <= x <= MAX_ID for x in item):
        return item[0], item[1]
    return None


def pairs(d: dict, key: str, most: int, default: Any = MISSING) -> tuple[tuple[int, int], ...]:
    return items(d, key, most, pair, "[job, attempt]", default)
