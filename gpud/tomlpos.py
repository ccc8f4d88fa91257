"""Line numbers of the keys and tables in a TOML document, for error messages.

Theory of operation
-------------------
``tomllib`` parses a document into plain dicts and lists and forgets where each value came
from, so a message about a bad value could not say where it is.  ``key_lines(text)`` scans
the same text once more and returns ``{path: line}``: a path is a tuple of table names,
keys and array indexes, exactly as one would index the parsed data
(``("partition", 1, "max_time")`` for the second ``[[partition]]``'s ``max_time``), and the
line is 1-based.  Tables get the line of their header (or of the first key that creates
them implicitly); array elements get the line where the element starts.

The scanner assumes the text already parsed with ``tomllib`` (it is never the judge of
validity) and only needs to be good enough to point at a line: it follows headers, dotted
and quoted keys, every string form (multi-line ones included), arrays and inline tables.
On text it does not understand it stops and returns what it found so far.

``line_for(lines, path)`` answers for the longest prefix of ``path`` that has a line, so a
missing key points at its table and a missing table at nothing (``None``).
"""

from __future__ import annotations

import bisect
from typing import Union

Path = tuple[Union[str, int], ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class _Stop(Exception):
    """Text the scanner does not follow; it keeps what it has."""


def key_lines(text: str) -> dict[Path, int]:
    """``{path: line}`` for every table, key and array element in ``text``."""
    scanner = _Scanner(text)
    try:
        scanner.document()
    except (_Stop, IndexError, ValueError):
        pass
    return scanner.lines


def line_for(lines: dict[Path, int], path: Path) -> int | None:
    """The line of ``path``, else of its nearest ancestor that has one."""
    for n in range(len(path), 0, -1):
        line = lines.get(tuple(path[:n]))
        if line is not None:
            return line
    return None


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.lines: dict[Path, int] = {}
        self._starts = [0] + [n + 1 for n, c in enumerate(text) if c == "\n"]
        self._arrays: dict[Path, int] = {}   # [[array]] path -> index of its last element
        self._table: Path = ()

    # -- positions ------------------------------------------------------------------------

    def line(self, pos: int | None = None) -> int:
        return bisect.bisect_right(self._starts, self.i if pos is None else pos)

    def mark(self, path: Path, pos: int) -> None:
        self.lines.setdefault(path, self.line(pos))

    # -- low level ------------------------------------------------------------------------

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def blank(self, newlines: bool) -> None:
        """Skip spaces and comments (and newlines when ``newlines``)."""
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#":
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
            else:
                return

    def expect(self, c: str) -> None:
        if self.peek() != c:
            raise _Stop(self.i)
        self.i += 1

    # -- document structure -----------------------------------------------------------------

    def document(self) -> None:
        while True:
            self.blank(newlines=True)
            if self.i >= len(self.s):
                return
            if self.peek(2) == "[[":
                self.array_header()
            elif self.peek() == "[":
                self.table_header()
            else:
                self.keyval(self._table)

    def _resolve(self, names: Path) -> Path:
        """Insert the current index after every name that is an array of tables."""
        out: Path = ()
        for name in names:
            out = out + (name,)
            if out in self._arrays:
                out = out + (self._arrays[out],)
        return out

    def table_header(self) -> None:
        start = self.i
        self.i += 1
        names = self.key()
        self.expect("]")
        path = self._resolve(names)
        for n in range(1, len(path) + 1):
            self.mark(path[:n], start)
        self._table = path

    def array_header(self) -> None:
        start = self.i
        self.i += 2
        names = self.key()
        self.expect("]")
        self.expect("]")
        parent = self._resolve(names[:-1]) + (names[-1],)
        index = self._arrays.get(parent, -1) + 1
        self._arrays[parent] = index
        path = parent + (index,)
        for n in range(1, len(path) + 1):
            self.mark(path[:n], start)
        self._table = path

    def keyval(self, table: Path) -> None:
        start = self.i
        names = self.key()
        self.expect("=")
        path = table + names
        for n in range(len(table) + 1, len(path) + 1):
            self.mark(path[:n], start)
        self.blank(newlines=False)
        self.value(path)

    def key(self) -> Path:
        """A dotted key; leaves the position after it and any trailing blanks."""
        names: list[str] = []
        while True:
            self.blank(newlines=False)
            c = self.peek()
            if c == '"':
                names.append(self.basic_string())
            elif c == "'":
                names.append(self.literal_string())
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE:
                    self.i += 1
                if self.i == start:
                    raise _Stop(self.i)
                names.append(self.s[start:self.i])
            self.blank(newlines=False)
            if self.peek() != ".":
                return tuple(names)
            self.i += 1

    # -- values ---------------------------------------------------------------------------

    def value(self, path: Path) -> None:
        c = self.peek()
        if c == '"':
            self.basic_string()
        elif c == "'":
            self.literal_string()
        elif c == "[":
            self.array(path)
        elif c == "{":
            self.inline_table(path)
        else:  # numbers, booleans, dates: up to the next delimiter
            start = self.i
            while self.i < len(self.s) and self.s[self.i] not in ",]}#\n":
                self.i += 1
            if self.i == start:
                raise _Stop(self.i)

    def array(self, path: Path) -> None:
        self.i += 1
        n = 0
        while True:
            self.blank(newlines=True)
            if self.peek() == "]":
                self.i += 1
                return
            self.mark(path + (n,), self.i)
            self.value(path + (n,))
            n += 1
            self.blank(newlines=True)
            if self.peek() == ",":
                self.i += 1

    def inline_table(self, path: Path) -> None:
        self.i += 1
        while True:
            self.blank(newlines=True)
            if self.peek() == "}":
                self.i += 1
                return
            self.keyval(path)
            self.blank(newlines=True)
            if self.peek() == ",":
                self.i += 1

    def basic_string(self) -> str:
        multi = self.peek(3) == '"""'
        self.i += 3 if multi else 1
        out: list[str] = []
        while True:
            if self.i >= len(self.s):
                raise _Stop(self.i)
            if multi and self.peek(3) == '"""':
                # Up to two more quotes may close the string as part of its content.
                self.i += 3
                while self.peek() == '"':
                    out.append('"')
                    self.i += 1
                return "".join(out)
            c = self.s[self.i]
            if c == '"' and not multi:
                self.i += 1
                return "".join(out)
            if c == "\\":
                nxt = self.s[self.i + 1]
                if nxt in _ESCAPES:
                    out.append(_ESCAPES[nxt])
                    self.i += 2
                elif nxt in "uU":
                    width = 4 if nxt == "u" else 8
                    out.append(chr(int(self.s[self.i + 2:self.i + 2 + width], 16)))
                    self.i += 2 + width
                else:  # a line-ending backslash in a multi-line string
                    self.i += 1
                    while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
                        self.i += 1
                continue
            out.append(c)
            self.i += 1

    def literal_string(self) -> str:
        multi = self.peek(3) == "'''"
        quote = "'''" if multi else "'"
        self.i += len(quote)
        end = self.s.find(quote, self.i)
        if end < 0:
            raise _Stop(self.i)
        if multi:
            while self.s[end + 3:end + 4] == "'":
                end += 1
        text = self.s[self.i:end]
        self.i = end + len(quote)
        return text
