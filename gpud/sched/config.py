"""Scheduling policy as plain frozen data, read from the scheduler sections of gpud.toml.

Theory of operation
-------------------
``sched_config_from_dict`` takes the whole parsed gpud.toml and reads only the sections
that shape scheduling decisions: ``[scheduler]``, ``[preemption]``, ``[billing]``,
``[[partition]]``, ``[qos.*]`` and ``[accounts.*]``.  Every value is checked once, here; the
core then trusts the config and never re-validates.  A bad value raises
``SchedConfigError`` whose message names the key and says what to write instead; its
``key`` attribute is the dotted key so the caller can point at a line of the file.

Missing sections fall back to a config that runs a cluster: one default partition "gpu"
over every node, one QOS "normal", one account "default" that admits everyone.

Memory default: a job that does not ask for memory gets its partition's
``default_mem_per_gpu`` times its GPU count when that is set and the job has GPUs, else
the partition's ``default_mem``, else ``[scheduler] default_mem`` (1 GiB).

Quotas in a hierarchy: an account's ``gpu_quota`` covers its whole subtree, so the quotas
of its children must add up to no more than its own.  See gpud/sched/quota.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..units import UnitError, parse_duration, parse_size_mb

PLACEMENTS = ("binpack", "spread", "shapes")
PREEMPT_MODES = ("requeue", "cancel")
IDLE_ACTIONS = ("none", "requeue", "cancel")   # what the head does to a job flagged GPU-idle
WEIGHT_NAMES = ("age", "fairshare", "job_size", "qos", "partition")
DAY = 86400.0


class SchedConfigError(ValueError):
    """An invalid scheduler setting; ``key`` is the dotted key, the message says the fix."""

    def __init__(self, message: str, key: str = "", path: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.path = path


@dataclass(frozen=True)
class Weights:
    """Multifactor priority weights; each factor is in [0, 1] before weighting."""

    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 500.0
    qos: float = 2000.0
    partition: float = 1000.0


@dataclass(frozen=True)
class PreemptionConfig:
    exempt_time: float = 600.0       # never preempt a job younger than this (seconds)
    max_per_job: int = 3             # a job preempted this often is no longer preemptible
    max_per_minute: int = 30         # cluster-wide cap on preemptions in any 60 s


@dataclass(frozen=True)
class PartitionConfig:
    name: str
    nodes: tuple[str, ...] = ("*",)          # fnmatch globs over node names
    default: bool = False
    default_time: float | None = 3600.0      # seconds; None = unlimited
    max_time: float | None = None            # seconds; None = unlimited
    priority: int = 0
    placement: str | None = None             # None: [scheduler] placement
    default_mem_mb: int | None = None        # per job
    default_mem_per_gpu_mb: int | None = None
    # Idle-GPU detection (gpud/head/telemetry.py): a running job whose every GPU stays under
    # idle_threshold percent for idle_period is flagged, then idle_action is applied.
    idle_threshold: float = 5.0              # percent utilization
    idle_period: float | None = 3600.0       # seconds; None: never flag
    idle_action: str = "none"                # "none" (flag only), "requeue" or "cancel"


@dataclass(frozen=True)
class QosConfig:
    name: str
    priority: int = 0
    preempt: tuple[str, ...] = ()            # QOS names this one may preempt
    preempt_mode: str = "requeue"            # what happens to a job of this QOS when preempted
    grace_time: float = 60.0                 # seconds from the first signal to SIGKILL
    max_gpus_per_user: int | None = None
    max_submit_jobs: int | None = None       # pending and running per user (gpud.head.jobcaps)


@dataclass(frozen=True)
class AccountConfig:
    name: str
    parent: str | None = None
    shares: float = 1.0
    gpu_quota: int | None = None             # guaranteed GPUs for the subtree (lent out while idle)
    gpu_limit: int | None = None             # hard cap for the subtree, borrowed GPUs included
    users: tuple[str, ...] = ()              # "*" admits everyone
    max_submit_jobs: int | None = None       # pending and running per user (gpud.head.jobcaps)


def _default_partitions() -> dict[str, PartitionConfig]:
    return {"gpu": PartitionConfig(name="gpu", default=True)}


def _default_qos() -> dict[str, QosConfig]:
    return {"normal": QosConfig(name="normal")}


def _default_accounts() -> dict[str, AccountConfig]:
    return {"default": AccountConfig(name="default", users=("*",))}


@dataclass(frozen=True)
class SchedConfig:
    default_partition: str = "gpu"
    default_account: str = "default"         # for users no account lists by name
    default_qos: str = "normal"
    interactive_partition: str | None = None  # of salloc / srun-outside-a-job that name none
    interactive_qos: str | None = None
    default_mem_mb: int = 1024
    fairshare_half_life: float | None = 7 * DAY   # None: usage never decays
    max_age: float = 7 * DAY
    weights: Weights = field(default_factory=Weights)
    placement: str = "binpack"
    backfill: bool = True
    backfill_depth: int = 100                # at most this many reservations per pass
    mig_min_interval: float = 600.0          # seconds between re-layouts that destroy slices, per GPU
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    billing: dict[str, float] = field(default_factory=dict)   # GPU model -> weight (default 1)
    prices: dict[str, float] = field(default_factory=dict)    # GPU model -> price per GPU-hour (default 0)
    partitions: dict[str, PartitionConfig] = field(default_factory=_default_partitions)
    qos: dict[str, QosConfig] = field(default_factory=_default_qos)
    accounts: dict[str, AccountConfig] = field(default_factory=_default_accounts)

    def billing_weight(self, model: str) -> float:
        return self.billing.get(model, 1.0)

    def price(self, model: str) -> float:
        """Cost of one GPU-hour of ``model`` for reports (0 when no price is set)."""
        return self.prices.get(model, 0.0)

    def placement_for(self, partition: str) -> str:
        p = self.partitions.get(partition)
        return (p.placement if p is not None and p.placement else None) or self.placement

    def default_account_for(self, user: str) -> str | None:
        """The first account listing ``user`` by name, else the catch-all account, else None."""
        for a in self.accounts.values():
            if user in a.users:
                return a.name
        fallback = self.accounts.get(self.default_account)
        if fallback is not None and "*" in fallback.users:
            return fallback.name
        return None

    def user_in_account(self, user: str, account: str) -> bool:
        a = self.accounts.get(account)
        return a is not None and (user in a.users or "*" in a.users)

    def account_chain(self, account: str) -> tuple[str, ...]:
        """``account`` and its ancestors, nearest first (empty for an unknown account)."""
        out: list[str] = []
        a = self.accounts.get(account)
        while a is not None and a.name not in out:
            out.append(a.name)
            a = self.accounts.get(a.parent) if a.parent else None
        return tuple(out)


# -- parsing ----------------------------------------------------------------------------------

_SECTION_KEYS = {
    "scheduler": {"fairshare_half_life", "max_age", "weights", "placement", "backfill",
                  "backfill_depth", "default_mem", "default_qos", "default_account", "mig_min_interval",
                  "interactive_partition", "interactive_qos"},
    "preemption": {"exempt_time", "max_per_job", "max_per_minute"},
    "billing": {"weights", "prices"},
}
_PARTITION_KEYS = {"name", "nodes", "default", "default_time", "max_time", "priority",
                   "placement", "default_mem", "default_mem_per_gpu", "idle_threshold", "idle_period",
                   "idle_action"}
_QOS_KEYS = {"priority", "preempt", "preempt_mode", "grace_time", "max_gpus_per_user", "max_submit_jobs"}
_ACCOUNT_KEYS = {"parent", "shares", "gpu_quota", "gpu_limit", "users", "max_submit_jobs"}

# Every key these sections accept, for gpud/config.py's unknown-key check and the example
# coverage test.  "*" stands for a name the site chooses ([qos.NAME], [accounts.NAME]);
# "[]" for each [[partition]] table.  billing.weights maps GPU models and is free-form.
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"scheduler", "preemption", "billing", "partition", "qos", "accounts"}),
    "scheduler": frozenset(_SECTION_KEYS["scheduler"]),
    "scheduler.weights": frozenset(WEIGHT_NAMES),
    "preemption": frozenset(_SECTION_KEYS["preemption"]),
    "billing": frozenset(_SECTION_KEYS["billing"]),
    "partition[]": frozenset(_PARTITION_KEYS),
    "qos.*": frozenset(_QOS_KEYS),
    "accounts.*": frozenset(_ACCOUNT_KEYS),
}


class _Reader:
    """Typed getters over one table that raise SchedConfigError naming the dotted key."""

    def __init__(self, table: Any, where: str, allowed: set[str], path: str) -> None:
        self.where, self.path = where, path
        if not isinstance(table, dict):
            self.fail(where, "must be a table")
        unknown = sorted(set(table) - allowed)
        if unknown:
            self.fail(f"{where}.{unknown[0]}",
                      f"unknown setting; valid settings here: {', '.join(sorted(allowed))}")
        self.t = table

    def fail(self, key: str, what: str) -> None:
        raise SchedConfigError(f"{key}: {what}", key=key, path=self.path)

    def key(self, k: str) -> str:
        return f"{self.where}.{k}" if self.where else k

    def duration(self, k: str, default: float | None, *, allow_unlimited: bool = False) -> float | None:
        if k not in self.t:
            return default
        try:
            v = parse_duration(self.t[k], default_unit="s")
        except UnitError as e:
            self.fail(self.key(k), str(e))
        if v is None and not allow_unlimited:
            self.fail(self.key(k), "must be a finite duration such as \"10m\" or \"7d\"")
        return v

    def number(self, k: str, default: float, *, lo: float = 0.0) -> float:
        v = self.t.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
            self.fail(self.key(k), f"must be a number >= {lo:g}, not {v!r}")
        return float(v)

    def integer(self, k: str, default: int | None, *, lo: int = 0) -> int | None:
        v = self.t.get(k, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            self.fail(self.key(k), f"must be a whole number >= {lo}, not {v!r}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        v = self.t.get(k, default)
        if not isinstance(v, bool):
            self.fail(self.key(k), f"must be true or false, not {v!r}")
        return v

    def string(self, k: str, default: str | None, choices: tuple[str, ...] = ()) -> str | None:
        v = self.t.get(k, default)
        if v is None and k not in self.t:
            return None
        if not isinstance(v, str) or not v:   # an explicit null too (configs given as data)
            self.fail(self.key(k), f"must be a non-empty string, not {v!r}")
        if choices and v not in choices:
            self.fail(self.key(k), f"must be one of {', '.join(repr(c) for c in choices)}, not {v!r}")
        return v

    def strings(self, k: str, default: tuple[str, ...]) -> tuple[str, ...]:
        v = self.t.get(k, list(default))
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            self.fail(self.key(k), f"must be a list of names, e.g. [\"a\", \"b\"], not {v!r}")
        return tuple(v)

    def size_mb(self, k: str) -> int | None:
        if k not in self.t:
            return None
        try:
            v = parse_size_mb(self.t[k])
        except UnitError as e:
            self.fail(self.key(k), str(e))
        if v <= 0:
            self.fail(self.key(k), "must be a positive size such as \"16G\"")
        return v


def sched_config_from_dict(data: dict[str, Any], path: str = "<config>") -> SchedConfig:
    """The scheduling policy in a parsed gpud.toml; SchedConfigError for a bad value."""
    if not isinstance(data, dict):
        raise SchedConfigError("the configuration must be a TOML table", path=path)
    top = _Reader(data, "", set(data), path)
    s = _Reader(top.t.get("scheduler", {}), "scheduler", _SECTION_KEYS["scheduler"], path)
    p = _Reader(top.t.get("preemption", {}), "preemption", _SECTION_KEYS["preemption"], path)
    b = _Reader(top.t.get("billing", {}), "billing", _SECTION_KEYS["billing"], path)

    w = _Reader(s.t.get("weights", {}), "scheduler.weights", set(WEIGHT_NAMES), path)
    weights = Weights(**{n: w.number(n, getattr(Weights, n)) for n in WEIGHT_NAMES})
    bw = b.t.get("weights", {})
    if not isinstance(bw, dict):
        b.fail("billing.weights", "must be a table of GPU model = weight")
    bill = _Reader(bw, "billing.weights", set(bw), path)
    billing = {str(m): bill.number(m, 1.0) for m in bw}
    bp = b.t.get("prices", {})
    if not isinstance(bp, dict):
        b.fail("billing.prices", "must be a table of GPU model = price per GPU-hour, e.g. { \"H100-80GB\" = 2.5 }")
    price = _Reader(bp, "billing.prices", set(bp), path)
    prices = {str(m): price.number(m, 0.0) for m in bp}

    preemption = PreemptionConfig(
        exempt_time=p.duration("exempt_time", PreemptionConfig.exempt_time) or 0.0,
        max_per_job=p.integer("max_per_job", PreemptionConfig.max_per_job),
        max_per_minute=p.integer("max_per_minute", PreemptionConfig.max_per_minute),
    )
    partitions = _partitions(top.t.get("partition"), path)
    qos = _qos_table(top.t.get("qos"), path)
    accounts = _accounts(top.t.get("accounts"), path)

    default_qos = s.string("default_qos", None)
    if default_qos is None:
        default_qos = "normal" if "normal" in qos else next(iter(qos))
    elif default_qos not in qos:
        s.fail("scheduler.default_qos", f"no QOS {default_qos!r}; define [qos.{default_qos}] or pick one of "
               f"{', '.join(qos)}")
    default_account = s.string("default_account", None)
    if default_account is None:
        default_account = next((a.name for a in accounts.values() if "*" in a.users), next(iter(accounts)))
    elif default_account not in accounts:
        s.fail("scheduler.default_account", f"no account {default_account!r}; define [accounts.{default_account}]")

    interactive_partition = s.string("interactive_partition", None)
    if interactive_partition is not None and interactive_partition not in partitions:
        s.fail("scheduler.interactive_partition", f"no partition {interactive_partition!r}; pick one of "
               f"{', '.join(partitions)}")
    interactive_qos = s.string("interactive_qos", None)
    if interactive_qos is not None and interactive_qos not in qos:
        s.fail("scheduler.interactive_qos", f"no QOS {interactive_qos!r}; define [qos.{interactive_qos}] or pick "
               f"one of {', '.join(qos)}")
    placement = s.string("placement", "binpack", PLACEMENTS)
    assert placement is not None
    mem = s.size_mb("default_mem")
    return SchedConfig(
        default_partition=next(pc.name for pc in partitions.values() if pc.default),
        default_account=default_account,
        default_qos=default_qos,
        interactive_partition=interactive_partition,
        interactive_qos=interactive_qos,
        default_mem_mb=mem if mem is not None else SchedConfig.default_mem_mb,
        fairshare_half_life=s.duration("fairshare_half_life", 7 * DAY, allow_unlimited=True) or None,
        max_age=_positive(s, "max_age", 7 * DAY),
        weights=weights,
        placement=placement,
        backfill=s.boolean("backfill", True),
        backfill_depth=s.integer("backfill_depth", 100) or 0,
        mig_min_interval=s.duration("mig_min_interval", SchedConfig.mig_min_interval) or 0.0,
        preemption=preemption,
        billing=billing,
        prices=prices,
        partitions=partitions,
        qos=qos,
        accounts=accounts,
    )


def _positive(r: _Reader, k: str, default: float) -> float:
    v = r.duration(k, default)
    if not v or v <= 0:
        r.fail(r.key(k), "must be a positive duration such as \"7d\"")
    return float(v or default)


def _partitions(raw: Any, path: str) -> dict[str, PartitionConfig]:
    if raw is None:
        return _default_partitions()
    if not isinstance(raw, list) or not raw:
        raise SchedConfigError("partition: write each partition as a [[partition]] table with a name",
                               key="partition", path=path)
    out: dict[str, PartitionConfig] = {}
    for i, table in enumerate(raw):
        r = _Reader(table, f"partition[{i}]", _PARTITION_KEYS, path)
        name = r.string("name", None)
        if name is None:
            r.fail(f"partition[{i}].name", "missing; every [[partition]] needs a name")
        assert name is not None
        if name in out:
            r.fail(f"partition[{i}].name", f"partition {name!r} is defined twice; names must be unique")
        r.where = f"partition.{name}"
        pc = PartitionConfig(
            name=name,
            nodes=r.strings("nodes", ("*",)),
            default=r.boolean("default", False),
            default_time=r.duration("default_time", 3600.0, allow_unlimited=True),
            max_time=r.duration("max_time", None, allow_unlimited=True),
            priority=r.integer("priority", 0) or 0,
            placement=r.string("placement", None, PLACEMENTS),
            default_mem_mb=r.size_mb("default_mem"),
            default_mem_per_gpu_mb=r.size_mb("default_mem_per_gpu"),
            idle_threshold=r.number("idle_threshold", PartitionConfig.idle_threshold),
            idle_period=r.duration("idle_period", PartitionConfig.idle_period, allow_unlimited=True) or None,
            idle_action=r.string("idle_action", "none", IDLE_ACTIONS) or "none",
        )
        if pc.idle_threshold > 100:
            r.fail(r.key("idle_threshold"), f"is a percentage of utilization, 0 to 100, not {pc.idle_threshold:g}")
        if pc.max_time is not None and (pc.default_time is None or pc.default_time > pc.max_time):
            r.fail(r.key("default_time"), "must not exceed max_time; lower default_time or raise max_time")
        out[name] = pc
    defaults = [pc.name for pc in out.values() if pc.default]
    if len(defaults) > 1:
        raise SchedConfigError(f"partition.{defaults[1]}.default: only one partition may be the default "
                               f"(also {defaults[0]!r})", key=f"partition.{defaults[1]}.default", path=path)
    if not defaults:  # the first partition is the default, as in Slurm
        first = next(iter(out.values()))
        out[first.name] = replace(first, default=True)
    return out


def _qos_table(raw: Any, path: str) -> dict[str, QosConfig]:
    if raw is None:
        return _default_qos()
    if not isinstance(raw, dict) or not raw:
        raise SchedConfigError("qos: define each QOS as a [qos.NAME] table", key="qos", path=path)
    out: dict[str, QosConfig] = {}
    for name, table in raw.items():
        r = _Reader(table, f"qos.{name}", _QOS_KEYS, path)
        out[name] = QosConfig(
            name=name,
            priority=r.integer("priority", 0) or 0,
            preempt=r.strings("preempt", ()),
            preempt_mode=r.string("preempt_mode", "requeue", PREEMPT_MODES) or "requeue",
            grace_time=r.duration("grace_time", 60.0) or 0.0,
            max_gpus_per_user=r.integer("max_gpus_per_user", None),
            max_submit_jobs=r.integer("max_submit_jobs", None),
        )
    for q in out.values():
        for victim in q.preempt:
            if victim == q.name:
                raise SchedConfigError(f"qos.{q.name}.preempt: a QOS cannot preempt itself; remove {victim!r}",
                                       key=f"qos.{q.name}.preempt", path=path)
            if victim not in out:
                raise SchedConfigError(f"qos.{q.name}.preempt: no QOS {victim!r}; define [qos.{victim}] "
                                       f"or remove it", key=f"qos.{q.name}.preempt", path=path)
    return out


def _accounts(raw: Any, path: str) -> dict[str, AccountConfig]:
    if raw is None:
        return _default_accounts()
    if not isinstance(raw, dict) or not raw:
        raise SchedConfigError("accounts: define each account as an [accounts.NAME] table",
                               key="accounts", path=path)
    out: dict[str, AccountConfig] = {}
    for name, table in raw.items():
        r = _Reader(table, f"accounts.{name}", _ACCOUNT_KEYS, path)
        a = AccountConfig(
            name=name,
            parent=r.string("parent", None),
            shares=r.number("shares", 1.0),
            gpu_quota=r.integer("gpu_quota", None),
            gpu_limit=r.integer("gpu_limit", None),
            users=r.strings("users", ()),
            max_submit_jobs=r.integer("max_submit_jobs", None),
        )
        if a.gpu_quota is not None and a.gpu_limit is not None and a.gpu_quota > a.gpu_limit:
            r.fail(r.key("gpu_quota"), f"{a.gpu_quota} exceeds gpu_limit {a.gpu_limit}; lower the quota "
                   "or raise the limit")
        out[name] = a
    for a in out.values():
        key = f"accounts.{a.name}.parent"
        if a.parent is not None and a.parent not in out:
            raise SchedConfigError(f"{key}: no account {a.parent!r}; define [accounts.{a.parent}]",
                                   key=key, path=path)
        seen = {a.name}
        up = out.get(a.parent) if a.parent else None
        while up is not None:
            if up.name in seen:
                raise SchedConfigError(f"{key}: accounts form a cycle through {up.name!r}; "
                                       "parents must form a tree", key=key, path=path)
            seen.add(up.name)
            up = out.get(up.parent) if up.parent else None
    for a in out.values():
        if a.gpu_quota is None:
            continue
        carved = sum(c.gpu_quota or 0 for c in out.values() if _quota_parent(out, c) == a.name)
        if carved > a.gpu_quota:
            key = f"accounts.{a.name}.gpu_quota"
            raise SchedConfigError(f"{key}: the quotas of accounts below it add up to {carved}, more than "
                                   f"its own {a.gpu_quota}; a child's quota counts inside its parent's",
                                   key=key, path=path)
    return out


def _quota_parent(accounts: dict[str, AccountConfig], a: AccountConfig) -> str | None:
    """The nearest strict ancestor of ``a`` that sets a gpu_quota, if ``a`` sets one itself."""
    if a.gpu_quota is None:
        return None
    up = accounts.get(a.parent) if a.parent else None
    while up is not None and up.gpu_quota is None:
        up = accounts.get(up.parent) if up.parent else None
    return up.name if up is not None else None
