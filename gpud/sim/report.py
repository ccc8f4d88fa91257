"""What a simulation measured, and how it is shown.

The engine feeds a ``Tally`` as things happen (time passing, jobs arriving, starting and
ending); ``Tally.report`` turns it into one plain dict, the ``--json`` output, and
``format_text`` renders that dict for people.  Definitions:

* ``gpu_allocation``: of the GPU-time that passed while at least one job was waiting, the
  fraction that was allocated.  1.0 means no GPU sat idle while someone waited; ``None``
  when no job ever waited.
* ``utilization``: allocated GPU-time over all GPU-time from the first arrival to the end.
* GPU-seconds are unweighted (no billing weights) and counted up to the end of the
  simulation (``--until`` cuts running jobs there).  A job holding a share of a GPU counts
  its share; ``gpu_seconds_allocated`` counts the whole GPUs it held.  Runs cut short by a
  preemption count too: the GPUs were busy.
* A job's wait is from submission to its first start; requeues after a preemption do not
  reset it.  Waits of jobs that never started are not in the means (see ``jobs.pending``).
* ``makespan_s``: from the first submission to the last job's end; ``None`` when jobs were
  still pending or running when the simulation stopped.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..units import format_duration

__all__ = ["Tally", "AccountTally", "format_text", "percentile"]


@dataclass
class AccountTally:
    submitted: int = 0
    started: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0          # share-weighted
    gpu_seconds_allocated: float = 0.0
    wait_sum: float = 0.0


@dataclass
class Tally:
    total_gpus: int
    accounts: dict[str, AccountTally] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    ends: Counter = field(default_factory=Counter)     # final state -> jobs
    submitted: int = 0
    restarts: int = 0
    preemptions: int = 0
    infeasible: Counter = field(default_factory=Counter)
    first_submit: float | None = None
    last_end: float | None = None
    alloc_seconds: float = 0.0        # allocated GPU-seconds (whole GPUs)
    waiting_alloc_seconds: float = 0.0
    waiting_total_seconds: float = 0.0
    passes: int = 0
    accounts_added: list[str] = field(default_factory=list)   # trace accounts not configured

    def account(self, name: str) -> AccountTally:
        acct = self.accounts.get(name)
        if acct is None:
            acct = self.accounts[name] = AccountTally()
        return acct

    def advance(self, dt: float, allocated: int, waiting: bool) -> None:
        """``dt`` seconds passed with ``allocated`` GPUs busy."""
        busy = allocated * dt
        self.alloc_seconds += busy
        if waiting:
            self.waiting_alloc_seconds += busy
            self.waiting_total_seconds += self.total_gpus * dt

    def submit(self, account: str, t: float) -> None:
        self.submitted += 1
        self.account(account).submitted += 1
        if self.first_submit is None or t < self.first_submit:
            self.first_submit = t

    def start(self, account: str, wait: float | None) -> None:
        """A run began; ``wait`` is set on a job's first start only."""
        if wait is None:
            self.restarts += 1
            return
        acct = self.account(account)
        acct.started += 1
        acct.wait_sum += wait
        self.waits.append(wait)

    def run_ended(self, account: str, seconds: float, share: float, gpus: int) -> None:
        acct = self.account(account)
        acct.gpu_seconds += seconds * share
        acct.gpu_seconds_allocated += seconds * gpus

    def job_ended(self, account: str, state: str, t: float) -> None:
        self.ends[state] += 1
        if state == "COMPLETED":
            self.account(account).completed += 1
        if self.last_end is None or t > self.last_end:
            self.last_end = t

    def report(self, *, end: float, pending: int, running: int, trace: dict[str, Any],
               nodes: int) -> dict[str, Any]:
        total_gpu_s = sum(a.gpu_seconds for a in self.accounts.values())
        waits = sorted(self.waits)
        start = self.first_submit if self.first_submit is not None else end
        span = max(0.0, end - start)
        finished = pending == 0 and running == 0 and self.last_end is not None
        return {
            "gpu_allocation": (_round(self.waiting_alloc_seconds / self.waiting_total_seconds)
                               if self.waiting_total_seconds > 0 else None),
            "utilization": _round(self.alloc_seconds / (self.total_gpus * span)) if span > 0 else None,
            "accounts": {
                name: {
                    "gpu_seconds": _round(a.gpu_seconds),
                    "gpu_seconds_allocated": _round(a.gpu_seconds_allocated),
                    "share": _round(a.gpu_seconds / total_gpu_s) if total_gpu_s > 0 else None,
                    "jobs_submitted": a.submitted,
                    "jobs_started": a.started,
                    "jobs_completed": a.completed,
                    "mean_wait_s": _round(a.wait_sum / a.started) if a.started else None,
                }
                for name, a in sorted(self.accounts.items())
            },
            "preemptions": self.preemptions,
            "makespan_s": _round(self.last_end - start) if finished else None,
            "wait_s": {
                "mean": _round(sum(waits) / len(waits)) if waits else None,
                "p50": _round(percentile(waits, 50)) if waits else None,
                "p95": _round(percentile(waits, 95)) if waits else None,
                "max": _round(waits[-1]) if waits else None,
            },
            "jobs": {
                "submitted": self.submitted,
                "started": len(waits),
                "completed": self.ends.get("COMPLETED", 0),
                "ended": dict(sorted(self.ends.items())),
                "restarts": self.restarts,
                "pending": pending,
                "running": running,
                "infeasible": dict(sorted(self.infeasible.items())),
            },
            "gpu_seconds": _round(total_gpu_s),
            "accounts_added": sorted(self.accounts_added),
            "trace": trace,
            "cluster": {"nodes": nodes, "gpus": self.total_gpus},
            "simulated_s": _round(span),
            "end_time": _round(end),
            "scheduler_passes": self.passes,
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _round(v: float) -> float:
    # Stable output: JSON diffs between runs show policy changes, not float noise.
    return round(v, 6)


def format_text(r: dict[str, Any]) -> str:
    """The report as a short human-readable summary."""
    def dur(v: float | None) -> str:
        return "-" if v is None else format_duration(v)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    jobs, wait, tr, cl = r["jobs"], r["wait_s"], r["trace"], r["cluster"]
    skipped = ", ".join(f"{k} {v}" for k, v in tr.get("skipped", {}).items()) or "none"
    infeasible = ", ".join(f"{k} {v}" for k, v in jobs["infeasible"].items()) or "none"
    ended = ", ".join(f"{k} {v}" for k, v in jobs["ended"].items()) or "none"
    lines = [
        f"Cluster      {cl['nodes']} nodes, {cl['gpus']} GPUs",
        f"Trace        {tr.get('rows', 0)} rows, {tr.get('accepted', 0)} accepted; "
        f"skipped: {skipped}",
        f"Simulated    {dur(r['simulated_s'])} (ends at t={r['end_time']:.0f}s), "
        f"{r['scheduler_passes']} scheduler passes",
        f"Jobs         {jobs['submitted']} submitted, {jobs['started']} started, "
        f"{jobs['completed']} completed, {jobs['pending']} pending, {jobs['running']} running "
        f"at end; infeasible: {infeasible}",
        f"Ended        {ended}; {jobs['restarts']} restarts after {r['preemptions']} preemptions",
        f"Makespan     {dur(r['makespan_s'])}",
        f"Wait         mean {dur(wait['mean'])}, p50 {dur(wait['p50'])}, "
        f"p95 {dur(wait['p95'])}, max {dur(wait['max'])}",
        f"GPUs         {pct(r['gpu_allocation'])} allocated while jobs waited, "
        f"{pct(r['utilization'])} overall; {r['gpu_seconds'] / 3600:.1f} GPU-hours used",
        "",
        f"{'ACCOUNT':<20} {'GPU-HOURS':>12} {'SHARE':>7} {'SUBMIT':>8} {'STARTED':>8} "
        f"{'DONE':>8} {'MEAN WAIT':>12}",
    ]
    # Biggest users first: with many accounts the top of the table is what matters.
    for name, a in sorted(r["accounts"].items(), key=lambda kv: (-kv[1]["gpu_seconds"], kv[0])):
        lines.append(
            f"{name[:20]:<20} {a['gpu_seconds'] / 3600:>12.1f} {pct(a['share']):>7} "
            f"{a['jobs_submitted']:>8} {a['jobs_started']:>8} {a['jobs_completed']:>8} "
            f"{dur(a['mean_wait_s']):>12}")
    return "\n".join(lines)
