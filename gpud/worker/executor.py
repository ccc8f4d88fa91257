"""The job executor: runs batch jobs on a worker, as their users, and remembers how they ended.

Theory of operation
-------------------
Every job runs under ``jobwrap.py`` (see there): a small process that leads the job's session
and process group, becomes the job's user only in its child, writes the job's exact wait
status to a file, and outlives the worker.  The executor prepares the allocation's directory
(``jobstore.py``: script, what the wrapper needs, a record of the run), starts the wrapper
(forked by the wrapper server, ``forkserver.py``, which hands back a pidfd; exec'd directly
where the kernel has no pidfds or the server fails), watches it with a pidfd (psutil
polling where the kernel has none), and enforces the time limit and the kill grace on its
injected clock.  When the wrapper is gone it turns the
status file into an ``Outcome``, saves it, and hands it to ``on_finished``.

A stop (time limit, cancel, preemption) sends a signal to the whole group, then SIGCONT so a
stopped job sees it, and SIGKILL when the grace runs out; fencing (``kill``) sends SIGKILL
at once.  The first reason given is the one reported.  Stops are saved in the record, so a
restarted worker still delivers the SIGKILL on time.

Restarts: ``close()`` stops watching and never kills.  ``start()`` reads the directories
again: a live wrapper (same pid *and* same process start time) is watched again; a dead one
is finished from its status file, or as "lost" when it left none.  Outcomes stay on disk
until ``ack()``, which leaves a small tombstone so that a repeated ``launch`` never runs an
allocation twice (written on a thread, in batches: ``acks.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import pwd
import shutil
import signal as signals
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import psutil

from ..gpu.backend import GpuError
from ..units import format_duration
from .cpubind import format_cpulist
from . import procs
from .acks import AckWriter
from .cgroups import Cgroups, Limits, Sampler, Unconfined, Usage, job_name
from .forkserver import ForkServer
from .jobstore import JobStore, Key, Saved
from .launch import OOM_SIGNAL, GpuAssignment, Launch, Outcome, batch_env, output_path, parse_signal

__all__ = ["Executor", "GpuAssignment", "Launch", "Outcome", "output_path", "parse_signal"]

log = logging.getLogger("gpud.worker.executor")

DEFAULT_SHELL = "/bin/bash"
WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobwrap.py")
# The wrapper may run as root: it never sees the job's environment (LD_PRELOAD, PYTHON*...).
WRAPPER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

# Wrappers still running when their executor closed; polled later so that a process that
# keeps running (an in-process restart, tests) reaps them.
_DETACHED: list[subprocess.Popen] = []


class _LaunchError(Exception):
    """The job cannot start; the message is the user-facing reason."""


@dataclass(frozen=True)
class TaskSetup:
    """How to start a process of a running allocation as its job (gpud.worker.steps)."""

    uid: int
    gid: int
    groups: list[int]
    switch_user: bool
    work_dir: str
    env: dict[str, str]
    step_cgroup: Callable[[int], list[str]] | None = None   # step -> the cgroup files its tasks join


@dataclass(eq=False)
class _Job:
    """One allocation this executor runs or watches (mutable; event-loop thread only)."""

    launch: Launch
    pid: int | None = None           # the wrapper's pid, which is also the job's pgid
    create_time: float | None = None  # the wrapper's start time as psutil reports it
    start_time: float | None = None
    deadline: float | None = None    # monotonic time of the time limit
    stop_reason: str | None = None
    kill_at: float | None = None     # monotonic time of the SIGKILL that ends a stop's grace
    killed: bool = False             # SIGKILL sent
    popen: subprocess.Popen | None = None   # None when adopted or forked by the server
    pidfd: int | None = None         # the fork server's pidfd of the wrapper, until watched
    task: asyncio.Task | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    early: list[int] = field(default_factory=list)  # signals asked for before the spawn
    cpus: tuple[int, ...] = ()       # the CPUs it is bound to (gpud.worker.cpubind); (): unbound
    spent_fds: list[int] = field(default_factory=list)  # pidfds of the exited wrapper, to close
    warned: bool = False             # --signal's warning sent

    @property
    def key(self) -> Key:
        return (self.launch.job_id, self.launch.attempt)

    def record(self) -> dict[str, Any]:
        return {"version": 1, "timers": "monotonic", "pid": self.pid, "create_time": self.create_time,
                "start_time": self.start_time, "deadline": self.deadline,
                "stop_reason": self.stop_reason, "kill_at": self.kill_at, "killed": self.killed,
                "cpus": list(self.cpus),
                "launch": self.launch.to_body()}

    @classmethod
    def from_saved(cls, saved: Saved) -> "_Job":
        """Raises ValueError (or KeyError, TypeError) when the record is unusable."""
        rec = saved.record
        if rec is None:
            raise ValueError("no record")
        job = cls(Launch.from_body(rec["launch"]))
        for name in ("create_time", "start_time", "deadline", "kill_at"):
            value = rec.get(name)
            setattr(job, name, float(value) if isinstance(value, (int, float)) else None)
        if rec.get("timers") != "monotonic":   # written by a worker that timed on the wall clock
            shift = time.monotonic() - time.time()
            job.deadline = None if job.deadline is None else job.deadline + shift
            job.kill_at = None if job.kill_at is None else job.kill_at + shift
        job.stop_reason = rec["stop_reason"] if isinstance(rec.get("stop_reason"), str) else None
        job.killed = rec.get("killed") is True
        cpus = rec.get("cpus")
        job.cpus = tuple(c for c in cpus if type(c) is int) if isinstance(cpus, list) else ()
        pid = rec.get("pid")
        # No pid: the worker died between the spawn and the record; the wrapper wrote its own.
        job.pid = pid if isinstance(pid, int) and pid > 0 else saved.wrapper_pid
        return job


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
        self._use_pidfd = hasattr(os, "pidfd_open")
        self._python = sys.executable or shutil.which("python3") or "/usr/bin/python3"
        # Wrappers forked by one server (see forkserver.py) where the kernel has pidfds
        self._server = ForkServer(self._python, WRAPPER, WRAPPER_ENV) if self._use_pidfd else None
        self._jobs: dict[Key, _Job] = {}
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
        _reap_detached()
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
        job = self._jobs[key] = _Job(launch)
        if self.cpu_binder is not None:
            job.cpus = tuple(self.cpu_binder.choose(key, [g.index for g in launch.gpus], launch.cpus))
        _reap_detached()
        try:  # one trip to a thread: the files, the wrapper and the record that names it
            started = await asyncio.to_thread(self._start, job)
            if started is None:  # its directory or tombstone is on disk: a repeat
                self._jobs.pop(key, None)
                if self.cpu_binder is not None:
                    self.cpu_binder.release(key)
                log.debug("job %d.%d: launched here before; repeat ignored", *key)
                return
            popen, pid, job.pidfd, create_time, start_time = started
        except _LaunchError as e:
            await self._finish(key, self._outcome(job, None, None, "launch_failed", str(e)))
            return
        except Exception as e:  # noqa: BLE001 - a bad launch must never take the worker down
            log.exception("job %d.%d: launch failed", *key)
            await self._finish(key, self._outcome(job, None, None, "launch_failed",
                                                  f"internal error while starting the job: {e}"))
            return
        job.popen, job.pid, job.create_time = popen, pid, create_time
        job.start_time = start_time
        job.deadline = _deadline(launch, self._mono())
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
        await self._finish(key, self._outcome(_Job(launch), None, None, "launch_failed", message))

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
            job.deadline = _deadline(job.launch, started)
            warn_at = _warn_at(job)
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
                _DETACHED.append(job.popen)
            if job.pidfd is not None:
                os.close(job.pidfd)
                job.pidfd = None
        if self._server is not None:
            _DETACHED.extend(self._server.close())
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
            job = _Job.from_saved(saved)
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
        if not _alive(job.pid, job.create_time, saved.dir):
            await self._conclude(job)
            return
        log.info("job %d.%d: watching it again (pid %d)", *job.key, job.pid)
        if job.start_time is None:  # found by its wrapper.pid: the limit counts from now
            job.create_time = procs.create_time(job.pid)
            job.start_time = self._clock()
            job.deadline = _deadline(job.launch, self._mono())
            self._save_record(job)
        self._watch(job)

    # -- launching ------------------------------------------------------------------------------

    def task_setup(self, job_id: int, attempt: int) -> "TaskSetup | None":
        """(thread) What a ``gpuctl srun`` task of a running allocation runs with: the job's
        user, groups, working directory and environment (this node's GPUs only), exactly
        as its batch script or holder got them.  None when the allocation does not run here;
        _LaunchError (a ValueError) when its user cannot be resolved."""
        job = self._jobs.get((job_id, attempt))
        if job is None or job.pid is None or job.stop_reason is not None:
            return None
        launch = job.launch
        try:
            user, home, groups, switch = self._identity(launch)
        except _LaunchError as e:
            raise ValueError(str(e)) from None
        step_cgroup = None
        if self.cgroups.active:
            def step_cgroup(step: int) -> list[str]:
                return self.step_cgroup(job_id, attempt, step)
        return TaskSetup(launch.uid, launch.gid, groups, switch, launch.work_dir,
                         self._environment(launch, user, home), step_cgroup)

    def _environment(self, launch: Launch, user: str, home: str) -> dict[str, str]:
        env = dict(launch.env)
        env.update({
            "GPUD_JOB_ID": str(launch.job_id), "GPUD_JOB_NAME": launch.name,
            "GPUD_NODENAME": self.node, "GPUD_SUBMIT_DIR": launch.submit_dir,
            "GPUD_GPUS": ",".join(str(i) for i in dict.fromkeys(g.index for g in launch.gpus)),
            "GPUD_JOB_ATTEMPT": str(launch.attempt),
            # UUIDs survive any renumbering; an empty value hides every GPU.
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in launch.gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "USER": user, "LOGNAME": user, "HOME": home,
        })
        env.update(batch_env(launch, self.node))   # GPUD_ARRAY_*, SLURM_* (slurm_compat_env)
        env.update(launch.extra_env)
        return env

    def _prepare(self, job: _Job) -> None:
        """(thread) Resolve the user, build the environment, write the allocation's files."""
        launch = job.launch
        user, home, groups, switch = self._identity(launch)
        env = self._environment(launch, user, home)
        if job.cpus:
            env["GPUD_JOB_CPUS"] = format_cpulist(job.cpus)
        stdout = output_path(launch.stdout, launch, self.node)
        stderr = output_path(launch.stderr, launch, self.node) if launch.stderr else stdout
        job_dir = self.store.dir(job.key)
        spec = {"user": user, "uid": launch.uid, "gid": launch.gid, "groups": groups,
                "switch_user": switch, "work_dir": launch.work_dir, "stdout": stdout,
                "stderr": stderr, "shell": self._shell, "script": os.path.join(job_dir, "script"),
                "env": env, "open_mode": launch.open_mode, "cpus": list(job.cpus),
                "rlimits": {k: list(v) for k, v in launch.rlimits.items()},
                "cgroup_procs": self._confine(job), "lease_file": self.lease_file}
        try:
            self.store.create(job.key, launch.script, (launch.uid, launch.gid) if switch else None,
                              spec, job.record())
        except OSError as e:
            if spec["cgroup_procs"]:
                try:
                    self.cgroups.remove(job_name(*job.key))
                except OSError:
                    pass   # the next start's orphan sweep removes it
            raise _LaunchError(f"cannot write the job's files under {job_dir}: {e.strerror}") from None

    def limits(self, launch: Launch, cpus: tuple[int, ...]) -> Limits:
        """What the job's cgroup allows: its CPUs, memory, tasks and GPU device nodes."""
        devices, known = None, ()
        node_devices = self.gpu_devices() if self.gpu_devices is not None else None
        if node_devices is not None:
            held = [(g.index, g.slice_start if g.kind == "mig" else None) for g in launch.gpus]
            devices, known = node_devices.allowed(held), tuple(node_devices.known())
        return Limits(cpus=cpus, mem_bytes=launch.mem_mb * (1 << 20) if launch.mem_mb else None,
                      pids_max=self.max_tasks or None, devices=devices, known_devices=known)

    def _confine(self, job: _Job) -> list[str]:
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
            raise _LaunchError(f"cannot create the job's cgroup on node {self.node}: "
                               f"{getattr(e, 'strerror', None) or e}") from None

    def step_cgroup(self, job_id: int, attempt: int, step: int) -> list[str]:
        """(thread) The cgroup files a ``gpuctl srun`` step's task joins; [] unconfined."""
        if not self.cgroups.active or (job_id, attempt) not in self._jobs:
            return []
        return self.cgroups.step(job_name(job_id, attempt), f"step_{step}")

    def _start(self, job: _Job) -> tuple[subprocess.Popen | None, int, int | None, float | None, float] | None:
        """(thread) Write the allocation's files, start the wrapper and record it: (its
        Popen or None when the fork server made it, pid, pidfd, process start time, job
        start time); None when it was launched here before.  The job's fields are set by
        the caller, on the event loop; a stop that came meanwhile is saved there again."""
        if self.store.seen(job.key):
            return None
        self._prepare(job)
        popen, pidfd = None, None
        if self._server is not None:
            try:
                pid, pidfd = self._server.spawn(self.store.dir(job.key))
            except OSError as e:  # the server cannot: exec the wrapper as before
                log.warning("job %d.%d: the job wrapper server failed (%s); starting the wrapper "
                            "directly", *job.key, e)
        if pidfd is None:
            popen = self._spawn(job)
            pid = popen.pid
        create_time, start_time = procs.create_time(pid), self._clock()
        record = job.record()
        record.update(pid=pid, create_time=create_time, start_time=start_time,
                      deadline=_deadline(job.launch, self._mono()))
        try:
            self.store.save_record(job.key, record)
        except OSError as e:
            log.error("job %d.%d: cannot save its record: %s", *job.key, e.strerror)
        return popen, pid, pidfd, create_time, start_time

    def _identity(self, launch: Launch) -> tuple[str, str, list[int], bool]:
        """(user, home, groups, switch_user): the job's user when root, else ourselves."""
        if os.geteuid() != 0:
            try:
                pw = pwd.getpwuid(os.getuid())
                return pw.pw_name, pw.pw_dir, [], False
            except KeyError:
                return launch.user, os.environ.get("HOME", "/"), [], False
        try:
            pw = pwd.getpwuid(launch.uid)
        except KeyError:
            raise _LaunchError(f"user {launch.user} (uid {launch.uid}) does not exist on node "
                               f"{self.node}; add the user there or fix its user database") from None
        if pw.pw_name != launch.user:
            raise _LaunchError(f"uid {launch.uid} is {pw.pw_name} on node {self.node} but "
                               f"{launch.user} on the head; make the user databases agree")
        try:
            groups = os.getgrouplist(pw.pw_name, launch.gid)
        except OSError as e:
            raise _LaunchError(f"cannot read the groups of {pw.pw_name}: {e.strerror}") from None
        return pw.pw_name, pw.pw_dir, groups, True

    def _spawn(self, job: _Job) -> subprocess.Popen:
        """(thread) Start the wrapper as the leader of a new session."""
        job_dir = self.store.dir(job.key)
        try:
            log_fd = os.open(os.path.join(job_dir, "wrapper.log"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                return subprocess.Popen(
                    [self._python, "-I", "-S", WRAPPER, job_dir], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=log_fd, cwd="/", env=WRAPPER_ENV,
                    start_new_session=True, close_fds=True)
            finally:
                os.close(log_fd)
        except OSError as e:
            raise _LaunchError(f"cannot start the job wrapper {self._python}: {e.strerror}") from None

    # -- watching and stopping ------------------------------------------------------------------

    def _watch(self, job: _Job) -> None:
        job.task = asyncio.get_running_loop().create_task(
            self._supervise(job), name=f"job {job.key[0]}.{job.key[1]}")

    async def _supervise(self, job: _Job) -> None:
        exited = self._exit_future(job)
        try:
            while not exited.done():
                self._enforce(job)
                job.wake.clear()
                waker = asyncio.ensure_future(job.wake.wait())
                try:
                    await asyncio.wait((exited, waker), timeout=self._delay(job),
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
            _close_spent(job)   # normally the outcome's thread has closed them

    def _exit_future(self, job: _Job) -> asyncio.Future:
        """Resolves once the wrapper has exited (a zombie counts)."""
        loop = asyncio.get_running_loop()
        if job.pidfd is not None:  # from the fork server: exactly this wrapper, exited or not
            fd, job.pidfd = job.pidfd, None
            return self._pidfd_future(loop, fd, job, checked=True)
        if self._use_pidfd and job.pid is not None:
            try:
                fd = os.pidfd_open(job.pid)
            except ProcessLookupError:
                fut = loop.create_future()
                fut.set_result(None)
                return fut
            except OSError:
                self._use_pidfd = False  # a kernel without pidfds: poll instead
            else:
                return self._pidfd_future(loop, fd, job)
        return asyncio.ensure_future(self._poll_exit(job))

    def _pidfd_future(self, loop: asyncio.AbstractEventLoop, fd: int, job: _Job, *,
                      checked: bool = False) -> asyncio.Future:
        fut = loop.create_future()
        # Checked with the pidfd open, so the pid cannot be recycled between check and watch.
        if job.popen is None and not checked and not _alive(job.pid, job.create_time, self.store.dir(job.key)):
            os.close(fd)
            fut.set_result(None)
            return fut
        loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))

        def release(done: asyncio.Future) -> None:
            loop.remove_reader(fd)
            if done.cancelled():   # no longer watched: nothing else will close it
                os.close(fd)
            else:   # the wrapper exited: closed on the thread that reads its outcome
                job.spent_fds.append(fd)

        fut.add_done_callback(release)
        return fut

    async def _poll_exit(self, job: _Job) -> None:
        job_dir = self.store.dir(job.key)
        while (job.popen.poll() is None if job.popen is not None
               else _alive(job.pid, job.create_time, job_dir)):
            await asyncio.sleep(self._poll)

    def _delay(self, job: _Job) -> float | None:
        """Seconds to the next deadline, at most the poll interval; None: no deadline."""
        due = [t for t, pending in ((job.deadline, job.stop_reason is None),
                                    (_warn_at(job), not job.warned and job.stop_reason is None),
                                    (job.kill_at, not job.killed)) if t is not None and pending]
        if not due:
            return None
        return min(max(0.0, min(due) - self._mono()), self._poll)

    def _enforce(self, job: _Job) -> None:
        now = self._mono()
        warn_at = _warn_at(job)
        if warn_at is not None and not job.warned and job.stop_reason is None and now >= warn_at:
            self._warn(job)
        if job.stop_reason is None and job.deadline is not None and now >= job.deadline:
            log.info("job %d.%d: time limit reached", *job.key)
            self._begin_stop(job, signals.SIGTERM, job.launch.kill_grace, "timeout")
        if job.kill_at is not None and not job.killed and now >= job.kill_at:
            log.info("job %d.%d: grace over, killing it", *job.key)
            self._kill_now(job, job.stop_reason or "killed")

    def _warn(self, job: _Job) -> None:
        """--signal's warning before the time limit: to the batch shell alone (B:), whose
        pid is the wrapper's one child, or to the job's whole group as a stop signal goes."""
        job.warned = True
        sig = parse_signal(job.launch.warn_signal or "")
        if sig is None or job.pid is None:
            return
        log.info("job %d.%d: %s %.0f s before its time limit", *job.key, sig.name, job.launch.warn_time)
        if not job.launch.warn_batch:
            self._signal_group(job, sig)
            return
        try:
            for shell in psutil.Process(job.pid).children():
                os.kill(shell.pid, sig)
        except (psutil.Error, ProcessLookupError):
            pass

    def _begin_stop(self, job: _Job, sig: int, grace: float, reason: str) -> None:
        job.stop_reason = job.stop_reason or reason
        kill_at = self._mono() + max(0.0, grace)
        job.kill_at = kill_at if job.kill_at is None else min(job.kill_at, kill_at)
        self._signal_group(job, sig)
        if sig != signals.SIGCONT:
            self._signal_group(job, signals.SIGCONT)  # a stopped job gets the signal now
        self._save_record(job)
        job.wake.set()

    def _kill_now(self, job: _Job, reason: str) -> None:
        job.stop_reason = job.stop_reason or reason
        self._signal_group(job, signals.SIGKILL)
        job.killed = True
        self._save_record(job)
        job.wake.set()

    def _signal_group(self, job: _Job, sig: int) -> None:
        if job.pid is None:  # still spawning: sent as soon as the wrapper exists
            job.early.append(sig)
            return
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            log.warning("job %d.%d: cannot signal its processes: %s", *job.key, e.strerror)
        if self.cgroups.active:   # also the ones in sessions and groups of their own
            try:
                if sig == signals.SIGKILL:
                    self.cgroups.kill(job_name(*job.key))
                else:
                    self.cgroups.signal(job_name(*job.key), sig)
            except OSError as e:
                log.warning("job %d.%d: cannot signal its cgroup: %s", *job.key, e.strerror or e)

    # -- finishing ------------------------------------------------------------------------------

    async def _conclude(self, job: _Job) -> None:
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
        """Kill what is left in a job's cgroup, wait until it is empty (a job is over only
        then), take its last accounting and remove it."""
        cg = self.cgroups
        try:   # the usual case in one trip to a thread: nothing left, or gone at the first kill
            usage = await asyncio.to_thread(self._drain_now, name)
            if usage is not False:
                return usage
        except OSError as e:
            log.warning("cgroup %s: %s", name, e.strerror or e)
        delay, waited, warned = 0.005, 0.0, False
        while True:
            try:
                busy = await asyncio.to_thread(cg.populated, name)
                if busy:
                    await asyncio.to_thread(cg.kill, name)
            except OSError as e:
                log.warning("cgroup %s: %s", name, e.strerror or e)
                busy = False
            if not busy:
                break
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 1.0)
            if waited > 30 and not warned:
                log.warning("cgroup %s: processes survive SIGKILL (stuck in the kernel?); "
                            "the job ends once they are gone", name)
                warned = True
        try:
            usage = await asyncio.to_thread(self._usage.sample, name)
        except OSError:
            usage = self._usage.forget(name)
        self._usage.forget(name)
        for _ in range(50):   # a cgroup is busy for a moment after its last process exits
            try:
                if await asyncio.to_thread(cg.remove, name):
                    break
            except OSError as e:
                log.warning("cgroup %s: cannot remove it: %s", name, e.strerror or e)
                break
            await asyncio.sleep(0.02)
        return usage

    def _drain_now(self, name: str) -> "Usage | None | bool":
        """(thread) ``_drain`` without waiting: the usage once the cgroup is empty and
        removed, False while processes remain."""
        cg = self.cgroups
        if cg.populated(name):
            cg.kill(name)
            for _ in range(20):   # SIGKILLed processes exit within milliseconds
                time.sleep(0.001)
                if not cg.populated(name):
                    break
            else:
                return False
        usage = self._usage.sample(name)
        self._usage.forget(name)
        if not cg.remove(name):
            return False
        return usage

    def _outcome_saved(self, job: _Job, rc: int | None, usage: Usage | None = None) -> Outcome:
        """(thread) The ended wrapper's outcome, saved.  A wrapper that was not our child
        and wrote no status may have left processes in its group: they are swept (one that
        wrote its status went on to SIGKILL its whole group itself)."""
        _close_spent(job)
        status = self.store.status(job.key)
        if status is None and job.popen is None and job.pid is not None:
            procs.sweep_group(job.pid, job.create_time)
        outcome = self._outcome_from(job, status, rc, usage)
        self._save_outcome(job.key, outcome)
        return outcome

    def _outcome_from(self, job: _Job, status: dict | None, rc: int | None,
                      usage: Usage | None = None) -> Outcome:
        outcome = self._plain_outcome(job, status, rc)
        if usage is None:
            return outcome
        if usage.oom_kills and job.stop_reason is None and outcome.reason in ("exited", "lost"):
            # Slurm's OUT_OF_MEMORY reads ExitCode 0:125
            limit = f"{job.launch.mem_mb} MB" if job.launch.mem_mb else "memory"
            outcome = dataclasses.replace(
                outcome, exit_code=0, signal=OOM_SIGNAL, reason="oom",
                message=f"out of memory: the job's memory limit ({limit}) was reached and the "
                        f"kernel killed {usage.oom_kills} of its processes")
        return dataclasses.replace(outcome, max_rss=usage.max_rss, cpu_usec=usage.cpu_usec)

    def _plain_outcome(self, job: _Job, status: dict | None, rc: int | None) -> Outcome:
        if status is not None and isinstance(status.get("error"), str):
            return self._outcome(job, None, None, "launch_failed", status["error"])
        reason = job.stop_reason or ("lease_expired" if status is not None and status.get("lease_expired")
                                     else "exited")
        if status is not None and isinstance(status.get("exit_code"), int):
            sig = status.get("signal") if isinstance(status.get("signal"), int) else None
            return self._outcome(job, status["exit_code"], sig, reason, core=status.get("core") is True)
        if rc is not None and rc < 0:  # the wrapper itself was killed, normally by our SIGKILL
            return self._outcome(job, 0, -rc, reason)
        if rc is None and job.killed:  # adopted, and our SIGKILL ended it
            return self._outcome(job, 0, signals.SIGKILL, reason)
        detail = self.store.wrapper_error(job.key)
        return self._outcome(job, None, None, job.stop_reason or "lost",
                             "the job ended without recording an exit status"
                             + (f" ({detail})" if detail else ""))

    def _outcome(self, job: _Job, exit_code: int | None, sig: int | None, reason: str,
                 message: str | None = None, core: bool = False) -> Outcome:
        if message is None:
            if sig:
                try:
                    name = signals.Signals(sig).name
                except ValueError:
                    name = "unknown"
                message = f"killed by signal {sig} ({name})" + (", core dumped" if core else "")
            else:
                message = f"exited with code {exit_code}"
            if reason == "timeout":
                message = f"time limit of {format_duration(job.launch.time_limit)} reached; {message}"
            elif reason != "exited":
                message = f"{reason}; {message}"
        return Outcome(job.launch.job_id, job.launch.attempt, exit_code, sig, reason, message,
                       job.start_time, self._clock())

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

    def _save_record(self, job: _Job) -> None:
        if job.pid is None:  # still spawning: the record written after the spawn has it all
            return
        try:
            self.store.save_record(job.key, job.record())
        except OSError as e:
            log.error("job %d.%d: cannot save its record: %s", *job.key, e.strerror)


# -- processes ------------------------------------------------------------------------------------

def _alive(pid: int | None, create_time: float | None, job_dir: str) -> bool:
    """Is ``pid`` still this job's wrapper (running, and not a recycled pid)?"""
    if pid is None:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None:
            return abs(p.create_time() - create_time) < 0.1
        # Only the wrapper's pid file was left: a wrapper started on this directory, or one
        # the fork server forked (its command line) that existed when the file was written.
        cmdline = p.cmdline()
        if job_dir in cmdline:
            return True
        return (WRAPPER in cmdline
                and p.create_time() <= os.stat(os.path.join(job_dir, "wrapper.pid")).st_mtime + 0.1)
    except (psutil.Error, OSError):
        return False


def _close_spent(job: _Job) -> None:
    """Close the exited wrapper's pidfds (from the loop or a thread: each is popped once)."""
    while True:
        try:
            fd = job.spent_fds.pop()
        except IndexError:
            return
        os.close(fd)


def _warn_at(job: _Job) -> float | None:
    """When --signal's warning is due: warn_time seconds before the deadline."""
    if job.launch.warn_signal is None or job.deadline is None:
        return None
    return job.deadline - job.launch.warn_time


def _deadline(launch: Launch, started: float) -> float | None:
    """The monotonic time of the limit of a job started at monotonic time ``started``."""
    return None if launch.time_limit is None else started + launch.time_limit


def _reap_detached() -> None:
    _DETACHED[:] = [p for p in _DETACHED if p.poll() is None]


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
