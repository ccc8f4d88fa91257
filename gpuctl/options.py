"""sbatch's options: the one table of them, and how their settings combine.

Theory of operation
-------------------
``OPTIONS`` is the one table of sbatch options (srun and salloc take them too), with
Slurm's names, short forms and meanings.  Each entry names the option's spellings, its
metavar (None for a flag) and a converter (``gpuctl.converters``) from the text a user
wrote to spec settings (``{"gpus": 2, "gpu_type": "a100"}``).  Everything else reads the
table:

* ``gpuctl sbatch`` builds its click options from it, and the fast path
  (``gpuctl.fastpath``) its parser; both convert what the user typed with the same
  converters, so a value means the same on the command line and in a script;
* ``gpuctl.directives`` reads ``#SBATCH``/``#GPUD`` lines with it (``BY_NAME``,
  ``long_option``: Slurm's abbreviations and aliases).

Precedence, lowest first: defaults, ``#SBATCH``, ``#GPUD``, the command line (or the
Python API's keyword options).  Options that say the same thing another way replace each
other across layers (``override``: ``--mem``, ``--mem-per-gpu``, ``--mem-per-cpu``;
``--cpus-per-task``, ``--cpus-per-gpu``; ``--gpus``, ``--gpus-per-node``,
``--gpus-per-task``; ``--ntasks``, ``--ntasks-per-node``).  Within one layer (``merge``)
the GPU counts, and the task counts, are kept side by side and must agree; ``gpuctl.script``
resolves them when it builds the spec.

Adding an option is one table entry, its line in man/gpuctl-sbatch.1 (a test checks
that), and, when it sets a new JobSpec field, that field's name in
``gpuctl.script._API_KEYS``.
"""

from __future__ import annotations

from . import unsupported
from .converters import (MAX_NODES, MAX_TASKS_PER_NODE, ScriptError, array, choice, constraint, dependency,
                         export, flag, gpu_count, gpu_mem, gpus, gres, hosts, integer, job_name, mail_type,
                         mail_user, mem, node_count, or_unset, signal_spec, size, string, switches, time_limit,
                         when, yes_no)

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

    from .converters import Converter

# Options that say the same thing in different ways: a later layer's one replaces them all.
EXCLUSIVE = (frozenset({"mem_mb", "mem_per_gpu", "mem_per_cpu"}), frozenset({"cpus", "cpus_per_gpu"}),
             frozenset({"gpus", "gpus_per_node", "gpus_per_task", "mig_profile", "gpu_mem_mb"}),
             frozenset({"ntasks", "ntasks_per_node"}), frozenset({"switches", "switches_wait"}))
# ... except that, within one layer, these may stand side by side: they must then agree.
AGREEING = (frozenset({"gpus", "gpus_per_node", "gpus_per_task"}), frozenset({"ntasks", "ntasks_per_node"}))


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


OPTIONS: tuple[Option, ...] = (
    Option("--gpus", "-G", "[TYPE:]N", gpus,
           "GPUs for the job: a count, TYPE:COUNT, or MIG slices PROFILE:COUNT (1g.10gb:2)."),
    Option("--gres", None, "gpu[:TYPE][:N]", gres, "GPUs on each node, Slurm's generic-resource way (gpu:1g.10gb:2)."),
    Option("--gpu-mem", None, "SIZE", gpu_mem,
           "One slice, MPS share or GPU with this much memory, whichever wastes least."),
    Option("--gpus-per-node", None, "[TYPE:]N", gpu_count("--gpus-per-node", "gpus_per_node"),
           "GPUs on each node: the job gets N times --nodes."),
    Option("--gpus-per-task", None, "[TYPE:]N", gpu_count("--gpus-per-task", "gpus_per_task"),
           "GPUs for each task: the job gets N times its tasks."),
    Option("--gpu-type", None, "TYPE", or_unset("gpu_type", string("gpu_type", "--gpu-type")), "Only GPUs of this model."),
    Option("--cpus-per-task", "-c", "N", integer("cpus", "--cpus-per-task", 1, 100000), "CPU cores for each task."),
    Option("--cpus-per-gpu", None, "N", integer("cpus_per_gpu", "--cpus-per-gpu", 1, 100000), "CPU cores per GPU."),
    Option("--mem", None, "SIZE", mem, "Memory on each node: megabytes, or a K/M/G/T suffix."),
    Option("--mem-per-gpu", None, "SIZE", size("mem_per_gpu", "--mem-per-gpu"), "Memory per GPU."),
    Option("--mem-per-cpu", None, "SIZE", size("mem_per_cpu", "--mem-per-cpu"), "Memory per CPU core."),
    Option("--nodes", "-N", "N", node_count, "Nodes, all started at once (default 1)."),
    Option("--ntasks-per-node", None, "N", integer("ntasks_per_node", "--ntasks-per-node", 1, MAX_TASKS_PER_NODE),
           "Processes gpuctl srun starts on each node (default 1)."),
    Option("--ntasks", "-n", "N", integer("ntasks", "--ntasks", 1, MAX_NODES * MAX_TASKS_PER_NODE),
           "Tasks in all, spread evenly over the nodes."),
    Option("--nodelist", "-w", "HOSTLIST", or_unset("nodelist", hosts("nodelist", "--nodelist")),
           "These nodes must all be in the job (gpu[01-04], or a file of names)."),
    Option("--exclude", "-x", "HOSTLIST", or_unset("exclude", hosts("exclude", "--exclude")), "Never these nodes."),
    Option("--constraint", "-C", "FEATURES", or_unset("constraint", constraint), "Nodes with these features: a&b (all), a|b (any)."),
    Option("--exclusive", None, None, flag({"exclusive": True}), "No other job on the job's nodes."),
    Option("--switches", None, "N[@TIME]", switches, "At most N leaf switches, waiting at most TIME for that."),
    Option("--time", "-t", "TIME", time_limit, "Time limit: MIN, [D-]HH:MM:SS, UNLIMITED."),
    Option("--job-name", "-J", "NAME", or_unset("name", job_name), "Job name (default: the script's file name)."),
    Option("--output", "-o", "PATTERN", or_unset("stdout", string("stdout", "--output")), "Standard output file."),
    Option("--error", "-e", "PATTERN", or_unset("stderr", string("stderr", "--error")), "Standard error file."),
    Option("--chdir", "-D", "DIR", or_unset("work_dir", string("work_dir", "--chdir")), "Working directory (default: here)."),
    Option("--account", "-A", "ACCOUNT", or_unset("account", string("account", "--account")), "Charge this account."),
    Option("--partition", "-p", "PARTITION", or_unset("partition", string("partition", "--partition")), "Partition to run in."),
    Option("--qos", "-q", "QOS", or_unset("qos", string("qos", "--qos")), "Quality of service."),
    Option("--nice", None, "N", integer("nice", "--nice", -10000, 10000), "Lower the job's priority by N."),
    Option("--signal", None, "[B:]SIG[@TIME]", signal_spec,
           "Send SIG TIME seconds (default 60) before the time limit; B: to the batch shell only."),
    Option("--requeue", None, None, flag({"requeue": True}), "Requeue after a node failure or preemption.",
           negation="--no-requeue", negated={"requeue": False}),
    Option("--hold", "-H", None, flag({"hold": True}), "Submit held; release it later."),
    Option("--comment", None, "TEXT", or_unset("comment", string("comment", "--comment")), "A note kept with the job."),
    Option("--array", "-a", "INDICES", array, "A job array: 0-99, 1,3,5-9:2, 0-99%10."),
    Option("--dependency", "-d", "LIST", dependency, "Start after other jobs: afterok:ID[:ID], ...."),
    Option("--kill-on-invalid-dep", None, "yes|no", yes_no("kill_on_invalid_dep", "--kill-on-invalid-dep"),
           "Cancel the job if its dependency can never be met."),
    Option("--begin", "-b", "TIME", when("begin_time", "--begin"), "Not before TIME (now+1hour, 16:00, ...)."),
    Option("--deadline", None, "TIME", when("deadline", "--deadline"), "Cancel if it cannot end by TIME."),
    Option("--open-mode", None, "append|truncate", choice("open_mode", "--open-mode", "append", "truncate"),
           "Append to or truncate the output files."),
    Option("--export", None, "ALL|NONE|VARS", export, "The job's environment: ALL, NONE, or NAME[=VALUE],..."),
    Option("--mail-type", None, "TYPES", mail_type, "Mail on BEGIN, END, FAIL, ... (if the cluster mails)."),
    Option("--mail-user", None, "ADDRESS", mail_user, "Whom to mail (default: you)."),
    Option("--parsable", None, None, flag({"parsable": True}), "Print only the job id."),
    Option("--wait", "-W", None, flag({"wait": True}), "Wait for the job to end; exit with its exit code."),
    Option("--test-only", None, None, flag({"test_only": True}), "Say when and where it would start; submit nothing."),
    Option("--skip-if-active", None, None, flag({"skip_if_active": True}),
           "Submit nothing if a job of mine with this name is pending or running."),
    Option("--strict", None, None, flag({"strict": True}), "Refuse Slurm options gpud ignores."),
    Option("--quiet", "-Q", None, flag({"quiet": True}), "No warnings."),
    Option("--wrap", None, "CMD", string("wrap", "--wrap"), "Run CMD in a generated /bin/bash script.",
           directive=False),
)

BY_NAME: dict[str, tuple[Option, bool]] = {}
for _o in OPTIONS:
    BY_NAME[_o.long] = (_o, False)
    if _o.short:
        BY_NAME[_o.short] = (_o, False)
    if _o.negation:
        BY_NAME[_o.negation] = (_o, True)

# Other names Slurm's sbatch gives the same option.
ALIASES = {"--tasks-per-node": "--ntasks-per-node", "--cluster": "--clusters"}
_LONG_NAMES: list[str] = []   # every long name sbatch knows, filled on the first abbreviation


def long_option(name: str) -> str:
    """The long option ``name`` spells, as Slurm's getopt_long reads it: the name itself, an
    alias's option, or the one option it is an abbreviation of (``--part``: ``--partition``).
    A name that is none of these comes back as it is, for the caller to call unknown;
    ScriptError when it abbreviates several options."""
    if name in BY_NAME or name in unsupported.UNSUPPORTED:
        return name
    if name in ALIASES:
        return ALIASES[name]
    if len(name) < 3 or not name.startswith("--") or "=" in name:
        return name
    if not _LONG_NAMES:
        _LONG_NAMES.extend([n for n in BY_NAME if n.startswith("--")] + list(unsupported.UNSUPPORTED)
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
