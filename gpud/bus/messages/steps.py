"""``gpuctl srun`` steps: head -> worker ``step``, ``step_kill``, ``step_ack``, ``step_input``,
``step_resize``; worker -> head ``step_output`` and ``step_exit`` (``StepRef``: the step
they name)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..fields import MAX_ID, MessageError, any_text, env, flag, integer, is_int, items, obj, text
from .body import Body, read_rlimits

MAX_TASKS_PER_NODE = 256           # srun tasks one node starts for one step
MAX_INPUT_CHUNK = 64 << 10         # characters of one step_input
MAX_LINES = 1 << 17                # items in one step_output (the envelope's 1 MiB bounds it anyway)
MAX_WRITERS = 1024                 # input writers one step_output reports
MAX_STATUS = 255                   # a task's exit code as a shell sees it
MAX_SIGNAL = 127
STREAMS = (1, 2, 3)                # stdout, stderr, a terminal's bytes (latin-1)


# -- head -> worker: steps (gpuctl srun) ------------------------------------------------------------

@dataclass(frozen=True)
class StepRef(Body):
    """What every step message names: the allocation and the step."""

    job: int
    attempt: int
    step: int

    def ref(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "step": self.step}

    @classmethod
    def read_ref(cls, d: Any) -> tuple[int, int, int]:
        d = obj(d)
        return integer(d, "job"), integer(d, "attempt"), integer(d, "step")


@dataclass(frozen=True, kw_only=True)
class StepStart(StepRef):
    """``step``: start ``ntasks_per_node`` tasks of a step here, at node rank ``node_rank``."""

    KIND: ClassVar[str] = "step"

    argv: tuple[str, ...]
    env: dict[str, str]         # srun's environment (the job's wins over it)
    ntasks_per_node: int
    node_rank: int
    nnodes: int
    nodelist: str
    master_addr: str
    master_port: int
    pty: bool = False           # one task on a terminal
    stdin: bool = False         # task 0 takes input (step_input)
    rows: int = 24
    cols: int = 80
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)   # srun's own (model.parse_rlimits)

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "argv": list(self.argv), "env": dict(self.env),
                "ntasks_per_node": self.ntasks_per_node, "node_rank": self.node_rank, "nnodes": self.nnodes,
                "nodelist": self.nodelist, "master_addr": self.master_addr, "master_port": self.master_port,
                "pty": self.pty, "stdin": self.stdin, "rows": self.rows, "cols": self.cols}
        if self.rlimits:   # absent: none (what older heads send)
            body["rlimits"] = {k: list(v) for k, v in self.rlimits.items()}
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepStart":
        ref = cls.read_ref(d)
        per_node, rank = integer(d, "ntasks_per_node", 1, MAX_TASKS_PER_NODE), integer(d, "node_rank", 0, 1 << 20)
        nnodes = integer(d, "nnodes", 1, 1 << 20)
        if rank >= nnodes:
            raise MessageError("node_rank must be below nnodes")
        argv = d.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv) \
                or not argv[0]:
            raise MessageError("argv must be a non-empty list of strings")
        pty = flag(d, "pty")
        if pty and per_node * nnodes != 1:
            raise MessageError("a step on a terminal has one task")
        return cls(*ref, argv=tuple(argv), env=env(d, "env"), ntasks_per_node=per_node, node_rank=rank,
                   nnodes=nnodes, nodelist=text(d, "nodelist", most=65536),
                   master_addr=text(d, "master_addr", most=65536), master_port=integer(d, "master_port", 0, 65535),
                   pty=pty, stdin=flag(d, "stdin"), rows=integer(d, "rows", 1, 65535, 24),
                   cols=integer(d, "cols", 1, 65535, 80), rlimits=read_rlimits(d.get("rlimits")))


@dataclass(frozen=True)
class StepKill(StepRef):
    """``step_kill``: kill the step's tasks here (a task failed somewhere, or srun was interrupted)."""

    KIND: ClassVar[str] = "step_kill"

    def to_body(self) -> dict[str, Any]:
        return self.ref()

    @classmethod
    def from_body(cls, d: Any) -> "StepKill":
        return cls(*cls.read_ref(d))


@dataclass(frozen=True)
class StepAck(StepRef):
    """``step_ack``: the readers have every output item before ``next``; with ``resend``,
    send what is kept from there again."""

    KIND: ClassVar[str] = "step_ack"

    next: int = 0
    resend: bool = False

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "next": self.next, "resend": self.resend}

    @classmethod
    def from_body(cls, d: Any) -> "StepAck":
        return cls(*cls.read_ref(d), integer(d, "next"), flag(d, "resend"))


def _latin1(data: str) -> bool:
    return all(ord(c) <= 255 for c in data)


@dataclass(frozen=True)
class StepInput(StepRef):
    """``step_input``: chunk ``seq`` of ``writer``'s input for task 0 (bytes as latin-1 text)."""

    KIND: ClassVar[str] = "step_input"

    writer: str = ""
    seq: int = 0
    data: str = ""
    eof: bool = False

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "writer": self.writer, "seq": self.seq, "data": self.data, "eof": self.eof}

    @classmethod
    def from_body(cls, d: Any) -> "StepInput":
        ref = cls.read_ref(d)
        writer = text(d, "writer", most=64)
        data = any_text(d, "data", "")
        if len(data) > MAX_INPUT_CHUNK or not _latin1(data):
            raise MessageError(f"data must be bytes as latin-1 text, at most {MAX_INPUT_CHUNK} characters")
        return cls(*ref, writer, integer(d, "seq"), data, flag(d, "eof"))


@dataclass(frozen=True)
class StepResize(StepRef):
    """``step_resize``: a terminal step's new window size."""

    KIND: ClassVar[str] = "step_resize"

    rows: int = 24
    cols: int = 80

    def to_body(self) -> dict[str, Any]:
        return {**self.ref(), "rows": self.rows, "cols": self.cols}

    @classmethod
    def from_body(cls, d: Any) -> "StepResize":
        return cls(*cls.read_ref(d), integer(d, "rows", 1, 65535), integer(d, "cols", 1, 65535))


# -- worker -> head: step output ----------------------------------------------------------------------

def _line(item: Any) -> tuple[int, int, str] | None:
    """[rank, stream, text]."""
    if isinstance(item, list) and len(item) == 3 and is_int(item[0]) and 0 <= item[0] <= MAX_ID \
            and is_int(item[1]) and item[1] in STREAMS and isinstance(item[2], str):
        return item[0], item[1], item[2]
    return None


def _step_extras(d: dict) -> tuple[int | None, bool]:
    """``tasks`` and ``pty``, which a worker adds so a restarted head can adopt the step."""
    return integer(d, "tasks", 1, MAX_TASKS_PER_NODE, None), flag(d, "pty")


@dataclass(frozen=True)
class StepOutput(StepRef):
    """``step_output``: items ``first``, ``first + 1``... of the node's output of a step,
    and how much of each writer's input task 0 has had."""

    KIND: ClassVar[str] = "step_output"

    first: int | None = None     # None: a worker from before the numbering
    lines: tuple[tuple[int, int, str], ...] = ()   # (rank, stream, text)
    seq: int = 0
    input: dict[str, int] = field(default_factory=dict)
    tasks: int | None = None     # the node's tasks (for a head adopting the step)
    pty: bool = False

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "seq": self.seq, "first": self.first, "lines": [list(x) for x in self.lines],
                "input": dict(self.input), "pty": self.pty}
        if self.tasks is not None:
            body["tasks"] = self.tasks
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepOutput":
        ref = cls.read_ref(d)
        got = d.get("input") or {}
        if not isinstance(got, dict) or len(got) > MAX_WRITERS or not all(
                isinstance(w, str) and 0 < len(w) <= 64 and is_int(n) and 0 <= n <= MAX_ID for w, n in got.items()):
            raise MessageError("input must map writers to counts")
        return cls(*ref, first=integer(d, "first", default=None),
                   lines=items(d, "lines", MAX_LINES, _line, "[rank, stream, text]"),
                   seq=integer(d, "seq", default=0), input=dict(got), tasks=_step_extras(d)[0], pty=flag(d, "pty"))


@dataclass(frozen=True)
class StepExit(StepRef):
    """``step_exit``: a task of the step ended here (``rank`` None: every task of the node,
    as when the node refused the step); ``next``: the output items sent before it."""

    KIND: ClassVar[str] = "step_exit"

    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None
    next: int | None = None
    tasks: int | None = None
    pty: bool = False

    def to_body(self) -> dict[str, Any]:
        body = {**self.ref(), "rank": self.rank, "exit_code": self.exit_code, "signal": self.signal,
                "message": self.message, "next": self.next, "pty": self.pty}
        if self.tasks is not None:
            body["tasks"] = self.tasks
        return body

    @classmethod
    def from_body(cls, d: Any) -> "StepExit":
        ref = cls.read_ref(d)
        tasks, pty = _step_extras(d)
        return cls(*ref, rank=integer(d, "rank", default=None),
                   exit_code=integer(d, "exit_code", 0, MAX_STATUS, None),
                   signal=integer(d, "signal", 0, MAX_SIGNAL, None), message=any_text(d, "message"),
                   next=integer(d, "next", default=None), tasks=tasks, pty=pty)
