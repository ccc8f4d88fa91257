"""Which nodes are alive, and the leases that let their workers run jobs.

``Liveness`` takes the workers' ``register`` and ``heartbeat``: a registration brings a
node (back) UP with its resources; a heartbeat renews the node's lease, fences what the
node runs that the head no longer assigns to it, and re-sends launches the node does not
report and stops it has not acted on (through ``WorkerCommands``).  Its loop marks nodes
DOWN after ``node_timeout`` without a heartbeat (nothing new is scheduled there) and
requeues their jobs (or ends them NODE_FAIL with --no-requeue) only once the node's lease
has surely ended.  Time while the head itself is cut off from the broker does not count
against the nodes.

Leases (no job runs twice at once): a worker runs allocations only while it holds a lease,
renewed by the head's ``lease`` answer to each heartbeat.  The worker times the lease from
when it *sent* that heartbeat, the head from when it *answered* it, each on its own
monotonic clock, so the worker's lease always ends before the head's idea of it; the head
starts a lost job's replacement only ``lease + lease_margin(lease)`` after its last answer
to the node, or as soon as the worker reports the attempt ended.  A launch carries the
heartbeat it was granted on (``lease.seq``): a worker never starts one whose lease lapsed.
Every judgement here reads the monotonic clock (``mono``); the change door's wall clock
only stamps what is stored.

It is given only what it uses: the store (read; every write goes through the head's
change door, ``change``), the bus, ``WorkerCommands``, the live config and the monotonic
clock as getters (a reload or a test swaps them), and three callbacks: the WAL
checkpoint, a node's MIG layout on registering, and a job's srun steps ended.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..bus.base import node_cmd
from ..bus.messages import Heartbeat, Kill, Lease, Register
from ..model import JobState, NodeState, StopReason
from . import gang
from .jobs import requeue_changes
from .ops_slurm import node_time_limit
from .scheduling import DOWN, DRAIN, UP
from .store import NodeRecord

if TYPE_CHECKING:
    from ..bus.base import Bus
    from ..config import Config
    from .change import Change
    from .commands import WorkerCommands
    from .store import Store

log = logging.getLogger("gpud.head")

LEASE_MARGIN = 1.0              # seconds, plus LEASE_MARGIN_SHARE of the lease: see lease_margin
LEASE_MARGIN_SHARE = 0.005      # monotonic clocks may run this much apart (NTP slews 0.05% at most)
LAUNCH_RESEND_AFTER = 3.0       # seconds before an unreported allocation's launch is re-sent
STOP_RESEND_AFTER = 5.0         # seconds before a stop signal is re-sent


def lease_margin(lease: float) -> float:
    """How long after a lease's end the head waits before it counts the worker's jobs dead:
    the worker's kill and the two monotonic clocks' different rates."""
    return LEASE_MARGIN + LEASE_MARGIN_SHARE * lease


class Liveness:
    def __init__(self, store: "Store", bus: "Bus", commands: "WorkerCommands", *,
                 config: Callable[[], "Config"], mono: Callable[[], float], change: Callable[[], "Change"],
                 lease_seq: dict[str, int], checkpoint: Callable[[], Awaitable[None]],
                 registered: Callable[[str, dict[str, Any], float], None],
                 job_ended: Callable[[int], Any]) -> None:
        self.store = store
        self.bus = bus
        self.commands = commands
        self._config = config            # the live config: lease and node_timeout may change on reload
        self._mono = mono
        self._change = change            # the head's change door (head/change.py)
        self._checkpoint = checkpoint    # the WAL's, after each judgement of the nodes
        self._registered = registered    # a node's MIG layout (MigCommands.registered)
        self._job_ended = job_ended      # a lost job's srun steps end (Steps.job_ended)
        self.lease_seq = lease_seq       # node -> the heartbeat its last lease answered (commands read it)
        self.heard: dict[str, float] = {}     # node -> mono time of its last heartbeat or register
        self.granted: dict[str, float] = {}   # node -> mono time of the last lease granted to it

    def head_started(self) -> None:
        """Nodes get a full timeout from the head's start to report in: the head being down
        is not the nodes' fault.  And any of them may hold a lease granted just before a
        crash: their jobs are replaced no earlier than a whole lease from now."""
        mono = self._mono()
        for name in self.store.nodes:
            self.heard[name] = self.granted[name] = mono

    def bus_reconnected(self) -> None:
        """Whatever time the head was away does not count against the nodes (their leases
        went on ending meanwhile: ``granted`` stays as it was)."""
        mono = self._mono()
        for name in self.store.nodes:
            self.heard[name] = mono

    # -- what the workers say -----------------------------------------------------------------

    async def on_register(self, node: str, msg: Register) -> None:
        info = msg.node
        if info.name != node:
            log.warning("dropped register from %s: claims to be %s", node, info.name)
            return
        self.heard[node] = self._mono()
        self.granted.setdefault(node, self.heard[node])
        old = self.store.nodes.get(node)
        back = old is None or old.state in (DOWN, NodeState.UNKNOWN.value)
        state = UP if back else old.state
        if back:
            log.info("node %s up: %d GPUs, %d CPUs, %d MB", node, len(info.gpus), info.cpus, info.mem_mb)
        async with self._change() as ch:
            now = ch.now
            ch.txn.node_transition(
                old or NodeRecord(name=node, info={}, state=UP, reason=None, last_seen=now, registered=now),
                state, reason=None if back else old.reason, now=now,
                event="registered" if old is None else "returned" if back else "registered again",
                info=info.to_dict(), last_seen=now)
            ch.then(self._registered, node, info.to_dict(), now)   # before the woken pass: it reads the layouts
            ch.wake()

    async def on_heartbeat(self, node: str, hb: Heartbeat) -> None:
        store, commands = self.store, self.commands
        running, done, seq = hb.running, hb.done, hb.seq
        rec = store.nodes[node]
        mono = self.heard[node] = self._mono()
        if rec.state == DOWN:
            async with self._change() as ch:
                ch.txn.node_transition(rec, UP, reason=None, now=ch.now, event="returned", last_seen=ch.now)
                ch.wake()
            log.info("node %s is back", node)
        # The lease: granted (and recorded) before it is sent, so the head's idea of when it
        # ends is never earlier than the worker's.
        here = list(store.jobs_on_node(node))
        if seq is not None:
            self.granted[node] = mono
            self.lease_seq[node] = seq
            cfg = self._config()
            # Each allocation's time limit rides along, so a lost ``time_limit`` command (an
            # operator raising it) reaches the node with the next answer.
            await self.bus.publish(node_cmd(node), Lease(
                seq, cfg.head.lease, tuple((j.job_id, j.attempt) for j in here),
                tuple((j.job_id, j.attempt, node_time_limit(j, gang.rank_of(j, node) or 0, cfg.head.kill_grace))
                      for j in here)))
        # Fencing: kill whatever this node runs that the head no longer assigns to it.
        stale = []
        for jid, attempt in running:
            job = store.active.get(jid)
            if job is None or job.attempt != attempt or not job.state.active or gang.rank_of(job, node) is None:
                stale.append((jid, attempt))
        if stale:
            log.warning("node %s runs allocations no longer assigned to it, killing: %s", node,
                        [list(p) for p in stale])
            await self.bus.publish(node_cmd(node), Kill(tuple(stale), "fenced"))
        reported = set(running) | set(done)
        for job in list(store.jobs_on_node(node)):
            key = (job.job_id, job.attempt)
            if key in reported:
                if job.state is JobState.COMPLETING and key in set(running):
                    sent = commands.stop_sent.get(key, float("-inf"))
                    if mono - sent > STOP_RESEND_AFTER:
                        await commands.resend_stop(job, node)
                continue
            sent = commands.launch_sent.setdefault(key, mono)
            if job.launched_at is not None and mono - sent > LAUNCH_RESEND_AFTER:
                log.info("re-sending launch of job %d attempt %d to %s", job.job_id, job.attempt, node)
                await commands.send_launch(job, node)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        while True:  # node_timeout may change on reload
            await asyncio.sleep(max(0.05, min(1.0, self._config().head.node_timeout / 4)))
            await self.tick()

    async def tick(self) -> None:
        """Judge the nodes and keep the WAL small; a failure (a full disk, say) is logged and
        the next tick tries again: never fatal."""
        try:
            await self.check_nodes()
        except Exception as e:
            log.error("liveness: could not record node changes (will retry): %s", e,
                      exc_info=not isinstance(e, (sqlite3.Error, OSError)))
        try:
            await self._checkpoint()
        except Exception as e:
            log.warning("could not checkpoint the database's WAL: %s", e)

    def lease_ends(self, node: str) -> float:
        """Mono time by which the node's worker has surely stopped what it ran for us."""
        lease = self._config().head.lease
        return self.granted.get(node, float("-inf")) + lease + lease_margin(lease)

    async def check_nodes(self) -> None:
        store = self.store
        mono, timeout = self._mono(), self._config().head.node_timeout
        for rec in list(store.nodes.values()):
            heard = self.heard.get(rec.name)
            if rec.state in (UP, DRAIN) and heard is not None and mono - heard > timeout:
                await self.node_down(rec, f"no heartbeat for {mono - heard:.0f}s")
        for rec in list(store.nodes.values()):
            if rec.state == DOWN and mono >= self.lease_ends(rec.name) and \
                    next(store.jobs_on_node(rec.name), None) is not None:
                await self.node_failed(rec)

    async def node_down(self, rec: NodeRecord, reason: str) -> None:
        """No more jobs for the node; what runs there is kept until its lease has ended."""
        async with self._change() as ch:
            ch.txn.node_transition(rec, DOWN, reason=reason, now=ch.now, event="node_down")
            ch.wake()
        jobs = list(self.store.jobs_on_node(rec.name))
        wait = max(0.0, self.lease_ends(rec.name) - self._mono())
        log.warning("node %s DOWN: %s%s", rec.name, reason,
                    f"; its {len(jobs)} job(s) are requeued once its lease has ended, in {wait:.0f}s, "
                    "unless it returns" if jobs else "")

    async def node_failed(self, rec: NodeRecord) -> None:
        """The DOWN node's lease has ended: its jobs are surely dead there; requeue them."""
        async with self._change() as ch:
            now, txn = ch.now, ch.txn
            reason = f"node {rec.name} DOWN ({rec.reason or 'no heartbeat'}); its lease ended"
            lost = list(self.store.jobs_on_node(rec.name))
            for job in lost:
                txn.end_allocation(job.job_id, job.attempt, end=now, outcome="node_fail")
                if job.spec.requeue and job.stop_reason != StopReason.CANCELLED:
                    txn.transition(job, JobState.PENDING, now=now, event="node_fail",
                                   detail=f"{reason}; requeued", **requeue_changes(job))
                    log.info("job %d (user %s) requeued: %s", job.job_id, job.user, reason)
                else:
                    new = JobState.CANCELLED if job.stop_reason == StopReason.CANCELLED else JobState.NODE_FAIL
                    txn.transition(job, new, now=now, event="node_fail", detail=reason, end_time=now)
                    log.info("job %d (user %s) %s: %s", job.job_id, job.user, new.value, reason)
                ch.ended(job, now)
                if job.parts:   # a gang job's other parts hold nothing now
                    ch.then(self.commands.kill_parts, job, "node_fail", besides=rec.name)
                ch.then(self._job_ended, job.job_id)
            ch.wake()
