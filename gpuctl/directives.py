"""``#SBATCH`` and ``#GPUD`` lines: the settings a batch script carries for itself.

``parse_directives`` reads them Slurm's way: only comment lines before the first command
count, ``# SBATCH`` (with a space) is an ordinary comment, and an option may be written
``--opt=V``, ``--opt V``, ``-xV`` or ``-x V``, with the names, abbreviations and
converters of the option table (``gpuctl.options``).  ``#GPUD`` lines win over
``#SBATCH`` lines wherever they stand, so one script can carry settings for both
schedulers.

Slurm options gpud does not support (``gpuctl.unsupported``) are dropped with a warning
naming them (``Directives.warnings``; an error under ``--strict``); an option nobody knows
is an error, naming its line.
"""

from __future__ import annotations

from . import unsupported
from .converters import ScriptError
from .options import BY_NAME, convert, long_option, merge, override

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

DIRECTIVE_PREFIXES = ("#GPUD", "#SBATCH")


class Directives:
    """What a script's directive block says."""

    __slots__ = ("settings", "body_line", "warnings")

    def __init__(self, settings: dict[str, Any], body_line: int, warnings: list[str] | None = None) -> None:
        self.settings = settings
        self.body_line = body_line      # index of the first command line: where `set --` goes
        self.warnings = [] if warnings is None else warnings   # Slurm options gpud ignores


def parse_directives(text: str) -> Directives:
    """Settings from the script's directive block; ScriptError naming the line."""
    lines = text.split("\n")
    found: dict[str, dict[str, Any]] = {p: {} for p in DIRECTIVE_PREFIXES}
    warnings: list[str] = []
    body = len(lines)
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            body = i
            break
        for prefix in DIRECTIVE_PREFIXES:
            rest = line[len(prefix):]
            if line.startswith(prefix) and (not rest or rest[0].isspace()):
                try:
                    settings, ignored = _parse_directive_line(rest)
                except ScriptError as e:
                    raise ScriptError(f"line {i + 1}: {prefix} {e}") from None
                found[prefix] = merge(found[prefix], settings)
                warnings += [f"line {i + 1}: {w}" for w in ignored]
    settings = override(found["#SBATCH"], found["#GPUD"])
    return Directives(settings, body, warnings)


def _parse_directive_line(rest: str) -> tuple[dict[str, Any], list[str]]:
    from . import shellwords   # only scripts with directives need it

    try:
        words = shellwords.split(rest, comments=True)
    except ValueError as e:
        raise ScriptError(f"cannot split: {e}") from None
    out: dict[str, Any] = {}
    ignored: list[str] = []
    while words:
        word = words.pop(0)
        name, value = word, None
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
        if word.startswith("--"):
            name = long_option(name)
        elif word.startswith("-") and not word.startswith("--") and len(word) > 2:
            name, value = word[:2], word[2:]
        entry = BY_NAME.get(name)
        long = unsupported.lookup(name) if entry is None and word.startswith("-") else None
        if long is not None:
            arity = unsupported.takes_value(long)
            if arity == "value" and value is None:
                if not words:
                    raise ScriptError(f"{name} needs a value")
                words.pop(0)
            elif arity == "flag" and value is not None:
                raise ScriptError(f"{name} takes no value")
            ignored.append(unsupported.warning(long))
            continue
        if entry is None or not word.startswith("-"):
            raise ScriptError(f"unrecognized option {word!r}")
        option, negated = entry
        if not option.directive:
            raise ScriptError(f"{option.long} is not allowed in a batch script")
        if option.is_flag:
            if value is not None and option.long in unsupported.VALUE_REFUSED:
                raise ScriptError(unsupported.value_refused(option.long, value))
            if value is not None:
                raise ScriptError(f"{name} takes no value")
            out = merge(out, convert(option, True, negated))
            continue
        if value is None:
            if not words:
                raise ScriptError(f"{name} needs a value")
            value = words.pop(0)
        out = merge(out, convert(option, value))
    return out, ignored
