"""The head with shared GPUs: submit-time refusals, devices recorded and launched, MIG
re-layouts sent once and re-checked, nodes shown per GPU; in-process (real SQLite store,
in-memory bus, injected clock), the worker played by the test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpud.gpu import mig
from gpud.head.gpusharing import gpu_view
from gpud.head.scheduling import plan_to_txn, running_view
from gpud.head.store import Store
from gpud.model import GpuInfo, NodeInfo, SliceInfo
from gpud.sched.apply import Held, Holdings
from gpud.sched.plan import Plan, Relayout, Start
from gpud.sched.snapshot import Device, NodeView, Part, PendingJob, RunningJob

from .slurm_head import ALICE, BOB, HeadKit, as_sent

GiB = 1024


def slices(model: str, layout: list[mig.Slice], node: str = "n1", gpu: int = 0) -> tuple[SliceInfo, ...]:
    cat = mig.catalog(model)
    return tuple(SliceInfo(s.profile, s.start, f"MIG-{node}-{gpu}-{s.start}", cat[s.profile].memory_mb)
                 for s in layout)


def a100(index: int = 0, layout: list[mig.Slice] = (), dynamic: bool = True, **kw) -> GpuInfo:
    return GpuInfo(index, f"GPU-n1-{index}", "A100-80GB", 80 * GiB, mode="mig", dynamic=dynamic,
                   slices=slices("A100-80GB", list(layout), gpu=index), **kw)


def h100(index: int, mode: str = "whole", **kw) -> GpuInfo:
    return GpuInfo(index, f"GPU-n1-{index}", "H100-80GB", 80 * GiB, mode=mode, **kw)


class Kit(HeadKit):
    """HeadKit with nodes of shared GPUs and a record of what the head sends to workers."""

    async def __aenter__(self) -> "Kit":
        await super().__aenter__()
        self.sent: list[tuple[str, str, dict]] = []
        publish = self.bus.publish

        async def record(topic, message, body=None, **kw):
            self.sent.append((topic, *as_sent(message, body)))
            await publish(topic, message, body, **kw)

        self.bus.publish = record          # type: ignore[method-assign]
        return self

    def put_node(self, *gpus: GpuInfo, name: str = "n1") -> NodeInfo:
        from gpud.head.store import NodeRecord
        info = NodeInfo(name, 64, 512 * GiB, tuple(gpus))
        self.store.nodes[name] = NodeRecord(name, info.to_dict(), "UP", None, self.clock(), self.clock())
        return info

    async def register(self, info: NodeInfo) -> None:
        await self.report(info.name, "register", {"node": info.to_dict()})

    def of_kind(self, kind: str) -> list[dict]:
        return [body for _, k, body in self.sent if k == kind]


@pytest.fixture
async def kit(tmp_path):
    async with Kit(tmp_path) as k:
        yield k


async def test_slices_are_cut_once_then_launched_with_their_mig_uuids(kit):
    info = kit.put_node(a100(0))
    jobs = [await kit.submit(mig_profile="1g.10gb", gpus=2) for _ in range(2)]
    await kit.schedule()
    [cmd] = kit.of_kind("mig")
    assert cmd["gpu"] == 0 and cmd["destroy"] == [] and len(cmd["create"]) == 4
    assert {kit.job(j).reason for j in jobs} == {"MigReconfig"}
    await kit.schedule()                         # no answer yet: nothing sent twice
    assert len(kit.of_kind("mig")) == 1 and not kit.of_kind("launch")
    layout = [mig.Slice(c["profile"], c["start"]) for c in cmd["create"]]
    info = replace(info, gpus=(a100(0, layout, relaid_at=kit.clock()),))
    kit.put_node(*info.gpus)
    await kit.register(info)
    await kit.schedule()
    launches = kit.of_kind("launch")
    assert sorted(b["job_id"] for b in launches) == jobs
    for body in launches:
        assert len(body["gpus"]) == 2
        for g in body["gpus"]:
            assert g["kind"] == "mig" and g["uuid"].startswith("MIG-") and g["profile"] == "1g.10gb"
            assert g["slice_start"] in {s.start for s in layout}
    listed = (await kit.call("jobs", ALICE, job_ids=jobs))["jobs"]
    assert all(j["mig_profile"] == "1g.10gb" and len(j["devices"]) == 2 for j in listed)
    node = (await kit.call("nodes", ALICE))["nodes"][0]
    gpu = node["gpus"][0]
    assert gpu["mode"] == "mig" and gpu["dynamic"]
    assert sorted(s["job_id"] for s in gpu["slices"]) == sorted(jobs * 2)
    assert {h["user"] for h in gpu["holders"]} == {"alice"}


async def test_a_lost_answer_is_planned_again_after_the_timeout(kit):
    kit.put_node(a100(0))
    await kit.submit(mig_profile="3g.40gb")
    await kit.schedule()
    kit.clock.advance(61)
    await kit.schedule()
    assert len(kit.of_kind("mig")) == 2


async def test_mps_shares_and_their_users(kit):
    kit.put_node(h100(0, "mps"))
    alice = [await kit.submit(ALICE, gpu_mem_mb="20G") for _ in range(5)]
    bob = await kit.submit(BOB, gpu_mem_mb="20G")
    await kit.schedule()
    launches = kit.of_kind("launch")
    assert sorted(b["job_id"] for b in launches) == alice[:4]
    for body in launches:
        [g] = body["gpus"]
        assert (g["kind"], g["index"], g["uuid"], g["mem_mb"]) == ("mps", 0, "GPU-n1-0", 20 * GiB)
    assert kit.job(alice[4]).reason == "Resources" and kit.job(bob).reason == "Resources"
    for j in alice[:4]:
        await kit.finish(j)
    await kit.schedule()
    assert kit.job(alice[4]).state.value == "RUNNING" and kit.job(bob).state.value == "PENDING"
    await kit.finish(alice[4])
    await kit.schedule()
    assert kit.job(bob).state.value == "RUNNING"


async def test_refused_at_submit(kit):
    kit.put_node(a100(0), h100(1, "mps"), h100(2))
    msg = await kit.refused("submit", ALICE, spec={"script": "#!/bin/sh\ntrue\n", "mig_profile": "1g.5gb"})
    assert "offers MIG profile 1g.5gb" in msg and "1g.10gb" in msg
    msg = await kit.refused("submit", ALICE, spec={"script": "#!/bin/sh\ntrue\n", "mig_profile": "1g.10gb",
                                                   "gpus": 8})
    assert "at most 7" in msg
    msg = await kit.refused("submit", ALICE, spec={"script": "#!/bin/sh\ntrue\n", "gpu_mem_mb": "200G"})
    assert "--gpu-mem" in msg
    msg = await kit.refused("submit", ALICE, spec={"script": "#!/bin/sh\ntrue\n", "gpus": 2})
    assert "has 1" in msg                        # one whole GPU: MIG and MPS GPUs are not whole
    msg = await kit.refused("submit", ALICE, spec={"script": "#!/bin/sh\ntrue\n", "mig_profile": "9g.1gb"})
    assert "no MIG profile" in msg or "offers" in msg
    assert await kit.submit(mig_profile="MIG 1G.10GB")


async def test_a_whole_gpu_for_gpu_mem_when_nothing_smaller(kit):
    kit.put_node(h100(0), h100(1))
    job = await kit.submit(gpu_mem_mb="40G")
    await kit.schedule()
    [body] = kit.of_kind("launch")
    assert body["gpus"] == [{"index": 0, "uuid": "GPU-n1-0", "kind": "gpu", "slice_start": None,
                             "mem_mb": None, "profile": None}]
    assert kit.job(job).gpu_indices == (0,)


def held_node(info: NodeInfo, *holders: tuple[str, Device]) -> Held:
    """Node ``info`` as the head's re-check sees it, with a job of ``user`` holding each device."""
    view = NodeView(info.name, info.cpus, info.mem_mb, tuple(gpu_view(g) for g in info.gpus))
    run = [RunningJob(k, user, "a", "gpu", "normal", info.name, (), 1, 1, 0.0, None, devices=(d,))
           for k, (user, d) in enumerate(holders, start=1)]
    return Holdings([view], run).node(info.name)


def fits(h: Held, user: str, devices: list[Device]) -> str | None:
    """Why ``user`` cannot have ``devices`` of node ``h`` now (None: it can)."""
    whole = tuple(d.index for d in devices if d.kind == "gpu")
    shared = len(whole) != len(devices)
    job = PendingJob(99, user, "a", "gpu", "normal", len(whole), 1, 1, None, 0.0, gpu_mem_mb=1 if shared else None)
    return h.refusal(job, (h.view.name, whole, 1, 1, tuple(devices)))


def test_plan_recheck_skips_taken_slices_and_relayouts_of_busy_slices():
    layout = [mig.Slice("1g.10gb", s) for s in range(7)]
    info = NodeInfo("n1", 64, 512 * GiB, (a100(0, layout),))
    busy = Device(0, "mig", "MIG-n1-0-3", 3, 9728, "1g.10gb")
    use = held_node(info, ("alice", busy))
    assert fits(use, "bob", [busy]) == "slice MIG-n1-0-3 is taken"
    assert fits(use, "bob", [Device(0, "mig", "MIG-n1-0-9", 9)]) == "slice MIG-n1-0-9 is gone from GPU 0"
    assert fits(use, "bob", [Device(0, "mig", "MIG-n1-0-4", 4)]) is None
    assert use.relayout_refusal(Relayout("n1", 0, (3,), (), "test")) == "the slice at slot 3 is in use"
    assert use.relayout_refusal(Relayout("n1", 0, (4, 5), (), "test")) is None
    mps = NodeInfo("n1", 64, 512 * GiB, (h100(0, "mps", mps_max_clients=2),))
    use = held_node(mps, ("alice", Device(0, "mps", "GPU-n1-0", None, 60 * GiB)))
    assert "another user" in fits(use, "bob", [Device(0, "mps", "GPU-n1-0", None, GiB)])
    assert "MB left" in fits(use, "alice", [Device(0, "mps", "GPU-n1-0", None, 30 * GiB)])
    assert fits(use, "alice", [Device(0, "mps", "GPU-n1-0", None, 20 * GiB)]) is None


async def test_devices_survive_a_head_restart_and_requeue_clears_them(kit, tmp_path):
    kit.put_node(h100(0, "timeslice", replicas=2))
    job = await kit.submit(gpu_mem_mb="8G")
    await kit.schedule()
    rec = kit.job(job)
    assert rec.devices[0]["kind"] == "timeslice"
    view = running_view(rec)
    assert view.gpu_indices == () and view.devices[0].kind == "timeslice"
    async with Store(kit.db) as again:
        assert again.active[job].devices == rec.devices
    await kit.call("requeue", ALICE, job_ids=[job])
    await kit.finish(job, reason="signalled")
    assert kit.job(job).state.value == "PENDING" and kit.job(job).devices == ()


async def test_stale_plans_do_not_double_book(kit):
    kit.put_node(a100(0, [mig.Slice("3g.40gb", 0), mig.Slice("3g.40gb", 4)], dynamic=False))
    a = await kit.submit(mig_profile="3g.40gb")
    b = await kit.submit(mig_profile="3g.40gb")
    dev = Device(0, "mig", "MIG-n1-0-0", 0, 40192, "3g.40gb")
    plan = Plan(starts=[Start(a, "n1", (), 1, GiB, devices=(dev,)), Start(b, "n1", (), 1, GiB, devices=(dev,))])
    txn, applied = plan_to_txn(kit.store, plan, kit.clock())
    assert [j.job_id for j in applied.launches] == [a]


async def test_a_plan_starts_only_what_still_holds_and_logs_only_what_no_longer_fits(kit, caplog):
    kit.put_node(h100(0), h100(1))
    kit.put_node(h100(0), h100(1), name="n2")
    a, b, c, e = [await kit.submit(gpus=1) for _ in range(4)]
    d = await kit.submit(gpus=2, nodes=2)
    await kit.call("cancel", ALICE, job_ids=[a])           # cancelled while the core ran ...
    kit.store.nodes["n2"].state = "DRAIN"                  # ... and n2 drained
    plan = Plan(starts=[Start(a, "n1", (0,), 1, GiB), Start(b, "n1", (0,), 1, GiB), Start(c, "n1", (0,), 1, GiB),
                        Start(d, "n1", (1,), 1, GiB, parts=(Part("n2", (0,), 1, GiB),)), Start(e, "n1", (1,), 1, GiB)])
    with caplog.at_level("WARNING", logger="gpud.sched"):
        txn, applied = plan_to_txn(kit.store, plan, kit.clock())
    assert [j.job_id for j in applied.launches] == [b, e]          # d's refused gang held nothing of n1
    assert [r.getMessage() for r in caplog.records] == [f"plan start of job {c} on n1 skipped: on n1: GPU 0 is taken"]


def test_the_head_recheck_keeps_an_mps_dynamic_gpu_whole_or_shared_never_both():
    info = NodeInfo("n1", 64, 512 * GiB, (GpuInfo(0, "GPU-0", "H100-80GB", 81920, mode="mps", dynamic=True),))
    whole, share = Device(0, "gpu", "GPU-0"), Device(0, "mps", "GPU-0", None, 1024)
    idle = held_node(info)
    assert fits(idle, "u", [whole]) is None and fits(idle, "u", [share]) is None
    shared = held_node(info, ("u", share))
    assert "serves MPS shares" in fits(shared, "u", [whole])
    held = held_node(info, ("u", whole))
    assert "held whole" in fits(held, "u", [share])


def test_a_refused_relayout_backs_off_and_is_retried_with_the_heads_interval():
    import asyncio
    from types import SimpleNamespace

    from gpud.head.gpusharing import REFUSED_BACKOFF, MigCommands
    from gpud.sched.config import SchedConfig
    from gpud.sched.core import schedule
    from gpud.sched.snapshot import GpuView, NodeView, PendingJob, Snapshot

    sent = []

    class Bus:
        async def publish(self, topic, message):
            sent.append(message.to_body())

    info = {"name": "n1", "gpus": [{"index": 0, "slices": [{"profile": "7g.80gb", "start": 0}]}]}
    head = SimpleNamespace(store=SimpleNamespace(nodes={"n1": SimpleNamespace(info=info)}), bus=Bus(),
                           cfg=SimpleNamespace(sched=SchedConfig(mig_min_interval=5.0)))
    mig = MigCommands(head.store, head.bus, config=lambda: head.cfg)
    gpu = GpuView(0, "GPU-0", "A100-80GB", 81920, mode="mig", dynamic=True)
    snap = Snapshot((NodeView("n1", 64, 512 * 1024, (gpu,)),),
                    (PendingJob(1, "u", "default", "gpu", "normal", 1, 1, 1024, 3600.0, 0.0, mig_profile="1g.10gb"),), ())
    now = 100.0
    plan = schedule(mig.adjust(snap, now), now)
    (r,) = plan.relayouts
    asyncio.run(mig.send(plan.relayouts, now))
    assert sent[-1]["min_interval"] == 5.0                  # the head's interval travels with it
    # the worker re-registers with the layout unchanged: refused; nothing planned there for a while
    mig.registered("n1", info, now)
    for t, backoff in ((now + 1, True), (now + REFUSED_BACKOFF + 1, False)):
        plan = schedule(mig.adjust(snap, t), t)
        assert bool(plan.relayouts) is not backoff, t
        if backoff:
            assert plan.reasons[1] == "MigReconfig" and plan.expected_starts[1] == now + REFUSED_BACKOFF
    # refused again: twice as long; after a reconfigure the retry carries the new interval
    asyncio.run(mig.send(plan.relayouts, now + REFUSED_BACKOFF + 1))
    mig.registered("n1", info, now + REFUSED_BACKOFF + 1)
    assert mig.refused[("n1", 0)][0] == now + 3 * REFUSED_BACKOFF + 1
    head.cfg = SimpleNamespace(sched=SchedConfig(mig_min_interval=0.0))
    t = now + 3 * REFUSED_BACKOFF + 2
    plan = schedule(mig.adjust(snap, t), t)
    asyncio.run(mig.send(plan.relayouts, t))
    assert sent[-1]["min_interval"] == 0.0
    # applied this time: the backoff is forgotten
    mig.registered("n1", {"name": "n1", "gpus": [{"index": 0, "slices": [{"profile": "1g.10gb", "start": 6}]}]}, t)
    assert ("n1", 0) not in mig.refused
