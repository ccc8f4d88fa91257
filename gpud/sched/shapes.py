"""Placement by the fragmentation a start leaves for the request shapes the cluster sees.

Theory of operation
-------------------
Best fit looks at one job at a time: the fullest node that holds it.  What it cannot see is
that the GPUs it leaves behind may be useless to the jobs that come next: half a GPU beside
exhausted CPUs, three free GPUs where every waiting job wants four, a fraction too small for
any share in the queue.  ``placement = "shapes"`` instead scores each node that could hold
a job by how much *usable* capacity the start would cost the cluster, for the requests it
expects (the idea of the FGD paper, Weng et al., USENIX ATC '23, in gpud's terms).

Demand.  The request shapes (CPUs, memory, whole GPUs or a share's GPU memory) of the
pending queue, and of running jobs, weighing half as much per ``DEMAND_HALF_LIFE`` since
they started (recent history, decayed); a job weighs one plus the square root of the GPUs
it asks for (``_weight``); the ``MAX_SHAPES`` heaviest shapes, as shares of one
(``Demand``).  The job being placed is in the queue, so the demand is never empty.

Fragments.  For one shape and one node, the node's free GPU capacity (whole free GPUs count
one, an MPS GPU its free memory over its memory) is *fragmented* when the shape cannot use
it: all of it when the shape does not fit the node at all (too few CPUs, memory, whole
GPUs, or no GPU with room for its share), else the GPUs that are free but too small for
it (a partly shared GPU for a whole-GPU shape, a GPU with less free memory than the share).
A node's fragmentation is the demand-weighted sum over shapes.  A start goes where it
raises that sum least; ties go to the node left with the least free GPU capacity, then the
fewest free CPUs and memory (best fit), then node order.  A share goes, on that node, to
the GPU whose use raises it least.

Only the score is new: which nodes may take a job (partition, CPUs, memory, GPU model,
reservations, exclusive nodes, MPS rules) is decided exactly as for binpack, and the start
is made by the same ``Cluster``/``Shares`` code.  Nodes in the same state get the same
score, so nodes are kept grouped by state (``ShapeIndex``) and each group is scored once
per request shape until one of its nodes changes: a search costs the number of distinct
node states, not nodes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from .snapshot import PendingJob, RunningJob

if TYPE_CHECKING:
    from .placement import Cluster
    from .gpustate import GpuState

DEMAND_HALF_LIFE = 86400.0    # a running job's shape weighs half as much a day after its start
MAX_SHAPES = 256              # the heaviest shapes kept (the openb pod list has 151)

# one GPU in a node's state: (model, free MiB, memory MiB, takes a whole job, takes shares)
Entry = tuple[str, int, int, bool, bool]
State = tuple[int, int, tuple[Entry, ...]]          # (free CPUs, free memory, GPUs with room)
Shape = tuple[int, int, int, int]                   # (CPUs, memory, whole GPUs, share MiB)


class Demand:
    """The request shapes expected, with their weights (summing to one)."""

    def __init__(self, weights: dict[Shape, float], limit: int = MAX_SHAPES) -> None:
        top = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        total = sum(w for _, w in top) or 1.0
        self.shapes = tuple((s, w / total) for s, w in top)
        # by GPU need (whole GPUs, share MiB): the (CPUs, memory, weight) of its shapes
        by_need: dict[tuple[int, int], list[tuple[int, int, float]]] = defaultdict(list)
        for (cpus, mem, k, want), p in self.shapes:
            by_need[(k, want)].append((cpus, mem, p))
        self.needs = tuple((need, tuple(v)) for need, v in sorted(by_need.items()))

    @classmethod
    def of(cls, pending: Iterable[PendingJob], running: Iterable[RunningJob], now: float,
           gpu_memory_mb: int) -> "Demand":
        """From the queue and running jobs (module docstring); ``gpu_memory_mb`` turns a
        share's memory into a fraction of a GPU (``_weight``)."""
        w: dict[Shape, float] = defaultdict(float)
        per_gpu = max(1, gpu_memory_mb)
        for j in pending:
            s = job_shape(j)
            if s is not None and not j.held:
                w[s] += _weight(s, per_gpu)
        for r in running:
            if r.parts or r.exclusive:
                continue
            mem_share = next((d.mem_mb or 0 for d in r.devices if d.kind == "mps"), 0)
            if r.devices and not mem_share:
                continue                      # a MIG slice or time-slice: not scored here
            s = (r.cpus, r.mem_mb, 0 if mem_share else len(r.gpu_indices), mem_share)
            w[s] += _weight(s, per_gpu) * 0.5 ** (max(0.0, now - r.start_time) / DEMAND_HALF_LIFE)
        return cls(w)


def _weight(s: Shape, per_gpu: int) -> float:
    """What one job of shape ``s`` weighs: one, plus the square root of the GPUs it asks for
    (a share: its memory over a GPU's).  Stranding what an 8-GPU job needs costs more than
    what a CPU-only job needs, but not eight times more: big jobs are few, and a score led
    by them leaves the many small ones the gaps (on the openb protocol the root beats both
    counting jobs alone, 94.9 %, and weighing them by their GPUs, 95.3 %, seeds 42-45)."""
    return 1.0 + (s[2] + s[3] / per_gpu) ** 0.5


def job_shape(j: PendingJob) -> Shape | None:
    """A single-node job's shape; None for MIG slices, gangs and whole-node jobs."""
    if j.mig_profile is not None or j.nodes != 1 or j.exclusive:
        return None
    if j.gpu_mem_mb is not None:
        return (j.cpus, j.mem_mb, 0, j.gpu_mem_mb)
    return (j.cpus, j.mem_mb, j.gpus, 0)


class Fragments:
    """A node state's fragmentation for a demand (module docstring), remembered per state."""

    def __init__(self, demand: Demand) -> None:
        self.demand = demand
        self._frag: dict[State, float] = {}
        self._gpu_part: dict[tuple[Entry, ...], tuple[float, tuple[tuple[int, float], ...]]] = {}

    def frag(self, s: State) -> float:
        """The demand-weighted free GPU capacity the shapes cannot use on a node in state ``s``."""
        hit = self._frag.get(s)
        if hit is not None:
            return hit
        cpus, mem, entries = s
        total, gains = self._gpu(entries)
        f = total
        needs = self.demand.needs
        for r, gain in gains:           # the shapes of need r that fit use ``gain`` of it
            for c, m, p in needs[r][1]:
                if c <= cpus and m <= mem:
                    f -= p * gain
        if len(self._frag) > 200_000:
            self._frag.clear()
        self._frag[s] = f
        return f

    def _gpu(self, entries: tuple[Entry, ...]) -> tuple[float, tuple[tuple[int, float], ...]]:
        """(free GPU capacity, and per need the GPUs can serve: the capacity it can use)."""
        hit = self._gpu_part.get(entries)
        if hit is not None:
            return hit
        total = sum(e[1] / e[2] for e in entries)
        gains = []
        for r, ((k, want), _) in enumerate(self.demand.needs):
            if k:
                if sum(1 for e in entries if e[3]) >= k:
                    gains.append((r, sum(e[1] / e[2] for e in entries if e[3])))
            elif want:
                usable = sum(e[1] / e[2] for e in entries if e[4] and e[1] >= want)
                if usable:
                    gains.append((r, usable))
            else:
                gains.append((r, total))          # CPU-only: uses no GPU, strands none
        hit = self._gpu_part[entries] = (total, tuple(gains))
        return hit


def free_capacity(s: State) -> float:
    """A node state's free GPU capacity, in GPUs."""
    return sum(e[1] / e[2] for e in s[2])


class ShapeIndex:
    """Nodes grouped by state, and the fragmentation scores of starts on them."""

    def __init__(self, cluster: "Cluster", shared: dict[int, list["GpuState"]], demand: Demand) -> None:
        self.c, self.demand = cluster, demand
        self.shared = {(i, g.index): g for i, gs in shared.items() for g in gs}
        self.views = [{v.index: v for v in n.gpus} for n in cluster.nodes]
        self.key: list[State | None] = [None] * len(cluster.nodes)
        self.groups: dict[State, dict[int, None]] = {}
        self.frag = Fragments(demand).frag
        self._delta: dict[tuple, tuple | None] = {}
        for i in range(len(cluster.nodes)):
            if cluster.up[i]:
                self._file(i)

    # -- node states ---------------------------------------------------------------------------

    def state(self, i: int) -> State:
        c = self.c
        free = c.free[i]
        whole = c.model_of[i]
        entries: list[Entry] = []
        for v in c.nodes[i].gpus:
            if v.index in whole:
                if v.index in free:
                    entries.append((v.model, v.memory_mb, v.memory_mb, True, v.dynamic))
                    continue
                if not v.dynamic:
                    continue                  # held whole
            if v.mode != "mps":
                continue
            g = self.shared.get((i, v.index))
            if g is None or (v.dynamic and not g.clients) or len(g.clients) >= v.mps_max_clients:
                continue
            left = v.memory_mb - g.mem_used()
            if left > 0:
                entries.append((v.model, left, v.memory_mb, False, True))
        return (c.cpus[i], c.mem[i], tuple(sorted(entries)))

    def _file(self, i: int) -> None:
        k = self.state(i)
        self.key[i] = k
        self.groups.setdefault(k, {})[i] = None

    def touch(self, i: int) -> None:
        """Node ``i`` changed (a start): move it to its new group."""
        old = self.key[i]
        if old is None:
            return
        grp = self.groups[old]
        del grp[i]
        if not grp:
            del self.groups[old]
        self._file(i)

    # -- scores --------------------------------------------------------------------------------

    def whole_after(self, s: State, gpus: int, cpus: int, mem: int, model: str | None) -> State | None:
        """State ``s`` after a start of ``gpus`` whole GPUs (None: it does not fit)."""
        c0, m0, entries = s
        if cpus > c0 or mem > m0:
            return None
        if gpus == 0:
            return (c0 - cpus, m0 - mem, entries)
        # whole-only GPUs go first, so an mps:dynamic one stays free for shares
        order = sorted(range(len(entries)), key=lambda x: (entries[x][4], x))
        take = [x for x in order if entries[x][3] and (model is None or entries[x][0] == model)][:gpus]
        if len(take) < gpus:
            return None
        gone = set(take)
        return (c0 - cpus, m0 - mem, tuple(e for x, e in enumerate(entries) if x not in gone))

    def share_after(self, s: State, want: int, cpus: int, mem: int, model: str | None) -> list[tuple[Entry, State]]:
        """For each distinct GPU of state ``s`` with room for a ``want`` MiB share, the state after."""
        c0, m0, entries = s
        if cpus > c0 or mem > m0:
            return []
        out = []
        seen = set()
        for x, e in enumerate(entries):
            if not e[4] or e[1] < want or e in seen or (model is not None and e[0] != model):
                continue
            seen.add(e)
            left = e[1] - want
            rest = entries[:x] + entries[x + 1:]
            if left > 0:
                rest = tuple(sorted(rest + ((e[0], left, e[2], False, True),)))
            out.append((e, (c0 - cpus, m0 - mem, rest)))
        return out

    def _score(self, s: State, after: State) -> tuple:
        """(rise in fragmentation, then best fit: free GPU capacity, CPUs, memory left)."""
        return (round(self.frag(after) - self.frag(s), 9), round(free_capacity(after), 9), after[0], after[1])

    def ranked_whole(self, gpus: int, cpus: int, mem: int, model: str | None) -> list[tuple[tuple, State]]:
        """The node states that could take the start, best first."""
        out = []
        delta = self._delta
        for s in self.groups:
            key = ("w", s, gpus, cpus, mem, model)
            hit = delta.get(key, False)
            if hit is False:
                after = self.whole_after(s, gpus, cpus, mem, model)
                hit = delta[key] = None if after is None else self._score(s, after)
            if hit is not None:
                out.append((hit, s))
        out.sort(key=lambda t: t[0])
        return out

    def ranked_share(self, want: int, cpus: int, mem: int, model: str | None) -> list[tuple[tuple, State, list]]:
        """The node states that could take a ``want`` MiB share, best first, each with its
        GPUs (entries) in order of preference."""
        out = []
        delta = self._delta
        for s in self.groups:
            key = ("s", s, want, cpus, mem, model)
            hit = delta.get(key, False)
            if hit is False:
                options = sorted((self._score(s, after), e) for e, after in self.share_after(s, want, cpus, mem, model))
                hit = delta[key] = (options[0][0], [e for _, e in options]) if options else None
            if hit is not None:
                out.append((hit[0], s, hit[1]))
        out.sort(key=lambda t: t[0])
        return out

    # -- searches --------------------------------------------------------------------------------

    def finder(self, members: Sequence[int], gpus: int, cpus: int, mem: int, model: str | None,
               vetoed: set[int], veto: Callable[[int], bool]) -> Callable[[], tuple[int | None, bool]]:
        """A whole-GPU (or CPU-only) search, as ``Cluster.finder`` gives: (node, vetoed any)."""
        allowed = frozenset(members)
        c = self.c

        def find() -> tuple[int | None, bool]:
            blocked = False
            for _, s in self.ranked_whole(gpus, cpus, mem, model):
                for i in self.groups[s]:
                    if i not in allowed or i in c.exclusive:
                        continue
                    if i in vetoed and veto(i):
                        blocked = True
                        continue
                    return i, blocked
            return None, blocked
        return find

    def gpu_for_share(self, want: int, cpus: int, mem: int, model: str | None,
                      ok: Callable[["GpuState"], bool]) -> "GpuState | None":
        """The MPS GPU a ``want`` MiB share should take: on the best node state's first node
        where one of the preferred GPUs passes ``ok`` (MPS rules, claims, node checks)."""
        for _, s, prefs in self.ranked_share(want, cpus, mem, model):
            for i in self.groups[s]:
                gs = [self.shared.get((i, v.index)) for v in self.c.nodes[i].gpus]
                for e in prefs:
                    for g in gs:
                        if g is not None and self._entry_of(i, g) == e and ok(g):
                            return g
        return None

    def _entry_of(self, i: int, g: "GpuState") -> Entry | None:
        v = g.view
        if v.dynamic and not g.clients:
            return (v.model, v.memory_mb, v.memory_mb, True, True) if v.index in self.c.free[i] else None
        return (v.model, v.memory_mb - g.mem_used(), v.memory_mb, False, True)
