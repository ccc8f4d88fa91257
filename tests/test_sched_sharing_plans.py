"""Fractional passes give the recorded plans: seeded random snapshots of shared GPUs.

Each seed builds one snapshot: nodes of dynamic and static MIG GPUs (random layouts, some
slices busy, some GPUs re-laid recently, re-laying or backing off a refused re-layout), MPS
GPUs (plain and dynamic, with clients), time-sliced and whole GPUs, and a queue of slice,
``--gpu-mem`` and whole-GPU jobs, many of them alike (arrays), under binpack or shapes
placement, with or without limits, quotas and preemption.  The plan of each pass must equal
the one in ``tests/data/sharing_plans.json``, so a change meant to make the pass faster
shows it changes no decision.  A change of policy rewrites the file on purpose:

    python -m tests.test_sched_sharing_plans --write
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

import pytest

from gpud.gpu import mig
from gpud.sched.core import schedule
from gpud.sched.plan import Plan
from gpud.sched.snapshot import Device, GpuView, NodeView, PendingJob, RunningJob, SliceView, Snapshot

from .sched_builders import GiB, config
from .sharing_rig import check_shares

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "sharing_plans.json")
SEEDS = range(32)
NOW = 10_000.0
MODELS = ["A100-80GB"] * 4 + ["H100-80GB", "A30-24GB"]
USERS = ["u0", "u1", "u2", "u3"]


def _layout(rnd: random.Random, model: str) -> list[mig.Slice]:
    if rnd.random() < 0.4:
        return mig.named_layout(model, rnd.choice(mig.layout_names(model)))
    profiles = [p for p in mig.catalog(model) if rnd.random() < 0.7 or not p.endswith("+me")]
    slices: list[mig.Slice] = []
    for _ in range(rnd.randint(0, 7)):
        new = mig.place(model, [rnd.choice(profiles)], slices)
        if new:
            slices += new
    return sorted(slices, key=lambda s: s.start)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.running: list[RunningJob] = []
        self.next_id = 100_000

    def run(self, node: str, user: str, devices: tuple[Device, ...] = (), gpus: tuple[int, ...] = (),
            cpus: int = 1) -> None:
        rnd = self.rnd
        self.next_id += 1
        self.running.append(RunningJob(
            self.next_id, user, rnd.choice(["a", "b"]), "gpu", rnd.choice(["normal", "low"]), node, gpus, cpus,
            GiB, start_time=NOW - rnd.choice([60.0, 700.0, 3000.0]), time_limit=rnd.choice([600.0, 3600.0, 7200.0]),
            stopping=rnd.random() < 0.05, borrowed=rnd.random() < 0.3, devices=devices))

    def gpu(self, node: str, i: int) -> GpuView:
        rnd = self.rnd
        model = rnd.choice(MODELS)
        uuid = f"GPU-{node}-{i}"
        mem = 24 * GiB if model.startswith("A30") else 80 * GiB
        kind = rnd.choice(["mig", "mig", "mig", "mps", "timeslice", "whole"])
        if kind == "mig":
            cat = mig.catalog(model)
            slices = _layout(rnd, model)
            views = tuple(SliceView(s.profile, s.start, f"MIG-{node}-{i}-{s.start}", cat[s.profile].memory_mb)
                          for s in slices)
            for s in slices:
                if rnd.random() < 0.45:
                    self.run(node, rnd.choice(USERS), (Device(i, "mig", f"MIG-{node}-{i}-{s.start}", s.start,
                                                              cat[s.profile].memory_mb, s.profile),))
            return GpuView(i, uuid, model, mem, mode="mig", dynamic=rnd.random() < 0.75, slices=views,
                           relaid_at=rnd.choice([None, None, NOW - 60.0, NOW - 3600.0]),
                           reconfiguring=rnd.random() < 0.05,
                           relayout_after=rnd.choice([None] * 8 + [NOW + 100.0, NOW - 100.0]))
        if kind == "mps":
            dynamic = rnd.random() < 0.3
            clients = rnd.choice([1, 2, 4, 8, 48])
            user = rnd.choice(USERS)
            shares = rnd.choice([0, 0, 1, 2, 3])
            if dynamic and shares == 0 and rnd.random() < 0.4:
                self.run(node, user, gpus=(i,))                 # held whole
            left = mem
            for _ in range(min(shares, clients)):
                share = min(left, rnd.choice([5, 10, 20]) * GiB)
                left -= share
                self.run(node, user, (Device(i, "mps", uuid, None, share),))
            return GpuView(i, uuid, model, mem, mode="mps", dynamic=dynamic, mps_max_clients=clients)
        if kind == "timeslice":
            replicas = rnd.randint(1, 4)
            for _ in range(rnd.randint(0, replicas)):
                self.run(node, rnd.choice(USERS), (Device(i, "timeslice", uuid),))
            return GpuView(i, uuid, model, mem, mode="timeslice", replicas=replicas)
        if rnd.random() < 0.3:
            self.run(node, rnd.choice(USERS), gpus=(i,))
        return GpuView(i, uuid, model, mem)

    def job_kinds(self) -> list[dict[str, Any]]:
        """A few request shapes; the queue repeats them, as arrays do."""
        rnd = self.rnd
        out = []
        for _ in range(rnd.randint(3, 12)):
            kw: dict[str, Any] = {"cpus": rnd.choice([1, 1, 1, 2, 2, 8, 8, 16, 16, 300]), "mem_mb": rnd.choice([1, 4, 64]) * GiB,
                                  "time_limit": rnd.choice([600.0, 3600.0, 7200.0, None]),
                                  "gpu_type": rnd.choice([None] * 8 + ["A100-80GB", "H100-80GB", "A30-24GB"])}
            kind = rnd.choice(["mig"] * 6 + ["mem"] * 3 + ["whole"] * 2)
            if kind == "mig":
                model = kw["gpu_type"] or "A100-80GB"
                kw["mig_profile"] = rnd.choice(list(mig.catalog(model)))
                kw["gpus"] = rnd.choice([1, 1, 1, 1, 2, 3])
            elif kind == "mem":
                kw["gpu_mem_mb"] = rnd.choice([5, 10, 12, 19, 20, 24, 30, 40, 60, 80, 90]) * GiB
                kw["gpus"] = 1
            else:
                kw["gpus"] = rnd.choice([1, 2])
            out.append(kw)
        return out

    def snapshot(self, seed: int) -> Snapshot:
        rnd = self.rnd
        big = seed % 10 == 9
        nodes = []
        for n in range(rnd.randint(20, 30) if big else rnd.randint(1, 8)):
            name = f"n{n:02d}"
            gpus = tuple(self.gpu(name, i) for i in range(rnd.randint(1, 8)))
            nodes.append(NodeView(name, rnd.choice([16, 64, 256]), rnd.choice([128, 512]) * GiB, gpus,
                                  schedulable=rnd.random() > 0.08))
        kinds = self.job_kinds()
        pending = []
        for k in range(rnd.randint(200, 400) if big else rnd.randint(5, 120)):
            kw = dict(rnd.choice(kinds))
            job_id = k + 1
            pending.append(PendingJob(
                job_id, rnd.choice(USERS), rnd.choice(["a", "b"]), rnd.choice(["gpu", "gpu", "gpu", "small"]),
                rnd.choice(["normal", "normal", "high", "low"]), kw.pop("gpus"), kw.pop("cpus"), kw.pop("mem_mb"),
                kw.pop("time_limit"), float(rnd.randint(0, 50)), held=rnd.random() < 0.03,
                blocked_reason="Dependency" if rnd.random() < 0.03 else None, **kw))
        return Snapshot(tuple(nodes), tuple(pending), tuple(self.running), self.config(nodes),
                        recent_preemptions=tuple(NOW - 10.0 for _ in range(rnd.choice([0, 0, 29]))))

    def config(self, nodes: list[NodeView]) -> Any:
        rnd = self.rnd
        small = [n.name for n in nodes[::2]]
        sched: dict[str, Any] = {"mig_min_interval": "10m", "placement": rnd.choice(["binpack", "binpack", "shapes"]),
                                 "backfill_depth": rnd.choice([0, 2, 100])}
        qos: dict[str, Any] = {"normal": {}, "low": {}, "high": {"priority": 100}}
        accounts: dict[str, Any] = {"a": {"users": ["*"]}, "b": {"users": ["*"]}}
        if rnd.random() < 0.5:
            qos["high"]["preempt"] = ["low"]
        if rnd.random() < 0.3:
            qos["normal"]["max_gpus_per_user"] = rnd.choice([1, 3])
        if rnd.random() < 0.4:
            accounts["a"]["gpu_quota"] = rnd.choice([1, 4])
            accounts["b"]["gpu_quota"] = rnd.choice([1, 4])
        return config(scheduler=sched, qos=qos, accounts=accounts,
                      partition=[{"name": "gpu", "default": True}, {"name": "small", "nodes": small}])


def bench_like(seed: int) -> Snapshot:
    """The shape of bench/bench_sharing.py's pass, smaller: per node four dynamic A100s cut in
    seven 1g.10gb with four busy, two MPS GPUs with two clients, two whole GPUs; a long queue
    of a few slice and memory shapes."""
    rnd = random.Random(seed)
    cat = mig.catalog("A100-80GB")
    nodes, running = [], []
    rid = 100_000
    for n in range(40):
        name = f"a{n:02d}"
        views = []
        for i in range(8):
            uuid = f"GPU-{name}-{i}"
            if i < 4:
                layout = mig.named_layout("A100-80GB", "all-1g.10gb")
                views.append(GpuView(i, uuid, "A100-80GB", 80 * GiB, mode="mig", dynamic=True, slices=tuple(
                    SliceView(s.profile, s.start, f"MIG-{name}-{i}-{s.start}", cat[s.profile].memory_mb)
                    for s in layout), relaid_at=rnd.choice([None, NOW - 60.0])))
                for s in layout[:rnd.randint(2, 5)]:
                    rid += 1
                    running.append(RunningJob(rid, f"u{rid % 4}", "a", "gpu", "normal", name, (), 1, GiB,
                                              NOW - 600.0, rnd.choice([1800.0, 3600.0]), devices=(
                                                  Device(i, "mig", f"MIG-{name}-{i}-{s.start}", s.start, 9728,
                                                         s.profile),)))
            elif i < 6:
                views.append(GpuView(i, uuid, "A100-80GB", 80 * GiB, mode="mps"))
                for _ in range(2):
                    rid += 1
                    running.append(RunningJob(rid, f"u{n % 4}", "a", "gpu", "normal", name, (), 1, GiB,
                                              NOW - 600.0, 3600.0, devices=(Device(i, "mps", uuid, None, 10 * GiB),)))
            else:
                views.append(GpuView(i, uuid, "A100-80GB", 80 * GiB))
        nodes.append(NodeView(name, 256, 2048 * GiB, tuple(views)))
    shapes = [("1g.10gb", None), ("2g.20gb", None), ("3g.40gb", None), ("4g.40gb", None), ("7g.80gb", None),
              (None, 8 * GiB), (None, 20 * GiB), (None, 40 * GiB)]
    pending = []
    for k in range(600):
        profile, mem = rnd.choice(shapes)
        pending.append(PendingJob(k + 1, f"u{k % 4}", "a", "gpu", "normal", 1, 1, GiB,
                                  rnd.choice([600.0, 3600.0]), float(k), mig_profile=profile, gpu_mem_mb=mem))
    cfg = config(scheduler={"mig_min_interval": "10m", "placement": "shapes" if seed % 2 else "binpack"},
                 accounts={"a": {"users": ["*"]}})
    return Snapshot(tuple(nodes), tuple(pending), tuple(running), cfg)


def snapshot_for(seed: int) -> Snapshot:
    return bench_like(seed) if seed >= 30 else _Builder(seed).snapshot(seed)


def encode(plan: Plan) -> Any:
    """The plan as JSON data (the factors only sum to the priorities, which are kept)."""
    def dev(d: Device) -> list:
        return [d.index, d.kind, d.uuid, d.slice_start, d.mem_mb, d.profile]
    out = {
        "starts": [[s.job_id, s.node, list(s.gpu_indices), s.cpus, s.mem_mb, s.borrowed, [dev(d) for d in s.devices],
                    [[p.node, list(p.gpu_indices), p.cpus, p.mem_mb] for p in s.parts]] for s in plan.starts],
        "preemptions": [[p.job_id, p.mode, p.grace_time, p.reason, p.for_job] for p in plan.preemptions],
        "reasons": plan.reasons, "priorities": plan.priorities, "expected_starts": plan.expected_starts,
        "reserved_nodes": plan.reserved_nodes,
        "relayouts": [[x.node, x.gpu, list(x.destroy), [[s.profile, s.start] for s in x.create], x.reason]
                      for x in plan.relayouts],
    }
    return json.loads(json.dumps(out))


def _recorded() -> dict[str, Any]:
    with open(FIXTURE) as f:
        return json.load(f)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fractional_pass_gives_the_recorded_plan(seed):
    snap = snapshot_for(seed)
    plan = schedule(snap, NOW)
    check_shares(snap, plan)
    assert encode(plan) == _recorded()[str(seed)]


def test_the_snapshots_exercise_every_path():
    """The recorded plans start slices, shares and whole GPUs, re-lay GPUs, reserve and
    preempt, and say MigReconfig, so a pass that changes any of those shows here."""
    plans = _recorded()
    starts = [d[1] for p in plans.values() for s in p["starts"] for d in s[6]]
    assert {"mig", "mps", "timeslice", "gpu"} <= set(starts)
    assert sum(len(p["relayouts"]) for p in plans.values()) > 50
    assert any(x[2] for p in plans.values() for x in p["relayouts"]), "no re-layout destroys a slice"
    assert sum(len(p["expected_starts"]) for p in plans.values()) > 50
    assert any(p["preemptions"] for p in plans.values())
    reasons = {r for p in plans.values() for r in p["reasons"].values()}
    assert {"MigReconfig", "Resources", "Priority", "BadConstraints"} <= reasons


if __name__ == "__main__" and "--write" in sys.argv:
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w") as f:        # a line per seed, so a change shows which plans moved
        f.write("{\n" + ",\n".join(f'"{s}": {json.dumps(encode(schedule(snapshot_for(s), NOW)), sort_keys=True)}'
                                    for s in SEEDS) + "\n}\n")
