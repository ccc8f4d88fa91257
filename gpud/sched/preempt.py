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

*Victims.*  On each node, candidates are ordered: borrowed jobs first,
then lowest priority, then youngest (least work lost), then job id.  Taking them in that
order until the job fits, then dropping any that turn out unnecessary (last first), frees
what is needed with as little as possible.  Among nodes, the cheapest set wins: fewest
non-borrowed victims, then lowest top victim priority, then least lost GPU-seconds, then
fewest victims, then node order.  Nodes are visited in order of a lower bound on that cost
(computed once per pass from their candidates), so the search stops as soon as no
remaining node can beat the best set found.  A node that carries reservations must still honour them
with the job placed at ``now``.

*Gangs.*  A multi-node job (``RunningJob.parts``) is never a victim: its ranks stop and start
together, and freeing one node would not free the others.  A gang, or an exclusive job, does
not preempt either; it waits or reserves (gang.py).  A single-node job that names nodes or
features preempts only on those (``allowed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

from .backfill import Release, Timeline
from .config import SchedConfig
from .placement import Cluster
from .quota import Pool, QuotaBook
from .snapshot import RunningJob

RATE_WINDOW = 60.0   # seconds over which max_per_minute counts


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
        targets = {t for q in cfg.qos.values() for t in q.preempt}
        reclaim, pos, up = book.enabled, cluster.pos, cluster.up
        exempt, max_per_job = cfg.preemption.exempt_time, cfg.preemption.max_per_job
        # Lower bounds on the cost of any victim set on a node, per group of candidates (a
        # QOS, or "borrowed" for reclaim), to visit nodes cheapest first and stop early.
        # Taking victims only raises a node's true cost, so the bounds hold all pass.
        self.bounds: dict[int, dict[str | None, tuple[int, float, float, int]]] = {}
        bounds, prio = self.bounds, self.priority
        # GPUs free now or on their way back, per node: with all candidates, an upper bound
        self.soon = soon = [len(f) for f in cluster.free]
        # borrowed jobs on slices and shares, per (node, GPU): quota reclaim for a fraction
        self.fractional: dict[tuple[int, int], list[RunningJob]] = {}
        for r in running:
            if r.stopping:
                for i, gpus, _, _ in cluster.held(r):
                    soon[i] += len(gpus)
                continue          # already on its way out: never a candidate
            if r.qos not in targets and not (r.borrowed and reclaim):
                continue          # nothing may ever preempt it
            # the caps: too young, or preempted too often
            if not now - r.start_time >= exempt or r.preempt_count >= max_per_job:
                continue
            i = pos.get(r.node)
            if i is None or not up[i]:
                continue
            if r.devices and not r.gpu_indices:
                if r.borrowed and reclaim:     # holds a slice or share: only a fraction's reclaim frees it
                    for d in r.devices:
                        self.fractional.setdefault((i, d.index), []).append(r)
                continue          # stopping it frees no whole GPU
            if r.parts:
                continue          # a gang job is never a victim: stopping one node would not free the rest
            p = prio[r.job_id] = priority(r)
            borrowed, g = r.borrowed, len(r.gpu_indices)
            cands = per_node.get(i)
            if cands is None:
                cands, groups = per_node[i], bounds[i] = [], {}
            else:
                groups = bounds[i]
            cands.append(((not borrowed, p, -r.start_time, r.job_id), r))     # the victim order
            key = (0 if borrowed else 1, p, (g or 1) * (now - r.start_time), g)
            for name in (r.qos, None) if borrowed else (r.qos,):
                old = groups.get(name)
                if old is None:
                    groups[name] = key
                else:     # min() of each, as conditionals (min keeps the first of equals, as here)
                    groups[name] = (key[0] if key[0] < old[0] else old[0], key[1] if key[1] < old[1] else old[1],
                                    key[2] if key[2] < old[2] else old[2], old[3] + g)
        self.candidates = {i: [r for _, r in sorted(v, key=lambda kv: kv[0])] if len(v) > 1 else [v[0][1]]
                           for i, v in sorted(per_node.items())}
        self.qos_running = {r.qos for v in self.candidates.values() for r in v}
        self.taken: set[int] = set()
        self._orders: dict[tuple, list[tuple[tuple[int, float, float], int, int]]] = {}
        # (node, request, targets) -> (node version, the cheapest set there, budget aside)
        self._seen: dict[tuple, tuple[int, Choice | None]] = {}

    def _order(self, partition: str, targets: frozenset[str], reclaim: bool,
               gpus: int = 0) -> list[tuple[tuple, int, int]]:
        """(cost lower bound, node, most GPUs it could free) for nodes with candidates that could
        free at least ``gpus`` GPUs, cheapest first (kept per request size: most nodes cannot
        free a big one, and a search would only step over them)."""
        key = (partition, targets, reclaim, gpus)
        order = self._orders.get(key)
        if order is None and gpus > 0:
            order = self._orders[key] = [e for e in self._order(partition, targets, reclaim) if e[2] >= gpus]
        elif order is None:
            members = set(self.cluster.members.get(partition, ()))
            groups = sorted(targets) + ([None] if reclaim else [])   # type: ignore[list-item]
            order = []
            for i, bound in self.bounds.items():
                parts = [bound[g] for g in groups if g in bound]
                if i in members and len(parts) == 1:
                    p = parts[0]
                    order.append(((p[0], p[1], p[2]), i, self.soon[i] + p[3]))
                elif i in members and parts:
                    order.append(((min(p[0] for p in parts), min(p[1] for p in parts), min(p[2] for p in parts)),
                                  i, self.soon[i] + sum(p[3] for p in parts)))
            order.sort()
            self._orders[key] = order
        return order

    def worth_trying(self, targets: frozenset[str], reclaim: bool, for_pool: Pool) -> bool:
        if self.budget <= 0 or not self.candidates:
            return False
        return bool(targets & self.qos_running) or (reclaim and self.book.any_reclaimable(for_pool))

    def select(self, partition: str, gpus: int, cpus: int, mem: int, model: str | None,
               time_limit: float | None, targets: frozenset[str], reclaim: bool,
               for_pool: Pool, allowed: Collection[int] | None = None) -> Choice | None:
        """The cheapest victim set on one node (of ``allowed``, when given), or None."""
        best: Choice | None = None
        least: tuple | None = None      # best.cost[:3]: no node with a higher bound can beat it
        seen, versions = self._seen, self.timeline.versions
        for bound, i, most in self._order(partition, targets, reclaim, gpus):
            if least is not None and bound > least:
                break
            if allowed is not None and i not in allowed:
                continue
            if reclaim:        # depends on every pool's excess: asked afresh
                choice = self._on_node(i, self.candidates[i], gpus, cpus, mem, model, time_limit, targets,
                                       reclaim, for_pool)
            else:              # remembered until the node changes (a victim taken there changes it too)
                key = (i, gpus, cpus, mem, model, time_limit, targets)
                version = versions.get(i, 0)
                hit = seen.get(key)
                if hit is None or hit[0] != version:
                    hit = seen[key] = (version, self._on_node(i, self.candidates[i], gpus, cpus, mem, model,
                                                              time_limit, targets, reclaim, for_pool))
                choice = hit[1]
            if choice is not None and len(choice.victims) > self.budget:
                choice = None
            if choice is not None and (best is None or choice.cost < best.cost):
                best = choice
                least = choice.cost[:3]
        return best

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
        taken, book = self.taken, self.book
        for v in cands:
            if dg <= 0 and dc <= 0 and dm <= 0:
                break
            if v.job_id in taken:      # already a victim in this plan
                continue
            targeted = v.qos in targets
            if not targeted and not (reclaim and book.reclaimable(v, for_pool)):
                continue
            vg = len(v.gpu_indices) if model is None else c.count_matching(i, v.gpu_indices, model)
            if not ((dg > 0 and vg) or (dc > 0 and v.cpus) or (dm > 0 and v.mem_mb)):
                continue
            if not targeted:   # reclaim only
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
        victims = tuple(v for v, _ in chosen)      # (select checks them against the rate budget)
        if i in self.timeline.reserved:
            extra = [Release(now, v.gpu_indices, v.cpus, v.mem_mb, v.job_id) for v in victims]
            if self.timeline.earliest_on_node(i, gpus, cpus, mem, model, time_limit, extra) != now:
                return None
        lost = sum(max(1, len(v.gpu_indices)) * (now - v.start_time) for v in victims)
        cost = (sum(1 for v in victims if not v.borrowed),
                max(self.priority[v.job_id] for v in victims), lost, len(victims), i)
        return Choice(i, victims, cost)

    def commit(self, choice: Choice, amounts: Sequence[float] | None = None) -> None:
        """Stop ``choice``'s victims (``amounts``: the GPUs each counts, when not whole ones)."""
        for k, v in enumerate(choice.victims):
            self.taken.add(v.job_id)
            self.timeline.stop(v.job_id)
            self.book.on_victim(v, None if amounts is None else amounts[k])
        self.budget -= len(choice.victims)

    def reclaim_fraction(self, i: int, gpu: int, for_pool: Pool, room: Callable[[list[RunningJob]], bool],
                         amount: Callable[[RunningJob], float]) -> tuple[RunningJob, ...] | None:
        """The fewest borrowed jobs of other pools on GPU ``gpu`` of node ``i`` whose exit
        leaves ``room`` (lowest priority, then youngest, first), within every pool's excess
        and the rate budget; None when there is no such set."""
        cands = [r for r in self.fractional.get((i, gpu), ()) if r.job_id not in self.taken
                 and self.book.pool(r.account) != for_pool]
        cands.sort(key=lambda r: (-r.start_time, r.job_id))
        chosen: list[RunningJob] = []
        excess: dict[Pool, float] = {}
        for r in cands:
            if len(chosen) >= self.budget:
                break
            p = self.book.pool(r.account)
            left = excess.get(p, self.book.excess(p))
            g = amount(r)
            if left + 1e-9 < g:
                continue
            excess[p] = left - g
            chosen.append(r)
            if room(chosen):
                return tuple(chosen)
        return None
