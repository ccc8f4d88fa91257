"""Reservations for waiting jobs and backfill that never delays them."""

from __future__ import annotations

from gpud.sched.backfill import Timeline
from gpud.sched.core import schedule
from gpud.sched.placement import Cluster

from .sched_builders import ToyCluster, config, node, nodes, pending, running, snapshot

MIN = 60.0
HOUR = 3600.0
BIG = node("big", gpus=16, cpus=128)


def busy_half() -> list:
    """8 of the 16 GPUs busy, freeing one by one over 4 hours."""
    return [running(100 + k, "big", (k,), start_time=0.0, time_limit=(k + 1) * 30 * MIN) for k in range(8)]


def test_big_job_reserved_small_jobs_fill_the_gap():
    pend = [pending(1, 16, submit_time=0.0),
            pending(2, 4, submit_time=10.0, time_limit=HOUR),        # ends before the reservation
            pending(3, 4, submit_time=20.0, time_limit=8 * HOUR),    # would delay it
            pending(4, 4, submit_time=30.0, time_limit=2 * HOUR)]
    plan = schedule(snapshot([BIG], pend, busy_half()), 0.0)
    assert plan.expected_starts[1] == 4 * HOUR and plan.reserved_nodes[1] == "big"
    assert plan.reasons[1] == "Resources"
    assert [s.job_id for s in plan.starts] == [2, 4]
    assert plan.reasons[3] == "Priority"


def test_backfill_may_use_what_the_reservation_does_not_need():
    run = [running(100, "big", range(8), start_time=0.0, time_limit=4 * HOUR)]
    pend = [pending(1, 12, submit_time=0.0), pending(2, 4, submit_time=1.0, time_limit=None)]
    plan = schedule(snapshot([BIG], pend, run), 0.0)
    # the 12-GPU job needs 12 of the 16 at 4h: 4 GPUs are spare for ever
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.expected_starts[1] == 4 * HOUR


def test_without_backfill_lower_jobs_wait_in_order():
    cfg = config(scheduler={"backfill": False})
    pend = [pending(1, 16, submit_time=0.0), pending(2, 4, submit_time=10.0, time_limit=HOUR)]
    plan = schedule(snapshot([BIG], pend, busy_half(), cfg=cfg), 0.0)
    assert plan.starts == [] and plan.reasons == {1: "Resources", 2: "Priority"}
    assert plan.expected_starts == {}


def test_backfill_depth_caps_reservations():
    cfg = config(scheduler={"backfill_depth": 2})
    run = [running(100, "n001", range(8), time_limit=HOUR)]
    pend = [pending(k, 8, submit_time=float(k)) for k in range(1, 6)]
    plan = schedule(snapshot(nodes(1), pend, run, cfg=cfg), 0.0)
    assert plan.expected_starts == {1: HOUR, 2: 2 * HOUR}


def test_reservations_stack_on_the_earliest_nodes():
    run = [running(100, "n001", range(8), time_limit=HOUR), running(101, "n002", range(8), time_limit=3 * HOUR)]
    pend = [pending(1, 8, submit_time=0.0, time_limit=HOUR), pending(2, 8, submit_time=1.0, time_limit=HOUR),
            pending(3, 8, submit_time=2.0, time_limit=HOUR)]
    plan = schedule(snapshot(nodes(2), pend, run), 0.0)
    assert plan.expected_starts == {1: HOUR, 2: 2 * HOUR, 3: 3 * HOUR}
    assert plan.reserved_nodes == {1: "n001", 2: "n001", 3: "n001"}


def test_timeline_profile_and_no_delay():
    c = Cluster([BIG], busy_half(), config())
    tl = Timeline(c, busy_half(), 0.0)
    assert tl.earliest_on_node(0, 16, 1, 1, None, HOUR) == 4 * HOUR
    assert tl.earliest_on_node(0, 9, 1, 1, None, HOUR) == 30 * MIN
    tl.reserve(1, 0, 4 * HOUR, HOUR, 16, 1, 1, None)
    assert tl.free_at(0, 4 * HOUR, None)[0] == 0
    assert tl.free_at(0, 5 * HOUR, None)[0] == 16
    assert tl.no_delay(0, (8, 9), 1, 1, 4 * HOUR)
    assert not tl.no_delay(0, (8, 9), 1, 1, 4 * HOUR + 1)
    assert tl.earliest_on_node(0, 1, 1, 1, None, None) == 5 * HOUR   # unlimited: after it
    assert tl.earliest_on_node(0, 17, 1, 1, None, HOUR) is None


def test_big_job_starts_by_its_reservation_under_a_stream_of_small_jobs():
    """A 16-GPU job at the top starts no later than first promised, small jobs backfill."""
    toy = ToyCluster((BIG,), config())
    for k in range(8):      # the machine is half busy, freeing over the next 4 hours
        toy.submit(1, duration=(k + 1) * 30 * MIN, time_limit=(k + 1) * 30 * MIN)
    toy.step()
    big = toy.submit(16, duration=HOUR, time_limit=2 * HOUR)
    promised = toy.step().expected_starts[big]
    assert promised == 4 * HOUR
    t = toy.now
    while toy.now < 10 * HOUR:      # a small job every 5 minutes, forever
        t += 5 * MIN
        toy.run(until=t, interval=5 * MIN)
        toy.submit(1, duration=20 * MIN, time_limit=30 * MIN)
    assert toy.events("start", big) and toy.events("start", big)[0] <= promised
    backfilled = [j for j in toy.jobs if j > big and toy.events("start", j)
                  and toy.events("start", j)[0] < promised]
    assert len(backfilled) >= 20
