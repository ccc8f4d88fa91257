"""The plan applier: which starts, re-layouts and preemptions hold against the state now."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpud.gpu import mig
from gpud.sched.apply import Holdings, apply_plan
from gpud.sched.core import schedule
from gpud.sched.plan import Plan, Preemption, Relayout, Start
from gpud.sched.snapshot import Device, GpuView, NodeView, Part

from .sched_builders import GiB, node, nodes, pending, running, snapshot
from .sharing_rig import mig_gpu, mps_gpu, shared_node, timeslice_gpu
from .test_sched_golden import SNAPSHOTS, golden_snapshot


def apply(node_list, plan, pend=(), run=()):
    state = Holdings(node_list, run)
    out = apply_plan(state, plan, {j.job_id: j for j in pend}, {r.job_id: r for r in run})
    return out, state


def reasons(out):
    return [r.reason for r in out.refused]


def slice_of(gpu: GpuView, start: int) -> Device:
    s = next(s for s in gpu.slices if s.start == start)
    return Device(gpu.index, "mig", s.uuid, s.start, s.memory_mb, s.profile)


# -- whole GPUs, CPUs, memory ---------------------------------------------------------------

def test_a_start_that_fits_holds_and_is_held():
    out, state = apply(nodes(1), Plan(starts=[Start(1, "n001", (0, 1), 4, 8 * GiB)]), [pending(1, 2)])
    assert [s.job_id for s in out.starts] == [1] and not out.refused and out.state is state
    h = state.node("n001")
    assert h.free == set(range(2, 8)) and h.whole == {0, 1}
    assert (h.cpus, h.mem_mb, h.jobs) == (60, 504 * GiB, 1)


def test_a_gpu_is_never_booked_twice():
    # against a running job, and between two starts of one plan: the first one wins
    run = [running(9, "n001", (0,))]
    plan = Plan(starts=[Start(1, "n001", (0,), 1, GiB), Start(2, "n001", (1,), 1, GiB), Start(3, "n001", (1,), 1, GiB)])
    out, state = apply(nodes(1), plan, [pending(1), pending(2), pending(3)], run)
    assert [s.job_id for s in out.starts] == [2]
    assert reasons(out) == ["on n001: GPU 0 is taken", "on n001: GPU 1 is taken"]
    assert not any(r.gone for r in out.refused)
    assert state.node("n001").whole == {0, 1}


def test_cpus_and_memory_are_never_over_given():
    one = node("n001", gpus=4, cpus=8, mem_mb=16 * GiB)
    plan = Plan(starts=[Start(1, "n001", (0,), 6, GiB), Start(2, "n001", (1,), 4, GiB),
                        Start(3, "n001", (2,), 1, 15 * GiB + 1), Start(4, "n001", (3,), 2, 15 * GiB)])
    out, _ = apply([one], plan, [pending(k, cpus=c, mem_mb=m) for k, c, m in
                                 ((1, 6, GiB), (2, 4, GiB), (3, 1, 15 * GiB + 1), (4, 2, 15 * GiB))])
    assert [s.job_id for s in out.starts] == [1, 4]
    assert reasons(out) == ["on n001: 4 CPUs asked, 2 free", "on n001: 15361 MB of memory asked, 15360 MB free"]


def test_the_start_must_be_what_the_job_asks_for():
    mixed = node("n001", gpus=2, models=["H100-80GB", "A100-80GB"])
    cases = [
        (Start(1, "n001", (0, 0), 1, GiB), pending(1, 2), "on n001: a GPU is named twice in [0, 0]"),
        (Start(1, "n001", (0,), 1, GiB), pending(1, 2), "on n001: 1 GPUs given, the job asks for 2 a node"),
        (Start(1, "n001", (5,), 1, GiB), pending(1), "on n001: no GPU 5"),
        (Start(1, "n001", (1,), 1, GiB), pending(1, gpu_type="H100-80GB"),
         "on n001: GPU 1 is a A100-80GB, not a H100-80GB"),
        (Start(1, "n001", (0,), 1, GiB), pending(1, 2, nodes=2), "the job asks for 2 nodes, the plan gives it 1"),
        (Start(1, "n001", (0,), 1, GiB, parts=(Part("n001", (1,), 1, GiB),)), pending(1, 2, nodes=2),
         "node n001 is named twice"),
    ]
    for start, job, why in cases:
        out, _ = apply([mixed], Plan(starts=[start]), [job])
        assert reasons(out) == [why] and not out.starts
    out, _ = apply([mixed], Plan(starts=[Start(1, "n001", (0,), 1, GiB)] * 2), [pending(1)])
    assert len(out.starts) == 1 and reasons(out) == ["job 1 is started twice in the plan"]


def test_jobs_and_nodes_that_are_gone_are_refused_as_a_race():
    down = replace(node("n002"), schedulable=False)
    plan = Plan(starts=[Start(1, "n001", (0,), 1, GiB), Start(2, "n001", (0,), 1, GiB),
                        Start(3, "n002", (0,), 1, GiB), Start(4, "n009", (0,), 1, GiB)])
    out, _ = apply([node("n001"), down], plan, [pending(2, held=True), pending(3), pending(4)])
    assert reasons(out) == ["job 1 is not pending", "job 2 is held", "node n002 is not up", "node n009 is unknown"]
    assert all(r.gone for r in out.refused)


def test_exclusive_jobs_have_their_nodes_to_themselves():
    ns = nodes(2, gpus=4)
    plan = Plan(starts=[Start(1, "n001", (0,), 1, GiB), Start(2, "n001", (1,), 1, GiB), Start(3, "n002", (0,), 1, GiB)])
    out, state = apply(ns, plan, [pending(1), pending(2, exclusive=True), pending(3)],
                       [running(9, "n002", (3,), exclusive=True)])
    assert [s.job_id for s in out.starts] == [1]
    assert reasons(out) == ["on n001: the job is exclusive and the node is in use",
                            "on n002: an exclusive job holds the node"]


# -- gangs ----------------------------------------------------------------------------------

def test_a_gang_holds_on_all_its_nodes_or_on_none():
    ns = nodes(3, gpus=4)
    gang = Start(1, "n001", (0, 1), 1, GiB, parts=(Part("n002", (0, 1), 1, GiB), Part("n003", (2, 3), 1, GiB)))
    out, state = apply(ns, Plan(starts=[gang]), [pending(1, 6, nodes=3)], [running(9, "n003", (3,))])
    assert reasons(out) == ["on n003: GPU 3 is taken"]
    assert state.node("n001").free == {0, 1, 2, 3} and state.node("n002").free == {0, 1, 2, 3}
    out, state = apply(ns, Plan(starts=[gang]), [pending(1, 6, nodes=3)])
    assert out.starts == [gang]
    assert [state.node(n).free for n in ("n001", "n002", "n003")] == [{2, 3}, {2, 3}, {0, 1}]


# -- slices and shares ----------------------------------------------------------------------

def test_mig_slices_taken_gone_or_overlapping_are_refused():
    layout = [mig.Slice("1g.10gb", s) for s in range(7)]
    gpu = mig_gpu(0, dynamic=False, slices=layout, node="n1")
    n1 = shared_node("n1", [gpu])
    busy = slice_of(gpu, 3)
    run = [running(9, "n1", (), user="alice", devices=(busy,))]
    gone = Device(0, "mig", "MIG-n1-0-9", 9)
    plan = Plan(starts=[Start(1, "n1", (), 1, GiB, devices=(busy,)), Start(2, "n1", (), 1, GiB, devices=(gone,)),
                        Start(3, "n1", (), 1, GiB, devices=(slice_of(gpu, 4),)),
                        Start(4, "n1", (), 1, GiB, devices=(slice_of(gpu, 4),))])
    jobs = [pending(k, 1, user="bob", mig_profile="1g.10gb") for k in (1, 2, 3, 4)]
    out, state = apply([n1], plan, jobs, run)
    assert [s.job_id for s in out.starts] == [3]
    assert reasons(out) == ["on n1: slice MIG-n1-0-3-1g.10gb is taken", "on n1: slice MIG-n1-0-9 is gone from GPU 0",
                            f"on n1: slice {slice_of(gpu, 4).uuid} is taken"]
    assert state.node("n1").slices[0].keys() == {3, 4}
    # a slice recorded by a running job as 3g.40gb at slot 0 takes slots 0-3: a 1g.10gb at
    # slot 2 (another UUID, another start) overlaps it; one at slot 4 does not
    wide = Device(0, "mig", "MIG-old", 0, 40 * GiB, "3g.40gb")
    plan = Plan(starts=[Start(1, "n1", (), 1, GiB, devices=(slice_of(gpu, 2),)),
                        Start(2, "n1", (), 1, GiB, devices=(slice_of(gpu, 4),))])
    out, _ = apply([n1], plan, jobs[:2], [running(9, "n1", (), devices=(wide,))])
    assert reasons(out) == [f"on n1: slice {slice_of(gpu, 2).uuid} overlaps a slice in use on GPU 0"]
    assert [s.job_id for s in out.starts] == [2]


def test_fractions_over_a_gpus_capacity_are_refused():
    mps = mps_gpu(0, node="n1", clients=2)
    ts = timeslice_gpu(1, node="n1", replicas=2)
    n1 = shared_node("n1", [mps, ts])

    def share(gpu, mem=None):
        return Device(gpu.index, gpu.mode, gpu.uuid, None, mem)

    run = [running(9, "n1", (), user="alice", devices=(share(mps, 60 * GiB),)),
           running(8, "n1", (), user="carol", devices=(share(ts),))]
    plan = Plan(starts=[Start(1, "n1", (), 1, GiB, devices=(share(mps, 30 * GiB),)),     # 90 of 80 GiB
                        Start(2, "n1", (), 1, GiB, devices=(share(mps, GiB),)),          # another user
                        Start(3, "n1", (), 1, GiB, devices=(share(mps, 10 * GiB),)),
                        Start(4, "n1", (), 1, GiB, devices=(share(mps, 10 * GiB),)),     # 3rd client of 2
                        Start(5, "n1", (), 1, GiB, devices=(share(ts),)),
                        Start(6, "n1", (), 1, GiB, devices=(share(ts),))])               # 3rd replica of 2
    users = {1: "alice", 2: "bob", 3: "alice", 4: "alice", 5: "dave", 6: "erin"}
    out, state = apply([n1], plan, [pending(k, 1, user=u, gpu_mem_mb=GiB) for k, u in users.items()], run)
    assert [s.job_id for s in out.starts] == [3, 5]
    assert reasons(out) == ["on n1: MPS GPU 0 has not 30720 MB left", "on n1: MPS GPU 0 serves another user",
                            "on n1: MPS GPU 0 has 2 clients", "on n1: time-sliced GPU 1 has all 2 replicas taken"]
    assert [u for _, u, _ in state.node("n1").clients[0]] == ["alice", "alice"]


def test_devices_of_a_gpu_in_another_mode_or_held_whole_are_refused():
    mps = mps_gpu(0, node="n1")
    n1 = shared_node("n1", [mps, mig_gpu(1, node="n1")])
    plan = Plan(starts=[Start(1, "n1", (), 1, GiB, devices=(Device(1, "mps", "GPU-n1-1", None, GiB),)),
                        Start(2, "n1", (0,), 1, GiB), Start(3, "n1", (), 1, GiB,
                                                            devices=(Device(0, "mps", "GPU-other", None, GiB),))])
    out, _ = apply([n1], plan, [pending(1, 1, gpu_mem_mb=GiB), pending(2), pending(3, 1, gpu_mem_mb=GiB)])
    assert reasons(out) == ["on n1: GPU 1 is in mig mode now, not mps", "on n1: GPU 0 is in mps mode now",
                            "on n1: GPU 0 is GPU-n1-0 now, not GPU-other"]


def test_an_mps_dynamic_gpu_is_whole_or_shared_never_both_even_within_one_plan():
    gpu = GpuView(0, "GPU-0", "H100-80GB", 80 * GiB, mode="mps", dynamic=True)
    n1 = NodeView("n1", 64, 512 * GiB, (gpu,))
    whole, share = Device(0, "gpu", "GPU-0"), Device(0, "mps", "GPU-0", None, GiB)
    jobs = [pending(1, 1, gpu_mem_mb=GiB), pending(2, 1)]      # a share, a whole GPU
    # a whole start, then a share on it; a share, then a whole start on it
    for first, second, why in (
            (Start(2, "n1", (0,), 1, GiB), Start(1, "n1", (), 1, GiB, devices=(share,)),
             "on n1: GPU 0 is held whole now"),
            (Start(1, "n1", (), 1, GiB, devices=(share,)), Start(2, "n1", (0,), 1, GiB, devices=(whole,)),
             "on n1: GPU 0 serves MPS shares now")):
        out, _ = apply([n1], Plan(starts=[first, second]), jobs)
        assert [s.job_id for s in out.starts] == [first.job_id] and reasons(out) == [why]
    # once the share is given back, the GPU is whole again
    run = running(9, "n1", (), devices=(share,))
    state = Holdings([n1], [run])
    assert state.node("n1").free == set()
    state.release(run)
    assert state.node("n1").free == {0} and not state.node("n1").clients


# -- preemptions and re-layouts -------------------------------------------------------------

def test_a_preemption_frees_nothing_until_its_victim_exits():
    victim = running(9, "n001", range(8), qos="low", time_limit=None)
    plan = Plan(starts=[Start(1, "n001", (0,), 1, GiB)], preemptions=[Preemption(9, "requeue", 30.0, "x", 1)])
    out, state = apply(nodes(1), plan, [pending(1)], [victim])
    assert [p.job_id for p in out.preemptions] == [9]          # the victim is told to stop ...
    assert reasons(out) == ["on n001: GPU 0 is taken"]         # ... but holds its GPUs through its grace
    state.release(victim)                                     # it exited
    again = apply_plan(state, Plan(starts=plan.starts), {1: pending(1)}, {})
    assert again.starts == plan.starts and not again.refused


def test_preemptions_of_jobs_not_running_or_already_stopping_are_refused():
    run = [running(1, "n001", (0,)), running(2, "n001", (1,), stopping=True)]
    plan = Plan(preemptions=[Preemption(k, "requeue", 0.0, "x") for k in (1, 1, 2, 3)])
    out, _ = apply(nodes(1), plan, (), run)
    assert [p.job_id for p in out.preemptions] == [1]
    assert reasons(out) == ["job 1 is preempted twice in the plan", "job 2 is already being stopped",
                            "job 3 is not running"]
    assert [r.gone for r in out.refused] == [False, True, True]


def test_relayouts_destroy_only_free_slices_of_dynamic_gpus():
    layout = [mig.Slice("1g.10gb", s) for s in range(7)]
    gpu = mig_gpu(0, slices=layout, node="n1")
    n1 = shared_node("n1", [gpu, mig_gpu(1, dynamic=False, slices=layout, node="n1")])
    start = Start(1, "n1", (), 1, GiB, devices=(slice_of(gpu, 5),))       # takes slot 5 in the same plan
    plan = Plan(starts=[start], relayouts=[Relayout("n1", 0, (3,), (), "busy"), Relayout("n1", 0, (4, 6), (), "ok"),
                                           Relayout("n1", 0, (0,), (), "twice"), Relayout("n1", 0, (5,), (), "new"),
                                           Relayout("n1", 0, (9,), (), "absent"), Relayout("n1", 1, (), (), "static")])
    out, _ = apply([n1], plan, [pending(1, 1, mig_profile="1g.10gb")],
                   [running(9, "n1", (), devices=(slice_of(gpu, 3),))])
    assert [r.reason for r in out.relayouts] == ["ok"]
    assert reasons(out) == ["the slice at slot 3 is in use", "the GPU is re-laid twice in the plan",
                            "the GPU is re-laid twice in the plan", "the GPU is re-laid twice in the plan",
                            "GPU 1 is not a dynamic MIG GPU"]
    out, _ = apply([n1], Plan(starts=[start], relayouts=[Relayout("n1", 0, (5,), (), "new")]),
                   [pending(1, 1, mig_profile="1g.10gb")])
    assert reasons(out) == ["the slice at slot 5 is in use"]
    out, _ = apply([n1], Plan(relayouts=[Relayout("n1", 0, (9,), (), "absent")]))
    assert reasons(out) == ["no slice at slot 9"]


# -- a stale plan ---------------------------------------------------------------------------

def test_a_stale_plan_is_re_checked_against_the_state_that_changed():
    ns = nodes(2, gpus=2)
    run = [running(9, "n001", (0, 1), time_limit=None)]
    snap = snapshot(ns, [pending(1, 2), pending(2, 2), pending(3, 1), pending(4, 1)], run)
    plan = schedule(snap, 0.0)
    assert [(s.job_id, s.node) for s in plan.starts] == [(1, "n002")]
    # meanwhile: job 9 ended, job 1 was cancelled, job 5 took n002's GPU 0, and n002 lost GPU 1
    # (it re-registered with one GPU): nothing the plan starts holds, for its own reason
    n002 = replace(ns[1], gpus=ns[1].gpus[:1])
    out, state = apply([ns[0], n002], plan, [pending(2, 2), pending(3), pending(4)], [running(5, "n002", (0,))])
    assert reasons(out) == ["job 1 is not pending"] and out.refused[0].gone
    # the same plan with job 1 still pending: its GPUs are gone or taken
    out, _ = apply([ns[0], n002], plan, [pending(1, 2)], [running(5, "n002", (0,))])
    assert reasons(out) == ["on n002: GPU 0 is taken"]
    out, _ = apply([ns[0], n002], plan, [pending(1, 2)])
    assert reasons(out) == ["on n002: no GPU 1"]
    # what freed meanwhile does not matter to a start elsewhere: it still holds
    out, _ = apply(ns, plan, [pending(1, 2)])
    assert out.starts == plan.starts


def test_a_stale_slice_after_a_relayout_is_refused():
    layout = [mig.Slice("3g.40gb", 0), mig.Slice("3g.40gb", 4)]
    gpu = mig_gpu(0, slices=layout, node="n1")
    snap = snapshot([shared_node("n1", [gpu])], [pending(1, 1, mig_profile="3g.40gb")])
    plan = schedule(snap, 0.0)
    assert [d.slice_start for d in plan.starts[0].devices] == [0]
    # the GPU was re-cut meanwhile: slot 0 holds another slice (another UUID)
    recut = replace(gpu, slices=(replace(gpu.slices[0], uuid="MIG-new"), gpu.slices[1]))
    out, _ = apply([shared_node("n1", [recut])], plan, snap.pending)
    assert reasons(out) == [f"on n1: slice {gpu.slices[0].uuid} is gone from GPU 0"]


# -- the core's plans hold against their own snapshots ---------------------------------------

@pytest.mark.parametrize("seed", range(SNAPSHOTS))
def test_every_plan_of_the_saved_snapshots_holds_against_its_snapshot(seed):
    snap, now = golden_snapshot(seed)
    plan = schedule(snap, now)
    out, state = apply(snap.nodes, plan, snap.pending, snap.running)
    assert not out.refused
    assert out.starts == plan.starts and out.preemptions == plan.preemptions and out.relayouts == plan.relayouts
    # and holding then releasing every job leaves each node as it was
    started = {s.job_id: s for s in out.starts}
    for r in snap.running:
        state.release(r)
    for s in started.values():
        job = next(j for j in snap.pending if j.job_id == s.job_id)
        state.release(running(s.job_id, s.node, s.gpu_indices, user=job.user, cpus=s.cpus, mem_mb=s.mem_mb,
                              devices=s.devices, parts=s.parts, exclusive=job.exclusive))
    empty = Holdings(snap.nodes)
    for n in snap.nodes:
        h, e = state.node(n.name), empty.node(n.name)
        assert (h.free, h.whole, h.cpus, h.mem_mb, h.jobs, h.exclusive) == (e.free, e.whole, e.cpus, e.mem_mb, 0, 0)
        assert not any(h.slices.values()) and not h.clients
