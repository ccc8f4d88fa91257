"""What a simulation measured, and how it is shown.

The engine feeds a ``Tally`` as things happen (time passing, jobs arriving, starting and
ending); ``Tally.report`` turns it into one plain dict, the ``--json`` output, and
``format_text`` renders that dict for people (``gpud.sim.compare`` puts several side by
side).  Definitions:

* ``gpu_allocation``: of the GPU-time that passed while at least one job was waiting, the
  fraction that was allocated.  1.0 means no GPU sat idle while someone waited; ``None``
  when no job ever waited.
* ``utilization``: allocated GPU-time over all GPU-time from the first arrival to the end.
* GPU-seconds are unweighted (no billing weights) and counted up to the end of the
  simulation (``--until`` cuts running jobs there).  A job holding a share of a GPU counts
  its share; ``gpu_seconds_allocated`` counts what it held (a whole GPU for a fraction on
  a GPU that is not shared, the slice or share otherwise).  Runs cut short by a
  preemption count too: the GPUs were busy.
* A job's wait is from submission to its first start; requeues after a preemption do not
  reset it.  Waits of jobs that never started are not in the statistics (see
  ``jobs.pending``).  Completion time (``jct_s``) is from submission to the end, for jobs
  that ended; bounded slowdown is completion time over the last run's length, that length
  taken as at least ``SLOWDOWN_BOUND`` seconds, and never below 1.
* ``preempted_gpu_hours``: GPU-time of runs a preemption cut short.  A requeued job starts
  over, so all of it is lost work.
* ``fragmentation``: GPU-time left idle while some job waited for ``Resources`` (as the
  last scheduler pass said); ``scattered_gpu_hours`` is the part of it during which that
  job's GPU count was free in total, but not on one node.  ``index``, ``free_gpus`` and
  ``stranded_gpus`` are gpud.sched.fragmentation's measures for ``size``-GPU requests
  (8, or the most whole GPUs a node has when that is fewer), averaged over the time jobs
  waited: free whole GPUs, those no such request could use, and their ratio (0 while
  nothing is free).
* Per account: ``configured_share`` is its share of the configured ``shares`` among the
  accounts that submitted jobs (product down the account tree).  Its demand is the
  GPU-time it wanted: GPUs held plus GPUs its waiting jobs asked for, over time.  Its
  ``fair_share`` is what it would get of the GPU-time used if each account got its
  configured share, capped at its demand, with what a capped account leaves split among
  the others in the same proportions (weighted max-min).  ``fairness.periods`` gives, for
  each ``--period`` (a week by default), every account's share of the GPU-time and Jain's
  index of ``share / fair share`` in that period (1.0: exactly fair; 1/n: one account got
  everything); ``fairness.jain`` is the mean of the periods' indexes weighted by GPU-time.
* ``jobs.multi_node``: jobs bigger than the largest node, run on several nodes at once;
  ``jobs.rounded_up``: those whose GPU count was rounded up to a multiple of their nodes.
  ``by_size`` buckets a job by the GPUs it ran with.
* Per QOS (``qos``, the streams of ``--background``): jobs submitted, started and
  pending at the end, waits, GPU-hours used and the mean GPUs held, the GPU allocation
  (all QOS together) while a job of this QOS waited, and the preemptions its jobs
  suffered with the GPU-hours they cost.
* ``makespan_s``: from the first submission to the last job's end; ``None`` when jobs were
  still pending or running when the simulation stopped.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..sched.config import SchedConfig
from ..units import format_duration

__all__ = ["Tally", "AccountTally", "QosTally", "format_text", "percentile", "size_bucket", "SIZE_BUCKETS",
           "SLOWDOWN_BOUND", "fair_shares", "jain", "configured_shares"]

SLOWDOWN_BOUND = 10.0           # seconds: the usual bound, so tiny jobs do not dominate
# (label, most GPUs); shares of one GPU are "<1"
SIZE_BUCKETS = (("<1", 0), ("1", 1), ("2-4", 4), ("5-8", 8), ("9-16", 16), ("17-32", 32),
                ("33+", None))


def size_bucket(gpus: int, share: float) -> str:
    if share < 1:
        return "<1"
    for label, most in SIZE_BUCKETS[1:]:
        if most is None or gpus <= most:
            return label
    return SIZE_BUCKETS[-1][0]


@dataclass
class AccountTally:
    submitted: int = 0
    started: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0          # share-weighted
    gpu_seconds_allocated: float = 0.0
    demand: float = 0.0               # share-weighted GPU-seconds of the jobs it submitted
    waits: list[float] = field(default_factory=list)
    rate: float = 0.0                 # GPUs (share-weighted) running now
    rate_allocated: float = 0.0       # GPUs held now (a slice or share: its fraction)
    queued: float = 0.0               # GPUs (share-weighted) its waiting jobs ask for
    wanted: float = 0.0               # GPU-seconds held or asked for
    since: float | None = None        # the sums above run up to this time (settled lazily)


@dataclass
class QosTally:
    submitted: int = 0
    waits: list[float] = field(default_factory=list)
    pending: int = 0                  # jobs of this QOS waiting now
    rate: float = 0.0                 # GPUs (share-weighted) running now
    gpu_seconds: float = 0.0
    waiting_alloc_seconds: float = 0.0   # allocated GPU-seconds (all QOS) while one waited
    waiting_total_seconds: float = 0.0
    preempted: int = 0
    preempted_gpu_seconds: float = 0.0


@dataclass
class Tally:
    total_gpus: int
    period: float = 7 * 86400.0
    series_step: float | None = None  # sample the state every this many seconds
    accounts: dict[str, AccountTally] = field(default_factory=dict)
    qos: dict[str, QosTally] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    size_waits: dict[str, list[float]] = field(default_factory=dict)
    size_slowdowns: dict[str, list[float]] = field(default_factory=dict)
    completion_times: list[float] = field(default_factory=list)
    slowdowns: list[float] = field(default_factory=list)
    ends: Counter = field(default_factory=Counter)     # final state -> jobs
    submitted: int = 0
    restarts: int = 0
    preemptions: int = 0
    preempted_gpu_seconds: float = 0.0
    infeasible: Counter = field(default_factory=Counter)
    multi_node: int = 0               # jobs bigger than a node, run as gangs of nodes
    rounded_up: int = 0               # ... whose GPU count was rounded up to N nodes x G
    first_submit: float | None = None
    last_end: float | None = None
    alloc_seconds: float = 0.0        # allocated GPU-seconds (whole GPUs)
    waiting_alloc_seconds: float = 0.0
    waiting_total_seconds: float = 0.0
    idle_for_resources: float = 0.0   # idle GPU-seconds while a job waited for Resources
    idle_scattered: float = 0.0       # ... while its GPU count was free, though not on one node
    frag_size: int = 8                # the request size fragmentation is measured against
    frag_waiting_s: float = 0.0       # seconds with jobs waiting
    frag_index_s: float = 0.0         # integrals over those seconds: fragmentation index,
    frag_free_s: float = 0.0          # free whole GPUs,
    frag_stranded_s: float = 0.0      # and free GPUs no ``frag_size`` request could use
    passes: int = 0
    accounts_added: list[str] = field(default_factory=list)   # trace accounts not configured
    periods: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # [used, wanted]
    series: dict[str, Any] = field(default_factory=dict)
    _next_sample: float | None = None
    now: float = 0.0                  # how far ``advance`` has run

    def account(self, name: str) -> AccountTally:
        """The account's tally, its sums settled up to now (its rates are about to change)."""
        acct = self.accounts.get(name)
        if acct is None:
            acct = self.accounts[name] = AccountTally(since=self.now)
        elif acct.since != self.now:
            self._settle(name, acct, self.now)
        return acct

    def _settle(self, name: str, a: AccountTally, t: float) -> None:
        """Add what the account used and wanted from ``a.since`` to ``t`` at its current rates:
        an account's sums change only when its rates do, so time passing costs nothing."""
        t0 = a.since if a.since is not None else t
        if t > t0 and (a.rate_allocated or a.queued):
            dt = t - t0
            a.gpu_seconds += a.rate * dt
            a.gpu_seconds_allocated += a.rate_allocated * dt
            a.wanted += (a.rate + a.queued) * dt
            self._into_periods(t0, t, name, a)
        a.since = t

    # -- time passing ------------------------------------------------------------------

    def advance(self, t0: float, t1: float, allocated: float, pending: int,
                resources_need: int | None, free: int = 0, stranded: int = 0) -> None:
        """Time ran from ``t0`` to ``t1`` with ``allocated`` GPUs busy and ``pending`` jobs
        waiting; ``resources_need``: the fewest GPUs a job waiting for Resources wants;
        ``free`` whole GPUs were free, ``stranded`` of them unusable by a ``frag_size`` request
        (gpud.sched.fragmentation's terms)."""
        dt = t1 - t0
        if dt <= 0:
            return
        busy = allocated * dt
        self.alloc_seconds += busy
        for q in self.qos.values():       # a handful of QOS: cheaper than settling lazily
            if q.rate:
                q.gpu_seconds += q.rate * dt
            if q.pending:
                q.waiting_alloc_seconds += busy
                q.waiting_total_seconds += self.total_gpus * dt
        if pending:
            self.waiting_alloc_seconds += busy
            self.waiting_total_seconds += self.total_gpus * dt
            self.frag_waiting_s += dt
            if free:
                self.frag_index_s += stranded / free * dt
                self.frag_free_s += free * dt
                self.frag_stranded_s += stranded * dt
            if resources_need is not None:
                idle = (self.total_gpus - allocated) * dt
                self.idle_for_resources += idle
                if resources_need <= self.total_gpus - allocated:
                    self.idle_scattered += idle
        self.now = t1
        if self.series_step:
            self._sample(t1, allocated, pending)

    def _into_periods(self, t0: float, t1: float, name: str, a: AccountTally) -> None:
        p = self.period
        while t0 < t1:
            k = int(t0 // p)
            end = min(t1, (k + 1) * p)
            bucket = self.periods.setdefault(k, {})
            cell = bucket.get(name)
            if cell is None:
                cell = bucket[name] = [0.0, 0.0]
            cell[0] += a.rate * (end - t0)
            cell[1] += (a.rate + a.queued) * (end - t0)
            t0 = end

    def _sample(self, t1: float, allocated: int, pending: int) -> None:
        step = self.series_step
        assert step
        if self._next_sample is None:
            self._next_sample = (self.first_submit or 0.0)
            self.series = {"t": [], "allocated": [], "pending": [], "accounts": {}}
        s = self.series
        while self._next_sample <= t1:
            k = len(s["t"])
            s["t"].append(self._next_sample)
            s["allocated"].append(allocated)
            s["pending"].append(pending)
            for name, a in self.accounts.items():
                col = s["accounts"].get(name)
                if col is None:
                    col = s["accounts"][name] = [0.0] * k
                col.append(a.rate)
            self._next_sample += step

    # -- jobs --------------------------------------------------------------------------

    def qos_tally(self, name: str) -> QosTally:
        q = self.qos.get(name)
        if q is None:
            q = self.qos[name] = QosTally()
        return q

    def queue(self, account: str, share: float, qos: str | None = None) -> None:
        """A job of ``share`` GPUs joined (positive) or left (negative) the queue."""
        if qos is not None:
            self.qos_tally(qos).pending += 1 if share > 0 else -1
        acct = self.account(account)
        acct.queued += share
        if abs(acct.queued) < 1e-9:
            acct.queued = 0.0

    def submit(self, account: str, t: float, demand: float, qos: str | None = None) -> None:
        self.submitted += 1
        if qos is not None:
            self.qos_tally(qos).submitted += 1
        acct = self.account(account)
        acct.submitted += 1
        acct.demand += demand
        if self.first_submit is None or t < self.first_submit:
            self.first_submit = t

    def start(self, account: str, wait: float | None, bucket: str = "1",
              qos: str | None = None) -> None:
        """A run began; ``wait`` is set on a job's first start only."""
        if wait is None:
            self.restarts += 1
            return
        if qos is not None:
            self.qos_tally(qos).waits.append(wait)
        acct = self.account(account)
        acct.started += 1
        acct.waits.append(wait)
        self.waits.append(wait)
        self.size_waits.setdefault(bucket, []).append(wait)

    def run_started(self, account: str, share: float, gpus: float, qos: str | None = None) -> None:
        if qos is not None:
            self.qos_tally(qos).rate += share
        acct = self.account(account)
        acct.rate += share
        acct.rate_allocated += gpus

    def run_stopped(self, account: str, share: float, gpus: float, seconds: float,
                    preempted: bool, qos: str | None = None) -> None:
        if qos is not None:
            q = self.qos_tally(qos)
            q.rate -= share
            if abs(q.rate) < 1e-9:
                q.rate = 0.0
            if preempted:
                q.preempted += 1
                q.preempted_gpu_seconds += gpus * seconds
        acct = self.account(account)
        acct.rate -= share
        acct.rate_allocated -= gpus
        if abs(acct.rate_allocated) < 1e-9:
            acct.rate_allocated = 0.0
            acct.rate = 0.0          # no float residue once nothing runs
        if preempted:
            self.preempted_gpu_seconds += gpus * seconds

    def job_ended(self, account: str, state: str, t: float, submit: float | None = None,
                  last_run: float = 0.0, bucket: str = "1") -> None:
        self.ends[state] += 1
        if state == "COMPLETED":
            self.account(account).completed += 1
        if self.last_end is None or t > self.last_end:
            self.last_end = t
        if submit is not None:
            jct = t - submit
            self.completion_times.append(jct)
            bsld = max(1.0, jct / max(last_run, SLOWDOWN_BOUND))
            self.slowdowns.append(bsld)
            self.size_slowdowns.setdefault(bucket, []).append(bsld)

    # -- the report --------------------------------------------------------------------

    def report(self, *, end: float, pending: int, running: int, trace: dict[str, Any],
               nodes: int, config: SchedConfig | None = None) -> dict[str, Any]:
        for name, a in self.accounts.items():
            self._settle(name, a, max(end, self.now))
        total_gpu_s = sum(a.gpu_seconds for a in self.accounts.values())
        start = self.first_submit if self.first_submit is not None else end
        span = max(0.0, end - start)
        finished = pending == 0 and running == 0 and self.last_end is not None
        active = [n for n, a in self.accounts.items() if a.submitted]
        configured = configured_shares(config or SchedConfig(), active)
        fair = fair_shares(total_gpu_s, configured, {n: self.accounts[n].wanted for n in active})
        periods = []
        for k, b in sorted(self.periods.items()):
            used = sum(c[0] for c in b.values())
            pfair = fair_shares(used, {n: configured.get(n, 0.0) for n in b}, {n: c[1] for n, c in b.items()})
            ratios = [c[0] / pfair[n] for n, c in b.items() if pfair.get(n, 0.0) > 0]
            periods.append({
                "start": _round(k * self.period), "end": _round(min((k + 1) * self.period, end)),
                "gpu_seconds": _round(used),
                "shares": {n: _round(c[0] / used) for n, c in sorted(b.items())} if used > 0 else {},
                "jain": _round(jain(ratios)) if ratios else None})
        weighted = [(p["jain"], p["gpu_seconds"]) for p in periods if p["jain"] is not None]
        wsum = sum(w for _, w in weighted)
        report = {
            "gpu_allocation": (_round(self.waiting_alloc_seconds / self.waiting_total_seconds)
                               if self.waiting_total_seconds > 0 else None),
            "utilization": _round(self.alloc_seconds / (self.total_gpus * span)) if span > 0 else None,
            "wait_s": _stats(self.waits, with_max=True),
            "jct_s": _stats(self.completion_times),
            "bounded_slowdown": _stats(self.slowdowns),
            "by_size": {
                label: {"jobs_started": len(self.size_waits.get(label, ())),
                        "wait_s": _stats(self.size_waits.get(label, [])),
                        "bounded_slowdown": _stats(self.size_slowdowns.get(label, []))}
                for label, _ in SIZE_BUCKETS if label in self.size_waits},
            "accounts": {
                name: {
                    "gpu_seconds": _round(a.gpu_seconds),
                    "gpu_seconds_allocated": _round(a.gpu_seconds_allocated),
                    "share": _round(a.gpu_seconds / total_gpu_s) if total_gpu_s > 0 else None,
                    "configured_share": _maybe(configured.get(name)),
                    "fair_share": (_round(fair[name] / total_gpu_s)
                                   if total_gpu_s > 0 and name in fair else None),
                    "demand_gpu_seconds": _round(a.wanted),
                "submitted_gpu_seconds": _round(a.demand),
                    "jobs_submitted": a.submitted,
                    "jobs_started": a.started,
                    "jobs_completed": a.completed,
                    "mean_wait_s": _round(sum(a.waits) / a.started) if a.started else None,
                    "wait_s": _stats(a.waits),
                }
                for name, a in sorted(self.accounts.items())
            },
            "qos": {
                name: {
                    "jobs_submitted": q.submitted,
                    "jobs_started": len(q.waits),
                    "jobs_pending": q.pending,
                    "wait_s": _stats(q.waits, with_max=True),
                    "gpu_hours": _round(q.gpu_seconds / 3600),
                    "mean_gpus": _round(q.gpu_seconds / span) if span > 0 else None,
                    "gpu_allocation": (_round(q.waiting_alloc_seconds / q.waiting_total_seconds)
                                       if q.waiting_total_seconds > 0 else None),
                    "preempted": q.preempted,
                    "preempted_gpu_hours": _round(q.preempted_gpu_seconds / 3600),
                }
                for name, q in sorted(self.qos.items())
            },
            "fairness": {
                "jain": _round(sum(j * w for j, w in weighted) / wsum) if wsum > 0 else None,
                "period_s": self.period,
                "periods": periods,
            },
            "preemptions": self.preemptions,
            "preempted_gpu_hours": _round(self.preempted_gpu_seconds / 3600),
            "fragmentation": {
                "idle_gpu_hours": _round(self.idle_for_resources / 3600),
                "fraction": (_round(self.idle_for_resources / self.waiting_total_seconds)
                             if self.waiting_total_seconds > 0 else None),
                "scattered_gpu_hours": _round(self.idle_scattered / 3600),
                **self._fragmentation(),
            },
            "makespan_s": _round(self.last_end - start) if finished else None,
            "jobs": {
                "submitted": self.submitted,
                "started": len(self.waits),
                "completed": self.ends.get("COMPLETED", 0),
                "ended": dict(sorted(self.ends.items())),
                "restarts": self.restarts,
                "pending": pending,
                "running": running,
                "infeasible": dict(sorted(self.infeasible.items())),
                "multi_node": self.multi_node,
                "rounded_up": self.rounded_up,
            },
            "gpu_seconds": _round(total_gpu_s),
            "accounts_added": sorted(self.accounts_added),
            "trace": trace,
            "cluster": {"nodes": nodes, "gpus": self.total_gpus},
            "simulated_s": _round(span),
            "end_time": _round(end),
            "scheduler_passes": self.passes,
        }
        if self.series_step:
            report["series"] = self.series or {"t": [], "allocated": [], "pending": [], "accounts": {}}
            report["series"]["targets"] = {n: _round(f) for n, f in sorted(configured.items())}   # the plot's lines
        return report


    def _fragmentation(self) -> dict[str, Any]:
        """gpud.sched.fragmentation's measures, averaged over the time jobs waited."""
        w = self.frag_waiting_s
        return {"size": self.frag_size,
                "index": _round(self.frag_index_s / w) if w > 0 else None,
                "free_gpus": _round(self.frag_free_s / w) if w > 0 else None,
                "stranded_gpus": _round(self.frag_stranded_s / w) if w > 0 else None}


# -- fairness arithmetic -------------------------------------------------------------------

def configured_shares(config: SchedConfig, active: list[str]) -> dict[str, float]:
    """Each active account's fraction of the configured shares, among active accounts only:
    at each level of the tree, siblings with no active account below them do not count."""
    accounts = config.accounts
    chains = {a: config.account_chain(a) or (a,) for a in active}
    live = {x for c in chains.values() for x in c}

    def shares(name: str) -> float:
        a = accounts.get(name)
        return a.shares if a is not None else 1.0

    def parent(name: str) -> str | None:
        a = accounts.get(name)
        return a.parent if a is not None else None

    siblings: dict[str | None, float] = {}
    for name in live:
        siblings[parent(name)] = siblings.get(parent(name), 0.0) + shares(name)
    out = {}
    for a, chain in chains.items():
        f = 1.0
        for name in chain:
            tot = siblings.get(parent(name), 0.0)
            f *= shares(name) / tot if tot > 0 else 0.0
        out[a] = f
    return out


def fair_shares(total: float, weights: dict[str, float], demand: dict[str, float]) -> dict[str, float]:
    """Weighted max-min split of ``total``: each gets its weight's part, at most its
    demand; what a capped account leaves goes to the rest by weight."""
    out = {n: 0.0 for n in weights}
    open_ = {n for n, w in weights.items() if w > 0}
    left = total
    while open_ and left > 1e-9:
        wsum = sum(weights[n] for n in open_)
        capped = {n for n in open_ if demand.get(n, 0.0) - out[n] <= left * weights[n] / wsum}
        if not capped:
            for n in open_:
                out[n] += left * weights[n] / wsum
            break
        for n in capped:
            give = max(0.0, demand.get(n, 0.0) - out[n])
            out[n] += give
            left -= give
        open_ -= capped
    return out


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _stats(values: list[float], with_max: bool = False) -> dict[str, float | None]:
    v = sorted(values)
    out = {"mean": _round(sum(v) / len(v)) if v else None,
           "p50": _round(percentile(v, 50)) if v else None,
           "p95": _round(percentile(v, 95)) if v else None}
    if with_max:
        out["max"] = _round(v[-1]) if v else None
    return out


def _round(v: float) -> float:
    # Stable output: JSON diffs between runs show policy changes, not float noise.
    return round(v, 6)


def _maybe(v: float | None) -> float | None:
    return None if v is None else _round(v)


# -- text ----------------------------------------------------------------------------------

def dur(v: float | None) -> str:
    return "-" if v is None else format_duration(v)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def num(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def format_text(r: dict[str, Any]) -> str:
    """The report as a short human-readable summary."""
    jobs, wait, tr, cl = r["jobs"], r["wait_s"], r["trace"], r["cluster"]
    jct, bsld, frag = r["jct_s"], r["bounded_slowdown"], r["fragmentation"]
    skipped = ", ".join(f"{k} {v}" for k, v in tr.get("skipped", {}).items()) or "none"
    infeasible = ", ".join(f"{k} {v}" for k, v in jobs["infeasible"].items()) or "none"
    ended = ", ".join(f"{k} {v}" for k, v in jobs["ended"].items()) or "none"
    lines = [
        *([f"Policy       {r['policy']}"] if r.get("policy") else []),
        f"Cluster      {cl['nodes']} nodes, {cl['gpus']} GPUs",
        f"Trace        {tr.get('rows', 0)} rows, {tr.get('accepted', 0)} accepted; "
        f"skipped: {skipped}",
        f"Simulated    {dur(r['simulated_s'])} (ends at t={r['end_time']:.0f}s), "
        f"{r['scheduler_passes']} scheduler passes",
        f"Jobs         {jobs['submitted']} submitted, {jobs['started']} started, "
        f"{jobs['completed']} completed, {jobs['pending']} pending, {jobs['running']} running "
        f"at end; infeasible: {infeasible}",
        *([f"Multi-node   {jobs['multi_node']} jobs bigger than a node ran on several, "
           f"{jobs.get('rounded_up', 0)} of them rounded up to N nodes x G GPUs"]
          if jobs.get("multi_node") else []),
        f"Ended        {ended}; {jobs['restarts']} restarts after {r['preemptions']} preemptions "
        f"({r['preempted_gpu_hours']:.1f} GPU-hours lost)",
        f"Makespan     {dur(r['makespan_s'])}",
        f"Wait         mean {dur(wait['mean'])}, p50 {dur(wait['p50'])}, "
        f"p95 {dur(wait['p95'])}, max {dur(wait['max'])}",
        f"Completion   mean {dur(jct['mean'])}, p50 {dur(jct['p50'])}, p95 {dur(jct['p95'])}; "
        f"bounded slowdown mean {num(bsld['mean'])}, p95 {num(bsld['p95'])}",
        f"GPUs         {pct(r['gpu_allocation'])} allocated while jobs waited, "
        f"{pct(r['utilization'])} overall; {r['gpu_seconds'] / 3600:.1f} GPU-hours used",
        f"Idle GPUs    {frag['idle_gpu_hours']:.1f} GPU-hours while a job waited for Resources "
        f"({pct(frag['fraction'])}), {frag['scattered_gpu_hours']:.1f} of them scattered",
        f"Fragments    index {num(frag.get('index'), '.3f')} for {frag.get('size', 8)}-GPU requests "
        f"while jobs waited: {num(frag.get('stranded_gpus'), '.1f')} of "
        f"{num(frag.get('free_gpus'), '.1f')} free GPUs stranded on average",
        f"Fairness     Jain's index {num(r['fairness']['jain'], '.3f')} (GPU-time against "
        f"fair share, per {dur(r['fairness']['period_s'])} period)",
    ]
    if len(r.get("qos", {})) > 1:
        lines += ["", f"{'QOS':<12} {'STARTED':>8} {'PENDING':>8} {'MEAN WAIT':>12} {'P95 WAIT':>12} "
                  f"{'GPUS':>8} {'ALLOC':>7} {'PREEMPTED':>10}"]
        for name, q in r["qos"].items():
            w = q["wait_s"]
            lines.append(f"{name[:12]:<12} {q['jobs_started']:>8} {q['jobs_pending']:>8} "
                         f"{dur(w['mean']):>12} {dur(w['p95']):>12} {num(q['mean_gpus'], '.1f'):>8} "
                         f"{pct(q['gpu_allocation']):>7} {q['preempted']:>10}")
    lines += ["", f"{'SIZE':<6} {'STARTED':>8} {'MEAN WAIT':>12} {'P50 WAIT':>12} {'P95 WAIT':>12} "
                  f"{'SLOWDOWN':>9}"]
    for label, s in r["by_size"].items():
        w = s["wait_s"]
        lines.append(f"{label:<6} {s['jobs_started']:>8} {dur(w['mean']):>12} {dur(w['p50']):>12} "
                     f"{dur(w['p95']):>12} {num(s['bounded_slowdown']['mean']):>9}")
    lines += ["", f"{'ACCOUNT':<20} {'GPU-HOURS':>12} {'SHARE':>7} {'CONFIG':>7} {'FAIR':>7} "
                  f"{'SUBMIT':>8} {'STARTED':>8} {'DONE':>8} {'MEAN WAIT':>12} {'P95 WAIT':>12}"]
    # Biggest users first: with many accounts the top of the table is what matters.
    for name, a in sorted(r["accounts"].items(), key=lambda kv: (-kv[1]["gpu_seconds"], kv[0])):
        lines.append(
            f"{name[:20]:<20} {a['gpu_seconds'] / 3600:>12.1f} {pct(a['share']):>7} "
            f"{pct(a['configured_share']):>7} {pct(a['fair_share']):>7} "
            f"{a['jobs_submitted']:>8} {a['jobs_started']:>8} {a['jobs_completed']:>8} "
            f"{dur(a['mean_wait_s']):>12} {dur(a['wait_s']['p95']):>12}")
    return "\n".join(lines)
