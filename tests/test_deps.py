"""Dependencies: the notation, the pure verdicts, and what the head does with them."""

from __future__ import annotations

import pytest

from gpud.head import deps
from gpud.head.deps import MET, NEVER, WAIT, DependencyBook, JobFacts, Named
from gpud.syntax import Dependency, SyntaxProblem, Target, Term, parse_dependency
from tests.slurm_head import ALICE, BOB, HeadKit, T0

# -- the notation -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, canonical", [
    ("afterok:12", "afterok:12"),
    ("afterok:12:13,afterany:14", "afterok:12:13,afterany:14"),
    ("afterany:12?afternotok:13", "afterany:12?afternotok:13"),
    ("after:12+30:13", "after:12+30:13"),
    ("AFTEROK:5_3", "afterok:5_3"),
    ("singleton", "singleton"),
    ("afterok:1,singleton", "afterok:1,singleton"),
    ("  afterok:7  ", "afterok:7"),
])
def test_dependency_round_trip(text, canonical):
    dep = parse_dependency(text)
    assert dep.format() == canonical
    assert parse_dependency(dep.format()) == dep


def test_dependency_structure():
    dep = parse_dependency("afterok:12:13_4,after:9+5")
    assert dep == Dependency((Term("afterok", (Target(12), Target(13, 4))), Term("after", (Target(9, None, 5),))))
    assert dep.job_ids() == {12, 13, 9}
    assert parse_dependency("") is None and parse_dependency("none") is None


@pytest.mark.parametrize("text, message", [
    ("afterok", "afterok needs job ids"),
    ("afterok:", "afterok needs job ids"),
    ("afterok:1::2", "bad job id ''"),
    ("afterok:x", "bad job id 'x'"),
    ("afterok:12+5", "+MINUTES only with after"),
    ("beforeok:12", "unknown type 'beforeok'"),
    ("afterok:1,afterany:2?afterok:3", "not both"),
    ("singleton:4", "singleton takes no job ids"),
    ("aftercorr:4", "aftercorr (task-by-task array dependencies) is not supported"),
    ("afterok:0", "invalid job id"),
])
def test_dependency_errors_say_what_is_wrong(text, message):
    with pytest.raises(SyntaxProblem) as e:
        parse_dependency(text)
    assert message in str(e.value)


# -- verdicts -------------------------------------------------------------------------------------

def facts(*items) -> dict:
    """{(job, task): [JobFacts]} from (job_id, state, start) triples; arrays via (id, task, state, start)."""
    table: dict = {}
    for item in items:
        if len(item) == 3:
            job_id, state, start = item
            table[(job_id, None)] = [JobFacts(job_id, state, start)]
        else:
            array_id, task, state, start = item
            f = JobFacts(array_id + task, state, start, array_id, task)
            table.setdefault((array_id, None), []).append(f)
            table[(array_id, task)] = [f]
    return table


def verdict(text: str, table: dict, now: float = T0, singleton_blocked: bool = False) -> str:
    return deps.evaluate(parse_dependency(text), lambda j, t: table.get((j, t)), now, singleton_blocked)


@pytest.mark.parametrize("text, state, expected", [
    ("afterok:1", "PENDING", WAIT), ("afterok:1", "RUNNING", WAIT), ("afterok:1", "COMPLETED", MET),
    ("afterok:1", "FAILED", NEVER), ("afterok:1", "CANCELLED", NEVER), ("afterok:1", "TIMEOUT", NEVER),
    ("afterok:1", "NODE_FAIL", NEVER), ("afterok:1", "OUT_OF_MEMORY", NEVER),
    ("afternotok:1", "RUNNING", WAIT), ("afternotok:1", "FAILED", MET), ("afternotok:1", "COMPLETED", NEVER),
    ("afternotok:1", "CANCELLED", MET),
    ("afterany:1", "RUNNING", WAIT), ("afterany:1", "COMPLETED", MET), ("afterany:1", "FAILED", MET),
    ("after:1", "PENDING", WAIT), ("after:1", "RUNNING", MET), ("after:1", "COMPLETED", MET),
])
def test_each_kind_against_each_state(text, state, expected):
    start = None if state == "PENDING" else T0 - 10
    assert verdict(text, facts((1, state, start))) == expected


def test_after_counts_a_job_cancelled_before_it_started_and_waits_out_the_delay():
    assert verdict("after:1", facts((1, "CANCELLED", None))) == MET
    table = facts((1, "RUNNING", T0 - 60))
    assert verdict("after:1+5", table) == WAIT
    assert verdict("after:1+5", table, now=T0 + 240) == MET


def test_all_of_and_any_of():
    table = facts((1, "COMPLETED", T0), (2, "RUNNING", T0), (3, "FAILED", T0))
    assert verdict("afterok:1,afterok:2", table) == WAIT
    assert verdict("afterok:1,afterok:3", table) == NEVER
    assert verdict("afterok:1:2", table) == WAIT
    assert verdict("afterok:3?afterok:1", table) == MET
    assert verdict("afterok:3?afterok:2", table) == WAIT
    assert verdict("afterok:3?afternotok:1", table) == NEVER


def test_an_array_id_means_every_task_and_a_task_id_one():
    table = facts((10, 0, "COMPLETED", T0), (10, 1, "FAILED", T0), (10, 2, "RUNNING", T0))
    assert verdict("afterok:10", table) == NEVER            # one task failed already
    assert verdict("afterok:10_0", table) == MET
    assert verdict("afterany:10", table) == WAIT
    assert verdict("afternotok:10", table) == WAIT           # not all ended yet
    done = facts((10, 0, "COMPLETED", T0), (10, 1, "FAILED", T0))
    assert verdict("afternotok:10", done) == MET
    assert verdict("afterany:10", done) == MET


def test_an_unknown_job_can_never_satisfy():
    assert verdict("afterany:99", {}) == NEVER


def test_singleton():
    assert verdict("singleton", {}) == MET
    assert verdict("singleton", {}, singleton_blocked=True) == WAIT
    jobs = [Named(1, "alice", "a", True), Named(2, "alice", "a", False), Named(3, "alice", "a", False),
            Named(4, "bob", "a", False), Named(5, "alice", "b", False), Named(6, "alice", "b", False)]
    # 2 and 3 wait for the running 1; 6 waits for the earlier pending 5; bob's is his own
    assert deps.singleton_blocked(jobs) == {2, 3, 6}


def test_cycles_are_found():
    graph = {2: [1], 3: [2]}
    dep = parse_dependency("afterok:3")
    assert deps.creates_cycle(1, dep, lambda j: graph.get(j, []))
    assert not deps.creates_cycle(4, dep, lambda j: graph.get(j, []))
    assert deps.creates_cycle(5, parse_dependency("afterok:5"), lambda j: [])


def test_the_book_keeps_finished_facts_and_forgets_what_nobody_asks_about():
    book = DependencyBook()
    book.record(JobFacts(1, "RUNNING", T0))       # not finished: never kept
    book.record(JobFacts(2, "COMPLETED", T0))
    book.record(JobFacts(10, "FAILED", T0, 10, 0))
    book.record(JobFacts(11, "COMPLETED", T0, 10, 1))
    assert book.ended_targets(1, None) == []
    assert [f.job_id for f in book.ended_targets(10, None)] == [10, 11]
    assert [f.job_id for f in book.ended_targets(10, 1)] == [11]
    book.retain({10})
    assert book.ended_targets(2, None) == []
    assert [f.job_id for f in book.ended_targets(10, None)] == [10, 11]


# -- on the head ------------------------------------------------------------------------------------

async def test_afterok_chain_runs_in_order_and_a_failure_leaves_the_child_never_satisfied(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        a = await kit.submit(gpus=1)
        b = await kit.submit(gpus=1, dependency=f"afterok:{a}")
        c = await kit.submit(gpus=1, dependency=f"afterok:{b}")
        await kit.schedule()
        assert kit.running() == [a]
        assert (kit.job(b).reason, kit.job(c).reason) == ("Dependency", "Dependency")
        await kit.finish(a, exit_code=0)
        await kit.schedule()
        assert kit.running() == [b]
        await kit.finish(b, exit_code=1)
        await kit.schedule()
        assert kit.running() == []
        assert kit.job(c).reason == "DependencyNeverSatisfied"
        assert kit.job(c).state.value == "PENDING"


async def test_kill_on_invalid_dep_cancels_instead(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1)
        b = await kit.submit(dependency=f"afterok:{a}", kill_on_invalid_dep=True)
        await kit.schedule()
        await kit.finish(a, exit_code=2)
        await kit.schedule()
        assert kit.job(b) is None
        rec = await kit.record(b)
        assert (rec.state.value, rec.reason) == ("CANCELLED", "DependencyNeverSatisfied")


async def test_afternotok_and_afterany_and_singleton_on_the_head(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        a = await kit.submit(gpus=1)
        on_fail = await kit.submit(dependency=f"afternotok:{a}")
        always = await kit.submit(dependency=f"afterany:{a}")
        first = await kit.submit(name="solo", dependency="singleton")
        second = await kit.submit(name="solo", dependency="singleton")
        await kit.schedule()
        assert set(kit.running()) == {a, first}
        assert kit.job(second).reason == "Dependency"
        await kit.finish(first)
        await kit.finish(a, exit_code=0)
        await kit.schedule()
        assert set(kit.running()) == {always, second}
        assert kit.job(on_fail).reason == "DependencyNeverSatisfied"


async def test_dependencies_survive_a_head_restart(tmp_path):
    db = str(tmp_path / "head.db")
    async with HeadKit(tmp_path, db=db) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1)
        b = await kit.submit(dependency=f"afterok:{a}")
        await kit.schedule()
        await kit.finish(a, exit_code=0)
    async with HeadKit(tmp_path, db=db) as kit:   # the book starts empty: facts come from SQLite
        kit.add_node("n1")
        await kit.schedule()
        assert kit.running() == [b]


async def test_submit_refuses_a_dependency_on_a_job_that_does_not_exist(tmp_path):
    async with HeadKit(tmp_path) as kit:
        message = await kit.refused("submit", spec={"script": "#!/bin/sh\ntrue\n", "dependency": "afterok:4242"})
        assert message == "Batch job submission failed: Job dependency problem: no job 4242"
        a = await kit.submit()
        message = await kit.refused("submit", spec={"script": "#!/bin/sh\ntrue\n", "dependency": f"afterok:{a}_3"})
        assert message.endswith(f"no job {a}_3")


async def test_update_dependency_checks_targets_and_cycles(tmp_path):
    async with HeadKit(tmp_path) as kit:
        a = await kit.submit(hold=True)
        b = await kit.submit(dependency=f"afterok:{a}")
        r = await kit.call("update_job", ALICE, job_ids=[a], changes={"Dependency": f"afterok:{b}"})
        assert r["errors"] == [f"job {a}: Job dependency problem: the dependency would make the job wait for itself"]
        assert "no job 999" in await kit.refused("update_job", ALICE, job_ids=[b], changes={"dependency": "afterok:999"})
        r = await kit.call("update_job", ALICE, job_ids=[b], changes={"dependency": ""})
        assert r == {"done": [str(b)], "errors": []}
        assert kit.job(b).dependency is None
        r = await kit.call("update_job", BOB, job_ids=[b], changes={"dependency": f"afterany:{a}"})
        assert r["errors"] == [f"job {b}: Access/permission denied"]
