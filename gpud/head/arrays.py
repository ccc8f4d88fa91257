"""Job arrays: one submission, many tasks; each task is an ordinary job row.

Theory of operation
-------------------
``sbatch --array=0-99%10`` becomes 100 job rows inserted in one transaction.  They share
``array_job_id``, which is the job id of the first task (as in Slurm, where the array's id
is its first task's), and each has its own ``array_task_id``; ``expand`` builds the rows
with a placeholder id that ``Store.insert_jobs`` resolves.  Everything the head does to a
job (scheduling, requeue, fencing, accounting) works on tasks unchanged.

Names: ``123_4`` is task 4 of array 123; a bare ``123`` that is an array's id means every
task of it (``scancel 123`` cancels the whole array), as in Slurm.  ``select`` resolves
such references against the unfinished jobs (``ArrayIndex``).

Throttle (``%10``): ``throttled`` lets at most that many tasks of an array be running at
once, counting the ones already running and admitting the lowest pending task ids first;
the rest wait with reason ``JobArrayTaskLimit``.  It runs before every pass, so one pass
never starts more tasks than the throttle allows.

Pure functions over ``JobRecord``s; no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Iterable

from ..model import JobState
from ..syntax import ArraySpec, format_indices, parse_array
from .store import JobRecord

THROTTLE_REASON = "JobArrayTaskLimit"
# Store.insert_jobs replaces a negative array id with its first task's job id; each
# submission gets its own, so two arrays in one group commit stay apart.
_placeholders = itertools.count(1)


def expand(job: JobRecord, spec: ArraySpec) -> list[JobRecord]:
    """The task rows for an array submission whose template is ``job``."""
    placeholder = -next(_placeholders)
    return [replace(job, array_job_id=placeholder, array_task_id=task, array_throttle=spec.throttle)
            for task in spec.tasks]


def array_summary(job: JobRecord) -> str | None:
    """``123_[0-99%10]``: the array a task belongs to, as squeue writes it."""
    if job.array_job_id is None or not job.spec.array:
        return None
    spec = parse_array(job.spec.array)
    text = format_indices(spec.tasks) + (f"%{job.array_throttle}" if job.array_throttle else "")
    return f"{job.array_job_id}_[{text}]"


class ArrayIndex:
    """Unfinished jobs by id and by array, to resolve ``123`` and ``123_4`` quickly.

    ``jobs`` is read at the first look-up, not before: every pass makes an index and most
    passes look nothing up (no pending job has a dependency); at 100,000 jobs building it
    took a tenth of a second."""

    def __init__(self, jobs: Iterable[JobRecord]) -> None:
        self._jobs: Iterable[JobRecord] | None = jobs
        self._by_id: dict[int, JobRecord] = {}
        self._by_array: dict[int, list[JobRecord]] = {}

    def _build(self) -> None:
        if self._jobs is None:
            return
        by_id, by_array = self._by_id, self._by_array
        for j in self._jobs:
            by_id[j.job_id] = j
            if j.array_job_id is not None:
                by_array.setdefault(j.array_job_id, []).append(j)
        self._jobs = None

    @property
    def by_id(self) -> dict[int, JobRecord]:
        self._build()
        return self._by_id

    @property
    def by_array(self) -> dict[int, list[JobRecord]]:
        self._build()
        return self._by_array

    def select(self, job_id: int, task: int | None) -> list[JobRecord]:
        """The job ``job_id`` (every task when it is an array's id), or task ``task`` of it."""
        tasks = self.by_array.get(job_id, [])
        if task is not None:
            return [j for j in tasks if j.array_task_id == task]
        if tasks:
            return sorted(tasks, key=lambda j: j.job_id)
        own = self.by_id.get(job_id)
        return [own] if own is not None else []


def throttled(jobs: Iterable[JobRecord], blocked: set[int] | dict[int, str]) -> set[int]:
    """Pending tasks that must wait because their array already runs its limit.

    ``blocked``: pending jobs that cannot start for another reason; they use no slot.
    """
    running: dict[int, int] = {}
    waiting: dict[int, list[JobRecord]] = {}
    limits: dict[int, int] = {}
    # Most jobs are in no throttled array: a comprehension passes over them cheaply.
    for j in [j for j in jobs if j.array_throttle and j.array_job_id is not None]:
        limits[j.array_job_id] = j.array_throttle
        if j.state.active:
            running[j.array_job_id] = running.get(j.array_job_id, 0) + 1
        elif j.state is JobState.PENDING and j.job_id not in blocked:
            waiting.setdefault(j.array_job_id, []).append(j)
    out: set[int] = set()
    for array_id, tasks in waiting.items():
        room = max(0, limits[array_id] - running.get(array_id, 0))
        tasks.sort(key=lambda j: (j.array_task_id or 0, j.job_id))
        out.update(j.job_id for j in tasks[room:])
    return out


def task_env_fields(job: JobRecord) -> dict[str, int]:
    """Array facts a task's environment carries (GPUD_ARRAY_* / SLURM_ARRAY_*)."""
    if job.array_job_id is None or job.array_task_id is None or not job.spec.array:
        return {}
    tasks = parse_array(job.spec.array).tasks
    steps = {b - a for a, b in zip(tasks, tasks[1:])}
    return {"array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "array_task_count": len(tasks), "array_task_min": tasks[0], "array_task_max": tasks[-1],
            "array_task_step": steps.pop() if len(steps) == 1 else 1}
