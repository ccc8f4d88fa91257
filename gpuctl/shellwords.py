"""Shell words the way ``shlex`` reads and writes them, without importing ``re``.

``shlex`` imports ``re`` (about as long as the rest of an ``sbatch``), and every batch script
with ``#SBATCH`` lines needs its directive lines split into words.  ``split`` is
``shlex.split(text, comments)`` in POSIX mode and ``quote`` is ``shlex.quote``, exactly:
tests compare them with ``shlex`` on generated text.
"""

from __future__ import annotations

_BLANK = " \t\r\n"
# shlex.quote leaves a word alone when it is made only of these (its ``[\w@%+=:,./-]``, ASCII)
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def split(text: str, comments: bool = False) -> list[str]:
    """Words of ``text``: blanks separate them, quotes and backslashes as in POSIX shells;
    with ``comments``, ``#`` ends the word it is in and the rest of its line is skipped.
    Raises ValueError for an unclosed quote or a trailing backslash, with shlex's messages."""
    words: list[str] = []
    word: list[str] | None = None          # None between words; [] for a word of only ''
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _BLANK or (comments and c == "#"):
            if word is not None:
                words.append("".join(word))
                word = None
            if c == "#":
                end = text.find("\n", i)
                i = n if end < 0 else end + 1
            else:
                i += 1
            continue
        if word is None:
            word = []
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("No escaped character")
            word.append(text[i + 1])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ValueError("No closing quotation")
            word.append(text[i + 1:end])
            i = end + 1
        elif c == '"':
            i = _double_quoted(text, i + 1, word)
        else:
            word.append(c)
            i += 1
    if word is not None:
        words.append("".join(word))
    return words


def _double_quoted(text: str, i: int, word: list[str]) -> int:
    """Append the inside of a "..." starting at ``i``; return the index after its close.
    A backslash escapes only ``"`` and itself there, and is kept before anything else."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return i + 1
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("No escaped character")
            if text[i + 1] not in '"\\':
                word.append("\\")
            word.append(text[i + 1])
            i += 2
        else:
            word.append(c)
            i += 1
    raise ValueError("No closing quotation")


def quote(word: str) -> str:
    """``word`` as one shell word: unchanged when it is safe, else in single quotes."""
    if not word:
        return "''"
    if all(c in _SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"
