"""The ``jobs`` op keeps squeue's folded table until a job changes, and answers everything
else afresh."""

from __future__ import annotations

import pytest

from gpud import jsoncodec, protocol
from gpud.head import arrays
from gpud.ctlsocket import Caller, RequestError
from gpud.head.ops_jobs import OPS, op_jobs
from gpud.head.store import JobRecord, Txn
from gpud.model import JobSpec, JobState
from tests.telemetry_rig import rig

CALLER = Caller(uid=1000, gid=1000, pid=1, user="alice")
TABLE = {"fold": True, "fields": ["job_id", "display_id", "state", "reason", "priority", "node"]}


def job(array: str | None = None) -> JobRecord:
    spec = JobSpec(script="#!/bin/sh\ntrue\n", name="job", gpus=1, array=array)
    return JobRecord(job_id=0, name="job", user="alice", uid=1000, gid=1000, account="default", partition="gpu",
                     qos="normal", state=JobState.PENDING, spec=spec, gpus=1, cpus=1, mem_mb=1024,
                     time_limit=None, submit_time=1_700_000_000.0)


async def answer(r, args=TABLE) -> dict | protocol.Encoded:
    return await OPS["jobs"](r.head, CALLER, dict(args))


async def listing(r, args=TABLE) -> dict:
    """The answer as a client reads it (the kept table comes encoded)."""
    a = await answer(r, args)
    return jsoncodec.loads(a) if isinstance(a, protocol.Encoded) else a


async def test_the_table_is_kept_until_a_job_changes(tmp_path) -> None:
    async with rig(tmp_path) as r:
        tasks = await r.store.insert_jobs(arrays.expand(job("0-4"), arrays.parse_array("0-4")), r.clock())
        kept = await answer(r)
        assert isinstance(kept, protocol.Encoded)
        assert await answer(r) is kept                          # nothing changed: the same answer
        first = await listing(r)
        assert first == await op_jobs(r.head, CALLER, dict(TABLE))
        assert protocol.decode_response(protocol.ok(kept)) == first

        (lone,) = await r.store.insert_jobs([job()], r.clock())  # a submission
        second = await listing(r)
        assert second is not first and second == await op_jobs(r.head, CALLER, dict(TABLE))
        assert lone.job_id in {rec["job_id"] for rec in second["jobs"]}

        txn = Txn(r.store)                                      # a commit
        txn.transition(r.store.active[tasks[0].job_id], JobState.CANCELLED, now=r.clock(), event="cancelled",
                       end_time=r.clock())
        await r.store.commit(txn)
        third = await listing(r)
        assert third != second and third == await op_jobs(r.head, CALLER, dict(TABLE))

        await r.add_node("gpu01")                               # a pass: starts and annotations
        await r.schedule()
        fourth = await listing(r)
        assert fourth != third and fourth == await op_jobs(r.head, CALLER, dict(TABLE))
        assert any(rec["node"] == "gpu01" for rec in fourth["jobs"])


async def test_other_questions_are_answered_afresh(tmp_path) -> None:
    async with rig(tmp_path) as r:
        await r.store.insert_jobs([job()], r.clock())
        for args in ({}, {"fold": True}, {"fold": True, "fields": ["job_id", "comment"]},
                     {"fields": ["job_id"]}, {"fold": True, "all": True, "fields": ["job_id"]}):
            first = await answer(r, args)
            assert await answer(r, args) is not first and not isinstance(first, protocol.Encoded)
        filtered = {**TABLE, "users": ["bob"]}
        assert (await listing(r, filtered))["jobs"] == []
        assert len((await listing(r))["jobs"]) == 1             # each question its own answer


async def test_bad_arguments_are_still_refused(tmp_path) -> None:
    async with rig(tmp_path) as r:
        for bad in ({**TABLE, "states": ["NOPE"]}, {**TABLE, "job_ids": ["x"]}):
            for _ in range(2):
                with pytest.raises(RequestError):
                    await listing(r, bad)
