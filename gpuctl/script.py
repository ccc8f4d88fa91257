"""A batch script and its settings, as the JobSpec dict the head is sent.

Theory of operation
-------------------
The settings come from the option table's converters (``gpuctl.options``,
``gpuctl.converters``), layered over the script's ``#SBATCH``/``#GPUD`` lines
(``gpuctl.directives``).  ``build_spec`` puts the command line's over the directives',
then resolves nodes, tasks and per-node, per-task, per-GPU and per-CPU amounts
(``resolve_amounts``), builds the environment ``--export`` asks for, fills the defaults
(job name, working directory), makes paths absolute, encodes script arguments as a
``set --`` line after the directives, and returns a dict with JobSpec's field names (a
single-node job's dict has no ``nodes``).

Big jobs use Slurm's options and meanings: ``-N`` nodes, ``--ntasks-per-node`` (or ``-n``
tasks in all), ``-w``/``-x`` hostlists (or files of names), ``-C`` node features,
``--exclusive``, ``--switches``.  The JobSpec's ``gpus`` is the job's total, so
``--gpus-per-node G`` becomes ``G * nodes`` and ``--gpus-per-task G`` ``G * tasks``;
``cpus`` and ``mem_mb`` are what each node gives, so ``-c`` (per task) is multiplied by
the tasks on a node, and ``--cpus-per-gpu``/``--mem-per-gpu`` by the GPUs on a node.

``api_settings`` turns ``Client.submit``'s keyword options into the same settings, so
the Python API means what the command line means.
"""

from __future__ import annotations

import os

from . import converters as conv
from .converters import MAX_GPUS, MAX_TASKS_PER_NODE, ScriptError
from .options import override

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

    from .directives import Directives

# Settings that are not JobSpec fields: they change what sbatch does, not the job, or are
# resolved into other fields by build_spec.
CLIENT_SETTINGS = frozenset({"parsable", "wrap", "wait", "strict", "quiet", "export", "cpus_per_gpu",
                             "mem_per_gpu", "mem_per_cpu", "gpus_per_node", "gpus_per_task", "ntasks"})
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh", "ash", "mksh", "busybox"})


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
    if directives is True:
        from .directives import parse_directives   # not on the way of --wrap, which has none

        directives = parse_directives(text)
    body_line = directives.body_line if directives else len(text.split("\n"))
    settings = resolve_amounts(override(directives.settings if directives else {}, cli))
    if settings.get("env") is not None:
        env = settings["env"]
    settings.pop("env", None)
    env = export_env(settings.pop("export", None), os.environ if env is None else env)
    cwd = cwd or os.getcwd()
    work_dir = os.path.normpath(os.path.join(cwd, settings.pop("work_dir", None) or "."))
    spec: dict[str, Any] = {
        "script": add_arguments(text, list(args or ()), body_line),
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
    return name.translate(conv.BAD_NAME_CHARS)[:200] or "job"


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
_API_TEXT = {"array": conv.array, "dependency": conv.dependency,
             "begin_time": conv.when("begin_time", "begin_time"), "deadline": conv.when("deadline", "deadline"),
             "mail_type": conv.mail_type, "mail_user": conv.mail_user,
             "nodelist": conv.hosts("nodelist", "nodelist"), "exclude": conv.hosts("exclude", "exclude"),
             "constraint": conv.constraint, "switches": conv.switches}


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
            out.update(conv.mem(value))
        elif key == "gpu_mem_mb" and isinstance(value, str):
            out.update(conv.gpu_mem(value))
        elif key == "time_limit" and isinstance(value, str):
            out.update(conv.time_limit(value))
        elif key == "signal":
            out.update(conv.signal_spec(str(value)))
        elif key == "name":
            out.update(conv.job_name(value))
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
