import sqlite3
from dataclasses import replace

import pytest

from gpud.head.store import MIGRATIONS, JobRecord, Store, Txn
from gpud.model import IllegalTransition, JobSpec, JobState


def new_job(**kw) -> JobRecord:
    d = dict(job_id=0, name="j", user="alice", uid=1000, gid=1000, account="default", partition="gpu",
             qos="normal", state=JobState.PENDING, spec=JobSpec(script="#!/bin/bash\ntrue\n"), gpus=1,
             cpus=1, mem_mb=1024, time_limit=None, submit_time=100.0)
    d.update(kw)
    return JobRecord(**d)


async def test_insert_transition_and_reload(tmp_path):
    path = str(tmp_path / "head.db")
    async with Store(path) as store:
        (job,) = await store.insert_jobs([new_job()], now=100.0)
        assert job.job_id == 1
        txn = Txn(store)
        txn.transition(job, JobState.RUNNING, now=101.0, event="allocated", node="n1", gpu_indices=(0,),
                       attempt=1)
        await store.commit(txn)
        assert store.active[1].state is JobState.RUNNING
    async with Store(path) as store:
        job = store.active[1]
        assert (job.state, job.node, job.gpu_indices, job.attempt) == (JobState.RUNNING, "n1", (0,), 1)
        events = await store.job_events(1)
        assert [e["event"] for e in events] == ["submitted", "allocated"]
        txn = Txn(store)
        txn.transition(job, JobState.COMPLETED, now=102.0, event="finished", exit_code=0, end_time=102.0)
        await store.commit(txn)
        assert 1 not in store.active
        (done,) = await store.find_jobs(job_ids=[1])
        assert done.state is JobState.COMPLETED and done.exit_code == 0


async def test_a_transition_writes_the_spec_only_when_it_is_a_new_one(tmp_path):
    path = str(tmp_path / "head.db")
    async with Store(path) as store:
        (job,) = await store.insert_jobs([new_job()], now=100.0)
        txn = Txn(store)
        held = txn.transition(job, JobState.PENDING, now=101.0, event="held", spec=replace(job.spec, hold=True))
        assert "spec=?" in txn._sql[0][0]
        txn.transition(held, JobState.RUNNING, now=102.0, event="allocated", node="n1", attempt=1)
        assert "spec=?" not in txn._sql[2][0]
        await store.commit(txn)
    async with Store(path) as store:
        job = store.active[1]
        assert (job.state, job.spec.hold, job.spec.script) == (JobState.RUNNING, True, "#!/bin/bash\ntrue\n")


async def test_illegal_transition_raises_and_changes_nothing(tmp_path):
    async with Store(str(tmp_path / "head.db")) as store:
        (job,) = await store.insert_jobs([new_job()], now=1.0)
        txn = Txn(store)
        txn.transition(job, JobState.CANCELLED, now=2.0, event="cancelled")
        await store.commit(txn)
        (job,) = await store.find_jobs(job_ids=[1])
        with pytest.raises(IllegalTransition):
            Txn(store).transition(job, JobState.RUNNING, now=3.0, event="allocated")
        (again,) = await store.find_jobs(job_ids=[1])
        assert again.state is JobState.CANCELLED


async def test_failed_commit_leaves_memory_and_disk_unchanged(tmp_path):
    async with Store(str(tmp_path / "head.db")) as store:
        (job,) = await store.insert_jobs([new_job()], now=1.0)
        txn = Txn(store)
        txn.transition(job, JobState.RUNNING, now=2.0, event="allocated", node="n1")
        txn.execute("INSERT INTO no_such_table VALUES (1)")
        with pytest.raises(Exception):
            await store.commit(txn)
        assert store.active[1].state is JobState.PENDING
        (disk,) = await store.find_jobs(job_ids=[1])
        assert disk.state is JobState.PENDING
        (again,) = await store.insert_jobs([new_job()], now=3.0)   # rolled back, not left open
        assert again.job_id == 2


async def test_an_older_database_is_migrated_and_keeps_its_jobs(tmp_path):
    path = str(tmp_path / "head.db")
    con = sqlite3.connect(path, isolation_level=None)
    for stmt in ";".join(MIGRATIONS[:3]).split(";"):     # a database of schema 3
        if stmt.strip():
            con.execute(stmt)
    con.execute("PRAGMA user_version=3")
    con.execute("INSERT INTO jobs(name, user, uid, gid, account, partition, qos, state, spec, gpus, cpus, "
                "mem_mb, submit_time) VALUES ('old', 'alice', 1000, 1000, 'default', 'gpu', 'normal', "
                "'PENDING', '{\"script\": \"#!/bin/sh\\ntrue\\n\"}', 1, 1, 1024, 1.0)")
    con.close()
    async with Store(path) as store:
        (job,) = store.active.values()
        assert (job.name, job.devices, job.parts) == ("old", (), ())
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    con.close()


async def test_schema_version_and_newer_database_refused(tmp_path):
    path = str(tmp_path / "head.db")
    async with Store(path):
        pass
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    con.close()
    with pytest.raises(RuntimeError, match="newer than this gpud"):
        async with Store(path):
            pass


async def test_earlier_attempts_say_how_each_requeued_run_ended(tmp_path):
    from gpud.head.jobs import requeue_changes
    from gpud.head.store_reports import earlier_attempts

    async with Store(str(tmp_path / "head.db")) as store:
        (job,) = await store.insert_jobs([new_job()], now=1.0)
        ends = [("node_fail", "node_fail", "node n1 DOWN (no heartbeat); its lease ended; requeued"),
                ("requeued", "preempted:requeue", "preempted:requeue exit=0 signal=15"),
                ("requeued", "requeue", "requeue exit=0 signal=15")]
        for attempt, (event, outcome, detail) in enumerate(ends, start=1):
            txn = Txn(store)
            job = txn.transition(job, JobState.RUNNING, now=10.0 * attempt, event="allocated", node=f"n{attempt}",
                                 attempt=attempt, start_time=10.0 * attempt)
            txn.start_allocation(job, now=10.0 * attempt)
            await store.commit(txn)
            txn = Txn(store)
            txn.end_allocation(job.job_id, attempt, end=10.0 * attempt + 5, outcome=outcome)
            job = txn.transition(job, JobState.PENDING, now=10.0 * attempt + 5, event=event, detail=detail,
                                 **requeue_changes(job))
            await store.commit(txn)
        (other,) = await store.insert_jobs([new_job()], now=2.0)
        runs = await earlier_attempts(store, [job.job_id, other.job_id])
        assert list(runs) == [job.job_id]
        assert [(r["attempt"], r["node"], r["state"], r["start_time"], r["end_time"]) for r in runs[job.job_id]] == [
            (1, "n1", "NODE_FAIL", 10.0, 15.0), (2, "n2", "PREEMPTED", 20.0, 25.0), (3, "n3", "REQUEUED", 30.0, 35.0)]
        assert runs[job.job_id][0]["reason"].startswith("node n1 DOWN")
