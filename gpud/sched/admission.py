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
node of the partition has.  Node checks apply only once nodes have registered; before that,
a request waits instead.  ``infeasible`` gives the same answer with the kind of its reason
(``Infeasible.kind``: ``no_such_qos``, ``too_many_gpus``, ...): the simulator refuses trace
jobs with it, so its refusals are the head's, counted by kind.

Multi-node jobs (``nodes`` > 1) and jobs that name nodes, features or exclusivity are
refused when the request contradicts itself (GPUs not divisible by the node count, more
``nodelist`` names than nodes, a node both required and excluded, a malformed
``constraint``, a GPU fraction over several nodes) and, once nodes have registered, when
the partition has fewer nodes than asked, a named node is not in it, no node has the
features, or fewer than N matching nodes could hold the per-node share (``gpus // nodes``
GPUs, ``cpus`` and ``mem_mb`` on each).

Whole GPUs (``--gpus N``) count only GPUs in ``whole`` mode and ``mps:dynamic`` ones.  A MIG request is refused
when no GPU of the partition offers its profile (a dynamic MIG GPU whose model has it, or
a fixed layout holding it) or no node could hold that many slices; a ``--gpu-mem``
request when no slice, share or GPU of the partition is that large.

``req`` is anything with the request's attributes (a JobSpec) or a dict with those keys:
``partition``, ``account``, ``qos``, ``time_limit``, ``mem_mb``, ``gpus``, ``cpus``,
``gpu_type``, ``mig_profile``, ``gpu_mem_mb``, and optionally ``nodes``, ``nodelist``,
``exclude``, ``constraint``, ``exclusive``.  The ``nodes`` argument holds NodeInfo or NodeView
objects (``name``, ``cpus``, ``mem_mb``, ``labels``, ``gpus`` with ``model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, NamedTuple, Sequence

from ..gpu import mig
from ..units import format_duration, format_size_mb
from .config import SchedConfig
from .gang import node_features, parse_constraint
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
    interactive = bool(_get(req, "interactive", False))   # salloc, srun outside a job
    partition = _get(req, "partition") or (interactive and cfg.interactive_partition) or cfg.default_partition
    account = _get(req, "account") or cfg.default_account_for(user) or cfg.default_account
    qos = _get(req, "qos") or (interactive and cfg.interactive_qos) or cfg.default_qos
    time_limit = _get(req, "time_limit")
    if time_limit is None:
        p = cfg.partitions.get(partition)
        time_limit = p.default_time if p is not None else None
    mem = _get(req, "mem_mb")
    if mem == 0:   # Slurm's --mem=0: all the memory of each node; here the partition's smallest
        p = cfg.partitions.get(partition)
        mem = min((n.mem_mb for n in _members(nodes, p.nodes).members), default=0) if p is not None else 0
    mem = mem or default_mem_mb(cfg, partition, int(_get(req, "gpus", 0)))
    return Resolved(account=account, partition=partition, qos=qos, time_limit=time_limit, mem_mb=mem)


class Infeasible(NamedTuple):
    """Why a request can never run: a short name for the kind of reason, and the message."""

    kind: str          # e.g. "no_such_qos", "too_many_gpus" (the simulator counts refusals by it)
    message: str       # one line with what to change, for the user


def refusal(req: Any, resolved: Resolved, user: str, cfg: SchedConfig, nodes: Sequence[Any] = ()) -> str | None:
    """Why the request can never run, in one line with what to change; None if it can."""
    why = infeasible(req, resolved, user, cfg, nodes)
    return None if why is None else why.message


def infeasible(req: Any, resolved: Resolved, user: str, cfg: SchedConfig, nodes: Sequence[Any] = (), *,
               accounts: bool = True) -> Infeasible | None:
    """``refusal`` with the kind of its reason.  ``accounts=False`` leaves out whether the
    account exists and the user may use it (the simulator makes every trace account and
    user valid)."""
    part = cfg.partitions.get(resolved.partition)
    if part is None:
        return Infeasible(
            "no_such_partition",
            f"invalid partition {resolved.partition!r}: choose one of "
            f"{', '.join(cfg.partitions)} with --partition")
    if resolved.qos not in cfg.qos:
        return Infeasible("no_such_qos",
                          f"invalid QOS {resolved.qos!r}: choose one of {', '.join(cfg.qos)} with --qos")
    if accounts:
        why = _account_refusal(req, resolved, user, cfg)
        if why:
            return why
    if part.max_time is not None and (resolved.time_limit is None or resolved.time_limit > part.max_time):
        return Infeasible(
            "over_time_limit",
            f"time limit {format_duration(resolved.time_limit)} exceeds partition "
            f"{part.name}'s max_time of {format_duration(part.max_time)}: ask for less with --time")
    view = _members(nodes, part.nodes)
    members = view.members
    gpus, cpus = int(_get(req, "gpus", 0)), int(_get(req, "cpus", 1))
    gpu_type = _get(req, "gpu_type")
    mem = resolved.mem_mb
    shared = _get(req, "mig_profile") is not None or _get(req, "gpu_mem_mb") is not None
    count = int(_get(req, "nodes", 1))
    wanted = tuple(_get(req, "nodelist", ()))
    banned = tuple(_get(req, "exclude", ()))
    features = _get(req, "constraint")
    exclusive = bool(_get(req, "exclusive", False))
    filtered = count != 1 or wanted or banned or features or exclusive
    if filtered:
        why = _request_refusal(count, gpus, shared, exclusive, wanted, banned, features)
        if why:
            return why
    if not members:
        return None

    if shared:
        return _shared_refusal(req, part.name, members, cpus, mem)
    if filtered:
        return _gang_refusal(part.name, members, count, gpus // count, cpus, mem, gpu_type, wanted, banned,
                             features, exclusive)

    most = view.most_whole(gpu_type)
    if gpu_type is not None and not most:
        models = view.whole_models()
        return Infeasible(
            "no_such_gpu_type",
            f"no node in partition {part.name} has GPUs of type {gpu_type!r}: use one of "
            f"{', '.join(models) or '(none: this partition has no GPUs)'} with --gpu-type")
    if gpus > most:
        return Infeasible(
            "too_many_gpus",
            f"Requested node configuration is not available: {gpus} GPUs on one node, but the largest "
            f"node in partition {part.name} has {most}; ask for at most {most}")
    if cpus > view.cpus:
        return Infeasible(
            "too_many_cpus",
            f"Requested node configuration is not available: {cpus} CPUs, but the largest node in "
            f"partition {part.name} has {view.cpus}; ask for at most {view.cpus}")
    if mem > view.mem_mb:
        return Infeasible(
            "too_much_memory",
            f"Requested node configuration is not available: {format_size_mb(mem)} of memory, but the "
            f"largest node in partition {part.name} has {format_size_mb(view.mem_mb)}; ask for less with --mem")
    if not any(_whole(n, gpu_type) >= gpus and n.cpus >= cpus and n.mem_mb >= mem for n in members):
        return Infeasible(
            "no_node_fits",
            f"Requested node configuration is not available: no node in partition {part.name} has "
            f"{gpus} GPUs, {cpus} CPUs and {format_size_mb(mem)} of memory together; ask for less")
    return None


def _account_refusal(req: Any, resolved: Resolved, user: str, cfg: SchedConfig) -> Infeasible | None:
    named = _get(req, "account") is not None
    if not named and not cfg.user_in_account(user, resolved.account):
        return Infeasible("no_account",
                          f"user {user} belongs to no account: ask an administrator to add them to one in gpud.toml")
    if resolved.account not in cfg.accounts:
        return Infeasible(
            "no_such_account",
            f"invalid account {resolved.account!r}: choose one of "
            f"{', '.join(cfg.accounts)} with --account")
    if not cfg.user_in_account(user, resolved.account):
        mine = [a.name for a in cfg.accounts.values() if cfg.user_in_account(user, a.name)]
        hint = f"use --account {' or '.join(mine)}" if mine else "ask an administrator to add you"
        return Infeasible("not_in_account", f"user {user} is not in account {resolved.account!r}: {hint}")
    return None


def _whole(n: Any, gpu_type: str | None) -> int:
    """Node ``n``'s GPUs in whole mode (of ``gpu_type``, when given)."""
    return sum(1 for g in n.gpus if (gpu_type is None or g.model == gpu_type) and _takes_whole(g))


class _Members:
    """A partition's nodes among one sequence of nodes, and the largest node's GPUs, CPUs
    and memory, each worked out once."""

    def __init__(self, nodes: Sequence[Any], patterns: Sequence[str]) -> None:
        self.nodes = nodes
        self.members = [n for n in nodes if any(fnmatchcase(n.name, pat) for pat in patterns)]
        self.cpus = max((n.cpus for n in self.members), default=0)
        self.mem_mb = max((n.mem_mb for n in self.members), default=0)
        self._whole: dict[str | None, int] = {}
        self._models: list[str] | None = None

    def most_whole(self, gpu_type: str | None) -> int:
        most = self._whole.get(gpu_type)
        if most is None:
            most = self._whole[gpu_type] = max((_whole(n, gpu_type) for n in self.members), default=0)
        return most

    def whole_models(self) -> list[str]:
        """The models of the members' GPUs that can be given whole, sorted."""
        if self._models is None:
            self._models = sorted({g.model for n in self.members for g in n.gpus if _takes_whole(g)})
        return self._models


_KEPT: dict[tuple[str, ...], _Members] = {}


def _members(nodes: Sequence[Any], patterns: Sequence[str]) -> _Members:
    """``_Members`` of ``nodes``, kept while the same tuple of nodes comes again: the head
    passes one tuple until a node registers anew, and walking 1,000 nodes' GPUs cost every
    submission over a millisecond.  Any other sequence is walked each time."""
    if not isinstance(nodes, tuple):
        return _Members(nodes, patterns)
    key = tuple(patterns)
    kept = _KEPT.get(key)
    if kept is None or kept.nodes is not nodes:
        kept = _KEPT[key] = _Members(nodes, patterns)
    return kept


def _request_refusal(count: int, gpus: int, shared: bool, exclusive: bool, wanted: tuple[str, ...],
                     banned: tuple[str, ...], features: str | None) -> Infeasible | None:
    """Why a node request contradicts itself, whatever the nodes."""
    if count < 1:
        return Infeasible("bad_request", f"invalid node count {count}: ask for at least 1 node with -N")
    if shared and (count > 1 or exclusive):
        return Infeasible(
            "bad_request",
            "GPU fractions (a MIG profile or --gpu-mem) run on one node and share it: drop -N and "
            "--exclusive, or ask for whole GPUs with --gpus")
    if gpus % count:
        return Infeasible(
            "bad_request",
            f"{gpus} GPUs cannot be split evenly over {count} nodes: ask for a multiple of {count} "
            "with --gpus, or give --gpus-per-node")
    if len(set(wanted)) > count:
        k = len(set(wanted))
        return Infeasible(
            "bad_request",
            f"--nodelist names {k} nodes but the job asks for {count}: ask for -N {k}, or name fewer nodes")
    both = sorted(set(wanted) & set(banned))
    if both:
        return Infeasible(
            "bad_request",
            f"node {both[0]} is both required (--nodelist) and excluded (--exclude): drop it from one")
    try:
        parse_constraint(features)
    except ValueError as e:
        return Infeasible("bad_request", str(e))
    return None


def _gang_refusal(part: str, members: list[Any], count: int, per_node: int, cpus: int, mem: int,
                  gpu_type: str | None, wanted: tuple[str, ...], banned: tuple[str, ...],
                  features: str | None, exclusive: bool) -> Infeasible | None:
    """Why a multi-node job, or one that names nodes or features, can never run in ``part``."""
    names = {n.name for n in members}
    unknown = sorted(set(wanted) - names)
    if unknown:
        return Infeasible(
            "no_such_node",
            f"Invalid node name specified: {unknown[0]} is not a node of partition {part}; "
            "see gpuctl sinfo for its nodes")
    if count > len(members):
        return Infeasible(
            "too_many_nodes",
            f"Requested node configuration is not available: {count} nodes, but partition {part} has "
            f"{len(members)}; ask for at most {len(members)} with -N")
    alternatives = parse_constraint(features)
    usable = [n for n in members if n.name not in banned]
    if alternatives:
        usable = [n for n in usable if any(a <= node_features(_labels(n)) for a in alternatives)]
        if not usable:
            offered = sorted({f for n in members for f in node_features(_labels(n))})
            return Infeasible(
                "no_such_feature",
                f"Invalid feature specification: no node in partition {part} has {features}; "
                f"its nodes offer {', '.join(offered) or 'no features'}")

    def have(n: Any) -> int:
        return sum(1 for g in n.gpus if (gpu_type is None or g.model == gpu_type) and _takes_whole(g))

    most = max(have(n) for n in members)
    if per_node > most:
        return Infeasible(
            "too_many_gpus",
            f"Requested node configuration is not available: {per_node} GPUs per node, but the largest "
            f"node in partition {part} has {most}; ask for at most {most * count} GPUs over {count} nodes")
    able = [n for n in usable if have(n) >= per_node and n.cpus >= cpus and n.mem_mb >= mem]
    if len(able) < count or not set(wanted) <= {n.name for n in able}:
        what = f"{per_node} GPUs, {cpus} CPUs and {format_size_mb(mem)} of memory"
        including = f" (including {', '.join(sorted(wanted))})" if wanted else ""
        return Infeasible(
            "no_node_fits",
            f"Requested node configuration is not available: the job needs {count} nodes{including} with "
            f"{what} each, but only {len(able)} matching nodes of partition {part} have that; ask for "
            "fewer nodes or less per node")
    return None


def _labels(n: Any) -> dict[str, str]:
    labels = getattr(n, "labels", None) or {}
    return labels if isinstance(labels, dict) else dict(labels)


def _mode(g: Any) -> str:
    return getattr(g, "mode", "whole") or "whole"


def _takes_whole(g: Any) -> bool:
    """A ``whole`` GPU, or an ``mps:dynamic`` one (whole while no share holds it)."""
    mode = _mode(g)
    return mode == "whole" or (mode == "mps" and bool(getattr(g, "dynamic", False)))


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


def _shared_refusal(req: Any, part: str, members: list[Any], cpus: int, mem: int) -> Infeasible | None:
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
            return Infeasible(
                "no_such_mig_profile",
                f"no GPU{kind} in partition {part} offers MIG profile {profile}: {hint}")
        most = max(cap(n) for n in members)
        if count > most:
            return Infeasible(
                "too_many_slices",
                f"Requested node configuration is not available: {count} {profile} slices on one node, but "
                f"the most one node of partition {part} can hold is {most}; ask for at most {most}")
        what = f"{count} {profile} slice{'s' if count > 1 else ''}"
    else:
        def cap(n: Any) -> int:
            return int(any(_largest_mb(g) >= want for g in gpus(n)))
        if not any(cap(n) for n in members):
            top = max((_largest_mb(g) for n in members for g in gpus(n)), default=0)
            return Infeasible(
                "gpu_mem_too_large",
                f"no GPU, slice or share in partition {part} has {format_size_mb(want)} of GPU memory; "
                f"the largest has {format_size_mb(top)}: ask for less with --gpu-mem")
        what = f"a GPU device with {format_size_mb(want)}"
    if cpus > max(n.cpus for n in members) or mem > max(n.mem_mb for n in members) or not any(
            cap(n) >= (count if profile else 1) and n.cpus >= cpus and n.mem_mb >= mem for n in members):
        return Infeasible(
            "no_node_fits",
            f"Requested node configuration is not available: no node in partition {part} has {what}, "
            f"{cpus} CPUs and {format_size_mb(mem)} of memory together; ask for less")
    return None


class Refused(Exception):
    """A request that can never run; the message is for the user."""


def resolve(spec: Any, user: str, cfg: SchedConfig, nodes: Sequence[Any]) -> Resolved:
    """``resolve_job``, then ``refusal``: the submit-time check of the head (and of scrontab
    firing a job), raising Refused with the reason."""
    resolved = resolve_job(spec, user, cfg, nodes)
    why = refusal(spec, resolved, user, cfg, nodes)
    if why is not None:
        raise Refused(why)
    return resolved
