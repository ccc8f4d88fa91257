"""The head's Slurm-compatibility state and the Slurm side of submission.

Theory of operation
-------------------
``SlurmSupport`` is the head's part ``head.slurm``; it owns what these features need between
requests and is given the store, the scrontab part and getters, not the head:

* ``before_pass(now)`` runs under the head's lock before every scheduler pass.  It returns
  why pending jobs may not start (held, dependency, begin time, array throttle), which
  ``build_snapshot`` hands to the core as ``blocked_reason``; and it does what Slurm does
  on its own: cancel a job whose dependency can never be met when it asked for
  ``--kill-on-invalid-dep=yes``, cancel a pending job that can no longer end before its
  ``--deadline``, and stop a running job whose time limit was lowered below its run time.
* ``on_commit`` (a store listener) records the facts of jobs as they end, for
  dependencies (``deps.DependencyBook``), and sends ``--mail-type`` notices through
  ``[head] mail_command`` (``mail``).
* ``launch_fields(job)`` adds array and Slurm-environment facts to launch messages.
* ``run()`` is the head's task for scrontab (``cron.Cron``).

``submit`` is ``op_submit``'s second half: it checks dependencies and times, answers
``--test-only`` from a trial pass of the core, expands arrays (``arrays.expand``) into one
group commit, and makes ``--skip-if-active`` atomic by checking and inserting under the
head's lock.

The submit path (``submit``, ``test_only``) and ``is_admin`` take the head, as the socket
verbs that call them do; ``resolve`` and ``missing_targets``, which the verbs share, take
only the store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..model import JobState, StopReason
from ..syntax import Dependency, SyntaxProblem, parse_array, parse_dependency
from . import arrays, deps, mail
from ..ctlsocket import Caller, RequestError
from .cron import Cron
from .jobcaps import SubmitCaps
from .scheduling import build_snapshot, run_core
from .store import JobRecord, Txn

if TYPE_CHECKING:
    from ..config import Config
    from .daemon import Head
    from .store import Store

log = logging.getLogger("gpud.head")


HELD_REASONS = {"user": "JobHeldUser", "admin": "JobHeldAdmin"}
TIME_LIMIT_SLACK = 5.0      # s: the worker enforces the limit it was launched with; the head
                            # steps in only after this, for limits lowered since the launch
TRIAL_JOB_ID = 2**62        # the pretend job of --test-only
MAX_REFS = 100_000


def is_admin(head: "Head", caller: Caller) -> bool:
    from .ops_jobs import is_admin as admin_check  # one definition of who is an admin

    return admin_check(head, caller)


@functools.lru_cache(maxsize=4096)
def dependency_of(text: str) -> Dependency | None:
    return parse_dependency(text)


@functools.lru_cache(maxsize=4096)
def targets_of(text: str) -> frozenset[int]:
    dep = dependency_of(text)
    return frozenset(dep.job_ids()) if dep else frozenset()


def parse_refs(args: dict) -> list[tuple[int, int | None]]:
    """``job_ids`` and ``array_tasks`` of a request as (id, task or None) pairs."""
    refs: list[tuple[int, int | None]] = []
    ids = args.get("job_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise RequestError("job_ids must be a list of integers")
        refs += [(x, None) for x in ids]
    tasks = args.get("array_tasks")
    if tasks is not None:
        if not isinstance(tasks, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
                for p in tasks):
            raise RequestError("array_tasks must be a list of [array id, task id] pairs")
        refs += [(a, t) for a, t in tasks]
    if len(refs) > MAX_REFS:
        raise RequestError(f"at most {MAX_REFS} job ids per request")
    return refs


def ref_text(job_id: int, task: int | None) -> str:
    return str(job_id) if task is None else f"{job_id}_{task}"


async def resolve(store: "Store", refs: list[tuple[int, int | None]]) -> tuple[list[JobRecord], list[str]]:
    """Unfinished jobs named by ``refs``, and one error line per name that has none."""
    index = arrays.ArrayIndex(store.active.values())
    found: dict[int, JobRecord] = {}
    errors = []
    for job_id, task in refs:
        jobs = index.select(job_id, task)
        if jobs:
            found.update((j.job_id, j) for j in jobs)
            continue
        done = await store.find_jobs(job_ids=[job_id], arrays=True)
        exists = any(task is None or (j.array_job_id == job_id and j.array_task_id == task) for j in done)
        errors.append(f"job {ref_text(job_id, task)}: "
                      + ("Job/step already completing or completed" if exists else "Invalid job id specified"))
    return sorted(found.values(), key=lambda j: j.job_id), errors


def parse_or_refuse(text: str) -> Dependency | None:
    try:
        return parse_dependency(text)
    except SyntaxProblem as e:
        raise RequestError(str(e)) from None


async def missing_targets(store: "Store", dep: Dependency | None) -> list[str]:
    """Targets of ``dep`` that name no job at all (Slurm refuses those at submit)."""
    if dep is None:
        return []
    index = arrays.ArrayIndex(store.active.values())
    wanted = [(t.job_id, t.task) for term in dep.terms for t in term.targets]
    unknown = [(j, t) for j, t in wanted if not index.select(j, t)]
    if not unknown:
        return []
    rows = await store.find_jobs(job_ids=sorted({j for j, _ in unknown}), arrays=True)
    missing = []
    for job_id, task in unknown:
        if not any((task is None and (r.job_id == job_id or r.array_job_id == job_id))
                   or (r.array_job_id == job_id and r.array_task_id == task) for r in rows):
            missing.append(ref_text(job_id, task))
    return missing


def resolve_gpu_type(requested: str | None, models: set[str] | frozenset[str]) -> str:
    """Slurm's short GPU names to this cluster's models: ``h100`` -> ``H100-80GB`` when that is
    the one model it can mean; RequestError when it could mean several."""
    if requested is None or requested in models or not models:
        return requested  # type: ignore[return-value]
    low = requested.lower()
    same = [m for m in models if m.lower() == low]
    if len(same) == 1:
        return same[0]
    prefixed = sorted(m for m in models if m.lower().startswith(low) and m[len(low):][:1] in ("-", "_", " "))
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        raise RequestError(f"Batch job submission failed: GPU type {requested!r} could mean "
                           f"{', '.join(prefixed)}; name one of them")
    return requested


async def submit(head: "Head", caller: Caller, job: JobRecord) -> dict[str, Any]:
    """Insert ``job`` (or its array's tasks), honouring the Slurm options of its spec.
    ``job`` carries its spec's dependency, begin time, deadline and hold already (op_submit)."""
    spec = job.spec
    now = job.submit_time
    warnings = []
    if spec.deadline is not None and (spec.deadline <= now or (spec.begin_time or 0) >= spec.deadline):
        raise RequestError("Batch job submission failed: Incompatible begin and deadline time specification "
                           "(the deadline must lie after now and after --begin)")
    if spec.dependency:
        missing = await missing_targets(head.store, parse_or_refuse(spec.dependency))
        if missing:
            raise RequestError(f"Batch job submission failed: Job dependency problem: no job {missing[0]}")
    if spec.mail_type and not getattr(head.cfg.head, "mail_command", None):
        warnings.append("--mail-type: this cluster sends no mail (no [head] mail_command); no notifications")
    if spec.test_only:
        return await test_only(head, job, warnings)
    jobs = arrays.expand(job, parse_array(spec.array)) if spec.array else [job]
    if spec.skip_if_active:
        async with head.lock:
            same = [j for j in head.store.active.values() if j.uid == job.uid and j.name == job.name]
            if same:
                first = min(same, key=lambda j: j.job_id)
                return {"job_id": first.array_job_id or first.job_id, "skipped": True,
                        "display_id": str(first.array_job_id or first.job_id), "warnings": warnings}
            refusal = SubmitCaps(head.store.active, head.cfg).admit(jobs)
            if refusal is not None:
                raise RequestError(refusal)
            saved = await head.store.insert_jobs(jobs, now)
        head.kick()
    else:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        await head.submissions.put((jobs, fut))
        saved = await fut
    first = saved[0]
    job_id = first.array_job_id if first.array_job_id is not None else first.job_id
    if log.isEnabledFor(logging.DEBUG):   # Store.insert_jobs logs one info line per group commit
        log.debug("job %d submitted by %s (uid %d): %s gpus=%d%s", job_id, caller.user, caller.uid, first.name,
                  first.gpus, f" array of {len(saved)}" if len(saved) > 1 or spec.array else "")
    return {"job_id": job_id, "tasks": len(saved) if spec.array else 0, "warnings": warnings}


async def test_only(head: "Head", job: JobRecord, warnings: list[str]) -> dict[str, Any]:
    """When and where ``job`` would start if submitted now; nothing is inserted."""
    from ..sched.snapshot import PendingJob

    trial = replace(job, job_id=TRIAL_JOB_ID, array_job_id=None, array_task_id=None)
    async with head.lock:
        now = head.clock()
        support: SlurmSupport = head.slurm
        await support.load_targets([trial])
        blocked = support.blocked_reasons(now, extra=[trial])
        ledger = getattr(head, "usage", None)   # fair-share usage as of the last pass
        snap = build_snapshot(head.store, head.cfg.sched, dict(getattr(ledger, "usage", None) or {}), (), blocked)
        pending = PendingJob(
            job_id=TRIAL_JOB_ID, user=job.user, account=job.account, partition=job.partition, qos=job.qos,
            gpus=job.gpus, cpus=job.cpus, mem_mb=job.mem_mb, time_limit=job.time_limit,
            submit_time=now, gpu_type=job.spec.gpu_type, nice=job.spec.nice, held=job.spec.hold,
            blocked_reason=blocked.get(TRIAL_JOB_ID))
        plan = run_core(replace(snap, pending=snap.pending + (pending,)), now)
    out: dict[str, Any] = {"test_only": True, "partition": job.partition, "cpus": job.cpus, "gpus": job.gpus,
                           "warnings": warnings, "start_time": None, "node": None,
                           "reason": plan.reasons.get(TRIAL_JOB_ID)}
    start = next((s for s in plan.starts if s.job_id == TRIAL_JOB_ID), None)
    if start is not None:
        out.update(start_time=now, node=start.node, reason=None)
    elif TRIAL_JOB_ID in plan.expected_starts:
        out.update(start_time=plan.expected_starts[TRIAL_JOB_ID], node=plan.reserved_nodes.get(TRIAL_JOB_ID))
    elif out["reason"] == "BeginTime" and job.begin_time is not None:
        out.update(start_time=job.begin_time)
    return out


# -- the head's per-process state -------------------------------------------------------------------

class SlurmSupport:
    """Holds, dependencies, deadlines, lowered time limits, launch fields, mail and scrontab's
    task.  Given the store, the scrontab part (``cron``), and getters read at call time: the
    live config, how long a job's allocation has run (``ran_for``, the head's monotonic
    clock) and the commands' ``send_signal`` (built after this part)."""

    def __init__(self, store: "Store", cron: Cron, *, config: Callable[[], "Config"],
                 ran_for: Callable[[JobRecord], float], send_signal: Callable[..., Awaitable[None]]) -> None:
        self.store = store
        self.cron = cron
        self._config = config              # the live config: a reload swaps it
        self._ran_for = ran_for
        self._send_signal = send_signal
        self.book = deps.DependencyBook()
        self._mail_tasks: set[asyncio.Task] = set()
        store.on_commit.append(self.on_commit)

    async def run(self) -> None:
        """The head's task for these features: scrontab's clock."""
        await self.cron.run()

    # -- eligibility ----------------------------------------------------------------------------
    def _lookup(self, index: arrays.ArrayIndex):
        book = self.book
        seen: dict[tuple[int, int | None], list[deps.JobFacts] | None] = {}   # one pass: facts stand still

        def lookup(job_id: int, task: int | None) -> list[deps.JobFacts] | None:
            key = (job_id, task)
            if key in seen:
                return seen[key]
            live = [_facts(j) for j in index.select(job_id, task)]
            if task is None and live and all(j.array_job_id is None for j in live):
                seen[key] = live  # a plain job that has not ended
                return live
            facts = {f.job_id: f for f in book.ended_targets(job_id, task)}
            facts.update((f.job_id, f) for f in live)
            seen[key] = sorted(facts.values(), key=lambda f: f.job_id) or None
            return seen[key]
        return lookup

    def _refs(self, jobs) -> set[int]:
        refs: set[int] = set()
        for text in {j.dependency for j in jobs if j.dependency and j.state is JobState.PENDING}:
            refs |= targets_of(text)
        return refs

    async def load_targets(self, extra: list[JobRecord] = (), judged: list[JobRecord] | None = None) -> set[int]:
        """Read from the database what the book lacks about dependency targets.
        ``judged``: the active jobs ``_to_judge`` picked (default: every active job)."""
        store = self.store
        refs = self._refs((list(store.active.values()) if judged is None else judged) + list(extra))
        missing = sorted(r for r in refs if r not in self.book.known
                         and (r not in store.active or store.active[r].array_job_id is not None))
        if missing:
            rows = await store.find_jobs(job_ids=missing, arrays=True)
            for row in rows:
                if row.job_id not in store.active:
                    self.book.record(_facts(row))
            for r in missing:
                self.book.known.add(r)
        return refs

    def blocked_reasons(self, now: float, extra: list[JobRecord] = (),
                        judged: list[JobRecord] | None = None) -> dict[int, str]:
        """Why each pending job may not start now (absent: it may).  ``judged``: the active
        jobs ``_to_judge`` picked, when the caller has them (then ``extra`` must be empty)."""
        active = list(self.store.active.values()) + list(extra)
        index = arrays.ArrayIndex(active)
        lookup = self._lookup(index)
        pending = _to_judge(active)[0] if judged is None else judged
        singles = self._singleton_blocked(active, pending)
        verdicts: dict[tuple[str, bool], str] = {}    # many jobs share one dependency text
        out: dict[int, str] = {}
        for j in pending:
            if j.hold_kind or j.spec.hold:
                out[j.job_id] = HELD_REASONS[j.hold_kind or "user"]
                continue
            if j.dependency:
                key = (j.dependency, j.job_id in singles)
                verdict = verdicts.get(key)
                if verdict is None:
                    verdict = verdicts[key] = deps.evaluate(dependency_of(j.dependency), lookup, now, key[1])
                if verdict != deps.MET:
                    out[j.job_id] = deps.REASONS[verdict]
                    continue
            if j.begin_time is not None and now < j.begin_time:
                out[j.job_id] = "BeginTime"
        for job_id in arrays.throttled(active, out):
            out[job_id] = arrays.THROTTLE_REASON
        return out

    def _singleton_blocked(self, active: list[JobRecord], pending: list[JobRecord]) -> set[int]:
        singles = [j for j in pending if j.dependency and "singleton" in j.dependency]
        if not singles:
            return set()
        keys = {(j.user, j.name) for j in singles}
        return deps.singleton_blocked((deps.Named(j.job_id, j.user, j.name, j.state.active)
                                       for j in active if (j.user, j.name) in keys),
                                      {j.job_id for j in singles})

    async def before_pass(self, now: float) -> dict[int, str]:
        """Called under the head's lock before each pass: blocked reasons, and Slurm's own moves."""
        pending, timed = _to_judge(self.store.active.values())
        refs = await self.load_targets(judged=pending)
        blocked = self.blocked_reasons(now, judged=pending)
        txn = Txn(self.store)
        stops = []
        for j in pending:
            if blocked.get(j.job_id) == "DependencyNeverSatisfied" and j.spec.kill_on_invalid_dep:
                txn.transition(j, JobState.CANCELLED, now=now, event="cancelled",
                               detail="dependency can never be satisfied", end_time=now,
                               reason="DependencyNeverSatisfied")
            elif j.deadline is not None and (now >= j.deadline or (
                    j.time_limit is not None and now + j.time_limit > j.deadline)):
                txn.transition(j, JobState.CANCELLED, now=now, event="cancelled",
                               detail="cannot end before its deadline", end_time=now, reason="DeadLine")
        for j in timed:
            # on the monotonic clock: a step of the wall clock stops no job
            if (j.start_time is not None and j.stop_reason is None
                    and self._ran_for(j) >= j.time_limit + TIME_LIMIT_SLACK):
                stops.append(txn.transition(j, JobState.COMPLETING, now=now, event="timeout",
                                            detail="time limit reached (lowered after launch)",
                                            stop_reason=StopReason.TIMEOUT.value, stop_time=now))
        await self.store.commit(txn)
        for j in stops:
            await self._send_signal(j, "TERM", grace=self._config().head.kill_grace, reason="timeout")
        self.book.retain(refs)
        return {k: v for k, v in blocked.items() if k in self.store.active}

    def launch_fields(self, job: JobRecord) -> dict[str, Any]:
        """Launch-message fields for the job's environment and output files."""
        cfg = self._config()
        fields: dict[str, Any] = dict(arrays.task_env_fields(job))
        fields.update({"open_mode": job.spec.open_mode,
                       "slurm_compat_env": bool(getattr(cfg.head, "slurm_compat_env", False)),
                       "partition": job.partition, "account": job.account, "qos": job.qos,
                       "cluster": cfg.cluster, "restart_count": job.requeue_count})
        if job.spec.signal:   # --signal=[B:]SIG[@TIME], Slurm's 60 s when no TIME was given
            fields.update({"warn_signal": job.spec.signal, "warn_batch": job.spec.signal_batch,
                           "warn_time": 60 if job.spec.signal_time is None else job.spec.signal_time})
        return fields

    # -- commits: dependency facts and mail -----------------------------------------------------
    def on_commit(self, txn: Txn) -> None:
        for before, after, event, _now in txn.moves:
            if after.state.terminal:
                self.book.record(_facts(after))
            if after.spec.mail_type and getattr(self._config().head, "mail_command", None):
                what = mail.mail_event(before.state, after.state, after.spec.mail_type, after.array_job_id is not None)
                if what:
                    self._send_mail(after, what)

    def _send_mail(self, job: JobRecord, what: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._mail(job, what))
        except RuntimeError:
            return
        self._mail_tasks.add(task)
        task.add_done_callback(self._mail_tasks.discard)

    async def _mail(self, job: JobRecord, what: str) -> None:
        subject = f"gpud Job_id={job.display_id} Name={job.name} {what}"
        if job.state.terminal:
            subject += f", {job.state.value}, ExitCode {job.exit_code if job.exit_code is not None else 0}"
        await mail.send(self._config().head.mail_command, subject, job.spec.mail_user or job.user,
                        job.display_id)


def _to_judge(jobs) -> tuple[list[JobRecord], list[JobRecord]]:
    """One walk over active jobs: the pending ones with something to judge before a pass (a
    hold, a dependency, a begin time, a deadline) and the running ones with a time limit.
    Most pending jobs have none of these, and a pass over 100,000 of them walked them all
    four times."""
    pending, timed = [], []
    PENDING, RUNNING = JobState.PENDING, JobState.RUNNING
    for j in jobs:
        state = j.state
        if state is PENDING:
            if (j.dependency or j.hold_kind or j.begin_time is not None or j.deadline is not None
                    or j.spec.hold):
                pending.append(j)
        elif state is RUNNING and j.time_limit is not None:
            timed.append(j)
    return pending, timed


def _facts(j: JobRecord) -> deps.JobFacts:
    return deps.JobFacts(j.job_id, j.state.value, j.start_time, j.array_job_id, j.array_task_id)
