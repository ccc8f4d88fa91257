"""``gpuctl srun`` steps on the head: start tasks on every node of a job, gather their output.

Theory of operation
-------------------
``step_launch`` (the job's owner or an admin, by SO_PEERCRED; the job must be RUNNING)
numbers a new step of the job and sends a ``step`` command to every node of it, with that
node's rank; each worker starts ``ntasks_per_node`` processes as the job's user
(``gpud.worker.steps``).  Workers send the tasks' output as ``step_output`` messages of
whole lines, in bounded batches numbered per node (a repeat is dropped by its number),
and one ``step_exit`` per task.

The head keeps each step's output in memory, at most ``MAX_STEP_OUTPUT`` bytes: when
more arrives the oldest lines go, and a reader that was behind is told how many it
missed.  ``step_poll`` long-polls: it answers as soon as there are lines after the
reader's offset, the step is done, or ``POLL_WAIT`` passes.

A step is done when every task has exited.  The first task to exit non-zero (or be
killed) decides its exit code, and the head sends ``step_kill`` to every node at once,
as Slurm's ``--kill-on-bad-exit`` does; tasks killed because the job itself is stopping
(cancel, preemption, time limit) end the step with status 1 and the job's reason instead.
A job that ends (cancel, time limit, a lost node, rank 0's script returning) ends its
steps too: the workers kill their tasks with the job's part, and the head marks the
steps done so srun never waits on a dead job.
Steps are forgotten ``KEEP_DONE`` seconds after they are done.

Only the numbering is durable: each launch is a ``step`` event in the job's log, and a
restarted head numbers on from the count there, because workers ignore a step command
they have already seen (same job, attempt and step).  The steps themselves live in
memory: after a head restart srun reports its step as lost (exit 1), and the head tells
the nodes to kill the tasks of a step it does not know as soon as one of them sends
output (or srun asks for it).

Worker messages are checked field by field; anything malformed, from a node outside the
step, of another attempt or for an unknown step is dropped with one log line.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..bus.base import node_cmd
from ..model import JobState, StopReason
from ..protocol import is_int
from . import gang
from .api import Caller, RequestError
from .jobs import may_modify
from .store import Txn

if TYPE_CHECKING:
    from .daemon import Head
    from .store import JobRecord

log = logging.getLogger("gpud.steps")

MAX_STEP_OUTPUT = 4 << 20     # bytes of output kept per step; older lines are dropped
LINE_OVERHEAD = 64            # bytes a kept line costs beside its text (the cap counts it)
MAX_STEPS = 1024              # steps remembered at once, all jobs together
MAX_STEPS_PER_JOB = 128
MAX_TASKS_PER_NODE = 256
MAX_ARGV_BYTES = 128 << 10
MAX_ENV_BYTES = 256 << 10     # with argv, one signed message (the envelope takes 1 MiB)
MAX_POLL_BYTES = 1 << 20      # text per step_poll answer
POLL_WAIT = 10.0              # seconds step_poll waits for news (below gpuctl's 30 s timeout)
KEEP_DONE = 120.0             # seconds a done step stays readable
MAX_ORPHAN_KILLS = 4096       # (job, attempt, step, node) already told to kill an unknown step
MAX_STATUS = 255              # a task's exit code as a shell sees it
MAX_SIGNAL = 127
STOP_WORDS = {"cancelled": "was cancelled", "timeout": "reached its time limit", "requeue": "was requeued",
              "preempted": "was preempted", "idle": "was stopped for idle GPUs"}


@dataclass
class Step:
    job_id: int
    attempt: int
    step_id: int
    uid: int
    nodes: list[str]
    ntasks_per_node: int
    lines: deque = field(default_factory=deque)   # (offset, rank, stream, text)
    next_offset: int = 0
    size: int = 0
    exits: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)  # rank -> (code, sig)
    bad_rank: int | None = None
    exit_code: int | None = None
    message: str | None = None
    done_at: float | None = None
    seqs: dict[str, int] = field(default_factory=dict)   # node -> last output batch number
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ntasks(self) -> int:
        return len(self.nodes) * self.ntasks_per_node

    @property
    def done(self) -> bool:
        return self.done_at is not None

    def add(self, rank: int, stream: int, text: str) -> None:
        self.lines.append((self.next_offset, rank, stream, text))
        self.next_offset += 1
        self.size += len(text) + LINE_OVERHEAD
        while self.size > MAX_STEP_OUTPUT and self.lines:
            self.size -= len(self.lines.popleft()[3]) + LINE_OVERHEAD

    def poke(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def task_exit_code(code: int | None, sig: int | None) -> int:
    """A task's status as a shell reports it: its code, 128+signal when killed, 1 when none."""
    if sig:
        return 128 + sig
    return 1 if code is None else code


class Steps:
    """Every live step of every job, by (job id, step id)."""

    def __init__(self, head: "Head") -> None:
        self.head = head
        self.steps: dict[tuple[int, int], Step] = {}
        self._next: dict[int, int] = {}        # job id -> next step id
        self._numbering = asyncio.Lock()       # one step number read and recorded at a time
        self._orphans: dict[tuple[int, int, int, str], None] = {}   # insertion-ordered set

    # -- from gpuctl -------------------------------------------------------------------------

    async def launch(self, caller: Caller, args: dict) -> dict:
        job = self._job(caller, args.get("job_id"))
        if job.state is not JobState.RUNNING:
            raise RequestError(f"srun: job {job.job_id} is {job.state.value}, not RUNNING; "
                               "srun runs tasks only inside a running job")
        argv = args.get("argv")
        if (not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv)
                or not argv[0] or sum(len(a) + 1 for a in argv) > MAX_ARGV_BYTES):
            raise RequestError("srun: argv must be a non-empty list of strings without NUL, the first not empty "
                               "(at most 128 KiB)")
        per_node = args.get("ntasks_per_node")
        if per_node is None:
            per_node = gang.ntasks_per_node(job)
        if isinstance(per_node, bool) or not isinstance(per_node, int) or not 1 <= per_node <= MAX_TASKS_PER_NODE:
            raise RequestError(f"srun: --ntasks-per-node must be from 1 to {MAX_TASKS_PER_NODE}")
        env = args.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                                                and "\x00" not in k + v for k, v in env.items()):
            raise RequestError("srun: env must map variable names to strings")
        if sum(len(k) + len(v) + 2 for k, v in env.items()) > MAX_ENV_BYTES:
            raise RequestError(f"srun: the environment is larger than {MAX_ENV_BYTES >> 10} KiB; "
                               "unset what the tasks do not need")
        self._forget_old()
        if len(self.steps) >= MAX_STEPS or sum(1 for k in self.steps if k[0] == job.job_id) >= MAX_STEPS_PER_JOB:
            raise RequestError("srun: too many steps running at once; wait for some to end")
        nodes = gang.job_nodes(job)
        step_id = await self._number(job, caller, per_node * len(nodes), argv)
        job = self.head.store.active.get(job.job_id) or job
        if job.state is not JobState.RUNNING or gang.job_nodes(job) != nodes:   # it ended meanwhile
            raise RequestError(f"srun: job {job.job_id} is {job.state.value}, not RUNNING; "
                               "srun runs tasks only inside a running job")
        step = self.steps[(job.job_id, step_id)] = Step(job.job_id, job.attempt, step_id, job.uid, nodes, per_node)
        addr = gang.master_addr(self.head.store, job)
        log.info("job %d step %d (user %s): %d task(s) on %s: %s", job.job_id, step_id, caller.user,
                 step.ntasks, gang.nodelist_text(nodes), " ".join(argv)[:200])
        for rank, node in enumerate(nodes):
            try:
                await self.head.bus.publish(node_cmd(node), "step", {
                    "job": job.job_id, "attempt": job.attempt, "step": step_id, "argv": argv, "env": env,
                    "ntasks_per_node": per_node, "node_rank": rank, "nnodes": len(nodes),
                    "nodelist": gang.nodelist_text(nodes), "master_addr": addr,
                    "master_port": gang.master_port(job.job_id),
                })
            except Exception as e:   # too large for one message, or the bus refused it
                log.warning("job %d step %d: cannot send it to %s: %s", job.job_id, step_id, node, e)
                step.exit_code, step.message = 1, f"could not send the step to node {node}: {e}"
                await self._kill(step)
                self._finish(step)
                raise RequestError(f"srun: could not send the step to node {node}: {e}") from None
        return {"job_id": job.job_id, "step": step_id, "ntasks": step.ntasks, "nodes": len(nodes),
                "nodelist": gang.nodelist_text(nodes)}

    async def poll(self, caller: Caller, args: dict) -> dict:
        job_id, step_id, offset = args.get("job_id"), args.get("step"), args.get("offset", 0)
        _require_counts(job_id=job_id, step=step_id, offset=offset)
        step = self.steps.get((job_id, step_id))
        if step is None:
            job = self.head.store.active.get(job_id)
            if job is not None and job.state.active and self._issued(job_id, step_id) and may_modify(
                    job.uid, caller.uid, caller.user, self.head.admins, os.geteuid()):
                for node in gang.job_nodes(job):   # tasks left from before a restart: nobody reads them
                    await self._kill_orphan(job_id, job.attempt, step_id, node)
            raise RequestError(f"srun: no step {job_id}.{step_id} (it ended more than {KEEP_DONE:.0f}s ago, "
                               "or the head restarted; its tasks are killed)")
        if not may_modify(step.uid, caller.uid, caller.user, self.head.admins, os.geteuid()):
            raise RequestError(f"srun: step {job_id}.{step_id} is not yours")
        if step.next_offset <= offset and not step.done:
            try:
                await asyncio.wait_for(step.changed.wait(), POLL_WAIT)
            except asyncio.TimeoutError:
                pass
        first = step.lines[0][0] if step.lines else step.next_offset
        start = max(offset, first)
        out, size = [], 0
        for _, rank, stream, text in itertools.islice(step.lines, start - first, None):  # offsets are contiguous
            if out and size + len(text) > MAX_POLL_BYTES:
                break
            out.append([rank, stream, text])
            size += len(text)
        more = start + len(out) < step.next_offset
        return {"lines": out, "offset": start + len(out), "dropped": max(0, first - offset),
                "done": step.done and not more, "exit_code": step.exit_code, "message": step.message,
                "bad_rank": step.bad_rank}

    async def cancel(self, caller: Caller, args: dict) -> dict:
        """srun was interrupted: kill the step's tasks everywhere."""
        job_id, step_id = args.get("job_id"), args.get("step")
        _require_counts(job_id=job_id, step=step_id)
        step = self.steps.get((job_id, step_id))
        if step is None:
            return {"cancelled": False}
        if not may_modify(step.uid, caller.uid, caller.user, self.head.admins, os.geteuid()):
            raise RequestError(f"srun: step {step.job_id}.{step.step_id} is not yours")
        if not step.done:
            step.bad_rank = None
            step.exit_code = step.exit_code if step.exit_code is not None else 130
            step.message = step.message or "srun was interrupted; its tasks were killed"
            await self._kill(step)
        return {"cancelled": True}

    # -- from workers -----------------------------------------------------------------------

    async def handle(self, node: str, kind: str, body: Any) -> None:
        if not isinstance(body, dict):
            log.warning("dropped %s from %s: body is not an object", kind, node)
            return
        job_id, attempt, step_id = body.get("job"), body.get("attempt"), body.get("step")
        if not all(_is_count(v) for v in (job_id, attempt, step_id)):
            log.warning("dropped %s from %s: job, attempt and step must be non-negative integers", kind, node)
            return
        step = self.steps.get((job_id, step_id))
        if step is None:
            job = self.head.store.active.get(job_id)
            if (job is not None and job.state.active and job.attempt == attempt and node in gang.job_nodes(job)
                    and self._issued(job_id, step_id)):
                # A step this head does not know (it restarted) whose tasks still run there.
                log.info("dropped %s from %s: job %d has no step %d here; telling the node to kill it",
                         kind, node, job_id, step_id)
                await self._kill_orphan(job_id, attempt, step_id, node)
            else:
                log.debug("dropped %s from %s: step %d.%d is over or unknown", kind, node, job_id, step_id)
            return
        if attempt != step.attempt:
            log.info("dropped %s from %s: attempt %d of job %d, the step runs in attempt %d",
                     kind, node, attempt, job_id, step.attempt)
            return
        if node not in step.nodes:
            log.warning("dropped %s from %s: the node has no part in step %d.%d", kind, node, job_id, step_id)
            return
        if kind == "step_output":
            self._output(step, node, body)
        else:
            await self._exit(step, node, body)

    def _output(self, step: Step, node: str, body: dict) -> None:
        seq, lines = body.get("seq"), body.get("lines")
        if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(lines, list):
            log.warning("dropped step_output from %s: malformed", node)
            return
        if seq <= step.seqs.get(node, -1):
            return   # a repeat
        step.seqs[node] = seq
        lo = step.nodes.index(node) * step.ntasks_per_node
        bad = 0
        for item in lines:
            if (isinstance(item, list) and len(item) == 3 and type(item[0]) is int and type(item[1]) is int
                    and item[1] in (1, 2) and isinstance(item[2], str) and lo <= item[0] < lo + step.ntasks_per_node):
                step.add(item[0], item[1], item[2])
            else:
                bad += 1
        if bad:
            log.warning("dropped %d of %d line(s) of step_output from %s: malformed, or not its tasks'",
                        bad, len(lines), node)
        step.poke()

    async def _exit(self, step: Step, node: str, body: dict) -> None:
        rank, code, sig = body.get("rank"), body.get("exit_code"), body.get("signal")
        lo = step.nodes.index(node) * step.ntasks_per_node
        ranks = list(range(lo, lo + step.ntasks_per_node)) if rank is None else [rank]
        if not all(type(r) is int and lo <= r < lo + step.ntasks_per_node for r in ranks) \
                or not (code is None or (type(code) is int and 0 <= code <= MAX_STATUS)) \
                or not (sig is None or (type(sig) is int and 0 <= sig <= MAX_SIGNAL)):
            log.warning("dropped step_exit from %s: malformed (rank, exit_code or signal)", node)
            return
        for r in ranks:
            if r in step.exits:
                continue
            step.exits[r] = (code, sig)
            if (code != 0 or sig) and step.exit_code is None:
                stopping = self._stopping(step)
                why = body.get("message") if isinstance(body.get("message"), str) else None
                if stopping:   # the job's own stop killed it: not the step's failure
                    step.exit_code, step.message = 1, f"job {step.job_id} {stopping}; its tasks were killed"
                else:
                    step.bad_rank, step.exit_code = r, task_exit_code(code, sig)
                    step.message = (f"task {r} on {node}: " + (why[:300] if why else
                                    (f"killed by signal {sig}" if sig else f"exited with code {code}")))
                log.info("job %d step %d: %s; killing the other tasks", step.job_id, step.step_id, step.message)
                await self._kill(step)
        if len(step.exits) >= step.ntasks and not step.done:
            if step.exit_code is None:
                step.exit_code = 0
            self._finish(step)
        step.poke()

    # -- endings ----------------------------------------------------------------------------

    async def _kill(self, step: Step) -> None:
        for node in step.nodes:
            try:
                await self.head.bus.publish(node_cmd(node), "step_kill", {
                    "job": step.job_id, "attempt": step.attempt, "step": step.step_id})
            except Exception as e:   # the job's end kills the tasks in any case
                log.warning("job %d step %d: cannot send step_kill to %s: %s", step.job_id, step.step_id, node, e)

    async def _kill_orphan(self, job_id: int, attempt: int, step_id: int, node: str) -> None:
        """``step_kill`` for a step this head does not know, once per node."""
        key = (job_id, attempt, step_id, node)
        if key in self._orphans:
            return
        self._orphans[key] = None
        while len(self._orphans) > MAX_ORPHAN_KILLS:
            del self._orphans[next(iter(self._orphans))]
        try:
            await self.head.bus.publish(node_cmd(node), "step_kill", {"job": job_id, "attempt": attempt,
                                                                      "step": step_id})
        except Exception as e:   # the job's end kills them in any case
            log.warning("job %d step %d: cannot send step_kill to %s: %s", job_id, step_id, node, e)

    def _issued(self, job_id: int, step_id: int) -> bool:
        """Could ``step_id`` have been given out (by this head, or before it started)?"""
        nxt = self._next.get(job_id)
        return nxt is None or step_id < nxt

    def _stopping(self, step: Step) -> str | None:
        """Why the step's job is stopping or gone ("was cancelled"...), None while it runs."""
        job = self.head.store.active.get(step.job_id)
        if job is None or job.attempt != step.attempt:
            return "ended"
        if job.state is JobState.RUNNING:
            return None
        stop = StopReason.of(job.stop_reason)
        return STOP_WORDS.get(stop.kind, "is stopping") if stop is not None else "is stopping"

    async def _number(self, job: "JobRecord", caller: Caller, ntasks: int, argv: list[str]) -> int:
        """The job's next step number, recorded in its event log before anything starts."""
        async with self._numbering:
            if job.job_id not in self._next:   # first step since this head started
                events = await self.head.store.job_events(job.job_id)
                self._next[job.job_id] = sum(1 for e in events if e["event"] == "step")
            step_id = self._next[job.job_id]
            txn = Txn(self.head.store)
            txn.event(job, self.head.clock(), "step",
                      f"{step_id}: {ntasks} task(s) by {caller.user}: {' '.join(argv)}"[:300])
            try:
                await self.head.store.commit(txn)
            except Exception as e:   # the disk said no: nothing was started
                log.exception("job %d: cannot record step %d", job.job_id, step_id)
                raise RequestError(f"srun: cannot record the step: database error: {e}") from None
            self._next[job.job_id] = step_id + 1
            return step_id

    def _finish(self, step: Step) -> None:
        step.done_at = self.head.clock()
        step.poke()

    def job_ended(self, job_id: int) -> None:
        """The job is no longer running: its steps are done (its tasks die with its parts)."""
        job = self.head.store.active.get(job_id)
        state = job.state.value if job is not None else "ended"
        for (jid, _), step in list(self.steps.items()):
            if jid == job_id and not step.done:
                if step.exit_code is None:
                    step.exit_code = 1
                    step.message = f"job {job_id} {'was requeued' if state == 'PENDING' else 'ended'}; its tasks were killed"
                self._finish(step)
        self._forget_old()

    def _forget_old(self) -> None:
        now = self.head.clock()
        for key, step in list(self.steps.items()):
            if step.done_at is not None and now - step.done_at > KEEP_DONE:
                del self.steps[key]
        live = {k[0] for k in self.steps} | set(self.head.store.active)
        for jid in [j for j in self._next if j not in live]:
            del self._next[jid]

    def _job(self, caller: Caller, job_id: Any) -> "JobRecord":
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise RequestError("srun: job_id must be a positive integer")
        job = self.head.store.active.get(job_id)
        if job is None:
            raise RequestError(f"srun: job {job_id} is not running (finished, or no such job)")
        if not may_modify(job.uid, caller.uid, caller.user, self.head.admins, os.geteuid()):
            raise RequestError(f"srun: job {job_id} belongs to {job.user}; only its owner or an admin may "
                               "run tasks in it")
        return job


def _is_count(v: Any) -> bool:
    """A non-negative integer (not a bool)."""
    return is_int(v) and v >= 0


def _require_counts(**values: Any) -> None:
    """Refuse a request unless each of ``values`` is a non-negative integer."""
    for name, v in values.items():
        if not _is_count(v):
            raise RequestError(f"srun: {name} must be a non-negative integer")


async def op_step_launch(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.launch(caller, args)


async def op_step_poll(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.poll(caller, args)


async def op_step_cancel(head: "Head", caller: Caller, args: dict) -> dict:
    return await head.steps.cancel(caller, args)


OPS = {"step_launch": op_step_launch, "step_poll": op_step_poll, "step_cancel": op_step_cancel}
