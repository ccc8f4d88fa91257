"""Choosing preemption victims, with the caps that keep preemption from thrashing.

Theory of operation
-------------------
Two things may preempt: a QOS that lists others in its ``preempt`` (its jobs may stop jobs
of those QOS), and quota reclaim (a job within its account's guarantee may stop jobs that
borrow from other pools; see quota.py).

*Caps, always.*  A job is never a candidate while it is younger than
``preemption.exempt_time``, once it has been preempted ``max_per_job`` times, or while it
is already stopping (its resources are already on their way back; the timeline counts
them as free at ``now``, so they are neither picked again nor counted twice).  Across the
cluster, preemptions in the last 60 s (``Snapshot.recent_preemptions``) plus this plan's
never exceed ``max_per_minute``.

*Victims.*  On each node, candidates are ordered by ``victim_order``: borrowed jobs first,
then lowest priority, then youngest (least work lost), then job id.  Taking them in that
order until the job fits, then dropping any that turn out unnecessary (last first), frees
what is needed with as little as possible.  Among nodes, the cheapest set wins: fewest
non-borrowed victims, then lowest top victim priority, then least lost GPU-seconds, then
fewest victims, then node order.  A node that carries reservations must still honour them
with the job placed at ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .backfill import Release, Timeline
from .config import SchedConfig
from .placement import Cluster
from .quota import Pool, QuotaBook
from .snapshot import RunningJob

RATE_WINDOW = 60.0   # seconds over which max_per_minute counts


def victim_order(job: RunningJob, priority: float) -> tuple:
    """Sort key: the first victims to consider come first."""
    return (not job.borrowed, priority, -job.start_time, job.job_id)


def preemptible(job: RunningJob, cfg: SchedConfig, now: float) -> bool:
    pc = cfg.preemption
    return (not job.stopping and now - job.start_time >= pc.exempt_time
            and job.preempt_count < pc.max_per_job)


def rate_budget(recent: Sequence[float], cfg: SchedConfig, now: float) -> int:
    used = sum(1 for t in recent if now - RATE_WINDOW < t <= now)
    return max(0, cfg.preemption.max_per_minute - used)


@dataclass(frozen=True)
class Choice:
    node: int
    victims: tuple[RunningJob, ...]
    cost: tuple


class Preemptor:
    """Per-pass victim search over the candidates that pass the caps."""

    def __init__(self, cfg: SchedConfig, running: Sequence[RunningJob], cluster: Cluster,
                 timeline: Timeline, book: QuotaBook, priority: Callable[[RunningJob], float],
                 recent: Sequence[float], now: float) -> None:
        self.cluster, self.timeline, self.book, self.now = cluster, timeline, book, now
        self.budget = rate_budget(recent, cfg, now)
        self.priority: dict[int, float] = {}
        per_node: dict[int, list[tuple[tuple, RunningJob]]] = {}
        for r in running:
            i = cluster.pos.get(r.node)
            if i is None or not cluster.up[i] or not preemptible(r, cfg, now):
                continue
            p = priority(r)
            self.priority[r.job_id] = p
            per_node.setdefault(i, []).append((victim_order(r, p), r))
        self.candidates = {i: [r for _, r in sorted(v, key=lambda kv: kv[0])]
                           for i, v in sorted(per_node.items())}
        self.qos_running = {r.qos for v in self.candidates.values() for r in v}
        self.taken: set[int] = set()

    def worth_trying(self, targets: frozenset[str], reclaim: bool, for_pool: Pool) -> bool:
        if self.budget <= 0 or not self.candidates:
            return False
        return bool(targets & self.qos_running) or (reclaim and self.book.any_reclaimable(for_pool))

    def select(self, partition: str, gpus: int, cpus: int, mem: int, model: str | None,
               time_limit: float | None, targets: frozenset[str], reclaim: bool,
               for_pool: Pool) -> Choice | None:
        members = set(self.cluster.members.get(partition, ()))
        best: Choice | None = None
        for i, cands in self.candidates.items():
            if i not in members:
                continue
            choice = self._on_node(i, cands, gpus, cpus, mem, model, time_limit, targets, reclaim, for_pool)
            if choice is not None and (best is None or choice.cost < best.cost):
                best = choice
        return best

    def _allowed(self, v: RunningJob, targets: frozenset[str], reclaim: bool, for_pool: Pool) -> bool:
        if v.job_id in self.taken:
            return False
        return v.qos in targets or (reclaim and self.book.reclaimable(v, for_pool))

    def _on_node(self, i: int, cands: list[RunningJob], gpus: int, cpus: int, mem: int,
                 model: str | None, time_limit: float | None, targets: frozenset[str],
                 reclaim: bool, for_pool: Pool) -> Choice | None:
        c, now = self.cluster, self.now
        if c.capacity(i, model) < gpus or c.total_cpus[i] < cpus or c.total_mem[i] < mem:
            return None
        fg, fc, fm = self.timeline.free_at(i, now, model)
        dg, dc, dm = gpus - fg, cpus - fc, mem - fm           # still missing
        excess: dict[Pool, int] = {}                          # reclaim must stay within each pool's excess
        chosen: list[tuple[RunningJob, int]] = []
        for v in cands:
            if dg <= 0 and dc <= 0 and dm <= 0:
                break
            if not self._allowed(v, targets, reclaim, for_pool):
                continue
            vg = c.count_matching(i, v.gpu_indices, model)
            if not ((dg > 0 and vg) or (dc > 0 and v.cpus) or (dm > 0 and v.mem_mb)):
                continue
            if v.qos not in targets:   # reclaim only
                p = self.book.pool(v.account)
                left = excess.get(p, self.book.excess(p))
                if left < len(v.gpu_indices):
                    continue
                excess[p] = left - len(v.gpu_indices)
            chosen.append((v, vg))
            dg, dc, dm = dg - vg, dc - v.cpus, dm - v.mem_mb
        if dg > 0 or dc > 0 or dm > 0 or not chosen:
            return None
        for k in range(len(chosen) - 1, -1, -1):   # drop victims the job turns out not to need
            v, vg = chosen[k]
            if dg + vg <= 0 and dc + v.cpus <= 0 and dm + v.mem_mb <= 0:
                dg, dc, dm = dg + vg, dc + v.cpus, dm + v.mem_mb
                del chosen[k]
        victims = tuple(v for v, _ in chosen)
        if len(victims) > self.budget:
            return None
        if i in self.timeline.reserved:
            extra = [Release(now, v.gpu_indices, v.cpus, v.mem_mb, v.job_id) for v in victims]
            if self.timeline.earliest_on_node(i, gpus, cpus, mem, model, time_limit, extra) != now:
                return None
        lost = sum(max(1, len(v.gpu_indices)) * (now - v.start_time) for v in victims)
        cost = (sum(1 for v in victims if not v.borrowed),
                max(self.priority[v.job_id] for v in victims), lost, len(victims), i)
        return Choice(i, victims, cost)

    def commit(self, choice: Choice) -> None:
        for v in choice.victims:
            self.taken.add(v.job_id)
            self.timeline.stop(v.job_id)
            self.book.on_victim(v)
        self.budget -= len(choice.victims)
