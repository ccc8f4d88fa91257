"""Multi-node (gang) jobs and node filters: which nodes, now or at the earliest time.

Theory of operation
-------------------
A job takes this path when it asks for more than one node or names nodes, features or
exclusivity (``takes_gang_path``); every other job keeps the indexed single-node search of
placement.py.  A gang of ``N`` nodes gets ``gpus // N`` GPUs and the job's CPUs and memory
on *each* node, all nodes at once or none.

*Candidates* are fixed for a pass per filter: the partition's nodes that are not in
``exclude``, carry the ``constraint``'s features (``labels["features"]``, comma-joined;
``a&b`` needs both, ``a|b`` either, ``|`` binds loosest) and could ever hold a share.
``nodelist`` nodes must all be in the allocation; with fewer named than ``N`` the rest are
chosen freely.  ``misfit`` says ``BadConstraints`` when no allocation could ever exist and
``ReqNodeNotAvail`` when one could only with nodes that are down.

*Now.*  A candidate is eligible when it is up, has its share free (an exclusive job: the
whole node idle), and starting there delays no reservation (the same per-node no-delay rule
as everywhere).  Of the eligible nodes, ``choose`` (topology.py) takes N under the fewest
leaf switches (``labels["switch"]``; unlabeled nodes share one), then the fewest racks,
then binpack (or spread) order, then name.  ``--switches=S`` refuses a placement over more
than S switches until ``switches_wait`` seconds after submit (``DEFAULT_SWITCH_WAIT`` when
none was given, as Slurm's ``max_switch_wait``); the job waits with reason ``Resources``.

*Later.*  A gang that cannot start reserves the earliest time at which N candidates can
each hold their share for the whole time limit.  ``Timeline.windows`` gives each node's
possible start times as intervals; a sweep over their ends finds the first instant with N
nodes open (the named ones among them, within the switch limit when it still applies).
Nodes enter the sweep in order of when they could first have the GPUs at all, in doubling
batches, and the search stops at the first answer no node left out could improve: a few
times N nodes' timelines on a busy cluster, never nodes squared.  The job then holds a
reservation on each chosen node, and lower jobs may backfill on any of them only without
delaying it, so a stream of small jobs cannot starve a big gang.

A gang job is never a preemption victim, and neither a gang nor an exclusive job preempts:
it waits or reserves (simplest correct rule; the victim search is per node).  A single-node
job that names nodes or features may preempt, on its candidates only (core.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .backfill import Timeline
from .placement import Cluster
from .snapshot import PendingJob
from .topology import choose, spans

DEFAULT_SWITCH_WAIT = 300.0   # seconds --switches=N waits without @time (Slurm's max_switch_wait)
MAX_SWITCH_TRIES = 256        # instants a --switches reservation search tries before giving up
INF = float("inf")


def takes_gang_path(job: PendingJob) -> bool:
    return job.nodes != 1 or bool(job.nodelist or job.exclude or job.constraint or job.exclusive)


def parse_constraint(text: str | None) -> tuple[frozenset[str], ...]:
    """Alternatives, each a set of features a node must all have; ValueError when malformed."""
    if not text or not text.strip():
        return ()
    alternatives = []
    for alt in text.split("|"):
        names = frozenset(f.strip() for f in alt.split("&"))
        if "" in names:
            raise ValueError(f"constraint {text!r} has an empty feature name: write features like "
                             "\"a100&ib\" (all of them) or \"a100|h100\" (any of them)")
        alternatives.append(names)
    return tuple(alternatives)


def node_features(labels: dict[str, str]) -> frozenset[str]:
    return frozenset(f.strip() for f in labels.get("features", "").split(",") if f.strip())


def switch_limit(job: PendingJob, now: float) -> int | None:
    """The switch count a placement must keep to now, or None once the wait is over."""
    if job.switches is None:
        return None
    wait = DEFAULT_SWITCH_WAIT if job.switches_wait is None else job.switches_wait
    return job.switches if now < job.submit_time + wait else None


@dataclass(frozen=True)
class Request:
    """What a job on this path needs, per node."""

    partition: str
    nodes: int
    gpus: int                      # per node
    cpus: int
    mem: int
    model: str | None
    time_limit: float | None
    nodelist: tuple[str, ...]
    exclude: tuple[str, ...]
    constraint: str | None
    exclusive: bool

    def any_time(self) -> tuple:
        """The request less its time limit: what could ever run, or is short of nodes now,
        does not depend on it (a plain tuple: cheaper to build and hash than a copy)."""
        return (self.partition, self.nodes, self.gpus, self.cpus, self.mem, self.model, self.nodelist,
                self.exclude, self.constraint, self.exclusive)

    @classmethod
    def of(cls, job: PendingJob) -> "Request":
        n = max(1, job.nodes)
        return cls(job.partition, n, job.gpus // n, job.cpus, job.mem_mb, job.gpu_type, job.time_limit,
                   tuple(sorted(set(job.nodelist))), tuple(sorted(set(job.exclude))), job.constraint,
                   job.exclusive)


@dataclass
class _Fit:
    verdict: str | None            # None, "BadConstraints" or "ReqNodeNotAvail"
    nodes: list[int]               # up candidates that could ever hold a share, by index
    required: frozenset[int]
    allowed: frozenset[int] | None = None


class Gangs:
    """One pass's gang and filtered-node placement over the pass's Cluster and Timeline."""

    def __init__(self, cluster: Cluster, timeline: Timeline, now: float) -> None:
        self.c, self.tl, self.now = cluster, timeline, now
        labels = [dict(n.labels) for n in cluster.nodes]
        self.switch = [lb.get("switch", "") for lb in labels]
        self.rack = [lb.get("rack", "") for lb in labels]
        self.features = [node_features(lb) for lb in labels]
        self._fits: dict[tuple, _Fit] = {}        # by Request.any_time()
        self._short: set[tuple] = set()          # requests too few nodes have free now, this pass

    # -- can it ever run -------------------------------------------------------------------------

    def fit(self, req: Request) -> _Fit:
        key = req.any_time()
        hit = self._fits.get(key)
        if hit is None:
            hit = self._fits[key] = self._fit(req)
        return hit

    def _fit(self, req: Request) -> _Fit:
        c = self.c
        try:
            alternatives = parse_constraint(req.constraint)
        except ValueError:
            return _Fit("BadConstraints", [], frozenset())
        if len(req.nodelist) > req.nodes:
            return _Fit("BadConstraints", [], frozenset())
        members = c.members.get(req.partition, ())
        excluded = {c.pos[n] for n in req.exclude if n in c.pos}

        def holds(i: int) -> bool:
            return (i not in excluded and c.capacity(i, req.model) >= req.gpus and c.total_cpus[i] >= req.cpus
                    and c.total_mem[i] >= req.mem
                    and (not alternatives or any(a <= self.features[i] for a in alternatives)))

        able = [i for i in members if holds(i)]
        able_set = set(able)
        required = frozenset(c.pos[n] for n in req.nodelist if n in c.pos)
        if not required <= able_set:
            return _Fit("BadConstraints", [], required)
        if len(able) < req.nodes:
            return _Fit("BadConstraints" if members else "ReqNodeNotAvail", [], required)
        up = [i for i in able if c.up[i]]
        if len(required) < len(req.nodelist) or len(up) < req.nodes or not all(c.up[i] for i in required):
            return _Fit("ReqNodeNotAvail", [], required)   # an unknown name may yet register
        return _Fit(None, up, required)

    def allowed(self, req: Request) -> frozenset[int]:
        """The nodes the request may ever use (up ones), as a set."""
        fit = self.fit(req)
        if fit.allowed is None:
            fit.allowed = frozenset(fit.nodes)
        return fit.allowed

    # -- what one node gives -----------------------------------------------------------------------

    def share(self, i: int, req: Request) -> tuple[int, int, int, str | None]:
        """(GPUs, CPUs, memory, model) the job needs free on node ``i``: its whole node if exclusive."""
        c = self.c
        if req.exclusive:
            return len(c.model_of[i]), c.total_cpus[i], c.total_mem[i], None
        return req.gpus, req.cpus, req.mem, req.model

    def _order(self, nodes: Sequence[int], req: Request, policy: str) -> list[int]:
        c = self.c
        sign = 1 if policy == "binpack" else -1
        return sorted(nodes, key=lambda i: (sign * c.free_count(i, req.model),
                                            not c.fits_one_island(i, req.gpus, req.model), i))

    def _choose(self, ordered: list[int], req: Request, required: frozenset[int]) -> list[int]:
        if req.nodes == 1 and not required:
            return ordered[:1]
        levels: list[Callable[[int], str]] = [self.switch.__getitem__, self.rack.__getitem__]
        return sorted(choose(ordered, req.nodes, levels, required))

    # -- now -----------------------------------------------------------------------------------

    def place_now(self, req: Request, policy: str, limit: int | None,
                  veto: Callable[[int], bool]) -> tuple[list[int] | None, bool]:
        """(the nodes in rank order, or None; whether a reservation kept a node out)."""
        short = req.any_time()                    # too few nodes free is so for any time limit
        if short in self._short:
            return None, False
        fit = self.fit(req)
        c, reserved = self.c, self.tl.reserved
        free = []
        for i in fit.nodes:
            if req.exclusive:
                if not c.idle(i):
                    continue
            elif c.free_count(i, req.model) < req.gpus or c.cpus[i] < req.cpus or c.mem[i] < req.mem:
                continue
            if i not in c.exclusive:
                free.append(i)
        if len(free) < req.nodes or not fit.required <= set(free):
            self._short.add(short)                # resources only shrink during a pass
            return None, False
        eligible = [i for i in free if i not in reserved or not veto(i)]
        blocked = len(eligible) < len(free)
        if len(eligible) < req.nodes or not fit.required <= set(eligible):
            return None, blocked
        chosen = self._choose(self._order(eligible, req, policy), req, fit.required)
        if limit is not None and spans(chosen, self.switch.__getitem__) > limit:
            return None, blocked
        return chosen, blocked

    # -- later ---------------------------------------------------------------------------------

    def earliest(self, req: Request, policy: str, limit: int | None) -> tuple[float, list[int]] | None:
        """(time, nodes in rank order) of the earliest start of the whole gang, or None.

        Nodes are taken in order of the first instant they could have the GPUs at all
        (``Timeline.by_bound``), in batches that double: a start found before the next
        node's bound is final, since no node left could be open by then.  On a busy cluster
        this looks at a few times N nodes instead of all of them."""
        fit = self.fit(req)
        if req.exclusive:               # whole nodes: shares differ per node, sweep them all
            return self._sweep(fit.nodes, req, policy, limit, INF)
        allowed = set(fit.nodes)
        taken: list[int] = []
        seen: set[int] = set()
        batch = max(16, 2 * req.nodes)
        ordered = self.tl.by_bound(req.partition, req.model, req.gpus)
        try:
            horizon = -INF
            while horizon < INF:
                goal = len(taken) + batch
                horizon = INF
                for bound, i in ordered:
                    if i in allowed and i not in seen:
                        seen.add(i)
                        taken.append(i)
                        if len(taken) >= goal:
                            horizon = bound      # every node not taken opens at or after this
                            break
                found = self._sweep(taken, req, policy, limit, horizon)
                if found is not None:
                    return found
                batch *= 2
        finally:
            ordered.close()                      # hands the bounds back for the next search
        return None

    def _sweep(self, nodes: Sequence[int], req: Request, policy: str, limit: int | None,
               horizon: float) -> tuple[float, list[int]] | None:
        """The first instant before ``horizon`` at which N of ``nodes`` are open together."""
        events: list[tuple[float, int, int]] = []
        append, windows, span, exclusive = events.append, self.tl.windows, req.time_limit, req.exclusive
        g, cpus, mem, model = req.gpus, req.cpus, req.mem, req.model     # the share, unless exclusive
        for i in nodes:
            if exclusive:
                g, cpus, mem, model = self.share(i, req)
            for a, b in windows(i, g, cpus, mem, model, span):
                if a >= horizon:
                    break
                append((a, 0, i))
                if b < INF:
                    append((b, 1, i))
        events.sort()                     # by time, starts first, then node: the input order is free
        required = self.fit(req).required
        open_: set[int] = set()
        tries = 0
        k, n = 0, len(events)
        while k < n:
            t = events[k][0]
            while k < n and events[k][0] == t and events[k][1] == 0:
                open_.add(events[k][2])
                k += 1
            if len(open_) >= req.nodes and required <= open_:
                chosen = self._choose(self._order(sorted(open_), req, policy), req, required)
                if limit is None or spans(chosen, self.switch.__getitem__) <= limit:
                    return t, chosen
                tries += 1
                if tries >= MAX_SWITCH_TRIES:
                    return None
            while k < n and events[k][0] == t and events[k][1] == 1:
                open_.discard(events[k][2])
                k += 1
        return None

