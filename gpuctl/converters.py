"""Converters: the text a user wrote for an sbatch option, as spec settings.

Each converter takes an option's value as typed (on the command line, in a ``#SBATCH``
line, or as a string keyword of ``Client.submit``) and returns the settings it means, with
JobSpec's field names where there is one: ``gpus("a100:2")`` is ``{"gpus": 2, "gpu_type":
"a100"}``.  A bad value raises ScriptError with a one-line message naming the option.
The factories (``integer``, ``string``, ``size``, ``hosts``, ...) make a converter for one
option and one key; the option table (``gpuctl.options``) names which goes with which.

Parsers that cost start-up (``gpud.units``, ``gpud.syntax``, ``gpud.hostlist``, MIG
profiles, ``signal``) are imported inside the converters that need them: gpuctl starts on
every call, and most calls use none of them.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any, Callable

    Converter = Callable[[str], dict[str, Any]]

MAX_GPUS = 4096
MAX_NODES = 4096
MAX_TASKS_PER_NODE = 1024
clock = time.time  # --begin/--deadline read it; replaceable in tests


class ScriptError(ValueError):
    """A bad option value, directive or script; the message is one line for the user."""


def integer(key: str, option: str, lo: int, hi: int) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        try:
            v = int(text.strip())
        except ValueError:
            raise ScriptError(f"{option} needs a whole number, not {text!r}") from None
        if not lo <= v <= hi:
            raise ScriptError(f"{option} must be between {lo} and {hi}, not {v}")
        return {key: v}
    return convert


def string(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        if not text or "\x00" in text:
            raise ScriptError(f"{option} needs a non-empty value")
        return {key: text}
    return convert


def or_unset(key: str, convert: Converter) -> Converter:
    """``convert``, except that an empty value (``--exclude=''``, as job generators write
    options they have no value for) unsets the option, as in Slurm: its default applies."""
    def unset_or_convert(text: str) -> dict[str, Any]:
        return {key: None} if not text.strip() else convert(text)
    return unset_or_convert


def flag(settings: dict[str, Any]) -> Converter:
    return lambda string: dict(settings)


def _mig_profile(text: str) -> str | None:
    """The canonical MIG profile name ``text`` spells (``1g.10gb``, ``MIG-3g.40gb``), else None."""
    if not any(c.isalpha() for c in text):
        return None
    from gpud.gpu.mig import MigError, parse_profile   # only when a type or profile is given

    try:
        return parse_profile(text)
    except MigError:
        return None


def gpu_count(option: str, key: str = "gpus") -> Converter:
    def convert(text: str) -> dict[str, Any]:
        # Slurm spells a typed request --gpus=TYPE:N; accept it besides a bare count.  A MIG
        # profile as the type (1g.10gb:2, or 1g.10gb for one) asks for slices of it.
        gpu_type, sep, count = text.strip().rpartition(":")
        if not sep and _mig_profile(count):
            gpu_type, count = count, "1"
        out = integer(key, option, 0, MAX_GPUS)(count)
        if gpu_type:
            profile = _mig_profile(gpu_type)
            if profile:
                out["mig_profile"] = profile
            elif ":" in gpu_type:
                raise ScriptError(f"{option} needs N, TYPE:N or PROFILE:N (e.g. 1g.10gb:2), not {text!r}")
            else:
                out["gpu_type"] = gpu_type
        elif sep:
            raise ScriptError(f"{option} needs N, TYPE:N or PROFILE:N (e.g. 1g.10gb:2), not {text!r}")
        return out
    return convert


gpus = gpu_count("--gpus")


def gres(text: str) -> dict[str, Any]:
    """``gpu``, ``gpu:2``, ``gpu:h100:2``, ``gpu:1g.10gb:2`` (MIG slices; comma-separated;
    only GPUs exist here).  As in Slurm, the count is per node."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        parts = item.strip().split(":")
        name = parts[0].removeprefix("gres/")
        if name != "gpu":
            raise ScriptError(f"--gres={item.strip()}: gpud schedules GPUs only; use gpu[:TYPE][:COUNT]")
        if len(parts) > 3 or (len(parts) == 3 and not parts[1]):
            raise ScriptError(f"--gres={item.strip()}: use gpu[:TYPE][:COUNT]")
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        typ = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else None
        out.update(integer("gpus_per_node", "--gres", 0, MAX_GPUS)(count))
        if typ and _mig_profile(typ):
            out["mig_profile"] = _mig_profile(typ)
        elif typ:
            out["gpu_type"] = typ
    return out


def size(key: str, option: str, zero_ok: bool = False) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        from gpud.units import UnitError, parse_size_mb   # imports re: only for the options that need it

        try:
            mb = parse_size_mb(text)
        except UnitError as e:
            raise ScriptError(f"{option}: {e}") from None
        if mb < 0 or (mb == 0 and not zero_ok):
            raise ScriptError(f"{option} must be positive")
        return {key: mb}
    return convert


mem = size("mem_mb", "--mem", zero_ok=True)   # --mem=0: all the memory of each node, as in Slurm
gpu_mem = size("gpu_mem_mb", "--gpu-mem")


def node_count(text: str) -> dict[str, Any]:
    """Slurm's ``-N MIN[-MAX]``: one count, so MIN-MAX only when both are the same."""
    t = text.strip()
    low, sep, high = t.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise ScriptError(f"--nodes needs a number of nodes, not {text!r}")
    if sep and int(high) != int(low):
        raise ScriptError(f"--nodes={t}: gpud does not take a range of node counts; give one number, "
                          f"e.g. -N {int(high)}")
    return integer("nodes", "--nodes", 1, MAX_NODES)(low)


def hosts(key: str, option: str) -> Converter:
    """A hostlist (``gpu[01-04],gpu09``) or, as in Slurm, a file of them when it holds a '/'."""
    def convert(text: str) -> dict[str, Any]:
        from gpud.hostlist import NODE_NAME, expand

        t = text.strip()
        if "/" in t:
            try:
                with open(t, encoding="utf-8") as f:
                    t = f.read(1 << 20)
            except (OSError, UnicodeDecodeError) as e:
                raise ScriptError(f"{option}: cannot read the node file {text.strip()!r}: "
                                  f"{getattr(e, 'strerror', None) or e}") from None
        try:
            names = expand(t)
        except ValueError as e:
            raise ScriptError(f"{option}: {e}") from None
        if not names:
            raise ScriptError(f"{option} needs node names, e.g. gpu[01-04]")
        bad = next((n for n in names if not NODE_NAME.match(n)), None)
        if bad is not None:
            raise ScriptError(f"{option}: {bad!r} is not a node name (letters, digits, '.', '_' and '-')")
        return {key: list(dict.fromkeys(names))}
    return convert


def constraint(text: str) -> dict[str, Any]:
    from gpud.model import SpecError, parse_constraint

    t = text.strip()
    try:
        parse_constraint(t)
    except SpecError as e:
        raise ScriptError(f"--constraint: {e}") from None
    return {"constraint": t}


def switches(text: str) -> dict[str, Any]:
    """Slurm's ``--switches=N[@TIME]``: at most N leaf switches, waiting at most TIME for that."""
    count, at, wait = text.strip().partition("@")
    out = integer("switches", "--switches", 1, 64)(count)
    if at:
        from gpud.units import UnitError, parse_duration

        try:
            seconds = parse_duration(wait)
        except UnitError as e:
            raise ScriptError(f"--switches: {e}") from None
        if seconds is None:
            raise ScriptError("--switches: give the longest wait as a time such as 10:00, not an unlimited one")
        out["switches_wait"] = seconds
    return out


def array(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_array  # only when used: gpuctl starts on every call

    try:
        return {"array": parse_array(text).format()}
    except SyntaxProblem as e:
        raise ScriptError(str(e)) from None


def dependency(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_dependency

    try:
        dep = parse_dependency(text)
    except SyntaxProblem as e:
        raise ScriptError(str(e)) from None
    return {"dependency": dep.format() if dep else None}


def when(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        from gpud.syntax import SyntaxProblem, parse_time

        try:
            return {key: parse_time(text, clock())}
        except SyntaxProblem as e:
            raise ScriptError(f"{option}: {e}") from None
    return convert


def yes_no(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        t = text.strip().lower()
        if t not in ("yes", "no"):
            raise ScriptError(f"{option} takes yes or no, not {text!r}")
        return {key: t == "yes"}
    return convert


def choice(key: str, option: str, *choices: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        t = text.strip().lower()
        if t not in choices:
            raise ScriptError(f"{option} takes {' or '.join(choices)}, not {text!r}")
        return {key: t}
    return convert


MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "TIME_LIMIT",
               "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def mail_type(text: str) -> dict[str, Any]:
    words = [w.strip().upper() for w in text.split(",") if w.strip()]
    bad = [w for w in words if w not in MAIL_TYPES]
    if not words or bad:
        raise ScriptError(f"--mail-type: unknown type {(bad or [text])[0]!r}; use {', '.join(MAIL_TYPES)}")
    return {"mail_type": ",".join(words)}


def mail_user(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_mail_users

    try:
        return {"mail_user": ",".join(parse_mail_users(text))}
    except SyntaxProblem as e:
        raise ScriptError(f"--mail-user: {e}") from None


def export(text: str) -> dict[str, Any]:
    items = [w.strip() for w in text.split(",") if w.strip()]
    for w in items:
        name = w.split("=", 1)[0]
        # a NAME is [A-Za-z_][A-Za-z0-9_]*: an ASCII identifier
        if w.upper() not in ("ALL", "NONE") and not (name.isascii() and name.isidentifier()):
            raise ScriptError(f"--export: {w!r} is not ALL, NONE, NAME or NAME=VALUE")
    if not items:
        raise ScriptError("--export needs ALL, NONE, or a list of NAME[=VALUE]")
    if any(w.upper() == "NONE" for w in items) and len(items) > 1:
        raise ScriptError("--export=NONE cannot be combined with other names")
    return {"export": text}


def time_limit(text: str) -> dict[str, Any]:
    from gpud.units import UnitError, parse_duration

    try:
        seconds = parse_duration(text)
    except UnitError as e:
        raise ScriptError(f"--time: {e}") from None
    # UNLIMITED and 0 (Slurm's "no limit") both mean: the partition's limit.
    return {"time_limit": seconds if seconds else None}


# What a job name may not hold, each mapped to "_" (str.translate: no need for re here).
BAD_NAME_CHARS = {**{c: "_" for c in range(0x20)}, ord("/"): "_"}


def job_name(text: str) -> dict[str, Any]:
    if not text or len(text) > 200 or text.translate(BAD_NAME_CHARS) != text:
        raise ScriptError(f"invalid job name {text!r}: 1-200 characters, no '/' or control characters")
    return {"name": text}


def signal_spec(text: str) -> dict[str, Any]:
    """Slurm's ``[{R|B}:]SIG[@TIME]``: SIG goes TIME seconds (default 60) before the time limit,
    to the batch shell alone with ``B:``, else to all the job's processes.  ``R:`` (overlap a
    reservation) means nothing here: there are no reservations."""
    t = text.strip()
    flags, colon, rest = t.partition(":")
    batch = False
    if colon and flags and set(flags.upper()) <= set("RB"):
        batch, t = "B" in flags.upper(), rest
    sig, at, when = t.partition("@")
    seconds = 60
    if at:
        when = when.strip()
        if not when.isdigit() or int(when) > 65535:
            raise ScriptError(f"--signal: the time after @ must be whole seconds from 0 to 65535, not {when!r}")
        seconds = int(when)
    return {"signal": normalize_signal(sig, "--signal"), "signal_time": seconds, "signal_batch": batch}


def normalize_signal(text: str, option: str = "--signal") -> str:
    """``USR1``, ``SIGUSR1`` or ``10`` -> ``"SIGUSR1"``; ScriptError otherwise."""
    import signal

    t = text.strip().upper()
    try:
        sig = signal.Signals(int(t)) if t.isdigit() else signal.Signals[t if t.startswith("SIG") else "SIG" + t]
    except (KeyError, ValueError):
        raise ScriptError(f"{option}: unknown signal {text!r} (use a name like USR1 or a number)") from None
    return sig.name
