"""The resource limits a job's script or a step's task inherits from its submitter (Slurm's
PropagateResourceLimits): {"NOFILE": [soft, hard], ...}, -1 for unlimited, as
``gpud.model.parse_rlimits`` checked them.  Each is clamped to this process's own hard limit,
so user data can lower a limit, never raise one above the node's.

``plan`` works the values out (in the worker, or the job wrapper before it becomes the
job); ``apply`` sets them on this process (the wrapper, before it becomes the job),
``apply_to`` on another (an srun task's shell, waiting at its gate before it becomes the
command): no code runs in a forked child, whose descriptors subprocess would otherwise
close only after it, under the new limit.

Stdlib only and no gpud imports: the job wrapper (jobwrap.py, run with ``-I -S``) loads this
file by its path.
"""

import resource

INFINITY = resource.RLIM_INFINITY


def _clamp(value, cap):
    value = INFINITY if value == -1 else value
    if cap == INFINITY:
        return value
    return cap if value == INFINITY else min(value, cap)


def plan(limits):
    """([(name, resource, soft, hard)], [names this platform has no limit for]) for
    ``limits``, each clamped to this process's hard limit; limits already in force are left
    out, so an empty plan needs no setrlimit at all."""
    todo, unknown = [], []
    for name, (soft, hard) in sorted(limits.items()):
        res = getattr(resource, "RLIMIT_" + name, None)
        if res is None:
            unknown.append(name)
            continue
        now = resource.getrlimit(res)
        hard = _clamp(hard, now[1])
        soft = _clamp(soft, now[1])
        if hard != INFINITY and (soft == INFINITY or soft > hard):
            soft = hard
        if (soft, hard) != now:
            todo.append((name, res, soft, hard))
    return todo, unknown


def apply(todo, warn):
    """Set each planned limit; one that the kernel refuses is kept as it was and
    ``warn(line)`` says so."""
    for name, res, soft, hard in todo:
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError) as e:
            warn(f"cannot set {name} limit to {soft}/{hard}: {e}; keeping the node's")


def apply_to(pid, todo, warn):
    """``apply`` for process ``pid`` (prlimit): the limits hold from its next exec on."""
    for name, res, soft, hard in todo:
        try:
            resource.prlimit(pid, res, (soft, hard))
        except ProcessLookupError:
            return     # gone already: its exit is reported as any other
        except (ValueError, OSError) as e:
            warn(f"cannot set {name} limit to {soft}/{hard}: {e}; keeping the node's")
