"""The job executor: runs batch jobs on a worker, as their users, and remembers how they ended.

Theory of operation
-------------------
Every job runs under ``jobwrap.py`` (see there): a small process that leads the job's session
and process group, becomes the job's user only in its child, writes the job's exact wait
status to a file, and outlives the worker.  For each launch the executor

1. resolves the job's user and environment and writes the allocation's directory
   (``jobsetup.py``, ``jobstore.py``: script, what the wrapper needs, a record of the
   run), making the job's cgroup first (``cgroups.py``);
2. starts the wrapper (``wrappers.py``: forked by the wrapper server, ``forkserver.py``,
   which hands back a pidfd; exec'd directly where the kernel has no pidfds or the server
   fails) and watches it with a pidfd (psutil polling where the kernel has none);
3. enforces the time limit, ``--signal``'s warning and a stop's grace on its injected
   monotonic clock (``stopping.py``);
4. when the wrapper is gone, empties the job's cgroup, turns the status file into an
   ``Outcome`` (``jobend.py``), saves it, and hands it to ``on_finished``.

Each allocation's state is an ``Allocation`` (``allocation.py``), whose record is saved in
its directory, stops included, so a restarted worker still delivers the SIGKILL on time.

Restarts: ``close()`` stops watching and never kills.  ``start()`` reads the directories
again: a live wrapper (same pid *and* same process start time) is watched again; a dead one
is finished from its status file, or as "lost" when it left none.  Outcomes stay on disk
until ``ack()``, which leaves a small tombstone so that a repeated ``launch`` never runs an
allocation twice (written on a thread, in batches: ``acks.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal as signals
import subprocess
import time
from dataclasses import replace
from typing import Any, Callable

from ..gpu.backend import GpuError
from ..units import format_duration
from . import jobend, jobsetup, procs, stopping
from .acks import AckWriter
from .allocation import Allocation, time_limit_deadline, warning_time
from .cgroups import Cgroups, Limits, Sampler, Unconfined, Usage, job_name
from .jobsetup import LaunchError, TaskSetup
from .jobstore import JobStore, Key, Saved
from .launch import GpuAssignment, Launch, Outcome, output_path, parse_signal
from .wrappers import Wrappers, alive, close_spent, detach, reap_detached

__all__ = ["Executor", "GpuAssignment", "Launch", "Outcome", "output_path", "parse_signal"]

log = logging.getLogger("gpud.worker.executor")

DEFAULT_SHELL = "/bin/bash"


class Executor:
    """Runs, watches and stops this node's jobs; see the module docstring."""

    def __init__(self, state_dir: str, node: str, *, on_started: Callable | None = None,
                 on_finished: Callable | None = None, clock: Callable[[], float] = time.time,
                 shell: str = DEFAULT_SHELL, poll_interval: float = 1.0,
                 mono: Callable[[], float] = time.monotonic) -> None:
        """``on_started(job_id, attempt, pid, start_time)`` and ``on_finished(outcome)`` may be
        plain or async.  ``poll_interval`` bounds how long the clock goes unchecked."""
        self.node = node
        self.store = JobStore(state_dir, clock)
        self._on_started = on_started
        self._on_finished = on_finished
        self._clock = clock    # dates (start and end times reported)
        self._mono = mono      # time limits and grace periods: a wall-clock step kills nothing
        self.lease_file: str | None = None   # the worker's lease (gpud.worker.lease): wrappers kill at its end
        self._shell = shell
        self._poll = poll_interval
        self._wrappers = Wrappers()
        self._jobs: dict[Key, Allocation] = {}
        self._outcomes: dict[Key, Outcome] = {}
        self._closed = False
        self._acks = AckWriter(self.store, clock)
        self.cpu_binder: Any = None   # a gpud.worker.cpubind.CpuBinder, set by the worker; None: unbound
        # Confinement (gpud.worker.cgroups), set by the worker before start(): the hierarchy,
        # the node's GPU device nodes (gpud.gpu.devices.GpuDevices) and pids.max per job.
        self.cgroups: Cgroups = Unconfined("not set up")
        self.gpu_devices: Callable[[], Any] | None = None
        self.max_tasks: int | None = None
        self._usage: Sampler = Sampler(self.cgroups)

    # -- the API the worker daemon calls ------------------------------------------------------

    async def start(self) -> None:
        """Pick up what is on disk: watch live jobs again, finish the ones that ended."""
        self._closed = False
        reap_detached()
        await asyncio.to_thread(self.store.setup)
        found = await asyncio.to_thread(self.store.load)
        self._acks.pruned_now()
        self._usage = Sampler(self.cgroups)
        for saved in found:
            try:
                await self._resume(saved)
            except Exception:  # noqa: BLE001 - one bad directory must not stop the worker
                log.exception("job %d.%d: cannot pick it up again", *saved.key)
        await self._sweep_orphans()

    async def launch(self, launch: Launch) -> None:
        """Start an allocation; a repeat of one running, finished or acknowledged does nothing."""
        key = (launch.job_id, launch.attempt)
        if self._closed:
            log.warning("job %d.%d: executor closed; launch ignored", *key)
            return
        if key in self._jobs or key in self._outcomes:
            log.debug("job %d.%d: launched here before; repeat ignored", *key)
            return
        job = self._jobs[key] = Allocation(launch)
        if self.cpu_binder is not None:
            job.cpus = tuple(self.cpu_binder.choose(key, [g.index for g in launch.gpus], launch.cpus))
        reap_detached()
        try:  # one trip to a thread: the files, the wrapper and the record that names it
            started = await asyncio.to_thread(self._start, job)
            if started is None:  # its directory or tombstone is on disk: a repeat
                self._jobs.pop(key, None)
                if self.cpu_binder is not None:
                    self.cpu_binder.release(key)
                log.debug("job %d.%d: launched here before; repeat ignored", *key)
                return
            popen, pid, job.pidfd, create_time, start_time = started
        except LaunchError as e:
            await self._finish(key, self._launch_failed(job, str(e)))
            return
        except Exception as e:  # noqa: BLE001 - a bad launch must never take the worker down
            log.exception("job %d.%d: launch failed", *key)
            await self._finish(key, self._launch_failed(job, f"internal error while starting the job: {e}"))
            return
        job.popen, job.pid, job.create_time = popen, pid, create_time
        job.start_time = start_time
        job.deadline = time_limit_deadline(launch, self._mono())
        if job.stop_reason is not None:  # stopped while spawning: the thread's record lacks it
            self._save_record(job)
        for sig in job.early:
            self._signal_group(job, sig)
        log.info("job %d.%d started as %s (pid %d)", *key, launch.user, job.pid)
        if not self._closed:
            self._watch(job)
        await _call(self._on_started, key[0], key[1], job.pid, job.start_time)

    async def refuse(self, launch: Launch, message: str) -> None:
        """Record a launch this node will not run (its GPUs cannot take it) as launch_failed,
        reported like any outcome; a repeat of a known allocation does nothing."""
        key = (launch.job_id, launch.attempt)
        if key in self._jobs or key in self._outcomes or self.store.seen(key):
            return
        await self._finish(key, self._launch_failed(Allocation(launch), message))

    async def signal(self, job_id: int, attempt: int, sig: str | int = "TERM",
                     grace: float | None = None, reason: str = "cancelled") -> bool:
        """Stop a job: ``sig`` to its process group now, SIGKILL after ``grace`` seconds
        (default: the launch's kill_grace).  With reason "signal" the signal is only
        delivered, as ``scancel --signal`` does.  False when the job does not run here or
        ``sig`` names no signal."""
        job = self._jobs.get((job_id, attempt))
        if job is None:
            return False
        signum = parse_signal(sig)
        if signum is None:
            log.warning("job %d.%d: unknown signal %r ignored", job_id, attempt, sig)
            return False
        if reason == "signal":
            self._signal_group(job, signum)
        elif signum == signals.SIGKILL:
            self._kill_now(job, reason)
        else:
            self._begin_stop(job, signum, job.launch.kill_grace if grace is None else grace, reason)
        return True

    def held_time_limit(self, job_id: int, attempt: int) -> tuple[float | None] | None:
        """(the time limit a running job is held to,), None: none; None when it runs not
        here or is stopping already."""
        job = self._jobs.get((job_id, attempt))
        return None if job is None or job.stop_reason is not None else (job.launch.time_limit,)

    async def set_time_limit(self, job_id: int, attempt: int, time_limit: float | None) -> bool:
        """A new time limit (seconds from the start; None: none) for a running job, raised or
        lowered by an operator; its --signal warning moves with it.  False when the job does
        not run here or is already stopping."""
        job = self._jobs.get((job_id, attempt))
        if job is None or job.stop_reason is not None:
            return False
        before = job.launch.time_limit
        job.launch = replace(job.launch, time_limit=time_limit)
        if job.start_time is not None:
            # deadlines are monotonic: the start on that clock, from the old deadline if any
            started = (job.deadline - before if job.deadline is not None and before is not None
                       else self._mono() - max(0.0, self._clock() - job.start_time))
            job.deadline = time_limit_deadline(job.launch, started)
            warn_at = warning_time(job)
            job.warned = job.warned and warn_at is not None and warn_at <= self._mono()
            self._save_record(job)
        log.info("job %d.%d: time limit now %s", job_id, attempt, format_duration(time_limit))
        job.wake.set()
        return True

    async def kill(self, job_id: int, attempt: int, reason: str = "killed") -> bool:
        """Fencing: SIGKILL the job's whole group now.  False when it does not run here."""
        job = self._jobs.get((job_id, attempt))
        if job is None:
            return False
        self._kill_now(job, reason)
        return True

    def running(self) -> list[Key]:
        """Allocations started here and not finished (including ones no longer watched)."""
        return sorted(self._jobs)

    def launches(self) -> list[Launch]:
        """The launches of the allocations in running(), for telemetry."""
        return [self._jobs[k].launch for k in sorted(self._jobs)]

    def outcomes(self) -> list[Outcome]:
        """Finished allocations the head has not acknowledged yet."""
        return [self._outcomes[k] for k in sorted(self._outcomes)]

    def ack(self, job_id: int, attempt: int) -> None:
        """The head recorded this outcome: forget it, keeping only a tombstone.  The files
        change on a thread, in batches (``settle`` waits for them); until then the
        allocation's directory is still there, so a repeated launch is still refused."""
        key = (job_id, attempt)
        if self._outcomes.pop(key, None) is None:
            return
        self._acks.add(key)

    async def settle(self) -> None:
        """Wait until every ack so far is on disk."""
        await self._acks.settle()

    async def close(self) -> None:
        """Stop watching.  Jobs keep running; the next executor on this state_dir adopts them."""
        self._closed = True
        await self.settle()
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in self._jobs.values():
            job.task = None
            if job.popen is not None and job.popen.returncode is None:
                detach(job.popen)
            if job.pidfd is not None:
                os.close(job.pidfd)
                job.pidfd = None
        self._wrappers.close()
        if not self._jobs:
            try:
                await asyncio.to_thread(self.cgroups.close)
            except OSError as e:
                log.warning("cannot remove the jobs' cgroups: %s", e.strerror or e)

    def usage(self, job_id: int, attempt: int) -> Usage | None:
        """A running job's peak memory and CPU time so far, from its cgroup; None when it
        does not run here or is not confined."""
        if (job_id, attempt) not in self._jobs or not self.cgroups.active:
            return None
        try:
            return self._usage.sample(job_name(job_id, attempt))
        except OSError:
            return None

    def usage_rows(self) -> list[list]:
        """(thread) [job, attempt, step, peak bytes, CPU microseconds] for every confined
        running job: step "" is the whole job, then each of its steps (batch, step_N)."""
        if not self.cgroups.active:
            return []
        rows = []
        for key in list(self._jobs):
            name = job_name(*key)
            try:
                total = self._usage.sample(name)
                rows.append([*key, "", total.max_rss, total.cpu_usec])
                for step in self.cgroups.steps(name):
                    u = self.cgroups.usage(name, step)
                    rows.append([*key, step, u.max_rss, u.cpu_usec])
            except OSError:
                continue
        return rows

    # -- restarting -----------------------------------------------------------------------------

    async def _sweep_orphans(self) -> None:
        """Job cgroups that no record claims (their outcome was saved just before a crash,
        or their directory is gone): whatever still runs there is killed, the cgroup removed."""
        if not self.cgroups.active:
            return
        names = {job_name(*k) for k in self._jobs}
        for name in await asyncio.to_thread(self.cgroups.jobs):
            if name not in names:
                log.warning("cgroup %s belongs to no running job; killing what is left in it", name)
                await self._drain(name)

    async def _resume(self, saved: Saved) -> None:
        """One allocation found on disk: keep its outcome, watch it again, or finish it."""
        known = self._jobs.get(saved.key)
        if known is not None and known.task is None and known.pid is not None:
            self._watch(known)  # this executor was closed and is started again
        if known is not None or saved.key in self._outcomes:
            return
        if saved.outcome is not None:
            self._outcomes[saved.key] = saved.outcome
            return
        try:
            job = Allocation.from_saved(saved)
        except (KeyError, TypeError, ValueError):
            job = None
        if job is None or job.key != saved.key:
            log.error("job %d.%d: its record is unreadable; reported lost", *saved.key)
            await self._finish(saved.key, Outcome(
                *saved.key, None, None, "lost", "the worker's record of this job is unreadable",
                None, self._clock()))
            return
        self._jobs[job.key] = job
        if self.cpu_binder is not None and job.cpus:
            self.cpu_binder.adopt(job.key, job.cpus)
        if not alive(job.pid, job.create_time, saved.dir):
            await self._conclude(job)
            return
        log.info("job %d.%d: watching it again (pid %d)", *job.key, job.pid)
        if job.start_time is None:  # found by its wrapper.pid: the limit counts from now
            job.create_time = procs.create_time(job.pid)
            job.start_time = self._clock()
            job.deadline = time_limit_deadline(job.launch, self._mono())
            self._save_record(job)
        self._watch(job)

    # -- launching ------------------------------------------------------------------------------


    # -- launching ------------------------------------------------------------------------------

    def task_setup(self, job_id: int, attempt: int) -> "TaskSetup | None":
        """(thread) What a ``gpuctl srun`` task of a running allocation runs with: the job's
        user, groups, working directory and environment (this node's GPUs only), exactly
        as its batch script or holder got them.  None when the allocation does not run here;
        a ValueError when its user cannot be resolved."""
        job = self._jobs.get((job_id, attempt))
        if job is None or job.pid is None or job.stop_reason is not None:
            return None
        launch = job.launch
        try:
            user, home, groups, switch = jobsetup.identity(launch, self.node)
        except LaunchError as e:
            raise ValueError(str(e)) from None
        step_cgroup = None
        if self.cgroups.active:
            def step_cgroup(step: int) -> list[str]:
                return self.step_cgroup(job_id, attempt, step)
        return TaskSetup(launch.uid, launch.gid, groups, switch, launch.work_dir,
                         jobsetup.environment(launch, self.node, user, home), step_cgroup)

    def limits(self, launch: Launch, cpus: tuple[int, ...]) -> Limits:
        """What the job's cgroup allows: its CPUs, memory, tasks and GPU device nodes."""
        node_devices = self.gpu_devices() if self.gpu_devices is not None else None
        return jobsetup.limits(launch, cpus, node_devices, self.max_tasks)

    def step_cgroup(self, job_id: int, attempt: int, step: int) -> list[str]:
        """(thread) The cgroup files a ``gpuctl srun`` step's task joins; [] unconfined."""
        if not self.cgroups.active or (job_id, attempt) not in self._jobs:
            return []
        return self.cgroups.step(job_name(job_id, attempt), f"step_{step}")

    def _start(self, job: Allocation) -> tuple[subprocess.Popen | None, int, int | None, float | None, float] | None:
        """(thread) Write the allocation's files, start the wrapper and record it: (its
        Popen or None when the fork server made it, pid, pidfd, process start time, job
        start time); None when it was launched here before.  The job's fields are set by
        the caller, on the event loop; a stop that came meanwhile is saved there again."""
        if self.store.seen(job.key):
            return None
        self._prepare(job)
        popen, pid, pidfd = self._wrappers.start(job.key, self.store.dir(job.key))
        create_time, start_time = procs.create_time(pid), self._clock()
        record = job.record()
        record.update(pid=pid, create_time=create_time, start_time=start_time,
                      deadline=time_limit_deadline(job.launch, self._mono()))
        try:
            self.store.save_record(job.key, record)
        except OSError as e:
            log.error("job %d.%d: cannot save its record: %s", *job.key, e.strerror)
        return popen, pid, pidfd, create_time, start_time

    def _prepare(self, job: Allocation) -> None:
        """(thread) Resolve the user, build the environment, make the cgroup, write the
        allocation's files."""
        launch = job.launch
        job_dir = self.store.dir(job.key)
        spec = jobsetup.wrapper_spec(launch, self.node, job_dir, job.cpus, self._shell)
        spec["cgroup_procs"] = self._confine(job)
        spec["lease_file"] = self.lease_file
        try:
            self.store.create(job.key, launch.script, (launch.uid, launch.gid) if spec["switch_user"] else None,
                              spec, job.record())
        except OSError as e:
            if spec["cgroup_procs"]:
                try:
                    self.cgroups.remove(job_name(*job.key))
                except OSError:
                    pass   # the next start's orphan sweep removes it
            raise LaunchError(f"cannot write the job's files under {job_dir}: {e.strerror}") from None

    def _confine(self, job: Allocation) -> list[str]:
        """(thread) Create the job's cgroup; the files its batch step joins it by."""
        if not self.cgroups.active:
            return []
        name = job_name(*job.key)
        try:
            self.cgroups.create(name, self.limits(job.launch, job.cpus))
            return self.cgroups.step(name, "batch")
        except (OSError, GpuError) as e:
            try:
                self.cgroups.remove(name)
            except OSError:
                pass
            raise LaunchError(f"cannot create the job's cgroup on node {self.node}: "
                              f"{getattr(e, 'strerror', None) or e}") from None

    # -- watching and stopping ------------------------------------------------------------------

    def _watch(self, job: Allocation) -> None:
        job.task = asyncio.get_running_loop().create_task(
            self._supervise(job), name=f"job {job.key[0]}.{job.key[1]}")

    async def _supervise(self, job: Allocation) -> None:
        exited = self._wrappers.exited(job, self.store.dir(job.key), self._poll)
        try:
            while not exited.done():
                if stopping.enforce(job, self._mono, self.cgroups):
                    self._save_record(job)
                job.wake.clear()
                waker = asyncio.ensure_future(job.wake.wait())
                try:
                    await asyncio.wait((exited, waker), timeout=stopping.next_delay(job, self._mono(), self._poll),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waker.cancel()
            await self._conclude(job)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one job's trouble must not take the worker down
            log.exception("job %d.%d: watcher failed", *job.key)
        finally:
            exited.cancel()
            close_spent(job)   # normally the outcome's thread has closed them

    def _begin_stop(self, job: Allocation, sig: int, grace: float, reason: str) -> None:
        stopping.begin_stop(job, sig, grace, reason, self._mono(), self.cgroups)
        self._save_record(job)
        job.wake.set()

    def _kill_now(self, job: Allocation, reason: str) -> None:
        stopping.kill_now(job, reason, self.cgroups)
        self._save_record(job)
        job.wake.set()

    def _signal_group(self, job: Allocation, sig: int) -> None:
        stopping.signal_group(job, sig, self.cgroups)

    # -- finishing ------------------------------------------------------------------------------

    async def _conclude(self, job: Allocation) -> None:
        """The wrapper is gone: clear leftovers, read its status, record the outcome."""
        rc = None
        if job.popen is not None:
            rc = job.popen.poll()
            if rc is None:
                rc = await asyncio.to_thread(job.popen.wait)
            self._signal_group(job, signals.SIGKILL)  # just reaped: the group id is still ours
        usage = await self._drain(job_name(*job.key)) if self.cgroups.active else None
        # One trip to a thread: status, sweep, outcome saved.
        outcome = await asyncio.to_thread(self._outcome_saved, job, rc, usage)
        await self._finish(job.key, outcome, saved=True)

    async def _drain(self, name: str) -> Usage | None:
        return await jobend.drain(self.cgroups, self._usage, name)

    def _outcome_saved(self, job: Allocation, rc: int | None, usage: Usage | None = None) -> Outcome:
        """(thread)"""
        outcome = jobend.collect(self.store, job, rc, usage, self._clock)
        self._save_outcome(job.key, outcome)
        return outcome

    def _launch_failed(self, job: Allocation, message: str) -> Outcome:
        return jobend.outcome(job, None, None, "launch_failed", message, end_time=self._clock())

    async def _finish(self, key: Key, outcome: Outcome, *, saved: bool = False) -> None:
        if not saved:
            await asyncio.to_thread(self._save_outcome, key, outcome)
        self._jobs.pop(key, None)
        if self.cpu_binder is not None:
            self.cpu_binder.release(key)
        self._outcomes[key] = outcome
        log.info("job %d.%d ended: %s: %s", *key, outcome.reason, outcome.message)
        await _call(self._on_finished, outcome)

    def _save_outcome(self, key: Key, outcome: Outcome) -> None:
        """(thread)"""
        try:
            self.store.save_outcome(key, outcome)
        except OSError as e:
            log.error("job %d.%d: cannot save its outcome (%s); it lasts until restart",
                      *key, e.strerror)

    def _save_record(self, job: Allocation) -> None:
        if job.pid is None:  # still spawning: the record written after the spawn has it all
            return
        try:
            self.store.save_record(job.key, job.record())
        except OSError as e:
            log.error("job %d.%d: cannot save its record: %s", *job.key, e.strerror)


async def _call(fn: Callable | None, *args: Any) -> None:
    """Run a callback, plain or async; its failure is logged, never raised into the executor."""
    if fn is None:
        return
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001
        log.exception("executor callback %r failed", fn)
