"""The reports' reads (``gpuctl report``, ``seff``): the one place the SQL over allocations
and jobs that billing needs is written.  ``head/reports.py`` turns the rows into bills."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model import StopReason

if TYPE_CHECKING:
    from .store import Store


async def allocation_rows(store: "Store", since: float, until: float, job_id: int | None = None) -> list[tuple]:
    """(job_id, attempt, user, account, partition, node, gpu_indices, start, end, parts,
    devices) of the allocations overlapping ``[since, until)`` (of one job with ``job_id``),
    in job and attempt order: what ``gpuctl report`` and ``seff`` bill."""
    db = store.db
    assert db is not None
    q = ("SELECT a.job_id, a.attempt, j.user, j.account, j.partition, a.node, a.gpu_indices, a.start_time, "
         "a.end_time, a.parts, a.devices FROM allocations a JOIN jobs j ON j.job_id = a.job_id "
         "WHERE a.start_time < ? AND (a.end_time IS NULL OR a.end_time > ?)"
         + (" AND a.job_id = ?" if job_id is not None else "") + " ORDER BY a.job_id, a.attempt")
    async with db.execute(q, (until, since) + ((job_id,) if job_id is not None else ())) as cur:
        return list(await cur.fetchall())


# How an attempt that did not end the job ended, as sacct names the state of that run
_ENDED_AS = {"node_fail": "NODE_FAIL"}
_ATTEMPT_BATCH = 500    # job ids per query (SQLite's bound-parameter limit is 999 on old builds)


async def earlier_attempts(store: "Store", job_ids: list[int]) -> dict[int, list[dict]]:
    """Every attempt that ended with the job back in the queue, per job id, oldest first:
    ``{"attempt", "node", "start_time", "end_time", "state", "reason"}``, where ``state`` is
    how sacct's ``--duplicates`` names that run (NODE_FAIL, PREEMPTED or REQUEUED) and
    ``reason`` the requeue's recorded cause (a node's failure and its lease, a preemption,
    ``scontrol requeue``)."""
    db = store.db
    assert db is not None
    out: dict[int, list[dict]] = {}
    for i in range(0, len(job_ids), _ATTEMPT_BATCH):
        batch = job_ids[i:i + _ATTEMPT_BATCH]
        q = ("SELECT a.job_id, a.attempt, a.node, a.start_time, a.end_time, a.outcome, e.event, e.detail "
             "FROM allocations a JOIN job_events e ON e.job_id = a.job_id AND e.attempt = a.attempt "
             "AND e.state = 'PENDING' AND e.event IN ('node_fail', 'requeued') "
             f"WHERE a.job_id IN ({','.join('?' * len(batch))}) AND a.end_time IS NOT NULL "
             "ORDER BY a.job_id, a.attempt, e.id")
        async with db.execute(q, tuple(batch)) as cur:
            for jid, attempt, node, start, end, outcome, event, detail in await cur.fetchall():
                runs = out.setdefault(jid, [])
                if runs and runs[-1]["attempt"] == attempt:
                    continue    # one row per attempt: the first requeue recorded for it
                stop = StopReason.of(outcome)
                state = _ENDED_AS.get(event) or ("PREEMPTED" if stop is not None and stop.kind == "preempted"
                                                 else "REQUEUED")
                runs.append({"attempt": attempt, "node": node, "start_time": start, "end_time": end,
                             "state": state, "reason": detail})
    return out
