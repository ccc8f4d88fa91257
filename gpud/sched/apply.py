"""Applying a plan: which of its decisions still hold against the cluster as it is now.

Theory of operation
-------------------
The core plans against a snapshot; the plan is applied to the cluster as it is when the
plan comes back.  The head runs the core on a thread while jobs end, are cancelled and
nodes come and go; the simulator and the tests' toy clusters apply plans as the head does.
``apply_plan`` is the one re-check they share: given the state (``Holdings``: what each node
has and what jobs hold of it) and a plan, it returns the decisions that hold, a reason for
each that does not, and the state with the starts that hold now held.

What is held, per node (``Held``): whole GPUs by index (and so which GPUs can still be
given whole: ``whole`` GPUs, and ``mps:dynamic`` ones while no share holds them), CPUs and
memory, MIG slices by their memory slots, each MPS or time-sliced GPU's clients (user,
pinned memory), how many jobs hold anything there and whether one is exclusive.  A job
holds what it was given until it exits: a job being stopped (preempted, COMPLETING) still
holds, so a preemption frees nothing in the plan that makes it.  The core plans so: a job
waiting for its victims starts in a later pass.

A start holds when its job is pending and not held, started once in the plan, and given as
many nodes as it asks for, each named once; and on each of them (rank 0 and every part of
a gang):

* the node is known and up; no exclusive job holds it; an exclusive job finds it empty;
* its CPUs and memory are free;
* its whole GPUs exist, are named once, are as many as it asks per node (a whole-GPU
  request), are of its GPU type, and are free to be given whole;
* each slice or share exists as planned and is free: a MIG slice is still on its GPU with
  that UUID and overlaps no slice in use; an MPS GPU has a client left, no other user and
  the memory for the share; a time-sliced GPU has a replica left; neither is held whole.

Starts are checked in plan order, each against the state with the earlier ones held, so of
two starts that want one GPU the first wins.  A re-layout holds when its GPU is a dynamic
MIG GPU of an up node, re-laid once in the plan, and every slice it destroys is there and
free once the plan's starts are held.  A preemption holds when its victim runs, is not
already being stopped and is preempted once in the plan.

``Refusal.gone`` tells the ordinary race (the job or node is no longer there, or the job
already stops) from a plan that does not fit: the head logs only the latter.

``Holdings`` counts a node only when it is first asked about (``node``): a head pass that
starts a few jobs on a large cluster counts those few nodes.  The simulator keeps one for
its whole run, holding and releasing jobs as they start and end.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

from ..gpu import mig
from .gpustate import catalog, serves_whole
from .plan import Plan, Preemption, Relayout, Start
from .snapshot import Device, GpuView, NodeView, PendingJob, RunningJob

# One node's share of a job: (node, whole GPU indices, CPUs, memory, slices and shares)
Piece = tuple[str, tuple[int, ...], int, int, tuple[Device, ...]]
Decision = Union[Start, Preemption, Relayout]


def pieces(x: Start | RunningJob) -> tuple[Piece, ...]:
    """Each node's share of a start or a running job, rank 0 first (its devices with it)."""
    first = (x.node, tuple(x.gpu_indices), x.cpus, x.mem_mb, tuple(x.devices))
    if not x.parts:
        return (first,)
    return (first, *((p.node, tuple(p.gpu_indices), p.cpus, p.mem_mb, ()) for p in x.parts))


class Held:
    """One node: what it has (``view``) and what jobs hold of it now."""

    __slots__ = ("view", "gpus", "free", "whole", "cpus", "mem_mb", "slices", "clients", "jobs", "exclusive")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.gpus: dict[int, GpuView] = {g.index: g for g in view.gpus}
        # GPUs that can be given whole now; one set for the node's life (the simulator reads it)
        self.free: set[int] = {g.index for g in view.gpus if serves_whole(g)}
        self.whole: set[int] = set()                        # GPUs held whole
        self.cpus = view.cpus                               # CPUs free
        self.mem_mb = view.mem_mb                           # memory free
        self.slices: dict[int, dict[int, int]] = {}         # MIG GPU -> held slice's start -> its slots
        self.clients: dict[int, list[tuple[int, str, int]]] = {}  # MPS/time-slice GPU -> (job, user, memory)
        self.jobs = 0                                       # jobs holding anything here
        self.exclusive = 0                                  # exclusive ones among them

    def renew(self, view: NodeView) -> None:
        """The node's GPUs as it reports them now (a re-layout made or removed slices); what
        is held stays held."""
        self.view = view
        self.gpus = {g.index: g for g in view.gpus}

    # -- holding ------------------------------------------------------------------------------

    def take(self, job_id: int, user: str, exclusive: bool, piece: Piece) -> None:
        _, gpus, cpus, mem, devices = piece
        for i in gpus:
            self.whole.add(i)
            self.free.discard(i)
        for d in devices:
            if d.kind == "gpu":
                self.whole.add(d.index)
                self.free.discard(d.index)
            elif d.kind == "mig" and d.slice_start is not None:
                self.slices.setdefault(d.index, {})[d.slice_start] = self._slots(d)
            elif d.kind in ("mps", "timeslice"):
                self.clients.setdefault(d.index, []).append((job_id, user, d.mem_mb or 0))
                self.free.discard(d.index)          # an mps:dynamic GPU is shares or whole, never both
        self.cpus -= cpus
        self.mem_mb -= mem
        self.jobs += 1
        if exclusive:
            self.exclusive += 1

    def give_back(self, job_id: int, exclusive: bool, piece: Piece) -> None:
        _, gpus, cpus, mem, devices = piece
        returned = list(gpus)
        for d in devices:
            if d.kind == "gpu":
                returned.append(d.index)
            elif d.kind == "mig" and d.slice_start is not None:
                self.slices.get(d.index, {}).pop(d.slice_start, None)
            elif d.kind in ("mps", "timeslice"):
                left = [c for c in self.clients.get(d.index, ()) if c[0] != job_id]
                if left:
                    self.clients[d.index] = left
                else:
                    self.clients.pop(d.index, None)
                    returned.append(d.index)
        self.whole.difference_update(gpus)
        self.whole.difference_update(d.index for d in devices if d.kind == "gpu")
        for i in returned:
            g = self.gpus.get(i)
            if g is not None and serves_whole(g) and i not in self.whole and not self.clients.get(i):
                self.free.add(i)
        self.cpus += cpus
        self.mem_mb += mem
        self.jobs -= 1
        if exclusive:
            self.exclusive -= 1

    def _slots(self, d: Device) -> int:
        """The memory slots slice ``d`` takes, as a bit mask (0 when its profile is unknown)."""
        g = self.gpus.get(d.index)
        if g is None or d.slice_start is None:
            return 0
        profile = d.profile or next((s.profile for s in g.slices if s.start == d.slice_start), None)
        try:
            return mig.Placement(d.slice_start, catalog(g.model)[profile].memory_slices).mask
        except (KeyError, mig.MigError):
            return 0

    # -- checking -----------------------------------------------------------------------------

    def refusal(self, job: PendingJob, piece: Piece) -> str | None:
        """Why ``job`` cannot have ``piece`` of this node now; None when it can."""
        _, gpus, cpus, mem, devices = piece
        if self.exclusive:
            return "an exclusive job holds the node"
        if job.exclusive and self.jobs:
            return "the job is exclusive and the node is in use"
        if cpus > self.cpus:
            return f"{cpus} CPUs asked, {self.cpus} free"
        if mem > self.mem_mb:
            return f"{mem} MB of memory asked, {self.mem_mb} MB free"
        if len(set(gpus)) != len(gpus):
            return f"a GPU is named twice in {list(gpus)}"
        if not job.shared and len(gpus) != job.gpus // job.nodes:
            return f"{len(gpus)} GPUs given, the job asks for {job.gpus // job.nodes} a node"
        for i in gpus:
            g = self.gpus.get(i)
            if g is None:
                return f"no GPU {i}"
            if job.gpu_type is not None and g.model != job.gpu_type:
                return f"GPU {i} is a {g.model}, not a {job.gpu_type}"
            if i not in self.free:
                if i in self.whole:
                    return f"GPU {i} is taken"
                if not serves_whole(g):
                    return f"GPU {i} is in {g.mode} mode now"
                return f"GPU {i} serves MPS shares now"
        return self._devices_refusal(job, gpus, devices) if devices else None

    def _devices_refusal(self, job: PendingJob, gpus: tuple[int, ...], devices: tuple[Device, ...]) -> str | None:
        mine_slices: dict[int, dict[int, int]] = defaultdict(dict)    # this start's, so far
        mine_clients: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for d in devices:
            g = self.gpus.get(d.index)
            if g is None:
                return f"no GPU {d.index}"
            if job.gpu_type is not None and g.model != job.gpu_type:
                return f"GPU {d.index} is a {g.model}, not a {job.gpu_type}"
            if d.kind == "gpu":
                if d.index not in gpus:
                    return f"GPU {d.index} is a device of the start but not one of its GPUs"
                continue
            if d.index in self.whole:
                return f"GPU {d.index} is held whole now"
            if g.mode != d.kind:
                return f"GPU {d.index} is in {g.mode} mode now, not {d.kind}"
            if d.kind == "mig":
                if d.slice_start is None or not any(s.start == d.slice_start and s.uuid == d.uuid for s in g.slices):
                    return f"slice {d.uuid} is gone from GPU {d.index}"
                held, mine = self.slices.get(d.index, {}), mine_slices[d.index]
                if d.slice_start in held or d.slice_start in mine:
                    return f"slice {d.uuid} is taken"
                slots = self._slots(d)
                busy = 0
                for m in (*held.values(), *mine.values()):
                    busy |= m
                if slots & busy:
                    return f"slice {d.uuid} overlaps a slice in use on GPU {d.index}"
                mine[d.slice_start] = slots
                continue
            if d.kind not in ("mps", "timeslice"):
                return f"GPU {d.index}: unknown device kind {d.kind!r}"
            if d.uuid and g.uuid and d.uuid != g.uuid:
                return f"GPU {d.index} is {g.uuid} now, not {d.uuid}"
            held_by = [(u, m) for _, u, m in self.clients.get(d.index, ())] + mine_clients[d.index]
            if d.kind == "mps":
                if len(held_by) >= g.mps_max_clients:
                    return f"MPS GPU {d.index} has {len(held_by)} clients"
                if any(u != job.user for u, _ in held_by):
                    return f"MPS GPU {d.index} serves another user"
                if sum(m for _, m in held_by) + (d.mem_mb or 0) > g.memory_mb:
                    return f"MPS GPU {d.index} has not {d.mem_mb} MB left"
            elif len(held_by) >= g.replicas:
                return f"time-sliced GPU {d.index} has all {g.replicas} replicas taken"
            mine_clients[d.index].append((job.user, d.mem_mb or 0))
        return None

    def relayout_refusal(self, r: Relayout) -> str | None:
        g = self.gpus.get(r.gpu)
        if g is None or g.mode != "mig" or not g.dynamic:
            return f"GPU {r.gpu} is not a dynamic MIG GPU"
        have = {s.start for s in g.slices}
        held = self.slices.get(r.gpu, {})
        for start in r.destroy:
            if start not in have:
                return f"no slice at slot {start}"
            if start in held:
                return f"the slice at slot {start} is in use"
        return None


class Holdings:
    """What every node has and what jobs hold of it, counted per node when first asked for."""

    def __init__(self, nodes: Mapping[str, NodeView] | Iterable[NodeView], running: Iterable[RunningJob] = ()) -> None:
        self.views: Mapping[str, NodeView] = nodes if isinstance(nodes, Mapping) else {n.name: n for n in nodes}
        self._held: dict[str, Held] = {}
        # node -> (job, user, exclusive, piece) held there, for a node not counted yet
        self._waiting: dict[str, list[tuple[int, str, bool, Piece]]] = defaultdict(list)
        for r in running:
            self.hold(r)

    def node(self, name: str) -> Held | None:
        """Node ``name`` with what is held of it; None for a node it does not know."""
        h = self._held.get(name)
        if h is None:
            view = self.views.get(name)
            if view is None:
                return None
            h = self._held[name] = Held(view)
            for job_id, user, exclusive, piece in self._waiting.pop(name, ()):
                h.take(job_id, user, exclusive, piece)
        return h

    def renew(self, view: NodeView) -> None:
        """A node's GPUs changed (a re-layout): its view from now on, what is held kept."""
        if not isinstance(self.views, dict):
            self.views = dict(self.views)
        self.views[view.name] = view
        h = self._held.get(view.name)
        if h is not None:
            h.renew(view)

    def hold(self, r: RunningJob) -> None:
        """``r`` runs: it holds what it was given."""
        self._take(r.job_id, r.user, r.exclusive, pieces(r))

    def hold_start(self, s: Start, job: PendingJob) -> None:
        """Start ``s`` of ``job`` holds: what it is given is held from now on."""
        self._take(s.job_id, job.user, job.exclusive, pieces(s))

    def release(self, r: RunningJob) -> None:
        """``r`` has exited: what it held is free."""
        for piece in pieces(r):
            h = self._held.get(piece[0])
            if h is not None:
                h.give_back(r.job_id, r.exclusive, piece)
            elif piece[0] in self._waiting:
                self._waiting[piece[0]] = [w for w in self._waiting[piece[0]] if w[0] != r.job_id]

    def _take(self, job_id: int, user: str, exclusive: bool, held: tuple[Piece, ...]) -> None:
        for piece in held:
            h = self._held.get(piece[0])
            if h is not None:
                h.take(job_id, user, exclusive, piece)
            else:
                self._waiting[piece[0]].append((job_id, user, exclusive, piece))


@dataclass(frozen=True)
class Refusal:
    """A decision of the plan that does not hold, and why."""

    decision: Decision
    reason: str
    gone: bool = False          # its job or node is no longer there (or already stops): a race


@dataclass
class Outcome:
    """What of a plan holds, in plan order, and the state once it is applied."""

    state: Holdings
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    relayouts: list[Relayout] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def apply_plan(state: Holdings, plan: Plan, pending: Mapping[int, PendingJob],
               running: Mapping[int, RunningJob]) -> Outcome:
    """Re-check ``plan`` against ``state`` (updated in place: the starts that hold are held)
    and the jobs pending and running now; see the module docstring."""
    out = Outcome(state=state)
    started: set[int] = set()
    for s in plan.starts:
        job = pending.get(s.job_id)
        refusal = _start_refusal(state, s, job, started)
        if refusal is not None:
            out.refused.append(refusal)
            continue
        assert job is not None
        started.add(s.job_id)
        state.hold_start(s, job)
        out.starts.append(s)
    relaid: set[tuple[str, int]] = set()
    for r in plan.relayouts:
        h = state.node(r.node)
        if h is None or not h.view.schedulable:
            out.refused.append(Refusal(r, f"node {r.node} is {'unknown' if h is None else 'not up'}", gone=True))
            continue
        why = "the GPU is re-laid twice in the plan" if (r.node, r.gpu) in relaid else h.relayout_refusal(r)
        if why:
            out.refused.append(Refusal(r, why))
            continue
        relaid.add((r.node, r.gpu))
        out.relayouts.append(r)
    stopped: set[int] = set()
    for p in plan.preemptions:
        victim = running.get(p.job_id)
        if victim is None or victim.stopping or p.job_id in stopped:
            why = ("is not running" if victim is None else "is already being stopped" if victim.stopping
                   else "is preempted twice in the plan")
            out.refused.append(Refusal(p, f"job {p.job_id} {why}", gone=p.job_id not in stopped))
            continue
        stopped.add(p.job_id)
        out.preemptions.append(p)
    return out


def _start_refusal(state: Holdings, s: Start, job: PendingJob | None, started: set[int]) -> Refusal | None:
    if job is None:
        return Refusal(s, f"job {s.job_id} is not pending", gone=True)
    if job.held:
        return Refusal(s, f"job {s.job_id} is held", gone=True)
    if s.job_id in started:
        return Refusal(s, f"job {s.job_id} is started twice in the plan")
    placed = pieces(s)
    if len(placed) != job.nodes:
        return Refusal(s, f"the job asks for {job.nodes} nodes, the plan gives it {len(placed)}")
    seen: set[str] = set()
    for piece in placed:
        name = piece[0]
        if name in seen:
            return Refusal(s, f"node {name} is named twice")
        seen.add(name)
        h = state.node(name)
        if h is None or not h.view.schedulable:
            return Refusal(s, f"node {name} is {'unknown' if h is None else 'not up'}", gone=True)
        why = h.refusal(job, piece)
        if why:
            return Refusal(s, f"on {name}: {why}")
    return None
