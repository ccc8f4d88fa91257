"""sbatch's options, batch-script directives, and the JobSpec dict they become.

Theory of operation
-------------------
``OPTIONS`` is the one table of sbatch options.  Each entry names the option's spellings,
its metavar (None for a flag) and a converter from the text a user wrote to spec
settings (``{"gpus": 2, "gpu_type": "a100"}``).  Everything else reads the table:

* ``gpuctl sbatch`` builds its click options from it and converts what the user typed
  with the same converters, so a value means the same on the command line and in a
  script;
* ``parse_directives`` reads ``#SBATCH``/``#GPUD`` lines with it, Slurm's way: only
  comment lines before the first command count, ``# SBATCH`` (with a space) is an
  ordinary comment, and an option may be written ``--opt=V``, ``--opt V``, ``-xV`` or
  ``-x V``.  ``#GPUD`` lines win over ``#SBATCH`` lines wherever they stand, so one
  script can carry settings for both schedulers.

Precedence, lowest first: defaults, ``#SBATCH``, ``#GPUD``, the command line (or the
Python API's keyword options).  ``build_spec`` then fills the defaults (job name,
working directory, environment), makes paths absolute, encodes script arguments as a
``set --`` line after the directives, and returns a dict with JobSpec's field names.

Adding an option is one table entry, its line in man/gpuctl-sbatch.1 (a test checks
that), and, when it sets a new JobSpec field, that field's name in ``_API_KEYS``.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from gpud.units import UnitError, parse_duration, parse_size_mb

# Settings that are not JobSpec fields: they change what sbatch does, not the job.
CLIENT_SETTINGS = frozenset({"parsable", "wrap"})
DIRECTIVE_PREFIXES = ("#GPUD", "#SBATCH")
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh", "ash", "mksh", "busybox"})


class ScriptError(ValueError):
    """A bad option value, directive or script; the message is one line for the user."""


Converter = Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class Option:
    long: str                   # "--cpus-per-task"
    short: str | None           # "-c"
    metavar: str | None         # None: a flag that takes no value
    convert: Converter          # text -> settings; a flag gets "" and returns its setting
    help: str
    directive: bool = True      # allowed in #SBATCH/#GPUD lines
    negation: str | None = None  # "--no-requeue" for a boolean pair
    negated: dict[str, Any] | None = None  # settings for the negation

    @property
    def dest(self) -> str:
        """click's parameter name for this option."""
        return self.long.lstrip("-").replace("-", "_")

    @property
    def is_flag(self) -> bool:
        return self.metavar is None


# -- converters -------------------------------------------------------------------

def _int(key: str, option: str, lo: int, hi: int) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        try:
            v = int(text.strip())
        except ValueError:
            raise ScriptError(f"{option} needs a whole number, not {text!r}") from None
        if not lo <= v <= hi:
            raise ScriptError(f"{option} must be between {lo} and {hi}, not {v}")
        return {key: v}
    return convert


def _text(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        if not text or "\x00" in text:
            raise ScriptError(f"{option} needs a non-empty value")
        return {key: text}
    return convert


def _flag(settings: dict[str, Any]) -> Converter:
    return lambda _text: dict(settings)


def _gpus(text: str) -> dict[str, Any]:
    # Slurm spells a typed request --gpus=TYPE:N; accept it besides a bare count.
    gpu_type, sep, count = text.strip().rpartition(":")
    out = _int("gpus", "--gpus", 0, 4096)(count)
    if sep:
        if not gpu_type:
            raise ScriptError(f"--gpus needs N or TYPE:N, not {text!r}")
        out["gpu_type"] = gpu_type
    return out


def _mem(text: str) -> dict[str, Any]:
    try:
        mb = parse_size_mb(text)
    except UnitError as e:
        raise ScriptError(f"--mem: {e}") from None
    if mb <= 0:
        raise ScriptError("--mem must be positive")
    return {"mem_mb": mb}


def _time(text: str) -> dict[str, Any]:
    try:
        seconds = parse_duration(text)
    except UnitError as e:
        raise ScriptError(f"--time: {e}") from None
    # UNLIMITED and 0 (Slurm's "no limit") both mean: the partition's limit.
    return {"time_limit": seconds if seconds else None}


_BAD_NAME = re.compile(r"[\x00-\x1f/]")


def _name(text: str) -> dict[str, Any]:
    if not text or len(text) > 200 or _BAD_NAME.search(text):
        raise ScriptError(f"invalid job name {text!r}: 1-200 characters, no '/' or control characters")
    return {"name": text}


def _signal(text: str) -> dict[str, Any]:
    return {"signal": normalize_signal(text, "--signal")}


def normalize_signal(text: str, option: str = "--signal") -> str:
    """``USR1``, ``SIGUSR1`` or ``10`` -> ``"SIGUSR1"``; ScriptError otherwise."""
    import signal

    t = text.strip().upper()
    try:
        sig = signal.Signals(int(t)) if t.isdigit() else signal.Signals[t if t.startswith("SIG") else "SIG" + t]
    except (KeyError, ValueError):
        raise ScriptError(f"{option}: unknown signal {text!r} (use a name like USR1 or a number)") from None
    return sig.name


OPTIONS: tuple[Option, ...] = (
    Option("--gpus", None, "N", _gpus, "GPUs for the job: a count, or TYPE:COUNT."),
    Option("--gpu-type", None, "TYPE", _text("gpu_type", "--gpu-type"), "Only GPUs of this model."),
    Option("--cpus-per-task", "-c", "N", _int("cpus", "--cpus-per-task", 1, 100000), "CPU cores."),
    Option("--mem", None, "SIZE", _mem, "Memory: megabytes, or a K/M/G/T suffix."),
    Option("--time", "-t", "TIME", _time, "Time limit: MIN, [D-]HH:MM:SS, UNLIMITED."),
    Option("--job-name", "-J", "NAME", _name, "Job name (default: the script's file name)."),
    Option("--output", "-o", "PATTERN", _text("stdout", "--output"), "Standard output file."),
    Option("--error", "-e", "PATTERN", _text("stderr", "--error"), "Standard error file."),
    Option("--chdir", "-D", "DIR", _text("work_dir", "--chdir"), "Working directory (default: here)."),
    Option("--account", "-A", "ACCOUNT", _text("account", "--account"), "Charge this account."),
    Option("--partition", "-p", "PARTITION", _text("partition", "--partition"), "Partition to run in."),
    Option("--qos", "-q", "QOS", _text("qos", "--qos"), "Quality of service."),
    Option("--nice", None, "N", _int("nice", "--nice", -10000, 10000), "Lower the job's priority by N."),
    Option("--signal", None, "SIG", _signal, "Signal sent before the kill at the time limit."),
    Option("--requeue", None, None, _flag({"requeue": True}), "Requeue after a node failure or preemption.",
           negation="--no-requeue", negated={"requeue": False}),
    Option("--hold", "-H", None, _flag({"hold": True}), "Submit held; release it later."),
    Option("--comment", None, "TEXT", _text("comment", "--comment"), "A note kept with the job."),
    Option("--parsable", None, None, _flag({"parsable": True}), "Print only the job id."),
    Option("--wrap", None, "CMD", _text("wrap", "--wrap"), "Run CMD in a generated /bin/bash script.",
           directive=False),
)

_BY_NAME: dict[str, tuple[Option, bool]] = {}
for _o in OPTIONS:
    _BY_NAME[_o.long] = (_o, False)
    if _o.short:
        _BY_NAME[_o.short] = (_o, False)
    if _o.negation:
        _BY_NAME[_o.negation] = (_o, True)


def convert(option: Option, value: str | bool, negated: bool = False) -> dict[str, Any]:
    """Settings for one option occurrence (a flag passes True/False or negated)."""
    if option.is_flag:
        return dict(option.negated or {}) if negated or value is False else option.convert("")
    return option.convert(str(value))


# -- directives -------------------------------------------------------------------

@dataclass
class Directives:
    settings: dict[str, Any]
    body_line: int   # index of the first command line: where `set --` goes


def parse_directives(text: str) -> Directives:
    """Settings from the script's directive block; ScriptError naming the line."""
    lines = text.split("\n")
    found: dict[str, dict[str, Any]] = {p: {} for p in DIRECTIVE_PREFIXES}
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
                    found[prefix].update(_parse_directive_line(rest))
                except ScriptError as e:
                    raise ScriptError(f"line {i + 1}: {prefix} {e}") from None
    settings = {**found["#SBATCH"], **found["#GPUD"]}
    return Directives(settings, body)


def _parse_directive_line(rest: str) -> dict[str, Any]:
    try:
        words = shlex.split(rest, comments=True)
    except ValueError as e:
        raise ScriptError(f"cannot split: {e}") from None
    out: dict[str, Any] = {}
    while words:
        word = words.pop(0)
        name, value = word, None
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
        elif word.startswith("-") and not word.startswith("--") and len(word) > 2:
            name, value = word[:2], word[2:]
        entry = _BY_NAME.get(name)
        if entry is None or not word.startswith("-"):
            raise ScriptError(f"unrecognized option {word!r}")
        option, negated = entry
        if not option.directive:
            raise ScriptError(f"{option.long} is not allowed in a batch script")
        if option.is_flag:
            if value is not None:
                raise ScriptError(f"{name} takes no value")
            out.update(convert(option, True, negated))
            continue
        if value is None:
            if not words:
                raise ScriptError(f"{name} needs a value")
            value = words.pop(0)
        out.update(convert(option, value))
    return out


# -- the spec ---------------------------------------------------------------------

def wrap_script(command: str) -> str:
    return f"#!/bin/bash\n{command}\n"


def check_script(text: str, source: str) -> None:
    """Refuse what can never run: empty, NUL bytes, no interpreter line."""
    if not text.strip():
        raise ScriptError(f"{source} is empty")
    if "\x00" in text:
        raise ScriptError(f"{source} contains NUL bytes (is it a binary file?)")
    if not text.startswith("#!"):
        raise ScriptError(
            f"{source} does not look like a batch script: the first line must start with #! "
            "and an interpreter, e.g. #!/bin/bash"
        )


def add_arguments(text: str, args: list[str], body_line: int) -> str:
    """Put ``set -- 'a' 'b'`` before the first command, so ``$1..`` are the args."""
    if not args:
        return text
    interpreter = _interpreter(text)
    if interpreter not in _SHELLS:
        raise ScriptError(f"script arguments need a shell script (#!/bin/sh, #!/bin/bash), not {interpreter}")
    lines = text.split("\n")
    line = "set -- " + " ".join(shlex.quote(a) for a in args)
    return "\n".join(lines[:body_line] + [line] + lines[body_line:])


def _interpreter(text: str) -> str:
    words = text.split("\n", 1)[0][2:].split()
    if not words:
        return ""
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        return os.path.basename(words[1])
    return os.path.basename(words[0])


def build_spec(text: str, cli: dict[str, Any], *, default_name: str, args: list[str] | None = None,
               cwd: str | None = None, env: dict[str, str] | None = None,
               directives: bool = True) -> dict[str, Any]:
    """The JobSpec dict for ``text`` with ``cli`` settings over its directives."""
    parsed = parse_directives(text) if directives else Directives({}, len(text.split("\n")))
    settings = {**parsed.settings, **cli}
    if settings.get("env") is not None:
        env = settings["env"]
    settings.pop("env", None)
    cwd = cwd or os.getcwd()
    work_dir = os.path.normpath(os.path.join(cwd, settings.pop("work_dir", None) or "."))
    spec: dict[str, Any] = {
        "script": add_arguments(text, list(args or ()), parsed.body_line),
        "name": settings.pop("name", None) or _safe_name(default_name),
        "work_dir": work_dir,
        "env": exportable_env(os.environ if env is None else env),
    }
    for key in ("stdout", "stderr"):
        if settings.get(key):
            settings[key] = os.path.join(work_dir, settings[key])
    for key, value in settings.items():
        if key not in CLIENT_SETTINGS and value is not None:
            spec[key] = value
    return spec


def _safe_name(name: str) -> str:
    return _BAD_NAME.sub("_", name)[:200] or "job"


def exportable_env(env: Any) -> dict[str, str]:
    """The environment as JSON can carry it (undecodable entries are left out)."""
    out: dict[str, str] = {}
    for k, v in env.items():
        try:
            (k + v).encode("utf-8")
        except UnicodeEncodeError:
            continue
        if k and "=" not in k:
            out[k] = v
    return out


# -- the Python API ---------------------------------------------------------------

_API_KEYS = frozenset({
    "name", "work_dir", "stdout", "stderr", "env", "gpus", "gpu_type", "cpus", "mem_mb",
    "time_limit", "partition", "account", "qos", "nice", "requeue", "signal", "hold", "comment",
})


def api_settings(options: dict[str, Any]) -> dict[str, Any]:
    """Client.submit's keyword options as settings; strings go through sbatch's converters."""
    unknown = set(options) - _API_KEYS
    if unknown:
        raise TypeError(f"unknown job option(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "mem_mb" and isinstance(value, str):
            out.update(_mem(value))
        elif key == "time_limit" and isinstance(value, str):
            out.update(_time(value))
        elif key == "signal":
            out["signal"] = normalize_signal(str(value))
        elif key == "name":
            out.update(_name(value))
        elif key == "env":
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise TypeError("env must map variable names to strings")
            out["env"] = dict(value)
        else:
            out[key] = value
    return out
