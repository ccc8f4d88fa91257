"""Scheduler passes over long queues: views kept between passes, passes paced by their cost,
the garbage collector paused around the core."""

from __future__ import annotations

import gc

import pytest

from gpud import config
from gpud.config import ConfigError, HeadConfig
from gpud.head import arrays
from gpud.head.scheduling import JobViews, build_snapshot, pass_gap, run_core
from gpud.head.store import JobRecord, Txn
from gpud.model import JobSpec, JobState
from gpud.sched.config import SchedConfig
from tests.telemetry_rig import rig

SPEC = JobSpec(script="#!/bin/sh\ntrue\n", name="job", gpus=1)


def job(**kw) -> JobRecord:
    fields = dict(job_id=0, name="job", user="alice", uid=1000, gid=1000, account="default", partition="gpu",
                  qos="normal", state=JobState.PENDING, spec=SPEC, gpus=1, cpus=1, mem_mb=1024,
                  time_limit=None, submit_time=1_700_000_000.0)
    return JobRecord(**{**fields, **kw})


# -- pacing -------------------------------------------------------------------------------------

def test_a_cheap_pass_leaves_the_debounce() -> None:
    assert pass_gap(0.001, HeadConfig(schedule_debounce=0.005)) == 0.005


def test_a_long_pass_is_followed_by_a_rest_of_its_own_length_by_default() -> None:
    assert pass_gap(0.4, HeadConfig()) == pytest.approx(0.4)


def test_the_share_sets_the_rest() -> None:
    assert pass_gap(0.3, HeadConfig(schedule_max_share=0.25)) == pytest.approx(0.9)
    assert pass_gap(0.3, HeadConfig(schedule_max_share=1.0, schedule_debounce=0.0)) == 0.0


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "\"half\"", "true"])
def test_a_share_outside_zero_to_one_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        config.from_text(f"[head]\nschedule_max_share = {value}\n")
    assert "schedule_max_share" in str(e.value.lines)


def test_the_share_changes_live() -> None:
    old = config.from_text("[head]\nschedule_max_share = 0.5\n")
    new, notes = config.apply_live(old, config.from_text("[head]\nschedule_max_share = 0.2\n"))
    assert new.head.schedule_max_share == 0.2 and notes == []


# -- views kept between passes ----------------------------------------------------------------

async def test_views_are_kept_until_the_job_or_its_blocked_reason_changes(tmp_path) -> None:
    async with rig(tmp_path) as r:
        store = r.store
        tasks = arrays.expand(job(spec=JobSpec(script="#!/bin/sh\ntrue\n", name="job", gpus=1, array="0-3")),
                              arrays.parse_array("0-3"))
        saved = await store.insert_jobs(tasks + [job()], r.clock())
        views = JobViews()
        first = build_snapshot(store, SchedConfig(), {}, (), {}, views)
        assert first == build_snapshot(store, SchedConfig(), {}, ())

        a, b, c = saved[0].job_id, saved[1].job_id, saved[2].job_id
        txn = Txn(store)
        txn.transition(store.active[a], JobState.PENDING, now=r.clock(), event="updated", time_limit=60.0)
        txn.transition(store.active[c], JobState.CANCELLED, now=r.clock(), event="cancelled", end_time=r.clock())
        await store.commit(txn)
        blocked = {b: "Dependency"}
        second = build_snapshot(store, SchedConfig(), {}, (), blocked, views)
        assert second == build_snapshot(store, SchedConfig(), {}, (), blocked)

        before = {p.job_id: p for p in first.pending}
        after = {p.job_id: p for p in second.pending}
        assert c not in after                                  # ended: gone
        assert after[a].time_limit == 60.0                     # replaced record: a new view
        assert after[b].blocked_reason == "Dependency"         # blocked now: a new view
        unchanged = [j.job_id for j in saved[3:]]
        assert all(after[i] is before[i] for i in unchanged)   # the rest kept as they were


async def test_running_jobs_are_in_the_snapshot_and_not_among_the_views(tmp_path) -> None:
    async with rig(tmp_path) as r:
        await r.add_node("gpu01")
        first = await r.submit()
        await r.submit()
        await r.schedule()
        assert r.job(first).state is JobState.RUNNING
        await r.submit()
        snap = build_snapshot(r.store, SchedConfig(), {}, (), {}, r.head.views)
        assert first in {j.job_id for j in snap.running}
        assert first not in {p.job_id for p in snap.pending}
        assert snap == build_snapshot(r.store, SchedConfig(), {}, ())


async def test_running_views_are_kept_until_the_job_changes_and_shared_with_the_recheck(tmp_path) -> None:
    from gpud.head.scheduling import recheck
    from gpud.sched.plan import Plan

    async with rig(tmp_path) as r:
        await r.add_node("gpu01")
        a, b = await r.submit(), await r.submit()
        await r.schedule()
        views = JobViews()
        first = {v.job_id: v for v in build_snapshot(r.store, SchedConfig(), {}, (), {}, views).running}
        assert set(first) == {a, b}
        txn = Txn(r.store)
        txn.transition(r.store.active[a], JobState.COMPLETING, now=r.clock(), event="cancelled")
        await r.store.commit(txn)
        second = {v.job_id: v for v in build_snapshot(r.store, SchedConfig(), {}, (), {}, views).running}
        assert second[a].stopping and second[a] is not first[a]         # replaced record: a new view
        assert second[b] is first[b]                                     # the same record: the same view
        assert list(second.values()) == list(build_snapshot(r.store, SchedConfig(), {}, ()).running)
        # the re-check of a plan counts what they hold from the same views
        held = recheck(r.store, Plan(relayouts=[]), views)
        assert held.state.views == {} and not held.refused               # nothing to start: nothing counted
        assert {v.job_id: v for v in views.running(r.store.active.values())}[b] is first[b]


# -- the collector ------------------------------------------------------------------------------

def test_the_core_runs_with_the_collector_paused_and_leaves_it_as_it_was(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr("gpud.head.scheduling.schedule", lambda snap, now: seen.append(gc.isenabled()))
    assert gc.isenabled()
    run_core(None, 0.0)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run_core(None, 0.0)
        assert not gc.isenabled()     # someone else paused it: theirs to resume
    finally:
        gc.enable()


def test_the_collector_comes_back_when_the_core_fails(monkeypatch) -> None:
    def boom(snap, now):
        raise RuntimeError("core")
    monkeypatch.setattr("gpud.head.scheduling.schedule", boom)
    with pytest.raises(RuntimeError):
        run_core(None, 0.0)
    assert gc.isenabled()
