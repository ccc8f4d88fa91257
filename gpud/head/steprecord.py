"""An srun step as the head holds it (``Step``): its nodes and tasks, the output it keeps
for its readers (at most ``MAX_STEP_OUTPUT`` bytes, the oldest lines dropped first), where
each node's numbered items stand, and the tasks' exits; and a task's status as a shell
reports it (``task_exit_code``).  See gpud.head.steps."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

MAX_STEP_OUTPUT = 4 << 20     # bytes of output kept per step; older lines are dropped
LINE_OVERHEAD = 64            # bytes a kept line costs beside its text (the cap counts it)


@dataclass
class Step:
    job_id: int
    attempt: int
    step_id: int
    uid: int
    nodes: list[str]
    ntasks_per_node: int
    lines: deque = field(default_factory=deque)   # (offset, rank, stream, text, node, index)
    next_offset: int = 0
    size: int = 0
    pty: bool = False
    stdin: bool = False
    expected: dict[str, int | None] = field(default_factory=dict)   # node -> next item number to take
    needed: dict[str, int] = field(default_factory=dict)    # node -> items before its last exit
    acked: dict[str, int] = field(default_factory=dict)     # node -> what it was told was read
    gap_asked: dict[str, tuple[int, float]] = field(default_factory=dict)
    input_next: dict[str, int] = field(default_factory=dict)    # writer -> chunks task 0 has had
    input_moved: asyncio.Event = field(default_factory=asyncio.Event)
    read_at: float = 0.0          # monotonic: the last poll
    exits: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)  # rank -> (code, sig)
    bad_rank: int | None = None
    exit_code: int | None = None
    message: str | None = None
    done_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ntasks(self) -> int:
        return len(self.nodes) * self.ntasks_per_node

    @property
    def done(self) -> bool:
        return self.done_at is not None

    def add(self, rank: int, stream: int, text: str, node: str = "", index: int = 0) -> None:
        self.lines.append((self.next_offset, rank, stream, text, node, index))
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
