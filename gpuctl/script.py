"""sbatch's options, batch-script directives, and the JobSpec dict they become.

Theory of operation
-------------------
``OPTIONS`` is the one table of sbatch options, with Slurm's names, short forms and
meanings.  Each entry names the option's spellings,
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

Slurm options gpud does not support (``gpuctl.unsupported``) are dropped with a warning
naming them (``Directives.warnings``; an error under ``--strict``); an option nobody knows
is an error.

Big jobs use Slurm's options and meanings: ``-N`` nodes, ``--ntasks-per-node`` (or ``-n``
tasks in all), ``-w``/``-x`` hostlists (or files of names), ``-C`` node features,
``--exclusive``, ``--switches``.  The JobSpec's ``gpus`` is the job's total, so
``--gpus-per-node G`` becomes ``G * nodes`` and ``--gpus-per-task G`` ``G * tasks``;
``cpus`` and ``mem_mb`` are what each node gives, so ``-c`` (per task) is multiplied by
the tasks on a node, and ``--cpus-per-gpu``/``--mem-per-gpu`` by the GPUs on a node.

Precedence, lowest first: defaults, ``#SBATCH``, ``#GPUD``, the command line (or the
Python API's keyword options).  Options that say the same thing another way replace each
other across layers (``override``: ``--mem``, ``--mem-per-gpu``, ``--mem-per-cpu``;
``--cpus-per-task``, ``--cpus-per-gpu``; ``--gpus``, ``--gpus-per-node``,
``--gpus-per-task``; ``--ntasks``, ``--ntasks-per-node``).  Within one layer (``merge``)
the GPU counts, and the task counts, are kept side by side and must agree.  ``build_spec``
then resolves nodes, tasks and per-node, per-task, per-GPU and per-CPU amounts, builds the
environment ``--export`` asks for, fills the defaults (job name, working directory), makes
paths absolute, encodes script arguments as a ``set --`` line after the directives, and
returns a dict with JobSpec's field names (a single-node job's dict has no ``nodes``).

Adding an option is one table entry, its line in man/gpuctl-sbatch.1 (a test checks
that), and, when it sets a new JobSpec field, that field's name in ``_API_KEYS``.
"""

from __future__ import annotations

import os
import time

from . import unsupported

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any, Callable

    Converter = Callable[[str], dict[str, Any]]

# Settings that are not JobSpec fields: they change what sbatch does, not the job, or are
# resolved into other fields by build_spec.
CLIENT_SETTINGS = frozenset({"parsable", "wrap", "wait", "strict", "quiet", "export", "cpus_per_gpu",
                             "mem_per_gpu", "mem_per_cpu", "gpus_per_node", "gpus_per_task", "ntasks"})
# Options that say the same thing in different ways: a later layer's one replaces them all.
EXCLUSIVE = (frozenset({"mem_mb", "mem_per_gpu", "mem_per_cpu"}), frozenset({"cpus", "cpus_per_gpu"}),
             frozenset({"gpus", "gpus_per_node", "gpus_per_task", "mig_profile", "gpu_mem_mb"}),
             frozenset({"ntasks", "ntasks_per_node"}), frozenset({"switches", "switches_wait"}))
# ... except that, within one layer, these may stand side by side: they must then agree.
AGREEING = (frozenset({"gpus", "gpus_per_node", "gpus_per_task"}), frozenset({"ntasks", "ntasks_per_node"}))
MAX_GPUS = 4096
MAX_NODES = 4096
MAX_TASKS_PER_NODE = 1024
clock = time.time  # --begin/--deadline read it; replaceable in tests
DIRECTIVE_PREFIXES = ("#GPUD", "#SBATCH")
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh", "ash", "mksh", "busybox"})


class ScriptError(ValueError):
    """A bad option value, directive or script; the message is one line for the user."""


class Option:
    """One sbatch option: a plain class, since ``dataclasses`` alone would double gpuctl's start."""

    __slots__ = ("long", "short", "metavar", "convert", "help", "directive", "negation", "negated")

    def __init__(self, long: str, short: str | None, metavar: str | None, convert: Converter, help: str,
                 directive: bool = True, negation: str | None = None,
                 negated: dict[str, Any] | None = None) -> None:
        self.long = long                # "--cpus-per-task"
        self.short = short              # "-c"
        self.metavar = metavar          # None: a flag that takes no value
        self.convert = convert          # text -> settings; a flag gets "" and returns its setting
        self.help = help
        self.directive = directive      # allowed in #SBATCH/#GPUD lines
        self.negation = negation        # "--no-requeue" for a boolean pair
        self.negated = negated          # settings for the negation

    def __repr__(self) -> str:
        return f"Option({self.long!r})"

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


def _or_unset(key: str, convert: Converter) -> Converter:
    """``convert``, except that an empty value (``--exclude=''``, as job generators write
    options they have no value for) unsets the option, as in Slurm: its default applies."""
    def unset_or_convert(text: str) -> dict[str, Any]:
        return {key: None} if not text.strip() else convert(text)
    return unset_or_convert


def _flag(settings: dict[str, Any]) -> Converter:
    return lambda _text: dict(settings)


def _mig_profile(text: str) -> str | None:
    """The canonical MIG profile name ``text`` spells (``1g.10gb``, ``MIG-3g.40gb``), else None."""
    if not any(c.isalpha() for c in text):
        return None
    from gpud.gpu.mig import MigError, parse_profile   # only when a type or profile is given

    try:
        return parse_profile(text)
    except MigError:
        return None


def _gpu_count(option: str, key: str = "gpus") -> Converter:
    def convert(text: str) -> dict[str, Any]:
        # Slurm spells a typed request --gpus=TYPE:N; accept it besides a bare count.  A MIG
        # profile as the type (1g.10gb:2, or 1g.10gb for one) asks for slices of it.
        gpu_type, sep, count = text.strip().rpartition(":")
        if not sep and _mig_profile(count):
            gpu_type, count = count, "1"
        out = _int(key, option, 0, MAX_GPUS)(count)
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


_gpus = _gpu_count("--gpus")


def _gres(text: str) -> dict[str, Any]:
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
        out.update(_int("gpus_per_node", "--gres", 0, MAX_GPUS)(count))
        if typ and _mig_profile(typ):
            out["mig_profile"] = _mig_profile(typ)
        elif typ:
            out["gpu_type"] = typ
    return out


def _size(key: str, option: str, zero_ok: bool = False) -> Converter:
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


_mem = _size("mem_mb", "--mem", zero_ok=True)   # --mem=0: all the memory of each node, as in Slurm
_gpu_mem = _size("gpu_mem_mb", "--gpu-mem")


def _nodes(text: str) -> dict[str, Any]:
    """Slurm's ``-N MIN[-MAX]``: one count, so MIN-MAX only when both are the same."""
    t = text.strip()
    low, sep, high = t.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise ScriptError(f"--nodes needs a number of nodes, not {text!r}")
    if sep and int(high) != int(low):
        raise ScriptError(f"--nodes={t}: gpud does not take a range of node counts; give one number, "
                          f"e.g. -N {int(high)}")
    return _int("nodes", "--nodes", 1, MAX_NODES)(low)


def _hosts(key: str, option: str) -> Converter:
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


def _constraint(text: str) -> dict[str, Any]:
    from gpud.model import SpecError, parse_constraint

    t = text.strip()
    try:
        parse_constraint(t)
    except SpecError as e:
        raise ScriptError(f"--constraint: {e}") from None
    return {"constraint": t}


def _switches(text: str) -> dict[str, Any]:
    """Slurm's ``--switches=N[@TIME]``: at most N leaf switches, waiting at most TIME for that."""
    count, at, wait = text.strip().partition("@")
    out = _int("switches", "--switches", 1, 64)(count)
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


def _array(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_array  # only when used: gpuctl starts on every call

    try:
        return {"array": parse_array(text).format()}
    except SyntaxProblem as e:
        raise ScriptError(str(e)) from None


def _dependency(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_dependency

    try:
        dep = parse_dependency(text)
    except SyntaxProblem as e:
        raise ScriptError(str(e)) from None
    return {"dependency": dep.format() if dep else None}


def _when(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        from gpud.syntax import SyntaxProblem, parse_time

        try:
            return {key: parse_time(text, clock())}
        except SyntaxProblem as e:
            raise ScriptError(f"{option}: {e}") from None
    return convert


def _yes_no(key: str, option: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        t = text.strip().lower()
        if t not in ("yes", "no"):
            raise ScriptError(f"{option} takes yes or no, not {text!r}")
        return {key: t == "yes"}
    return convert


def _choice(key: str, option: str, *choices: str) -> Converter:
    def convert(text: str) -> dict[str, Any]:
        t = text.strip().lower()
        if t not in choices:
            raise ScriptError(f"{option} takes {' or '.join(choices)}, not {text!r}")
        return {key: t}
    return convert


_MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "TIME_LIMIT",
               "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def _mail_type(text: str) -> dict[str, Any]:
    words = [w.strip().upper() for w in text.split(",") if w.strip()]
    bad = [w for w in words if w not in _MAIL_TYPES]
    if not words or bad:
        raise ScriptError(f"--mail-type: unknown type {(bad or [text])[0]!r}; use {', '.join(_MAIL_TYPES)}")
    return {"mail_type": ",".join(words)}


def _mail_user(text: str) -> dict[str, Any]:
    from gpud.syntax import SyntaxProblem, parse_mail_users

    try:
        return {"mail_user": ",".join(parse_mail_users(text))}
    except SyntaxProblem as e:
        raise ScriptError(f"--mail-user: {e}") from None


def _export(text: str) -> dict[str, Any]:
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


def _time(text: str) -> dict[str, Any]:
    from gpud.units import UnitError, parse_duration

    try:
        seconds = parse_duration(text)
    except UnitError as e:
        raise ScriptError(f"--time: {e}") from None
    # UNLIMITED and 0 (Slurm's "no limit") both mean: the partition's limit.
    return {"time_limit": seconds if seconds else None}


# What a job name may not hold, each mapped to "_" (str.translate: no need for re here).
_BAD_NAME_CHARS = {**{c: "_" for c in range(0x20)}, ord("/"): "_"}


def _name(text: str) -> dict[str, Any]:
    if not text or len(text) > 200 or text.translate(_BAD_NAME_CHARS) != text:
        raise ScriptError(f"invalid job name {text!r}: 1-200 characters, no '/' or control characters")
    return {"name": text}


def _signal(text: str) -> dict[str, Any]:
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


OPTIONS: tuple[Option, ...] = (
    Option("--gpus", "-G", "[TYPE:]N", _gpus,
           "GPUs for the job: a count, TYPE:COUNT, or MIG slices PROFILE:COUNT (1g.10gb:2)."),
    Option("--gres", None, "gpu[:TYPE][:N]", _gres, "GPUs on each node, Slurm's generic-resource way (gpu:1g.10gb:2)."),
    Option("--gpu-mem", None, "SIZE", _gpu_mem,
           "One slice, MPS share or GPU with this much memory, whichever wastes least."),
    Option("--gpus-per-node", None, "[TYPE:]N", _gpu_count("--gpus-per-node", "gpus_per_node"),
           "GPUs on each node: the job gets N times --nodes."),
    Option("--gpus-per-task", None, "[TYPE:]N", _gpu_count("--gpus-per-task", "gpus_per_task"),
           "GPUs for each task: the job gets N times its tasks."),
    Option("--gpu-type", None, "TYPE", _or_unset("gpu_type", _text("gpu_type", "--gpu-type")), "Only GPUs of this model."),
    Option("--cpus-per-task", "-c", "N", _int("cpus", "--cpus-per-task", 1, 100000), "CPU cores for each task."),
    Option("--cpus-per-gpu", None, "N", _int("cpus_per_gpu", "--cpus-per-gpu", 1, 100000), "CPU cores per GPU."),
    Option("--mem", None, "SIZE", _mem, "Memory on each node: megabytes, or a K/M/G/T suffix."),
    Option("--mem-per-gpu", None, "SIZE", _size("mem_per_gpu", "--mem-per-gpu"), "Memory per GPU."),
    Option("--mem-per-cpu", None, "SIZE", _size("mem_per_cpu", "--mem-per-cpu"), "Memory per CPU core."),
    Option("--nodes", "-N", "N", _nodes, "Nodes, all started at once (default 1)."),
    Option("--ntasks-per-node", None, "N", _int("ntasks_per_node", "--ntasks-per-node", 1, MAX_TASKS_PER_NODE),
           "Processes gpuctl srun starts on each node (default 1)."),
    Option("--ntasks", "-n", "N", _int("ntasks", "--ntasks", 1, MAX_NODES * MAX_TASKS_PER_NODE),
           "Tasks in all, spread evenly over the nodes."),
    Option("--nodelist", "-w", "HOSTLIST", _or_unset("nodelist", _hosts("nodelist", "--nodelist")),
           "These nodes must all be in the job (gpu[01-04], or a file of names)."),
    Option("--exclude", "-x", "HOSTLIST", _or_unset("exclude", _hosts("exclude", "--exclude")), "Never these nodes."),
    Option("--constraint", "-C", "FEATURES", _or_unset("constraint", _constraint), "Nodes with these features: a&b (all), a|b (any)."),
    Option("--exclusive", None, None, _flag({"exclusive": True}), "No other job on the job's nodes."),
    Option("--switches", None, "N[@TIME]", _switches, "At most N leaf switches, waiting at most TIME for that."),
    Option("--time", "-t", "TIME", _time, "Time limit: MIN, [D-]HH:MM:SS, UNLIMITED."),
    Option("--job-name", "-J", "NAME", _or_unset("name", _name), "Job name (default: the script's file name)."),
    Option("--output", "-o", "PATTERN", _or_unset("stdout", _text("stdout", "--output")), "Standard output file."),
    Option("--error", "-e", "PATTERN", _or_unset("stderr", _text("stderr", "--error")), "Standard error file."),
    Option("--chdir", "-D", "DIR", _or_unset("work_dir", _text("work_dir", "--chdir")), "Working directory (default: here)."),
    Option("--account", "-A", "ACCOUNT", _or_unset("account", _text("account", "--account")), "Charge this account."),
    Option("--partition", "-p", "PARTITION", _or_unset("partition", _text("partition", "--partition")), "Partition to run in."),
    Option("--qos", "-q", "QOS", _or_unset("qos", _text("qos", "--qos")), "Quality of service."),
    Option("--nice", None, "N", _int("nice", "--nice", -10000, 10000), "Lower the job's priority by N."),
    Option("--signal", None, "[B:]SIG[@TIME]", _signal,
           "Send SIG TIME seconds (default 60) before the time limit; B: to the batch shell only."),
    Option("--requeue", None, None, _flag({"requeue": True}), "Requeue after a node failure or preemption.",
           negation="--no-requeue", negated={"requeue": False}),
    Option("--hold", "-H", None, _flag({"hold": True}), "Submit held; release it later."),
    Option("--comment", None, "TEXT", _or_unset("comment", _text("comment", "--comment")), "A note kept with the job."),
    Option("--array", "-a", "INDICES", _array, "A job array: 0-99, 1,3,5-9:2, 0-99%10."),
    Option("--dependency", "-d", "LIST", _dependency, "Start after other jobs: afterok:ID[:ID], ...."),
    Option("--kill-on-invalid-dep", None, "yes|no", _yes_no("kill_on_invalid_dep", "--kill-on-invalid-dep"),
           "Cancel the job if its dependency can never be met."),
    Option("--begin", "-b", "TIME", _when("begin_time", "--begin"), "Not before TIME (now+1hour, 16:00, ...)."),
    Option("--deadline", None, "TIME", _when("deadline", "--deadline"), "Cancel if it cannot end by TIME."),
    Option("--open-mode", None, "append|truncate", _choice("open_mode", "--open-mode", "append", "truncate"),
           "Append to or truncate the output files."),
    Option("--export", None, "ALL|NONE|VARS", _export, "The job's environment: ALL, NONE, or NAME[=VALUE],..."),
    Option("--mail-type", None, "TYPES", _mail_type, "Mail on BEGIN, END, FAIL, ... (if the cluster mails)."),
    Option("--mail-user", None, "ADDRESS", _mail_user, "Whom to mail (default: you)."),
    Option("--parsable", None, None, _flag({"parsable": True}), "Print only the job id."),
    Option("--wait", "-W", None, _flag({"wait": True}), "Wait for the job to end; exit with its exit code."),
    Option("--test-only", None, None, _flag({"test_only": True}), "Say when and where it would start; submit nothing."),
    Option("--skip-if-active", None, None, _flag({"skip_if_active": True}),
           "Submit nothing if a job of mine with this name is pending or running."),
    Option("--strict", None, None, _flag({"strict": True}), "Refuse Slurm options gpud ignores."),
    Option("--quiet", "-Q", None, _flag({"quiet": True}), "No warnings."),
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

# Other names Slurm's sbatch gives the same option.
ALIASES = {"--tasks-per-node": "--ntasks-per-node", "--cluster": "--clusters"}
_LONG_NAMES: list[str] = []   # every long name sbatch knows, filled on the first abbreviation


def long_option(name: str) -> str:
    """The long option ``name`` spells, as Slurm's getopt_long reads it: the name itself, an
    alias's option, or the one option it is an abbreviation of (``--part``: ``--partition``).
    A name that is none of these comes back as it is, for the caller to call unknown;
    ScriptError when it abbreviates several options."""
    if name in _BY_NAME or name in unsupported.UNSUPPORTED:
        return name
    if name in ALIASES:
        return ALIASES[name]
    if len(name) < 3 or not name.startswith("--") or "=" in name:
        return name
    if not _LONG_NAMES:
        _LONG_NAMES.extend([n for n in _BY_NAME if n.startswith("--")] + list(unsupported.UNSUPPORTED)
                           + list(ALIASES) + ["--help"])
    matches = [n for n in _LONG_NAMES if n.startswith(name)]
    if len({ALIASES.get(n, n) for n in matches}) > 1:   # an alias and its option are one option
        raise ScriptError(f"option '{name}' is ambiguous; possibilities: " + " ".join(f"'{n}'" for n in matches))
    return ALIASES.get(matches[0], matches[0]) if matches else name


def merge(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    """``upper``'s settings over ``lower``'s, both from one layer (one command line, the
    ``#SBATCH`` lines): one of a group of EXCLUSIVE keys replaces the others, but AGREEING
    keys stay side by side for ``resolve_amounts`` to check."""
    return _layered(lower, upper, same_layer=True)


def override(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    """A higher layer's settings over a lower one's: one of a group of EXCLUSIVE keys replaces all."""
    return _layered(lower, upper, same_layer=False)


def _layered(lower: dict[str, Any], upper: dict[str, Any], *, same_layer: bool) -> dict[str, Any]:
    out = dict(lower)
    for group in EXCLUSIVE:
        given = group & upper.keys()
        if not given:
            continue
        kept = next((keys for keys in AGREEING if given <= keys), frozenset()) if same_layer else frozenset()
        for key in group - kept:
            out.pop(key, None)
    out.update(upper)
    return out


def convert(option: Option, value: str | bool, negated: bool = False) -> dict[str, Any]:
    """Settings for one option occurrence (a flag passes True/False or negated)."""
    if option.is_flag:
        return dict(option.negated or {}) if negated or value is False else option.convert("")
    return option.convert(str(value))


# -- directives -------------------------------------------------------------------

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
        entry = _BY_NAME.get(name)
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
    from .shellwords import quote

    lines = text.split("\n")
    line = "set -- " + " ".join(quote(a) for a in args)
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
               directives: bool | Directives = True) -> dict[str, Any]:
    """The JobSpec dict for ``text`` with ``cli`` settings over its directives.

    ``directives``: False to ignore them (``--wrap``), or an already parsed ``Directives``."""
    if isinstance(directives, Directives):
        parsed = directives
    else:
        parsed = parse_directives(text) if directives else Directives({}, len(text.split("\n")))
    settings = resolve_amounts(override(parsed.settings, cli))
    if settings.get("env") is not None:
        env = settings["env"]
    settings.pop("env", None)
    env = export_env(settings.pop("export", None), os.environ if env is None else env)
    cwd = cwd or os.getcwd()
    work_dir = os.path.normpath(os.path.join(cwd, settings.pop("work_dir", None) or "."))
    spec: dict[str, Any] = {
        "script": add_arguments(text, list(args or ()), parsed.body_line),
        "name": settings.pop("name", None) or _safe_name(default_name),
        "work_dir": work_dir,
        "env": exportable_env(env),
    }
    for key in ("stdout", "stderr"):
        if settings.get(key):
            settings[key] = os.path.join(work_dir, settings[key])
    for key, value in settings.items():
        if key not in CLIENT_SETTINGS and value is not None:
            spec[key] = value
    for key in ("nodes", "ntasks_per_node"):     # a single-node job's request stays as it was
        if spec.get(key) == 1:
            del spec[key]
    return spec


def resolve_amounts(settings: dict[str, Any]) -> dict[str, Any]:
    """Nodes, tasks and per-node, per-task, per-GPU and per-CPU options as the JobSpec's
    amounts: ``gpus`` in all, ``cpus`` and ``mem_mb`` on each node."""
    out = dict(settings)
    nodes = _resolve_nodes(out)
    tasks = _resolve_tasks(out, nodes)
    gpus_on_a_node = _resolve_gpus(out, nodes, tasks) // nodes
    cpus_per_gpu = out.pop("cpus_per_gpu", None)
    if cpus_per_gpu is not None:
        if not gpus_on_a_node:
            raise ScriptError("--cpus-per-gpu needs GPUs: add --gpus N or --gres=gpu:N")
        out["cpus"] = cpus_per_gpu * gpus_on_a_node
    elif tasks > 1:
        out["cpus"] = int(out.get("cpus") or 1) * tasks     # -c is per task, cpus per node
    for key, option, per in (("mem_per_gpu", "--mem-per-gpu", gpus_on_a_node),
                             ("mem_per_cpu", "--mem-per-cpu", int(out.get("cpus") or 1))):
        amount = out.pop(key, None)
        if amount is None:
            continue
        if not per:
            raise ScriptError(f"{option} needs GPUs: add --gpus N or --gres=gpu:N")
        out["mem_mb"] = amount * per
    return out


def _resolve_nodes(out: dict[str, Any]) -> int:
    """-N, or as many nodes as -w names (every listed node is in the job, as in Slurm)."""
    listed = len(out.get("nodelist") or ())
    if out.get("nodes") is None:
        out["nodes"] = max(1, listed)
    elif listed > out["nodes"]:
        raise ScriptError(f"--nodelist names {listed} nodes but --nodes={out['nodes']}: every listed node "
                          f"is part of the job; give -N {listed} or list fewer nodes")
    return int(out["nodes"])


def _resolve_tasks(out: dict[str, Any], nodes: int) -> int:
    """--ntasks-per-node, or --ntasks spread evenly over the nodes; both must agree."""
    ntasks, per_node = out.pop("ntasks", None), out.get("ntasks_per_node")
    if ntasks is not None:
        if per_node is not None and ntasks != nodes * per_node:
            raise ScriptError(f"--ntasks={ntasks} disagrees with --ntasks-per-node={per_node} on "
                              f"{_count(nodes, 'node')} ({nodes * per_node} tasks): give one of them")
        if ntasks % nodes:
            raise ScriptError(f"--ntasks={ntasks} does not divide evenly among {nodes} nodes: give a multiple "
                              f"of {nodes}, or --ntasks-per-node")
        per_node = ntasks // nodes
        if per_node > MAX_TASKS_PER_NODE:
            raise ScriptError(f"--ntasks={ntasks} is {per_node} tasks on each node: at most "
                              f"{MAX_TASKS_PER_NODE}; add nodes with -N")
        out["ntasks_per_node"] = per_node
    return int(per_node or 1)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _resolve_gpus(out: dict[str, Any], nodes: int, tasks: int) -> int:
    """The job's total GPUs from --gpus, --gpus-per-node and --gpus-per-task, which must agree."""
    said: list[tuple[str, int]] = []
    if out.get("gpus") is not None:
        said.append((f"--gpus={out['gpus']}", int(out["gpus"])))
    per_node, per_task = out.pop("gpus_per_node", None), out.pop("gpus_per_task", None)
    if per_node is not None:
        said.append((f"{_count(per_node, 'GPU')} per node on {_count(nodes, 'node')}", per_node * nodes))
    if per_task is not None:
        said.append((f"{_count(per_task, 'GPU')} per task for {_count(nodes * tasks, 'task')}",
                     per_task * nodes * tasks))
    for what, total in said[1:]:
        if total != said[0][1]:
            raise ScriptError(f"{said[0][0]} and {what} ask for {said[0][1]} and {total} GPUs: give one of them "
                              "(--gpus counts all of the job's GPUs)")
    if said:
        if said[0][1] > MAX_GPUS:
            raise ScriptError(f"{said[-1][0]} is {said[0][1]} GPUs: at most {MAX_GPUS} per job")
        out["gpus"] = said[0][1]
    gpus = int(out.get("gpus") or 0)
    if nodes > 1 and gpus % nodes:
        raise ScriptError(f"--gpus={gpus} does not divide among {nodes} nodes: ask for a multiple of {nodes}, "
                          "or give --gpus-per-node")
    if nodes > 1 and (out.get("mig_profile") or out.get("gpu_mem_mb")):
        raise ScriptError("a job on several nodes takes whole GPUs: drop the MIG profile or --gpu-mem, or use -N 1")
    return gpus


def export_env(export: str | None, env: Any) -> dict[str, str]:
    """The job's environment for ``--export`` (ALL by default), from the submitting one."""
    if export is None:
        return dict(env)
    items = [w.strip() for w in export.split(",") if w.strip()]
    upper = [w.upper() for w in items]
    out: dict[str, str] = dict(env) if "ALL" in upper else {}
    for w in items:
        if w.upper() in ("ALL", "NONE"):
            continue
        name, eq, value = w.partition("=")
        if eq:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    return out


def _safe_name(name: str) -> str:
    return name.translate(_BAD_NAME_CHARS)[:200] or "job"


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
    "time_limit", "partition", "account", "qos", "nice", "requeue", "signal", "signal_time", "signal_batch",
    "hold", "comment",
    "array", "dependency", "begin_time", "deadline", "open_mode", "mail_type", "mail_user",
    "kill_on_invalid_dep", "skip_if_active", "mig_profile", "gpu_mem_mb",
    "nodes", "ntasks_per_node", "nodelist", "exclude", "constraint", "exclusive", "switches", "switches_wait",
})
# Keyword options given as text that go through sbatch's converters.
_API_TEXT = {"array": _array, "dependency": _dependency, "begin_time": _when("begin_time", "begin_time"),
             "deadline": _when("deadline", "deadline"), "mail_type": _mail_type, "mail_user": _mail_user,
             "nodelist": _hosts("nodelist", "nodelist"), "exclude": _hosts("exclude", "exclude"),
             "constraint": _constraint, "switches": _switches}


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
        elif key == "gpu_mem_mb" and isinstance(value, str):
            out.update(_gpu_mem(value))
        elif key == "time_limit" and isinstance(value, str):
            out.update(_time(value))
        elif key == "signal":
            out.update(_signal(str(value)))
        elif key == "name":
            out.update(_name(value))
        elif key in _API_TEXT and isinstance(value, str):
            out.update(_API_TEXT[key](value))
        elif key == "env":
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise TypeError("env must map variable names to strings")
            out["env"] = dict(value)
        else:
            out[key] = value
    return out
