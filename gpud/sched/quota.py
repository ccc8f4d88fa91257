"""GPU quotas (guaranteed, lent while idle), hard limits, and per-user QOS limits.

Theory of operation
-------------------
Quotas are turned on by giving any account a ``gpu_quota``; with none, nothing here
borrows or reclaims.

*Pools.*  Each account with a ``gpu_quota`` owns a pool of guaranteed GPUs.  A child's
quota counts inside its parent's: the parent's pool holds what is left of its quota after
the quotas of its nearest descendants that set their own (config loading checks that
this is not negative).  An account without a quota draws on the pool of its nearest
ancestor that has one; an account with no such ancestor has no guarantee (pool ``None``,
size 0).  Pools never overlap, so the guarantees add up.

*Borrowing.*  A job starts within quota when its pool, counting the job, stays within the
pool's size; otherwise it starts ``borrowed``: it runs on GPUs lent by someone else.  A
pool's use counts its running jobs that are not already stopping, jobs started in this pass,
and jobs waiting in this pass for victims to exit.

*Reclaim.*  A pending job within quota that cannot start may preempt borrowed jobs of
other pools, whatever their priority; a slice or share job, the fewest borrowed slice or
share jobs on one GPU whose exit leaves it room (core.reclaim_fraction).  A borrowed job is reclaimable while its pool uses
more than its size by at least that job's GPUs, so reclaim never cuts into anyone's own
guarantee.

*Limits.*  ``gpu_limit`` caps the GPUs held by an account's whole subtree, borrowed or not,
stopping jobs included (they still hold their GPUs); it is never exceeded.  Every count is
of a job's total GPUs: a gang of 4 nodes x 8 GPUs counts 32, and a job on MIG slices or
MPS or time-slice shares counts its fraction of their GPUs, as billing does
(``gpustate.device_fraction``: a ``3g.40gb`` of an A100 3/7, a 20 GiB share of an 80 GiB
GPU 1/4), so fractions cannot escape a limit.  A QOS's ``max_gpus_per_user`` caps one
user's GPUs under that QOS.  Counts are floats; a comparison allows for rounding
(``EPS``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from .config import SchedConfig
from .snapshot import RunningJob

Pool = str | None
EPS = 1e-9


def whole_gpus(r: RunningJob) -> float:
    return float(r.gpus if r.parts else len(r.gpu_indices))


class QuotaBook:
    def __init__(self, cfg: SchedConfig, running: Iterable[RunningJob],
                 share_of: Callable[[RunningJob], float] = whole_gpus) -> None:
        """``share_of``: the GPUs a running job counts (its fraction for slices and shares)."""
        self.cfg = cfg
        self.enabled = any(a.gpu_quota for a in cfg.accounts.values())
        self.pool_of: dict[str, Pool] = {}
        for name in cfg.accounts:
            self.pool_of[name] = next((a for a in cfg.account_chain(name)
                                       if cfg.accounts[a].gpu_quota is not None), None)
        self.size: dict[Pool, int] = {None: 0}
        for name, a in cfg.accounts.items():
            if a.gpu_quota is not None:
                carved = sum(cfg.accounts[c].gpu_quota or 0 for c in cfg.accounts
                             if c != name and cfg.accounts[c].gpu_quota is not None
                             and self._parent_pool(c) == name)
                self.size[name] = max(0, a.gpu_quota - carved)
        self.limits: dict[str, tuple[tuple[str, int], ...]] = {
            name: tuple((a, cfg.accounts[a].gpu_limit) for a in cfg.account_chain(name)  # type: ignore[misc]
                        if cfg.accounts[a].gpu_limit is not None)
            for name in cfg.accounts}
        self._chains: dict[str, tuple[str, ...]] = {}
        self.qos_caps = {n: q.max_gpus_per_user for n, q in cfg.qos.items() if q.max_gpus_per_user is not None}
        # False when no QOS cap and no account limit is configured: limit_reason is then None
        self.any_limits = bool(self.qos_caps) or any(self.limits.values())
        self.used: dict[Pool, float] = defaultdict(float)          # pool -> GPUs in use (not stopping)
        self.held: dict[str, float] = defaultdict(float)           # account subtree -> GPUs held
        self.per_user: dict[tuple[str, str], float] = defaultdict(float)   # (qos, user) -> GPUs held
        # With no quota and no limit nothing ever reads the counters: they are not kept
        self.counting = self.enabled or self.any_limits
        for r in running if self.counting else ():
            g = r.gpus if r.parts else (share_of(r) if r.devices else len(r.gpu_indices))   # a gang: all its nodes
            if not r.stopping:
                self.used[self.pool(r.account)] += g
            self._hold(r.account, r.qos, r.user, g)

    def _parent_pool(self, account: str) -> Pool:
        parent = self.cfg.accounts[account].parent
        return self.pool_of.get(parent) if parent else None

    def _hold(self, account: str, qos: str, user: str, gpus: float) -> None:
        chain = self._chains.get(account)
        if chain is None:
            chain = self._chains[account] = self.cfg.account_chain(account)
        for a in chain:
            self.held[a] += gpus
        self.per_user[(qos, user)] += gpus

    def pool(self, account: str) -> Pool:
        return self.pool_of.get(account)

    # -- questions -------------------------------------------------------------------------------

    def within(self, account: str, gpus: float) -> bool:
        """Whether a job of ``gpus`` GPUs would start within its account's guarantee."""
        if not self.enabled or gpus == 0:
            return True
        p = self.pool(account)
        return p is not None and self.used[p] + gpus <= self.size[p] + EPS

    def limit_ok(self, account: str, gpus: float) -> bool:
        return all(self.held[a] + gpus <= lim + EPS for a, lim in self.limits.get(account, ()))

    def limit_reason(self, qos: str, user: str, account: str, gpus: float) -> str | None:
        """The limit a job of ``gpus`` GPUs would break: Slurm's reason name, else None."""
        cap = self.qos_caps.get(qos)
        if cap is not None and self.per_user[(qos, user)] + gpus > cap + EPS:
            return "QOSMaxGRESPerUser"
        limits = self.limits.get(account)
        if limits and not all(self.held[a] + gpus <= lim + EPS for a, lim in limits):
            return "AccountLimit"
        return None

    def qos_ok(self, qos: str, user: str, gpus: float) -> bool:
        q = self.cfg.qos.get(qos)
        cap = q.max_gpus_per_user if q is not None else None
        return cap is None or self.per_user[(qos, user)] + gpus <= cap + EPS

    def excess(self, pool: Pool) -> float:
        return self.used[pool] - self.size.get(pool, 0)

    def reclaimable(self, victim: RunningJob, for_pool: Pool) -> bool:
        p = self.pool(victim.account)
        return (self.enabled and victim.borrowed and not victim.stopping and p != for_pool
                and self.excess(p) + EPS >= victim.gpus)

    def any_reclaimable(self, for_pool: Pool) -> bool:
        return self.enabled and any(self.excess(p) > 0 for p in list(self.used) if p != for_pool)

    # -- bookkeeping as the pass decides -----------------------------------------------------------

    def on_start(self, account: str, qos: str, user: str, gpus: float) -> None:
        if not self.counting:
            return
        self.used[self.pool(account)] += gpus
        self._hold(account, qos, user, gpus)

    def on_claim(self, account: str, gpus: int) -> None:
        """A job waits for victims to exit; the GPUs it will get count for its pool now."""
        self.used[self.pool(account)] += gpus

    def on_victim(self, victim: RunningJob, gpus: float | None = None) -> None:
        """A victim stops: its GPUs (``gpus``: its fraction, for slices and shares) leave its pool."""
        self.used[self.pool(victim.account)] -= victim.gpus if gpus is None else gpus
