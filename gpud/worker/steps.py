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
is the base: the job's variables win over it.

Output is read in chunks, cut into lines (a line longer than ``MAX_LINE`` is split) and
sent as ``step_output`` batches of whole lines, numbered per step, at most
``BATCH_BYTES`` each; a reader stops reading while ``MAX_PENDING`` bytes wait to be sent,
so a chatty task is slowed down, not buffered without end.  When a task exits (its
process group is then killed, as the job wrapper does for batch scripts) its last lines
go out, then its ``step_exit``: the head never sees an exit before the output before it.

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
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import psutil

from . import procs
from .jobstore import read_json, write_file

log = logging.getLogger("gpud.worker.steps")

READ_CHUNK = 64 << 10
MAX_LINE = 64 << 10           # longer lines are sent in pieces
BATCH_BYTES = 64 << 10        # at most this much text per step_output message
MAX_PENDING = 1 << 20         # readers pause while this much output waits to be sent
FLUSH_EVERY = 0.05            # seconds output may wait to share a message with more
MAX_TASKS_PER_NODE = 256
SHELL = "/bin/sh"
# A task's shell: wait at the gate (a line on its input), enter the work directory as the
# user, become the command with /dev/null for input.  End of input without the line: the
# worker died before recording the task's pid, so it does not run.
TASK_SHELL = 'read -r _ || exit 125; cd -- "$0" || exit 126; exec "$@" </dev/null'

Emit = Callable[[str, dict], Awaitable[None]]


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


@dataclass(eq=False)
class _Step:
    job: int
    attempt: int
    step: int
    tasks: list[_Task] = field(default_factory=list)
    pending: list[list] = field(default_factory=list)   # [rank, stream, text]
    pending_bytes: int = 0
    seq: int = 0
    room: asyncio.Event = field(default_factory=asyncio.Event)   # set while pending < MAX_PENDING
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    killed: bool = False
    ended: int = 0                # tasks whose step_exit went out

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job, self.attempt, self.step)


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
        self._runs: set[asyncio.Task] = set()
        self._done: deque = deque(maxlen=4096)   # steps that ended: a repeated command is ignored

    # -- commands -----------------------------------------------------------------------------

    async def start(self, body: dict) -> None:
        """A ``step`` command (already shape-checked by ``parse_step``)."""
        key = (body["job"], body["attempt"], body["step"])
        if key in self._steps or key in self._done:
            return   # a repeated command
        step = self._steps[key] = _Step(*key)
        step.room.set()
        per_node, node_rank = body["ntasks_per_node"], body["node_rank"]
        first = node_rank * per_node
        try:
            setup = await asyncio.to_thread(self._setup, key[0], key[1])
        except Exception as e:   # noqa: BLE001 - the step is refused, the worker goes on
            setup, why = None, str(e) or type(e).__name__
        else:
            why = f"job {key[0]} does not run on node {self.node} (ended, or not started yet)"
        if setup is None:
            log.warning("job %d step %d refused on %s: %s", key[0], key[2], self.node, why)
            await self._emit("step_exit", {"job": key[0], "attempt": key[1], "step": key[2], "rank": None,
                                           "exit_code": None, "signal": None, "message": why})
            self._steps.pop(key, None)
            self._done.append(key)
            return
        base = {**body["env"], **setup.env}
        for local in range(per_node):
            env = task_env(base, rank=first + local, local=local, per_node=per_node, node_rank=node_rank,
                           nnodes=body["nnodes"], step=key[2], master_addr=body["master_addr"],
                           master_port=body["master_port"], nodelist=body["nodelist"])
            task = _Task(first + local)
            step.tasks.append(task)
            run = asyncio.get_running_loop().create_task(self._run(step, task, body["argv"], setup, env),
                                                         name=f"step {key[0]}.{key[2]} task {task.rank}")
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
        log.info("job %d step %d: %d task(s) started on %s (ranks %d-%d)", key[0], key[2], per_node,
                 self.node, first, first + per_node - 1)

    def kill_step(self, job: int, attempt: int, step_id: int) -> bool:
        step = self._steps.get((job, attempt, step_id))
        if step is None:
            return False
        step.killed = True
        self._signal(step, signals.SIGKILL)
        return True

    def signal_job(self, job: int, attempt: int | None, sig: int) -> int:
        """``sig`` to every task of the job's steps (of ``attempt``, or all); how many steps."""
        steps = [s for s in self._steps.values() if s.job == job and attempt in (None, s.attempt)]
        for s in steps:
            if sig == signals.SIGKILL:
                s.killed = True
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
                await self._emit("step_exit", {"job": rec["job"], "attempt": rec["attempt"], "step": rec["step"],
                                               "rank": rec["rank"], "exit_code": None,
                                               "signal": signals.SIGKILL if killed else None, "message": why})
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
        for run in list(self._runs):
            run.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)

    # -- one task -------------------------------------------------------------------------------

    async def _run(self, step: _Step, task: _Task, argv: list[str], setup: Any, env: dict[str, str]) -> None:
        code, sig, message = None, None, None
        try:
            extra: dict[str, Any] = {}
            if setup.switch_user:
                extra = {"user": setup.uid, "group": setup.gid, "extra_groups": setup.groups}
            task.record = self._save(step, task)      # before it can run: see the module's doc
            # TASK_SHELL changes directory as the user (subprocess's cwd= would do it as root,
            # before the switch), once the record with the pid is written.
            task.proc = await asyncio.create_subprocess_exec(
                SHELL, "-c", TASK_SHELL, setup.work_dir, *argv, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd="/", env=env,
                start_new_session=True, limit=READ_CHUNK, **extra)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            message = f"cannot run {argv[0]}: {getattr(e, 'strerror', None) or e}"
            code = 127 if isinstance(e, FileNotFoundError) else 126
            await self._add(step, task.rank, 2, [f"srun: error: {message}\n"])
            if task.record is not None:
                _remove(task.record)
        else:
            task.record = self._save(step, task) or task.record
            if step.killed:
                _killpg(task.proc.pid, signals.SIGKILL)
            elif not await self._confine(step, task, setup):
                _killpg(task.proc.pid, signals.SIGKILL)
            _open_gate(task.proc)
            await asyncio.gather(self._read(step, task, task.proc.stdout, 1),
                                 self._read(step, task, task.proc.stderr, 2), self._reap(task))
            rc = task.proc.returncode
            code, sig = (0, -rc) if rc is not None and rc < 0 else (rc, None)
            if task.record is not None:
                _remove(task.record)
        await self._flush(step)
        await self._emit("step_exit", {"job": step.job, "attempt": step.attempt, "step": step.step,
                                       "rank": task.rank, "exit_code": code, "signal": sig, "message": message})
        step.ended += 1
        if step.ended == len(step.tasks):
            self._steps.pop(step.key, None)
            self._done.append(step.key)

    async def _reap(self, task: _Task) -> None:
        assert task.proc is not None
        await task.proc.wait()
        _killpg(task.proc.pid, signals.SIGKILL)   # what it left behind holds our pipes open

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
        if step.pending_bytes >= MAX_PENDING:
            step.room.clear()
        if step.pending_bytes >= BATCH_BYTES:
            await self._flush(step)
        elif first:
            asyncio.get_running_loop().call_later(
                FLUSH_EVERY, lambda: asyncio.ensure_future(self._flush(step)))

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
                await self._emit("step_output", {"job": step.job, "attempt": step.attempt, "step": step.step,
                                                 "seq": step.seq, "lines": batch})
            step.room.set()

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


def _write_pid(path: str, pid: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _open_gate(proc: asyncio.subprocess.Process) -> None:
    """Let a started task's shell go on to its command (one line, then end of input)."""
    stdin = proc.stdin
    if stdin is None:
        return
    try:
        stdin.write(b"\n")
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):   # it was killed meanwhile
        pass


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


def parse_step(body: Any) -> dict:
    """A ``step`` command body, checked; ValueError with a one-line reason otherwise."""
    if not isinstance(body, dict):
        raise ValueError("body is not an object")
    out: dict[str, Any] = {}
    for key, hi in (("job", 2**63 - 1), ("attempt", 2**63 - 1), ("step", 2**31), ("node_rank", 1 << 20),
                    ("nnodes", 1 << 20), ("ntasks_per_node", MAX_TASKS_PER_NODE), ("master_port", 65535)):
        v = body.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise ValueError(f"{key} must be an integer from 0 to {hi}")
        out[key] = v
    if out["ntasks_per_node"] < 1 or out["node_rank"] >= out["nnodes"]:
        raise ValueError("ntasks_per_node must be positive and node_rank below nnodes")
    argv = body.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a and "\x00" not in a
                                                         for a in argv[:1]) \
            or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    out["argv"] = list(argv)
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and "\x00" not in k
                                            and isinstance(v, str) and "\x00" not in v for k, v in env.items()):
        raise ValueError("env must map variable names to strings")
    out["env"] = dict(env)
    for key in ("master_addr", "nodelist"):
        v = body.get(key)
        if not isinstance(v, str) or not v or "\x00" in v or len(v) > 65536:
            raise ValueError(f"{key} must be a non-empty string")
        out[key] = v
    return out
