"""Multi-node (gang) jobs in the simulator: sized from the trace, started on every node at
once, released together, reserved ahead of small jobs, never over-allocated."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpud.sched.config import sched_config_from_dict
from gpud.sched.core import schedule
from gpud.sched.snapshot import Snapshot
from gpud.sim.cluster import parse_cluster
from gpud.sim.engine import Simulation, simulate
from gpud.sim.report import size_bucket
from gpud.sim.synthetic import generate
from gpud.sim.trace import iter_trace

HEADER = "job_id,submit_s,gpus,duration_s,user,group,gpu_type,status,time_limit_s,qos\n"


def trace(*rows: str) -> list:
    return list(iter_trace(io.StringIO(HEADER + "".join(r + "\n" for r in rows))))


def spied(nodes, jobs, config=None, **kw):
    """A Simulation whose core calls are recorded as (now, snapshot, plan)."""
    seen = []

    def spy(snap: Snapshot, now: float):
        plan = schedule(snap, now)
        seen.append((now, snap, plan))
        return plan

    return Simulation(nodes, jobs, config, schedule=spy, record_starts=True, **kw), seen


def nodes_of(run) -> list[str]:
    return [run.node, *(p.node for p in run.parts)]


def test_a_job_bigger_than_a_node_runs_on_n_nodes_at_once():
    sim, seen = spied(parse_cluster("3x4xH100-80GB"), trace("big,0,8,100,u,a,,,100,"))
    r = sim.run()
    assert r["jobs"]["multi_node"] == 1 and r["jobs"]["rounded_up"] == 0
    assert r["jobs"]["completed"] == 1 and r["makespan_s"] == 100
    (start,) = [s for _, _, plan in seen for s in plan.starts]
    assert len(start.parts) == 1 and {start.node, start.parts[0].node} <= {"n0001", "n0002", "n0003"}
    assert len(start.gpu_indices) == 4 and len(start.parts[0].gpu_indices) == 4
    assert r["accounts"]["a"]["gpu_seconds_allocated"] == 8 * 100
    assert r["by_size"]["5-8"]["jobs_started"] == 1


def test_gpus_round_up_to_n_nodes_times_g():
    # 9 GPUs on 8-GPU nodes: 2 nodes of 5; 12: 2 nodes of 6 exactly; 17: 3 nodes of 6
    r = simulate(parse_cluster("3x8xH100-80GB"),
                 trace("a,0,9,10,u,a,,,10,", "b,0,12,10,u,a,,,10,", "c,0,17,10,u,a,,,10,"))
    assert r["jobs"]["multi_node"] == 3 and r["jobs"]["rounded_up"] == 2
    assert r["accounts"]["a"]["gpu_seconds_allocated"] == (10 + 12 + 18) * 10
    assert set(r["by_size"]) == {"9-16", "17-32"}
    assert size_bucket(64, 64.0) == "33+"


def test_a_gang_the_cluster_cannot_hold_is_refused_at_arrival():
    jobs = trace("a,0,24,10,u,a,,,10,", "b,0,16,10,u,a,H100-80GB,,10,", "c,0,8,10,u,a,A100-80GB,,10,")
    r = simulate(parse_cluster("2x8xH100-80GB,1x8xA100-80GB"), jobs)
    assert r["jobs"]["infeasible"] == {}
    r = simulate(parse_cluster("1x8xH100-80GB,1x8xA100-80GB"), jobs)
    # 24 GPUs need 3 nodes, 16 of H100 need 2 H100 nodes: neither exists
    assert r["jobs"]["infeasible"] == {"too_many_gpus": 2} and r["jobs"]["completed"] == 1


def test_a_gang_releases_all_its_nodes_together():
    sim, seen = spied(parse_cluster("2x4xH100-80GB"),
                      trace("g1,0,8,100,u,a,,,100,", "g2,1,8,50,u,a,,,50,", "s,2,4,10,u,a,,,10,"))
    sim.run()
    starts = {job: t for t, job, _, _ in sim.start_log}
    # nothing fits beside the first gang; at 100 both nodes free at once
    assert starts["g1"] == 0 and min(starts["g2"], starts["s"]) == 100
    for now, snap, _ in seen:
        for run in snap.running:
            if len(run.parts) == 1:
                assert sorted(nodes_of(run)) == ["n0001", "n0002"]
        if 0 < now < 100:
            assert len(snap.running) == 1


def test_a_gang_keeps_its_reservation_while_small_jobs_backfill():
    # L holds 2 GPUs of node 1 until 1000; the gang G needs both nodes whole and reserves 1000.
    # S1 ends before that and backfills; S2 would run past it and must wait for G.
    sim, seen = spied(parse_cluster("2x4xH100-80GB"), trace(
        "L,0,2,1000,u,a,,,1000,", "G,1,8,100,v,b,,,100,",
        "S1,2,2,500,w,c,,,500,", "S2,3,2,2000,w,c,,,2000,"), exact_limits=True)
    r = sim.run()
    starts = {job: t for t, job, _, _ in sim.start_log}
    assert starts == {"L": 0, "S1": 2, "G": 1000, "S2": 1100}
    assert r["jobs"]["completed"] == 4
    reserved = [plan.expected_starts[2] for now, _, plan in seen if 1 <= now < 1000
                and 2 in plan.expected_starts]
    assert reserved and all(t == 1000 for t in reserved)


def test_a_gang_is_never_a_preemption_victim():
    config = sched_config_from_dict({
        "preemption": {"exempt_time": "0s"},
        "qos": {"low": {}, "high": {"priority": 10, "preempt": ["low"], "grace_time": "0s"}}})
    sim, seen = spied(parse_cluster("2x4xH100-80GB"), trace(
        "G,0,8,100,u,a,,,100,low", "hi,10,1,10,v,b,,,10,high"), config)
    r = sim.run()
    assert r["preemptions"] == 0
    assert {job: t for t, job, _, _ in sim.start_log} == {"G": 0, "hi": 100}


def test_synthetic_big_jobs_become_gangs():
    nodes = parse_cluster("8x8xH100-80GB")
    jobs = generate("mixed", 400, 2, gpus=64, max_gpus=8, load=1.0)
    big = [j for j in jobs if j.gpus > 8]
    assert big
    r = simulate(nodes, jobs)
    assert r["jobs"]["multi_node"] == len(big) and r["jobs"]["infeasible"] == {}
    assert r["jobs"]["pending"] == 0 and r["jobs"]["completed"] == len(jobs)


# -- never over-allocated, over random traffic with gangs ------------------------------------

row = st.tuples(
    st.integers(0, 3000),                                      # submit
    st.sampled_from(["1", "2", "4", "8", "9", "12", "16", "24", "0.5"]),   # gpus
    st.integers(1, 3000),                                      # duration
    st.sampled_from(["a", "b", "c"]),                          # account
    st.sampled_from(["", "500", "3000"]),                      # time limit
    st.sampled_from(["", "", "high"]),                         # QOS
)
POLICY = sched_config_from_dict({
    "preemption": {"exempt_time": "0s"},
    "qos": {"normal": {}, "high": {"priority": 10, "preempt": ["normal"], "grace_time": "30s"}}})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(row, max_size=30),
       spec=st.sampled_from(["3x8xH100-80GB", "2x4xH100-80GB,2x8xA100-80GB", "4x4xH100-80GB"]),
       preempt=st.booleans())
def test_never_over_allocated(rows, spec, preempt):
    text = HEADER + "".join(f"j{i},{s},{g},{d},u{i % 4},{a},,,{tl},{q if preempt else ''}\n"
                            for i, (s, g, d, a, tl, q) in enumerate(sorted(rows)))
    jobs = list(iter_trace(io.StringIO(text)))
    nodes = parse_cluster(spec)
    sim, seen = spied(nodes, jobs, POLICY if preempt else None)
    r = sim.run()
    capacity = {n.name: (len(n.gpus), n.cpus, n.mem_mb) for n in nodes}
    for _, snap, _ in seen:
        held: dict[str, list[int]] = {n: [] for n in capacity}
        cpus = dict.fromkeys(capacity, 0)
        mem = dict.fromkeys(capacity, 0)
        for run in snap.running:
            assert len(set(nodes_of(run))) == len(nodes_of(run))
            pieces = [(run.node, run.gpu_indices, run.cpus, run.mem_mb),
                      *((p.node, p.gpu_indices, p.cpus, p.mem_mb) for p in run.parts)]
            assert len({len(g) for _, g, _, _ in pieces}) == 1    # the same share on every node
            for node, gpus, c, m in pieces:
                held[node] += gpus
                cpus[node] += c
                mem[node] += m
        for name, (g, c, m) in capacity.items():
            assert len(held[name]) == len(set(held[name])) and all(0 <= i < g for i in held[name])
            assert cpus[name] <= c and mem[name] <= m
        # the core never picks a gang as a victim
        assert not any(run.parts and run.stopping for run in snap.running)
    j = r["jobs"]
    assert j["submitted"] == sum(j["ended"].values()) + j["pending"] + j["running"]
    assert j["pending"] == 0 and j["running"] == 0
    used = sum(a["gpu_seconds_allocated"] for a in r["accounts"].values())
    assert used <= r["cluster"]["gpus"] * r["simulated_s"] + 1e-6
    assert abs(sim.allocated) < 1e-9          # everything given back
    assert all(len(free) == len([g for g in n.gpus if g.mode == "whole"])
               for n in nodes for free in [sim._free[n.name]])
