"""The reports' reads (``gpuctl report``, ``seff``): the one place the SQL over allocations
and jobs that billing needs is written.  ``head/reports.py`` turns the rows into bills."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
