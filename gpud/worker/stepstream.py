"""An srun step's stream on this node: its tasks' output numbered, batched, kept until the
head acknowledges it and sent again when asked; task 0's input written in order.  See
gpud.worker.steps.

Output is read in chunks, cut into lines (a line longer than ``MAX_LINE`` is split) and
sent as ``step_output`` batches of whole lines, at most ``BATCH_BYTES`` each.  Every item
(one line, or one chunk of a terminal's bytes) has a number, counted per step on this
node from 0; a batch says the number of its first item (``first``).  Sent items are kept
until the head acknowledges them (``step_ack`` {next}: the reader has everything before
``next``), and readers stop reading while ``WINDOW`` bytes are sent and not acknowledged
or wait to be sent: a slow terminal at the far end slows the task down, nothing is
buffered without end.  ``step_ack`` with ``resend`` asks for everything kept from
``next`` on again (a restarted head, or a gap it saw), with the exits; when acknowledgements
stop coming for a while (gpud.worker.steps, ``RESEND_AFTER``) the kept items go out again
by themselves.  So a head restart or a broker blip loses nothing and, with the head
dropping numbers it has, doubles nothing.  A task's last items go out before its
``step_exit``, which carries the number after them (``next``): the head never ends a step
before it has the output before the exit.

Input goes to task 0 only.  ``step_input`` {writer, seq, data, eof} chunks are numbered
per writer (srun, sattach); they are written in order, once each (repeats are dropped,
early ones wait for the gap), and what each writer has had written is reported back in
``step_output``'s ``input`` {writer: next seq}.  ``data`` is bytes as latin-1 text.

A ``pty`` step's task is on a pseudo-terminal: its output goes out as raw bytes (stream 3,
latin-1 text) as soon as it is read, and ``step_resize`` {rows, cols} sets the window size
(gpud.worker.stepterm).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..bus.messages import Body, StepExit, StepOutput
from .stepterm import set_size, write_all

log = logging.getLogger("gpud.worker.steps")

READ_CHUNK = 64 << 10
MAX_LINE = 64 << 10           # longer lines are sent in pieces
BATCH_BYTES = 64 << 10        # at most this much text per step_output message
WINDOW = 1 << 20              # readers pause while this much output is unacknowledged or unsent
FLUSH_EVERY = 0.05            # seconds output may wait to share a message with more
TERMINAL_LINGER = 1.0         # seconds a terminal is read after its task exited
MAX_WRITERS = 16              # input writers remembered per step
MAX_HELD_INPUT = 64           # input chunks held per step waiting for an earlier one
PTY_STREAM = 3                # a terminal's raw bytes, as latin-1 text

Emit = Callable[[Body], Awaitable[None]]   # a step_output or step_exit, to the head


@dataclass(eq=False)
class Task:
    rank: int
    proc: asyncio.subprocess.Process | None = None
    record: str | None = None     # its file under state_dir while it runs
    master: int | None = None     # a terminal's master side (pty steps)


@dataclass(eq=False)
class Step:
    job: int
    attempt: int
    step: int
    emit: Emit                    # where its step_output and step_exit go
    per_node: int = 1
    pty: bool = False
    stdin: bool = False           # task 0 runs here and takes input
    tasks: list[Task] = field(default_factory=list)
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

    # -- output ---------------------------------------------------------------------------------

    async def add(self, rank: int, fd: int, texts: list[str]) -> None:
        await self.room.wait()
        first = not self.pending
        self.pending.extend([rank, fd, text] for text in texts)
        self.pending_bytes += sum(len(t) for t in texts)
        self.update_room()
        if self.pending_bytes >= BATCH_BYTES:
            await self.flush()
        elif first:   # a terminal's echo goes at once; lines may wait a little for company
            asyncio.get_running_loop().call_later(
                0 if self.pty else FLUSH_EVERY, lambda: asyncio.ensure_future(self.flush()))

    async def flush(self) -> None:
        async with self.send_lock:   # batches go out in order, each numbered once
            while self.pending:
                n, size = 0, 0
                while n < len(self.pending) and (n == 0 or size + len(self.pending[n][2]) <= BATCH_BYTES):
                    size += len(self.pending[n][2])
                    n += 1
                batch, self.pending = self.pending[:n], self.pending[n:]
                self.pending_bytes -= size
                self.seq += 1
                first = self.next_index
                self.next_index += len(batch)
                if not self.kept:
                    self.acked_at = time.monotonic()
                self.kept.extend(zip(range(first, first + len(batch)), batch))
                self.kept_bytes += size
                await self.emit(self.output(first, batch, self.seq))
            self.update_room()

    async def ack(self, upto: int, resend: bool) -> None:
        """``step_ack``: the reader has every item before ``upto``; with ``resend``, send
        the kept ones from there again (and the exits)."""
        moved = False
        while self.kept and self.kept[0][0] < upto:
            self.kept_bytes -= len(self.kept.popleft()[1][2])
            moved = True
        if upto > self.acked:
            self.acked = upto
        if moved:
            self.acked_at = time.monotonic()
            self.update_room()
        if resend:
            await self.resend(upto)

    async def resend(self, start: int) -> None:
        async with self.send_lock:
            items = [(i, item) for i, item in self.kept if i >= start]
            while items:
                batch, size = [], 0
                while items and (not batch or size + len(items[0][1][2]) <= BATCH_BYTES):
                    i, item = items.pop(0)
                    batch.append((i, item))
                    size += len(item[2])
                await self.emit(self.output(batch[0][0], [item for _, item in batch]))
            if not self.kept:   # tell the head where the stream stands, even with nothing to send
                await self.emit(self.output(self.next_index, []))
            self.acked_at = time.monotonic()
        for sent in self.exits:
            await self.emit(sent)

    # -- reading the tasks ------------------------------------------------------------------------

    async def read(self, task: Task, stream: asyncio.StreamReader | None, fd: int) -> None:
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
            texts = [piece for line in lines for piece in pieces(line)]
            if texts:
                await self.add(task.rank, fd, texts)
        if partial:
            await self.add(task.rank, fd, [partial.decode(errors="replace") + "\n"])

    async def read_terminal(self, task: Task) -> None:
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
                await self.add(task.rank, PTY_STREAM, [chunk.decode("latin-1")])
        finally:
            transport.close()

    # -- input and the window size ----------------------------------------------------------------

    def take_input(self, writer: str, seq: int, data: str, eof: bool) -> bool:
        """``step_input``: bytes (latin-1 text) for task 0, once each, in each writer's order;
        False when the step takes no input here or the writer is one too many."""
        if self.inputs is None:
            return False
        if writer not in self.input_next:
            if len(self.input_next) >= MAX_WRITERS:
                log.warning("job %d step %d: input from too many writers; %s dropped", self.job, self.step, writer)
                return False
            self.input_next[writer] = 0
        nxt = self.input_next[writer]
        if seq < nxt:
            return True    # a repeat
        if seq > nxt:      # an earlier chunk is still on its way
            if len(self.held) < MAX_HELD_INPUT:
                self.held[(writer, seq)] = (data, eof)
            return True
        while True:
            self.inputs.put_nowait((data, eof))
            nxt += 1
            if (writer, nxt) not in self.held:
                break
            data, eof = self.held.pop((writer, nxt))
        self.input_next[writer] = nxt
        return True

    async def feed(self, task: Task) -> None:
        """Task 0's input, written in order as it comes; each chunk reported once written."""
        assert self.inputs is not None and task.proc is not None
        loop = asyncio.get_running_loop()
        while True:
            data, eof = await self.inputs.get()
            raw = data.encode("latin-1", errors="replace")
            try:
                if task.master is not None:
                    if raw:
                        await write_all(loop, task.master, raw)
                elif task.proc.stdin is not None:
                    if raw:
                        task.proc.stdin.write(raw)
                        await task.proc.stdin.drain()
                    if eof:
                        task.proc.stdin.close()
            except (OSError, ConnectionResetError, BrokenPipeError):
                pass   # the task stopped reading (or ended); what it did not take is gone with it
            if self.inputs.empty():
                await self.emit(self.output(self.next_index, []))

    def resize(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        for t in self.tasks:
            if t.master is not None:
                set_size(t.master, rows, cols)


def pieces(line: bytes) -> list[str]:
    """One line of output as text, cut into MAX_LINE pieces, each ending in a newline."""
    if len(line) <= MAX_LINE:
        return [line.decode(errors="replace") + "\n"]
    return [line[i:i + MAX_LINE].decode(errors="replace") + "\n" for i in range(0, len(line), MAX_LINE)]
