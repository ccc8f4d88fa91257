"""Interactive allocations on the head: ``gpuctl salloc`` and ``gpuctl srun`` outside a job.

Theory of operation
-------------------
An interactive allocation is an ordinary job (``JobSpec.interactive``): it is queued,
prioritised, limited, preempted and timed out like any batch job.  Its script is a holder
that only waits (``gpuctl.commands.salloc.HOLDER``); the work comes as ``gpuctl srun``
steps, from salloc's command or from srun itself.

What is particular is who keeps it alive.  The gpuctl that asked for it calls
``alloc_status`` every quarter of ``[head] interactive_timeout`` (the answer says how
often); the head notes each call on its monotonic clock.  An allocation not heard of for
longer than the timeout is withdrawn (pending) or stopped like a cancel (running): a
salloc that was killed or lost its ssh does not hold GPUs for ever.  A restarted head
gives every interactive job the whole timeout again: its silence is not theirs.

An allocation is granted once its holder runs on every node (the workers' ``started``
reports, or for one that started before this head did, the job's ``started`` event):
before that a step would find nothing to run in.

``alloc_release`` is the normal end: a pending request is withdrawn (CANCELLED, as
Slurm's salloc leaves it when interrupted) and a running one is stopped like a cancel but
with the stop reason ``released``, so the job ends COMPLETED (``jobs.final_state``).

The sweep looks at the jobs it has heard of every second; every half timeout (and at
start) it scans all active jobs for interactive ones it has not, so one whose gpuctl died
before its first call is found too: such a one goes after one and a half timeouts at most.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..bus.messages import Started
from ..model import JobState, StopReason
from . import gang
from ..ctlsocket import Caller, RequestError
from .jobs import may_modify

if TYPE_CHECKING:
    from ..config import Config
    from .change import Change
    from .daemon import Head
    from .store import JobRecord, Store

log = logging.getLogger("gpud.interactive")



class Allocations:
    """The keepalives of interactive jobs, by job id, on the monotonic clock.  Given the
    store (read; writes go through the head's change door), getters for the live config
    and the admins, and the srun steps' sweep (run with each of its own)."""

    def __init__(self, store: "Store", *, change: Callable[[], "Change"], config: Callable[[], "Config"],
                 admins: Callable[[], frozenset[str]], sweep_steps: Callable[[float], Awaitable[None]],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._change = change
        self._config = config            # the live config: interactive_timeout may change on reload
        self._admins = admins            # as a reload leaves them
        self._sweep_steps = sweep_steps
        self.monotonic = monotonic
        self.seen: dict[int, float] = {}     # job id -> the last keepalive (or when first noticed)
        self.up: dict[tuple[int, int], set[str]] = {}   # (job, attempt) -> nodes whose holder started
        self._scanned = float("-inf")

    @property
    def timeout(self) -> float:
        return float(self._config().head.interactive_timeout)

    # -- from gpuctl ----------------------------------------------------------------------

    async def status(self, caller: Caller, args: dict) -> dict:
        """A keepalive, and where the allocation stands."""
        job = await self._job(caller, args.get("job_id"))
        if job.spec.interactive and job.state.active:
            self.seen[job.job_id] = self.monotonic()
        nodes = gang.job_nodes(job) if job.state is JobState.RUNNING else []
        if nodes and not await self._holding(job, nodes):
            return {"job_id": job.job_id, "state": "CONFIGURING", "reason": "waiting for the nodes to start it",
                    "nodelist": None, "nodes": 0, "env": {}, "keepalive_every": self.timeout / 4,
                    "stop_reason": None}
        return {"job_id": job.job_id, "state": job.state.value, "reason": job.reason,
                "nodelist": gang.nodelist_text(nodes) if nodes else None, "nodes": len(nodes),
                "env": self.environment(job) if nodes else {}, "keepalive_every": self.timeout / 4,
                "stop_reason": job.stop_reason}

    def started(self, node: str, report: Started) -> None:
        """A worker's ``started`` report (before it is applied): the holder runs there."""
        job = self.store.active.get(report.job)
        if job is not None and job.spec.interactive:
            self.up.setdefault((report.job, report.attempt), set()).add(node)

    async def _holding(self, job: "JobRecord", nodes: list[str]) -> bool:
        key = (job.job_id, job.attempt)
        if set(nodes) <= self.up.get(key, set()):
            return True
        if len(nodes) == 1:   # started before this head did: its event says so
            events = await self.store.job_events(job.job_id)
            if any(e["event"] == "started" and e["attempt"] == job.attempt for e in events):
                self.up.setdefault(key, set()).update(nodes)
                return True
        return False

    async def release(self, caller: Caller, args: dict) -> dict:
        """salloc's command ended, or it was interrupted while pending."""
        job = await self._job(caller, args.get("job_id"))
        if not job.spec.interactive:
            raise RequestError(f"job {job.job_id} is a batch job, not an interactive allocation; "
                               "end it with scancel")
        self.seen.pop(job.job_id, None)
        if job.state is JobState.PENDING:
            await self._withdraw(job, f"by {caller.user} (salloc)")
            return {"released": True, "state": "CANCELLED"}
        if job.state is JobState.RUNNING:
            log.info("job %d (user %s): interactive allocation released", job.job_id, job.user)
            await self._stop(job, "released", f"by {caller.user}", StopReason.RELEASED)
            return {"released": True, "state": "COMPLETING"}
        return {"released": False, "state": job.state.value}

    def environment(self, job: "JobRecord") -> dict[str, str]:
        """What salloc's command gets: the job's id and nodes, Slurm's names when configured."""
        nodes = gang.job_nodes(job)
        env = {"GPUD_JOB_ID": str(job.job_id), "GPUD_JOB_NODELIST": gang.nodelist_text(nodes),
               "GPUD_NNODES": str(len(nodes)), "GPUD_JOB_PARTITION": job.partition or ""}
        if getattr(self._config().head, "slurm_compat_env", False):
            env.update({"SLURM_JOB_ID": str(job.job_id), "SLURM_JOBID": str(job.job_id),
                        "SLURM_JOB_NODELIST": env["GPUD_JOB_NODELIST"], "SLURM_NODELIST": env["GPUD_JOB_NODELIST"],
                        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
                        "SLURM_JOB_PARTITION": job.partition or ""})
        return env

    # -- the sweep ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(1.0, self.timeout / 8)))
            try:
                await self.sweep()
            except Exception:   # one bad pass must not end keepalive checking
                log.exception("interactive sweep failed")

    async def sweep(self) -> None:
        now = self.monotonic()
        active = self.store.active
        if now - self._scanned >= self.timeout / 2:
            self._scanned = now
            for job in list(active.values()):
                if job.spec.interactive and job.state.active:
                    self.seen.setdefault(job.job_id, now)
        for job_id, last in list(self.seen.items()):
            job = active.get(job_id)
            if job is None or job.state not in (JobState.PENDING, JobState.RUNNING):
                del self.seen[job_id]
                for key in [k for k in self.up if k[0] == job_id]:
                    del self.up[key]
            elif now - last > self.timeout:
                del self.seen[job_id]
                await self._expire(job, now - last)
        await self._sweep_steps(now)

    async def _expire(self, job: "JobRecord", silent: float) -> None:
        why = f"no keepalive from its salloc/srun for {silent:.0f}s (interactive_timeout {self.timeout:g}s)"
        log.warning("job %d (user %s): released: %s", job.job_id, job.user, why)
        if job.state is JobState.PENDING:
            await self._withdraw(job, why)
            return
        await self._stop(job, "cancel", why, StopReason.CANCELLED)

    async def _stop(self, job: "JobRecord", event: str, detail: str, stop_reason: StopReason) -> None:
        """Stop a running allocation as scancel does; ``stop_reason`` decides its end state."""
        async with self._change() as ch:
            job = self.store.active.get(job.job_id)
            if job is None or job.state is not JobState.RUNNING:
                return
            job = ch.txn.transition(job, JobState.COMPLETING, now=ch.now, event=event, detail=detail,
                                    stop_reason=stop_reason.value, stop_time=ch.now)
            ch.signal(job, "TERM", grace=self._config().head.kill_grace, reason="cancelled")
            ch.wake()

    async def _withdraw(self, job: "JobRecord", detail: str) -> None:
        async with self._change() as ch:
            job = self.store.active.get(job.job_id)
            if job is None or job.state is not JobState.PENDING:
                return
            ch.txn.transition(job, JobState.CANCELLED, now=ch.now, event="cancelled", detail=detail,
                              end_time=ch.now, reason=None)
            ch.wake()

    async def _job(self, caller: Caller, job_id: Any) -> "JobRecord":
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise RequestError("job_id must be a positive integer")
        job = self.store.active.get(job_id)
        if job is None:
            found = await self.store.find_jobs(job_ids=[job_id])
            if not found:
                raise RequestError(f"invalid job id specified: {job_id}")
            job = found[0]
        if not may_modify(job.uid, caller.uid, caller.user, self._admins(), os.geteuid()):
            raise RequestError(f"job {job_id} belongs to {job.user}; only its owner or an admin may hold it")
        return job


async def op_alloc_status(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.allocs.status(caller, args)


async def op_alloc_release(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.allocs.release(caller, args)


OPS = {"alloc_status": op_alloc_status, "alloc_release": op_alloc_release}
