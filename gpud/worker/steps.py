"""``gpuctl srun`` tasks on a worker: started as the job's user, output sent to the head.

Theory of operation
-------------------
A ``step`` command names a running allocation of this node (job, attempt), the command
line and how many tasks this node starts (``ntasks_per_node``) at which node rank.  Each
task is started the way the allocation's batch script or holder was
(``Executor.task_setup``): as the job's user with its groups, in the job's working
directory, with the allocation's environment (so ``CUDA_VISIBLE_DEVICES`` lists this
node's GPUs only), in a session and process group of its own, plus the per-task
variables torchrun and ``torch.distributed`` read (``task_env``, gpud.worker.stepenv).
srun's own environment is the base: the job's variables win over it.  The tasks run under
srun's resource limits (the step's ``rlimits``, as a batch script runs under sbatch's),
each clamped to the worker's own hard limit (``gpud.worker.rlimits``), set on the task's
shell while it waits at its gate (so nothing runs in the forked child).

``StepTasks`` here is the coordinator: it starts each task (its shell, gate, limits and
record: gpud.worker.stepproc), hands its output and input to the step's stream
(gpud.worker.stepstream: numbered items, kept until acknowledged, the ``WINDOW``), sends
the kept items again when acknowledgements stopped coming for ``RESEND_AFTER`` seconds,
and remembers an ended step for ``KEEP_ENDED`` seconds so a restarted head can still ask
for its output and exits.  When a task exits (its process group is then killed, as the
job wrapper does for batch scripts) its last items go out, then its ``step_exit``.

A step with ``pty`` runs its one task on a pseudo-terminal (``os.openpty``): the task is a
session leader with the terminal as its controlling terminal, so the line discipline
turns a typed Ctrl-C or Ctrl-Z into signals for the remote foreground job; ``step_resize``
{rows, cols} sets the window size (TIOCSWINSZ), and the kernel tells the foreground job
(SIGWINCH) (gpud.worker.stepterm).

``step_kill`` (a task of the step failed somewhere), a stop of the job (``signal``,
forwarded to the tasks) and the end of the allocation on this node (every task
SIGKILLed) end tasks.

Tasks are children of the worker, each in a session of its own, outside the job's process
group.  A restarted worker (``recover``) kills what is left of the tasks a previous one
recorded and reports each as ended with the reason, so srun ends too; the record and the
gate make sure no task runs unrecorded (gpud.worker.stepproc).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal as signals
import subprocess
import time
from collections import deque
from typing import Any, Callable

from ..bus.messages import StepExit, StepStart
from . import rlimits
from .stepenv import task_env
from .stepproc import (SHELL, TASK_SHELL, TASK_SHELL_PTY, TASK_SHELL_STDIN, kill_left, killpg,
                       open_fd_gate, open_gate, read_record, remove, save_record, write_pid)
from .stepstream import READ_CHUNK, Emit, Step, Task
from .stepterm import set_size, terminal_child

log = logging.getLogger("gpud.worker.steps")

RESEND_AFTER = 5.0            # seconds without an acknowledgement before kept output goes again
KEEP_ENDED = 300.0            # seconds an ended step's output and exits can still be asked for


class StepTasks:
    """This node's srun tasks; ``setup(job, attempt)`` is Executor.task_setup."""

    def __init__(self, node: str, setup: Callable[[int, int], Any], emit: Emit, *,
                 state_dir: str | None = None) -> None:
        """``state_dir``: where running tasks are recorded for ``recover`` (None: nowhere)."""
        self.node = node
        self._setup = setup
        self._emit = emit
        self._dir = state_dir
        self._steps: dict[tuple[int, int, int], Step] = {}
        self._ended: dict[tuple[int, int, int], Step] = {}   # ended steps a head may ask again about
        self._runs: set[asyncio.Task] = set()
        self._done: deque = deque(maxlen=4096)   # steps that ended: a repeated command is ignored
        self._ticker: asyncio.Task | None = None

    # -- commands -----------------------------------------------------------------------------

    async def start(self, cmd: StepStart) -> None:
        """A ``step`` command."""
        key = (cmd.job, cmd.attempt, cmd.step)
        if key in self._steps or key in self._done:
            return   # a repeated command
        per_node, node_rank = cmd.ntasks_per_node, cmd.node_rank
        step = self._steps[key] = Step(*key, self._emit, per_node=per_node, pty=cmd.pty,
                                       stdin=cmd.stdin and node_rank == 0, rows=cmd.rows, cols=cmd.cols,
                                       acked_at=time.monotonic())
        step.room.set()
        if step.stdin:
            step.inputs = asyncio.Queue()
        self._tick()
        first = node_rank * per_node
        try:
            setup = await asyncio.to_thread(self._setup, key[0], key[1])
        except Exception as e:   # noqa: BLE001 - the step is refused, the worker goes on
            setup, why = None, str(e) or type(e).__name__
        else:
            why = f"job {key[0]} does not run on node {self.node} (ended, or not started yet)"
        if setup is None:
            log.warning("job %d step %d refused on %s: %s", key[0], key[2], self.node, why)
            refusal = step.exit(None, None, None, why)
            step.exits.append(refusal)
            await self._emit(refusal)
            self._end(step)
            return
        # Worked out here, once; set on each task's shell while it waits at its gate.
        step.limits, unknown = rlimits.plan(cmd.rlimits)
        if unknown:
            log.warning("job %d step %d: no %s limit on this node; ignored", key[0], key[2], ", ".join(unknown))
        base = {**cmd.env, **setup.env}
        for local in range(per_node):
            env = task_env(base, rank=first + local, local=local, per_node=per_node, node_rank=node_rank,
                           nnodes=cmd.nnodes, step=key[2], master_addr=cmd.master_addr,
                           master_port=cmd.master_port, nodelist=cmd.nodelist)
            task = Task(first + local)
            step.tasks.append(task)
            run = asyncio.get_running_loop().create_task(self._run(step, task, list(cmd.argv), setup, env),
                                                         name=f"step {key[0]}.{key[2]} task {task.rank}")
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
        log.info("job %d step %d: %d task(s) started on %s (ranks %d-%d)", key[0], key[2], per_node,
                 self.node, first, first + per_node - 1)

    # -- the stream's other direction, handed to the step (gpud.worker.stepstream) -----------

    async def ack(self, job: int, attempt: int, step_id: int, upto: int, resend: bool) -> bool:
        """``step_ack``: the reader has every item before ``upto``; with ``resend``, send
        the kept ones from there again (and the exits)."""
        step = self._steps.get((job, attempt, step_id)) or self._ended.get((job, attempt, step_id))
        if step is None:
            return False
        await step.ack(upto, resend)
        return True

    async def write_input(self, job: int, attempt: int, step_id: int, writer: str, seq: int,
                          data: str, eof: bool) -> bool:
        """``step_input``: bytes (latin-1 text) for task 0, once each, in each writer's order."""
        step = self._steps.get((job, attempt, step_id))
        return step is not None and step.take_input(writer, seq, data, eof)

    def resize(self, job: int, attempt: int, step_id: int, rows: int, cols: int) -> bool:
        step = self._steps.get((job, attempt, step_id))
        if step is None:
            return False
        step.resize(rows, cols)
        return True

    def _tick(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._ticks(), name="step resends")

    async def _ticks(self) -> None:
        """Kept output goes again when acknowledgements stopped coming; ended steps are forgotten."""
        while self._steps or self._ended:
            await asyncio.sleep(RESEND_AFTER / 2)
            now = time.monotonic()
            for step in list(self._steps.values()) + list(self._ended.values()):
                if step.kept and now - step.acked_at > RESEND_AFTER:
                    await step.resend(step.acked)
            for key, step in list(self._ended.items()):
                if step.ended_at is not None and now - step.ended_at > KEEP_ENDED:
                    del self._ended[key]

    def _end(self, step: Step) -> None:
        self._steps.pop(step.key, None)
        self._done.append(step.key)
        step.ended_at = time.monotonic()
        self._ended[step.key] = step

    def kill_step(self, job: int, attempt: int, step_id: int) -> bool:
        step = self._steps.get((job, attempt, step_id))
        if step is None:
            return False
        step.killed = True
        step.update_room()
        self._signal(step, signals.SIGKILL)
        return True

    def signal_job(self, job: int, attempt: int | None, sig: int) -> int:
        """``sig`` to every task of the job's steps (of ``attempt``, or all); how many steps."""
        steps = [s for s in self._steps.values() if s.job == job and attempt in (None, s.attempt)]
        for s in steps:
            if sig == signals.SIGKILL:
                s.killed = True
                s.update_room()
            self._signal(s, sig)
        return len(steps)

    def running(self) -> int:
        return sum(1 for s in self._steps.values() for t in s.tasks if t.proc and t.proc.returncode is None)

    async def recover(self) -> int:
        """At start: kill the tasks a previous worker left (their pipes died with it) and
        report each as ended; how many records were found."""
        if self._dir is None:
            return 0
        try:
            names = sorted(os.listdir(self._dir))   # a .tmp left half-way is read too
        except FileNotFoundError:
            return 0
        except OSError as e:   # the worker runs on without them; say why once
            log.error("cannot read srun task records in %s: %s", self._dir, e)
            return 0
        for name in names:
            path = os.path.join(self._dir, name)
            rec = read_record(path)
            if rec is None:
                log.warning("removing unreadable srun task record %s", path)
            else:
                if rec["pid"] is None:   # recorded, not started: its shell never got past the gate
                    killed, why = False, f"the worker on {self.node} restarted as the task started; it did not run"
                else:
                    killed = await asyncio.to_thread(kill_left, rec["pid"], rec["create_time"])
                    why = (f"the worker on {self.node} restarted while the task ran; "
                           + ("it was killed (its output could not be read any more)" if killed
                              else "its status is lost"))
                log.warning("job %d step %d task %d: %s", rec["job"], rec["step"], rec["rank"], why)
                await self._emit(StepExit(rec["job"], rec["attempt"], rec["step"], rank=rec["rank"],
                                          signal=int(signals.SIGKILL) if killed else None, message=why))
            remove(path)
        return len(names)

    async def _confine(self, step: Step, task: Task, setup: Any) -> bool:
        """Move the task, still waiting at its gate, into the step's cgroup under its job's
        (Executor.step_cgroup); False (it must not run) when that fails."""
        join = getattr(setup, "step_cgroup", None)
        if join is None or task.proc is None:
            return True
        try:
            paths = await asyncio.to_thread(join, step.step)
            for path in paths:
                await asyncio.to_thread(write_pid, path, task.proc.pid)
        except OSError as e:
            why = f"cannot join the job's cgroup: {e.strerror or e}"
            log.warning("job %d step %d: %s", step.job, step.step, why)
            await step.add(task.rank, 2, [f"srun: error: {why}\n"])
            return False
        return True

    async def close(self) -> None:
        """Stop reading (the worker is stopping); tasks keep running and end with their job."""
        runs = list(self._runs) + ([self._ticker] if self._ticker is not None else [])
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)

    # -- one task -------------------------------------------------------------------------------

    async def _run(self, step: Step, task: Task, argv: list[str], setup: Any, env: dict[str, str]) -> None:
        code, sig, message = None, None, None
        gate: int | None = None
        feeder: asyncio.Task | None = None
        takes_input = step.stdin and task.rank == 0
        try:
            extra: dict[str, Any] = {}
            if setup.switch_user:
                extra = {"user": setup.uid, "group": setup.gid, "extra_groups": setup.groups}
            task.record = self._save(step, task)      # before it can run: see the module's doc
            # TASK_SHELL changes directory as the user (subprocess's cwd= would do it as root,
            # before the switch), once the record with the pid is written.
            if step.pty:
                task.master, slave = os.openpty()
                set_size(task.master, step.rows, step.cols)
                gate_r, gate = os.pipe()
                try:
                    task.proc = await asyncio.create_subprocess_exec(
                        SHELL, "-c", TASK_SHELL_PTY, setup.work_dir, *argv, stdin=slave, stdout=slave,
                        stderr=slave, cwd="/", env=env, start_new_session=True, pass_fds=(3,),
                        preexec_fn=terminal_child(gate_r), **extra)
                finally:
                    os.close(slave)
                    os.close(gate_r)
            else:
                task.proc = await asyncio.create_subprocess_exec(
                    SHELL, "-c", TASK_SHELL_STDIN if takes_input else TASK_SHELL, setup.work_dir, *argv,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    cwd="/", env=env, start_new_session=True, limit=READ_CHUNK,
                    **extra)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            message = f"cannot run {argv[0]}: {getattr(e, 'strerror', None) or e}"
            code = 127 if isinstance(e, FileNotFoundError) else 126
            await step.add(task.rank, 2, [f"srun: error: {message}\n"])
            if task.record is not None:
                remove(task.record)
            for fd in (task.master, gate):
                if fd is not None:
                    os.close(fd)
            task.master = None
        else:
            task.record = self._save(step, task) or task.record
            if step.killed:
                killpg(task.proc.pid, signals.SIGKILL)
            elif not await self._confine(step, task, setup):
                killpg(task.proc.pid, signals.SIGKILL)
            elif step.limits and task.proc.returncode is None:   # at its gate: the command starts under them
                warned: list[str] = []
                rlimits.apply_to(task.proc.pid, step.limits, warned.append)
                if warned:
                    await step.add(task.rank, 2, [f"srun: warning: {line}\n" for line in warned])
            if gate is not None:
                open_fd_gate(gate)
            else:
                open_gate(task.proc, close=not takes_input)
            if takes_input:
                feeder = asyncio.get_running_loop().create_task(step.feed(task))
            if task.master is not None:
                await asyncio.gather(step.read_terminal(task), self._reap(task))
            else:
                await asyncio.gather(step.read(task, task.proc.stdout, 1),
                                     step.read(task, task.proc.stderr, 2), self._reap(task))
            rc = task.proc.returncode
            code, sig = (0, -rc) if rc is not None and rc < 0 else (rc, None)
            if task.record is not None:
                remove(task.record)
        if feeder is not None:
            feeder.cancel()
        if task.master is not None:
            os.close(task.master)
            task.master = None
        await step.flush()
        ended = step.exit(task.rank, code, sig, message)
        step.exits.append(ended)
        await self._emit(ended)
        step.ended += 1
        if step.ended == len(step.tasks):
            self._end(step)

    async def _reap(self, task: Task) -> None:
        assert task.proc is not None
        await task.proc.wait()
        killpg(task.proc.pid, signals.SIGKILL)   # what it left behind holds our pipes open

    def _save(self, step: Step, task: Task) -> str | None:
        """Record a task (see gpud.worker.stepproc): before it starts, then started."""
        if self._dir is None:
            return None
        return save_record(self._dir, step.job, step.attempt, step.step, task.rank,
                           task.proc.pid if task.proc is not None else None)

    def _signal(self, step: Step, sig: int) -> None:
        for t in step.tasks:
            if t.proc is not None and t.proc.returncode is None:
                killpg(t.proc.pid, sig)
                if sig not in (signals.SIGKILL, signals.SIGCONT):
                    killpg(t.proc.pid, signals.SIGCONT)
