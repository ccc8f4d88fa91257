"""Multifactor job priority and Fair Tree fair-share.

Theory of operation
-------------------
A pending job's priority is Slurm's multifactor sum, every factor in [0, 1]::

    priority = w_age * age + w_fairshare * fairshare + w_job_size * job_size
             + w_qos * qos + w_partition * partition - nice

* age: time since submission over ``max_age``, saturating at 1;
* job_size: the job's GPUs over the most GPUs any node of its partition has (a job runs on
  one node, so 1.0 is the largest job the partition can hold);
* qos, partition: their configured priority over the highest configured one (0 when none
  is positive);
* fairshare: Fair Tree, below.

Fair Tree (after Slurm's algorithm of that name).  Accounts form a tree (``parent``), users
hang under the accounts they submit to.  Among siblings each node gets a *level fair-share*
``S / U``: its shares over the siblings' total shares, divided by its decayed usage over the
siblings' total usage (infinite when it has used nothing).  Ranking every user by the
sequence of level fair-shares on the path from the root (higher first, compared level by
level) is a depth-first walk that visits siblings best first: every user of a better-served
account ranks below every user of a worse-served one, whatever their own usage.  With N
users, the best gets factor 1, the next (N-1)/N, ... the last 1/N; users with identical
paths tie and share the higher rank.  Two saturating accounts therefore alternate at the
top until their usage ratio matches their shares ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import compress, count, islice
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .config import SchedConfig

UsageKey = tuple[str, str]
INF = math.inf


@dataclass(frozen=True)
class ShareRow:
    """One line of ``gpuctl sshare``: an account (user None) or a user under an account."""

    account: str
    user: str | None
    depth: int                  # 0 for top-level accounts
    shares: float               # as configured (users: 1)
    norm_shares: float          # fraction of the whole cluster's shares (product down the tree)
    raw_usage: float            # decayed, billed GPU-seconds of the subtree
    effective_usage: float      # raw_usage over the whole cluster's usage
    level_fs: float             # S / U among its siblings (inf: no usage yet)
    fairshare: float | None     # the factor in [0, 1]; users only


@dataclass
class _Node:
    name: str
    shares: float
    user: str | None = None
    usage: float = 0.0
    children: list["_Node"] | None = None


def _level_fs(shares: float, total_shares: float, usage: float, total_usage: float) -> float:
    if shares <= 0 or total_shares <= 0:
        return 0.0
    if usage <= 0 or total_usage <= 0:
        return INF
    return (shares / total_shares) / (usage / total_usage)


def _build_tree(cfg: SchedConfig, usage: Mapping[UsageKey, float],
                members: Iterable[UsageKey]) -> list[_Node]:
    accounts = {name: _Node(name, a.shares, children=[]) for name, a in cfg.accounts.items()}
    pairs = set(usage) | set(members)
    for a in cfg.accounts.values():
        pairs.update((a.name, u) for u in a.users if u != "*")
    for acct, _user in pairs:  # an account the config no longer knows still shows its usage
        if acct not in accounts:
            accounts[acct] = _Node(acct, 1.0, children=[])
    roots: list[_Node] = []
    for name, node in accounts.items():
        parent = cfg.accounts[name].parent if name in cfg.accounts else None
        (accounts[parent].children if parent else roots).append(node)  # type: ignore[union-attr]
    for acct, user in sorted(pairs):
        leaf = _Node(acct, 1.0, user=user, usage=max(0.0, usage.get((acct, user), 0.0)))
        accounts[acct].children.append(leaf)  # type: ignore[union-attr]
    for r in roots:
        _total(r)
    return roots


# The tree walks are module functions, not closures: a nested function that calls itself
# is a reference cycle (function -> cell -> function), garbage left for the cyclic
# collector on every pass, with whatever the closure holds.

def _total(n: _Node) -> float:
    """``n``'s usage, an account's set to the sum of its subtree's."""
    if n.children is not None:
        n.usage = sum(_total(c) for c in n.children)
    return n.usage


def fairshare_table(cfg: SchedConfig, usage: Mapping[UsageKey, float],
                    members: Iterable[UsageKey] = ()) -> list[ShareRow]:
    """Rows for ``gpuctl sshare``, depth first; ``members`` adds (account, user) pairs with jobs."""
    roots = _build_tree(cfg, usage, members)
    cluster_usage = sum(r.usage for r in roots)
    rows: list[ShareRow] = []
    paths: list[tuple[float, ...]] = []     # each user's path of -level_fs, in walk order
    leaf_rows: list[int] = []               # ... and its row
    _share_rows(roots, 0, 1.0, (), None, cluster_usage, rows, paths, leaf_rows)
    for i, factor in zip(leaf_rows, _ranked(paths)):
        r = rows[i]
        rows[i] = ShareRow(r.account, r.user, r.depth, r.shares, r.norm_shares, r.raw_usage,
                           r.effective_usage, r.level_fs, factor)
    return rows


def fairshare_factors(cfg: SchedConfig, usage: Mapping[UsageKey, float],
                      members: Iterable[UsageKey] = ()) -> dict[UsageKey, float]:
    """(account, user) -> Fair Tree factor in (0, 1]: ``fairshare_table``'s users' column,
    from the same walk without building its rows (every pass needs this)."""
    roots = _build_tree(cfg, usage, members)
    paths: list[tuple[float, ...]] = []     # each user's path of -level_fs, in walk order
    keys: list[UsageKey] = []
    _user_paths(roots, (), None, paths, keys)
    return dict(zip(keys, _ranked(paths)))


def _share_rows(siblings: list[_Node], depth: int, parent_norm: float, path: tuple[float, ...],
                account: str | None, cluster_usage: float, rows: list[ShareRow],
                paths: list[tuple[float, ...]], leaf_rows: list[int]) -> None:
    """``fairshare_table``'s rows of ``siblings`` and their subtrees, depth first; each user's
    path of -level_fs to ``paths`` and its row's index to ``leaf_rows``."""
    s_tot = sum(n.shares for n in siblings)
    u_tot = sum(n.usage for n in siblings)
    for n in siblings:
        lfs = _level_fs(n.shares, s_tot, n.usage, u_tot)
        norm = parent_norm * (n.shares / s_tot if s_tot > 0 else 0.0)
        eff = n.usage / cluster_usage if cluster_usage > 0 else 0.0
        here = path + (-lfs,)
        if n.user is not None:
            paths.append(here)
            leaf_rows.append(len(rows))
            rows.append(ShareRow(account or n.name, n.user, depth, n.shares, norm, n.usage, eff, lfs, None))
        else:
            rows.append(ShareRow(n.name, None, depth, n.shares, norm, n.usage, eff, lfs, None))
            _share_rows(n.children or [], depth + 1, norm, here, n.name, cluster_usage, rows, paths, leaf_rows)


def _user_paths(siblings: list[_Node], path: tuple[float, ...], account: str | None,
                paths: list[tuple[float, ...]], keys: list[UsageKey]) -> None:
    """Each user's path of -level_fs under ``siblings`` to ``paths``, its key to ``keys``, in
    ``_share_rows``'s order."""
    s_tot = sum(n.shares for n in siblings)
    u_tot = sum(n.usage for n in siblings)
    for n in siblings:
        here = path + (-_level_fs(n.shares, s_tot, n.usage, u_tot),)
        if n.user is not None:
            paths.append(here)
            keys.append((account or n.name, n.user))
        else:
            _user_paths(n.children or [], here, n.name, paths, keys)


def _ranked(paths: list[tuple[float, ...]]) -> list[float]:
    """Each user's Fair Tree factor, in walk order, from its path of -level_fs: users ranked
    by path (walk order among equals), equal paths sharing the first one's rank, over N."""
    count = len(paths)
    factors = [0.0] * count
    rank_of_path: dict[tuple[float, ...], int] = {}
    for pos, k in enumerate(sorted(range(count), key=paths.__getitem__)):
        factors[k] = rank_of_path.setdefault(paths[k], count - pos) / count
    return factors


class PriorityModel:
    """Weighted multifactor priority for one pass (fair-share computed once)."""

    def __init__(self, cfg: SchedConfig, usage: Mapping[UsageKey, float], members: Iterable[UsageKey],
                 max_gpus: Mapping[str, int], now: float) -> None:
        self.cfg, self.now = cfg, now
        self.w = cfg.weights
        self.fs = fairshare_factors(cfg, usage, members)
        self.max_gpus = max_gpus
        self._fixed: dict[tuple, tuple[float, float, float, float, float]] = {}   # ..., their sum
        top_q = max((q.priority for q in cfg.qos.values()), default=0)
        top_p = max((p.priority for p in cfg.partitions.values()), default=0)
        self.qos_factor = {n: (max(0, q.priority) / top_q if top_q > 0 else 0.0) for n, q in cfg.qos.items()}
        self.part_factor = {n: (max(0, p.priority) / top_p if top_p > 0 else 0.0)
                            for n, p in cfg.partitions.items()}

    def factors(self, account: str, user: str, qos: str, partition: str, gpus: int,
                submit_time: float, nice: int) -> dict[str, float]:
        """Weighted factors; their sum is the priority."""
        fixed = self._fixed.get((account, user, qos, partition, gpus))
        if fixed is None:
            fixed = self._fixed_for(account, user, qos, partition, gpus)
        age = (self.now - submit_time) / self.cfg.max_age
        age = 1.0 if age > 1.0 else (0.0 if age < 0.0 else age)
        return {"age": self.w.age * age, "fairshare": fixed[0], "job_size": fixed[1], "qos": fixed[2],
                "partition": fixed[3], "nice": float(-nice)}

    def _fixed_for(self, account: str, user: str, qos: str, partition: str, gpus: int) -> tuple:
        """The weighted factors that do not change with time, and their sum (kept for the pass)."""
        w = self.w
        biggest = self.max_gpus.get(partition, 0)
        size = min(1.0, gpus / biggest) if biggest > 0 else 0.0
        parts = (w.fairshare * self.fs.get((account, user), 0.0), w.job_size * size,
                 w.qos * self.qos_factor.get(qos, 0.0), w.partition * self.part_factor.get(partition, 0.0))
        fixed = self._fixed[(account, user, qos, partition, gpus)] = (*parts, sum(parts))
        return fixed

    def for_jobs(self, jobs: Iterable) -> tuple["Factors", dict[int, float], list]:
        """(job -> weighted factors, job -> priority, the jobs in queue order) for pending jobs.

        Queue order: priority, then submit time, then job id.  This is the hot loop of a pass:
        only the priority is computed per job here; the factors, which only ``sprio`` reads,
        are built when asked for (``Factors``), by the same arithmetic.
        """
        listed = jobs if isinstance(jobs, (list, tuple)) else list(jobs)
        ids: list[int] = []
        neg: list[float] = []          # -priority, by position in ``listed``
        fixed_of, fixed_for, now, max_age, w_age = self._fixed, self._fixed_for, self.now, self.cfg.max_age, self.w.age
        add_id, add_neg = ids.append, neg.append
        for j in listed:
            fixed = fixed_of.get((j.account, j.user, j.qos, j.partition, j.gpus))
            if fixed is None:
                fixed = fixed_for(j.account, j.user, j.qos, j.partition, j.gpus)
            age = (now - j.submit_time) / max_age
            # age + the fixed factors' sum + float(-nice), as the factors add up (a - b == a + -b)
            add_neg(-(w_age * (1.0 if age > 1.0 else (0.0 if age < 0.0 else age)) + fixed[4] - j.nice))
            add_id(j.job_id)
        priorities = dict(zip(ids, map(float.__neg__, neg)))
        return Factors(self, dict(zip(ids, listed))), priorities, _queue_order(listed, neg)

    def priority(self, account: str, user: str, qos: str, partition: str, gpus: int,
                 submit_time: float, nice: int) -> float:
        fixed = self._fixed.get((account, user, qos, partition, gpus))
        age = (self.now - submit_time) / self.cfg.max_age
        if fixed is None:
            fixed = self._fixed_for(account, user, qos, partition, gpus)
        # One formula whether or not the fixed factors were cached: two (a sum in factor
        # order the first time) gave jobs of the same key priorities an ulp apart, so which
        # job came first in the snapshot could change a plan.
        return self.w.age * (1.0 if age > 1.0 else (0.0 if age < 0.0 else age)) + fixed[4] - nice

    def of_running(self, r: Any) -> float:
        """``priority`` of a running job (a preemption victim), from its submit time (its start
        time when unknown); asked for every candidate victim of a pass, hence inlined."""
        submit = r.submit_time if r.submit_time is not None else r.start_time
        gpus = r.gpus if r.parts else len(r.gpu_indices)
        fixed = self._fixed.get((r.account, r.user, r.qos, r.partition, gpus))
        if fixed is None:
            return self.priority(r.account, r.user, r.qos, r.partition, gpus, submit, r.nice)
        age = (self.now - submit) / self.cfg.max_age
        return self.w.age * (1.0 if age > 1.0 else (0.0 if age < 0.0 else age)) + fixed[4] - r.nice


def _queue_order(jobs: Sequence, neg: list[float]) -> list:
    """``jobs`` sorted by (-priority, submit time, job id), ``neg[k]`` being job k's -priority (a float).

    One sort on a plain float key (much cheaper than sorting tuples), then each run of equal
    priorities (an array's tasks, say) sorted by submit time and job id."""
    order = sorted(range(len(jobs)), key=neg.__getitem__)
    if len(set(neg)) < len(neg):       # some priorities tie: find the runs
        keys = list(map(neg.__getitem__, order))
        ties = list(compress(count(), map(float.__eq__, keys, islice(keys, 1, None))))   # keys[k] == keys[k + 1]
        t = 0
        while t < len(ties):
            first = ties[t]
            while t + 1 < len(ties) and ties[t + 1] == ties[t] + 1:
                t += 1
            last = ties[t] + 1
            order[first:last + 1] = sorted(order[first:last + 1], key=lambda k: (jobs[k].submit_time, jobs[k].job_id))
            t += 1
    return list(map(jobs.__getitem__, order))


class Factors(Mapping):
    """Pending job -> its weighted priority factors (``gpuctl sprio``), each built when read
    by the pass's model with the arithmetic that gave the job its priority."""

    def __init__(self, model: PriorityModel, jobs: dict[int, Any]) -> None:
        self._model, self._jobs = model, jobs

    def __getitem__(self, job_id: int) -> dict[str, float]:
        j = self._jobs[job_id]
        return self._model.factors(j.account, j.user, j.qos, j.partition, j.gpus, j.submit_time, j.nice)

    def __iter__(self) -> Iterator[int]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs
