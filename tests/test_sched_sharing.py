"""The pure core placing fractional GPUs: MIG slices (static and re-laid), MPS shares, time-slices.

Every pass of a ShareRig is checked by ``check_shares`` (nothing over-allocated, re-layouts
touch only free slices and stay valid) and run twice (same snapshot, same plan).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpud.gpu import mig
from gpud.sched.core import schedule
from gpud.sched.snapshot import Device, NodeView, RunningJob
from gpud.sched.usage import billing_rate

from .sched_builders import check_plan, pending, snapshot
from .sharing_rig import (GiB, ShareRig, check_shares, config, mig_gpu, mps_gpu, shared_node, timeslice_gpu,
                          whole_gpu)

MIN = 60.0
A100 = "A100-80GB"


def a100_rig(**gpu_kw) -> ShareRig:
    return ShareRig.of(shared_node("n", [mig_gpu(0, A100, **gpu_kw)]))


# -- must-show 2: dynamic MIG ---------------------------------------------------------------------

def test_seven_1g_jobs_on_an_idle_dynamic_a100_run_at_once():
    rig = a100_rig()
    jobs = [rig.submit(mig_profile="1g.10gb") for _ in range(7)]
    plan = rig.step()
    assert not plan.starts
    [x] = plan.relayouts
    assert (x.node, x.gpu, x.destroy) == ("n", 0, ())
    assert sorted(s.profile for s in x.create) == ["1g.10gb"] * 7
    assert all(rig.reason(j) == "MigReconfig" for j in jobs)
    plan = rig.step()                       # the worker reported the new slices
    assert sorted(s.job_id for s in plan.starts) == jobs and not plan.relayouts
    uuids = {d.uuid for j in jobs for d in rig.devices(j)}
    assert len(uuids) == 7 and all(u.startswith("MIG-") for u in uuids)
    assert {d.slice_start for j in jobs for d in rig.devices(j)} == set(range(7))


def test_a_7g_job_waits_for_the_1g_jobs_then_gets_the_gpu_re_laid():
    rig = a100_rig()
    small = [rig.submit(mig_profile="1g.10gb", duration=30 * MIN) for _ in range(7)]
    rig.step()
    rig.step()
    assert set(rig.running) == set(small)
    rig.advance(5 * MIN)
    big = rig.submit(mig_profile="7g.80gb", duration=10 * MIN)
    late = rig.submit(mig_profile="1g.10gb", duration=30 * MIN)   # must not jump ahead of the 7g
    plan = rig.step()
    assert not plan.relayouts and not plan.starts
    assert rig.reason(big) == "Resources" and plan.expected_starts[big] == 3600.0   # their time limits
    rig.advance(30 * MIN)                   # the 1g jobs end
    assert not rig.running
    plan = rig.step()
    [x] = plan.relayouts
    assert sorted(x.destroy) == list(range(7)) and [(s.profile, s.start) for s in x.create] == [("7g.80gb", 0)]
    assert rig.reason(big) == "MigReconfig" and rig.reason(late) == "Resources"
    plan = rig.step()
    assert [s.job_id for s in plan.starts] == [big]
    assert rig.devices(big)[0].profile == "7g.80gb"


def test_a_3g_job_gets_the_free_half_while_the_other_half_keeps_running():
    rig = a100_rig(layout="all-1g.10gb")
    others = [rig.submit(mig_profile="1g.10gb", duration=3 * 3600) for _ in range(7)]
    rig.step()
    before = {j: rig.devices(j) for j in others}
    for j in others:                       # free slots 0-3: their jobs end, 4-6 keep running
        if before[j][0].slice_start < 4:
            rig.running.pop(j)
    keep = {j: d for j, d in before.items() if d[0].slice_start >= 4}
    rig.now = 11 * MIN                     # past the minimum interval since the layout was cut
    half = rig.submit(mig_profile="3g.40gb")
    plan = rig.step()
    [x] = plan.relayouts
    assert sorted(x.destroy) == [0, 1, 2, 3]
    assert [(s.profile, s.start) for s in x.create] == [("3g.40gb", 0)]
    assert not {d[0].slice_start for d in keep.values()} & set(x.destroy)
    assert rig.reason(half) == "MigReconfig"
    rig.step()
    assert rig.devices(half)[0].slice_start == 0
    assert {j: rig.devices(j) for j in keep} == keep        # untouched: same slices, same UUIDs
    gpu = rig.gpu("n", 0)
    assert {s.uuid for s in gpu.slices} >= {d[0].uuid for d in keep.values()}


def _alternate(rig: ShareRig, waves: int) -> list[int]:
    """1g waves and 7g waves, one every 4 minutes, each job 3 minutes long."""
    submitted: list[int] = []
    for wave in range(waves):
        rig.run(wave * 4 * MIN, interval=MIN)
        if wave % 2 == 0:
            submitted += [rig.submit(mig_profile="1g.10gb", duration=3 * MIN) for _ in range(5)]
        else:
            submitted += [rig.submit(mig_profile="7g.80gb", duration=3 * MIN)]
    rig.run(6 * 3600, interval=MIN)
    assert set(rig.done) == set(submitted)
    return submitted


def test_alternating_demand_never_re_lays_a_gpu_faster_than_the_minimum_interval():
    rig = a100_rig()
    _alternate(rig, 12)
    destroys = [when for when, x in rig.relayouts if x.destroy]
    assert len(destroys) >= 3, "the workload should force re-layouts"
    for d in destroys:                     # a destroying re-layout comes 10 min after any other
        assert all(d - other >= 10 * MIN for other, _ in rig.relayouts if other < d)


def test_alternating_demand_on_two_gpus_settles_without_re_layouts():
    rig = ShareRig.of(shared_node("n", [mig_gpu(0, A100), mig_gpu(1, A100)]))
    _alternate(rig, 12)
    assert not rig.destroying(), "each size should keep a GPU cut its way"


def test_reconfiguring_gpu_takes_no_start():
    rig = a100_rig(layout="all-1g.10gb")
    node = rig.nodes["n"]
    rig.nodes["n"] = NodeView(node.name, node.cpus, node.mem_mb,
                              tuple(g.__class__(**{**g.__dict__, "reconfiguring": True}) for g in node.gpus))
    job = rig.submit(mig_profile="1g.10gb")
    plan = rig.step()
    assert not plan.starts and not plan.relayouts and rig.reason(job) == "MigReconfig"


def test_static_layout_is_never_re_laid():
    rig = a100_rig(layout="all-1g.10gb", dynamic=False)
    small = rig.submit(mig_profile="1g.10gb")
    big = rig.submit(mig_profile="3g.40gb")
    plan = rig.step()
    assert [s.job_id for s in plan.starts] == [small]
    assert not plan.relayouts and rig.reason(big) == "BadConstraints"


def test_slices_of_one_job_share_a_node():
    rig = ShareRig.of(shared_node("a", [mig_gpu(0, A100, layout="all-3g.40gb", dynamic=False, node="a")]),
                      shared_node("b", [mig_gpu(0, A100, layout="all-1g.10gb", dynamic=False, node="b")]))
    job = rig.submit(mig_profile="1g.10gb", gpus=3)
    too_many = rig.submit(mig_profile="1g.10gb", gpus=8)
    rig.step()
    assert rig.running[job].node == "b" and len(rig.devices(job)) == 3
    assert rig.reason(too_many) == "BadConstraints"



def _hold_slices(rig: ShareRig, node: str, gpu: int, starts) -> None:
    """Running jobs on these slices of ``gpu``, for an hour."""
    v = rig.gpu(node, gpu)
    for start in starts:
        sv = next(s for s in v.slices if s.start == start)
        job_id = 1000 + len(rig.running)
        rig.running[job_id] = RunningJob(job_id, "bob", "default", "gpu", "normal", node, (), 1, GiB, 0.0, 3600.0,
                                         devices=(Device(gpu, "mig", sv.uuid, start, sv.memory_mb, sv.profile),))
        rig.duration[job_id] = 3600.0


def test_slices_of_one_job_are_cut_only_on_gpus_of_its_type():
    one_left = [mig.Slice("1g.10gb", s) for s in range(6)]
    rig = ShareRig.of(shared_node("n", [mig_gpu(0, A100, slices=one_left), mig_gpu(1, "H100-80GB")]))
    _hold_slices(rig, "n", 0, range(6))
    job = rig.submit(mig_profile="1g.10gb", gpus=2, gpu_type=A100)
    plan = rig.step()
    assert not plan.relayouts and rig.reason(job) == "Resources"


def test_slices_of_one_job_are_cut_only_on_gpus_that_have_the_profile():
    rig = ShareRig.of(shared_node("n", [mig_gpu(0, A100), mig_gpu(1, "A30-24GB", slices=[mig.Slice("1g.6gb", 0)])]))
    _hold_slices(rig, "n", 1, [0])           # the A30 is the busier GPU, tried first
    job = rig.submit(mig_profile="1g.20gb", gpus=2)
    plan = rig.step()
    [x] = plan.relayouts
    assert x.gpu == 0 and [s.profile for s in x.create] == ["1g.20gb"] * 2 and rig.reason(job) == "MigReconfig"

def test_whole_and_shared_gpus_do_not_mix():
    rig = ShareRig.of(shared_node("n", [whole_gpu(0), mps_gpu(1), mig_gpu(2, A100, layout="all-7g.80gb")]))
    whole = rig.submit(gpus=1)
    two = rig.submit(gpus=2)
    plan = rig.step()
    assert [s.gpu_indices for s in plan.starts] == [(0,)]
    assert rig.reason(two) == "BadConstraints"
    assert not rig.devices(whole) or all(d.kind == "gpu" for d in rig.devices(whole))


# -- must-show 3: MPS -------------------------------------------------------------------------------

def test_four_20g_mps_jobs_share_an_h100_a_fifth_and_another_users_wait():
    rig = ShareRig.of(shared_node("n", [mps_gpu(0, "H100-80GB")]))
    alice = [rig.submit(gpu_mem_mb=20 * GiB, user="alice", duration=10 * MIN) for _ in range(5)]
    bob = rig.submit(gpu_mem_mb=20 * GiB, user="bob", duration=10 * MIN)
    plan = rig.step()
    assert [s.job_id for s in plan.starts] == alice[:4]
    for j in alice[:4]:
        [d] = rig.devices(j)
        assert (d.kind, d.index, d.uuid, d.mem_mb) == ("mps", 0, "GPU-n-0", 20 * GiB)
    assert rig.reason(alice[4]) == "Resources" and rig.reason(bob) == "Resources"
    rig.run(5 * 3600, interval=MIN)
    assert set(rig.done) == set(alice) | {bob}
    assert rig.started[alice[4]] == 10 * MIN
    assert rig.started[bob] >= max(rig.done[j] for j in alice), "bob shared an MPS server with alice"


def test_mps_never_mixes_users_while_the_first_users_stream_continues():
    rig = ShareRig.of(shared_node("n", [mps_gpu(0, "H100-80GB")]))
    first = [rig.submit(gpu_mem_mb=10 * GiB, user="alice", duration=20 * MIN) for _ in range(2)]
    rig.step()
    bob = rig.submit(gpu_mem_mb=10 * GiB, user="bob", duration=5 * MIN, submit_time=-3600)
    for k in range(6):                       # alice keeps submitting after bob
        rig.advance(rig.now + 5 * MIN)
        rig.submit(gpu_mem_mb=10 * GiB, user="alice", duration=20 * MIN)
        rig.step()
    rig.run(4 * 3600, interval=MIN)
    assert rig.started[bob] == max(rig.done[j] for j in first)   # as soon as alice's first jobs left


def test_mps_client_and_memory_limits():
    rig = ShareRig.of(shared_node("n", [mps_gpu(0, "H100-80GB", clients=3)]))
    jobs = [rig.submit(gpu_mem_mb=1 * GiB) for _ in range(4)]
    big = rig.submit(gpu_mem_mb=90 * GiB)
    rig.step()
    assert set(rig.running) == set(jobs[:3])
    assert rig.reason(big) == "BadConstraints"


def test_timeslice_replicas_mix_users():
    rig = ShareRig.of(shared_node("n", [timeslice_gpu(0, replicas=4)]))
    jobs = [rig.submit(gpu_mem_mb=30 * GiB, user=u) for u in ("a", "b", "c", "d", "e")]
    rig.step()
    assert set(rig.running) == set(jobs[:4])
    assert {rig.devices(j)[0].kind for j in jobs[:4]} == {"timeslice"}


# -- --gpu-mem: least waste -------------------------------------------------------------------------

def test_gpu_mem_takes_what_wastes_least():
    rig = ShareRig.of(shared_node("n", [whole_gpu(0, "H100-80GB"),
                                        mig_gpu(1, A100, layout="all-balanced", dynamic=False)]))
    small = rig.submit(gpu_mem_mb=8 * GiB)
    twenty = rig.submit(gpu_mem_mb=20 * GiB)        # a 1g.20gb/2g.20gb holds it by its name
    forty = rig.submit(gpu_mem_mb=40 * GiB)
    sixty = rig.submit(gpu_mem_mb=60 * GiB)
    rig.step()
    assert rig.devices(small)[0].profile == "1g.10gb"
    assert rig.devices(twenty)[0].profile == "2g.20gb"
    assert rig.devices(forty)[0].profile == "3g.40gb"
    assert rig.running[sixty].gpu_indices == (0,) and rig.devices(sixty)[0].kind == "gpu"


def test_gpu_mem_cuts_a_fitting_slice_on_a_dynamic_gpu_rather_than_a_whole_gpu():
    rig = ShareRig.of(shared_node("n", [whole_gpu(0, "A100-80GB"), mig_gpu(1, A100)]))
    job = rig.submit(gpu_mem_mb=15 * GiB)
    plan = rig.step()
    [x] = plan.relayouts
    assert [s.profile for s in x.create] == ["1g.20gb"] and rig.reason(job) == "MigReconfig"
    rig.step()
    assert rig.devices(job)[0].profile == "1g.20gb"


def test_gpu_mem_prefers_mps_over_a_whole_gpu():
    rig = ShareRig.of(shared_node("n", [whole_gpu(0), mps_gpu(1)]))
    job = rig.submit(gpu_mem_mb=20 * GiB)
    rig.step()
    assert rig.devices(job)[0].kind == "mps"


# -- billing ------------------------------------------------------------------------------------------

def test_fractions_are_billed_by_fraction():
    n = shared_node("n", [mig_gpu(0, A100, layout="all-balanced"), mps_gpu(1), timeslice_gpu(2, replicas=4),
                          whole_gpu(3)])
    cfg = config(billing={"weights": {"A100-80GB": 2.0}})

    def rate(*devices: Device, gpus: tuple[int, ...] = ()) -> float:
        r = RunningJob(1, "u", "default", "gpu", "normal", "n", gpus, 1, 1, 0.0, None, devices=devices)
        return billing_rate(r, n, cfg)

    assert rate(Device(0, "mig", slice_start=0, profile="3g.40gb")) == 2.0 * 3 / 7
    assert rate(Device(0, "mig", slice_start=6)) == 2.0 * 1 / 7            # profile found by slot
    assert rate(Device(1, "mps", mem_mb=20 * GiB)) == 0.25
    assert rate(Device(2, "timeslice", mem_mb=1)) == 0.25
    assert rate(Device(3, "gpu"), gpus=(3,)) == 1.0
    assert billing_rate(RunningJob(1, "u", "default", "gpu", "normal", "gone", (), 1, 1, 0.0, None,
                                   devices=(Device(0, "mig", profile="2g.20gb"),)), None, cfg) == 2 / 7


# -- bad input ------------------------------------------------------------------------------------------

def test_odd_reports_do_not_crash_a_pass():
    bad = mig_gpu(0, A100, layout="all-1g.10gb")
    bad = bad.__class__(**{**bad.__dict__, "slices": bad.slices + bad.slices[:1]})   # a duplicate slice
    unknown = mig_gpu(1, A100).__class__(**{**mig_gpu(1, A100).__dict__, "model": "Z9-1GB"})
    rig = ShareRig.of(shared_node("n", [bad, unknown, mps_gpu(2)]))
    job = rig.submit(mig_profile="1g.10gb")
    mem = rig.submit(gpu_mem_mb=GiB)
    stale = RunningJob(99, "u", "default", "gpu", "normal", "n", (), 1, 1, 0.0, None,
                       devices=(Device(7, "mig", slice_start=3), Device(2, "weird")))
    rig.running[99] = stale
    rig.duration[99] = 1.0
    rig.step()
    assert rig.reason(job) == "BadConstraints" and mem in rig.running


# -- properties ---------------------------------------------------------------------------------------

_PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@st.composite
def _cluster(draw):
    gpus = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["mig", "mig", "mps", "timeslice", "whole"]))
        if kind == "mig":
            layout = draw(st.sampled_from([None, "all-1g.10gb", "all-balanced", "all-3g.40gb", "all-enabled"]))
            gpus.append(mig_gpu(i, A100, layout=layout, dynamic=draw(st.booleans()),
                                relaid_at=draw(st.sampled_from([None, -3600.0, -60.0]))))
        elif kind == "mps":
            gpus.append(mps_gpu(i, clients=draw(st.integers(1, 6))))
        elif kind == "timeslice":
            gpus.append(timeslice_gpu(i, replicas=draw(st.integers(1, 4))))
        else:
            gpus.append(whole_gpu(i))
    jobs = draw(st.lists(st.tuples(st.sampled_from(["mig", "mem", "whole"]), st.sampled_from(_PROFILES),
                                   st.integers(1, 3), st.integers(1, 90), st.sampled_from(["a", "b"]),
                                   st.integers(60, 3600)), min_size=1, max_size=25))
    return gpus, jobs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cluster())
def test_random_traffic_never_over_allocates(case):
    gpus, jobs = case
    rig = ShareRig.of(shared_node("n", gpus), cfg=config(scheduler={"mig_min_interval": "2m"}))
    for kind, profile, n, gib, user, duration in jobs:
        if kind == "mig":
            rig.submit(mig_profile=profile, gpus=n, user=user, duration=duration)
        elif kind == "mem":
            rig.submit(gpu_mem_mb=gib * GiB, user=user, duration=duration)
        else:
            rig.submit(gpus=n, user=user, duration=duration)
    # every pass: check_shares, and run twice for determinism; long enough for the jobs to
    # run one after another, so whoever still waits at the end can never run
    rig.run(sum(job[-1] for job in jobs) + 3600, interval=10 * MIN)
    for job_id, p in rig.pending.items():    # whoever still waits can never run here
        assert rig.reason(job_id) == "BadConstraints", (job_id, p, rig.reason(job_id))
    for g in rig.nodes["n"].gpus:
        if g.mode == "mig":
            mig.validate_layout(g.model, [mig.Slice(s.profile, s.start) for s in g.slices])


def test_whole_gpu_plans_still_pass_the_core_checks():
    n = shared_node("n001", [whole_gpu(0), whole_gpu(1), mps_gpu(2)])
    snap = snapshot([n], [pending(1, 2), pending(2, 1, gpu_mem_mb=GiB)])
    plan = schedule(snap, 0.0)
    check_shares(snap, plan)
    assert {s.job_id for s in plan.starts} == {1, 2}
    whole_only = snapshot([n], [pending(1, 2)])
    check_plan(whole_only, schedule(whole_only, 0.0), 0.0)
