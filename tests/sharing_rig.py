"""A toy cluster of shared GPUs on a fake clock that applies plans as the head and worker do.

``ShareRig`` runs the pure core, re-checks the plan as the head does (``gpud.sched.apply``),
starts jobs on the devices the plan names, and applies ``Plan.relayouts`` the way a worker must: a slice in use is never destroyed, the new layout
must be valid (``gpud.gpu.mig.validate_layout``), every new slice gets a ``MIG-`` UUID and
the GPU's ``relaid_at`` becomes now.  ``check_shares`` asserts, after every pass, that no
slice, MPS GPU or time-slice replica is over-allocated, and that an ``mps:dynamic`` GPU is
given whole only while no share is on it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from gpud.gpu import mig
from gpud.sched.apply import Holdings, apply_plan
from gpud.sched.config import SchedConfig
from gpud.sched.core import schedule
from gpud.sched.gpustate import serves_whole
from gpud.sched.plan import Plan
from gpud.sched.snapshot import GpuView, NodeView, PendingJob, RunningJob, SliceView, Snapshot

from .sched_builders import GiB, config, pending

__all__ = ["GiB", "ShareRig", "check_shares", "config", "mig_gpu", "mps_gpu", "shared_node",
           "slice_views", "timeslice_gpu", "whole_gpu"]


def slice_views(model: str, slices: Iterable[mig.Slice], node: str = "n", gpu: int = 0) -> tuple[SliceView, ...]:
    cat = mig.catalog(model)
    return tuple(SliceView(s.profile, s.start, f"MIG-{node}-{gpu}-{s.start}-{s.profile}", cat[s.profile].memory_mb)
                 for s in sorted(slices, key=lambda s: s.start))


def mig_gpu(index: int = 0, model: str = "A100-80GB", *, dynamic: bool = True, layout: str | None = None,
            slices: Iterable[mig.Slice] = (), relaid_at: float | None = None, node: str = "n") -> GpuView:
    chosen = mig.named_layout(model, layout) if layout else list(slices)
    return GpuView(index, f"GPU-{node}-{index}", model, 80 * GiB, mode="mig", dynamic=dynamic,
                   slices=slice_views(model, chosen, node, index), relaid_at=relaid_at)


def mps_gpu(index: int = 0, model: str = "H100-80GB", *, clients: int = 48, node: str = "n") -> GpuView:
    return GpuView(index, f"GPU-{node}-{index}", model, 80 * GiB, mode="mps", mps_max_clients=clients)


def timeslice_gpu(index: int = 0, model: str = "H100-80GB", *, replicas: int = 4, node: str = "n") -> GpuView:
    return GpuView(index, f"GPU-{node}-{index}", model, 80 * GiB, mode="timeslice", replicas=replicas)


def whole_gpu(index: int = 0, model: str = "H100-80GB", node: str = "n") -> GpuView:
    return GpuView(index, f"GPU-{node}-{index}", model, 80 * GiB)


def shared_node(name: str, gpus: Iterable[GpuView], cpus: int = 64, mem_mb: int = 512 * GiB) -> NodeView:
    return NodeView(name=name, cpus=cpus, mem_mb=mem_mb, gpus=tuple(gpus))


def check_shares(snap: Snapshot, plan: Plan) -> None:
    """Nothing over-allocated after ``plan``; re-layouts touch only free slices and stay valid."""
    views = {(n.name, g.index): g for n in snap.nodes for g in n.gpus}
    pend = {j.job_id: j for j in snap.pending}
    slice_users: dict[tuple[str, int, int], int] = {}
    clients: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    whole: set[tuple[str, int]] = set()
    for r in snap.running:
        for i in r.gpu_indices:
            whole.add((r.node, i))
        for d in r.devices:
            if d.kind == "mig":
                slice_users[(r.node, d.index, d.slice_start)] = r.job_id
            elif d.kind in ("mps", "timeslice"):
                clients[(r.node, d.index)].append((r.user, d.mem_mb or 0))
    relaid = {(x.node, x.gpu) for x in plan.relayouts}
    for s in plan.starts:
        job = pend[s.job_id]
        for i in s.gpu_indices:
            key = (s.node, i)
            assert key not in whole, f"whole GPU {key} given twice"
            assert serves_whole(views[key]), f"job {s.job_id} got shared GPU {key} as a whole GPU"
            whole.add(key)
        if job.mig_profile:
            assert len(s.devices) == max(1, job.gpus) and not s.gpu_indices
        elif job.gpu_mem_mb:
            assert len(s.devices) == 1
        for d in s.devices:
            key = (s.node, d.index)
            v = views[key]
            assert not v.reconfiguring, f"job {s.job_id} started on reconfiguring {key}"
            assert job.gpu_type is None or v.model == job.gpu_type
            if d.kind == "gpu":
                assert d.index in s.gpu_indices
                continue
            assert d.kind == v.mode, f"job {s.job_id}: {d.kind} device on a {v.mode} GPU"
            if d.kind == "mig":
                sv = next(x for x in v.slices if x.start == d.slice_start)
                assert d.uuid == sv.uuid and d.profile == sv.profile
                assert (s.node, d.index, d.slice_start) not in slice_users, f"slice {key}@{d.slice_start} twice"
                slice_users[(s.node, d.index, d.slice_start)] = s.job_id
                if job.mig_profile:
                    assert sv.profile == job.mig_profile
                else:
                    assert max(sv.memory_mb, int(sv.profile.split(".")[1].split("gb")[0]) * 1024) >= job.gpu_mem_mb
            else:
                assert d.uuid == v.uuid
                clients[key].append((job.user, d.mem_mb or 0))
    for key, cs in clients.items():
        v = views[key]
        assert key not in whole, f"MPS GPU {key} given whole while it has shares"
        if v.mode == "mps":
            assert len(cs) <= v.mps_max_clients, f"MPS clients over the limit on {key}"
            assert len({u for u, _ in cs}) <= 1, f"two users on MPS GPU {key}"
            assert sum(m for _, m in cs) <= v.memory_mb, f"MPS memory over-allocated on {key}"
        else:
            assert len(cs) <= v.replicas, f"time-slice replicas over-allocated on {key}"
    for x in plan.relayouts:
        v = views[(x.node, x.gpu)]
        assert v.mode == "mig" and v.dynamic and not v.reconfiguring
        have = {s.start: s for s in v.slices}
        for start in x.destroy:
            assert start in have, f"destroying a slice that is not there: {x}"
            assert (x.node, x.gpu, start) not in slice_users, f"re-layout destroys a slice in use: {x}"
        kept = [mig.Slice(s.profile, s.start) for s in v.slices if s.start not in x.destroy]
        mig.validate_layout(v.model, kept + list(x.create))
    assert len(relaid) == len(plan.relayouts), "two re-layouts of one GPU in one plan"


@dataclass
class ShareRig:
    """Nodes of shared GPUs; jobs run ``duration`` seconds; passes apply plans on a fake clock."""

    nodes: dict[str, NodeView]
    cfg: SchedConfig = field(default_factory=lambda: config(scheduler={"mig_min_interval": "10m"}))
    now: float = 0.0
    pending: dict[int, PendingJob] = field(default_factory=dict)
    running: dict[int, RunningJob] = field(default_factory=dict)
    duration: dict[int, float] = field(default_factory=dict)
    done: dict[int, float] = field(default_factory=dict)            # job -> end time
    started: dict[int, float] = field(default_factory=dict)         # job -> start time
    relayouts: list[tuple[float, Any]] = field(default_factory=list)
    last_plan: Plan | None = None
    next_id: int = 1
    apply_relayouts: bool = True

    @classmethod
    def of(cls, *nodes: NodeView, **kw: Any) -> "ShareRig":
        return cls({n.name: n for n in nodes}, **kw)

    def submit(self, *, duration: float = 600.0, gpus: int = 1, **kw: Any) -> int:
        job_id = self.next_id
        self.next_id += 1
        kw.setdefault("submit_time", self.now)
        self.pending[job_id] = pending(job_id, gpus, **kw)
        self.duration[job_id] = duration
        return job_id

    def snapshot(self) -> Snapshot:
        return Snapshot(nodes=tuple(self.nodes[n] for n in sorted(self.nodes)),
                        pending=tuple(self.pending.values()), running=tuple(self.running.values()),
                        config=self.cfg)

    def step(self) -> Plan:
        snap = self.snapshot()
        plan = schedule(snap, self.now)
        check_shares(snap, plan)
        assert schedule(snap, self.now) == plan, "the same snapshot gave another plan"
        applied = apply_plan(Holdings(snap.nodes, snap.running), plan, self.pending, self.running)
        assert not applied.refused, f"the plan does not hold against its own snapshot: {applied.refused}"
        for s in applied.starts:
            p = self.pending.pop(s.job_id)
            self.running[s.job_id] = RunningJob(
                job_id=p.job_id, user=p.user, account=p.account, partition=p.partition, qos=p.qos,
                node=s.node, gpu_indices=s.gpu_indices if not any(d.kind != "gpu" for d in s.devices) else (),
                cpus=s.cpus, mem_mb=s.mem_mb, start_time=self.now, time_limit=p.time_limit,
                submit_time=p.submit_time, devices=s.devices)
            self.started[s.job_id] = self.now
        if self.apply_relayouts:
            for x in applied.relayouts:
                self.relayout(x)
        self.last_plan = plan
        return plan

    def relayout(self, x: Any) -> None:
        """Apply one re-layout as a worker does (the checks above already passed)."""
        node = self.nodes[x.node]
        v = next(g for g in node.gpus if g.index == x.gpu)
        kept = [mig.Slice(s.profile, s.start) for s in v.slices if s.start not in x.destroy]
        views = {s.start: s for s in v.slices}
        new = slice_views(v.model, list(x.create), x.node, x.gpu)
        slices = tuple(sorted([views[s.start] for s in kept] + list(new), key=lambda s: s.start))
        nv = replace(v, slices=slices, relaid_at=self.now)
        self.nodes[x.node] = replace(node, gpus=tuple(nv if g.index == x.gpu else g for g in node.gpus))
        self.relayouts.append((self.now, x))

    def advance(self, until: float) -> None:
        """End the jobs whose time has come, up to ``until``."""
        for job_id, r in sorted(self.running.items()):
            end = r.start_time + self.duration[job_id]
            if end <= until:
                del self.running[job_id]
                self.done[job_id] = end
        self.now = until

    def next_end(self) -> float:
        return min((r.start_time + self.duration[j] for j, r in self.running.items()), default=float("inf"))

    def run(self, until: float, interval: float = 30.0) -> None:
        """Passes every ``interval`` and at every job end, until ``until``."""
        while self.now < until:
            self.step()
            self.advance(min(until, self.now + interval, max(self.now, self.next_end())))
        self.step()

    def reason(self, job_id: int) -> str | None:
        assert self.last_plan is not None
        return self.last_plan.reasons.get(job_id)

    def devices(self, job_id: int) -> tuple:
        return self.running[job_id].devices

    def gpu(self, node: str, index: int) -> GpuView:
        return next(g for g in self.nodes[node].gpus if g.index == index)

    def destroying(self) -> Counter:
        """Re-layouts that destroyed slices, per GPU."""
        return Counter((x.node, x.gpu) for _, x in self.relayouts if x.destroy)
