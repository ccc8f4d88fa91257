"""``gpuctl srun`` steps on the head: start tasks on every node of a job, gather their output.

Theory of operation
-------------------
``step_launch`` (the job's owner or root, by SO_PEERCRED, never an admin; the job must be RUNNING)
numbers a new step of the job and sends a ``step`` command to every node of it, with that
node's rank; each worker starts ``ntasks_per_node`` processes as the job's user
(``gpud.worker.steps``).  Workers send the tasks' output as ``step_output`` messages of
whole lines, in bounded batches numbered per node (a repeat is dropped by its number),
and one ``step_exit`` per task.

Each item of output (a line, or a chunk of a terminal's bytes) is numbered by its node,
per step (``gpud.worker.steps``).  The head takes a node's items in order only: a repeat
is dropped, and a gap (a lost message, a head that restarted) makes it ask the node for
everything from the first missing number again (``step_ack`` with ``resend``).  A reader
(srun, sattach) holds a *cursor*, the next number it wants from each node, and long-polls
with it (``step_poll``): the answer comes as soon as there is something after it, the
step is done, or ``POLL_WAIT`` passes, and carries the new cursor.  What readers have
read goes back to the nodes as ``step_ack`` {next}: a node keeps what is not acknowledged
and stops reading its tasks while ``WINDOW`` bytes are outstanding, so a slow reader slows
the task and the head never holds more than that per node.  The head's copy is still
capped at ``MAX_STEP_OUTPUT`` bytes (the oldest lines go; a reader that was behind is
told how many it missed; gpud.head.steprecord) and one answer carries at most
``MAX_POLL_BYTES``, so a bulk reader takes turns with everyone else's requests.

Input (``step_input``: srun's or sattach's standard input, in numbered chunks per writer)
goes to the node of task 0, which writes each chunk once, in order, and reports how far
it got; a writer has at most ``INPUT_WINDOW`` chunks outstanding and waits for the rest.
``step_resize`` carries a terminal's new size to a ``pty`` step.

Steps survive a head restart.  The tasks run on; their nodes keep what was not
acknowledged.  A restarted head that hears of a step it does not know (output from a
node, or a reader's poll) *adopts* it, when its job is active and the number was given
out (the step events in the job's log): the reader's cursor says where each node must
start again, and the head asks for exactly that, so nothing printed is lost or doubled.
A step nobody has read for ``READER_TIMEOUT`` seconds (its srun is gone) is killed.

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
they have already seen (same job, attempt and step) (gpud.head.stepnumbers).

The socket verbs (``OPS``) and their shared argument checks are gpud.head.stepops; ``Steps``
here holds every live step and does the work.

Worker messages come decoded (``gpud.bus.messages``: anything malformed was dropped with one
log line); one from a node outside the step, of another attempt, for an unknown step or
naming another node's tasks is dropped here, with one log line too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..bus.base import node_cmd
from ..bus.messages import (MAX_INPUT_CHUNK, MAX_TASKS_PER_NODE, StepAck, StepExit, StepInput, StepKill, StepOutput,
                            StepResize, StepStart)
from ..model import JobState, SpecError, StopReason, parse_rlimits
from ..protocol import is_int
from . import gang
from ..ctlsocket import Caller, RequestError
from .jobs import may_modify
from .stepnumbers import StepNumbers
from .stepops import parse_cursor, require_counts
from .steprecord import LINE_OVERHEAD, Step, task_exit_code

if TYPE_CHECKING:
    from ..bus.base import Bus
    from .daemon import Head
    from .store import JobRecord, Store


log = logging.getLogger("gpud.steps")

MAX_STEPS = 1024              # steps remembered at once, all jobs together
MAX_STEPS_PER_JOB = 128
MAX_ARGV_BYTES = 128 << 10
MAX_ENV_BYTES = 256 << 10     # with argv, one signed message (the envelope takes 1 MiB)
MAX_POLL_BYTES = 256 << 10    # text per step_poll answer: a bulk reader takes turns with others
POLL_WAIT = 10.0              # seconds step_poll waits for news (below gpuctl's 30 s timeout)
KEEP_DONE = 120.0             # seconds a done step stays readable
READER_TIMEOUT = 90.0         # seconds a step may go unread before it is killed (its srun is gone)
RESEND_GAP_AFTER = 2.0        # seconds before the same gap is asked for again
INPUT_WINDOW = 32             # input chunks a writer may have outstanding
STOP_WORDS = {"cancelled": "was cancelled", "timeout": "reached its time limit", "requeue": "was requeued",
              "preempted": "was preempted", "idle": "was stopped for idle GPUs", "released": "was released"}


class Steps:
    """Every live step of every job, by (job id, step id).  Given the store (read; the step
    numbers are committed through it), the bus (the step commands) and getters for the admins
    and the wall clock (read at call time: a reload swaps the admins, tests the clock)."""

    def __init__(self, store: "Store", bus: "Bus", *, admins: Callable[[], frozenset[str]],
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.bus = bus
        self._admins = admins
        self._clock = clock
        self.steps: dict[tuple[int, int], Step] = {}
        self.numbers = StepNumbers(store, clock=clock)
        self.epoch = os.urandom(6).hex()      # a reader's offsets are this head's only
        self.monotonic = time.monotonic

    @classmethod
    def of(cls, head: "Head") -> "Steps":
        """The steps of ``head``, wired as ``Head.__init__`` wires them (a test's restarted
        head builds them the same way)."""
        return cls(head.store, head.bus, admins=lambda: head.admins, clock=lambda: head.clock())

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
            per_node = 1 if args.get("pty") else gang.ntasks_per_node(job)
        if isinstance(per_node, bool) or not isinstance(per_node, int) or not 1 <= per_node <= MAX_TASKS_PER_NODE:
            raise RequestError(f"srun: --ntasks-per-node must be from 1 to {MAX_TASKS_PER_NODE}")
        env = args.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                                                and "\x00" not in k + v for k, v in env.items()):
            raise RequestError("srun: env must map variable names to strings")
        if sum(len(k) + len(v) + 2 for k, v in env.items()) > MAX_ENV_BYTES:
            raise RequestError(f"srun: the environment is larger than {MAX_ENV_BYTES >> 10} KiB; "
                               "unset what the tasks do not need")
        try:   # srun's own limits, which its tasks inherit, checked as a submission's are
            rlimits = parse_rlimits(args.get("rlimits"))
        except SpecError as e:
            raise RequestError(f"srun: {e}") from None
        pty, stdin = args.get("pty", False), args.get("stdin", False)
        rows, cols = args.get("rows", 24), args.get("cols", 80)
        if not isinstance(pty, bool) or not isinstance(stdin, bool):
            raise RequestError("srun: pty and stdin must be true or false")
        if not all(is_int(v) and 1 <= v <= 65535 for v in (rows, cols)):
            raise RequestError("srun: rows and cols must be from 1 to 65535")
        self._forget_old()
        if len(self.steps) >= MAX_STEPS or sum(1 for k in self.steps if k[0] == job.job_id) >= MAX_STEPS_PER_JOB:
            raise RequestError("srun: too many steps running at once; wait for some to end")
        nodes = gang.job_nodes(job)
        if pty and per_node * len(nodes) != 1:
            raise RequestError(f"srun: --pty runs one task, and job {job.job_id} has {len(nodes)} node(s) with "
                               f"{per_node} task(s) each; use --ntasks-per-node 1 in a one-node allocation")
        step_id = await self.numbers.next(job, caller, per_node * len(nodes), argv)
        job = self.store.active.get(job.job_id) or job
        if job.state is not JobState.RUNNING or gang.job_nodes(job) != nodes:   # it ended meanwhile
            raise RequestError(f"srun: job {job.job_id} is {job.state.value}, not RUNNING; "
                               "srun runs tasks only inside a running job")
        step = self.steps[(job.job_id, step_id)] = Step(job.job_id, job.attempt, step_id, job.uid, nodes, per_node,
                                                        pty=pty, stdin=stdin or pty, read_at=self.monotonic())
        step.expected = {n: 0 for n in nodes}
        addr = gang.master_addr(self.store, job)
        log.info("job %d step %d (user %s): %d task(s) on %s%s: %s", job.job_id, step_id, caller.user,
                 step.ntasks, gang.nodelist_text(nodes), " on a terminal" if pty else "", " ".join(argv)[:200])
        for rank, node in enumerate(nodes):
            try:
                await self.bus.publish(node_cmd(node), StepStart(
                    job.job_id, job.attempt, step_id, argv=tuple(argv), env=dict(env), ntasks_per_node=per_node,
                    node_rank=rank, nnodes=len(nodes), nodelist=gang.nodelist_text(nodes), master_addr=addr,
                    master_port=gang.master_port(job.job_id), pty=pty, stdin=step.stdin, rows=rows, cols=cols,
                    rlimits=rlimits))
            except Exception as e:   # too large for one message, or the bus refused it
                log.warning("job %d step %d: cannot send it to %s: %s", job.job_id, step_id, node, e)
                step.exit_code, step.message = 1, f"could not send the step to node {node}: {e}"
                await self._kill(step)
                self._finish(step)
                raise RequestError(f"srun: could not send the step to node {node}: {e}") from None
        return {"job_id": job.job_id, "step": step_id, "ntasks": step.ntasks, "nodes": len(nodes),
                "nodelist": gang.nodelist_text(nodes), "pty": pty, "stdin": step.stdin}

    async def poll(self, caller: Caller, args: dict) -> dict:
        job_id, step_id, offset = args.get("job_id"), args.get("step"), args.get("offset", 0)
        require_counts(job_id=job_id, step=step_id, offset=offset)
        cursor = parse_cursor(args.get("cursor"))
        step = await self._reader_step(caller, job_id, step_id, args, cursor)
        step.read_at = self.monotonic()
        same_head = args.get("epoch") in (None, self.epoch)
        if not same_head:
            offset = 0           # another head's offsets: the cursor says where the reader is
        start_offset = offset
        if step.next_offset <= offset and not (step.done and self._caught_up(step)):
            try:
                await asyncio.wait_for(step.changed.wait(), POLL_WAIT)
            except asyncio.TimeoutError:
                pass
            step.read_at = self.monotonic()
        first = step.lines[0][0] if step.lines else step.next_offset
        start = max(offset, first)
        out, size, last = [], 0, start
        for off, rank, stream, text, node, index in itertools.islice(step.lines, start - first, None):
            if out and size + len(text) > MAX_POLL_BYTES:
                break
            last = off + 1
            if index < cursor.get(node, 0):
                continue         # the reader has it (read from this head or another)
            out.append([rank, stream, text])
            cursor[node] = index + 1
            size += len(text)
        more = last < step.next_offset
        await self._acknowledge(step, cursor)
        caught_up = self._caught_up(step)
        return {"lines": out, "offset": last, "epoch": self.epoch, "cursor": cursor,
                "dropped": max(0, first - start_offset) if same_head else 0,
                "done": step.done and not more and caught_up, "exit_code": step.exit_code, "message": step.message,
                "bad_rank": step.bad_rank, "pty": step.pty, "stdin": step.stdin, "input": dict(step.input_next)}

    @staticmethod
    def _caught_up(step: Step) -> bool:
        """Has the head every item its nodes sent before their tasks' exits?"""
        return all(step.expected.get(n) is not None and step.expected[n] >= step.needed.get(n, 0)
                   for n in step.nodes)

    async def _reader_step(self, caller: Caller, job_id: int, step_id: int, args: dict,
                           cursor: dict[str, int]) -> Step:
        """The step a reader or writer asks about; adopted when this head does not know it."""
        step = self.steps.get((job_id, step_id))
        if step is None:
            job = self.store.active.get(job_id)
            if job is not None and job.state is JobState.RUNNING and not self.numbers.known(job_id):
                await self.numbers.count(job)
            if (job is None or job.state is not JobState.RUNNING or not self.numbers.issued(job_id, step_id)
                    or not may_modify(job.uid, caller.uid, caller.user, self._admins(), os.geteuid())):
                raise RequestError(f"srun: no step {job_id}.{step_id} (it ended more than {KEEP_DONE:.0f}s ago, "
                                   "or its job is not running)")
            hint = args.get("ntasks_per_node")
            per_node = hint if is_int(hint) and 1 <= hint <= MAX_TASKS_PER_NODE else gang.ntasks_per_node(job)
            step = self._adopt(job, step_id, per_node, args.get("pty") is True)
        if not may_modify(step.uid, caller.uid, caller.user, self._admins(), os.geteuid()):
            raise RequestError(f"srun: step {job_id}.{step_id} is not yours")
        for node in step.nodes:
            if step.expected.get(node) is None:   # adopted: start that node where the reader is
                await self._ask_from(step, node, cursor.get(node, 0))
        return step

    def _adopt(self, job: "JobRecord", step_id: int, per_node: int, pty: bool) -> Step:
        nodes = gang.job_nodes(job)
        step = self.steps[(job.job_id, step_id)] = Step(job.job_id, job.attempt, step_id, job.uid, nodes, per_node,
                                                        pty=pty, stdin=pty, read_at=self.monotonic())
        step.expected = {n: None for n in nodes}
        log.info("job %d step %d: adopted (it ran before this head started)", job.job_id, step_id)
        return step

    async def _ask_from(self, step: Step, node: str, index: int) -> None:
        """Take ``node``'s items from ``index`` on, and ask it for them again."""
        step.expected[node] = index
        if any(n == node and i >= index for _, _, _, _, n, i in step.lines):
            step.lines = deque(x for x in step.lines if not (x[4] == node and x[5] >= index))
            step.size = sum(len(x[3]) + LINE_OVERHEAD for x in step.lines)
            step.next_offset += 1   # offsets stay unique: a reader's old offset is not reused
        step.gap_asked[node] = (index, self.monotonic())
        await self._send_ack(step, node, index, resend=True)

    async def _acknowledge(self, step: Step, cursor: dict[str, int]) -> None:
        for node in step.nodes:
            c = cursor.get(node, 0)
            if c > step.acked.get(node, 0):
                step.acked[node] = c
                await self._send_ack(step, node, c, resend=False)

    async def _send_ack(self, step: Step, node: str, upto: int, *, resend: bool) -> None:
        try:
            await self.bus.publish(node_cmd(node), StepAck(step.job_id, step.attempt, step.step_id, upto, resend))
        except Exception as e:   # the node sends its kept output again by itself
            log.warning("job %d step %d: cannot send step_ack to %s: %s", step.job_id, step.step_id, node, e)

    async def write(self, caller: Caller, args: dict) -> dict:
        """``step_input``: a chunk of a writer's input for task 0, passed on in order."""
        job_id, step_id, seq = args.get("job_id"), args.get("step"), args.get("seq")
        require_counts(job_id=job_id, step=step_id, seq=seq)
        writer, data, eof = args.get("writer"), args.get("data", ""), args.get("eof", False)
        if not isinstance(writer, str) or not 0 < len(writer) <= 64:
            raise RequestError("srun: writer must be a short string")
        if not isinstance(data, str) or len(data) > MAX_INPUT_CHUNK or not isinstance(eof, bool) \
                or any(ord(c) > 255 for c in data):
            raise RequestError(f"srun: data must be bytes as latin-1 text, at most {MAX_INPUT_CHUNK >> 10} KiB")
        step = await self._reader_step(caller, job_id, step_id, args, {})
        if not step.stdin:
            raise RequestError(f"srun: step {job_id}.{step_id} takes no input")
        if step.done:
            return {"written": False}
        deadline = self.monotonic() + POLL_WAIT
        while seq - step.input_next.get(writer, 0) >= INPUT_WINDOW:   # task 0 is not reading
            left = deadline - self.monotonic()
            if left <= 0 or step.done:
                return {"retry": True}
            try:
                await asyncio.wait_for(step.input_moved.wait(), left)
            except asyncio.TimeoutError:
                pass
        await self.bus.publish(node_cmd(step.nodes[0]), StepInput(step.job_id, step.attempt, step.step_id,
                                                                  writer, seq, data, eof))
        return {"written": True}

    async def resize(self, caller: Caller, args: dict) -> dict:
        job_id, step_id, rows, cols = args.get("job_id"), args.get("step"), args.get("rows"), args.get("cols")
        require_counts(job_id=job_id, step=step_id)
        if not all(is_int(v) and 1 <= v <= 65535 for v in (rows, cols)):
            raise RequestError("srun: rows and cols must be from 1 to 65535")
        step = await self._reader_step(caller, job_id, step_id, args, {})
        if step.pty and not step.done:
            await self.bus.publish(node_cmd(step.nodes[0]), StepResize(step.job_id, step.attempt, step.step_id,
                                                                       rows, cols))
        return {"resized": step.pty}

    async def cancel(self, caller: Caller, args: dict) -> dict:
        """srun was interrupted: kill the step's tasks everywhere."""
        job_id, step_id = args.get("job_id"), args.get("step")
        require_counts(job_id=job_id, step=step_id)
        step = self.steps.get((job_id, step_id))
        if step is None:
            return {"cancelled": False}
        if not may_modify(step.uid, caller.uid, caller.user, self._admins(), os.geteuid()):
            raise RequestError(f"srun: step {step.job_id}.{step.step_id} is not yours")
        if not step.done:
            step.bad_rank = None
            step.exit_code = step.exit_code if step.exit_code is not None else 130
            step.message = step.message or "srun was interrupted; its tasks were killed"
            await self._kill(step)
        return {"cancelled": True}

    async def sweep(self, now: float) -> None:
        """Kill the steps nobody has read for READER_TIMEOUT seconds (their srun is gone)."""
        for step in list(self.steps.values()):
            if not step.done and now - step.read_at > READER_TIMEOUT:
                log.warning("job %d step %d: nobody read it for %.0fs; killing its tasks",
                            step.job_id, step.step_id, now - step.read_at)
                step.read_at = now
                step.exit_code = step.exit_code if step.exit_code is not None else 1
                step.message = step.message or "its srun went away; the tasks were killed"
                await self._kill(step)

    # -- from workers -----------------------------------------------------------------------

    async def handle(self, node: str, msg: StepOutput | StepExit) -> None:
        job_id, attempt, step_id, kind = msg.job, msg.attempt, msg.step, msg.KIND
        step = self.steps.get((job_id, step_id))
        if step is None:
            job = self.store.active.get(job_id)
            if job is not None and job.state is JobState.RUNNING and not self.numbers.known(job_id):
                await self.numbers.count(job)
            if (job is not None and job.state is JobState.RUNNING and job.attempt == attempt
                    and node in gang.job_nodes(job) and self.numbers.issued(job_id, step_id)):
                # A step that ran before this head started: keep it for its reader.
                step = self._adopt(job, step_id, msg.tasks or gang.ntasks_per_node(job), msg.pty)
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
        if msg.tasks is not None:
            step.ntasks_per_node = msg.tasks
        if msg.pty:
            step.pty = step.stdin = True
        if isinstance(msg, StepOutput):
            await self._output(step, node, msg)
        else:
            await self._exit(step, node, msg)

    async def _output(self, step: Step, node: str, msg: StepOutput) -> None:
        for writer, n in msg.input.items():
            if n > step.input_next.get(writer, 0):
                step.input_next[writer] = n
                step.input_moved.set()
                step.input_moved = asyncio.Event()
        expected = step.expected.get(node)
        first = msg.first
        if first is None:          # a worker of before the numbering: take the batch as it is
            first = expected if expected is not None else 0
        if expected is None:       # adopted, reader not seen yet: its cursor decides
            return
        if first > expected:       # a gap: ask for it again (once in a while), drop the rest
            asked = step.gap_asked.get(node)
            if asked is None or asked[0] != expected or self.monotonic() - asked[1] > RESEND_GAP_AFTER:
                log.info("job %d step %d: items %d-%d from %s are missing; asking again",
                         step.job_id, step.step_id, expected, first - 1, node)
                step.gap_asked[node] = (expected, self.monotonic())
                await self._send_ack(step, node, expected, resend=True)
            return
        lo = step.nodes.index(node) * step.ntasks_per_node
        bad = 0
        for i, (rank, stream, text) in enumerate(msg.lines):
            index = first + i
            if index < expected:
                continue           # a repeat
            if lo <= rank < lo + step.ntasks_per_node:
                step.add(rank, stream, text, node, index)
            else:
                bad += 1   # counted as taken: the numbering goes on
            expected = index + 1
        step.expected[node] = expected
        if bad:
            log.warning("dropped %d of %d line(s) of step_output from %s: not its tasks'", bad, len(msg.lines), node)
        step.poke()

    async def _exit(self, step: Step, node: str, msg: StepExit) -> None:
        rank, code, sig = msg.rank, msg.exit_code, msg.signal
        lo = step.nodes.index(node) * step.ntasks_per_node
        ranks = list(range(lo, lo + step.ntasks_per_node)) if rank is None else [rank]
        if not all(lo <= r < lo + step.ntasks_per_node for r in ranks):
            log.warning("dropped step_exit from %s: rank %s is not one of its tasks", node, rank)
            return
        if msg.next is not None and msg.next > step.needed.get(node, 0):
            step.needed[node] = msg.next
        for r in ranks:
            if r in step.exits:
                continue
            step.exits[r] = (code, sig)
            if (code != 0 or sig) and step.exit_code is None:
                stopping = self._stopping(step)
                why = msg.message
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
                await self.bus.publish(node_cmd(node), StepKill(step.job_id, step.attempt, step.step_id))
            except Exception as e:   # the job's end kills the tasks in any case
                log.warning("job %d step %d: cannot send step_kill to %s: %s", step.job_id, step.step_id, node, e)

    def _stopping(self, step: Step) -> str | None:
        """Why the step's job is stopping or gone ("was cancelled"...), None while it runs."""
        job = self.store.active.get(step.job_id)
        if job is None or job.attempt != step.attempt:
            return "ended"
        if job.state is JobState.RUNNING:
            return None
        stop = StopReason.of(job.stop_reason)
        return STOP_WORDS.get(stop.kind, "is stopping") if stop is not None else "is stopping"

    def _finish(self, step: Step) -> None:
        step.done_at = self._clock()
        step.poke()

    def job_ended(self, job_id: int) -> None:
        """The job is no longer running: its steps are done (its tasks die with its parts)."""
        job = self.store.active.get(job_id)
        state = job.state.value if job is not None else "ended"
        for (jid, _), step in list(self.steps.items()):
            if jid == job_id and not step.done:
                if step.exit_code is None:
                    step.exit_code = 1
                    step.message = f"job {job_id} {'was requeued' if state == 'PENDING' else 'ended'}; its tasks were killed"
                self._finish(step)
        self._forget_old()

    def _forget_old(self) -> None:
        now = self._clock()
        for key, step in list(self.steps.items()):
            if step.done_at is not None and now - step.done_at > KEEP_DONE:
                del self.steps[key]
        self.numbers.forget({k[0] for k in self.steps} | set(self.store.active))

    def _job(self, caller: Caller, job_id: Any) -> "JobRecord":
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise RequestError("srun: job_id must be a positive integer")
        job = self.store.active.get(job_id)
        if job is None:
            raise RequestError(f"srun: job {job_id} is not running (finished, or no such job)")
        if caller.uid not in (job.uid, 0):
            # Not even an admin: the tasks would run as the job's user (as in Slurm).
            raise RequestError(f"srun: Access/permission denied: job {job_id} belongs to {job.user}; only its "
                               "owner or root may run tasks in it (an admin may cancel, hold or requeue it)")
        return job
