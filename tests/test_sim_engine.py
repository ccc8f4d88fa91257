"""The simulation engine on small, hand-computed scenarios, driving the real core."""

from __future__ import annotations

import io
import random

import pytest

from gpud.sched.core import schedule
from gpud.sched.plan import Preemption
from gpud.sim.cluster import parse_cluster
from gpud.sim.engine import Simulation, simulate
from gpud.sim.report import format_text, percentile
from gpud.sim.trace import TraceStats, iter_trace

HEADER = "job_id,submit_s,gpus,duration_s,user,group,gpu_type,status,time_limit_s\n"


def trace(*rows: str) -> list:
    return list(iter_trace(io.StringIO(HEADER + "".join(r + "\n" for r in rows))))


# Four GPUs.  j1 and j2 fill them at t=0; j3 (4 GPUs) must wait for both; j4 (1 GPU, short)
# fits when j2 ends and finishes long before j3 could start, so any policy starts it at 50
# (time limits equal durations, so backfill can prove it delays nobody).
SCENARIO = trace(
    "j1,0,2,100,u1,a,,,100",
    "j2,0,2,50,u2,b,,,50",
    "j3,10,4,30,u1,a,,,30",
    "j4,20,1,10,u2,b,,,10",
)


def test_hand_computed_scenario():
    r = simulate(parse_cluster("1x4xH100-80GB"), SCENARIO)
    # starts: j1 0, j2 0, j4 50, j3 100 -> ends 100, 50, 60, 130
    assert r["makespan_s"] == 130
    assert r["wait_s"]["mean"] == pytest.approx((0 + 0 + 90 + 30) / 4)
    assert r["wait_s"]["max"] == 90
    assert r["accounts"]["a"]["gpu_seconds"] == 2 * 100 + 4 * 30
    assert r["accounts"]["b"]["gpu_seconds"] == 2 * 50 + 1 * 10
    assert r["accounts"]["a"]["mean_wait_s"] == 45 and r["accounts"]["b"]["mean_wait_s"] == 15
    assert r["accounts"]["a"]["share"] == pytest.approx(320 / 430)
    assert r["accounts"]["a"]["jobs_started"] == 2
    # jobs wait during [10, 100): 4/4 GPUs busy until 50, 3/4 until 60, 2/4 until 100
    assert r["gpu_allocation"] == pytest.approx((40 * 4 + 10 * 3 + 40 * 2) / (90 * 4))
    assert r["utilization"] == pytest.approx(430 / (4 * 130))
    assert r["jobs"]["completed"] == 4 and r["jobs"]["pending"] == r["jobs"]["running"] == 0
    assert r["preemptions"] == 0


def test_until_stops_the_clock_and_cuts_gpu_seconds():
    r = simulate(parse_cluster("1x4xH100-80GB"), SCENARIO, until=70)
    assert r["end_time"] == 70
    assert r["makespan_s"] is None
    assert r["accounts"]["a"]["gpu_seconds"] == 2 * 70
    assert r["accounts"]["b"]["gpu_seconds"] == 2 * 50 + 1 * 10
    assert r["jobs"]["pending"] == 1 and r["jobs"]["running"] == 1
    assert r["jobs"]["completed"] == 2


def test_until_before_later_arrivals_leaves_them_unread():
    stats = TraceStats()
    rows = iter_trace(io.StringIO(HEADER + "a,0,1,10,,,,,\nb,5,1,10,,,,,\nc,1000,1,10,,,,,\n"
                                  + "d,2000,1,10,,,,,\n"), stats)
    r = simulate(parse_cluster("1x1xH100-80GB"), rows, until=100, trace_stats=stats)
    assert r["jobs"]["submitted"] == 2
    assert stats.rows == 3  # one row of lookahead, never the rest


def test_time_limit_ends_a_run_as_timeout():
    r = simulate(parse_cluster("1x1xH100-80GB"), trace("t,0,1,100,,a,,,60", "n,0,1,10,,a,,,"))
    assert r["jobs"]["ended"] == {"COMPLETED": 1, "TIMEOUT": 1}
    assert r["accounts"]["a"]["gpu_seconds"] == 60 + 10
    assert r["makespan_s"] == 70


def test_shares_are_billed_their_fraction_but_hold_a_whole_gpu():
    r = simulate(parse_cluster("1x1xH100-80GB"), trace("s1,0,0.25,100,,a,,,", "s2,0,0.5,100,,a,,,"))
    a = r["accounts"]["a"]
    assert a["gpu_seconds"] == pytest.approx(25 + 50)
    assert a["gpu_seconds_allocated"] == 200
    assert r["makespan_s"] == 200  # one GPU, so they run one after the other


def test_infeasible_jobs_are_refused_at_arrival():
    jobs = trace("big,0,24,10,,a,,,", "typ,0,1,10,,a,A100-80GB,,", "ok,0,2,10,,a,H100-80GB,,")
    r = simulate(parse_cluster("2x8xH100-80GB"), jobs)
    assert r["jobs"]["infeasible"] == {"no_such_gpu_type": 1, "too_many_gpus": 1}
    assert r["jobs"]["submitted"] == 1
    r = simulate(parse_cluster("2x8xH100-80GB"), jobs, ignore_gpu_type=True)
    assert r["jobs"]["infeasible"] == {"too_many_gpus": 1}


def test_gpu_type_places_on_matching_nodes():
    nodes = parse_cluster("1x2xH100-80GB,1x2xA100-80GB")
    seen = []

    def spy(snap, now):
        plan = schedule(snap, now)
        seen.extend(plan.starts)
        return plan

    Simulation(nodes, trace("a,0,2,10,,x,A100-80GB,,", "h,0,2,10,,x,H100-80GB,,"),
               schedule=spy).run()
    assert {s.job_id: s.node for s in seen} == {1: "n0002", 2: "n0001"}


def test_events_at_one_time_share_one_pass():
    jobs = trace(*[f"j{i},0,1,10,,a,,," for i in range(8)])
    r = simulate(parse_cluster("1x8xH100-80GB"), jobs)
    assert r["scheduler_passes"] == 1
    assert r["makespan_s"] == 10


def preempting(at: float, job_id: int, mode: str, grace: float):
    """The real core, plus one preemption the test asks for (the core decides the rest)."""
    done = []

    def policy(snap, now):
        plan = schedule(snap, now)
        running = {r.job_id: r for r in snap.running}
        if now >= at and not done and job_id in running:
            done.append(now)
            plan.preemptions.append(Preemption(job_id, mode, grace, "test"))
        return plan
    return policy


def test_preemption_requeues_after_grace_keeping_submit_time():
    # j1 (2 GPUs, 100 s) is preempted at 30, when j2 arrives (and takes the other node),
    # with 5 s grace: its GPUs free at 35, it is requeued and runs its whole duration again.
    jobs = trace("j1,0,2,100,,a,,,", "j2,30,2,10,,b,,,")
    core = preempting(30, 1, "requeue", 5)
    pending_seen = {}

    def spy(snap, now):
        pending_seen.update({(now, p.job_id): p for p in snap.pending})
        return core(snap, now)

    r = Simulation(parse_cluster("2x2xH100-80GB"), jobs, schedule=spy).run()
    assert r["preemptions"] == 1 and r["jobs"]["restarts"] == 1
    assert r["jobs"]["ended"] == {"COMPLETED": 2}
    again = pending_seen[(35, 1)]
    assert (again.submit_time, again.preempt_count) == (0, 1)
    assert r["accounts"]["a"]["gpu_seconds"] == 2 * 35 + 2 * 100
    assert r["accounts"]["a"]["mean_wait_s"] == 0  # waits count to the first start only
    assert r["makespan_s"] == 135


def test_preemption_in_cancel_mode_ends_the_job():
    jobs = trace("j1,0,1,100,,a,,,", "j2,10,1,10,,b,,,")
    r = Simulation(parse_cluster("1x1xH100-80GB"), jobs,
                   schedule=preempting(10, 1, "cancel", 0)).run()
    assert r["jobs"]["ended"] == {"COMPLETED": 1, "PREEMPTED": 1}
    assert r["accounts"]["a"]["gpu_seconds"] == 10
    assert r["accounts"]["b"]["mean_wait_s"] == 0
    assert r["makespan_s"] == 20


def test_the_stop_decides_even_if_the_job_ends_within_its_grace():
    # As in the head: a requeue preemption requeues even when the run ends meanwhile.
    jobs = trace("j1,0,1,12,,a,,,", "j2,5,1,3,,b,,,")
    r = Simulation(parse_cluster("1x1xH100-80GB"), jobs,
                   schedule=preempting(5, 1, "requeue", 30)).run()
    assert r["preemptions"] == 1 and r["jobs"]["restarts"] == 1
    assert r["jobs"]["ended"] == {"COMPLETED": 2}
    assert r["accounts"]["a"]["gpu_seconds"] == 12 + 12
    assert r["makespan_s"] == 12 + 12 + 3


def test_a_core_that_plans_the_impossible_is_contained():
    def bad(snap, now):
        plan = schedule(snap, now)
        from gpud.sched.plan import Start
        plan.starts.append(Start(999, "n0001", (0,), 1, 1))      # no such job
        plan.starts.append(Start(1, "nowhere", (0,), 1, 1))      # no such node
        return plan

    r = Simulation(parse_cluster("1x1xH100-80GB"), trace("j,0,1,5,,a,,,"), schedule=bad).run()
    assert r["jobs"]["completed"] == 1


def synthetic(seed: int, n: int, accounts=("a", "b", "c")) -> list:
    rnd = random.Random(seed)
    t, rows = 0.0, []
    for i in range(n):
        t += rnd.expovariate(1 / 600)
        rows.append(f"j{i},{t:.0f},{rnd.choice([1, 1, 1, 2, 4, 8, 0.5])},"
                    f"{rnd.randint(60, 7200)},u{rnd.randint(1, 5)},{rnd.choice(accounts)},,,")
    return trace(*rows)


def test_same_input_same_report():
    jobs = synthetic(7, 300)
    nodes = parse_cluster("2x8xH100-80GB")
    first = simulate(nodes, jobs)
    assert simulate(nodes, jobs) == first
    assert first["jobs"]["submitted"] == 300 and first["wait_s"]["p95"] > 0


def test_text_report_renders():
    text = format_text(simulate(parse_cluster("1x4xH100-80GB"), SCENARIO))
    assert "Makespan     00:02:10" in text
    assert "a " in text and "74.4%" in text


def test_percentile():
    assert percentile([1.0], 95) == 1.0
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile([float(i) for i in range(101)], 95) == 95.0


def test_no_pass_when_no_waiting_job_fits_the_free_gpus():
    # j3 needs all 8 GPUs: j2's end at 10 frees 4, which no waiting job can use.
    jobs = trace("j1,0,4,100,,a,,,", "j2,0,4,10,,a,,,", "j3,1,8,10,,a,,,")
    r = simulate(parse_cluster("1x8xH100-80GB"), jobs)
    assert r["scheduler_passes"] == 2      # t=0 and t=100
    assert r["wait_s"]["max"] == 99 and r["makespan_s"] == 110


def test_pass_interval_defers_starts_to_the_next_allowed_pass():
    jobs = trace("j1,0,1,10,,a,,,", "j2,0,1,10,,a,,,", "j3,5,1,10,,a,,,")
    r = simulate(parse_cluster("1x1xH100-80GB"), jobs, pass_interval=60)
    # passes at 0 (j1), 60 (j2; j1 ended at 10), 120 (j3; j2 ended at 70)
    assert r["scheduler_passes"] == 3
    assert r["wait_s"]["max"] == 115 and r["makespan_s"] == 130


def cfg(data: dict):
    from gpud.sched.config import sched_config_from_dict
    return sched_config_from_dict(data, "<test>")


def test_trace_accounts_join_the_tree():
    r = simulate(parse_cluster("1x2xH100-80GB"), trace("x,0,1,5,,a,,,", "y,0,1,5,,b,,,", "z,0,1,5,,,,,"))
    assert r["accounts_added"] == ["a", "b"]
    assert set(r["accounts"]) == {"a", "b", "default"}
    assert r["jobs"]["completed"] == 3


PREEMPTING_QOS = {"normal": {}, "high": {"priority": 100, "preempt": ["low"]}, "low": {"grace_time": "30s"}}


def low_then_high(config) -> dict:
    """low j1 (1,000 s) runs from 0; high j2 (10 s) arrives at 700, past the 600 s exempt
    time, on the one GPU."""
    rows = HEADER.replace("time_limit_s", "time_limit_s,qos") + \
        "j1,0,1,1000,,a,,,,low\n" + "j2,700,1,10,,b,,,,high\n"
    return simulate(parse_cluster("1x1xH100-80GB"), list(iter_trace(io.StringIO(rows))), config)


def test_qos_preemption_through_the_real_core():
    # j2 preempts j1; j1's 30 s grace ends at 730, j2 runs 730-740, j1 runs again 740-1740.
    r = low_then_high(cfg({"qos": PREEMPTING_QOS}))
    assert r["preemptions"] == 1 and r["jobs"]["restarts"] == 1
    assert r["accounts"]["b"]["mean_wait_s"] == 30
    assert r["accounts"]["a"]["gpu_seconds"] == 730 + 1000
    assert r["makespan_s"] == 1740


def test_the_gpu_stopped_for_a_preemptor_goes_to_it_not_back_to_its_victim():
    # As above, but age alone orders the queue, so the requeued j1 (submitted first)
    # outranks j2.  j2's claim on what it stopped puts it first: it starts when j1's grace
    # ends (730) instead of j1 taking its GPU back and running to 1730.
    weights = {"qos": 0, "fairshare": 0, "job_size": 0, "partition": 0}
    r = low_then_high(cfg({"scheduler": {"weights": weights}, "qos": PREEMPTING_QOS}))
    assert r["preemptions"] == 1 and r["jobs"]["restarts"] == 1
    assert r["accounts"]["b"]["mean_wait_s"] == 30
    assert r["makespan_s"] == 1740


def test_refusals_and_partition_limits():
    config = cfg({"partition": [{"name": "gpu", "max_time": "100s", "default_time": "50s"}],
                  "qos": {"normal": {}}})
    rows = HEADER.replace("time_limit_s", "time_limit_s,qos") + (
        "long,0,1,10,,a,,,200,\n"      # asks for more than max_time
        "qos,0,1,10,,a,,,,gold\n"      # no such QOS
        "cut,0,1,150,,a,,,,\n")        # no limit given: max_time applies, ends TIMEOUT
    r = simulate(parse_cluster("1x1xH100-80GB"), list(iter_trace(io.StringIO(rows))), config)
    assert r["jobs"]["infeasible"] == {"no_such_qos": 1, "over_time_limit": 1}
    assert r["jobs"]["ended"] == {"TIMEOUT": 1}
    assert r["accounts"]["a"]["gpu_seconds"] == 100


def test_exact_limits_give_jobs_their_duration():
    seen = {}

    def spy(snap, now):
        seen.update({p.job_id: p.time_limit for p in snap.pending})
        return schedule(snap, now)

    jobs = trace("a,0,1,30,,x,,,", "b,0,1,40,,x,,,15")
    Simulation(parse_cluster("1x1xH100-80GB"), jobs, exact_limits=True, schedule=spy).run()
    assert seen == {1: 30, 2: 15}


def test_billing_weights_shape_fair_share_usage():
    config = cfg({"billing": {"weights": {"H100-80GB": 2.0}}, "scheduler": {"fairshare_half_life": "unlimited"}})
    usage = []

    def spy(snap, now):
        usage.append(dict(snap.usage))
        return schedule(snap, now)

    Simulation(parse_cluster("1x2xH100-80GB"), trace("a,0,0.5,100,u,x,,,", "b,200,1,1,u,x,,,"),
               config, schedule=spy).run()
    assert usage[-1][("x", "u")] == pytest.approx(0.5 * 2.0 * 100)
