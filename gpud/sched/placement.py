"""Free capacity now, per node, and where a job fits: best-fit bin-packing or spread.

Theory of operation
-------------------
``Cluster`` starts from the snapshot's nodes minus what running jobs hold (a stopping job
still holds its resources until it exits) and is then mutated by the pass as it starts
jobs, so it always says what is free *now*.  Nothing is ever allocated beyond a node's
GPUs, CPUs or memory: a start takes specific free GPU indices and subtracts CPUs and memory
that the search (``finder``) checked.

Search is indexed.  For each (partition, GPU model filter) in use, a ``FreeIndex`` keeps
the partition's schedulable nodes in buckets by how many matching GPUs they have free.  A
job needing ``g`` GPUs looks at buckets ``g, g+1, ...`` (``binpack``: the fullest node that
fits, which keeps whole nodes free for big jobs) or from the top down (``spread``), so a
search touches only nodes that have enough GPUs; within a bucket, nodes keep a
deterministic order.  The search also takes a veto (backfill: "would this delay a
reservation?") that is consulted only for nodes that carry reservations.

Topology.  On a node whose GPUs report NVLink peers or NUMA nodes, ``pick`` takes GPUs from
one island when one has room (best fit), else from the fewest, with NUMA nodes as the next
tiebreak (topology.py); elsewhere it takes the lowest free indices.  Among nodes that are
equally good for binpack or spread (one bucket), the search prefers one where the job fits in
one island.  Clusters without topology data take none of these paths.

Gangs and exclusive jobs.  A running gang job holds its share on every node it spans
(``RunningJob.parts``).  An exclusive job holds its whole node: everything left on it once
the other running jobs are counted, so nothing else is placed there while it runs
(``held`` says what each running job holds where; the timeline releases exactly that).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Callable, Sequence

from .config import SchedConfig
from .snapshot import NodeView, RunningJob
from .topology import NodeTopology, topology_of

Holding = tuple[int, tuple[int, ...], int, int]              # (node, GPUs, CPUs, memory)

Shape = tuple[bool, int, int, tuple[tuple[str, int], ...]]   # (up, cpus, mem, GPUs per model)


class FreeIndex:
    """Schedulable nodes of one partition bucketed by free GPUs (of one model, or any)."""

    def __init__(self, cluster: "Cluster", partition: str, model: str | None) -> None:
        self.model = model
        members = [i for i in cluster.members.get(partition, ())
                   if cluster.up[i] and (model is None or model in cluster.model_set[i])]
        self.maxk = max((cluster.capacity(i, model) for i in members), default=0)
        self.buckets: list[dict[int, None]] = [{} for _ in range(self.maxk + 1)]
        self.where: dict[int, int] = {}
        for i in members:
            k = cluster.free_count(i, model)
            self.buckets[k][i] = None
            self.where[i] = k
            cluster.node_indexes[i].append(self)

    def move(self, i: int, k: int) -> None:
        old = self.where[i]
        if old != k:
            del self.buckets[old][i]
            self.buckets[k][i] = None
            self.where[i] = k

    def most_free(self) -> int:
        for k in range(self.maxk, -1, -1):
            if self.buckets[k]:
                return k
        return -1


class Cluster:
    def __init__(self, nodes: Sequence[NodeView], running: Sequence[RunningJob], cfg: SchedConfig) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.name)
        self.pos = {n.name: i for i, n in enumerate(self.nodes)}
        self.up = [n.schedulable for n in self.nodes]
        # whole GPUs only: MIG, MPS and time-sliced GPUs are handed out by shared.py, slices.py and
        # shares.py, except
        # that an mps:dynamic GPU is also a whole GPU here while no share holds it
        self.model_of = [{g.index: g.model for g in n.gpus   # gpustate.serves_whole, inlined
                          if g.mode == "whole" or (g.dynamic and g.mode == "mps")} for n in self.nodes]
        self.model_set = [frozenset(m.values()) for m in self.model_of]
        self.mixed = [len(ms) > 1 for ms in self.model_set]
        self.total_cpus = [n.cpus for n in self.nodes]
        self.total_mem = [n.mem_mb for n in self.nodes]
        taken: list[set[int]] = [set() for _ in self.nodes]
        self.cpus = list(self.total_cpus)
        self.mem = list(self.total_mem)
        self.exclusive: set[int] = set()          # nodes an exclusive job holds whole
        self._held: dict[int, list[Holding]] = {}
        pos, free_cpus, free_mem = self.pos, self.cpus, self.mem
        exclusive_jobs = []
        for r in running:
            if r.exclusive:
                exclusive_jobs.append(r)      # they take what is left, once the rest is counted
                continue
            i = pos.get(r.node)
            if i is not None:
                taken[i].update(r.gpu_indices)
                if r.devices:          # an MPS share on an mps:dynamic GPU keeps it from whole jobs
                    taken[i].update(d.index for d in r.devices if d.kind == "mps")
                free_cpus[i] -= r.cpus
                free_mem[i] -= r.mem_mb
            if not r.parts:
                continue                      # held() derives it: no list per job on big clusters
            held = self._held[r.job_id] = [] if i is None else [(i, r.gpu_indices, r.cpus, r.mem_mb)]
            for p in r.parts:
                k = pos.get(p.node)
                if k is not None:
                    taken[k].update(p.gpu_indices)
                    free_cpus[k] -= p.cpus
                    free_mem[k] -= p.mem_mb
                    held.append((k, p.gpu_indices, p.cpus, p.mem_mb))
        for r in exclusive_jobs:
            held = self._held[r.job_id] = []
            for node, gpus, cpus, mem in ((r.node, r.gpu_indices, r.cpus, r.mem_mb),
                                          *((p.node, p.gpu_indices, p.cpus, p.mem_mb) for p in r.parts)):
                i = pos.get(node)
                if i is None:
                    continue
                gpus = tuple(sorted(set(gpus) | (self.model_of[i].keys() - taken[i])))
                cpus, mem = max(cpus, free_cpus[i]), max(mem, free_mem[i])
                self.exclusive.add(i)
                taken[i].update(gpus)
                free_cpus[i] -= cpus
                free_mem[i] -= mem
                held.append((i, gpus, cpus, mem))
        self.free = [sorted([g for g in m if g not in t]) if t else sorted(m) for m, t in zip(self.model_of, taken)]
        self.members: dict[str, list[int]] = {}
        for name, p in cfg.partitions.items():
            if "*" in p.nodes:
                self.members[name] = list(range(len(self.nodes)))
            else:
                self.members[name] = [i for i, n in enumerate(self.nodes)
                                      if any(fnmatchcase(n.name, pat) for pat in p.nodes)]
        self.topology: list[NodeTopology | None] = [topology_of(n.gpus) for n in self.nodes]
        self.any_topology = any(t is not None for t in self.topology)
        self.node_indexes: list[list[FreeIndex]] = [[] for _ in self.nodes]
        self._indexes: dict[tuple[str, str | None], FreeIndex] = {}
        self._shapes: dict[str, list[Shape]] = {}
        self.watch: Callable[[int], None] | None = None    # told of every node that changes

    def held(self, r: RunningJob) -> list[Holding]:
        """What running job ``r`` holds on each node it spans (nodes not in the snapshot left out)."""
        held = self._held.get(r.job_id)
        if held is not None:
            return held
        i = self.pos.get(r.node)
        return [] if i is None else [(i, r.gpu_indices, r.cpus, r.mem_mb)]

    def idle(self, i: int) -> bool:
        """Nothing runs on node ``i`` (what an exclusive job needs)."""
        return (len(self.free[i]) == len(self.model_of[i]) and self.cpus[i] == self.total_cpus[i]
                and self.mem[i] == self.total_mem[i])

    # -- counting ------------------------------------------------------------------------------

    def capacity(self, i: int, model: str | None) -> int:
        m = self.model_of[i]
        return len(m) if model is None else sum(1 for x in m.values() if x == model)

    def free_count(self, i: int, model: str | None) -> int:
        if model is None:
            return len(self.free[i])
        m = self.model_of[i]
        return sum(1 for g in self.free[i] if m[g] == model)

    def count_matching(self, i: int, gpus: Sequence[int], model: str | None) -> int:
        if model is None:
            return len(gpus)
        if not self.mixed[i]:
            return len(gpus) if model in self.model_set[i] else 0
        m = self.model_of[i]
        return sum(1 for g in gpus if m.get(g) == model)

    def max_gpus(self, partition: str) -> int:
        """The most GPUs any node of the partition has (the biggest job it can hold)."""
        return max((len(self.model_of[i]) for i in self.members.get(partition, ())), default=0)

    def feasibility(self, partition: str, gpus: int, cpus: int, mem: int, model: str | None) -> str:
        """"ok" if some schedulable node could ever hold the job, "down" if only nodes that
        are down or drained could (or the partition has no nodes yet), "never" if none could."""
        shapes = self._shapes.get(partition)
        if shapes is None:
            models_of: dict[tuple[str, ...], tuple[tuple[str, int], ...]] = {}   # nodes mostly look alike
            found = set()
            for i in self.members.get(partition, ()):
                kinds = tuple(self.model_of[i].values())
                models = models_of.get(kinds)
                if models is None:
                    models = models_of[kinds] = tuple(sorted((mo, self.capacity(i, mo)) for mo in self.model_set[i]))
                found.add((self.up[i], self.total_cpus[i], self.total_mem[i], models))
            shapes = self._shapes[partition] = sorted(found, reverse=True)
        verdict = "never" if shapes else "down"
        for up, c, m, models in shapes:
            have = sum(n for _, n in models) if model is None else dict(models).get(model, 0)
            if have >= gpus and c >= cpus and m >= mem:
                if up:
                    return "ok"
                verdict = "down"
        return verdict

    # -- search and allocation -----------------------------------------------------------------

    def index(self, partition: str, model: str | None) -> FreeIndex:
        key = (partition, model)
        idx = self._indexes.get(key)
        if idx is None:
            idx = self._indexes[key] = FreeIndex(self, partition, model)
        return idx

    def finder(self, partition: str, gpus: int, cpus: int, mem: int, model: str | None, policy: str,
               vetoed: set[int], veto: Callable[[int], bool],
               versions: dict[int, int]) -> Callable[[], tuple[int | None, bool]]:
        """The placement search for one request, to be asked again as the pass goes on: each
        call gives (node index or None, whether a node had room but was vetoed).  The buckets
        to look in are chosen once (they are updated in place as nodes fill).  Each node's
        veto is remembered until its number in ``versions`` (node -> a number that changes
        whenever the node does) changes: a busy queue walks past the same reserved nodes on
        every search."""
        memo: dict[int, tuple[int, bool]] = {}     # node -> (version, vetoed)

        def remembered(i: int) -> bool:
            version = versions.get(i, 0)
            hit = memo.get(i)
            if hit is None or hit[0] != version:
                hit = memo[i] = (version, veto(i))
            return hit[1]
        idx = self.index(partition, model)
        if gpus > idx.maxk:
            return lambda: (None, False)
        ks = range(gpus, idx.maxk + 1) if policy == "binpack" else range(idx.maxk, gpus - 1, -1)
        if self.any_topology and gpus > 1:
            return lambda: self._find_by_island(idx, ks, gpus, cpus, mem, model, vetoed, remembered)
        buckets = [idx.buckets[k] for k in ks]
        free_cpus, free_mem = self.cpus, self.mem

        def find() -> tuple[int | None, bool]:
            blocked = False
            for bucket in buckets:
                for i in bucket:
                    if free_cpus[i] >= cpus and free_mem[i] >= mem:
                        if i in vetoed:         # remembered(i), inlined
                            hit = memo.get(i)
                            if hit is None or hit[0] != versions.get(i, 0):
                                hit = memo[i] = (versions.get(i, 0), veto(i))
                            if hit[1]:
                                blocked = True
                                continue
                        return i, blocked
            return None, blocked
        return find

    def _find_by_island(self, idx: FreeIndex, ks: range, gpus: int, cpus: int, mem: int, model: str | None,
                        vetoed: set[int], veto: Callable[[int], bool]) -> tuple[int | None, bool]:
        """The search where nodes report topology: within a bucket, a node where the job fits
        in one NVLink island comes before one where it would span islands."""
        blocked = False
        for k in ks:
            fallback = None
            for i in idx.buckets[k]:
                if self.cpus[i] >= cpus and self.mem[i] >= mem:
                    if i in vetoed and veto(i):
                        blocked = True
                        continue
                    if not self.fits_one_island(i, gpus, model):
                        if fallback is None:
                            fallback = i
                        continue
                    return i, blocked
            if fallback is not None:
                return fallback, blocked
        return None, blocked

    def matching_free(self, i: int, model: str | None) -> list[int]:
        if model is None:
            return self.free[i]
        m = self.model_of[i]
        return [g for g in self.free[i] if m[g] == model]

    def fits_one_island(self, i: int, gpus: int, model: str | None) -> bool:
        t = self.topology[i]
        return t is None or t.fits_one_island(self.matching_free(i, model), gpus)

    def pick(self, i: int, gpus: int, model: str | None) -> tuple[int, ...]:
        """The GPUs a start on node ``i`` would take: one NVLink island when the node's
        topology is known and one has room (see topology.py), else the lowest free indices."""
        t = self.topology[i]
        if t is None or gpus <= 0:
            if model is None:
                return tuple(self.free[i][:gpus])
            m = self.model_of[i]
            return tuple([g for g in self.free[i] if m[g] == model][:gpus])
        return t.pick(self.matching_free(i, model), gpus)

    def take(self, i: int, gpus: int, model: str | None, cpus: int, mem: int) -> tuple[int, ...]:
        """``pick`` and ``allocate`` in one: the GPUs taken.  Without topology or a model the
        lowest free indices are a slice of the sorted free list (every start comes here)."""
        if model is not None or self.topology[i] is not None:
            taken = self.pick(i, gpus, model)
            self.allocate(i, taken, cpus, mem)
            return taken
        free = self.free[i]
        if cpus > self.cpus[i] or mem > self.mem[i]:
            raise AssertionError(f"over-allocation on {self.nodes[i].name}")  # a bug, never input
        taken, left = tuple(free[:gpus]), free[gpus:]
        self.free[i] = left
        self.cpus[i] -= cpus
        self.mem[i] -= mem
        for idx in self.node_indexes[i]:         # idx.move, inlined
            k = len(left) if idx.model is None else self.free_count(i, idx.model)
            old = idx.where[i]
            if old != k:
                del idx.buckets[old][i]
                idx.buckets[k][i] = None
                idx.where[i] = k
        if self.watch is not None:
            self.watch(i)
        return taken

    def allocate(self, i: int, gpu_indices: tuple[int, ...], cpus: int, mem: int) -> None:
        taken = set(gpu_indices)
        left = [g for g in self.free[i] if g not in taken]
        if len(left) + len(taken) != len(self.free[i]) or cpus > self.cpus[i] or mem > self.mem[i]:
            raise AssertionError(f"over-allocation on {self.nodes[i].name}")  # a bug, never input
        self.free[i] = left
        self.cpus[i] -= cpus
        self.mem[i] -= mem
        for idx in self.node_indexes[i]:
            idx.move(i, len(left) if idx.model is None else self.free_count(i, idx.model))
        if self.watch is not None:
            self.watch(i)
