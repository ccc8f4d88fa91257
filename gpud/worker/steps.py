"""``gpuctl srun`` tasks on a worker: started as the job's user, output sent to the head.

Theory of operation
-------------------
A ``step`` command names a running allocation of this node (job, attempt), the command
line and how many tasks this node starts (``ntasks_per_node``) at which node rank.  Each
task is started the way the allocation's batch script or holder was
(``Executor.task_setup``): as the job's user with its groups, in the job's working
directory, with the allocation's environment (so ``CUDA_VISIBLE_DEVICES`` lists this
node's GPUs only), in a session and process group of its own, plus the per-task
variables torchrun and ``torch.distributed`` read (``task_env``).  srun's own environment
is the base: the job's variables win over it.  The tasks run under srun's resource limits
(the step's ``rlimits``, as a batch script runs under sbatch's), each clamped to the
worker's own hard limit (``gpud.worker.rlimits``), set in the child before exec.

Output is read in chunks, cut into lines (a line longer than ``MAX_LINE`` is split) and
sent as ``step_output`` batches of whole lines, at most ``BATCH_BYTES`` each.  Every item
(one line, or one chunk of a terminal's bytes) has a number, counted per step on this
node from 0; a batch says the number of its first item (``first``).  Sent items are kept
until the head acknowledges them (``step_ack`` {next}: the reader has everything before
``next``), and readers stop reading while ``WINDOW`` bytes are sent and not acknowledged
or wait to be sent: a slow terminal at the far end slows the task down, nothing is
buffered without end.  ``step_ack`` with ``resend`` asks for everything kept from
``next`` on again (a restarted head, or a gap it saw), with the exits; when acknowledgements
stop coming for ``RESEND_AFTER`` seconds the kept items go out again by themselves.  So a
head restart or a broker blip loses nothing and, with the head dropping numbers it has,
doubles nothing.  When a task exits (its process group is then killed, as the job wrapper
does for batch scripts) its last items go out, then its ``step_exit`` with the number
after them (``next``): the head never ends a step before it has the output before the exit.

Input goes to task 0 only.  ``step_input`` {writer, seq, data, eof} chunks are numbered
per writer (srun, sattach); they are written in order, once each (repeats are dropped,
early ones wait for the gap), and what each writer has had written is reported back in
``step_output``'s ``input`` {writer: next seq}.  ``data`` is bytes as latin-1 text.

A step with ``pty`` runs its one task on a pseudo-terminal (``os.openpty``): the task is a
session leader with the terminal as its controlling terminal, so the line discipline
turns a typed Ctrl-C or Ctrl-Z into signals for the remote foreground job; its output
goes out as raw bytes (stream 3, latin-1 text) as soon as it is read; ``step_resize``
{rows, cols} sets the window size (TIOCSWINSZ), and the kernel tells the foreground job
(SIGWINCH).

``step_kill`` (a task of the step failed somewhere), a stop of the job (``signal``,
forwarded to the tasks) and the end of the allocation on this node (every task
SIGKILLed) end tasks.

Tasks are children of the worker, each in a session of its own, so they are outside the
job's process group: the executor's end of the allocation would not reach them.  A file
per task under ``state_dir`` (pid and process start time) outlives the worker; a
restarted worker (``recover``) kills what is left of those tasks, whose output nobody can
read any more, and reports each as ended with the reason, so srun ends too.  The file is
written before the task is started and again with its pid, and the task's shell waits on
its standard input until then: a worker that dies in between leaves a record without a
pid, and a task that finds its input closed exits (125) without running the command, so
no task runs unrecorded and every recorded one is reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal as signals
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import psutil

from ..bus.messages import Body, StepExit, StepOutput, StepStart
from . import procs, rlimits
from .jobstore import read_json, write_file
from .stepterm import set_size as _set_size, terminal_child as _terminal_child, write_all as _write_all

__all__ = ["StepTasks", "task_env"]

log = logging.getLogger("gpud.worker.steps")

READ_CHUNK = 64 << 10
MAX_LINE = 64 << 10           # longer lines are sent in pieces
BATCH_BYTES = 64 << 10        # at most this much text per step_output message
WINDOW = 1 << 20              # readers pause while this much output is unacknowledged or unsent
FLUSH_EVERY = 0.05            # seconds output may wait to share a message with more
TERMINAL_LINGER = 1.0         # seconds a terminal is read after its task exited
RESEND_AFTER = 5.0            # seconds without an acknowledgement before kept output goes again
KEEP_ENDED = 300.0            # seconds an ended step's output and exits can still be asked for
MAX_WRITERS = 16              # input writers remembered per step
MAX_HELD_INPUT = 64           # input chunks held per step waiting for an earlier one
SHELL = "/bin/sh"
PTY_STREAM = 3                # a terminal's raw bytes, as latin-1 text
# A task's shell: wait at the gate (a line on its input), enter the work directory as the
# user, become the command with /dev/null for input.  End of input without the line: the
# worker died before recording the task's pid, so it does not run.
TASK_SHELL = 'read -r _ || exit 125; cd -- "$0" || exit 126; exec "$@" </dev/null'
# Task 0 of a step with input: the rest of the pipe is its standard input.
TASK_SHELL_STDIN = 'read -r _ || exit 125; cd -- "$0" || exit 126; exec "$@"'
# On a terminal the gate is descriptor 3, closed before the command.
TASK_SHELL_PTY = 'read -r _ <&3 || exit 125; exec 3<&-; cd -- "$0" || exit 126; exec "$@"'

Emit = Callable[[Body], Awaitable[None]]   # a step_output or step_exit, to the head


def task_env(base: dict[str, str], *, rank: int, local: int, per_node: int, node_rank: int, nnodes: int,
             step: int, master_addr: str, master_port: int, nodelist: str) -> dict[str, str]:
    """One task's environment: ``base`` plus its place in the step, under gpud's names,
    the ones torchrun and torch.distributed read, and Slurm's when the job has them."""
    world = per_node * nnodes
    env = dict(base)
    env.update({
        "GPUD_PROCID": str(rank), "GPUD_LOCALID": str(local), "GPUD_NTASKS": str(world),
        "GPUD_NTASKS_PER_NODE": str(per_node), "GPUD_NODEID": str(node_rank), "GPUD_NNODES": str(nnodes),
        "GPUD_STEP_ID": str(step), "GPUD_JOB_NODELIST": nodelist,
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(per_node), "NODE_RANK": str(node_rank), "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    })
    if "SLURM_JOB_ID" in base:
        env.update({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NTASKS": str(world),
                    "SLURM_NODEID": str(node_rank), "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step)})
    return env


@dataclass(eq=False)
class _Task:
    rank: int
    proc: asyncio.subprocess.Process | None = None
    record: str | None = None     # its file under state_dir while it runs
    master: int | None = None     # a terminal's master side (pty steps)


@dataclass(eq=False)
class _Step:
    job: int
    attempt: int
    step: int
    per_node: int = 1
    pty: bool = False
    stdin: bool = False           # task 0 runs here and takes input
    tasks: list[_Task] = field(default_factory=list)
    pending: list[list] = field(default_factory=list)   # [rank, stream, text]
    pending_bytes: int = 0
    next_index: int = 0           # the number of the next item to send
    kept: deque = field(default_factory=deque)          # (index, [rank, stream, text]) not acknowledged
    kept_bytes: int = 0
    acked: int = 0
    acked_at: float = 0.0         # monotonic: the last acknowledgement (or send) that moved things
    seq: int = 0
    room: asyncio.Event = field(default_factory=asyncio.Event)   # set while below WINDOW
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    killed: bool = False
    ended: int = 0                # tasks whose step_exit went out
    ended_at: float | None = None
    exits: list[StepExit] = field(default_factory=list)  # the step_exits sent, for a resend
    input_next: dict[str, int] = field(default_factory=dict)   # writer -> next seq to write
    held: dict[tuple[str, int], tuple[str, bool]] = field(default_factory=dict)
    inputs: asyncio.Queue | None = None                 # (data, eof) in order, for task 0
    rows: int = 24
    cols: int = 80
    limits: list = field(default_factory=list)          # rlimits.plan: srun's limits, set in each task

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job, self.attempt, self.step)

    def output(self, first: int, lines: list[list], seq: int = 0) -> StepOutput:
        """A step_output of ``lines`` ([rank, stream, text]) numbered from ``first``."""
        return StepOutput(self.job, self.attempt, self.step, first=first, lines=tuple(tuple(x) for x in lines),
                          seq=seq, input=dict(self.input_next), tasks=self.per_node, pty=self.pty)

    def exit(self, rank: int | None, code: int | None, sig: int | None, message: str | None) -> StepExit:
        return StepExit(self.job, self.attempt, self.step, rank=rank, exit_code=code, signal=sig, message=message,
                        next=self.next_index, tasks=self.per_node, pty=self.pty)

    def update_room(self) -> None:
        # A killed step's last output never waits: its tasks are gone, only the pipes'
        # contents are left, and its exits must go out even if nobody reads.
        if self.killed or self.pending_bytes + self.kept_bytes < WINDOW:
            self.room.set()
        else:
            self.room.clear()


class StepTasks:
    """This node's srun tasks; ``setup(job, attempt)`` is Executor.task_setup."""

    def __init__(self, node: str, setup: Callable[[int, int], Any], emit: Emit, *,
                 state_dir: str | None = None) -> None:
        """``state_dir``: where running tasks are recorded for ``recover`` (None: nowhere)."""
        self.node = node
        self._setup = setup
        self._emit = emit
        self._dir = state_dir
        self._steps: dict[tuple[int, int, int], _Step] = {}
        self._ended: dict[tuple[int, int, int], _Step] = {}   # ended steps a head may ask again about
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
        step = self._steps[key] = _Step(*key, per_node=per_node, pty=cmd.pty, stdin=cmd.stdin and node_rank == 0,
                                        rows=cmd.rows, cols=cmd.cols, acked_at=time.monotonic())
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
        # Worked out here, once: the task's child only calls setrlimit (see _limits_child).
        step.limits, unknown = rlimits.plan(cmd.rlimits)
        if unknown:
            log.warning("job %d step %d: no %s limit on this node; ignored", key[0], key[2], ", ".join(unknown))
        base = {**cmd.env, **setup.env}
        for local in range(per_node):
            env = task_env(base, rank=first + local, local=local, per_node=per_node, node_rank=node_rank,
                           nnodes=cmd.nnodes, step=key[2], master_addr=cmd.master_addr,
                           master_port=cmd.master_port, nodelist=cmd.nodelist)
            task = _Task(first + local)
            step.tasks.append(task)
            run = asyncio.get_running_loop().create_task(self._run(step, task, list(cmd.argv), setup, env),
                                                         name=f"step {key[0]}.{key[2]} task {task.rank}")
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
        log.info("job %d step %d: %d task(s) started on %s (ranks %d-%d)", key[0], key[2], per_node,
                 self.node, first, first + per_node - 1)

    # -- the stream's other direction: acknowledgements, input, window size -------------------

    async def ack(self, job: int, attempt: int, step_id: int, upto: int, resend: bool) -> bool:
        """``step_ack``: the reader has every item before ``upto``; with ``resend``, send
        the kept ones from there again (and the exits)."""
        step = self._steps.get((job, attempt, step_id)) or self._ended.get((job, attempt, step_id))
        if step is None:
            return False
        moved = False
        while step.kept and step.kept[0][0] < upto:
            step.kept_bytes -= len(step.kept.popleft()[1][2])
            moved = True
        if upto > step.acked:
            step.acked = upto
        if moved:
            step.acked_at = time.monotonic()
            step.update_room()
        if resend:
            await self._resend(step, upto)
        return True

    async def _resend(self, step: _Step, start: int) -> None:
        async with step.send_lock:
            items = [(i, item) for i, item in step.kept if i >= start]
            while items:
                batch, size = [], 0
                while items and (not batch or size + len(items[0][1][2]) <= BATCH_BYTES):
                    i, item = items.pop(0)
                    batch.append((i, item))
                    size += len(item[2])
                await self._emit(step.output(batch[0][0], [item for _, item in batch]))
            if not step.kept:   # tell the head where the stream stands, even with nothing to send
                await self._emit(step.output(step.next_index, []))
            step.acked_at = time.monotonic()
        for sent in step.exits:
            await self._emit(sent)

    async def write_input(self, job: int, attempt: int, step_id: int, writer: str, seq: int,
                          data: str, eof: bool) -> bool:
        """``step_input``: bytes (latin-1 text) for task 0, once each, in each writer's order."""
        step = self._steps.get((job, attempt, step_id))
        if step is None or step.inputs is None:
            return False
        if writer not in step.input_next:
            if len(step.input_next) >= MAX_WRITERS:
                log.warning("job %d step %d: input from too many writers; %s dropped", job, step_id, writer)
                return False
            step.input_next[writer] = 0
        nxt = step.input_next[writer]
        if seq < nxt:
            return True    # a repeat
        if seq > nxt:      # an earlier chunk is still on its way
            if len(step.held) < MAX_HELD_INPUT:
                step.held[(writer, seq)] = (data, eof)
            return True
        while True:
            step.inputs.put_nowait((data, eof))
            nxt += 1
            if (writer, nxt) not in step.held:
                break
            data, eof = step.held.pop((writer, nxt))
        step.input_next[writer] = nxt
        return True

    def resize(self, job: int, attempt: int, step_id: int, rows: int, cols: int) -> bool:
        step = self._steps.get((job, attempt, step_id))
        if step is None:
            return False
        step.rows, step.cols = rows, cols
        for t in step.tasks:
            if t.master is not None:
                _set_size(t.master, rows, cols)
        return True

    async def _feed(self, step: _Step, task: _Task) -> None:
        """Task 0's input, written in order as it comes; each chunk reported once written."""
        assert step.inputs is not None and task.proc is not None
        loop = asyncio.get_running_loop()
        while True:
            data, eof = await step.inputs.get()
            raw = data.encode("latin-1", errors="replace")
            try:
                if task.master is not None:
                    if raw:
                        await _write_all(loop, task.master, raw)
                elif task.proc.stdin is not None:
                    if raw:
                        task.proc.stdin.write(raw)
                        await task.proc.stdin.drain()
                    if eof:
                        task.proc.stdin.close()
            except (OSError, ConnectionResetError, BrokenPipeError):
                pass   # the task stopped reading (or ended); what it did not take is gone with it
            if step.inputs.empty():
                await self._emit(step.output(step.next_index, []))

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
                    await self._resend(step, step.acked)
            for key, step in list(self._ended.items()):
                if step.ended_at is not None and now - step.ended_at > KEEP_ENDED:
                    del self._ended[key]

    def _end(self, step: _Step) -> None:
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
            rec = _read_record(path)
            if rec is None:
                log.warning("removing unreadable srun task record %s", path)
            else:
                if rec["pid"] is None:   # recorded, not started: its shell never got past the gate
                    killed, why = False, f"the worker on {self.node} restarted as the task started; it did not run"
                else:
                    killed = await asyncio.to_thread(_kill_left, rec["pid"], rec["create_time"])
                    why = (f"the worker on {self.node} restarted while the task ran; "
                           + ("it was killed (its output could not be read any more)" if killed
                              else "its status is lost"))
                log.warning("job %d step %d task %d: %s", rec["job"], rec["step"], rec["rank"], why)
                await self._emit(StepExit(rec["job"], rec["attempt"], rec["step"], rank=rec["rank"],
                                          signal=int(signals.SIGKILL) if killed else None, message=why))
            _remove(path)
        return len(names)

    async def _confine(self, step: _Step, task: _Task, setup: Any) -> bool:
        """Move the task, still waiting at its gate, into the step's cgroup under its job's
        (Executor.step_cgroup); False (it must not run) when that fails."""
        join = getattr(setup, "step_cgroup", None)
        if join is None or task.proc is None:
            return True
        try:
            paths = await asyncio.to_thread(join, step.step)
            for path in paths:
                await asyncio.to_thread(_write_pid, path, task.proc.pid)
        except OSError as e:
            why = f"cannot join the job's cgroup: {e.strerror or e}"
            log.warning("job %d step %d: %s", step.job, step.step, why)
            await self._add(step, task.rank, 2, [f"srun: error: {why}\n"])
            return False
        return True

    async def close(self) -> None:
        """Stop reading (the worker is stopping); tasks keep running and end with their job."""
        runs = list(self._runs) + ([self._ticker] if self._ticker is not None else [])
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)

    # -- one task -------------------------------------------------------------------------------

    async def _run(self, step: _Step, task: _Task, argv: list[str], setup: Any, env: dict[str, str]) -> None:
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
                _set_size(task.master, step.rows, step.cols)
                gate_r, gate = os.pipe()
                try:
                    task.proc = await asyncio.create_subprocess_exec(
                        SHELL, "-c", TASK_SHELL_PTY, setup.work_dir, *argv, stdin=slave, stdout=slave,
                        stderr=slave, cwd="/", env=env, start_new_session=True, pass_fds=(3,),
                        preexec_fn=_limits_child(step.limits, _terminal_child(gate_r)), **extra)
                finally:
                    os.close(slave)
                    os.close(gate_r)
            else:
                task.proc = await asyncio.create_subprocess_exec(
                    SHELL, "-c", TASK_SHELL_STDIN if takes_input else TASK_SHELL, setup.work_dir, *argv,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    cwd="/", env=env, start_new_session=True, limit=READ_CHUNK,
                    preexec_fn=_limits_child(step.limits), **extra)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            message = f"cannot run {argv[0]}: {getattr(e, 'strerror', None) or e}"
            code = 127 if isinstance(e, FileNotFoundError) else 126
            await self._add(step, task.rank, 2, [f"srun: error: {message}\n"])
            if task.record is not None:
                _remove(task.record)
            for fd in (task.master, gate):
                if fd is not None:
                    os.close(fd)
            task.master = None
        else:
            task.record = self._save(step, task) or task.record
            if step.killed:
                _killpg(task.proc.pid, signals.SIGKILL)
            elif not await self._confine(step, task, setup):
                _killpg(task.proc.pid, signals.SIGKILL)
            if gate is not None:
                _open_fd_gate(gate)
            else:
                _open_gate(task.proc, close=not takes_input)
            if takes_input:
                feeder = asyncio.get_running_loop().create_task(self._feed(step, task))
            if task.master is not None:
                await asyncio.gather(self._read_terminal(step, task), self._reap(task))
            else:
                await asyncio.gather(self._read(step, task, task.proc.stdout, 1),
                                     self._read(step, task, task.proc.stderr, 2), self._reap(task))
            rc = task.proc.returncode
            code, sig = (0, -rc) if rc is not None and rc < 0 else (rc, None)
            if task.record is not None:
                _remove(task.record)
        if feeder is not None:
            feeder.cancel()
        if task.master is not None:
            os.close(task.master)
            task.master = None
        await self._flush(step)
        ended = step.exit(task.rank, code, sig, message)
        step.exits.append(ended)
        await self._emit(ended)
        step.ended += 1
        if step.ended == len(step.tasks):
            self._end(step)

    async def _reap(self, task: _Task) -> None:
        assert task.proc is not None
        await task.proc.wait()
        _killpg(task.proc.pid, signals.SIGKILL)   # what it left behind holds our pipes open

    async def _read_terminal(self, step: _Step, task: _Task) -> None:
        """A terminal's bytes as they come, until its last holder closes it (EIO)."""
        assert task.master is not None and task.proc is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                    os.fdopen(os.dup(task.master), "rb", buffering=0))
        try:
            while True:
                try:
                    if task.proc.returncode is None:
                        chunk = await reader.read(READ_CHUNK)
                    else:   # exited: what is left, without waiting on what it left behind
                        chunk = await asyncio.wait_for(reader.read(READ_CHUNK), TERMINAL_LINGER)
                except (OSError, asyncio.TimeoutError):   # EIO: every slave side is closed
                    break
                if not chunk:
                    break
                await self._add(step, task.rank, PTY_STREAM, [chunk.decode("latin-1")])
        finally:
            transport.close()

    async def _read(self, step: _Step, task: _Task, stream: asyncio.StreamReader | None, fd: int) -> None:
        if stream is None:
            return
        partial = b""
        while True:
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                break
            *lines, partial = (partial + chunk).split(b"\n")
            while len(partial) >= MAX_LINE:
                lines.append(partial[:MAX_LINE])
                partial = partial[MAX_LINE:]
            texts = [piece for line in lines for piece in _pieces(line)]
            if texts:
                await self._add(step, task.rank, fd, texts)
        if partial:
            await self._add(step, task.rank, fd, [partial.decode(errors="replace") + "\n"])

    # -- output ---------------------------------------------------------------------------------

    async def _add(self, step: _Step, rank: int, fd: int, texts: list[str]) -> None:
        await step.room.wait()
        first = not step.pending
        step.pending.extend([rank, fd, text] for text in texts)
        step.pending_bytes += sum(len(t) for t in texts)
        step.update_room()
        if step.pending_bytes >= BATCH_BYTES:
            await self._flush(step)
        elif first:   # a terminal's echo goes at once; lines may wait a little for company
            asyncio.get_running_loop().call_later(
                0 if step.pty else FLUSH_EVERY, lambda: asyncio.ensure_future(self._flush(step)))

    async def _flush(self, step: _Step) -> None:
        async with step.send_lock:   # batches go out in order, each numbered once
            while step.pending:
                n, size = 0, 0
                while n < len(step.pending) and (n == 0 or size + len(step.pending[n][2]) <= BATCH_BYTES):
                    size += len(step.pending[n][2])
                    n += 1
                batch, step.pending = step.pending[:n], step.pending[n:]
                step.pending_bytes -= size
                step.seq += 1
                first = step.next_index
                step.next_index += len(batch)
                if not step.kept:
                    step.acked_at = time.monotonic()
                step.kept.extend(zip(range(first, first + len(batch)), batch))
                step.kept_bytes += size
                await self._emit(step.output(first, batch, step.seq))
            step.update_room()

    def _save(self, step: _Step, task: _Task) -> str | None:
        """Record a task for a worker that may come after this one: before it starts
        (no pid yet), then started."""
        if self._dir is None:
            return None
        path = os.path.join(self._dir, f"{step.job}.{step.attempt}.{step.step}.{task.rank}")
        pid = task.proc.pid if task.proc is not None else None
        rec = {"job": step.job, "attempt": step.attempt, "step": step.step, "rank": task.rank,
               "pid": pid, "create_time": procs.create_time(pid) if pid is not None else None}
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            write_file(path, json.dumps(rec).encode(), 0o600)
        except OSError as e:   # the task runs; only a worker restart would miss it
            log.warning("job %d step %d: cannot record task %d: %s", step.job, step.step, task.rank, e)
            return None
        return path

    def _signal(self, step: _Step, sig: int) -> None:
        for t in step.tasks:
            if t.proc is not None and t.proc.returncode is None:
                _killpg(t.proc.pid, sig)
                if sig not in (signals.SIGKILL, signals.SIGCONT):
                    _killpg(t.proc.pid, signals.SIGCONT)


def _pieces(line: bytes) -> list[str]:
    """One line of output as text, cut into MAX_LINE pieces, each ending in a newline."""
    if len(line) <= MAX_LINE:
        return [line.decode(errors="replace") + "\n"]
    return [line[i:i + MAX_LINE].decode(errors="replace") + "\n" for i in range(0, len(line), MAX_LINE)]


def _read_record(path: str) -> dict | None:
    rec = read_json(path)
    if rec is None or not all(type(rec.get(k)) is int and rec[k] >= 0 for k in ("job", "attempt", "step", "rank")):
        return None
    if not (rec.get("pid") is None or (type(rec["pid"]) is int and rec["pid"] > 0)):
        return None
    if not isinstance(rec.get("create_time"), (int, float)):
        rec["create_time"] = None
    return rec


def _kill_left(pid: int, create_time: float | None) -> bool:
    """SIGKILL a recorded task's process group, if it is still that task's (same start
    time, or younger members of the group when the leader is gone); True when any died."""
    try:
        leader = psutil.Process(pid)
        if create_time is not None and abs(leader.create_time() - create_time) < 0.1 \
                and leader.status() != psutil.STATUS_ZOMBIE:
            os.killpg(pid, signals.SIGKILL)
            return True
    except (psutil.Error, OSError):
        pass
    if create_time is None:
        return False
    return procs.sweep_group(pid, create_time, spare=pid)   # the leader exited; what it left behind


def _limits_child(todo: list, then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """The task's child, after the switch to the job's user and before exec: ``then``, and
    srun's limits (lowering is all a user may do, and the plan never raises one above the
    worker's hard limits).  None when there is nothing to do, so the spawn stays fast."""
    if not todo:
        return then

    def child() -> None:
        if then is not None:
            then()
        rlimits.apply(todo, _warn_child)
    return child


def _warn_child(line: str) -> None:
    os.write(2, f"srun: warning: {line}\n".encode(errors="replace"))   # the task's own stderr


def _write_pid(path: str, pid: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _open_gate(proc: asyncio.subprocess.Process, close: bool = True) -> None:
    """Let a started task's shell go on to its command (one line, then end of input, unless
    the rest of the pipe is the task's input)."""
    stdin = proc.stdin
    if stdin is None:
        return
    try:
        stdin.write(b"\n")
        if close:
            stdin.close()
    except (BrokenPipeError, ConnectionResetError):   # it was killed meanwhile
        pass


def _open_fd_gate(fd: int) -> None:
    try:
        os.write(fd, b"\n")
    except OSError:   # it was killed meanwhile
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
