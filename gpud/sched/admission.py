"""Submit-time policy: fill in a request's defaults, and refuse what can never run.

Theory of operation
-------------------
The head calls ``resolve_job`` then ``refusal`` for every submission, before storing it.
``resolve_job`` never fails: it picks the partition, account, QOS, time limit and memory a
request gets when it names none (an unknown name is passed through unchanged).
``refusal`` then returns a one-line message for a request that can never run as the
cluster is configured (flux calls this "infeasible", as opposed to "not now"): an unknown
partition, QOS or account, an account the user is not in, a time limit over the
partition's ``max_time``, a GPU type no node has, or more GPUs, CPUs or memory than any one
node of the partition has (a job runs on one node).  Node checks apply only once nodes
have registered; before that, a request waits instead.

Whole GPUs (``--gpus N``) count only GPUs in ``whole`` mode.  A MIG request is refused
when no GPU of the partition offers its profile (a dynamic MIG GPU whose model has it, or
a fixed layout holding it) or no node could hold that many slices; a ``--gpu-mem``
request when no slice, share or GPU of the partition is that large.

``req`` is anything with the request's attributes (a JobSpec) or a dict with those keys:
``partition``, ``account``, ``qos``, ``time_limit``, ``mem_mb``, ``gpus``, ``cpus``,
``gpu_type``, ``mig_profile``, ``gpu_mem_mb``.  ``nodes`` are NodeInfo or NodeView objects (``name``, ``cpus``, ``mem_mb``,
``gpus`` with ``model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Sequence

from ..gpu import mig
from ..units import format_duration, format_size_mb
from .config import SchedConfig
from .gpustate import slice_capacity_mb


@dataclass(frozen=True)
class Resolved:
    account: str
    partition: str
    qos: str
    time_limit: float | None      # seconds; None = unlimited
    mem_mb: int


def _get(req: Any, key: str, default: Any = None) -> Any:
    if isinstance(req, dict):
        v = req.get(key, default)
    else:
        v = getattr(req, key, default)
    return default if v is None else v


def default_mem_mb(cfg: SchedConfig, partition: str, gpus: int) -> int:
    """Memory for a job that names none: per-GPU default x GPUs, else per-job, else global."""
    p = cfg.partitions.get(partition)
    if p is not None and p.default_mem_per_gpu_mb and gpus > 0:
        return p.default_mem_per_gpu_mb * gpus
    if p is not None and p.default_mem_mb:
        return p.default_mem_mb
    return cfg.default_mem_mb


def resolve_job(req: Any, user: str, cfg: SchedConfig, nodes: Sequence[Any] = ()) -> Resolved:
    """The request with every default filled in; never raises."""
    partition = _get(req, "partition") or cfg.default_partition
    account = _get(req, "account") or cfg.default_account_for(user) or cfg.default_account
    qos = _get(req, "qos") or cfg.default_qos
    time_limit = _get(req, "time_limit")
    if time_limit is None:
        p = cfg.partitions.get(partition)
        time_limit = p.default_time if p is not None else None
    mem = _get(req, "mem_mb") or default_mem_mb(cfg, partition, int(_get(req, "gpus", 0)))
    return Resolved(account=account, partition=partition, qos=qos, time_limit=time_limit, mem_mb=mem)


def refusal(req: Any, resolved: Resolved, user: str, cfg: SchedConfig, nodes: Sequence[Any] = ()) -> str | None:
    """Why the request can never run, in one line with what to change; None if it can."""
    part = cfg.partitions.get(resolved.partition)
    if part is None:
        return (f"invalid partition {resolved.partition!r}: choose one of {', '.join(cfg.partitions)} "
                "with --partition")
    if resolved.qos not in cfg.qos:
        return f"invalid QOS {resolved.qos!r}: choose one of {', '.join(cfg.qos)} with --qos"
    named = _get(req, "account") is not None
    if not named and not cfg.user_in_account(user, resolved.account):
        return f"user {user} belongs to no account: ask an administrator to add them to one in gpud.toml"
    if resolved.account not in cfg.accounts:
        return f"invalid account {resolved.account!r}: choose one of {', '.join(cfg.accounts)} with --account"
    if not cfg.user_in_account(user, resolved.account):
        mine = [a.name for a in cfg.accounts.values() if cfg.user_in_account(user, a.name)]
        hint = f"use --account {' or '.join(mine)}" if mine else "ask an administrator to add you"
        return f"user {user} is not in account {resolved.account!r}: {hint}"
    if part.max_time is not None and (resolved.time_limit is None or resolved.time_limit > part.max_time):
        return (f"time limit {format_duration(resolved.time_limit)} exceeds partition {part.name}'s "
                f"max_time of {format_duration(part.max_time)}: ask for less with --time")
    members = [n for n in nodes if any(fnmatchcase(n.name, pat) for pat in part.nodes)]
    if not members:
        return None
    gpus, cpus = int(_get(req, "gpus", 0)), int(_get(req, "cpus", 1))
    gpu_type = _get(req, "gpu_type")
    mem = resolved.mem_mb

    if _get(req, "mig_profile") is not None or _get(req, "gpu_mem_mb") is not None:
        return _shared_refusal(req, part.name, members, cpus, mem)

    def have(n: Any) -> int:
        return sum(1 for g in n.gpus if (gpu_type is None or g.model == gpu_type) and _mode(g) == "whole")

    if gpu_type is not None and not any(have(n) for n in members):
        models = sorted({g.model for n in members for g in n.gpus if _mode(g) == "whole"})
        return (f"no node in partition {part.name} has GPUs of type {gpu_type!r}: use one of "
                f"{', '.join(models) or '(none: this partition has no GPUs)'} with --gpu-type")
    most = max(have(n) for n in members)
    if gpus > most:
        return (f"Requested node configuration is not available: {gpus} GPUs on one node, but the largest "
                f"node in partition {part.name} has {most}; ask for at most {most}")
    if cpus > max(n.cpus for n in members):
        top = max(n.cpus for n in members)
        return (f"Requested node configuration is not available: {cpus} CPUs, but the largest node in "
                f"partition {part.name} has {top}; ask for at most {top}")
    if mem > max(n.mem_mb for n in members):
        top = max(n.mem_mb for n in members)
        return (f"Requested node configuration is not available: {format_size_mb(mem)} of memory, but the "
                f"largest node in partition {part.name} has {format_size_mb(top)}; ask for less with --mem")
    if not any(have(n) >= gpus and n.cpus >= cpus and n.mem_mb >= mem for n in members):
        return (f"Requested node configuration is not available: no node in partition {part.name} has "
                f"{gpus} GPUs, {cpus} CPUs and {format_size_mb(mem)} of memory together; ask for less")
    return None


def _mode(g: Any) -> str:
    return getattr(g, "mode", "whole") or "whole"


def _slices_on(g: Any, profile: str) -> int:
    """How many slices of ``profile`` GPU ``g`` could hold at once (0 when none)."""
    if _mode(g) != "mig" or not mig.supports_mig(g.model):
        return 0
    cat = mig.catalog(g.model)
    if profile not in cat:
        return 0
    if getattr(g, "dynamic", False):
        return cat[profile].max_count
    return sum(1 for s in getattr(g, "slices", ()) if s.profile == profile)


def _largest_mb(g: Any) -> int:
    """The most memory one device of GPU ``g`` can give a job."""
    if _mode(g) != "mig":
        return int(g.memory_mb)
    if getattr(g, "dynamic", False) and mig.supports_mig(g.model):
        return max(slice_capacity_mb(p.name, p.memory_mb) for p in mig.catalog(g.model).values())
    return max((slice_capacity_mb(s.profile, s.memory_mb) for s in getattr(g, "slices", ())), default=0)


def _shared_refusal(req: Any, part: str, members: list[Any], cpus: int, mem: int) -> str | None:
    """Why a MIG or --gpu-mem request can never run in partition ``part``."""
    gpu_type = _get(req, "gpu_type")
    profile = _get(req, "mig_profile")
    want = int(_get(req, "gpu_mem_mb", 0))
    count = max(1, int(_get(req, "gpus", 1)))

    def gpus(n: Any) -> list[Any]:
        return [g for g in n.gpus if gpu_type is None or g.model == gpu_type]

    if profile is not None:
        def cap(n: Any) -> int:
            return sum(_slices_on(g, profile) for g in gpus(n))
        if not any(cap(n) for n in members):
            offered = sorted({p for n in members for g in gpus(n) if _mode(g) == "mig" and mig.supports_mig(g.model)
                              for p in (mig.catalog(g.model) if getattr(g, "dynamic", False)
                                        else {s.profile for s in getattr(g, "slices", ())})})
            hint = (f"MIG GPUs here offer {', '.join(offered)}" if offered
                    else "it has no GPUs in MIG mode; ask for whole GPUs (--gpus N) or memory (--gpu-mem)")
            kind = f" of type {gpu_type}" if gpu_type else ""
            return f"no GPU{kind} in partition {part} offers MIG profile {profile}: {hint}"
        most = max(cap(n) for n in members)
        if count > most:
            return (f"Requested node configuration is not available: {count} {profile} slices on one node, but "
                    f"the most one node of partition {part} can hold is {most}; ask for at most {most}")
        what = f"{count} {profile} slice{'s' if count > 1 else ''}"
    else:
        def cap(n: Any) -> int:
            return int(any(_largest_mb(g) >= want for g in gpus(n)))
        if not any(cap(n) for n in members):
            top = max((_largest_mb(g) for n in members for g in gpus(n)), default=0)
            return (f"no GPU, slice or share in partition {part} has {format_size_mb(want)} of GPU memory; "
                    f"the largest has {format_size_mb(top)}: ask for less with --gpu-mem")
        what = f"a GPU device with {format_size_mb(want)}"
    if cpus > max(n.cpus for n in members) or mem > max(n.mem_mb for n in members) or not any(
            cap(n) >= (count if profile else 1) and n.cpus >= cpus and n.mem_mb >= mem for n in members):
        return (f"Requested node configuration is not available: no node in partition {part} has {what}, "
                f"{cpus} CPUs and {format_size_mb(mem)} of memory together; ask for less")
    return None
