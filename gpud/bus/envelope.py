"""Sealed envelopes: how a message stays secret, proves who sent it, and that it is new.

Theory of operation
-------------------
Every payload on the bus is a short clear header followed by one AEAD ciphertext::

    b"\\x02" | key id (4 bytes) | nonce (12 bytes) | ChaCha20-Poly1305(JSON fields) + tag

The JSON inside holds ``kind``, ``sender``, ``id``, ``ts`` (the sender's wall clock, shown
and used for a first contact only), ``epoch``, ``seq``, ``conn``, ``will`` and ``body``.
The associated data is the header and the topic suffix the sender published to, so a
captured command for one node cannot be moved onto another node's topic, and the tag
authenticates every field inside.  An observer of the broker learns topics and sizes only.

Keys.  The cluster key is never used directly: HKDF-SHA256 derives an encryption key
(the AEAD's) and an authentication key (HMAC-SHA256: the key id in the header, and the
client ids of ``gpud.bus.mqtt``) from it.  A ``Keyring`` seals with its first key and opens
with any of its keys, found by key id: that is how the cluster key is rotated without
stopping anything (docs/security.md).

Replay protection does not depend on clocks agreeing across hosts.  Each sending
process has an *epoch* (``gpud.bus.epoch``: its start, on its own clock, kept above a
persisted floor) and numbers its messages ``seq`` = 1, 2, 3...  ``Verifier`` keeps, per
sender, the newest epoch seen and a window of the sequence numbers seen in it:

* a newer epoch is that sender's new process: its state starts afresh;
* an older epoch is an earlier run of that sender: refused;
* in the same epoch, a number seen before, or one more than ``window`` below the highest
  seen, is refused ("replayed"); a QoS 1 repeat is the commonest case.

Only epochs of one sender are compared with each other, so one host's clock stepping
an hour either way changes nothing for its peers.  The clock is consulted once per
sender: a receiver with no state for a sender (it just started, or a flood evicted it)
accepts that sender's first message only if ``ts`` is within ``max_skew`` of its own
clock, as before epochs existed.  (A status alone, which may be old, does not count as
that first message.)

Status messages (``.../status`` topics: retained, and the last will) are re-delivered by
the broker and may be old by nature.  They skip the window and the clock; instead the newest
status per (topic, sender) wins, ordered by ``(epoch, conn, will, seq)``: ``conn`` is
the sequence number taken when the current connection began, which is also the will's,
so a will fired at a disconnect beats every status of its own connection, the next
connection's "online" beats the will, and a replayed old "offline" never beats anything.

Sans-IO: no sockets, no clock (callers pass ``now`` and ``epoch``), no asyncio; the only
dependency is ``cryptography`` for the AEAD.  Everything wrong with a payload raises
``EnvelopeError`` with a short reason.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Sequence, Union

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .base import Message

VERSION = 2
MAX_PAYLOAD = 1024 * 1024
MAX_NAME = 256           # longest kind, sender, id or topic accepted
RESEAL_AFTER = 30.0      # a bus re-seals a queued message older than this before sending it
WINDOW = 1 << 16         # sequence numbers this far below a sender's highest are still checked
MAX_SENDERS = 100_000    # senders a Verifier keeps state for; past it the oldest is forgotten
_KID_BYTES = 4
_NONCE_BYTES = 12
_HEADER = 1 + _KID_BYTES + _NONCE_BYTES
_AD_PREFIX = b"gpud bus v2\0"
_FIELDS = frozenset(("kind", "sender", "id", "ts", "epoch", "seq", "conn", "will", "body"))


class EnvelopeError(ValueError):
    """A payload that is not a valid, new message from a key holder."""

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
    epoch: int = 0
    seq: int = 0
    conn: int = 0
    will: bool = False

    def message(self, *, retained: bool = False) -> Message:
        return Message(topic=self.topic, kind=self.kind, sender=self.sender, msg_id=self.msg_id,
                       ts=self.ts, body=self.body, retained=retained)


def new_id() -> str:
    return secrets.token_hex(12)


# Sequence numbers are process-wide: buses of one process that share a sender name (a
# worker and its relay) then never reuse a number within their common epoch.
_SEQ = itertools.count(1)
_LOCAL_IDS = itertools.count(1)   # unsigned payloads' ids: unique in the process is enough

_PLAIN = json.JSONEncoder(separators=(",", ":"))


# -- keys -----------------------------------------------------------------------------------------

def _hkdf(key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"gpud cluster key",
                info=b"gpud bus " + purpose).derive(key)


class _Key:
    __slots__ = ("kid", "aead", "auth")

    def __init__(self, key: bytes) -> None:
        self.auth = _hkdf(key, b"authentication")
        self.aead = ChaCha20Poly1305(_hkdf(key, b"encryption"))
        self.kid = hmac.new(self.auth, b"key id", hashlib.sha256).digest()[:_KID_BYTES]


class Keyring:
    """Cluster keys: the first seals, every one opens (a rotation holds two)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        keys = [bytes(k) for k in keys]
        if not keys or not all(keys):
            raise ValueError("empty cluster key")
        self._keys = [_Key(k) for k in keys]
        self._by_kid = {}
        for k in self._keys:
            self._by_kid.setdefault(k.kid, k)

    @classmethod
    def of(cls, keys: "KeysLike") -> "Keyring":
        if isinstance(keys, Keyring):
            return keys
        if isinstance(keys, (bytes, bytearray, memoryview)):
            return cls([bytes(keys)])
        return cls(list(keys))

    @property
    def primary(self) -> _Key:
        return self._keys[0]

    def find(self, kid: bytes) -> _Key | None:
        return self._by_kid.get(kid)

    def client_tag(self, name: str) -> str:
        """A tag only key holders can compute, for broker client ids (gpud.bus.mqtt)."""
        return hmac.new(self.primary.auth, b"client id\0" + name.encode(), hashlib.sha256).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self._keys)


KeysLike = Union[bytes, Keyring, Iterable[bytes]]


# -- sealing --------------------------------------------------------------------------------------

def _check_names(fields: dict[str, Any]) -> None:
    for name in ("kind", "sender", "id"):
        value = fields[name]
        if not isinstance(value, str) or not value or len(value) > MAX_NAME:
            raise ValueError(f"invalid envelope {name}: {value!r}")


def _encrypt(key: _Key, topic: str, fields: dict[str, Any]) -> bytes:
    header = bytes((VERSION,)) + key.kid + secrets.token_bytes(_NONCE_BYTES)
    plain = _PLAIN.encode(fields).encode()
    payload = header + key.aead.encrypt(header[1 + _KID_BYTES:], plain, _AD_PREFIX + header + topic.encode())
    if len(payload) > MAX_PAYLOAD:
        raise EnvelopeError(f"message too large ({len(payload)} bytes, limit {MAX_PAYLOAD})")
    return payload


def seal(keys: KeysLike, sender: str, kind: str, body: dict[str, Any], *, now: float,
         msg_id: str | None = None, topic: str = "", epoch: int = 0, seq: int | None = None,
         conn: int = 0, will: bool = False) -> bytes:
    """The sealed payload for one message.  ``body`` must be JSON-serialisable.

    Daemons seal through a ``Sealer``, which keeps the epoch and connection; this is the
    one-off form (tests, tools).  ``seq`` defaults to the process's next number."""
    if not isinstance(body, dict):
        raise TypeError(f"message body must be a dict, not {type(body).__name__}")
    if not isinstance(topic, str) or len(topic) > MAX_NAME:
        raise ValueError(f"invalid envelope topic: {topic!r}")
    fields = {"kind": kind, "sender": sender, "id": msg_id or new_id(), "ts": float(now),
              "epoch": int(epoch), "seq": int(seq if seq is not None else next(_SEQ)),
              "conn": int(conn), "will": bool(will), "body": body}
    _check_names(fields)
    return _encrypt(Keyring.of(keys).primary, topic, fields)


def _decrypt(keyring: Keyring, payload: Any, topic: str) -> dict[str, Any]:
    """The payload's fields, authenticated and well-formed; EnvelopeError otherwise."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise EnvelopeError("payload is not bytes")
    payload = bytes(payload)
    if not payload:
        raise EnvelopeError("empty payload")
    if len(payload) > MAX_PAYLOAD:
        raise EnvelopeError("too large")
    if len(payload) < _HEADER + 16 or payload[0] != VERSION:
        raise EnvelopeError("not a gpud envelope (or from an incompatible version)")
    header = payload[:_HEADER]
    key = keyring.find(header[1:1 + _KID_BYTES])
    if key is None:
        raise EnvelopeError("sealed with an unknown key (another cluster's, or one rotated out)")
    try:
        plain = key.aead.decrypt(header[1 + _KID_BYTES:], payload[_HEADER:],
                                 _AD_PREFIX + header + topic.encode())
    except InvalidTag:
        # Also what a payload moved to another topic gives: the topic is associated data.
        raise EnvelopeError("bad seal (altered, or sealed for another topic)") from None
    # Only a key holder gets here; still, a key holder's bug must not crash a receiver.
    try:
        obj = json.loads(plain)
    except (ValueError, RecursionError):
        raise EnvelopeError("sealed content is not JSON") from None
    if not isinstance(obj, dict) or set(obj) != _FIELDS:
        raise EnvelopeError("sealed content lacks the envelope's fields")
    for name in ("kind", "sender", "id"):
        value = obj[name]
        if not isinstance(value, str) or not value or len(value) > MAX_NAME:
            raise EnvelopeError(f"bad field {name!r}")
    for name in ("epoch", "seq", "conn"):
        if isinstance(obj[name], bool) or not isinstance(obj[name], int) or obj[name] < 0:
            raise EnvelopeError(f"bad field {name!r}")
    ts = obj["ts"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise EnvelopeError("bad field 'ts'")
    obj["ts"] = float(ts)
    if not isinstance(obj["will"], bool):
        raise EnvelopeError("bad field 'will'")
    if not isinstance(obj["body"], dict):
        raise EnvelopeError("bad field 'body'")
    return obj


def reseal(keys: KeysLike, payload: bytes, *, now: float, topic: str) -> bytes:
    """``payload`` sealed again with timestamp ``now`` (and a new nonce), keeping its id,
    epoch and sequence number, so a repeat is still recognised as one.

    For messages that waited in a queue while the broker was away: a receiver meeting
    their sender for the first time judges them by ``ts``."""
    keyring = Keyring.of(keys)
    fields = _decrypt(keyring, payload, topic)
    fields["ts"] = float(now)
    return _encrypt(keyring.primary, topic, fields)


def peek(keys: KeysLike, payload: bytes, *, topic: str) -> Envelope:
    """A payload's content, authenticated but not checked for replay: for diagnostics and
    tests, never for acting on a message."""
    obj = _decrypt(Keyring.of(keys), payload, topic)
    return Envelope(kind=obj["kind"], sender=obj["sender"], msg_id=obj["id"], ts=obj["ts"], topic=topic,
                    body=obj["body"], epoch=obj["epoch"], seq=obj["seq"], conn=obj["conn"], will=obj["will"])


class Sealer:
    """Seals one sender's messages: its keys, its epoch, its current connection."""

    def __init__(self, keys: KeysLike, sender: str, *, epoch: int) -> None:
        self.keyring = Keyring.of(keys)
        self.sender = sender
        self.epoch = int(epoch)
        self.conn = 0

    def seal(self, kind: str, body: dict[str, Any], *, now: float, topic: str,
             msg_id: str | None = None) -> bytes:
        return seal(self.keyring, self.sender, kind, body, now=now, msg_id=msg_id, topic=topic,
                    epoch=self.epoch, conn=self.conn)

    def seal_will(self, kind: str, body: dict[str, Any], *, now: float, topic: str) -> bytes:
        """The will for a connection about to open: it starts the connection's numbering, so
        it outranks this connection's statuses and is outranked by the next one's."""
        self.conn = next(_SEQ)
        return seal(self.keyring, self.sender, kind, body, now=now, topic=topic, epoch=self.epoch,
                    seq=self.conn, conn=self.conn, will=True)

    def new_connection(self) -> None:
        """A connection without a will starts its numbering too."""
        self.conn = next(_SEQ)

    def reseal(self, payload: bytes, *, now: float, topic: str) -> bytes:
        return reseal(self.keyring, payload, now=now, topic=topic)


# -- unsigned (in-process) payloads ------------------------------------------------------------

def unsigned_payload(sender: str, kind: str, body: dict[str, Any], *, now: float, topic: str) -> bytes:
    """The envelope's fields in the clear, for an in-process broker nobody else can reach
    (``gpud.bus.memory``, ``signed=False``); ``open_unsigned`` reads it."""
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


def may_be_stale(topic: str, retained: bool) -> bool:
    """Whether a message on ``topic`` may be an old one delivered again: a status.

    gpud retains only statuses, and last wills (sealed when their client connected) go to
    status topics, which the broker delivers to current subscribers without the retained
    flag.  Anything else that comes retained was put there by someone replaying it, and is
    judged like any other message, flag or not (``retained`` is accepted for the callers'
    convenience and ignored).
    """
    return topic.endswith("/status")


# -- opening --------------------------------------------------------------------------------------

class _Peer:
    """What a receiver knows of one sender: its epoch and the numbers seen in it."""

    __slots__ = ("epoch", "top", "seen", "confirmed")

    def __init__(self, epoch: int, confirmed: bool) -> None:
        self.epoch = epoch
        self.top = 0      # highest sequence number seen (0: none yet)
        self.seen = 0     # bit i set: top - i was seen
        # Whether a message of this sender passed the first-contact clock check; a status
        # (which may be old) alone does not vouch for its epoch being the current one.
        self.confirmed = confirmed

    def check(self, seq: int, window: int) -> None:
        if seq > self.top:
            return
        behind = self.top - seq
        if behind >= window:
            raise EnvelopeError("replayed (too far behind its sender's newest message to be new)")
        if self.seen >> behind & 1:
            raise EnvelopeError("replayed")

    def record(self, seq: int, window: int) -> None:
        if seq > self.top:
            jump = seq - self.top
            # A jump past the window forgets everything (and never builds a huge int).
            self.seen = ((self.seen << jump) | 1) & ((1 << window) - 1) if jump < window else 1
            self.top = seq
        else:
            self.seen |= 1 << (self.top - seq)


class Verifier:
    """Opens payloads for one receiver; holds that receiver's replay state."""

    def __init__(self, keys: KeysLike, *, max_skew: float = 120.0, window: int = WINDOW,
                 max_senders: int = MAX_SENDERS) -> None:
        if max_skew <= 0 or window <= 0 or max_senders <= 0:
            raise ValueError("max_skew, window and max_senders must be positive")
        self.keyring = Keyring.of(keys)
        self.max_skew = float(max_skew)
        self.window = window
        self.max_senders = max_senders
        self._peers: dict[str, _Peer] = {}
        self._status: dict[tuple[str, str], tuple[int, int, bool, int]] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def open(self, payload: bytes, *, now: float, allow_stale: bool = False,
             topic: str | None = None) -> Envelope:
        """Verify ``payload``, sealed for ``topic`` (None: sealed without one).

        ``allow_stale``: a status message (retained, or a will): the newest per topic wins,
        whatever its age; see the module docstring."""
        topic = topic or ""
        obj = _decrypt(self.keyring, payload, topic)
        sender, epoch, seq = obj["sender"], obj["epoch"], obj["seq"]
        peer = self._peers.get(sender)
        if peer is not None and epoch < peer.epoch:
            raise EnvelopeError(f"from an earlier run of {sender} (epoch {epoch} < {peer.epoch})")
        if (peer is None or not peer.confirmed) and not allow_stale:
            # First contact: nothing to compare with but the clock.
            ts = obj["ts"]
            if ts < now - self.max_skew:
                raise EnvelopeError(f"stale ({now - ts:.0f}s old, limit {self.max_skew:.0f}s; "
                                    f"first message from {sender})")
            if ts > now + self.max_skew:
                raise EnvelopeError(f"from the future ({ts - now:.0f}s ahead, limit {self.max_skew:.0f}s; "
                                    f"first message from {sender})")
        fresh_epoch = peer is None or epoch > peer.epoch
        if allow_stale:
            rank = (epoch, obj["conn"], obj["will"], seq)
            last = self._status.get((topic, sender))
            if last is not None:
                if rank == last:
                    raise EnvelopeError("replayed")
                if rank < last:
                    raise EnvelopeError("older than the status already seen")
            self._status[(topic, sender)] = rank
        elif not fresh_epoch:
            peer.check(seq, self.window)
        if fresh_epoch:
            peer = self._new_peer(sender, epoch, confirmed=not allow_stale)
        if not allow_stale:
            peer.confirmed = True
            peer.record(seq, self.window)
        return Envelope(kind=obj["kind"], sender=sender, msg_id=obj["id"], ts=obj["ts"], topic=topic,
                        body=obj["body"], epoch=epoch, seq=seq, conn=obj["conn"], will=obj["will"])

    def _new_peer(self, sender: str, epoch: int, *, confirmed: bool) -> _Peer:
        self._peers.pop(sender, None)
        while len(self._peers) >= self.max_senders:
            del self._peers[next(iter(self._peers))]   # the longest known; it meets the clock again
        peer = self._peers[sender] = _Peer(epoch, confirmed)
        return peer
