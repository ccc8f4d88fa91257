"""scrontab's tables (``cron_entries``, ``scrontabs``): the one place their SQL is written.

``head/cron.py`` keeps the entries in memory and decides when they fire; this repository
only reads and writes their rows, each write in one transaction under the store's writer
lock, like every other write to the head's database.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .store import JobRecord, Store

Statement = tuple[str, tuple]
_ENTRY_COLUMNS = "entry_id, uid, gid, user, line, schedule, spec, last_slot, last_job_id"


class CronRepository:
    def __init__(self, store: "Store") -> None:
        self.store = store

    async def entries(self) -> list[tuple]:
        """Every entry's row: (entry_id, uid, gid, user, line, schedule text, spec json,
        last_slot, last_job_id), in entry order."""
        db = self.store.db
        assert db is not None
        async with db.execute(f"SELECT {_ENTRY_COLUMNS} FROM cron_entries ORDER BY entry_id") as cur:
            return list(await cur.fetchall())

    async def text_of(self, uid: int) -> str:
        db = self.store.db
        assert db is not None
        async with db.execute("SELECT text FROM scrontabs WHERE uid=?", (uid,)) as cur:
            row = await cur.fetchone()
        return row[0] if row else ""

    async def mark_slot(self, entry_id: int, slot: int) -> None:
        """The entry's ``slot`` is done without a job (skipped or refused)."""
        await self._write([("UPDATE cron_entries SET last_slot=? WHERE entry_id=?", (slot, entry_id))])

    @staticmethod
    def fired(entry_id: int, slot: int) -> Callable[[list["JobRecord"]], list[Statement]]:
        """For ``Store.insert_jobs(also=...)``: the entry fired ``slot`` with the job inserted,
        in the same transaction, so a restart neither loses nor repeats it."""
        return lambda jobs: [("UPDATE cron_entries SET last_slot=?, last_job_id=? WHERE entry_id=?",
                              (slot, jobs[0].job_id, entry_id))]

    async def replace(self, uid: int, gid: int, user: str, text: str,
                      rows: list[tuple[int, str, dict[str, Any], int | None, int | None]], now: float) -> list[int]:
        """The user's entries become ``rows`` (line, schedule text, spec, last_slot,
        last_job_id) and their crontab ``text``, in one transaction; the new entry ids."""
        stmts: list[Statement] = [("DELETE FROM cron_entries WHERE uid=?", (uid,))]
        for line, schedule, spec, last, job in rows:
            stmts.append(("INSERT INTO cron_entries(uid, gid, user, line, schedule, spec, last_slot, last_job_id, "
                          "created) VALUES (?,?,?,?,?,?,?,?,?)",
                          (uid, gid, user, line, schedule, json.dumps(spec, sort_keys=True), last, job, now)))
        if text.strip():
            stmts.append(("INSERT INTO scrontabs(uid, user, text, updated) VALUES (?,?,?,?) ON CONFLICT(uid) "
                          "DO UPDATE SET user=excluded.user, text=excluded.text, updated=excluded.updated",
                          (uid, user, text, now)))
        else:
            stmts.append(("DELETE FROM scrontabs WHERE uid=?", (uid,)))
        return await self._write(stmts)

    async def _write(self, statements: list[Statement]) -> list[int]:
        """Run statements in one transaction; the rowids of the INSERTs into cron_entries."""
        def work(conn: sqlite3.Connection) -> list[int]:
            ids = []
            for sql, params in statements:
                cur = conn.execute(sql, params)
                if sql.startswith("INSERT INTO cron_entries"):
                    ids.append(cur.lastrowid)
            return ids
        async with self.store.write_lock:
            return await self.store.transaction(work)
