"""Multifactor priority, Fair Tree fair-share, and fairness between saturating accounts."""

from __future__ import annotations

import random

import pytest

from gpud.sched.core import schedule
from gpud.sched.priority import PriorityModel, fairshare_factors, fairshare_table

from .sched_builders import ToyCluster, config, nodes, pending, snapshot

TWO = {"a": {"users": ["ua"]}, "b": {"users": ["ub"]}}


def test_fair_tree_ranks_by_usage_over_shares():
    cfg = config(accounts={"a": {"shares": 2, "users": ["u1"]}, "b": {"shares": 1, "users": ["u2"]}})
    # a used 3x b's usage with 2x the shares: a is over-served, b ranks first
    f = fairshare_factors(cfg, {("a", "u1"): 300.0, ("b", "u2"): 100.0})
    assert f == {("a", "u1"): 0.5, ("b", "u2"): 1.0}
    f = fairshare_factors(cfg, {("a", "u1"): 150.0, ("b", "u2"): 100.0})
    assert f == {("a", "u1"): 1.0, ("b", "u2"): 0.5}


def test_every_user_of_a_better_served_account_ranks_first():
    cfg = config(accounts={"a": {"users": ["x", "y"]}, "b": {"users": ["z"]}})
    # a used less than b overall, so both of a's users outrank z, even y who used more than z
    f = fairshare_factors(cfg, {("a", "x"): 1.0, ("a", "y"): 40.0, ("b", "z"): 100.0})
    assert f[("a", "x")] == 1.0 and f[("a", "y")] == pytest.approx(2 / 3) and f[("b", "z")] == pytest.approx(1 / 3)


def test_ties_share_the_higher_rank_and_unused_accounts_lead():
    cfg = config(accounts={"a": {"users": ["x"]}, "b": {"users": ["y"]}, "c": {"users": ["z"]}})
    f = fairshare_factors(cfg, {("c", "z"): 5.0})
    assert f == {("a", "x"): 1.0, ("b", "y"): 1.0, ("c", "z"): pytest.approx(1 / 3)}


def test_sshare_rows_nest_accounts_and_users():
    cfg = config(accounts={"research": {"shares": 3, "users": ["alice"]},
                           "vision": {"parent": "research", "users": ["bob"]},
                           "ops": {"shares": 1, "users": ["*"]}})
    rows = fairshare_table(cfg, {("vision", "bob"): 30.0, ("ops", "eve"): 10.0, ("research", "alice"): 0.0})
    shape = [(r.account, r.user, r.depth) for r in rows]
    assert shape == [("research", None, 0), ("vision", None, 1), ("vision", "bob", 2),
                     ("research", "alice", 1), ("ops", None, 0), ("ops", "eve", 1)]
    research = rows[0]
    assert research.raw_usage == 30.0 and research.effective_usage == pytest.approx(0.75)
    assert research.norm_shares == pytest.approx(0.75) and research.fairshare is None
    users = {r.user: r.fairshare for r in rows if r.user}
    # research (S=.75, U=.75) and ops (S=.25, U=.25) tie at the top level; alice (no usage)
    # leads inside research
    assert users["alice"] == 1.0 and users["bob"] < 1.0 and users["eve"] < 1.0


def test_factors_are_weighted_and_sum_to_the_priority():
    cfg = config(qos={"normal": {}, "high": {"priority": 100}},
                 scheduler={"max_age": "1d"}, accounts=TWO)
    m = PriorityModel(cfg, {}, [("a", "ua")], {"gpu": 8}, now=43200.0)
    f = m.factors("a", "ua", "high", "gpu", 4, submit_time=0.0, nice=7)
    assert f == {"age": 500.0, "fairshare": 10000.0, "job_size": 250.0, "qos": 2000.0,
                 "partition": 0.0, "nice": -7.0}
    assert m.priority("a", "ua", "high", "gpu", 4, 0.0, 7) == sum(f.values())
    assert m.factors("a", "ua", "normal", "gpu", 8, -10 * 86400.0, 0)["age"] == 1000.0


def test_plan_reports_priorities_and_factors():
    snap = snapshot(nodes(1), [pending(1, submit_time=0.0), pending(2, submit_time=100.0)])
    plan = schedule(snap, 200.0)
    assert set(plan.priorities) == {1, 2}
    assert plan.priorities[1] > plan.priorities[2]
    assert plan.priorities[1] == pytest.approx(sum(plan.factors[1].values()))


@pytest.mark.parametrize("shares, want", [((1, 1), 0.5), ((2, 1), 2 / 3)])
def test_two_saturating_accounts_get_their_shares(shares, want):
    """Two accounts that always have work queued split the cluster by their shares."""
    cfg = config(accounts={"a": {"shares": shares[0], "users": ["ua"]},
                           "b": {"shares": shares[1], "users": ["ub"]}},
                 scheduler={"fairshare_half_life": "1d"})
    rng = random.Random(7)
    toy = ToyCluster(nodes(2), cfg)
    day = 86400.0

    def refill() -> None:
        for acct in ("a", "b"):
            while sum(1 for p in toy.pending.values() if p.account == acct) < 10:
                toy.submit(1, duration=rng.uniform(1200, 5400), account=acct, user="u" + acct,
                           time_limit=2 * 3600.0)

    while toy.now < 2 * day:
        refill()
        toy.step()
        toy.advance(min(toy.now + 600.0, max(toy.now, toy._next_event())))
    got = toy.gpu_seconds["a"] / (toy.gpu_seconds["a"] + toy.gpu_seconds["b"])
    assert got == pytest.approx(want, abs=0.04)


def test_a_pass_leaves_no_reference_cycles():
    # The head runs the core with the cyclic collector paused, the simulator collects only
    # now and then: a pass must leave its garbage to reference counting.
    import gc

    from gpud.sched.core import schedule

    from .sched_builders import config, nodes, pending, running, snapshot
    cfg = config(accounts={"a": {"shares": 2, "users": ["x"]}, "b": {"parent": "a", "users": ["y"]},
                           "c": {"users": ["*"]}})
    snap = snapshot(nodes(2), [pending(k, 1 + k % 3, user="xy"[k % 2], account="ab"[k % 2]) for k in range(1, 40)],
                    [running(100, "n001", (0,), user="z", account="c")], cfg=cfg,
                    usage={("a", "x"): 5.0, ("b", "y"): 1.0, ("c", "z"): 9.0})
    collecting = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        plan = schedule(snap, 3600.0)
        assert plan.starts
        del plan
        assert gc.collect() == 0
    finally:
        if collecting:
            gc.enable()
