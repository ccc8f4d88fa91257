"""The telemetry tables (``job_telemetry``, ``node_series`` and the jobs' GPU columns): the
one place their SQL is written.  ``head/telemetry.py`` keeps the live aggregates and decides
what to write; ``head/reports.py`` reads the shares back for ``gpuctl report``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .store import Store

# A job's GPU-usage aggregates, in column order (telemetry.JobUsage's fields).
USAGE_COLUMNS = ("sampled_s", "gpu_s", "util_gpu_s", "idle_gpu_s", "util_max", "mem_max_mb", "energy_j",
                 "last_sample")
_UPSERT_USAGE = (f"INSERT INTO job_telemetry(job_id, {', '.join(USAGE_COLUMNS)}) "
                 f"VALUES (?{', ?' * len(USAGE_COLUMNS)}) "
                 f"ON CONFLICT(job_id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in USAGE_COLUMNS)}")
_CHUNK = 500    # SQLite's limit on host parameters


class TelemetryRepository:
    def __init__(self, store: "Store") -> None:
        self.store = store

    async def usage_rows(self, job_ids: Iterable[int]) -> list[tuple]:
        """(job_id, *USAGE_COLUMNS) of the given jobs that have a row."""
        return await self._in_chunks(f"SELECT job_id, {', '.join(USAGE_COLUMNS)} FROM job_telemetry "
                                     "WHERE job_id IN ({})", job_ids)

    async def usage_row(self, job_id: int) -> tuple | None:
        """USAGE_COLUMNS of one job, None when it was never sampled."""
        db = self.store.db
        assert db is not None
        async with db.execute(f"SELECT {', '.join(USAGE_COLUMNS)} FROM job_telemetry WHERE job_id=?",
                              (job_id,)) as cur:
            return await cur.fetchone()

    async def shares(self, job_ids: Iterable[int]) -> list[tuple[int, float, float, float]]:
        """(job_id, gpu_s, util_gpu_s, idle_gpu_s) of the given jobs that were sampled."""
        return await self._in_chunks("SELECT job_id, gpu_s, util_gpu_s, idle_gpu_s FROM job_telemetry "
                                     "WHERE gpu_s > 0 AND job_id IN ({})", job_ids)

    async def flush(self, usages: list[tuple[int, tuple, tuple]], buckets: list[tuple], *, cut_before: float) -> None:
        """One transaction: each (job_id, USAGE_COLUMNS values, (util_mean, util_max,
        mem_max_mb, energy_j)) into job_telemetry and the job's row, the closed
        ``node_series`` buckets, and the series cut at ``cut_before``."""
        await self.store.write_many([
            (_UPSERT_USAGE, [(job_id, *values) for job_id, values, _ in usages]),
            ("UPDATE jobs SET gpu_util_mean=?, gpu_util_max=?, gpu_mem_max_mb=?, energy_j=? WHERE job_id=?",
             [(*shown, job_id) for job_id, _, shown in usages]),
            ("INSERT OR REPLACE INTO node_series(node, t, gpus, gpus_alloc, util_mean, util_max, mem_used_mb, "
             "power_w, temp_max, samples) VALUES (?,?,?,?,?,?,?,?,?,?)", buckets),
            ("DELETE FROM node_series WHERE t < ?", [(cut_before,)]),
        ])

    async def _in_chunks(self, sql: str, job_ids: Iterable[int]) -> list[tuple]:
        db = self.store.db
        assert db is not None
        ids = sorted(job_ids)
        out: list[tuple] = []
        for n in range(0, len(ids), _CHUNK):
            chunk = ids[n:n + _CHUNK]
            async with db.execute(sql.format(",".join("?" * len(chunk))), chunk) as cur:
                out.extend(await cur.fetchall())
        return out
