"""The pass's shortcuts give what the straightforward computation gives.

Each shortcut of the hot path (the queue order by one float key, Fair Tree factors without
sshare's rows, factors built when read, the timeline's merged release stream, the quota
book that keeps no counts when nothing reads them, a start's GPUs taken as a slice) is
checked against the plain way of computing the same thing, on random inputs; and whole
plans must not depend on the order pending jobs arrive in.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.sched.backfill import Timeline
from gpud.sched.core import schedule
from gpud.sched.placement import Cluster
from gpud.sched.priority import PriorityModel, _queue_order, fairshare_factors, fairshare_table
from gpud.sched.quota import QuotaBook
from gpud.sched.snapshot import Snapshot

from .sched_builders import config, node, nodes, pending, running, snapshot

CFG = config(
    qos={"normal": {}, "high": {"priority": 100, "preempt": ["low"]}, "low": {}},
    accounts={"a": {"shares": 2, "users": ["*"]}, "b": {"parent": "a", "users": ["*"]},
              "c": {"shares": 1, "users": ["*"]}})

# few distinct values, so priorities, submit times and whole jobs tie often (arrays)
job = st.builds(
    lambda job_id, gpus, user, account, qos, submit, nice, tl: pending(
        job_id, gpus, user=user, account=account, qos=qos, submit_time=submit, nice=nice, time_limit=tl,
        cpus=gpus, mem_mb=1024 * max(1, gpus)),
    st.integers(1, 10**6), st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from(["u1", "u2", "u3"]),
    st.sampled_from(["a", "b", "c"]), st.sampled_from(["normal", "high", "low"]),
    st.sampled_from([0.0, 10.0, 500.0, 5000.0]), st.sampled_from([0, 0, 10]),
    st.sampled_from([600.0, 3600.0, None]))
jobs = st.lists(job, max_size=40, unique_by=lambda j: j.job_id)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-3.0, -1.0, 0.0, -0.0, 2.5]), st.sampled_from([0.0, 1.0, 2.0]),
                          st.integers(0, 10**6)), max_size=60, unique_by=lambda t: t[2]))
def test_queue_order_is_the_tuple_sort(keys):
    """One float-key sort plus tie runs orders exactly like sorting (-priority, submit, id)."""
    items = [pending(job_id, submit_time=submit) for _, submit, job_id in keys]
    neg = [k[0] for k in keys]
    expected = [t[3] for t in sorted((n, j.submit_time, j.job_id, j) for n, j in zip(neg, items))]
    assert _queue_order(items, neg) == expected


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.tuples(st.sampled_from(["a", "b", "c", "gone"]), st.sampled_from(["u1", "u2", "u3"])),
                       st.sampled_from([0.0, 1.0, 50.0, 1e6]), max_size=8),
       st.sets(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["u1", "u4"])), max_size=4))
def test_fairshare_factors_are_the_tables_users(usage, members):
    table = {(r.account, r.user): r.fairshare for r in fairshare_table(CFG, usage, members) if r.user is not None}
    assert fairshare_factors(CFG, usage, members) == table


@settings(max_examples=100, deadline=None)
@given(jobs, st.floats(0.0, 1e6))
def test_for_jobs_matches_each_jobs_own_factors(pend, now):
    """The factors read from the pass hold exactly what each job's own computation gives, they
    sum to its priority as the pass computed it, and the queue is the jobs sorted by
    (-priority, submit time, job id)."""
    members = {(j.account, j.user) for j in pend}
    model = PriorityModel(CFG, {}, members, {"gpu": 8}, now)
    factors, priorities, queue = model.for_jobs(pend)
    fresh = PriorityModel(CFG, {}, members, {"gpu": 8}, now)
    for j in pend:
        own = fresh.factors(j.account, j.user, j.qos, j.partition, j.gpus, j.submit_time, j.nice)
        assert factors[j.job_id] == own
        fixed = own["fairshare"] + own["job_size"] + own["qos"] + own["partition"]
        assert priorities[j.job_id] == own["age"] + fixed + own["nice"]     # bit for bit
    assert list(factors) == [j.job_id for j in pend] and len(factors) == len(pend)
    assert queue == sorted(pend, key=lambda j: (-priorities[j.job_id], j.submit_time, j.job_id))


@settings(max_examples=60, deadline=None)
@given(jobs, st.randoms(use_true_random=False))
def test_plans_do_not_depend_on_the_order_jobs_arrive_in(pend, rnd):
    run = [running(900_001, "n001", (0, 1, 2, 3), qos="low", start_time=-5000.0, cpus=4),
           running(900_002, "n002", (0,), qos="normal", start_time=-100.0, time_limit=None)]
    snap = snapshot(nodes(3), pend, run, cfg=CFG, usage={("a", "u1"): 100.0, ("c", "u2"): 5.0})
    shuffled = list(pend)
    rnd.shuffle(shuffled)
    a = schedule(snap, 0.0)
    b = schedule(Snapshot(snap.nodes, tuple(shuffled), snap.running, snap.config, snap.usage), 0.0)
    assert a == b


def _busy_timeline() -> tuple[Cluster, Timeline, list[int]]:
    """Four nodes with twelve running jobs of staggered limits: (cluster, timeline, their ids)."""
    run = [running(100 + k, f"n00{1 + k % 4}", (k // 4,), start_time=0.0, time_limit=900.0 * (1 + k % 3))
           for k in range(12)]
    cluster = Cluster(nodes(4), run, CFG)
    return cluster, Timeline(cluster, run, now=0.0), [r.job_id for r in run]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "stop", "stream"]), st.integers(0, 3),
                          st.sampled_from([60.0, 600.0, 3600.0, float("inf")])), max_size=30))
def test_release_stream_merges_like_a_fresh_sort(ops):
    """The sorted releases the reservation search walks equal a sort from scratch after any
    mix of starts (merged in) and stopped victims (moved to their new place)."""
    cluster, tl, stoppable = _busy_timeline()
    next_id = 1000
    for op, node, end in ops:
        if op == "start" and cluster.free[node]:
            gpus = (cluster.free[node][0],)
            cluster.allocate(node, gpus, 1, 1024)
            tl.add_start(node, gpus, 1, 1024, end, next_id)
            next_id += 1
        elif op == "stop" and stoppable:
            tl.stop(stoppable.pop(random.Random(node).randrange(len(stoppable))))
        events = tl._sorted_releases()
        assert events == sorted((rel.end, i, k) for i, rels in enumerate(tl.releases)
                                for k, rel in enumerate(rels) if rel.end < float("inf"))


def test_a_book_without_quotas_or_limits_keeps_no_counts():
    book = QuotaBook(config(), [running(1, "n001", (0, 1))])
    assert not book.counting and not book.any_limits
    book.on_start("default", "normal", "alice", 4)
    assert book.limit_reason("normal", "alice", "default", 10**6) is None
    assert book.within("default", 10**6)
    limited = QuotaBook(config(qos={"normal": {"max_gpus_per_user": 2}}), [running(1, "n001", (0, 1))])
    assert limited.counting and limited.limit_reason("normal", "alice", "default", 1) == "QOSMaxGRESPerUser"


class _Forgetful(dict):
    """A cache that never keeps anything: every lookup misses."""

    def __setitem__(self, key, value) -> None:
        pass


@settings(max_examples=60, deadline=None)
@given(jobs, st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1, 2, 4]), st.sampled_from(["low", "normal"]),
                                st.sampled_from([-9000.0, -700.0, -10.0])), max_size=10),
       st.integers(0, 3))
def test_remembered_victim_sets_match_a_fresh_search(pend, held, recent):
    """The victim search remembers each node's answer until the node changes; a search that
    remembers nothing picks the same victims."""
    run, used = [], {k: 0 for k in range(4)}
    for k, (node, gpus, qos, start) in enumerate(held):
        take = tuple(range(used[node], min(8, used[node] + gpus)))
        if take:
            used[node] += len(take)
            run.append(running(500 + k, f"n00{node + 1}", take, qos=qos, start_time=start, cpus=len(take)))
    assert_fresh_search_agrees(snapshot(nodes(4), pend, run, cfg=CFG, recent=[-5.0] * recent))


def test_remembered_victim_sets_on_a_full_cluster():
    run = [running(500 + k, f"n00{k // 4 + 1}", (2 * (k % 4), 2 * (k % 4) + 1), account="a",
                   qos="low" if k % 3 else "normal", start_time=-1000.0 - k, cpus=2) for k in range(16)]
    pend = [pending(k, (1, 2, 4, 8)[k % 4], qos="high", account="c", submit_time=float(k)) for k in range(1, 13)]
    plan = assert_fresh_search_agrees(snapshot(nodes(4), pend, run, cfg=CFG))
    assert len(plan.preemptions) >= 4


def assert_fresh_search_agrees(snap: Snapshot):
    import gpud.sched.core as core
    from gpud.sched.preempt import Preemptor

    class Fresh(Preemptor):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self._seen = _Forgetful()

    remembered = schedule(snap, 0.0)
    original, core.Preemptor = core.Preemptor, Fresh
    try:
        fresh = schedule(snap, 0.0)
    finally:
        core.Preemptor = original
    assert remembered == fresh
    return remembered


@settings(max_examples=100, deadline=None)
@given(job, st.floats(0.0, 1e6))
def test_a_first_priority_is_the_sum_of_its_factors(j, now):
    """A running job's priority asked first (a victim's) is the sum of its factors dict."""
    members = {(j.account, j.user)}
    ask = PriorityModel(CFG, {}, members, {"gpu": 8}, now)
    own = PriorityModel(CFG, {}, members, {"gpu": 8}, now)
    args = (j.account, j.user, j.qos, j.partition, j.gpus, j.submit_time, j.nice)
    assert ask.priority(*args) == sum(own.factors(*args).values())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "stop", "reserve", "ask"]), st.integers(0, 3),
                          st.sampled_from([60.0, 600.0, 3600.0, float("inf")]), st.sampled_from([1, 2, 4, 8])),
                max_size=30))
def test_remembered_windows_and_first_instants_match_a_fresh_computation(ops):
    """A gang search's per-node windows and first free instants, remembered until the node
    changes, equal what the node's profile gives afresh after any starts, reservations and
    stopped victims."""
    cluster, tl, stoppable = _busy_timeline()
    next_id = 1000
    for op, node, span, g in ops:
        if op == "start" and cluster.free[node]:
            gpus = (cluster.free[node][0],)
            cluster.allocate(node, gpus, 1, 1024)
            tl.add_start(node, gpus, 1, 1024, span, next_id)
        elif op == "reserve":
            tl.reserve(next_id, node, 300.0, None if span == float("inf") else span, g, 1, 1024, None)
        elif op == "stop" and stoppable:
            tl.stop(stoppable.pop(random.Random(node).randrange(len(stoppable))))
        next_id += 1
        limit = None if span == float("inf") else span
        for i in range(4):
            assert tl.windows(i, g, 1, 1024, None, limit) == tl._windows_of(i, g, 1, 1024, None, limit)
            fresh = next((t for t, free in zip(tl.profile(i, None).times, tl.profile(i, None).gpus)
                          if free >= g), float("inf"))
            assert tl.first_instant(i, None, g) == fresh


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 2, 3, 8]), st.sampled_from([None, "A100", "H100"])),
                max_size=20))
def test_take_is_pick_then_allocate(asks):
    """A start's GPUs taken in one step (a slice of the free list where it can be) are the
    ones ``pick`` chooses, and leave the cluster as ``allocate`` would."""
    mixed = (node("n001"), node("n002", models=["A100"] * 4 + ["H100"] * 4), node("n003", gpus=4), node("n004"))
    run = [running(1, "n001", (1, 5)), running(2, "n002", (0, 6)), running(3, "n004", (3,))]
    one, other = Cluster(mixed, run, CFG), Cluster(mixed, run, CFG)
    for c in (one, other):
        c.index("gpu", None), c.index("gpu", "H100")     # buckets that follow each start
    for i, gpus, model in asks:
        if one.free_count(i, model) < gpus:
            continue
        expected = other.pick(i, gpus, model)
        other.allocate(i, expected, 1, 1024)
        assert one.take(i, gpus, model, 1, 1024) == expected
        assert (one.free, one.cpus, one.mem) == (other.free, other.cpus, other.mem)
        assert ([[list(b) for b in idx.buckets] for idx in one._indexes.values()]
                == [[list(b) for b in idx.buckets] for idx in other._indexes.values()])   # order too


def test_a_start_is_built_like_its_dataclass():
    """``Start`` sets its fields itself (cheaper than a frozen class's generated __init__):
    the same parameters, defaults and fields, still frozen, equal and hashable by value."""
    import dataclasses
    import inspect

    from gpud.sched.plan import Start

    params = inspect.signature(Start).parameters
    fields = dataclasses.fields(Start)
    assert list(params) == [f.name for f in fields]
    assert [p.default for p in params.values()] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]
    a, b = Start(7, "n001", (0, 1), 2, 1024, borrowed=True), Start(7, "n001", (0, 1), 2, 1024, True, (), ())
    assert a == b and hash(a) == hash(b) and vars(a) == {f.name: getattr(b, f.name) for f in fields}
    assert dataclasses.replace(a, cpus=3).cpus == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.cpus = 3    # type: ignore[misc]


@settings(max_examples=100, deadline=None)
@given(job, st.sampled_from([{}, {"held": True}, {"blocked_reason": "Dependency"}, {"mig_profile": "1g.10gb"},
                             {"gpu_mem_mb": 4096}, {"nodes": 2}, {"nodelist": ("n001",)}, {"exclude": ("n002",)},
                             {"constraint": "ib"}, {"exclusive": True}, {"gpu_type": "H100"}]))
def test_a_jobs_plain_key_is_its_verdict_key_on_the_plain_path_only(j, change):
    """A view's derived verdict key (made once, kept across passes) is the key the pass would
    build, and there only for a job the pass decides on its plain path; ``replace`` remakes it."""
    from dataclasses import replace

    j = replace(j, **change)
    plain = not (j.held or j.blocked_reason or j.shared or j.nodes != 1 or j.nodelist or j.exclude
                 or j.constraint or j.exclusive)
    expected = (j.partition, j.gpus, j.cpus, j.mem_mb, j.gpu_type, j.time_limit, j.qos, j.account)
    assert j.plain_key == (expected if plain else None)
    assert replace(j, held=True).plain_key is None and j == replace(j)
