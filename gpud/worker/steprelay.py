"""The head's ``gpuctl srun`` step commands, handed to the node's step tasks.

``StepRelay`` takes ``step``, ``step_kill``, ``step_ack``, ``step_input`` and
``step_resize`` for the ``StepTasks`` (gpud.worker.steps) that run and stream a step's
tasks, and answers a step this node refuses (one it cannot even read) with a
``step_exit``: srun waits for one from every node.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from ..bus.base import HEAD_EVENTS
from ..bus.messages import Body, MessageError, StepAck, StepExit, StepInput, StepKill, StepRef, StepResize, StepStart

log = logging.getLogger("gpud.worker")


class StepRelay:
    def __init__(self, name: str, steps: Callable[[], Any],
                 publish: Callable[[str, Body], Awaitable[None]]) -> None:
        self.name = name
        self._steps = steps          # the StepTasks, once the worker runs (None before)
        self._publish = publish

    async def refuse(self, body: Any, why: str) -> None:
        """A step this node cannot start: srun waits for its tasks' exits, so say no."""
        try:
            job, attempt, step = StepRef.read_ref(body)
        except MessageError:
            return   # nothing to address the answer to
        why = f"node {self.name} refused the step: {why}"[:300]
        await self._publish(HEAD_EVENTS, StepExit(job, attempt, step, message=why))

    async def start(self, cmd: StepStart) -> None:
        steps = self._steps()
        if steps is not None:
            await steps.start(cmd)

    async def kill(self, cmd: StepKill) -> None:
        steps = self._steps()
        if steps is not None and steps.kill_step(cmd.job, cmd.attempt, cmd.step):
            log.info("job %s.%s step %s on %s: tasks killed", cmd.job, cmd.attempt, cmd.step, self.name)

    async def ack(self, cmd: StepAck) -> None:
        steps = self._steps()
        if steps is not None:
            await steps.ack(cmd.job, cmd.attempt, cmd.step, cmd.next, cmd.resend)

    async def input(self, cmd: StepInput) -> None:
        steps = self._steps()
        if steps is not None:
            await steps.write_input(cmd.job, cmd.attempt, cmd.step, cmd.writer, cmd.seq, cmd.data, cmd.eof)

    async def resize(self, cmd: StepResize) -> None:
        steps = self._steps()
        if steps is not None:
            steps.resize(cmd.job, cmd.attempt, cmd.step, cmd.rows, cmd.cols)

    def handlers(self) -> dict[type, Callable[[Any], Awaitable[None]]]:
        """Its part of the worker's command table."""
        return {StepStart: self.start, StepKill: self.kill, StepAck: self.ack, StepInput: self.input,
                StepResize: self.resize}
