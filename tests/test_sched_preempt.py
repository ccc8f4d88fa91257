"""QOS preemption: victims, and the caps that always hold."""

from __future__ import annotations

from dataclasses import replace

from gpud.sched.core import claimants_first as core_claimants_first
from gpud.sched.core import schedule
from gpud.sched.snapshot import live_claims

from .sched_builders import ToyCluster, config, node, nodes, pending, running, snapshot

MIN = 60.0
HOUR = 3600.0
QOS = {"normal": {}, "high": {"priority": 1000, "preempt": ["low"]},
       "low": {"preempt_mode": "requeue", "grace_time": "30s"}}


def qos_config(**preemption):
    return config(qos=QOS, preemption=preemption) if preemption else config(qos=QOS)


def test_victims_borrowed_first_then_lowest_priority_then_youngest():
    cfg = config(qos=QOS, accounts={"a": {"gpu_quota": 2, "users": ["*"]}})
    run = [running(1, "n001", (0,), qos="low", start_time=0.0, time_limit=None, account="a", user="x"),
           running(2, "n001", (1,), qos="low", start_time=100.0, time_limit=None, account="a", user="x"),
           running(3, "n001", (2,), qos="low", start_time=50.0, time_limit=None, account="a", user="x",
                   borrowed=True),
           running(4, "n001", (3,), qos="normal", start_time=0.0, time_limit=None, account="a", user="x")]
    one = node("n001", gpus=4)
    snap = snapshot([one], [pending(9, 1, qos="high", account="a", user="x")], run, cfg=cfg)
    plan = schedule(snap, 2 * HOUR)
    assert [p.job_id for p in plan.preemptions] == [3]            # borrowed beats younger
    snap = snapshot([one], [pending(9, 2, qos="high", account="a", user="x")], run, cfg=cfg)
    assert sorted(p.job_id for p in schedule(snap, 2 * HOUR).preemptions) == [2, 3]   # then youngest
    p = schedule(snap, 2 * HOUR).preemptions[0]
    assert (p.mode, p.grace_time, p.reason, p.for_job) == ("requeue", 30.0, "QOS high preempts low", 9)


def test_only_what_is_needed_and_only_listed_qos():
    run = [running(1, "n001", (0, 1, 2, 3), qos="low", time_limit=None),
           running(2, "n001", (4, 5, 6, 7), qos="normal", time_limit=None)]
    snap = snapshot(nodes(1), [pending(9, 4, qos="high")], run, cfg=qos_config())
    plan = schedule(snap, HOUR)
    assert [p.job_id for p in plan.preemptions] == [1]
    assert plan.reasons[9] == "Resources" and plan.expected_starts[9] == HOUR
    snap = snapshot(nodes(1), [pending(9, 5, qos="high")], run, cfg=qos_config())
    assert schedule(snap, HOUR).preemptions == []                # normal jobs are not fair game


def test_non_requeueable_victims_are_cancelled():
    run = [running(1, "n001", range(8), qos="low", time_limit=None, requeue=False)]
    snap = snapshot(nodes(1), [pending(9, 1, qos="high")], run, cfg=qos_config())
    assert schedule(snap, HOUR).preemptions[0].mode == "cancel"


def test_stopping_jobs_are_not_picked_again_nor_counted_twice():
    run = [running(1, "n001", range(4), qos="low", time_limit=None, stopping=True),
           running(2, "n001", range(4, 8), qos="low", time_limit=None)]
    pend = [pending(9, 4, qos="high"), pending(10, 4, qos="high")]
    plan = schedule(snapshot(nodes(1), pend, run, cfg=qos_config()), HOUR)
    # 9 waits for job 1's GPUs; 10 needs one more victim, job 2
    assert [(p.job_id, p.for_job) for p in plan.preemptions] == [(2, 10)]
    assert plan.expected_starts == {9: HOUR, 10: HOUR}


def test_exempt_time_protects_young_jobs():
    run = [running(1, "n001", range(8), qos="low", start_time=HOUR - 9 * MIN, time_limit=2 * HOUR)]
    snap = snapshot(nodes(1), [pending(9, 8, qos="high")], run, cfg=qos_config())
    plan = schedule(snap, HOUR)
    assert plan.preemptions == []
    assert plan.expected_starts[9] == HOUR - 9 * MIN + 2 * HOUR   # reserved at the victim's end
    assert [p.job_id for p in schedule(snap, HOUR + MIN).preemptions] == [1]


def test_a_job_preempted_max_per_job_times_runs_to_completion():
    toy = ToyCluster((node("n001", gpus=1),), qos_config(exempt_time="10m", max_per_job=3))
    low = toy.submit(1, duration=5 * HOUR, time_limit=6 * HOUR, qos="low")
    t = 0.0
    while toy.now < 12 * HOUR:                 # a high job every 30 minutes, each 20 minutes long
        t += 30 * MIN
        toy.run(until=t, interval=5 * MIN)
        toy.submit(1, duration=20 * MIN, time_limit=HOUR, qos="high")
    assert len(toy.events("preempt", low)) == 3
    assert toy.done.get(low) == "COMPLETED"
    starts = toy.events("start", low)
    for when in toy.events("preempt", low):
        last = max(s for s in starts if s <= when)
        assert when - last >= 10 * MIN              # never before exempt_time


def test_never_more_than_max_per_minute():
    toy = ToyCluster(nodes(4), qos_config(max_per_minute=5, exempt_time="1m"))
    for _ in range(32):
        toy.submit(1, duration=10 * HOUR, time_limit=None, qos="low")
    toy.run(until=10 * MIN, interval=10)
    assert len(toy.running) == 32
    for _ in range(32):
        toy.submit(1, duration=HOUR, time_limit=2 * HOUR, qos="high")
    toy.run(until=30 * MIN, interval=10)
    times = sorted(toy.preempt_times)
    assert len(times) == 32                       # all of them, eventually
    for k, t in enumerate(times):
        assert sum(1 for u in times[k:] if u - t < 60) <= 5


# -- claims: what a preemption frees goes to the job it was for ---------------------------------

# QOS gives no priority here, age does: a requeued victim (submitted first) outranks the
# high job that preempted it, as with a site whose QOS weight is below its other weights.
AGE_ONLY = {"weights": {"qos": 0, "fairshare": 0, "job_size": 0, "partition": 0, "age": 1000}}


def test_a_requeued_victim_does_not_take_back_what_was_stopped_for_its_preemptor():
    toy = ToyCluster((node("n001", gpus=1),), config(qos=QOS, scheduler=AGE_ONLY, preemption={"exempt_time": "1m"}))
    low = toy.submit(1, duration=5 * HOUR, time_limit=6 * HOUR, qos="low")
    toy.run(until=10 * MIN, interval=MIN)
    high = toy.submit(1, duration=20 * MIN, time_limit=HOUR, qos="high")
    toy.run(until=2 * HOUR, interval=MIN)
    assert toy.events("preempt", low) == [10 * MIN]
    assert toy.events("start", high) == [10 * MIN + 30]       # when low's 30 s grace ended
    assert toy.events("start", low) == [0, 30 * MIN + 30]     # again once high is done
    assert toy.claims == {}                                    # the claim ended with high's start


def test_without_a_claim_the_victim_would_take_the_gpu_back():
    # The same queue as the head sees it after low exited: low (requeued, older) ranks first.
    pend = [pending(1, 1, qos="low", submit_time=0.0), pending(2, 1, qos="high", submit_time=600.0)]
    cfg = config(qos=QOS, scheduler=AGE_ONLY)
    snap = snapshot([node("n001", gpus=1)], pend, cfg=cfg)
    assert [s.job_id for s in schedule(snap, HOUR).starts] == [1]
    claimed = replace(snap, claims=((1, 2),))
    assert [s.job_id for s in schedule(claimed, HOUR).starts] == [2]
    assert schedule(claimed, HOUR).reasons[1] == "Resources"


def test_claimants_go_first_in_queue_order_and_after_their_own_preemptor():
    jobs = [pending(k) for k in range(1, 7)]

    def claimants_first(queue, claims):
        return core_claimants_first(queue, claims, {j.job_id for j in queue})

    def ids(q):
        return [j.job_id for j in q]

    assert ids(claimants_first(jobs, ())) == [1, 2, 3, 4, 5, 6]
    assert ids(claimants_first(jobs, ((1, 5), (2, 4)))) == [4, 5, 1, 2, 3, 6]
    # 4 preempted 9 (gone since) and was itself preempted for 6: 6 first, then 4
    assert ids(claimants_first(jobs, ((9, 4), (4, 6)))) == [6, 4, 1, 2, 3, 5]
    # a preemptor no longer pending claims nothing
    assert ids(claimants_first(jobs, ((1, 99),))) == [1, 2, 3, 4, 5, 6]
    # a cycle (never made by the rules) still gives every job once
    assert sorted(ids(claimants_first(jobs, ((4, 6), (6, 4))))) == [1, 2, 3, 4, 5, 6]


def test_live_claims_end_when_the_preemptor_starts_or_the_victim_runs_again():
    claims = {1: 10, 2: 10, 3: 11, 4: 12}
    pending_ids, running_again = {10, 11}, {3}
    assert live_claims(claims, pending_ids.__contains__, running_again.__contains__) == {1: 10, 2: 10}
