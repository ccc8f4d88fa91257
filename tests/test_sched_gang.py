"""Multi-node (gang) jobs and node filters in the pure core: all nodes or none, switches and
racks, nodelist/exclude/constraint/exclusive, reservations on N nodes, admission."""

from __future__ import annotations

import random
from dataclasses import replace

from gpud.sched.admission import refusal, resolve_job
from gpud.sched.core import schedule
from gpud.sched.gang import DEFAULT_SWITCH_WAIT, parse_constraint
from gpud.sched.snapshot import NodeView, Part

from .sched_builders import ToyCluster, config, node, nodes, pending, running, snapshot

MIN = 60.0
HOUR = 3600.0


def labelled(name: str, switch: str = "", rack: str = "", features: str = "", **kw) -> NodeView:
    labels = tuple(sorted((k, v) for k, v in (("switch", switch), ("rack", rack), ("features", features)) if v))
    return replace(node(name, **kw), labels=labels)


def gang(job_id: int, n: int, per_node: int = 8, **kw):
    return pending(job_id, n * per_node, nodes=n, **kw)


def placed(plan, job_id: int) -> list[str]:
    s = next(s for s in plan.starts if s.job_id == job_id)
    return [s.node, *(p.node for p in s.parts)]


# -- all or nothing --------------------------------------------------------------------------------

def test_a_gang_starts_on_all_its_nodes_at_once_or_not_at_all():
    run = [running(1, "n003", range(4), time_limit=HOUR), running(2, "n004", range(4), time_limit=2 * HOUR)]
    plan = schedule(snapshot(nodes(4), [gang(9, 3)], run), 0.0)
    assert plan.starts == [] and plan.reasons[9] == "Resources"
    assert plan.expected_starts[9] == HOUR and plan.reserved_nodes[9] == "n001"
    plan = schedule(snapshot(nodes(4), [gang(9, 2, cpus=4, mem_mb=1024)], run), 0.0)
    (s,) = plan.starts
    assert (s.node, s.gpu_indices, s.cpus) == ("n001", tuple(range(8)), 4)
    assert s.parts == (Part("n002", tuple(range(8)), 4, 1024),)


def test_a_gang_takes_per_node_gpus_and_binpacks():
    run = [running(1, "n001", range(6)), running(2, "n002", range(4)), running(3, "n003", range(2))]
    plan = schedule(snapshot(nodes(4), [gang(9, 2, per_node=2)], run), 0.0)
    assert placed(plan, 9) == ["n001", "n002"]        # the two fullest nodes that fit
    assert plan.starts[0].gpu_indices == (6, 7) and plan.starts[0].parts[0].gpu_indices == (4, 5)


def test_running_gang_holds_every_node_and_frees_them_together():
    g = running(1, "n001", range(8), time_limit=HOUR, parts=(Part("n002", tuple(range(8)), 1, 1024),))
    plan = schedule(snapshot(nodes(3), [pending(2, 8), pending(3, 8, submit_time=1.0)], [g]), 0.0)
    assert placed(plan, 2) == ["n003"]
    assert plan.expected_starts[3] == HOUR                 # both of the gang's nodes come back at its end
    plan = schedule(snapshot(nodes(2), [gang(4, 2)], [g]), 0.0)
    assert plan.expected_starts[4] == HOUR


# -- switches and racks ----------------------------------------------------------------------------

FABRIC = (labelled("a1", "s1", "r1"), labelled("a2", "s1", "r1"),
          labelled("b1", "s2", "r2"), labelled("b2", "s2", "r2"), labelled("b3", "s2", "r3"),
          labelled("c1", "s3", "r4"))


def test_fewest_switches_then_racks():
    assert placed(schedule(snapshot(FABRIC, [gang(9, 3)]), 0.0), 9) == ["b1", "b2", "b3"]
    assert placed(schedule(snapshot(FABRIC, [gang(9, 2)]), 0.0), 9) == ["a1", "a2"]   # best fit: s1
    assert placed(schedule(snapshot(FABRIC, [gang(9, 4)]), 0.0), 9) == ["b1", "b2", "b3", "c1"]
    # on s2 two nodes share rack r2: a 2-node job there takes them, not b3
    busy_s1 = [running(1, "a1", (0,)), running(2, "c1", (0,))]
    assert placed(schedule(snapshot(FABRIC, [gang(9, 2)], busy_s1), 0.0), 9) == ["b1", "b2"]
    # unlabeled nodes count as one switch
    assert placed(schedule(snapshot(nodes(3), [gang(9, 3)]), 0.0), 9) == ["n001", "n002", "n003"]


def test_switches_waits_then_gives_up():
    busy = [running(1, "b1", range(8), time_limit=10 * HOUR)]
    job = gang(9, 3, switches=1, switches_wait=600.0, submit_time=0.0)
    plan = schedule(snapshot(FABRIC, [job], busy), 0.0)          # s2 has 2 free: no single switch holds 3
    assert plan.starts == [] and plan.reasons[9] == "Resources"
    assert placed(schedule(snapshot(FABRIC, [job], busy), 601.0), 9) == ["a1", "a2", "c1"]
    assert placed(schedule(snapshot(FABRIC, [replace(job, switches=2)], busy), 0.0), 9) == ["a1", "a2", "c1"]
    assert placed(schedule(snapshot(FABRIC, [replace(job, switches=1)]), 0.0), 9) == ["b1", "b2", "b3"]
    no_time = replace(job, switches_wait=None)
    assert schedule(snapshot(FABRIC, [no_time], busy), DEFAULT_SWITCH_WAIT - 1).starts == []
    assert schedule(snapshot(FABRIC, [no_time], busy), DEFAULT_SWITCH_WAIT).starts != []


# -- filters ---------------------------------------------------------------------------------------

def test_nodelist_and_exclude():
    plan = schedule(snapshot(nodes(4), [gang(9, 2, nodelist=("n003",))]), 0.0)
    assert placed(plan, 9) == ["n001", "n003"]
    plan = schedule(snapshot(nodes(4), [pending(9, 1, nodelist=("n004",))], [running(1, "n001", (0,))]), 0.0)
    assert placed(plan, 9) == ["n004"]
    plan = schedule(snapshot(nodes(4), [pending(9, 1, exclude=("n001",))], [running(1, "n001", (0,))]), 0.0)
    assert placed(plan, 9) == ["n002"]
    plan = schedule(snapshot(nodes(4), [gang(9, 3, exclude=("n001", "n002"))]), 0.0)
    assert plan.reasons[9] == "BadConstraints"
    plan = schedule(snapshot(nodes(4), [gang(9, 2, nodelist=("n001", "n002", "n003"))]), 0.0)
    assert plan.reasons[9] == "BadConstraints"
    down = [*nodes(3), node("n004", up=False)]
    assert schedule(snapshot(down, [pending(9, 1, nodelist=("n004",))]), 0.0).reasons[9] == "ReqNodeNotAvail"
    assert schedule(snapshot(down, [gang(9, 4)]), 0.0).reasons[9] == "ReqNodeNotAvail"
    assert schedule(snapshot(down, [gang(9, 5)]), 0.0).reasons[9] == "BadConstraints"
    assert schedule(snapshot(down, [pending(9, 24, nodes=2)]), 0.0).reasons[9] == "BadConstraints"  # 12 a node
    assert schedule(snapshot(down, [pending(9, 7, nodes=2)]), 0.0).reasons[9] == "BadConstraints"   # uneven


def test_constraint_features():
    ns = (labelled("a", features="a100"), labelled("b", features="a100,ib"), labelled("c", features="h100,ib"))
    assert parse_constraint("a100&ib|h100") == (frozenset({"a100", "ib"}), frozenset({"h100"}))
    assert placed(schedule(snapshot(ns, [pending(9, 1, constraint="a100&ib")]), 0.0), 9) == ["b"]
    assert placed(schedule(snapshot(ns, [pending(9, 1, constraint="h100|v100")]), 0.0), 9) == ["c"]
    assert placed(schedule(snapshot(ns, [gang(9, 2, constraint="ib")]), 0.0), 9) == ["b", "c"]
    assert schedule(snapshot(ns, [gang(9, 3, constraint="ib")]), 0.0).reasons[9] == "BadConstraints"
    assert schedule(snapshot(ns, [pending(9, 1, constraint="a100&&ib")]), 0.0).reasons[9] == "BadConstraints"


def test_exclusive_needs_an_idle_node_and_keeps_it():
    run = [running(1, "n001", (0,))]
    plan = schedule(snapshot(nodes(2), [pending(9, 1, exclusive=True)], run), 0.0)
    assert placed(plan, 9) == ["n002"] and plan.starts[0].gpu_indices == (0,)
    # a node running an exclusive job takes nothing else, even with 7 GPUs free
    run = [running(1, "n001", (0,), exclusive=True)]
    plan = schedule(snapshot(nodes(2), [pending(9, 1), pending(10, 1, submit_time=1.0)], run), 0.0)
    assert [s.node for s in plan.starts] == ["n002", "n002"]
    # in one pass: the exclusive job's node is closed to the jobs after it
    plan = schedule(snapshot(nodes(2), [pending(9, 1, exclusive=True), pending(10, 1, submit_time=1.0)]), 0.0)
    assert placed(plan, 9) == ["n001"] and placed(plan, 10) == ["n002"]
    # exclusive on a busy cluster: a reservation for a whole node
    run = [running(1, "n001", (0,), time_limit=HOUR), running(2, "n002", (0,), time_limit=2 * HOUR)]
    plan = schedule(snapshot(nodes(2), [gang(9, 2, per_node=1, exclusive=True)], run), 0.0)
    assert plan.expected_starts[9] == 2 * HOUR


# -- quotas and preemption -------------------------------------------------------------------------

def test_limits_count_a_gangs_total_gpus():
    cfg = config(accounts={"default": {"users": ["*"], "gpu_limit": 20}})
    g = running(1, "n001", range(8), parts=(Part("n002", tuple(range(8)), 1, 1024),))
    plan = schedule(snapshot(nodes(4), [pending(2, 8), pending(3, 4, submit_time=1.0)], [g], cfg=cfg), 0.0)
    assert plan.reasons[2] == "AccountLimit" and placed(plan, 3) == ["n003"]
    plan = schedule(snapshot(nodes(4), [gang(4, 3)], cfg=cfg), 0.0)
    assert plan.reasons[4] == "AccountLimit"


def test_a_gang_is_never_a_victim():
    cfg = config(qos={"normal": {}, "low": {}, "high": {"preempt": ["low"]}})
    g = running(1, "n001", range(8), qos="low", time_limit=None, parts=(Part("n002", tuple(range(8)), 1, 1024),))
    plan = schedule(snapshot(nodes(2), [pending(2, 8, qos="high")], [g], cfg=cfg), HOUR)
    assert plan.preemptions == [] and plan.reasons[2] == "Resources" and 2 not in plan.expected_starts
    single = running(3, "n002", range(8), qos="low", time_limit=None)
    plan = schedule(snapshot(nodes(2), [pending(2, 8, qos="high")], [replace(g, parts=()), single], cfg=cfg), HOUR)
    assert [p.job_id for p in plan.preemptions] == [1]


def test_a_job_with_node_filters_preempts_only_on_its_nodes():
    cfg = config(qos={"normal": {}, "low": {}, "high": {"preempt": ["low"]}})
    ns = (labelled("a", features="ib"), labelled("b"), labelled("c", features="ib"))
    run = [running(1, "a", range(8), qos="low", time_limit=None, start_time=100.0),   # the youngest
           running(2, "b", range(8), qos="low", time_limit=None, start_time=200.0),
           running(3, "c", range(8), qos="low", time_limit=None, start_time=0.0)]
    plan = schedule(snapshot(ns, [pending(9, 8, qos="high", constraint="ib")], run, cfg=cfg), HOUR)
    assert [p.job_id for p in plan.preemptions] == [1] and plan.reserved_nodes[9] == "a"
    plan = schedule(snapshot(ns, [pending(9, 8, qos="high", exclude=("a",))], run, cfg=cfg), HOUR)
    assert [p.job_id for p in plan.preemptions] == [2]
    plan = schedule(snapshot(ns, [pending(9, 8, qos="high", exclusive=True)], run, cfg=cfg), HOUR)
    assert plan.preemptions == []


# -- backfill around a gang reservation ------------------------------------------------------------

def test_4x8_gang_on_a_busy_cluster_starts_by_its_reservation_while_small_jobs_backfill():
    toy = ToyCluster(nodes(8), config())
    for k in range(8):               # every node full, emptying one by one over 4 hours
        toy.submit(8, duration=(k + 1) * 30 * MIN, time_limit=(k + 1) * 30 * MIN)
    toy.step()
    big = toy.submit(32, nodes=4, duration=HOUR, time_limit=2 * HOUR)
    promised = toy.step().expected_starts[big]
    assert promised == 2 * HOUR                  # the fourth node frees at 2 h
    promises = [promised]
    t = toy.now
    while toy.now < 6 * HOUR:        # small jobs keep coming
        t += 5 * MIN
        toy.run(until=t, interval=5 * MIN)
        if big in toy.pending and toy.last_plan is not None:
            promises.append(toy.last_plan.expected_starts[big])
        toy.submit(1, duration=20 * MIN, time_limit=30 * MIN)
        toy.submit(2, duration=50 * MIN, time_limit=HOUR)
    start = toy.events("start", big)
    assert start and start[0] <= promised
    assert all(b <= a for a, b in zip(promises, promises[1:])), "the reservation moved later"
    backfilled = [j for j in toy.jobs if j > big and toy.events("start", j) and toy.events("start", j)[0] < start[0]]
    assert len(backfilled) >= 10
    print(f"4x8 gang promised {promised / HOUR:.2f} h, started {start[0] / HOUR:.2f} h; "
          f"{len(backfilled)} small jobs backfilled before it")


def test_random_gang_traffic_keeps_every_invariant_and_is_order_independent():
    ns = tuple(labelled(f"n{i:03d}", f"s{i // 4}", f"r{i // 2}", "ib" if i % 3 else "eth") for i in range(12))
    rng = random.Random(5)
    toy = ToyCluster(ns, config())
    for _ in range(120):
        for _ in range(rng.choice([0, 1, 2])):
            n = rng.choice([1, 1, 1, 2, 3, 4])
            kw = {}
            if rng.random() < 0.2:
                kw["constraint"] = "ib"
            if rng.random() < 0.1:
                kw["exclusive"] = True
            if rng.random() < 0.1:
                kw["exclude"] = (f"n{rng.randrange(12):03d}",)
            if n > 1 and rng.random() < 0.3:
                kw["switches"], kw["switches_wait"] = 1, 1200.0
            toy.submit(n * rng.choice([1, 2, 4, 8]), nodes=n, duration=rng.uniform(5, 90) * MIN,
                       time_limit=2 * HOUR, **kw)
        snap = toy.snapshot()
        plan = toy.step()             # check_plan: nodes, per-node GPUs, exclusive, no over-allocation
        again = schedule(replace(snap, pending=tuple(reversed(snap.pending)), running=tuple(reversed(snap.running)),
                                 nodes=tuple(reversed(snap.nodes))), toy.now)
        assert again == plan
        toy.advance(toy.now + 5 * MIN)
    assert sum(1 for r in toy.log if r[1] == "start") > 60


# -- admission -------------------------------------------------------------------------------------

def admit(req: dict, node_list=None) -> str | None:
    cfg = config()
    return refusal(req, resolve_job(req, "alice", cfg), "alice", cfg, node_list if node_list is not None else nodes(4))


def test_admission_refuses_gangs_that_can_never_run():
    assert admit({"gpus": 32, "nodes": 4}) is None
    assert "5 nodes" in admit({"gpus": 40, "nodes": 5}) and "at most 4" in admit({"gpus": 40, "nodes": 5})
    assert "evenly" in admit({"gpus": 30, "nodes": 4})
    assert "16 GPUs per node" in admit({"gpus": 32, "nodes": 2})
    assert "-N 3" in admit({"gpus": 2, "nodes": 2, "nodelist": ["n001", "n002", "n003"]})
    assert "both" in admit({"gpus": 1, "nodelist": ["n001"], "exclude": ["n001"]})
    assert "empty feature" in admit({"gpus": 1, "constraint": "a&"})
    assert "ib" in admit({"gpus": 1, "constraint": "ib"})
    assert "n009" in admit({"gpus": 1, "nodelist": ["n009"]})
    assert "one node" in admit({"gpus": 2, "nodes": 2, "gpu_mem_mb": 1000})
    assert "needs 3 nodes" in admit({"gpus": 24, "nodes": 3, "exclude": ["n001", "n002"]})
    for msg in (admit({"gpus": 30, "nodes": 4}), admit({"gpus": 40, "nodes": 5})):
        assert "\n" not in msg
    assert admit({"gpus": 40, "nodes": 5}, node_list=[]) is None        # no node registered yet: it waits


def test_a_gang_is_billed_for_all_its_gpus():
    from gpud.sched.usage import billing_rate
    g = running(1, "n001", range(8), parts=(Part("n002", tuple(range(8)), 1, 1024),))
    assert billing_rate(g, node("n001"), config()) == 16.0 and billing_rate(g, None, config()) == 16.0


def test_batched_reservation_search_finds_what_a_full_sweep_finds():
    """Gangs.earliest takes nodes in batches by bound; the answer must equal sweeping them all."""
    from gpud.sched.backfill import Timeline
    from gpud.sched.gang import Gangs, Request
    from gpud.sched.placement import Cluster

    rng = random.Random(11)
    for trial in range(30):
        ns = tuple(labelled(f"n{i:03d}", f"s{i // 6}", f"r{i // 3}") for i in range(40))
        run, job_id = [], 1
        for n in ns:
            free = list(range(8))
            while free and rng.random() < 0.8:
                size = rng.choice([1, 2, 4, 8])
                take, free = free[:size], free[size:]
                if take:
                    run.append(running(job_id, n.name, take, time_limit=rng.choice([600.0, 1800.0, HOUR, 4 * HOUR]),
                                       start_time=-rng.uniform(0, 500)))
                    job_id += 1
        c = Cluster(ns, run, config())
        tl = Timeline(c, run, 0.0)
        gangs = Gangs(c, tl, 0.0)
        for n_nodes, per in ((2, 8), (4, 4), (8, 2), (3, 8)):
            req = Request.of(pending(999, n_nodes * per, nodes=n_nodes, time_limit=rng.choice([600.0, HOUR])))
            limit = rng.choice([None, 1, 2])
            full = gangs._sweep(gangs.fit(req).nodes, req, "binpack", limit, float("inf"))
            assert gangs.earliest(req, "binpack", limit) == full, (trial, n_nodes, per, limit)
            if full is not None:    # later searches see it, as in a pass
                for i in full[1]:
                    tl.reserve(999, i, full[0], req.time_limit, per, 1, 1024, None)
