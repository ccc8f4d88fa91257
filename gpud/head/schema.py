"""The head database's schema, as numbered migrations (gpud.head.store runs them).

``PRAGMA user_version`` records how many have run; a database newer than this list is
refused.  A migration is only ever appended, never edited: a database of any earlier
version upgrades by running the rest in order, each in its own transaction.  A migration's
statements are split at ``;``, so none may hold one in a literal.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the first schema
    """
    CREATE TABLE jobs (
        job_id        INTEGER PRIMARY KEY AUTOINCREMENT,
        name          TEXT NOT NULL,
        user          TEXT NOT NULL,
        uid           INTEGER NOT NULL,
        gid           INTEGER NOT NULL,
        account       TEXT NOT NULL,
        partition     TEXT NOT NULL,
        qos           TEXT NOT NULL,
        state         TEXT NOT NULL,
        reason        TEXT,
        spec          TEXT NOT NULL,
        gpus          INTEGER NOT NULL,
        cpus          INTEGER NOT NULL,
        mem_mb        INTEGER NOT NULL,
        time_limit    REAL,
        submit_time   REAL NOT NULL,
        start_time    REAL,
        end_time      REAL,
        exit_code     INTEGER,
        signal        INTEGER,
        node          TEXT,
        gpu_indices   TEXT NOT NULL DEFAULT '[]',
        gpu_uuids     TEXT NOT NULL DEFAULT '[]',
        attempt       INTEGER NOT NULL DEFAULT 0,
        requeue_count INTEGER NOT NULL DEFAULT 0,
        preempt_count INTEGER NOT NULL DEFAULT 0,
        borrowed      INTEGER NOT NULL DEFAULT 0,
        launched_at   REAL,
        stop_reason   TEXT,
        stop_time     REAL
    );
    CREATE INDEX jobs_by_state ON jobs(state, job_id);
    CREATE INDEX jobs_by_user ON jobs(uid, job_id);
    CREATE INDEX jobs_by_end ON jobs(end_time);
    CREATE TABLE allocations (
        job_id      INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        node        TEXT NOT NULL,
        gpu_indices TEXT NOT NULL,
        gpu_uuids   TEXT NOT NULL,
        cpus        INTEGER NOT NULL,
        mem_mb      INTEGER NOT NULL,
        start_time  REAL NOT NULL,
        end_time    REAL,
        outcome     TEXT,
        PRIMARY KEY (job_id, attempt)
    );
    CREATE TABLE job_events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id  INTEGER NOT NULL,
        time    REAL NOT NULL,
        attempt INTEGER NOT NULL,
        event   TEXT NOT NULL,
        state   TEXT NOT NULL,
        detail  TEXT
    );
    CREATE INDEX job_events_by_job ON job_events(job_id, id);
    CREATE TABLE nodes (
        name       TEXT PRIMARY KEY,
        info       TEXT NOT NULL,
        state      TEXT NOT NULL,
        reason     TEXT,
        last_seen  REAL,
        registered REAL NOT NULL
    );
    CREATE TABLE usage (
        account TEXT NOT NULL,
        user    TEXT NOT NULL,
        value   REAL NOT NULL,
        updated REAL NOT NULL,
        PRIMARY KEY (account, user)
    );
    CREATE TABLE preemptions (time REAL NOT NULL);
    """,
    # 2: GPU telemetry (gpud/head/telemetry.py): per-job aggregates, a bounded per-node series
    """
    ALTER TABLE jobs ADD COLUMN gpu_util_mean REAL;
    ALTER TABLE jobs ADD COLUMN gpu_util_max REAL;
    ALTER TABLE jobs ADD COLUMN gpu_mem_max_mb INTEGER;
    ALTER TABLE jobs ADD COLUMN energy_j REAL;
    CREATE TABLE job_telemetry (
        job_id       INTEGER PRIMARY KEY,
        sampled_s    REAL NOT NULL DEFAULT 0,
        gpu_s        REAL NOT NULL DEFAULT 0,
        util_gpu_s   REAL NOT NULL DEFAULT 0,
        idle_gpu_s   REAL NOT NULL DEFAULT 0,
        util_max     REAL,
        mem_max_mb   INTEGER,
        energy_j     REAL NOT NULL DEFAULT 0,
        last_sample  REAL
    );
    CREATE TABLE node_series (
        node        TEXT NOT NULL,
        t           REAL NOT NULL,
        gpus        INTEGER NOT NULL,
        gpus_alloc  INTEGER NOT NULL,
        util_mean   REAL,
        util_max    REAL,
        mem_used_mb REAL,
        power_w     REAL,
        temp_max    REAL,
        samples     INTEGER NOT NULL,
        PRIMARY KEY (node, t)
    );
    CREATE INDEX node_series_by_time ON node_series(t);
    CREATE INDEX allocations_by_end ON allocations(end_time);
    """,
    # 3: Slurm compatibility (slurm.py, arrays.py, deps.py, cron.py): array tasks,
    # dependencies, begin times, holds, and scrontab entries with the last slot each fired
    """
    ALTER TABLE jobs ADD COLUMN array_job_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_task_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_throttle INTEGER;
    ALTER TABLE jobs ADD COLUMN dependency TEXT;
    ALTER TABLE jobs ADD COLUMN begin_time REAL;
    ALTER TABLE jobs ADD COLUMN deadline REAL;
    ALTER TABLE jobs ADD COLUMN hold_kind TEXT;
    ALTER TABLE jobs ADD COLUMN cron_entry INTEGER;
    CREATE INDEX jobs_by_array ON jobs(array_job_id, array_task_id);
    CREATE TABLE scrontabs (
        uid     INTEGER PRIMARY KEY,
        user    TEXT NOT NULL,
        text    TEXT NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE cron_entries (
        entry_id    INTEGER PRIMARY KEY AUTOINCREMENT,
        uid         INTEGER NOT NULL,
        gid         INTEGER NOT NULL,
        user        TEXT NOT NULL,
        line        INTEGER NOT NULL,
        schedule    TEXT NOT NULL,
        spec        TEXT NOT NULL,
        last_slot   INTEGER NOT NULL,
        last_job_id INTEGER,
        created     REAL NOT NULL
    );
    CREATE INDEX cron_entries_by_uid ON cron_entries(uid);
    """,
    # 4: GPU sharing (gpusharing.py): the devices an allocation holds (whole GPUs, MIG
    # slices, MPS shares, time-slice replicas)
    """
    ALTER TABLE jobs ADD COLUMN devices TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE allocations ADD COLUMN devices TEXT;
    """,
    # 5: multi-node (gang) jobs (gang.py): the nodes after the first, in rank order, as
    # [{node, gpu_indices, gpu_uuids, cpus, mem_mb}]
    """
    ALTER TABLE jobs ADD COLUMN parts TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE allocations ADD COLUMN parts TEXT;
    """,
    # 6: accounting from the job's cgroup (gpud.worker.cgroups): peak memory in bytes and
    # CPU time in seconds, sampled while it runs and final at its end (sacct MaxRSS, TotalCPU)
    """
    ALTER TABLE jobs ADD COLUMN max_rss INTEGER;
    ALTER TABLE jobs ADD COLUMN total_cpu REAL;
    """,
    # 7: node state history (Txn.node_transition: one row per change, with its reason) and
    # the key a client gives a submission, so that a repeat returns the same job
    """
    CREATE TABLE node_events (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        node      TEXT NOT NULL,
        time      REAL NOT NULL,
        old_state TEXT,
        state     TEXT NOT NULL,
        event     TEXT NOT NULL,
        reason    TEXT
    );
    CREATE INDEX node_events_by_node ON node_events(node, id);
    ALTER TABLE jobs ADD COLUMN submit_key TEXT;
    CREATE INDEX jobs_by_submit_key ON jobs(submit_key) WHERE submit_key IS NOT NULL;
    """,
]
