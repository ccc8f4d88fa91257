"""Reservations for the top waiting jobs, and the backfill rule that protects them.

Theory of operation
-------------------
``Timeline`` knows, per node, when held resources come back: every running job releases
its GPUs, CPUs and memory at ``start + time_limit`` (never, when unlimited), a stopping job
(already signalled, or picked as a victim in this pass) at ``now``, and a job started in
this pass at ``now + its time limit``.  Free capacity at a future time ``t`` is what is free
now, plus every release up to ``t``, minus every reservation active at ``t``.

A gang job (gang.py) reserves the same amount on each of its N nodes from one start time:
``windows`` gives, per node, the start times at which the node could hold its share, and the
gang search sweeps those.  Every rule below then holds per node, gangs included.

A high-priority job that cannot start now gets a *reservation*: the earliest time at which
some node has what it needs for its whole time limit without touching earlier
reservations.  A lower job may start now on a node that carries reservations only if, at
the start of each of them that it overlaps, the node still has what the reservation needs
after this job takes its share ("ends before the reservation, or uses resources the
reservation does not need").  Reservations never move later because of backfilled jobs, so a
big job at the top cannot be starved by a stream of small ones.

GPUs are fungible within a node (a reservation counts GPUs of its model, not indices), which
is exact for whole GPUs on one node.  When GPU models are mixed on one node, a reservation
without a model is charged against every model: conservative, it never delays one.

Search is pruned: for a job needing ``g`` GPUs, nodes wait in a heap keyed by a lower bound
on when they could start it (first, when running jobs alone would leave ``g`` GPUs free; once
reservations land on a node, the first instant it has ``g`` GPUs free at all), and the
search stops once the smallest bound passes the best exact answer.  Reservations and starts
only ever delay a node, so bounds stay valid for the whole pass and are only ever raised;
a node where a victim was picked (resources back early) is re-filed at ``now``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .placement import Cluster
from .snapshot import RunningJob

INF = math.inf


@dataclass(slots=True)
class Release:
    end: float                    # clamped to >= now
    gpus: tuple[int, ...]
    cpus: int
    mem: int
    job_id: int


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: int
    node: int
    start: float
    end: float
    gpus: int
    cpus: int
    mem: int
    model: str | None

    def overlaps(self, a: float, b: float) -> bool:
        return self.start < b and self.end > a


@dataclass
class Profile:
    """Free (GPUs, CPUs, memory) on one node: ``gpus[k]`` etc. hold from ``times[k]`` on."""

    times: list[float]
    gpus: list[int]
    cpus: list[int]
    mem: list[int]

    def at(self, t: float) -> tuple[int, int, int]:
        k = bisect.bisect_right(self.times, t) - 1
        if k < 0:
            return 0, 0, 0
        return self.gpus[k], self.cpus[k], self.mem[k]

    def _split(self, t: float) -> int:
        """The index of a breakpoint at ``t`` (``t >= times[0]``), inserted if missing."""
        k = bisect.bisect_left(self.times, t)
        if k < len(self.times) and self.times[k] == t:
            return k
        self.times.insert(k, t)
        for col in (self.gpus, self.cpus, self.mem):
            col.insert(k, col[k - 1])
        return k

    def add(self, t0: float, t1: float, gpus: int, cpus: int, mem: int) -> None:
        if t1 <= t0:
            return
        k0 = self._split(t0)
        k1 = self._split(t1) if t1 < INF else len(self.times)
        for k in range(k0, k1):
            self.gpus[k] += gpus
            self.cpus[k] += cpus
            self.mem[k] += mem


class Timeline:
    def __init__(self, cluster: Cluster, running: Sequence[RunningJob], now: float) -> None:
        self.cluster, self.now = cluster, now
        n = len(cluster.nodes)
        self.releases: list[list[Release]] = [[] for _ in range(n)]
        self.reservations: list[list[Reservation]] = [[] for _ in range(n)]
        self.reserved: set[int] = set()     # nodes carrying at least one reservation
        self._by_job: dict[int, Release] = {}        # victims are single-node jobs: their one release
        self._node_of: dict[int, int] = {}           # ... and its node (two plain dicts: no tuple a job)
        self._profiles: dict[int, dict[str | None, Profile]] = {}
        self._bounds: dict[tuple[str, str | None, int], _Candidates] = {}
        # every finite release by end, for the streams; releases added since it was sorted are
        # merged in, and a moved one (a victim's) leaves its old place for its new one
        self._events: list[tuple[float, int, int]] | None = None
        self._added: list[tuple[float, int, int]] = []
        self._moves: list[tuple[float, float, int, int]] = []    # (old end, new end, node, index)
        # node -> a number bumped on every change to it: what is remembered per node is
        # kept with the number it was computed at, and asked afresh once that changes
        self.versions: dict[int, int] = {}
        self._exact: dict[tuple, tuple[int, float | None]] = {}   # (node, request) -> (version, start)
        self._windows: dict[tuple, tuple[int, list[tuple[float, float]]]] = {}   # likewise, windows
        self._firsts: dict[tuple, tuple[int, float]] = {}  # (node, model, GPUs) -> (version, first instant)
        pos, releases, by_job, node_of = cluster.pos, self.releases, self._by_job, self._node_of
        for r in running:
            if r.stopping:
                end = now
            else:        # max(now, r.end_time()), inlined: a pass looks at every running job
                end = INF if r.time_limit is None else r.start_time + r.time_limit
                if not end > now:
                    end = now
            if r.parts or r.exclusive:
                for i, gpus, cpus, mem in cluster.held(r):     # every node of a gang, all of an exclusive node
                    self._add(i, Release(end, gpus, cpus, mem, r.job_id))
                continue
            i = pos.get(r.node)
            if i is not None:           # _add, inlined
                rel = Release(end, tuple(r.gpu_indices), r.cpus, r.mem_mb, r.job_id)
                releases[i].append(rel)
                by_job[r.job_id] = rel
                node_of[r.job_id] = i

    def _add(self, i: int, rel: Release) -> None:
        rels = self.releases[i]
        rels.append(rel)
        self._by_job[rel.job_id] = rel
        self._node_of[rel.job_id] = i
        if rel.end < INF and self._events is not None:
            self._added.append((rel.end, i, len(rels) - 1))

    def add_start(self, i: int, gpus: tuple[int, ...], cpus: int, mem: int, end: float, job_id: int) -> None:
        """A job started now on node ``i`` (already allocated in the Cluster) until ``end``."""
        rels = self.releases[i]                 # _add, inlined: every start of a pass comes here
        rels.append(Release(end, gpus, cpus, mem, job_id))
        self._by_job[job_id] = rels[-1]
        self._node_of[job_id] = i
        if end < INF and self._events is not None:
            self._added.append((end, i, len(rels) - 1))
        # _shift, inlined: every start of a pass comes here
        self.versions[i] = self.versions.get(i, 0) + 1
        profiles = self._profiles.get(i)
        if profiles:
            c, now = self.cluster, self.now
            for model, prof in profiles.items():
                prof.add(now, end, -c.count_matching(i, gpus, model), -cpus, -mem)

    def stop(self, job_id: int) -> None:
        """A victim picked in this pass: its resources come back at ``now``."""
        i, rel = self._node_of[job_id], self._by_job[job_id]
        old, rel.end = rel.end, self.now
        if self._events is not None:
            k = next(k for k, r in enumerate(self.releases[i]) if r is rel)
            self._moves.append((old, self.now, i, k))
        c = self.cluster
        for (partition, model, gpus), state in self._bounds.items():   # it may be ready earlier now
            if c.up[i] and c.capacity(i, model) >= gpus and _contains(c.members.get(partition, ()), i):
                heapq.heappush(state.heap, (self.now, i))
        self._shift(i, self.now, old, lambda m: self.cluster.count_matching(i, rel.gpus, m), rel.cpus, rel.mem, 1)

    def reserve(self, job_id: int, i: int, start: float, time_limit: float | None,
                gpus: int, cpus: int, mem: int, model: str | None) -> Reservation:
        end = INF if time_limit is None else start + time_limit
        r = Reservation(job_id, i, start, end, gpus, cpus, mem, model)
        self.reservations[i].append(r)
        self.reserved.add(i)
        self._shift(i, start, end, lambda m: gpus if (model is None or m is None or m == model) else 0,
                    -cpus, -mem, -1)
        return r

    def _shift(self, i: int, t0: float, t1: float, gpus_for: Callable[[str | None], int],
               cpus: int, mem: int, sign: int) -> None:
        """Keep the node's cached profiles current: add a change over ``[t0, t1)``."""
        self.versions[i] = self.versions.get(i, 0) + 1
        for model, prof in self._profiles.get(i, {}).items():
            prof.add(t0, t1, sign * gpus_for(model), cpus, mem)

    # -- capacity over time --------------------------------------------------------------------

    def profile(self, i: int, model: str | None, extra: Sequence[Release] = ()) -> Profile:
        """Free capacity on node ``i`` as a step function from ``now`` on."""
        c = self.cluster
        if model is not None and not c.mixed[i] and model in c.model_set[i]:
            model = None          # one model per node: counting "all" is counting that model
        if not extra:
            cached = self._profiles.get(i, {}).get(model)
            if cached is not None:
                return cached
        delta: dict[float, list[int]] = {}

        def add(t: float, g: int, cpus: int, mem: int) -> None:
            d = delta.get(t)
            if d is None:
                delta[t] = [g, cpus, mem]
            else:
                d[0] += g
                d[1] += cpus
                d[2] += mem

        now = self.now
        add(now, c.free_count(i, model), c.cpus[i], c.mem[i])
        for rel in (*self.releases[i], *extra) if extra else self.releases[i]:
            if rel.end < INF:
                add(rel.end, c.count_matching(i, rel.gpus, model), rel.cpus, rel.mem)
        for r in self.reservations[i]:
            g = r.gpus if (r.model is None or model is None or r.model == model) else 0
            add(max(now, r.start), -g, -r.cpus, -r.mem)
            if r.end < INF:
                add(max(now, r.end), g, r.cpus, r.mem)
        times = sorted(delta)
        g = cpus = mem = 0
        gs, cs, ms = [], [], []
        for t in times:
            d = delta[t]
            g, cpus, mem = g + d[0], cpus + d[1], mem + d[2]
            gs.append(g)
            cs.append(cpus)
            ms.append(mem)
        prof = Profile(times, gs, cs, ms)
        if not extra:
            self._profiles.setdefault(i, {})[model] = prof
        return prof

    def free_at(self, i: int, t: float, model: str | None,
                extra: Sequence[Release] = ()) -> tuple[int, int, int]:
        return self.profile(i, model, extra).at(t)

    def earliest_on_node(self, i: int, gpus: int, cpus: int, mem: int, model: str | None,
                         time_limit: float | None, extra: Sequence[Release] = ()) -> float | None:
        """The earliest time >= now at which node ``i`` can hold the job for its whole limit."""
        c = self.cluster
        if c.capacity(i, model) < gpus or c.total_cpus[i] < cpus or c.total_mem[i] < mem:
            return None
        p = self.profile(i, model, extra)
        times, gs, cs, ms = p.times, p.gpus, p.cpus, p.mem
        n = len(times)
        k = 0
        while k < n:
            if gs[k] < gpus or cs[k] < cpus or ms[k] < mem:
                k += 1
                continue
            end = INF if time_limit is None else times[k] + time_limit
            j = k + 1
            while j < n and times[j] < end and gs[j] >= gpus and cs[j] >= cpus and ms[j] >= mem:
                j += 1
            if j == n or times[j] >= end:
                return times[k]
            k = j + 1      # every start up to times[j] would overlap the shortfall at times[j]
        return None

    def windows(self, i: int, gpus: int, cpus: int, mem: int, model: str | None,
                time_limit: float | None) -> list[tuple[float, float]]:
        """The start times at which node ``i`` could hold the job for its whole limit, as
        closed intervals ``[a, b]`` in increasing order (``b`` is inf for the last one when
        the node stays free for ever).  Remembered until the node changes: the gangs of a
        queue repeat a few shapes, and each reservation changes only its own nodes.  The
        list is shared; callers must not change it."""
        key = (i, gpus, cpus, mem, model, time_limit)     # a gang search asks often
        hit = self._windows.get(key)
        version = self.versions.get(i, 0)
        if hit is None or hit[0] != version:
            hit = self._windows[key] = (version, self._windows_of(i, gpus, cpus, mem, model, time_limit))
        return hit[1]

    def _windows_of(self, i: int, gpus: int, cpus: int, mem: int, model: str | None,
                    time_limit: float | None) -> list[tuple[float, float]]:
        p = self.profile(i, model)
        times, gs, cs, ms = p.times, p.gpus, p.cpus, p.mem
        n = len(times)
        span = INF if time_limit is None else time_limit
        out: list[tuple[float, float]] = []
        k = 0
        while k < n:
            if gs[k] < gpus or cs[k] < cpus or ms[k] < mem:
                k += 1
                continue
            j = k + 1
            while j < n and gs[j] >= gpus and cs[j] >= cpus and ms[j] >= mem:
                j += 1
            end = times[j] if j < n else INF      # free enough over [times[k], end)
            last = INF if end == INF else end - span
            if last >= times[k]:
                out.append((times[k], last))
            k = j
        return out

    def _earliest_cached(self, i: int, gpus: int, cpus: int, mem: int, model: str | None,
                         time_limit: float | None) -> float | None:
        """earliest_on_node, remembered until the node changes (requests repeat a lot)."""
        key = (i, gpus, cpus, mem, model, time_limit)
        hit = self._exact.get(key)
        version = self.versions.get(i, 0)
        if hit is None or hit[0] != version:
            hit = self._exact[key] = (version, self.earliest_on_node(i, gpus, cpus, mem, model, time_limit))
        return hit[1]

    def no_delay(self, i: int, gpus: tuple[int, ...], cpus: int, mem: int, end: float) -> bool:
        """Whether starting a job now on node ``i`` (until ``end``) leaves every reservation whole."""
        c = self.cluster
        for r in self.reservations[i]:
            if r.overlaps(self.now, end):
                g, fc, fm = self.free_at(i, max(r.start, self.now), r.model)
                if g < c.count_matching(i, gpus, r.model) or fc < cpus or fm < mem:
                    return False
        return True

    # -- the earliest start anywhere -------------------------------------------------------------

    def _stream(self, partition: str, model: str | None, gpus: int) -> Iterator[tuple[float, int]]:
        """(lower bound on the start, node) for jobs of ``gpus`` GPUs, in increasing order:
        when running jobs alone would leave that many GPUs free.  Lazy, so a search that
        ends early never looks at most nodes."""
        c = self.cluster
        have: dict[int, int] = {}
        up, model_of, free = c.up, c.model_of, c.free
        for i in c.members.get(partition, ()):
            if not up[i]:
                continue
            if model is None:     # capacity and free_count, inlined: every node of the partition
                if len(model_of[i]) < gpus:
                    continue
                f = len(free[i])
            elif c.capacity(i, model) >= gpus:
                f = c.free_count(i, model)
            else:
                continue
            if f >= gpus:
                yield self.now, i
            else:
                have[i] = f
        for end, i, k in self._sorted_releases():
            f = have.get(i)
            if f is not None:
                f += c.count_matching(i, self.releases[i][k].gpus, model)
                if f >= gpus:
                    del have[i]
                    yield end, i
                else:
                    have[i] = f

    def _sorted_releases(self) -> list[tuple[float, int, int]]:
        """(end, node, index in its releases) of every finite release, by end; shared by streams."""
        events = self._events
        if events is not None and (self._added or self._moves):
            events = events + self._added     # a new list: a stream already running keeps its own
            events.sort()                     # two sorted runs and a few more: a merge
            for old, new, i, k in self._moves:
                if old < INF:
                    at = bisect.bisect_left(events, (old, i, k))
                    if at == len(events) or events[at] != (old, i, k):
                        events = None         # not where it should be (a bug): sort from scratch
                        break
                    del events[at]
                bisect.insort(events, (new, i, k))
        elif events is not None:
            return events
        if events is None:
            events = [(rel.end, i, k) for i, rels in enumerate(self.releases)
                      for k, rel in enumerate(rels) if rel.end < INF]
            events.sort()
        self._events, self._added, self._moves = events, [], []
        return events

    def first_instant(self, i: int, model: str | None, gpus: int) -> float:
        """The first time node ``i`` has ``gpus`` GPUs free at all: a bound for any job that size
        (remembered until the node changes: every search re-checks the nodes it takes)."""
        key = (i, model, gpus)                  # every node a search takes
        hit = self._firsts.get(key)
        version = self.versions.get(i, 0)
        if hit is None or hit[0] != version:
            hit = self._firsts[key] = (version, self._first_instant_of(i, model, gpus))
        return hit[1]

    def _first_instant_of(self, i: int, model: str | None, gpus: int) -> float:
        p = self.profile(i, model)
        for t, g in zip(p.times, p.gpus):
            if g >= gpus:
                return t
        return INF

    def by_bound(self, partition: str, model: str | None, gpus: int) -> Iterator[tuple[float, int]]:
        """(bound, node) for the nodes that could ever have ``gpus`` GPUs free, in increasing
        order of the first instant they do (a lower bound on any start there); shares the
        pruning state of ``earliest``, so close it (or run it out) before changing the timeline."""
        key = (partition, model, gpus)
        state = self._bounds.get(key)
        if state is None:
            state = self._bounds[key] = _Candidates([], self._stream(partition, model, gpus))
        seen: list[tuple[float, int]] = []
        pop, firsts, versions, first_of = state.pop, self._firsts, self.versions, self._first_instant_of
        try:
            while True:
                entry = pop()
                if entry is None:
                    break
                bound, i = entry
                hit = firsts.get((i, model, gpus))     # first_instant, inlined: every node taken
                if hit is None or hit[0] != versions.get(i, 0):
                    hit = firsts[(i, model, gpus)] = (versions.get(i, 0), first_of(i, model, gpus))
                tighter = hit[1]
                if tighter > bound:
                    if tighter < INF:
                        heapq.heappush(state.heap, (tighter, i))
                    continue
                seen.append((bound, i))
                yield bound, i
        finally:
            for entry in seen:
                heapq.heappush(state.heap, entry)

    def earliest(self, partition: str, gpus: int, cpus: int, mem: int, model: str | None,
                 time_limit: float | None) -> tuple[float, int] | None:
        """(time, node) of the earliest start for the job anywhere in its partition."""
        key = (partition, model, gpus)
        state = self._bounds.get(key)
        if state is None:
            state = self._bounds[key] = _Candidates([], self._stream(partition, model, gpus))
        heap = state.heap
        best: tuple[float, int] | None = None
        seen: list[tuple[float, int]] = []
        smallest, take, first = state.smallest, state.take_seen, self.first_instant
        while True:
            entry = smallest()
            if entry is None or (best is not None and entry[0] >= best[0]):
                break
            take(entry)
            bound, i = entry
            tighter = first(i, model, gpus)
            if tighter > bound:      # reservations moved this node later: re-file it
                if tighter < INF:
                    heapq.heappush(heap, (tighter, i))
                continue
            seen.append((bound, i))
            t = self._earliest_cached(i, gpus, cpus, mem, model, time_limit)
            if t is not None and (best is None or (t, i) < best):
                best = (t, i)
        for entry in seen:
            heapq.heappush(heap, entry)
        return best


class _Candidates:
    """Nodes for one request size: a heap of re-filed nodes merged with a lazy sorted stream."""

    def __init__(self, heap: list[tuple[float, int]], stream: Iterator[tuple[float, int]]) -> None:
        self.heap, self.stream = heap, stream
        self.peek: tuple[float, int] | None = None
        self.done = False

    def smallest(self) -> tuple[float, int] | None:
        if self.peek is None and not self.done:
            self.peek = next(self.stream, None)
            self.done = self.peek is None
        if self.heap and (self.peek is None or self.heap[0] < self.peek):
            return self.heap[0]
        return self.peek

    def take_seen(self, entry: tuple[float, int]) -> None:
        """Take ``entry``, which ``smallest`` has just returned."""
        if entry is self.peek:
            self.peek = None
        else:
            heapq.heappop(self.heap)

    def pop(self) -> tuple[float, int] | None:
        """``smallest`` and ``take_seen`` in one (the stream is read at the same point)."""
        peek = self.peek
        if peek is None and not self.done:
            peek = self.peek = next(self.stream, None)
            self.done = peek is None
        heap = self.heap
        if heap and (peek is None or heap[0] < peek):
            return heapq.heappop(heap)
        self.peek = None
        return peek


def _contains(sorted_list: Sequence[int], x: int) -> bool:
    k = bisect.bisect_left(sorted_list, x)
    return k < len(sorted_list) and sorted_list[k] == x
