"""The head's door for what workers (and relays) send: the bus loop and its dispatch.

``WorkerInbox`` reads the bus in arrival order.  A run of well-formed ``started`` and
``finished`` reports of known nodes waiting together goes to ``WorkerReports`` as one
batch (one commit, one ack per node); everything else is decoded and handed, one at a
time, to the part of the head it concerns: registrations and heartbeats to ``Liveness``,
GPU samples to ``Telemetry``, srun step output and exits to ``Steps``, relayed gpuctl
requests to ``RelayedRequests``.  A malformed message is logged in one line and dropped;
a worker the head does not know is asked to register.

It is given only the bus, the store (which nodes the head knows) and its ``Routes``: for
each kind of message, the callable of the part that takes it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from ..bus.base import HEAD_EVENTS, HEAD_REQUESTS, Bus, Message, node_cmd
from ..bus.messages import (Finished, Heartbeat, Hello, MessageError, Register, Samples, Started, StepExit,
                            StepOutput, decode)

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("gpud.head")

MAX_REPORT_BATCH = 1000         # worker messages taken from the bus at once


Reports = list[tuple[str, Started | Finished]]   # (node, report) in arrival order


@dataclass(frozen=True)
class Routes:
    """Where each message goes (the part of the head that takes it)."""
    relayed: Callable[[Message], Awaitable[None]]                  # gpuctl via a relay: RelayedRequests
    register: Callable[[str, Register], Awaitable[None]]           # Liveness
    heartbeat: Callable[[str, Heartbeat], Awaitable[None]]         # Liveness
    started: Callable[[str, Started], None]                        # salloc's holders: Allocations
    reports: Callable[[Reports], Awaitable[None]]                  # one commit: WorkerReports.apply
    samples: Callable[[str, Samples], Awaitable[None]]             # Telemetry.ingest
    bad_samples: Callable[[], None]                                # counts a malformed one: Telemetry
    step: Callable[[str, StepOutput | StepExit], Awaitable[None]]  # srun steps: Steps


class WorkerInbox:
    def __init__(self, bus: Bus, store: "Store", routes: Routes) -> None:
        self.bus = bus
        self.store = store
        self.routes = routes

    async def run(self) -> None:
        """Messages in arrival order; a run of ``started``/``finished`` reports waiting
        together is applied as one batch (one commit, one ack per node)."""
        inbox: asyncio.Queue[Message | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for m in self.bus.messages():
                    inbox.put_nowait(m)
            finally:
                inbox.put_nowait(None)

        reader = asyncio.create_task(read(), name="bus-reader")
        try:
            while True:
                msgs = [await inbox.get()]
                while not inbox.empty() and len(msgs) < MAX_REPORT_BATCH:
                    msgs.append(inbox.get_nowait())
                run: Reports = []
                for msg in msgs:
                    report = self._report(msg) if msg is not None else None
                    if report is not None:
                        run.append(report)
                        continue
                    await self._reports_or_log(run)
                    run = []
                    if msg is None:
                        await reader  # the bus closed: end as it ended (an error propagates)
                        return
                    try:
                        await self.handle(msg)
                    except Exception:
                        log.exception("dropped %s message from %s: handler failed", msg.kind, msg.sender)
                await self._reports_or_log(run)
        finally:
            reader.cancel()

    def _report(self, msg: Message) -> tuple[str, Started | Finished] | None:
        """(node, report) for a well-formed ``started``/``finished`` of a known node, which
        the bus loop batches; None for anything else (``handle`` takes it, and logs it if bad)."""
        if not (msg.topic == HEAD_EVENTS and msg.kind in (Started.KIND, Finished.KIND)
                and msg.sender.startswith("worker:") and msg.sender[len("worker:"):] in self.store.nodes):
            return None
        try:
            report = decode(msg.kind, msg.body)
        except MessageError:
            return None
        assert isinstance(report, (Started, Finished))
        return msg.sender[len("worker:"):], report

    async def _reports_or_log(self, run: Reports) -> None:
        if not run:
            return
        for node, report in run:
            if isinstance(report, Started):   # salloc is granted once every node's holder runs
                self.routes.started(node, report)
        try:
            await self.routes.reports(run)
        except Exception:
            log.exception("dropped %d started/finished reports: handler failed", len(run))

    async def handle(self, msg: Message) -> None:
        routes = self.routes
        if msg.topic == HEAD_REQUESTS:
            return await routes.relayed(msg)
        if msg.topic != HEAD_EVENTS:
            return  # node status topics: liveness is judged by heartbeats
        if not msg.sender.startswith("worker:"):
            log.warning("dropped %s message from %s: not a worker", msg.kind, msg.sender)
            return
        node = msg.sender[len("worker:"):]
        try:
            report = decode(msg.kind, msg.body)
        except MessageError as e:
            if msg.kind == Samples.KIND:
                routes.bad_samples()
            log.warning("dropped %s from %s: %s", msg.kind, node, e)
            return
        if isinstance(report, Register):
            await routes.register(node, report)
        elif node not in self.store.nodes:
            # A worker we do not know yet (e.g. the head lost its database): ask it to register.
            await self.bus.publish(node_cmd(node), Hello())
        elif isinstance(report, Heartbeat):
            await routes.heartbeat(node, report)
        elif isinstance(report, Started):
            await self._on_started(node, report)
        elif isinstance(report, Finished):
            await self._on_finished(node, report)
        elif isinstance(report, Samples):
            await routes.samples(node, report)
        elif isinstance(report, (StepOutput, StepExit)):
            await routes.step(node, report)
        else:
            log.warning("dropped %s from %s: not a worker's message", msg.kind, msg.sender)

    async def _on_started(self, node: str, report: Started) -> None:
        self.routes.started(node, report)
        await self.routes.reports([(node, report)])

    async def _on_finished(self, node: str, report: Finished) -> None:
        await self.routes.reports([(node, report)])
