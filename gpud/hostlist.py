"""Slurm's hostlist notation: ``gpu[01-04,07],login1`` for a set of node names.

Theory of operation
-------------------
A hostlist is a list of *expressions* separated by commas or whitespace (commas inside
brackets belong to the brackets).  An expression is literal text with any number of
bracket groups; each group is a comma-separated list of numbers and ``LO-HI`` ranges.
``expand`` takes the cartesian product of the groups, the last group varying fastest, so
``rack[1-2]-n[1-3]`` is rack1-n1, rack1-n2, rack1-n3, rack2-n1, ...  A range keeps the
width of its lower bound: ``[08-10]`` is 08, 09, 10 and ``[8-10]`` is 8, 9, 10.  The size
of an expansion is computed before anything is built, so ``n[1-999999999]`` is refused
with a ValueError instead of filling memory.

``compress`` goes the other way, Slurm's way: names are sorted naturally and deduplicated,
the trailing number of each name is its index, and names that share a prefix and a digit
width collapse into one bracket group of ranges.  A number written without leading zeros
(``10``) joins a zero-padded group of the same width (``[08-10]``), which reads the same.
``expand(compress(names))`` names each of ``names`` exactly once (tests check that for
arbitrary names), and ``compress`` of that gives the same text back.

Pure and stdlib-only: gpuctl calls it on every ``-w``/``-x``, the head on node records.
"""

from __future__ import annotations

import re
from typing import Iterable

MAX_NAMES = 65536          # the most names one expression may expand to
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")   # what a worker may be called
_DIGITS = "0123456789"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_SEPARATORS = ", \t\r\n"
_UNWRITABLE = re.compile(r"[\[\],\s]")


def expand(text: str, *, limit: int = MAX_NAMES) -> list[str]:
    """The names ``text`` denotes, in order (duplicates kept); ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"a hostlist must be text, not {text!r}")
    names: list[str] = []
    for expression in _split(text):
        pieces = _pieces(expression, text)
        size = 1
        for piece in pieces:
            size *= len(piece) if isinstance(piece, list) else 1
        if len(names) + size > limit:
            raise ValueError(f"hostlist {_short(text)} names more than {limit} nodes")
        product = [""]
        for piece in pieces:
            choices = piece if isinstance(piece, list) else [piece]
            product = [head + choice for head in product for choice in choices]
        names += product
    return names


def compress(names: Iterable[str]) -> str:
    """The shortest Slurm hostlist for ``names``: ``gpu01,gpu02,gpu03,gpu07`` -> ``gpu[01-03,07]``."""
    unique = set(names)
    bad = next((name for name in unique if not name or _UNWRITABLE.search(name)), None)
    if bad is not None:
        raise ValueError(f"{bad!r} cannot be written in a hostlist")
    padded: dict[tuple[str, int], list[int]] = {}   # zero-padded indices, by (prefix, width)
    plain: dict[str, list[int]] = {}                 # indices written without leading zeros
    singles: list[str] = []
    for name in unique:
        prefix = name.rstrip(_DIGITS)
        digits = name[len(prefix):]
        if not digits:
            singles.append(name)
        elif len(digits) > 1 and digits[0] == "0":
            padded.setdefault((prefix, len(digits)), []).append(int(digits))
        else:
            plain.setdefault(prefix, []).append(int(digits))
    groups: list[tuple[str, int, list[int]]] = []
    for prefix, numbers in plain.items():
        numbers.sort()
        rest = []
        for n in numbers:
            width = len(str(n))
            if (prefix, width) in padded:       # 10 joins [08-09]: same width, same text
                padded[(prefix, width)].append(n)
            else:
                rest.append(n)
        if rest:
            groups.append((prefix, 0, rest))
    groups += [(prefix, width, sorted(numbers)) for (prefix, width), numbers in padded.items()]
    parts = [(_natural(s), s) for s in singles]
    for prefix, width, numbers in groups:
        first = f"{prefix}{numbers[0]:0{width}d}"
        parts.append((_natural(first), _group_text(prefix, width, numbers)))
    return ",".join(text for _, text in sorted(parts))


def _group_text(prefix: str, width: int, numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    ranges: list[str] = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:   # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    return f"{prefix}[{','.join(ranges)}]"


def _natural(name: str) -> tuple:
    """Sort key: ``gpu2`` before ``gpu10``; names of one prefix together."""
    prefix = name.rstrip(_DIGITS)
    return (prefix, int(name[len(prefix):]), name) if len(prefix) < len(name) else (name, -1, name)


def _split(text: str) -> list[str]:
    """Top-level expressions: separators inside brackets do not split."""
    out, current, depth = [], [], 0
    for c in text:
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"hostlist {_short(text)}: brackets cannot nest")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {_short(text)}: ']' without '['")
        if c in _SEPARATORS and depth == 0:
            if current:
                out.append("".join(current))
            current = []
        else:
            current.append(c)
    if depth:
        raise ValueError(f"hostlist {_short(text)}: '[' without ']'")
    if current:
        out.append("".join(current))
    return out


def _pieces(expression: str, whole: str) -> list[str | list[str]]:
    """Literal text and, for each bracket group, the list of its indices as text."""
    out: list[str | list[str]] = []
    for i, part in enumerate(re.split(r"[\[\]]", expression)):
        if i % 2 == 0:
            if part:
                out.append(part)
            continue
        indices: list[str] = []
        for item in part.split(","):
            m = _RANGE.match(item.strip())
            if not m:
                what = f"{item.strip()!r} is not a number or a LO-HI range" if item.strip() else "empty range"
                raise ValueError(f"hostlist {_short(whole)}: {what} in brackets")
            lo, hi = m.group(1), m.group(2)
            if hi is not None and int(hi) < int(lo):
                raise ValueError(f"hostlist {_short(whole)}: range {lo}-{hi} runs backwards")
            count = int(hi) - int(lo) + 1 if hi is not None else 1
            if len(indices) + count > MAX_NAMES:
                raise ValueError(f"hostlist {_short(whole)} names more than {MAX_NAMES} nodes")
            width = len(lo)
            indices += [f"{n:0{width}d}" for n in range(int(lo), int(lo) + count)]
        out.append(indices)
    return out


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
