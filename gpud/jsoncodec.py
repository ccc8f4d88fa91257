"""JSON for the socket protocol, without importing the ``json`` package.

gpuctl starts on every call, and ``import json`` loads ``re`` (with ``enum``, ``functools``
and ``collections``) and the pure-Python decoder and encoder: several times what a bare
interpreter start costs in a plain virtual environment.  The work itself is done by the C
accelerator ``_json`` either way, so this module calls it directly:

* ``dumps(obj)`` is ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``:
  the same C encoder, built with the arguments ``json`` would give it.
* ``loads(data)`` is ``json.loads(data)`` for the bytes or text of one JSON document:
  strict UTF-8, the C scanner, nothing but whitespace after the value.

Both are exact by construction on the common path and hand everything else to ``json``
itself: an object JSON cannot encode, a document that does not parse, leading whitespace,
a byte order mark or another encoding, or a Python without ``_json``.  So every error is
``json``'s own, with its messages, and ``json`` is imported only then; the one exception is
a document nested past the recursion limit, a ValueError here rather than json's
RecursionError, so that callers which catch ValueError for bad input catch it too.
"""

from __future__ import annotations

try:
    import _json
except ImportError:   # another implementation: json itself does all the work
    _json = None

TYPE_CHECKING = False   # typing costs gpuctl's start-up
if TYPE_CHECKING:
    from typing import Any

__all__ = ["dumps", "loads"]

_WHITESPACE = " \t\n\r"   # what json skips around a document


class _ScannerContext:
    """The decoder settings ``_json.make_scanner`` reads, as ``json.loads`` sets them."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__


_scan = _json.make_scanner(_ScannerContext()) if _json is not None else None


def _refuse(obj: object) -> None:
    raise TypeError   # json.dumps below raises json's own error for it


def dumps(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``."""
    if _json is not None:
        # A fresh markers dict each time: after a failure the C encoder leaves entries
        # behind that would make a later call see a circular reference.
        encode = _json.make_encoder({}, _refuse, _json.encode_basestring, None, ":", ",", False, False, True)
        try:
            return "".join(encode(obj, 0))
        except Exception:
            pass
    import json

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def loads(data: bytes | bytearray | str) -> Any:
    """``json.loads(data)``."""
    if _scan is not None:
        try:
            text = data if isinstance(data, str) else data.decode("utf-8")
            obj, end = _scan(text, 0)
        except Exception:
            pass   # not UTF-8, leading whitespace or a bad document: json says which
        else:
            if end == len(text) or not text[end:].strip(_WHITESPACE):
                return obj
    import json

    try:
        return json.loads(data)
    except RecursionError:
        # Nesting past the interpreter's recursion limit (about 1,000 levels): a bad document
        # like any other, not an error that escapes whoever decodes untrusted input.
        raise ValueError("JSON nested too deeply") from None
