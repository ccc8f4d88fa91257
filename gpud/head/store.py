"""The head's durable state: jobs, allocations, nodes, usage and the job event log, in SQLite.

Theory of operation
-------------------
SQLite in WAL mode, one writer connection (aiosqlite runs it on its own thread), every
write inside ``BEGIN IMMEDIATE`` with ``synchronous=FULL``: once ``commit`` returns, a
``kill -9`` or a power cut cannot lose it.  A transaction goes to that thread whole, in
one trip (``Store.transaction``), not a trip per statement.  Nobody is told about a state
change (a gpuctl reply, a launch message) before the transaction holding it has committed.

Every job state change goes through ``Txn.transition``, which checks the move against
``gpud.model.JOB_TRANSITIONS`` and appends a row to ``job_events`` in the same transaction:
the event log is the history ``sacct`` reads and the answer to "why did this happen?".

The store also keeps every non-terminal job in memory (``Store.active``): the scheduler's
snapshot and ``squeue`` read it without touching the disk.  ``Txn`` updates the memory copy
only after the commit succeeds, so memory never runs ahead of the database.

Nodes have the same door: ``Txn.node_transition`` checks the move against
``gpud.model.NODE_TRANSITIONS`` and appends a row to ``node_events`` (why a node went DOWN,
who drained it), which ``scontrol show node`` reads.

Storage faults: when SQLite fails a statement (a full disk, an I/O error) the transaction is
rolled back if SQLite has not already done so, and the original error is raised, never the
ROLLBACK's own "no transaction is active"; ``storage_problem`` words it for users.  The WAL
is checkpointed by the head's liveness loop (``checkpoint``): passively once it grows past
``WAL_CHECKPOINT_BYTES``, and truncated to nothing every few seconds at a quiet moment.

Schema changes are numbered migrations in ``MIGRATIONS`` (schema.py); ``PRAGMA user_version`` records
how many have run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sqlite3
import stat
import time
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Any, Callable, Iterable, Iterator

import aiosqlite

from ..model import JobSpec, JobState, NodeState, check_job_transition, check_node_transition
from .schema import MIGRATIONS

log = logging.getLogger("gpud.store")


@dataclass
class JobRecord:
    """One job row, as held in memory for non-terminal jobs."""

    job_id: int
    name: str
    user: str
    uid: int
    gid: int
    account: str
    partition: str
    qos: str
    state: JobState
    spec: JobSpec
    gpus: int
    cpus: int
    mem_mb: int
    time_limit: float | None
    submit_time: float
    reason: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    attempt: int = 0
    requeue_count: int = 0
    preempt_count: int = 0
    borrowed: bool = False
    launched_at: float | None = None
    stop_reason: str | None = None
    stop_time: float | None = None
    # GPU telemetry over all attempts (gpud/head/telemetry.py); None until sampled
    gpu_util_mean: float | None = None
    gpu_util_max: float | None = None
    gpu_mem_max_mb: int | None = None
    energy_j: float | None = None
    # from the job's cgroup on its (first) node; None: not measured (an unconfined worker)
    max_rss: int | None = None        # peak memory, bytes
    total_cpu: float | None = None    # CPU time of all its processes, seconds
    # Slurm compatibility (gpud/head/slurm.py, arrays.py, deps.py, cron.py)
    array_job_id: int | None = None   # the array's id (its first task's job id)
    array_task_id: int | None = None
    array_throttle: int | None = None  # at most this many tasks of the array run at once
    dependency: str | None = None     # canonical dependency text; updatable
    begin_time: float | None = None   # not eligible before (epoch seconds)
    deadline: float | None = None     # cancelled when it cannot end by then
    hold_kind: str | None = None      # "user" or "admin" while held
    cron_entry: int | None = None     # the scrontab entry that submitted it
    submit_key: str | None = None     # the client's key for its submission (a repeat finds it)
    # GPU sharing: what the current allocation holds, as gpusharing.launch_devices entries
    devices: tuple[dict[str, Any], ...] = ()
    # multi-node jobs: the nodes after the first (rank 1..N-1) as gang.part_dict entries;
    # node/gpu_indices/cpus/mem_mb above are rank 0's
    parts: tuple[dict[str, Any], ...] = ()
    # not persisted: scheduler annotations refreshed every pass
    priority: float = 0.0
    expected_start: float | None = None

    def to_public(self) -> dict[str, Any]:
        """The JOB record of gpud.protocol."""
        return {
            "job_id": self.job_id, "name": self.name, "user": self.user, "uid": self.uid,
            "gid": self.gid, "account": self.account, "partition": self.partition,
            "qos": self.qos, "state": self.state.value, "reason": self.reason,
            "node": self.node, "gpus": self.gpus, "gpu_ids": list(self.gpu_uuids),
            "gpu_indices": list(self.gpu_indices), "cpus": self.cpus, "mem_mb": self.mem_mb,
            "time_limit": self.time_limit, "submit_time": self.submit_time,
            "start_time": self.start_time, "end_time": self.end_time,
            "exit_code": self.exit_code, "signal": self.signal,
            "work_dir": self.spec.work_dir, "stdout": self.spec.stdout,
            "stderr": self.spec.stderr, "attempt": self.attempt,
            "requeue_count": self.requeue_count, "preempt_count": self.preempt_count,
            "priority": self.priority, "borrowed": self.borrowed,
            "expected_start": self.expected_start, "comment": self.spec.comment,
            "gpu_util_mean": self.gpu_util_mean, "gpu_util_max": self.gpu_util_max,
            "gpu_mem_max_mb": self.gpu_mem_max_mb, "energy_j": self.energy_j,
            "max_rss": self.max_rss, "total_cpu": self.total_cpu,
            "display_id": self.display_id, "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id, "array_throttle": self.array_throttle,
            "dependency": self.dependency, "begin_time": self.begin_time,
            "deadline": self.deadline, "hold": self.hold_kind, "nice": self.spec.nice,
            "cron_entry": self.cron_entry, "devices": [dict(d) for d in self.devices],
            "mig_profile": self.spec.mig_profile, "gpu_mem_mb": self.spec.gpu_mem_mb,
            "nodes": self.spec.nodes if self.node is None else 1 + len(self.parts),
            "nodelist": self.nodelist,
            "ntasks_per_node": self.spec.ntasks_per_node,
        }

    @property
    def nodelist(self) -> str | None:
        """The job's nodes as a compressed hostlist (rank 0 is ``node``), or its one node."""
        if not self.parts:
            return self.node
        from .gang import job_nodes, nodelist_text

        return nodelist_text(job_nodes(self))

    @property
    def display_id(self) -> str:
        """``123`` or, for an array task, ``<array id>_<task>`` as squeue shows it."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


_PERSISTED = [f.name for f in fields(JobRecord) if f.name not in ("priority", "expected_start")]
_JSON_COLS = {"spec", "gpu_indices", "gpu_uuids", "devices", "parts"}


def _row_values(job: JobRecord, spec_json: str | None = None) -> list[Any]:
    """The row of ``job`` as values in ``_PERSISTED`` order: the attributes read in one C call,
    then the few columns stored differently converted in place.  ``spec_json``: the spec
    already encoded (an array's tasks share one), or "" where it is not written."""
    row = list(_persisted_values(job))
    row[_SPEC] = spec_json if spec_json is not None else encode_spec(job.spec)
    for i in _TUPLE_COLS:
        v = row[i]
        row[i] = json.dumps(list(v)) if v else "[]"   # a new job's are all empty
    row[_STATE] = row[_STATE].value
    row[_BORROWED] = int(row[_BORROWED])
    return row


def encode_spec(spec: JobSpec) -> str:
    return _compact_json(spec.to_dict())


_compact_json = json.JSONEncoder(separators=(",", ":")).encode   # one encoder, not one per call


_persisted_values = attrgetter(*_PERSISTED)


def _update(columns: list[str]) -> tuple[str, tuple[int, ...]]:
    """An UPDATE of ``columns`` by job id, and where their values sit in a row."""
    return (f"UPDATE jobs SET {', '.join(f'{c}=?' for c in columns)} WHERE job_id=?",
            tuple(_PERSISTED.index(c) for c in columns))


_UPDATE = _update([c for c in _PERSISTED if c != "job_id"])
_UPDATE_KEEPING_SPEC = _update([c for c in _PERSISTED if c not in ("job_id", "spec")])
_SPEC, _STATE, _BORROWED = (_PERSISTED.index(c) for c in ("spec", "state", "borrowed"))
_TUPLE_COLS = tuple(_PERSISTED.index(c) for c in ("gpu_indices", "gpu_uuids", "devices", "parts"))


def _from_row(row: aiosqlite.Row | tuple, cols: list[str]) -> JobRecord:
    d = dict(zip(cols, row))
    d["spec"] = JobSpec(**json.loads(d["spec"]))
    d["gpu_indices"] = tuple(json.loads(d["gpu_indices"]))
    d["gpu_uuids"] = tuple(json.loads(d["gpu_uuids"]))
    d["devices"] = tuple(x for x in json.loads(d.get("devices") or "[]") if isinstance(x, dict))
    d["parts"] = tuple(x for x in json.loads(d.get("parts") or "[]") if isinstance(x, dict))
    d["state"] = JobState(d["state"])
    d["borrowed"] = bool(d["borrowed"])
    return JobRecord(**{k: d[k] for k in _PERSISTED})


def _with_id(job: JobRecord, job_id: int) -> JobRecord:
    """A copy of a new job with its id: a shallow copy of its attributes, which is all that
    ``dataclasses.replace`` would do here, without its per-field work."""
    copy = object.__new__(JobRecord)
    copy.__dict__.update(job.__dict__)
    copy.job_id = job_id
    return copy


@dataclass
class NodeRecord:
    name: str
    info: dict[str, Any]
    state: str          # a NodeState value
    reason: str | None
    last_seen: float | None     # wall clock, for display; liveness is judged on the monotonic clock
    registered: float


_NODE_UPSERT = ("INSERT INTO nodes(name, info, state, reason, last_seen, registered) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET info=excluded.info, state=excluded.state, "
                "reason=excluded.reason, last_seen=excluded.last_seen")
WAL_CHECKPOINT_BYTES = 16 * 1024 * 1024   # a WAL past this is checkpointed (passive) at once


class Txn:
    """The writes of one transaction, applied to memory only after the commit."""

    def __init__(self, store: "Store") -> None:
        self._store = store
        self._sql: list[tuple[str, tuple]] = []
        self._jobs: dict[int, JobRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        # (before, after, event, now) of every transition, for Store.on_commit listeners
        self.moves: list[tuple[JobRecord, JobRecord, str, float]] = []

    def transition(self, job: JobRecord, new: JobState, *, now: float, event: str,
                   detail: str | None = None, **changes: Any) -> JobRecord:
        """Move ``job`` to ``new`` (legal moves only), with other column changes."""
        current = self._jobs.get(job.job_id, job)
        if new != current.state:
            check_job_transition(job.job_id, current.state, new)
        updated = replace(current, state=new, **changes)
        self._jobs[job.job_id] = updated
        self.moves.append((current, updated, event, now))
        # A spec is never changed in place: the same object means the same stored text, so
        # it is neither encoded nor written again (it is most of a row: script, environment).
        same_spec = updated.spec is current.spec
        row = _row_values(updated, "" if same_spec else None)
        sql, cols = _UPDATE_KEEPING_SPEC if same_spec else _UPDATE
        self._sql.append((sql, tuple([row[i] for i in cols]) + (job.job_id,)))
        self.event(updated, now, event, detail)
        return updated

    def event(self, job: JobRecord, now: float, event: str, detail: str | None = None) -> None:
        self._sql.append((
            "INSERT INTO job_events(job_id, time, attempt, event, state, detail) VALUES (?,?,?,?,?,?)",
            (job.job_id, now, job.attempt, event, job.state.value, detail),
        ))

    def execute(self, sql: str, params: tuple = ()) -> None:
        """A raw statement: for the store's own modules (head/store*.py) and tests only."""
        self._sql.append((sql, params))

    def start_allocation(self, job: JobRecord, *, now: float) -> None:
        """The allocation row of ``job``'s new attempt (as the transition to RUNNING left it)."""
        self._sql.append((
            "INSERT OR REPLACE INTO allocations(job_id, attempt, node, gpu_indices, gpu_uuids, cpus, mem_mb, "
            "start_time, devices, parts) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (job.job_id, job.attempt, job.node, _json(list(job.gpu_indices)), _json(list(job.gpu_uuids)),
             job.cpus, job.mem_mb, now, _json(list(job.devices)), _json(list(job.parts)) if job.parts else None)))

    def end_allocation(self, job_id: int, attempt: int, *, end: float, outcome: str) -> None:
        self._sql.append(("UPDATE allocations SET end_time=?, outcome=? WHERE job_id=? AND attempt=?",
                          (end, outcome, job_id, attempt)))

    def record_preemption(self, now: float) -> None:
        """One preemption, for the per-minute cap (``recent_preemptions``)."""
        self._sql.append(("INSERT INTO preemptions(time) VALUES (?)", (now,)))

    def node_transition(self, node: NodeRecord, new: NodeState | str, *, reason: str | None, now: float,
                        event: str, **changes: Any) -> NodeRecord:
        """Move ``node`` (a record, or a new one) to ``new`` with ``reason`` and other column
        changes (info, last_seen); legal moves only.  A change of state or reason leaves a
        ``node_events`` row; memory follows after the commit."""
        new = NodeState(new)
        before = self._nodes.get(node.name) or self._store.nodes.get(node.name)
        old = None if before is None else NodeState(before.state)
        check_node_transition(node.name, old, new)
        updated = replace(node, state=new.value, reason=reason, **changes)
        self._nodes[node.name] = updated
        self._sql.append((_NODE_UPSERT, (updated.name, json.dumps(updated.info), updated.state, updated.reason,
                                         updated.last_seen, updated.registered)))
        if old is not new or (before is not None and before.reason != reason):
            self._sql.append((
                "INSERT INTO node_events(node, time, old_state, state, event, reason) VALUES (?,?,?,?,?,?)",
                (node.name, now, None if old is None else old.value, new.value, event, reason)))
        return updated


def _json(value: Any) -> str:
    return json.dumps(value)


def _in_transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], Any]) -> Any:
    """(the database thread) ``work(conn)`` inside one IMMEDIATE transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
        conn.execute("COMMIT")
    except BaseException:
        # SQLite rolls back by itself after some errors (SQLITE_FULL, SQLITE_IOERR): a ROLLBACK
        # then fails with "no transaction is active", which must not hide the real error.
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as e:
                log.error("rollback after a failed transaction failed too: %s", e)
        raise
    return result


def storage_problem(e: BaseException, path: str) -> str:
    """A failed write as users should read it: what the disk said and where."""
    where = os.path.dirname(os.path.abspath(path))
    text = str(e)
    if isinstance(e, sqlite3.Error) and ("full" in text or getattr(e, "sqlite_errorname", "") == "SQLITE_FULL"):
        return f"the head's disk is full: {text} (free space under {where}; nothing was recorded)"
    if isinstance(e, OSError) and e.errno == 28:
        return f"the head's disk is full: {e.strerror} (free space under {where}; nothing was recorded)"
    if isinstance(e, sqlite3.Error):
        return f"the head's database failed: {text} ({path}; nothing was recorded)"
    return f"database error: {text}"


def free_kb(path: str) -> float | None:
    """Kilobytes (KiB) free for unprivileged writers on the filesystem holding ``path``; None: unknown."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize / 1024


def _migrate_to(version: int, conn: sqlite3.Connection) -> None:
    """(the database thread, in a transaction) Run migration number ``version``."""
    for stmt in MIGRATIONS[version - 1].split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute(f"PRAGMA user_version={version}")


def _one_writer(method: Callable) -> Callable:
    """Run a write method under ``Store.write_lock`` (see there)."""
    @functools.wraps(method)
    async def run(self: "Store", *args: Any, **kwargs: Any) -> Any:
        async with self.write_lock:
            return await method(self, *args, **kwargs)
    return run


def private_files(path: str) -> None:
    """Make the database and its WAL and shared-memory files the owner's alone (0600),
    whatever the umask: they hold every job's environment.  SQLite gives the -wal and -shm
    files it creates the database file's mode.  A missing directory is made 0711: nobody
    else may list it, but a worker sharing it (one state_dir for both) keeps job scripts
    below it that their users must reach.  gpud-head.service gives the head a directory of
    its own, 0700 (StateDirectory=gpud/head)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o711, exist_ok=True)
        os.chmod(directory, 0o711)
    for name, create in ((path, True), (path + "-wal", False), (path + "-shm", False)):
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, flags, 0o600)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise RuntimeError(f"cannot open the job database file {name}: {e.strerror}") from None
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode != 0o600:
                os.fchmod(fd, 0o600)
        except OSError as e:
            raise RuntimeError(f"the job database file {name} is mode {mode:04o} and cannot be made 0600 "
                               f"({e.strerror}); run: chmod 600 {name}") from None
        finally:
            os.close(fd)


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self.db: aiosqlite.Connection | None = None
        self.active: dict[int, JobRecord] = {}      # every non-terminal job
        # Counts changes to ``active`` and to its records' columns (commits, inserts, and
        # the scheduler's annotations, which call ``changed``): an answer computed from
        # ``active`` holds while it stays the same.
        self.changes = 0
        self.nodes: dict[str, NodeRecord] = {}
        self._cols: list[str] = []
        # Called with each committed Txn (metrics count outcomes here); must not raise.
        self.on_commit: list[Callable[[Txn], None]] = []
        # One transaction at a time on the one connection: a second BEGIN while another
        # coroutine's transaction is open fails ("cannot start a transaction within a
        # transaction").  Every write method below holds it; code that opens its own
        # transaction on ``db`` must too.
        self.write_lock = asyncio.Lock()
        self.last_write = float("-inf")   # monotonic time of the last transaction (WAL upkeep)

    async def transaction(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``work(conn)`` on the database thread inside one IMMEDIATE transaction, in one
        trip there and back.  Each aiosqlite call is such a trip (the event loop wakes for
        its answer), about 0.1-0.3 ms here: a transaction of N statements made N + 2, most of
        a lone submission's time at the head.  ``Connection._execute`` is how aiosqlite's
        own ``execute_fetchall`` runs a function on that thread.  Callers hold ``write_lock``."""
        assert self.db is not None
        try:
            return await self.db._execute(_in_transaction, self.db._conn, work)
        finally:
            self.last_write = time.monotonic()

    async def open(self) -> "Store":
        private_files(self.path)
        if not hasattr(aiosqlite.Connection, "_execute"):
            raise RuntimeError(f"aiosqlite {aiosqlite.__version__} lacks Connection._execute, which "
                               "gpud runs its transactions through; install aiosqlite 0.20 to 0.22")
        self.db = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            return await self._load()
        except BaseException:     # a refused database (newer schema, not SQLite): no thread left behind
            await self.close()
            raise

    async def _load(self) -> "Store":
        assert self.db is not None
        await self.db.execute("PRAGMA journal_mode=WAL")
        await self.db.execute("PRAGMA synchronous=FULL")
        await self.db.execute("PRAGMA busy_timeout=5000")
        await self.db.execute("PRAGMA foreign_keys=ON")
        await self._migrate()
        async with self.db.execute("SELECT * FROM jobs LIMIT 0") as cur:
            self._cols = [d[0] for d in cur.description]
        terminal = tuple(s.value for s in JobState if s.terminal)
        q = f"SELECT * FROM jobs WHERE state NOT IN ({','.join('?' * len(terminal))}) ORDER BY job_id"
        async with self.db.execute(q, terminal) as cur:
            async for row in cur:
                job = _from_row(row, self._cols)
                self.active[job.job_id] = job
        async with self.db.execute("SELECT name, info, state, reason, last_seen, registered FROM nodes") as cur:
            async for name, info, state, reason, last_seen, registered in cur:
                self.nodes[name] = NodeRecord(name, json.loads(info), state, reason, last_seen, registered)
        return self

    def changed(self) -> None:
        """Jobs in memory changed (see ``changes``)."""
        self.changes += 1

    async def close(self) -> None:
        if self.db is not None:
            await self.db.close()
            self.db = None

    async def __aenter__(self) -> "Store":
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _migrate(self) -> None:
        assert self.db is not None
        async with self.db.execute("PRAGMA user_version") as cur:
            (version,) = await cur.fetchone()
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"{self.path}: database schema {version} is newer than this gpud ({len(MIGRATIONS)}); upgrade gpud"
            )
        for n in range(version, len(MIGRATIONS)):
            await self.transaction(functools.partial(_migrate_to, n + 1))
            log.info("database %s migrated to schema %d", self.path, n + 1)

    # -- writes -----------------------------------------------------------------------

    @_one_writer
    async def commit(self, txn: Txn) -> None:
        """Run ``txn`` in one IMMEDIATE transaction, then update memory."""
        if not txn._sql:
            return
        statements = txn._sql

        def work(conn: sqlite3.Connection) -> None:
            for sql, params in statements:
                conn.execute(sql, params)
        await self.transaction(work)
        self.nodes.update(txn._nodes)
        if txn._jobs:
            self.changed()
        for job_id, job in txn._jobs.items():
            if job.state.terminal:
                self.active.pop(job_id, None)
            else:
                mem = self.active.get(job_id)
                if mem is not None:  # keep scheduler annotations
                    job.priority, job.expected_start = mem.priority, mem.expected_start
                self.active[job_id] = job
        for listener in self.on_commit:
            try:
                listener(txn)
            except Exception:  # an observer must never undo a committed transaction
                log.exception("commit listener failed")

    @_one_writer
    async def insert_jobs(self, jobs: list[JobRecord], now: float, *,
                          also: Callable[[list[JobRecord]], list[tuple[str, tuple]]] | None = None,
                          ) -> list[JobRecord]:
        """Insert new jobs in one transaction; returns them with their ids.

        The ids are the next ones AUTOINCREMENT would give, taken inside the IMMEDIATE
        transaction (the one writer), so the rows go in with one ``executemany``.
        Array tasks: a negative ``array_job_id`` is a placeholder; every task carrying it gets
        the job id of the first one (an array's id is its first task's id).
        ``also(saved)`` returns more statements for the same transaction (scrontab marks the
        slot it fired together with the job it submitted).
        """
        sql = f"INSERT INTO jobs ({', '.join(_PERSISTED)}) VALUES ({', '.join('?' * len(_PERSISTED))})"

        def work(conn: sqlite3.Connection) -> list[JobRecord]:
            (last,) = conn.execute(
                "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name='jobs'), 0), "
                "COALESCE((SELECT MAX(job_id) FROM jobs), 0))"
            ).fetchone()
            out: list[JobRecord] = []
            arrays: dict[int, int] = {}
            specs: dict[int, str] = {}   # each spec encoded once: an array's tasks share theirs
            rows = []
            for n, job in enumerate(jobs, start=last + 1):
                job = _with_id(job, n)
                if job.array_job_id is not None and job.array_job_id < 0:
                    job.array_job_id = arrays.setdefault(job.array_job_id, n)
                out.append(job)
                spec_json = specs.get(id(job.spec))
                if spec_json is None:
                    spec_json = specs[id(job.spec)] = encode_spec(job.spec)
                rows.append(_row_values(job, spec_json))
            conn.executemany(sql, rows)
            conn.executemany(
                "INSERT INTO job_events(job_id, time, attempt, event, state, detail) VALUES (?,?,?,?,?,?)",
                [(job.job_id, now, 0, "submitted", job.state.value, None) for job in out],
            )
            for stmt, params in (also(out) if also is not None else ()):
                conn.execute(stmt, params)
            return out
        out = await self.transaction(work)
        for job in out:
            self.active[job.job_id] = job
        if out:
            self.changed()
            users = sorted({j.user for j in out})
            log.info("recorded %d submitted job(s), %d-%d, of %s", len(out), out[0].job_id, out[-1].job_id,
                     ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else ""))
        return out

    async def upsert_node(self, node: NodeRecord, *, event: str = "update") -> None:
        """``node`` as it is now, through ``Txn.node_transition`` in a transaction of its own."""
        txn = Txn(self)
        txn.node_transition(node, node.state, reason=node.reason, now=node.last_seen or node.registered,
                            event=event)
        await self.commit(txn)

    async def node_events(self, node: str, limit: int = 20) -> list[dict[str, Any]]:
        """The node's last ``limit`` state changes, oldest first."""
        assert self.db is not None
        rows = await self.db.execute_fetchall(
            "SELECT time, old_state, state, event, reason FROM node_events WHERE node=? ORDER BY id DESC LIMIT ?",
            (node, limit))
        return [dict(zip(("time", "old_state", "state", "event", "reason"), r)) for r in reversed(list(rows))]

    async def submit_keys(self, since: float) -> list[tuple[int, str, int, int]]:
        """(uid, key, job id or array id, tasks) of the keyed submissions since ``since``."""
        assert self.db is not None
        rows = await self.db.execute_fetchall(
            "SELECT uid, submit_key, COALESCE(array_job_id, job_id), "
            "SUM(CASE WHEN array_job_id IS NULL THEN 0 ELSE 1 END) FROM jobs "
            "WHERE submit_key IS NOT NULL AND submit_time >= ? GROUP BY uid, submit_key", (since,))
        return [(int(u), str(k), int(j), int(n)) for u, k, j, n in rows]

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """``PRAGMA wal_checkpoint(mode)``: (busy, WAL pages, pages checkpointed)."""
        assert self.db is not None and mode in ("PASSIVE", "TRUNCATE")
        async with self.write_lock:
            rows = await self.db.execute_fetchall(f"PRAGMA wal_checkpoint({mode})")
        busy, pages, done = next(iter(rows), (0, 0, 0))
        return int(busy), int(pages), int(done)

    def wal_bytes(self) -> int:
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    @_one_writer
    async def write_many(self, batches: Iterable[tuple[str, list[tuple]]]) -> None:
        """Each (statement, rows) as one executemany, all in one IMMEDIATE transaction: bulk
        writes that touch no job state in memory (telemetry)."""
        batches = [(sql, rows) for sql, rows in batches if rows]

        def work(conn: sqlite3.Connection) -> None:
            for sql, rows in batches:
                conn.executemany(sql, rows)
        await self.transaction(work)

    @_one_writer
    async def save_usage(self, usage: dict[tuple[str, str], float], now: float) -> None:
        rows = [(a, u, v, now) for (a, u), v in usage.items()]
        await self.transaction(lambda conn: conn.executemany(
            "INSERT INTO usage(account, user, value, updated) VALUES (?,?,?,?) "
            "ON CONFLICT(account, user) DO UPDATE SET value=excluded.value, updated=excluded.updated", rows))

    async def load_usage(self) -> tuple[dict[tuple[str, str], float], float | None]:
        assert self.db is not None
        usage: dict[tuple[str, str], float] = {}
        updated: float | None = None
        async with self.db.execute("SELECT account, user, value, updated FROM usage") as cur:
            async for a, u, v, t in cur:
                usage[(a, u)] = v
                updated = t if updated is None else max(updated, t)
        return usage, updated

    async def recent_preemptions(self, since: float) -> list[float]:
        assert self.db is not None    # every pass asks: one trip to the database thread
        rows = await self.db.execute_fetchall("SELECT time FROM preemptions WHERE time >= ?", (since,))
        return [t for (t,) in rows]

    # -- reads ------------------------------------------------------------------------

    async def find_jobs(self, *, job_ids: Iterable[int] | None = None, uids: Iterable[int] | None = None,
                        states: Iterable[str] | None = None, since: float | None = None,
                        limit: int = 100000, arrays: bool = False) -> list[JobRecord]:
        """Jobs from the database, finished ones included (sacct).

        ``arrays``: an id in ``job_ids`` that is an array's id also selects all its tasks."""
        assert self.db is not None
        where, params = [], []
        if job_ids is not None:
            ids = list(job_ids)
            marks = ','.join('?' * len(ids))
            if arrays:
                where.append(f"(job_id IN ({marks}) OR array_job_id IN ({marks}))")
                params += ids + ids
            else:
                where.append(f"job_id IN ({marks})")
                params += ids
        if uids is not None:
            us = list(uids)
            where.append(f"uid IN ({','.join('?' * len(us))})")
            params += us
        if states is not None:
            ss = list(states)
            where.append(f"state IN ({','.join('?' * len(ss))})")
            params += ss
        if since is not None:
            where.append("(end_time IS NULL OR end_time >= ?)")
            params.append(since)
        q = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        q += " ORDER BY job_id LIMIT ?"
        params.append(limit)
        out = []
        async with self.db.execute(q, params) as cur:
            async for row in cur:
                job = _from_row(row, self._cols)
                mem = self.active.get(job.job_id)
                out.append(mem if mem is not None else job)
        return out

    async def job_events(self, job_id: int) -> list[dict[str, Any]]:
        assert self.db is not None
        async with self.db.execute(
            "SELECT time, attempt, event, state, detail FROM job_events WHERE job_id=? ORDER BY id", (job_id,)
        ) as cur:
            return [dict(zip(("time", "attempt", "event", "state", "detail"), r)) for r in await cur.fetchall()]

    def jobs_on_node(self, node: str) -> Iterator[JobRecord]:
        """Active jobs with any part on ``node`` (rank 0 or a later one)."""
        return (j for j in self.active.values() if j.state.active and (
            j.node == node or any(p.get("node") == node for p in j.parts)))
