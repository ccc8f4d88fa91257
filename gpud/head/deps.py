"""Job dependencies: is a pending job's ``--dependency`` met, not yet, or never?

Theory of operation
-------------------
A dependency (``gpud.syntax.Dependency``) is a list of terms joined by ``,`` (all must be
met) or ``?`` (one is enough).  Each term is judged against the facts of its target jobs
(state, start time) and gives one of three verdicts:

``MET``    the job may start as far as this term is concerned;
``WAIT``   not yet: a target is still pending or running (squeue reason ``Dependency``);
``NEVER``  it can never be met: ``afterok`` on a job that failed, ``afternotok`` on one
           that completed (reason ``DependencyNeverSatisfied``; with
           ``--kill-on-invalid-dep=yes`` the head cancels the job instead).

Slurm's meanings: ``after`` once every target started (or was cancelled before it did),
plus ``+MINUTES``; ``afterany`` once every target ended; ``afterok`` once every target
completed with exit 0; ``afternotok`` once every target ended and one of them failed;
``singleton`` once no earlier job of the same user and name is pending or running.  A bare
id that is an array's id means every task of the array; ``12_3`` means one task.

Everything here is pure except ``DependencyBook``, an in-memory cache of the facts of
finished jobs (the head's store keeps only unfinished jobs in memory).  The head feeds it
from its commits and, for targets it has not seen since it started, from the database;
``evaluate`` only ever reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from ..model import JobState
from ..syntax import Dependency, Term

MET = "met"
WAIT = "wait"
NEVER = "never"
REASONS = {WAIT: "Dependency", NEVER: "DependencyNeverSatisfied"}

_FAILED = frozenset(s.value for s in JobState if s.terminal and s is not JobState.COMPLETED)
_TERMINAL = frozenset(s.value for s in JobState if s.terminal)


@dataclass(frozen=True)
class JobFacts:
    """What a dependency needs to know about one target job."""

    job_id: int
    state: str                    # a JobState value
    start_time: float | None
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in _TERMINAL


# (job id, task or None) -> the target jobs, or None when no such job exists
Lookup = Callable[[int, "int | None"], "list[JobFacts] | None"]


def judge_term(term: Term, lookup: Lookup, now: float, singleton_blocked: bool = False) -> str:
    if term.kind == "singleton":
        return WAIT if singleton_blocked else MET
    verdicts = []
    for target in term.targets:
        facts = lookup(target.job_id, target.task)
        if not facts:
            return NEVER  # no such job: nothing will ever satisfy it
        verdicts.append(_judge_target(term.kind, facts, now, target.delay))
    return _all(verdicts)


def _judge_target(kind: str, facts: list[JobFacts], now: float, delay_min: int) -> str:
    if kind == "after":
        for f in facts:
            if f.start_time is None:
                if not f.ended:
                    return WAIT
                continue  # ended without starting (cancelled): counts as started
            if now < f.start_time + delay_min * 60:
                return WAIT
        return MET
    if kind == "afterok":
        if any(f.state in _FAILED for f in facts):
            return NEVER
        return MET if all(f.state == JobState.COMPLETED.value for f in facts) else WAIT
    if not all(f.ended for f in facts):
        return WAIT
    if kind == "afterany":
        return MET
    # afternotok
    return MET if any(f.state in _FAILED for f in facts) else NEVER


def _all(verdicts: Iterable[str]) -> str:
    vs = list(verdicts)
    if NEVER in vs:
        return NEVER
    return MET if all(v == MET for v in vs) else WAIT


def evaluate(dep: Dependency | None, lookup: Lookup, now: float, singleton_blocked: bool = False) -> str:
    """MET, WAIT or NEVER for a whole dependency expression."""
    if dep is None or not dep.terms:
        return MET
    verdicts = [judge_term(t, lookup, now, singleton_blocked) for t in dep.terms]
    if not dep.any:
        return _all(verdicts)
    if MET in verdicts:
        return MET
    return NEVER if all(v == NEVER for v in verdicts) else WAIT


class Named(NamedTuple):
    """A pending or running job, for ``singleton``."""

    job_id: int
    user: str
    name: str
    running: bool


def singleton_blocked(jobs: Iterable[Named], asking: set[int] | None = None) -> set[int]:
    """Ids (among ``asking``, default all) of pending jobs that a running job, or an earlier
    pending one, of the same user and name holds back."""
    running: set[tuple[str, str]] = set()
    first: dict[tuple[str, str], int] = {}
    pending: list[Named] = []
    for j in jobs:
        key = (j.user, j.name)
        if j.running:
            running.add(key)
        else:
            pending.append(j)
            if j.job_id < first.get(key, j.job_id + 1):
                first[key] = j.job_id
    return {j.job_id for j in pending if (asking is None or j.job_id in asking)
            and ((j.user, j.name) in running or first[(j.user, j.name)] != j.job_id)}


def creates_cycle(job_id: int, dep: Dependency | None, depends_on: Callable[[int], Iterable[int]]) -> bool:
    """Whether giving ``job_id`` the dependency ``dep`` would make it wait on itself."""
    if dep is None:
        return False
    seen: set[int] = set()
    todo = list(dep.job_ids())
    while todo:
        j = todo.pop()
        if j == job_id:
            return True
        if j in seen:
            continue
        seen.add(j)
        todo.extend(depends_on(j))
    return False


class DependencyBook:
    """Facts of finished jobs that some dependency may ask about (memory only).

    ``record`` every job that ends; ``load`` what the database says about targets the book
    has not seen; ``retain`` the referenced ids after each pass so the book stays small.
    Unfinished jobs are never kept here: the caller looks them up in the store first.
    """

    def __init__(self) -> None:
        self.ended: dict[int, JobFacts] = {}
        self.tasks: dict[int, set[int]] = {}   # array id -> ids of its ended tasks
        self.known: set[int] = set()           # ids whose facts were complete when loaded

    def record(self, f: JobFacts) -> None:
        if not f.ended:
            return
        self.ended[f.job_id] = f
        if f.array_job_id is not None:
            self.tasks.setdefault(f.array_job_id, set()).add(f.job_id)

    def load(self, ref: int, facts: Iterable[JobFacts]) -> None:
        for f in facts:
            self.record(f)
        self.known.add(ref)

    def ended_targets(self, job_id: int, task: int | None) -> list[JobFacts]:
        if task is None:
            out = [self.ended[j] for j in sorted(self.tasks.get(job_id, ())) if j in self.ended]
            own = self.ended.get(job_id)
            if own is not None and own.array_job_id is None:
                out.append(own)
            return out
        return [self.ended[j] for j in self.tasks.get(job_id, ())
                if j in self.ended and self.ended[j].array_task_id == task]

    def retain(self, refs: set[int]) -> None:
        keep = {j for r in refs for j in self.tasks.get(r, ())} | refs
        self.ended = {j: f for j, f in self.ended.items() if j in keep}
        self.tasks = {a: {j for j in ids if j in keep} for a, ids in self.tasks.items() if a in refs}
        self.known &= refs
