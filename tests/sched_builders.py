"""Small builders for scheduler tests, an invariant checker, and a toy cluster on a fake clock.

``ToyCluster`` applies plans the way the head does (``gpud.sched.apply`` re-checks them; starts
become running jobs, preempted jobs stop after their grace time and are requeued or cancelled)
on virtual time, so tests can drive the pure core through hours of traffic in milliseconds.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from gpud.sched.apply import Holdings, apply_plan
from gpud.sched.config import SchedConfig, sched_config_from_dict
from gpud.sched.core import schedule
from gpud.sched.plan import Plan
from gpud.sched.snapshot import GpuView, NodeView, PendingJob, RunningJob, Snapshot, live_claims
from gpud.sched.usage import accrue

GiB = 1024
MODEL = "H100-80GB"


def config(**sections: Any) -> SchedConfig:
    """A SchedConfig from TOML-shaped keyword sections, e.g. ``config(qos={...})``."""
    return sched_config_from_dict(dict(sections), "<test>")


def node(name: str, gpus: int = 8, model: str = MODEL, cpus: int = 64, mem_mb: int = 512 * GiB,
         up: bool = True, models: Iterable[str] | None = None) -> NodeView:
    kinds = list(models) if models is not None else [model] * gpus
    return NodeView(name=name, cpus=cpus, mem_mb=mem_mb, schedulable=up,
                    gpus=tuple(GpuView(i, f"GPU-{name}-{i}", m, 80 * GiB) for i, m in enumerate(kinds)))


def nodes(count: int, prefix: str = "n", **kw: Any) -> tuple[NodeView, ...]:
    return tuple(node(f"{prefix}{i + 1:03d}", **kw) for i in range(count))


def pending(job_id: int, gpus: int = 1, *, user: str = "alice", account: str = "default",
            partition: str = "gpu", qos: str = "normal", cpus: int = 1, mem_mb: int = GiB,
            time_limit: float | None = 3600.0, submit_time: float = 0.0, **kw: Any) -> PendingJob:
    return PendingJob(job_id=job_id, user=user, account=account, partition=partition, qos=qos, gpus=gpus,
                      cpus=cpus, mem_mb=mem_mb, time_limit=time_limit, submit_time=submit_time, **kw)


def running(job_id: int, node_name: str, gpu_indices: Iterable[int] = (0,), *, user: str = "alice",
            account: str = "default", partition: str = "gpu", qos: str = "normal", cpus: int = 1,
            mem_mb: int = GiB, start_time: float = 0.0, time_limit: float | None = 3600.0,
            **kw: Any) -> RunningJob:
    return RunningJob(job_id=job_id, user=user, account=account, partition=partition, qos=qos,
                      node=node_name, gpu_indices=tuple(gpu_indices), cpus=cpus, mem_mb=mem_mb,
                      start_time=start_time, time_limit=time_limit, **kw)


def snapshot(node_list: Iterable[NodeView], pend: Iterable[PendingJob] = (), run: Iterable[RunningJob] = (),
             cfg: SchedConfig | None = None, usage: dict | None = None,
             recent: Iterable[float] = ()) -> Snapshot:
    return Snapshot(nodes=tuple(node_list), pending=tuple(pend), running=tuple(run),
                    config=cfg or SchedConfig(), usage=dict(usage or {}), recent_preemptions=tuple(recent))


def check_plan(snap: Snapshot, plan: Plan, now: float) -> None:
    """Invariants every plan must hold; AssertionError naming the first one broken."""
    cfg = snap.config
    by_name = {n.name: n for n in snap.nodes}
    pend = {j.job_id: j for j in snap.pending}
    run = {r.job_id: r for r in snap.running}
    gpus_used: dict[str, set[int]] = defaultdict(set)
    cpus: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    exclusive: set[str] = set()
    for r in snap.running:
        for node_name, indices, c, m in ((r.node, r.gpu_indices, r.cpus, r.mem_mb),
                                         *((p.node, p.gpu_indices, p.cpus, p.mem_mb) for p in r.parts)):
            gpus_used[node_name].update(indices)
            cpus[node_name] += c
            mem[node_name] += m
            if r.exclusive:
                exclusive.add(node_name)
    started = set()
    for s in plan.starts:
        job = pend[s.job_id]
        assert not job.held and not job.blocked_reason, f"job {s.job_id} started while not eligible"
        assert s.job_id not in started, f"job {s.job_id} started twice"
        started.add(s.job_id)
        places = [(s.node, s.gpu_indices, s.cpus, s.mem_mb), *((p.node, p.gpu_indices, p.cpus, p.mem_mb)
                                                               for p in s.parts)]
        assert len(places) == job.nodes and len({p[0] for p in places}) == job.nodes, f"job {s.job_id}: nodes"
        assert sum(len(p[1]) for p in places) == job.gpus
        for node_name, indices, c, m in places:
            n = by_name[node_name]
            assert n.schedulable, f"job {s.job_id} started on unschedulable {node_name}"
            assert len(indices) == job.gpus // job.nodes and len(set(indices)) == len(indices)
            assert node_name not in job.exclude and node_name not in exclusive, f"job {s.job_id} on {node_name}"
            if job.exclusive:
                assert not gpus_used[node_name] and not cpus[node_name], f"exclusive job {s.job_id} shares"
                exclusive.add(node_name)
            models = {g.index: g.model for g in n.gpus}
            for i in indices:
                assert i in models, f"job {s.job_id}: no GPU {i} on {node_name}"
                assert i not in gpus_used[node_name], f"GPU {node_name}:{i} allocated twice"
                assert job.gpu_type is None or models[i] == job.gpu_type
            gpus_used[node_name].update(indices)
            cpus[node_name] += c
            mem[node_name] += m
            assert cpus[node_name] <= n.cpus, f"CPUs over-allocated on {node_name}"
            assert mem[node_name] <= n.mem_mb, f"memory over-allocated on {node_name}"
        assert set(job.nodelist) <= {p[0] for p in places}, f"job {s.job_id}: nodelist"
    for j in snap.pending:
        assert j.job_id in plan.priorities and j.job_id in plan.factors
        assert (j.job_id in started) != (j.job_id in plan.reasons), f"job {j.job_id}: start xor reason"
    # hard limits hold after the plan (stopping jobs still hold their GPUs)
    held: Counter[str] = Counter()
    for r in snap.running:
        for a in cfg.account_chain(r.account):
            held[a] += r.gpus
    for s in plan.starts:
        for a in cfg.account_chain(pend[s.job_id].account):
            held[a] += pend[s.job_id].gpus
    for a, n_held in held.items():
        lim = cfg.accounts[a].gpu_limit
        new = sum(pend[s.job_id].gpus for s in plan.starts if a in cfg.account_chain(pend[s.job_id].account))
        assert lim is None or new == 0 or n_held <= lim, f"account {a} over gpu_limit"
    # preemption caps
    pc = cfg.preemption
    victims = [p.job_id for p in plan.preemptions]
    assert len(victims) == len(set(victims)), "a job preempted twice in one plan"
    for p in plan.preemptions:
        r = run[p.job_id]
        assert not r.stopping, f"job {p.job_id} preempted while already stopping"
        assert now - r.start_time >= pc.exempt_time, f"job {p.job_id} preempted before exempt_time"
        assert r.preempt_count < pc.max_per_job, f"job {p.job_id} preempted more than max_per_job"
    recent = sum(1 for t in snap.recent_preemptions if now - 60 < t <= now)
    assert recent + len(victims) <= max(pc.max_per_minute, recent), "max_per_minute exceeded"


@dataclass
class ToyJob:
    pend: PendingJob
    duration: float                     # how long it runs once started (capped by its limit)
    requeue: bool = True


@dataclass
class ToyCluster:
    """A cluster on a fake clock that applies plans like the head does."""

    node_list: tuple[NodeView, ...]
    cfg: SchedConfig = field(default_factory=SchedConfig)
    now: float = 0.0
    check: bool = True
    jobs: dict[int, ToyJob] = field(default_factory=dict)
    pending: dict[int, PendingJob] = field(default_factory=dict)
    running: dict[int, RunningJob] = field(default_factory=dict)
    stop_at: dict[int, tuple[float, str]] = field(default_factory=dict)   # job -> (exit time, mode)
    usage: dict = field(default_factory=dict)
    preempt_times: list[float] = field(default_factory=list)
    claims: dict[int, int] = field(default_factory=dict)                   # victim -> its preemptor
    gpu_seconds: Counter = field(default_factory=Counter)                  # account -> raw GPU-seconds
    done: dict[int, str] = field(default_factory=dict)                     # job -> final state
    log: list[tuple[float, str, int]] = field(default_factory=list)
    last_plan: Plan | None = None
    next_id: int = 1

    def submit(self, gpus: int = 1, duration: float = 600.0, **kw: Any) -> int:
        job_id = self.next_id
        self.next_id += 1
        kw.setdefault("submit_time", self.now)
        requeue = kw.pop("requeue", True)
        p = pending(job_id, gpus, **kw)
        self.jobs[job_id] = ToyJob(p, duration, requeue)
        self.pending[job_id] = p
        self.log.append((self.now, "submit", job_id))
        return job_id

    def snapshot(self) -> Snapshot:
        recent = tuple(t for t in self.preempt_times if self.now - t < 60)
        running = self.running
        self.claims = live_claims(self.claims, self.pending.__contains__,
                                  lambda v: v in running and not running[v].stopping)
        return Snapshot(nodes=self.node_list, pending=tuple(self.pending.values()),
                        running=tuple(self.running.values()), config=self.cfg, usage=dict(self.usage),
                        recent_preemptions=recent, claims=tuple(self.claims.items()))

    def step(self) -> Plan:
        """One scheduler pass at ``now``, applied."""
        snap = self.snapshot()
        plan = schedule(snap, self.now)
        if self.check:
            check_plan(snap, plan, self.now)
        applied = apply_plan(Holdings(self.node_list, self.running.values()), plan, self.pending, self.running)
        if self.check:
            assert not applied.refused, f"the plan does not hold against its own snapshot: {applied.refused}"
        for s in applied.starts:
            p = self.pending.pop(s.job_id)
            self.running[s.job_id] = RunningJob(
                job_id=p.job_id, user=p.user, account=p.account, partition=p.partition, qos=p.qos,
                node=s.node, gpu_indices=s.gpu_indices, cpus=s.cpus, mem_mb=s.mem_mb, start_time=self.now,
                time_limit=p.time_limit, preempt_count=p.preempt_count, borrowed=s.borrowed,
                requeue=self.jobs[p.job_id].requeue, submit_time=p.submit_time, nice=p.nice,
                devices=s.devices, parts=s.parts, exclusive=p.exclusive)
            self.log.append((self.now, "start", s.job_id))
        for pr in applied.preemptions:
            r = self.running[pr.job_id]
            self.running[pr.job_id] = replace(r, stopping=True)
            self.stop_at[pr.job_id] = (self.now + pr.grace_time, pr.mode)
            self.preempt_times.append(self.now)
            if pr.for_job is not None:
                self.claims[pr.job_id] = pr.for_job
            self.log.append((self.now, "preempt", pr.job_id))
        self.last_plan = plan
        return plan

    def _next_event(self) -> float:
        times = [t for t, _ in self.stop_at.values()]
        for r in self.running.values():
            if r.job_id not in self.stop_at:
                times.append(r.start_time + self._runtime(r))
        return min(times, default=float("inf"))

    def _runtime(self, r: RunningJob) -> float:
        d = self.jobs[r.job_id].duration
        return d if r.time_limit is None else min(d, r.time_limit)

    def advance(self, until: float) -> None:
        """Move the clock to ``until``, ending jobs as their times come (no passes in between)."""
        while (t := self._next_event()) <= until:
            self._accrue(t)
            self.now = max(self.now, t)
            for job_id in sorted(self.running):
                r = self.running[job_id]
                if job_id in self.stop_at:
                    if self.stop_at[job_id][0] <= self.now:
                        self._stop(r, self.stop_at[job_id][1])
                elif r.start_time + self._runtime(r) <= self.now:
                    self.end(job_id)
        self._accrue(until)
        self.now = max(self.now, until)

    def _accrue(self, t: float) -> None:
        if t <= self.now:
            return
        for r in self.running.values():
            self.gpu_seconds[r.account] += r.gpus * (t - self.now)
        self.usage = accrue(self.usage, self.running.values(), self.node_list, self.cfg, self.now, t)

    def end(self, job_id: int, state: str = "COMPLETED") -> None:
        self.running.pop(job_id)
        self.stop_at.pop(job_id, None)
        self.done[job_id] = state
        self.log.append((self.now, state.lower(), job_id))

    def _stop(self, r: RunningJob, mode: str) -> None:
        self.running.pop(r.job_id)
        self.stop_at.pop(r.job_id)
        if mode == "requeue":
            p = self.jobs[r.job_id].pend
            self.pending[r.job_id] = replace(self.pending.get(r.job_id, p), preempt_count=r.preempt_count + 1)
            self.jobs[r.job_id].pend = self.pending[r.job_id]
            self.log.append((self.now, "requeued", r.job_id))
        else:
            self.done[r.job_id] = "PREEMPTED"
            self.log.append((self.now, "preempted", r.job_id))

    def run(self, until: float, interval: float = 60.0) -> None:
        """Passes every ``interval`` and after every job end, until ``until``."""
        while self.now < until:
            self.step()
            self.advance(min(self.now + interval, until, max(self.now, self._next_event())))
        self.step()

    def events(self, kind: str, job_id: int | None = None) -> list[float]:
        return [t for t, k, j in self.log if k == kind and (job_id is None or j == job_id)]
