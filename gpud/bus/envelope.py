"""Signed envelopes: how a message proves who sent it, when, and that it is new.

Theory of operation
-------------------
Every payload on the bus is one JSON object::

    {"body": {...}, "id": "...", "kind": "...", "sender": "...", "topic": "node/n1/cmd",
     "ts": 1712345678.9, "v": 1, "sig": "<hex>"}

``sig`` is HMAC-SHA256, keyed with the cluster key, over the *canonical* JSON of every
other field (sorted keys, compact separators, ASCII escapes).  The receiver parses the
payload, re-serialises it canonically and compares MACs in constant time, so the
signature does not depend on how the sender happened to format its bytes.  ``topic``
is the topic suffix the sender published to; signing it stops a captured command for
one node being replayed onto another node's topic.  (An empty ``topic`` means unbound;
the buses always bind one.)

A signature alone does not stop replays, so ``Verifier`` also checks:

* freshness: ``ts`` must be within ``max_skew`` seconds of the receiver's clock.
  Retained messages and last wills are old by nature; the caller opens them with
  ``allow_stale=True``, which skips this check but nothing else.
* uniqueness: ids are remembered until their message would be rejected as stale
  anyway (``ts + max_skew``), or for ``replay_window`` seconds after receipt when
  opened with ``allow_stale``.  The cache holds at most ``max_ids`` ids; when a flood
  fills it, the oldest entries are forgotten and ``floor`` rises to the newest
  timestamp forgotten, and fresh messages at or below the floor are refused.  So
  memory stays bounded and a forgotten id can still never be replayed.

Sans-IO and stdlib only: no sockets, no clock (callers pass ``now``), no asyncio.
Everything wrong with a payload raises ``EnvelopeError`` with a short reason.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .base import Message

VERSION = 1
MAX_PAYLOAD = 1024 * 1024
MAX_NAME = 256           # longest kind, sender, id or topic accepted
RESEAL_AFTER = 30.0      # a bus re-signs a queued message older than this before sending it
_FIELDS = ("v", "kind", "sender", "id", "ts", "topic", "body", "sig")


class EnvelopeError(ValueError):
    """A payload that is not a valid, fresh, unseen message from a key holder."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Envelope:
    """The verified fields of a payload."""

    kind: str
    sender: str
    msg_id: str
    ts: float
    topic: str
    body: dict[str, Any]

    def message(self, *, retained: bool = False) -> Message:
        return Message(topic=self.topic, kind=self.kind, sender=self.sender, msg_id=self.msg_id,
                       ts=self.ts, body=self.body, retained=retained)


def new_id() -> str:
    return secrets.token_hex(12)


_LOCAL_IDS = itertools.count(1)   # unsigned payloads' ids: unique in the process is enough


# Encoders built once: json.dumps would rebuild one per call, a third of sealing's cost.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_PLAIN = json.JSONEncoder(separators=(",", ":"))


def _canonical(obj: dict[str, Any]) -> bytes:
    return _CANONICAL.encode(obj).encode("ascii")


def _mac(key: bytes, unsigned: dict[str, Any]) -> str:
    return hmac.new(key, _canonical(unsigned), hashlib.sha256).hexdigest()


def _signed(key: bytes, unsigned: dict[str, Any]) -> bytes:
    """The payload: the canonical unsigned object with ``sig`` appended as its last field."""
    canonical = _canonical(unsigned)
    sig = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return canonical[:-1] + b',"sig":"' + sig.encode("ascii") + b'"}'


def seal(key: bytes, sender: str, kind: str, body: dict[str, Any], *, now: float,
         msg_id: str | None = None, topic: str = "") -> bytes:
    """The signed payload for one message.  ``body`` must be JSON-serialisable."""
    if not key:
        raise ValueError("empty cluster key")
    if not isinstance(body, dict):
        raise TypeError(f"message body must be a dict, not {type(body).__name__}")
    unsigned = {"v": VERSION, "kind": kind, "sender": sender, "id": msg_id or new_id(),
                "ts": float(now), "topic": topic, "body": body}
    for name in ("kind", "sender", "id", "topic"):
        value = unsigned[name]
        if not isinstance(value, str) or len(value) > MAX_NAME or (name != "topic" and not value):
            raise ValueError(f"invalid envelope {name}: {value!r}")
    # Round-trip the body so the MAC covers exactly what the receiver will parse
    # (tuples become lists, int keys become strings and sort as strings).
    unsigned["body"] = json.loads(_PLAIN.encode(body))
    payload = _signed(key, unsigned)
    if len(payload) > MAX_PAYLOAD:
        raise EnvelopeError(f"message too large ({len(payload)} bytes, limit {MAX_PAYLOAD})")
    return payload


def unsigned_payload(sender: str, kind: str, body: dict[str, Any], *, now: float, topic: str) -> bytes:
    """The envelope's fields without a signature, for an in-process broker nobody else can
    reach (``gpud.bus.memory``, ``signed=False``); ``open_unsigned`` reads it."""
    if not isinstance(body, dict):
        raise TypeError(f"message body must be a dict, not {type(body).__name__}")
    return _PLAIN.encode({"kind": kind, "sender": sender, "id": f"local-{next(_LOCAL_IDS)}", "ts": float(now),
                          "topic": topic, "body": body}).encode()


def open_unsigned(payload: bytes, topic: str) -> Envelope:
    """What ``unsigned_payload`` made: parsed, not verified (EnvelopeError if malformed)."""
    try:
        obj = json.loads(payload)
        return Envelope(kind=obj["kind"], sender=obj["sender"], msg_id=obj["id"], ts=obj["ts"],
                        topic=topic, body=obj["body"])
    except (ValueError, TypeError, KeyError):
        raise EnvelopeError("malformed unsigned payload") from None


def reseal(key: bytes, payload: bytes, *, now: float) -> bytes:
    """``payload`` re-signed with timestamp ``now``, keeping its id.

    For messages that waited in a queue while the broker was away: the receiver would
    refuse them as stale, yet a repeat must keep its id so it can be recognised as one.
    """
    obj, _ = _parse(payload)
    obj.pop("sig")
    obj["ts"] = float(now)
    return _signed(key, obj)


def may_be_stale(topic: str, retained: bool) -> bool:
    """Whether a message on ``topic`` may carry an old timestamp.

    Retained messages are as old as their last update, and last wills are sealed when
    their client connected; wills go to status topics, and the broker delivers them to
    current subscribers without the retained flag.
    """
    return retained or topic.endswith("/status")


def _parse(payload: bytes) -> tuple[dict[str, Any], float]:
    """The payload's fields, as sent, and its timestamp; EnvelopeError if malformed."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise EnvelopeError("payload is not bytes")
    if len(payload) > MAX_PAYLOAD:
        raise EnvelopeError("too large")
    if not payload:
        raise EnvelopeError("empty payload")
    try:
        obj = json.loads(bytes(payload))
    except (ValueError, RecursionError):  # ValueError includes UnicodeDecodeError
        raise EnvelopeError("not JSON") from None
    if not isinstance(obj, dict):
        raise EnvelopeError("not a JSON object")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise EnvelopeError(f"missing field {missing[0]!r}")
    extra = set(obj) - set(_FIELDS)
    if extra:
        raise EnvelopeError(f"unknown field {sorted(extra)[0]!r}")
    if obj["v"] != VERSION or isinstance(obj["v"], bool):
        raise EnvelopeError(f"unsupported version {obj['v']!r}")
    for name in ("kind", "sender", "id", "topic", "sig"):
        value = obj[name]
        if not isinstance(value, str) or len(value) > MAX_NAME or (name != "topic" and not value):
            raise EnvelopeError(f"bad field {name!r}")
    ts = obj["ts"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise EnvelopeError("bad field 'ts'")
    try:
        ts = float(ts)
    except OverflowError:
        raise EnvelopeError("bad field 'ts'") from None
    if not math.isfinite(ts):
        raise EnvelopeError("bad field 'ts'")
    if not isinstance(obj["body"], dict):
        raise EnvelopeError("bad field 'body'")
    return obj, ts


class Verifier:
    """Opens payloads for one receiver; holds that receiver's replay cache."""

    def __init__(self, key: bytes, *, max_skew: float = 120.0, replay_window: float | None = None,
                 max_ids: int = 200_000) -> None:
        if not key:
            raise ValueError("empty cluster key")
        if max_skew <= 0 or max_ids <= 0:
            raise ValueError("max_skew and max_ids must be positive")
        self._key = bytes(key)
        self.max_skew = float(max_skew)
        self.replay_window = float(replay_window if replay_window is not None else 2 * max_skew)
        self.max_ids = max_ids
        # Both map id -> a time, in receipt order.  _fresh: the message's ts (the id is
        # kept until ts + max_skew); _stale: when to forget an id opened with allow_stale.
        self._fresh: OrderedDict[str, float] = OrderedDict()
        self._stale: OrderedDict[str, float] = OrderedDict()
        self.floor = -math.inf

    def __len__(self) -> int:
        return len(self._fresh) + len(self._stale)

    def open(self, payload: bytes, *, now: float, allow_stale: bool = False,
             topic: str | None = None) -> Envelope:
        """Verify ``payload``; ``topic``, when given, must be the one it was signed for."""
        obj, ts = _parse(payload)
        sig = obj.pop("sig")
        # The MAC is checked before any judgement of content, so an outsider without
        # the key learns nothing from which later check failed.
        if not hmac.compare_digest(_mac(self._key, obj), sig):
            raise EnvelopeError("bad signature")
        # An empty topic is unbound (``seal`` without one).  Only a key holder can make
        # such a payload, and every bus binds its topic, so captured traffic cannot be
        # moved to another topic this way.
        if topic is not None and obj["topic"] and obj["topic"] != topic:
            raise EnvelopeError(f"signed for topic {obj['topic']!r}")
        if not allow_stale:
            if ts < now - self.max_skew:
                raise EnvelopeError(f"stale ({now - ts:.0f}s old, limit {self.max_skew:.0f}s)")
            if ts > now + self.max_skew:
                raise EnvelopeError(f"from the future ({ts - now:.0f}s ahead, limit {self.max_skew:.0f}s)")
        self._remember(obj["id"], ts, now, allow_stale)
        return Envelope(kind=obj["kind"], sender=obj["sender"], msg_id=obj["id"], ts=ts,
                        topic=topic if topic is not None else obj["topic"], body=obj["body"])

    def _remember(self, msg_id: str, ts: float, now: float, stale: bool) -> None:
        seen_ts = self._fresh.get(msg_id)
        if seen_ts is not None and seen_ts + self.max_skew >= now:
            raise EnvelopeError("replayed")
        forget_at = self._stale.get(msg_id)
        if forget_at is not None and forget_at >= now:
            raise EnvelopeError("replayed")
        if not stale and ts <= self.floor:
            raise EnvelopeError("too old to check for replay (replay cache overflowed)")
        if stale:
            self._stale[msg_id] = now + self.replay_window
            self._stale.move_to_end(msg_id)
            _trim(self._stale, now, 0.0, self.max_ids)
        else:
            self._fresh[msg_id] = ts
            self._fresh.move_to_end(msg_id)
            evicted = _trim(self._fresh, now, self.max_skew, self.max_ids)
            if evicted is not None:
                self.floor = max(self.floor, evicted)


def _trim(seen: OrderedDict[str, float], now: float, keep_for: float, cap: int) -> float | None:
    """Forget expired ids; past ``cap``, the oldest too.  Returns the newest time forgotten
    early (None if none was)."""
    # Times are nearly in receipt order, so trimming the front is O(1) amortised.
    while seen:
        first = next(iter(seen.values()))
        if first + keep_for >= now:
            break
        seen.popitem(last=False)
    if len(seen) <= cap:
        return None
    for k in [k for k, t in seen.items() if t + keep_for < now]:
        del seen[k]
    # Evict down to 90% so the O(n) sweep above runs once per cap/10 insertions at most.
    newest = None
    while len(seen) > cap * 9 // 10:
        _, t = seen.popitem(last=False)
        newest = t if newest is None else max(newest, t)
    return newest
