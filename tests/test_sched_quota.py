"""Guaranteed quotas, borrowing and reclaim; hard limits; per-user QOS limits."""

from __future__ import annotations

from dataclasses import replace

from gpud.sched.core import schedule
from gpud.sched.quota import QuotaBook

from .sched_builders import ToyCluster, config, nodes, pending, running, snapshot

HOUR = 3600.0
AB = {"a": {"gpu_quota": 8, "users": ["alice"]}, "b": {"gpu_quota": 8, "users": ["bob"]}}


def test_reclaim_preempts_exactly_the_borrowed_jobs_then_the_owner_starts():
    toy = ToyCluster(nodes(2), config(accounts=AB))
    b_jobs = [toy.submit(1, duration=10 * HOUR, time_limit=12 * HOUR, account="b", user="bob")
              for _ in range(16)]
    toy.step()
    assert len(toy.running) == 16
    borrowed = {j for j in b_jobs if toy.running[j].borrowed}
    own = set(b_jobs) - borrowed
    assert len(borrowed) == 8 and len(own) == 8

    toy.advance(HOUR)
    a_jobs = [toy.submit(1, duration=HOUR, account="a", user="alice") for _ in range(8)]
    plan = toy.step()
    assert {p.job_id for p in plan.preemptions} == borrowed
    assert all(p.reason == "quota reclaim for account a" for p in plan.preemptions)
    assert {p.for_job for p in plan.preemptions} == set(a_jobs)
    assert not plan.starts
    assert all(plan.reasons[j] == "Resources" and plan.expected_starts[j] == toy.now for j in a_jobs)

    # while the victims wind down, nothing more is preempted and nothing starts on their GPUs
    toy.advance(toy.now + 30)
    plan = toy.step()
    assert not plan.preemptions and not plan.starts

    toy.advance(toy.now + 60)          # grace time over: the victims are requeued
    plan = toy.step()
    assert {s.job_id for s in plan.starts} == set(a_jobs)
    assert not any(s.borrowed for s in plan.starts)
    assert own <= set(toy.running)      # b's guaranteed jobs never stopped
    assert all(toy.pending[j].preempt_count == 1 for j in borrowed)


def test_idle_quota_is_lent_and_borrowers_wait_behind_owners():
    cfg = config(accounts=AB)
    snap = snapshot(nodes(2), [pending(1, 8, account="b", user="bob", submit_time=0.0),
                               pending(2, 8, account="b", user="bob", submit_time=1.0),
                               pending(3, 8, account="a", user="alice", submit_time=2.0)], cfg=cfg)
    plan = schedule(snap, 10.0)
    # 3 is within a's quota and goes before b's borrowing job 2, whatever their priorities
    assert [(s.job_id, s.borrowed) for s in plan.starts] == [(1, False), (3, False)]
    assert plan.reasons[2] in ("Resources", "Priority")


def test_no_reclaim_within_exempt_time_or_from_guaranteed_jobs():
    cfg = config(accounts={"a": {"gpu_quota": 8, "users": ["alice"]}, "b": {"gpu_quota": 4, "users": ["bob"]}})
    run = [running(i, "n001", (i - 1,), account="b", user="bob", start_time=10.0 * i, time_limit=None,
                   borrowed=i > 4) for i in range(1, 9)]
    snap = snapshot(nodes(1), [pending(20, 1, account="a", user="alice")], run, cfg=cfg)
    assert schedule(snap, 60.0).preemptions == []             # victims younger than 10 min
    plan = schedule(snap, 2 * HOUR)
    assert [p.job_id for p in plan.preemptions] == [8]      # the youngest borrowed job
    # b at its quota: its jobs flagged borrowed are no longer reclaimable
    cfg8 = config(accounts=AB)
    assert schedule(snapshot(nodes(1), snap.pending, run, cfg=cfg8), 2 * HOUR).preemptions == []


def test_gpu_limit_is_a_hard_cap_including_stopping_jobs():
    cfg = config(accounts={"a": {"gpu_limit": 4, "users": ["*"]}})
    run = [running(1, "n001", (0, 1, 2), account="a", stopping=True)]
    snap = snapshot(nodes(1), [pending(2, 1, account="a"), pending(3, 1, account="a")], run, cfg=cfg)
    plan = schedule(snap, 0.0)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.reasons[3] == "AccountLimit"


def test_qos_max_gpus_per_user():
    cfg = config(qos={"normal": {"max_gpus_per_user": 2}})
    snap = snapshot(nodes(1), [pending(1, 2, user="u"), pending(2, 1, user="u"), pending(3, 1, user="v")],
                    cfg=cfg)
    plan = schedule(snap, 0.0)
    assert sorted(s.job_id for s in plan.starts) == [1, 3]
    assert plan.reasons[2] == "QOSMaxGRESPerUser"


def test_pools_in_a_hierarchy():
    cfg = config(accounts={
        "research": {"gpu_quota": 8, "users": ["alice"]},
        "vision": {"parent": "research", "gpu_quota": 3, "users": ["bob"]},
        "nlp": {"parent": "research", "users": ["carol"]},       # no quota: shares research's pool
        "ops": {"users": ["*"]},                                  # no guarantee at all
    })
    book = QuotaBook(cfg, [running(1, "n001", (0, 1), account="nlp", user="carol")])
    assert book.enabled
    assert book.pool("vision") == "vision" and book.size["vision"] == 3
    assert book.pool("nlp") == "research" and book.size["research"] == 5
    assert book.pool("ops") is None
    assert book.within("research", 3) and not book.within("research", 4)   # nlp already uses 2 of 5
    assert book.within("vision", 3) and not book.within("vision", 4)
    assert not book.within("ops", 1) and book.within("ops", 0)


def test_quotas_off_means_nothing_borrows():
    snap = snapshot(nodes(1), [pending(1, 8)])
    plan = schedule(snap, 0.0)
    assert plan.starts and not plan.starts[0].borrowed


def _shared_node():
    """One A100-80GB node: GPU 0 MPS, GPU 1 dynamic MIG, GPUs 2-3 whole."""
    from gpud.sched.snapshot import GpuView, NodeView
    gpus = (GpuView(0, "GPU-0", "A100-80GB", 81920, mode="mps"),
            GpuView(1, "GPU-1", "A100-80GB", 81920, mode="mig", dynamic=True),
            GpuView(2, "GPU-2", "A100-80GB", 81920), GpuView(3, "GPU-3", "A100-80GB", 81920))
    return NodeView("n001", 64, 512 * 1024, gpus)


def _share(job_id: int, mem: int, account: str = "a", user: str = "alice"):
    from gpud.sched.snapshot import Device
    return running(job_id, "n001", (), account=account, user=user,
                   devices=(Device(0, "mps", "GPU-0", None, mem),))


def test_fractions_count_against_gpu_limit_so_an_account_at_it_gets_no_more_slices_or_shares():
    cfg = config(accounts={"a": {"gpu_limit": 1, "users": ["*"]}})
    # two 40 GiB shares of an 80 GiB GPU: the account holds exactly its one GPU
    run = [_share(1, 40960), _share(2, 40960)]
    pend = [pending(3, 1, account="a", gpu_mem_mb=10240), pending(4, 1, account="a", mig_profile="1g.10gb"),
            pending(5, 1, account="a")]
    plan = schedule(snapshot([_shared_node()], pend, run, cfg=cfg), 0.0)
    assert plan.starts == [] and not plan.relayouts
    assert [plan.reasons[j] for j in (3, 4, 5)] == ["AccountLimit"] * 3
    # at half a GPU, a quarter share starts and then the limit holds again
    run = [_share(1, 40960)]
    pend = [pending(3, 1, account="a", gpu_mem_mb=20480), pending(4, 1, account="a", gpu_mem_mb=20480),
            pending(6, 1, account="a", gpu_mem_mb=20480)]
    plan = schedule(snapshot([_shared_node()], pend, run, cfg=cfg), 0.0)
    assert [s.job_id for s in plan.starts] == [3, 4]
    assert plan.reasons[6] == "AccountLimit"


def test_fractions_count_against_a_qos_cap_per_user():
    cfg = config(qos={"normal": {"max_gpus_per_user": 1}})
    run = [_share(1, 61440, account="default")]          # 3/4 of a GPU
    pend = [pending(2, 1, gpu_mem_mb=40960), pending(3, 1, gpu_mem_mb=20480), pending(4, 1, user="bob")]
    plan = schedule(snapshot([_shared_node()], pend, run, cfg=cfg), 0.0)
    assert plan.reasons[2] == "QOSMaxGRESPerUser"
    assert sorted(s.job_id for s in plan.starts) == [3, 4]


def test_quota_reclaim_preempts_borrowing_fractional_jobs():
    from gpud.gpu import mig
    from gpud.sched.snapshot import Device, GpuView, NodeView, SliceView
    cfg = config(accounts={"a": {"gpu_quota": 1, "users": ["alice"]}, "b": {"users": ["bob"]}})
    # an MPS GPU full of bob's borrowed shares: one user at a time, so both must go for alice
    run = [replace(_share(k, 40960, account="b", user="bob"), borrowed=True, start_time=-7200.0) for k in (1, 2)]
    mps_node = replace(_shared_node(), gpus=_shared_node().gpus[:1])
    plan = schedule(snapshot([mps_node], [pending(3, 1, account="a", gpu_mem_mb=20480)], run, cfg=cfg), 0.0)
    assert sorted(p.job_id for p in plan.preemptions) == [1, 2]
    assert all(p.for_job == 3 and "quota reclaim" in p.reason for p in plan.preemptions)
    assert plan.reasons[3] == "Resources" and not plan.starts
    # a MIG slice of the profile alice asks for, held by a borrowed job of bob's
    layout = mig.named_layout("A100-80GB", "all-1g.10gb")
    cat = mig.catalog("A100-80GB")
    gpu = GpuView(0, "GPU-0", "A100-80GB", 81920, mode="mig", slices=tuple(
        SliceView(s.profile, s.start, f"MIG-{s.start}", cat[s.profile].memory_mb) for s in layout))
    node = NodeView("n001", 64, 512 * 1024, (gpu,))
    run = [running(10 + s.start, "n001", (), account="b", user="bob", borrowed=True, start_time=-7200.0,
                   devices=(Device(0, "mig", f"MIG-{s.start}", s.start, 9728, s.profile),)) for s in layout]
    run[0] = replace(run[0], borrowed=False, account="a", user="alice")   # alice's own: never a victim
    plan = schedule(snapshot([node], [pending(3, 1, account="a", mig_profile="1g.10gb")], run, cfg=cfg), 0.0)
    (p,) = plan.preemptions
    assert p.job_id != run[0].job_id and p.for_job == 3
    # within quota only: a borrower gets no reclaim for itself
    plan = schedule(snapshot([node], [pending(4, 1, account="b", user="bob", mig_profile="1g.10gb")], run, cfg=cfg), 0.0)
    assert not plan.preemptions
