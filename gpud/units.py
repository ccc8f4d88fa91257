"""Durations and sizes as people write them, in config files and on the command line.

Stdlib only, and no regular expressions: gpuctl imports this on its start-up path, where
importing ``re`` alone costs about as much as the rest of an sbatch.

Durations accept Slurm's time formats (``minutes``, ``minutes:seconds``,
``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
``days-hours:minutes:seconds``), ``UNLIMITED``/``infinite``, and unit suffixes as in
config files (``90s``, ``10m``, ``1h``, ``7d``, ``1h30m``).  Sizes are megabytes by
default as in Slurm's ``--mem`` (``4096``), or carry a suffix: ``K``, ``M``, ``G``, ``T``
(binary multiples).
"""

from __future__ import annotations

__all__ = ["UnitError", "parse_duration", "format_duration", "parse_size_mb", "format_size_mb"]


class UnitError(ValueError):
    """A value that is not a duration or size; the message says what is accepted."""


_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
UNLIMITED = {"unlimited", "infinite", "inf"}


def parse_duration(text: str | int | float, *, default_unit: str = "m") -> float | None:
    """Seconds in ``text``; None for unlimited.

    A bare number is in ``default_unit`` (minutes, like Slurm's ``--time``; config
    files pass ``"s"``).
    """
    if isinstance(text, bool):
        raise UnitError(f"invalid duration {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise UnitError(f"invalid duration {text!r}: must not be negative")
        return float(text) * _UNIT_SECONDS[default_unit]
    s = str(text).strip().lower()
    if s in UNLIMITED:
        return None
    if not s:
        raise UnitError("empty duration")
    suffixed = _suffixed(s)
    if suffixed is not None:
        return float(sum(float(n) * _UNIT_SECONDS[u] for n, u in suffixed))
    days = 0
    rest = s
    if "-" in s:
        d, _, rest = s.partition("-")
        if not d.isdecimal():
            raise _bad_duration(text)
        days = int(d)
        parts = rest.split(":") if rest else ["0"]
        if not all(p.isdecimal() for p in parts) or len(parts) > 3:
            raise _bad_duration(text)
        nums = [int(p) for p in parts] + [0] * (3 - len(parts))
        h, m, sec = nums
        return float(days * 86400 + h * 3600 + m * 60 + sec)
    parts = rest.split(":")
    if not all(p.isdecimal() for p in parts) or len(parts) > 3:
        if _is_number(s):
            return float(s) * _UNIT_SECONDS[default_unit]
        raise _bad_duration(text)
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        return float(nums[0] * _UNIT_SECONDS[default_unit])
    if len(nums) == 2:
        return float(nums[0] * 60 + nums[1])
    return float(nums[0] * 3600 + nums[1] * 60 + nums[2])


def _is_number(s: str) -> bool:
    """``\\d+(\\.\\d+)?``: decimal digits with an optional fraction."""
    whole, dot, frac = s.partition(".")
    return whole.isdecimal() and (not dot or frac.isdecimal())


def _suffixed(s: str) -> list[tuple[str, str]] | None:
    """``90s``, ``1h30m``, ``1.5d`` as (number, unit) pairs; None if ``s`` is not that form."""
    parts, start = [], 0
    for i, c in enumerate(s):
        if c in _UNIT_SECONDS:
            if not _is_number(s[start:i]):
                return None
            parts.append((s[start:i], c))
            start = i + 1
    return parts if parts and start == len(s) else None


def _bad_duration(text: object) -> UnitError:
    return UnitError(
        f"invalid duration {text!r}: use minutes, [D-]HH:MM:SS, or a suffix like 90s, 10m, 2h, 7d"
    )


def format_duration(seconds: float | None) -> str:
    """Slurm's ``[D-]HH:MM:SS``; ``UNLIMITED`` for None."""
    if seconds is None:
        return "UNLIMITED"
    total = max(0, int(round(seconds)))
    d, rem = divmod(total, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


_SIZE_MB = {"k": 1 / 1024, "m": 1, "": 1, "g": 1024, "t": 1024 * 1024}


def parse_size_mb(text: str | int | float, *, default_unit: str = "m") -> int:
    """Megabytes in ``text`` (``4096``, ``16G``, ``512M``, ``1T``), rounded up."""
    return _parse_size(text, default_unit, 1)


def parse_size_kb(text: str | int | float, *, default_unit: str = "m") -> int:
    """Kilobytes (KiB) in ``text`` (``100K``, ``512M``, ``4096`` in ``default_unit``), rounded up."""
    return _parse_size(text, default_unit, 1024)


def _parse_size(text: str | int | float, default_unit: str, per_mb: int) -> int:
    if isinstance(text, bool):
        raise UnitError(f"invalid size {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise UnitError(f"invalid size {text!r}: must not be negative")
        return int(-(-float(text) * _SIZE_MB[default_unit] * per_mb // 1))
    # NUMBER [space] [K|M|G|T] [i] [B], read from the right
    s = str(text).strip().lower()
    s = s[:-1] if s.endswith("b") else s
    s = s[:-1] if s.endswith("i") else s
    unit = s[-1] if s and s[-1] in "kmgt" else ""
    number = (s[:-1] if unit else s).rstrip()
    if not _is_number(number):
        raise UnitError(f"invalid size {text!r}: use a number with an optional K, M, G or T suffix")
    return int(-(-float(number) * _SIZE_MB[unit or default_unit] * per_mb // 1))


def format_size_mb(mb: int | None) -> str:
    if mb is None:
        return "-"
    if mb >= 1024 and mb % 1024 == 0:
        return f"{mb // 1024}G"
    return f"{mb}M"


def format_size_kb(kb: float) -> str:
    """A size in KiB as the config writes one: ``390K``, ``100M``, ``2G`` (rounded down)."""
    kb = int(kb)
    if kb >= 1024 * 1024 and kb % (1024 * 1024) == 0 or kb >= 10 * 1024 * 1024:
        return f"{kb // (1024 * 1024)}G"
    if kb >= 1024 and kb % 1024 == 0 or kb >= 10 * 1024:
        return f"{kb // 1024}M"
    return f"{kb}K"
