"""The fill experiment (``gpud simulate --fill-to F --seed N``): the FGD paper's protocol.

The pods of a pod list are shuffled with the seed, then drawn from with replacement until
the GPU they ask for adds up to ``F`` times the cluster's GPU capacity; they arrive in that
order, each is placed or dropped (nothing waits, nothing departs).  Measured at each
percent of arrived requests (GPU asked for so far over capacity): the GPU allocated
(milli-GPU placed over capacity) and the fragmentation rate (free GPU capacity the pod
list's request shapes could not use, over all free GPU capacity; gpud/sched/shapes.py,
``Fragments``, with the whole pod list as the demand).

The placing is the core's: every drawn pod is a pending job (in arrival order: submit
time, no priority weights), and one ``schedule()`` pass over that queue places each in
turn or leaves it.  One pass is the protocol exactly: within a pass the core considers jobs
in queue order against what earlier ones left, resources only shrink, no job ends, and with
no time limits nothing is reserved, so a job that does not fit is one that was dropped.
A share (``gpu_milli`` below 1000) asks for ``32 x gpu_milli`` MiB of GPU memory
(gpud/sim/openb.py), so it needs shared GPUs (``--gpu-modes mps:dynamic``: an idle GPU
takes a whole pod or shares, as in the paper); on whole GPUs it holds one whole.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Sequence

from ..sched.config import SchedConfig, Weights
from ..sched.core import schedule
from ..sched.shapes import Demand, Fragments, State
from ..sched.snapshot import NodeView, PendingJob, Snapshot
from .openb import MB_PER_MILLI, Pod

__all__ = ["fill", "fill_config", "format_fill", "sample"]


def fill_config(config: SchedConfig, placement: str | None = None) -> SchedConfig:
    """``config`` as the protocol runs it: arrival order, nothing blocks or is reserved."""
    out = replace(
        config, weights=Weights(age=0.0, fairshare=0.0, job_size=0.0, qos=0.0, partition=0.0),
        backfill=True, backfill_depth=0,
        qos={n: replace(q, preempt=()) for n, q in config.qos.items()},
        accounts={n: replace(a, gpu_quota=None) for n, a in config.accounts.items()})
    if placement is not None:
        out = replace(out, placement=placement)
    return out


def sample(pods: Sequence[Pod], capacity_milli: int, fill_to: float, seed: int) -> list[Pod]:
    """The arrivals: ``pods`` shuffled, then drawn with replacement until they ask for
    ``fill_to`` times ``capacity_milli``."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    want = fill_to * capacity_milli
    out: list[Pod] = []
    asked = 0
    while asked < want and order:
        p = order[rng.randrange(len(order))]
        out.append(p)
        asked += p.milli
    return out


def _job(k: int, p: Pod, cfg: SchedConfig) -> PendingJob:
    share = p.share
    return PendingJob(
        job_id=k, user="unknown", account=cfg.default_account, partition=cfg.default_partition,
        qos=cfg.default_qos, gpus=1 if share else p.num_gpu, cpus=p.cpu_milli, mem_mb=p.memory_mib,
        time_limit=None, submit_time=float(k), gpu_type=p.gpu_spec[0] if len(p.gpu_spec) == 1 else None,
        gpu_mem_mb=p.gpu_milli * MB_PER_MILLI if share else None)


def fill(nodes: Sequence[NodeView], pods: Sequence[Pod], config: SchedConfig, fill_to: float,
         seed: int) -> dict[str, Any]:
    """Run the protocol once; the report's ``fill`` object (module docstring)."""
    up = [n for n in nodes if n.schedulable]
    capacity = 1000 * sum(len(n.gpus) for n in up)
    if capacity == 0:
        raise ValueError("the cluster has no GPUs to fill")
    arrivals = sample(pods, capacity, fill_to, seed)
    cfg = config
    pending = tuple(_job(k, p, cfg) for k, p in enumerate(arrivals, start=1))
    plan = schedule(Snapshot(nodes=tuple(nodes), pending=pending, running=(), config=cfg), 0.0)
    started = {s.job_id: s for s in plan.starts}

    demand = Demand(_pod_shapes(pods), limit=len(pods) or 1)
    frags = Fragments(demand)
    mirror = _Mirror(up)
    frag_total = sum(frags.frag(s) for s in mirror.states.values())
    free_total = capacity / 1000
    arrived_pct, allocated_pct, fragmentation_pct = [], [], []
    asked = placed = 0
    mark = 1
    for k, p in enumerate(arrivals, start=1):
        asked += p.milli
        s = started.get(k)
        if s is not None:
            placed += p.milli
            before, after = mirror.apply(s, p)
            frag_total += frags.frag(after) - frags.frag(before)
            free_total -= (sum(e[1] / e[2] for e in before[2]) - sum(e[1] / e[2] for e in after[2]))
        while asked * 100 >= mark * capacity:
            arrived_pct.append(mark)
            allocated_pct.append(round(100 * placed / capacity, 2))
            fragmentation_pct.append(round(100 * frag_total / free_total, 2) if free_total > 1e-9 else 0.0)
            mark += 1
    return {
        "seed": seed, "fill_to": fill_to, "placement": cfg.placement, "capacity_gpus": capacity / 1000,
        "pods_arrived": len(arrivals), "pods_placed": len(started),
        "arrived_pct": arrived_pct, "allocated_pct": allocated_pct, "fragmentation_pct": fragmentation_pct,
    }


def _pod_shapes(pods: Sequence[Pod]) -> dict[tuple[int, int, int, int], float]:
    w: dict[tuple[int, int, int, int], float] = {}
    for p in pods:
        s = (p.cpu_milli, p.memory_mib, 0 if p.share else p.num_gpu, p.gpu_milli * MB_PER_MILLI if p.share else 0)
        w[s] = w.get(s, 0.0) + 1.0
    return w


class _Mirror:
    """Each node's state (shapes.State) as the plan's starts, applied in order, leave it."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.gpus = {n.name: {g.index: [g.model, g.memory_mb, g.memory_mb, g.mode, g.dynamic] for g in n.gpus}
                     for n in nodes}
        self.res = {n.name: [n.cpus, n.mem_mb] for n in nodes}
        self.states: dict[str, State] = {n.name: self._state(n.name) for n in nodes}

    def _state(self, name: str) -> State:
        entries = []
        for model, free, total, mode, dynamic in self.gpus[name].values():
            if free <= 0:
                continue
            whole_ok = free == total and (mode == "whole" or dynamic)
            entries.append((model, free, total, whole_ok, mode == "mps" and (dynamic or free <= total)))
        cpus, mem = self.res[name]
        return (cpus, mem, tuple(sorted(entries)))

    def apply(self, s: Any, p: Pod) -> tuple[State, State]:
        before = self.states[s.node]
        gpus = self.gpus[s.node]
        for i in s.gpu_indices:
            gpus[i][1] = 0
        for d in s.devices:
            if d.kind == "mps":
                gpus[d.index][1] -= d.mem_mb or 0
                gpus[d.index][4] = False      # in share mode now: no whole pod until it empties
            else:
                gpus[d.index][1] = 0
        self.res[s.node][0] -= s.cpus
        self.res[s.node][1] -= s.mem_mb
        after = self.states[s.node] = self._state(s.node)
        return before, after


def format_fill(report: dict[str, Any]) -> str:
    """The text report: the curve every 10 % of arrivals and at 100 %."""
    f = report["fill"]
    c = report["cluster"]
    lines = [f"Cluster {c['nodes']} nodes, {c['gpus']} GPUs; pod list {report['pods']['read']} pods "
             f"of {report['pods']['rows']} rows; placement {f['placement']}, seed {f['seed']}, "
             f"filled to {f['fill_to'] * 100:g}%: {f['pods_placed']} of {f['pods_arrived']} pods placed",
             "", f"{'arrived':>8}  {'allocated':>9}  {'fragmented (of free)':>20}"]
    for a, al, fr in zip(f["arrived_pct"], f["allocated_pct"], f["fragmentation_pct"]):
        if a % 10 == 0 or a == 100 or a == f["arrived_pct"][-1]:
            lines.append(f"{a:>7}%  {al:>8.2f}%  {fr:>19.2f}%")
    return "\n".join(lines)
