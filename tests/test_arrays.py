"""Job arrays: the notation, the task rows, the throttle, and naming tasks on the head."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud.head import arrays
from gpud.syntax import MAX_ARRAY_TASKS, ArraySpec, SyntaxProblem, format_indices, parse_array
from tests.slurm_head import ALICE, BOB, ROOT, HeadKit


@pytest.mark.parametrize("text, tasks, throttle", [
    ("0-99", tuple(range(100)), None),
    ("1,3,5-9:2", (1, 3, 5, 7, 9), None),
    ("0-99%10", tuple(range(100)), 10),
    ("7", (7,), None),
    ("3,1,2,2", (1, 2, 3), None),
    ("0-10:5%1", (0, 5, 10), 1),
])
def test_array_syntax(text, tasks, throttle):
    assert parse_array(text) == ArraySpec(tasks, throttle)


@pytest.mark.parametrize("text, message", [
    ("", "needs task indices"),
    ("a-b", "use N, A-B or A-B:STEP"),
    ("5-1", "A must not exceed B"),
    ("1-5:0", "STEP is at least 1"),
    ("0-9%0", "the limit after % must be a positive number"),
    ("0-9%x", "the limit after % must be a positive number"),
    (f"0-{MAX_ARRAY_TASKS}", f"at most {MAX_ARRAY_TASKS} tasks"),
    ("99999999", "task indices go up to"),
    ("1,,2", "use N, A-B"),
])
def test_array_errors(text, message):
    with pytest.raises(SyntaxProblem) as e:
        parse_array(text)
    assert message in str(e.value)


@pytest.mark.parametrize("indices, text", [
    ([0, 1, 2, 5, 7, 9], "0-2,5-9:2"),
    ([1, 3, 5, 6, 7, 8, 9], "1,3,5-9"),
    ([4], "4"),
    ([2, 4], "2,4"),
    (list(range(0, 100)), "0-99"),
])
def test_format_indices(indices, text):
    assert format_indices(indices) == text


@given(st.sets(st.integers(0, 500), min_size=1, max_size=60), st.none() | st.integers(1, 50))
def test_format_then_parse_gives_the_same_tasks(tasks, throttle):
    spec = ArraySpec(tuple(sorted(tasks)), throttle)
    assert parse_array(spec.format()) == spec


# -- the head ---------------------------------------------------------------------------------------

async def test_an_array_is_one_row_per_task_sharing_the_first_tasks_id(tmp_path):
    async with HeadKit(tmp_path) as kit:
        before = await kit.submit()
        r = await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "1,3,5-9:2%2"})
        assert (r["job_id"], r["tasks"]) == (before + 1, 5)
        tasks = sorted((j for j in kit.store.active.values() if j.array_job_id), key=lambda j: j.job_id)
        assert [(j.job_id, j.array_job_id, j.array_task_id, j.array_throttle) for j in tasks] == [
            (before + 1 + i, before + 1, t, 2) for i, t in enumerate((1, 3, 5, 7, 9))]
        assert [j.display_id for j in tasks] == [f"{before + 1}_{t}" for t in (1, 3, 5, 7, 9)]
        after = await kit.submit()
        assert after == before + 6
        rows = await kit.store.find_jobs(job_ids=[before + 1], arrays=True)   # the database agrees
        assert [r.display_id for r in rows] == [j.display_id for j in tasks]


async def test_two_arrays_in_one_group_commit_stay_apart(tmp_path):
    import asyncio

    async with HeadKit(tmp_path) as kit:
        spec = {"script": "#!/bin/sh\ntrue\n", "array": "0-2"}
        a, b = await asyncio.gather(kit.call("submit", spec=spec), kit.call("submit", spec=spec))
        groups = {}
        for j in kit.store.active.values():
            groups.setdefault(j.array_job_id, []).append(j.array_task_id)
        assert groups == {a["job_id"]: [0, 1, 2], b["job_id"]: [0, 1, 2]}


async def test_the_throttle_is_never_exceeded(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        kit.add_node("n2", gpus=8)
        r = await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "0-99%10", "gpus": 1})
        array_id = r["job_id"]
        most = 0
        finished = 0
        while finished < 100:
            await kit.schedule()
            running = kit.running()
            most = max(most, len(running))
            assert len(running) <= 10
            waiting = [j for j in kit.store.active.values() if j.state.value == "PENDING"]
            assert all(j.reason == "JobArrayTaskLimit" for j in waiting)
            for job_id in running[:3]:   # a few end, others keep running
                await kit.finish(job_id)
                finished += 1
        assert most == 10
        rows = await kit.store.find_jobs(job_ids=[array_id], arrays=True)
        assert len(rows) == 100 and {r.state.value for r in rows} == {"COMPLETED"}


async def test_update_throttle_applies_to_the_whole_array(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        array_id = (await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "0-9%4", "gpus": 1}))["job_id"]
        r = await kit.call("update_job", ALICE, job_ids=[array_id], changes={"ArrayTaskThrottle": "6"})
        assert r["errors"][0].endswith("only root or an admin may raise an array's task limit (from 4 to 6)")
        r = await kit.call("update_job", ALICE, job_ids=[array_id], changes={"ArrayTaskThrottle": "2"})
        assert len(r["done"]) == 10
        await kit.schedule()
        assert len(kit.running()) == 2
        await kit.call("update_job", ROOT, job_ids=[array_id], changes={"ArrayTaskThrottle": "0"})
        await kit.schedule()
        assert len(kit.running()) == 8


async def test_cancel_one_task_or_the_whole_array(tmp_path):
    async with HeadKit(tmp_path) as kit:
        array_id = (await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "0-4"}))["job_id"]
        r = await kit.call("cancel", job_ids=[], array_tasks=[[array_id, 2]])
        assert r == {"cancelled": [array_id + 2], "errors": []}
        r = await kit.call("cancel", array_tasks=[[array_id, 2], [array_id, 9]])
        assert r["errors"] == [f"Kill job error on job id {array_id}_2: Job/step already completing or completed",
                               f"Kill job error on job id {array_id}_9: Invalid job id specified"]
        r = await kit.call("cancel", BOB, job_ids=[array_id])
        assert len(r["errors"]) == 4 and r["cancelled"] == []
        r = await kit.call("cancel", job_ids=[array_id])
        assert sorted(r["cancelled"]) == [array_id, array_id + 1, array_id + 3, array_id + 4]
        assert kit.store.active == {}


async def test_jobs_by_array_id_lists_every_task(tmp_path):
    async with HeadKit(tmp_path) as kit:
        array_id = (await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "0-2"}))["job_id"]
        live = (await kit.call("jobs", job_ids=[array_id]))["jobs"]
        assert [j["display_id"] for j in live] == [f"{array_id}_{t}" for t in range(3)]
        everything = (await kit.call("jobs", job_ids=[array_id], all=True))["jobs"]
        assert [j["array_task_id"] for j in everything] == [0, 1, 2]


async def test_launches_carry_the_array_facts(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        array_id = (await kit.call("submit", spec={"script": "#!/bin/sh\ntrue\n", "array": "10-30:10",
                                                  "open_mode": "append"}))["job_id"]
        await kit.schedule()
        body = kit.head.commands.launch_message(kit.store.active[array_id + 1]).to_body()
        assert {k: body[k] for k in ("array_job_id", "array_task_id", "array_task_count", "array_task_min",
                                     "array_task_max", "array_task_step", "open_mode", "slurm_compat_env",
                                     "partition", "cluster")} == {
            "array_job_id": array_id, "array_task_id": 20, "array_task_count": 3, "array_task_min": 10,
            "array_task_max": 30, "array_task_step": 10, "open_mode": "append", "slurm_compat_env": False,
            "partition": "gpu", "cluster": "test"}


def test_throttled_counts_running_tasks_and_skips_blocked_ones():
    from dataclasses import replace

    from gpud.head.store import JobRecord
    from gpud.model import JobSpec, JobState

    def task(job_id, t, state="PENDING"):
        return JobRecord(job_id=job_id, name="a", user="u", uid=1, gid=1, account="a", partition="p", qos="q",
                         state=JobState(state), spec=JobSpec(script="x", array="0-9%3"), gpus=0, cpus=1, mem_mb=1,
                         time_limit=None, submit_time=0, array_job_id=1, array_task_id=t, array_throttle=3)
    jobs = [task(1, 0, "RUNNING"), task(2, 1), task(3, 2), task(4, 3), task(5, 4)]
    assert arrays.throttled(jobs, set()) == {4, 5}
    assert arrays.throttled(jobs, {2}) == {5}           # a held task takes no slot
    assert arrays.throttled([replace(j, array_throttle=None) for j in jobs], set()) == set()
