"""Worker reports of job starts and ends, applied by the head as group commits.

Theory of operation
-------------------
Workers report ``started`` when a job's wrapper runs and ``finished`` (repeated until the
head acks it) when it ended.  The head's bus loop hands over every run of such reports
that waited together, decoded (``gpud.bus.messages``); ``WorkerReports.apply`` turns those that still
match an active allocation into one transaction (the allocation's outcome, the job's new
state, its event log lines), commits it, and only then acks them, one ack per node.  A burst
of job ends thus costs one fsync and one scheduler kick instead of one each.  Stale and
repeated reports are acked and change nothing.  Reports of gang jobs go one by one after
the batch (``_gang_finished``): a part's end can end the job and kill its other parts.

It is given the store (read; writes go through the head's change door, ``change``), the
commands (a gang job's other parts are killed) and the steps' ``job_ended``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..bus.base import node_cmd
from ..bus.messages import Ack, Finished, Started
from ..model import JobState
from ..protocol import is_int
from . import gang
from .jobs import final_state, requeue_changes
from .store import JobRecord, Txn

if TYPE_CHECKING:
    from .change import Change
    from .commands import WorkerCommands
    from .store import Store

log = logging.getLogger("gpud.head")

MAX_REASON = 64                 # characters of a worker's end reason kept ("exited", "timeout"...)
MAX_STATUS = 2 ** 31 - 1        # larger exit codes or signals in a report are not real ones


class WorkerReports:
    def __init__(self, store: "Store", commands: "WorkerCommands", *, change: Callable[[], "Change"],
                 job_ended: Callable[[int], Any]) -> None:
        self.store = store
        self.commands = commands
        self._change = change            # the head's change door (head/change.py)
        self._job_ended = job_ended      # an ended job's srun steps end (Steps.job_ended)

    async def apply(self, reports: Sequence[tuple[str, Started | Finished]]) -> None:
        """``started`` and ``finished`` reports (node, report), in order, as one group
        commit: every state change is durable before its ack goes out, and a burst of ends
        costs one fsync and one scheduler kick instead of one each.  Reports of gang jobs go
        one by one (``_gang_finished``): they end or kill other parts."""
        if not reports:
            return
        acks: dict[str, list[tuple[int, int]]] = {}
        gang_reports: list[tuple[str, Finished]] = []
        reported: list[int] = []
        async with self._change() as ch:
            end, txn = ch.now, ch.txn
            done: set[tuple[int, int]] = set()
            for node, report in reports:
                jid, attempt = report.job, report.attempt
                job = self.store.active.get(jid)
                if isinstance(report, Started):
                    # a stale attempt, or a part after rank 0 (only rank 0's start is logged)
                    if job is not None and job.attempt == attempt and job.node == node:
                        txn.event(job, end, "started", f"pid {report.pid}")
                    continue
                if job is not None and job.parts:
                    gang_reports.append((node, report))
                    continue
                acks.setdefault(node, []).append((jid, attempt))
                if job is None:
                    continue
                reported.append(jid)
                if job.attempt != attempt or job.node != node or not job.state.active or (jid, attempt) in done:
                    continue
                done.add((jid, attempt))
                new, detail = self._end_in(txn, job, report, end)
                ch.ended(job, end)
                ch.then(log.info, "job %d (user %s) on %s ended %s: %s", jid, job.user, node, new.value, detail)
                ch.wake()
            for node, pairs in acks.items():
                ch.tell(node_cmd(node), Ack(tuple(pairs)))
            ch.then(self._steps_ended, reported)
        for node, report in gang_reports:
            await self._gang_finished(node, report)

    def _steps_ended(self, job_ids: list[int]) -> None:
        """Tell the steps of every job in ``job_ids`` that has ended (or is no longer known)."""
        for jid in dict.fromkeys(job_ids):
            now_job = self.store.active.get(jid)
            if now_job is None or not now_job.state.active:
                self._job_ended(jid)

    def _end_in(self, txn: Txn, job: JobRecord, report: Finished, end: float) -> tuple[JobState, str]:
        """A single-node job's end, added to ``txn``: its new state and the event's detail."""
        jid, attempt = job.job_id, job.attempt
        reason, exit_code, sig = _outcome(report)
        new = final_state(job, reason, exit_code, sig)
        detail = _with_message(f"{reason} exit={exit_code} signal={sig}", report)
        txn.end_allocation(jid, attempt, end=end, outcome=reason)
        used = _usage(report)
        if new is JobState.PENDING:
            txn.transition(job, new, now=end, event="requeued", detail=detail, **requeue_changes(job), **used)
        else:
            txn.transition(job, new, now=end, event="finished", detail=detail,
                           end_time=end, exit_code=exit_code, signal=sig, **used)
        return new, detail

    async def _gang_finished(self, node: str, report: Finished) -> None:
        """One ``finished`` report of a gang job (any rank), committed on its own."""
        jid, attempt = report.job, report.attempt
        async with self._change() as ch:
            end = ch.now
            job = self.store.active.get(jid)
            rank = gang.rank_of(job, node) if job is not None else None
            ended_gang: JobRecord | None = None
            if job is not None and job.attempt == attempt and rank and job.state.active:
                # A part after rank 0 ended: only news while the job runs (a stop the head
                # sent ends every part; rank 0's report decides then).
                if job.state is JobState.RUNNING:
                    self._part_failed(ch, job, node, rank, report)
                    ended_gang = job
            elif job is not None and job.attempt == attempt and job.node == node and job.state.active:
                new, detail = self._end_in(ch.txn, job, report, end)
                ch.ended(job, end)
                ch.then(log.info, "job %d (user %s) on %s ended %s: %s", jid, job.user, node, new.value, detail)
                ch.wake()
                if job.parts:
                    ended_gang = job
            ch.tell(node_cmd(node), Ack(((jid, attempt),)))
            if ended_gang is not None:
                ch.then(self.commands.kill_parts, ended_gang, "job ended", besides=node)
            if job is not None:
                ch.then(self._steps_ended, [jid])

    def _part_failed(self, ch: "Change", job: JobRecord, node: str, rank: int, report: Finished) -> None:
        """A gang job's rank>0 part ended on its own: the job ends FAILED, or TIMEOUT when the
        holder reached its own limit first (rank 0's report was lost or late)."""
        reason, exit_code, sig = _outcome(report)
        detail = _with_message(f"part {rank} on {node} ended: {reason} exit={exit_code} signal={sig}", report)
        new = JobState.TIMEOUT if reason == "timeout" else JobState.FAILED
        ch.txn.end_allocation(job.job_id, job.attempt, end=ch.now, outcome="part_failed")
        ch.txn.transition(job, new, now=ch.now, event="finished", detail=detail, end_time=ch.now,
                          exit_code=exit_code, signal=sig)
        ch.ended(job, ch.now)
        ch.then(log.warning, "job %d (user %s) %s: %s; killing its other parts", job.job_id, job.user,
                new.value, detail)
        ch.wake()


def _outcome(report: Finished) -> tuple[str, int | None, int | None]:
    """A finished report's reason, exit code and signal, kept within what SQLite and a
    one-line detail hold: a report that cannot be committed would be repeated, and the job
    never end."""
    reason = report.reason[:MAX_REASON]
    exit_code = report.exit_code if _is_int(report.exit_code, MAX_STATUS) else None
    sig = report.signal if _is_int(report.signal, MAX_STATUS) else None
    return reason, exit_code, sig


def _usage(report: Finished) -> dict:
    """The job's final MaxRSS (bytes) and TotalCPU (seconds) from its cgroup, where the
    worker measured them (a report without them leaves the sampled values)."""
    out: dict = {}
    if _is_int(report.max_rss) and report.max_rss >= 0:
        out["max_rss"] = report.max_rss
    if _is_int(report.cpu_usec) and report.cpu_usec >= 0:
        out["total_cpu"] = report.cpu_usec / 1e6
    return out


def _with_message(detail: str, report: Finished) -> str:
    """``detail`` and the report's message, if it has one (its first 500 characters)."""
    return f"{detail}: {report.message[:500]}" if report.message else detail


def _is_int(v: Any, most: int = 2 ** 63 - 1) -> bool:
    """An integer SQLite can hold (not a bool), from -most to most."""
    return is_int(v) and -most <= v <= most
