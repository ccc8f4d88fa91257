"""What the head sends workers about jobs: launches, stop signals and kills.

``WorkerCommands`` builds each job's launch (one per rank of a gang job, under the lease
the node was last granted), publishes signals and kills to every node a job holds, and
remembers when each was last sent, so the heartbeat handler (``liveness.py``) re-sends a
launch a worker does not report or a stop it has not acted on.  It holds no job state of
its own: the store is read, never written, and a launch that cannot be sent is handed
back as a worker's ``launch_failed`` report would be (``fail``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from ..bus.base import Bus, node_cmd
from ..bus.messages import Finished, GpuAssignment, Kill, Launch, MessageError, Signal
from ..model import StopReason
from . import gang
from .gpusharing import launch_devices

if TYPE_CHECKING:
    from ..config import Config
    from .store import JobRecord, Store

log = logging.getLogger("gpud.head")


class WorkerCommands:
    def __init__(self, bus: Bus, store: "Store", *, config: Callable[[], "Config"],
                 mono: Callable[[], float], clock: Callable[[], float],
                 launch_fields: Callable[["JobRecord"], dict[str, Any]],
                 lease_seq: Mapping[str, int],
                 fail: Callable[[str, Finished], Awaitable[None]]) -> None:
        self.bus = bus
        self.store = store
        self._config = config            # the live config: kill_grace may change on reload
        self._mono = mono
        self._clock = clock
        self._launch_fields = launch_fields   # the Slurm-compatible fields (SlurmSupport)
        self._lease_seq = lease_seq      # node -> the heartbeat its last lease answered
        self._fail = fail                # a launch that cannot be sent ends as this report
        self.stop_sent: dict[tuple[int, int], float] = {}    # mono time of the last stop sent
        self.launch_sent: dict[tuple[int, int], float] = {}  # mono time of the last launch sent

    def forget(self, key: tuple[int, int]) -> None:
        """The allocation ended: nothing of it is re-sent."""
        self.stop_sent.pop(key, None)
        self.launch_sent.pop(key, None)

    def launch_message(self, job: "JobRecord") -> Launch:
        """Rank 0's launch of ``job`` (``gang.launches`` makes the other ranks')."""
        spec = job.spec
        return Launch(
            job_id=job.job_id, attempt=job.attempt, name=job.name, user=job.user, uid=job.uid, gid=job.gid,
            script=spec.script, work_dir=spec.work_dir, stdout=spec.stdout, stderr=spec.stderr, env=dict(spec.env),
            rlimits=dict(spec.rlimits), gpus=tuple(GpuAssignment.from_dict(d) for d in launch_devices(job)),
            cpus=job.cpus, mem_mb=job.mem_mb, time_limit=job.time_limit, kill_grace=self._config().head.kill_grace,
            submit_dir=spec.work_dir, **self._launch_fields(job))

    async def send_launch(self, job: "JobRecord", node: str | None = None) -> None:
        """The launch of every node of ``job`` (a gang job has one per rank), or of ``node``."""
        assert job.node is not None
        slurm_env = bool(getattr(self._config().head, "slurm_compat_env", False))
        self.launch_sent[(job.job_id, job.attempt)] = self._mono()
        try:
            launches = gang.launches(self.launch_message(job), job, gang.master_addr(self.store, job), slurm=slurm_env)
        except MessageError as e:   # a recorded device the worker would refuse
            await self._launch_failed(job, node or job.node, str(e))
            return
        for where, launch in launches:
            if node is None or where == node:
                # the lease it is granted under: the worker never starts it once that lapsed
                launch = dataclasses.replace(launch, lease_seq=self._lease_seq.get(where))
                try:
                    await self.bus.publish(node_cmd(where), launch)
                except (ValueError, TypeError) as e:   # the bus cannot carry it (too large)
                    await self._launch_failed(job, where, str(e))
                    return

    async def _launch_failed(self, job: "JobRecord", node: str, why: str) -> None:
        """A launch that cannot be sent fails its job, as a worker's failed launch would; the
        node and everything else go on (it must not stall the pass or the node's heartbeats)."""
        log.error("job %d (user %s): cannot send its launch to %s: %s; the job fails", job.job_id, job.user,
                  node, why)
        await self._fail(node, Finished(
            job.job_id, job.attempt, None, None, "launch_failed", self._clock(),
            f"the head could not send the launch to {node}: {why}"[:300]))

    async def send_signal(self, job: "JobRecord", sig: str, *, grace: float | None, reason: str,
                          nodes: list[str] | None = None) -> None:
        """``sig`` to the job on every node it holds (or on ``nodes``)."""
        if job.node is None:
            return
        self.stop_sent[(job.job_id, job.attempt)] = self._mono()
        for node in nodes if nodes is not None else gang.job_nodes(job):
            await self.bus.publish(node_cmd(node), Signal(job.job_id, job.attempt, sig, grace, reason))

    async def resend_stop(self, job: "JobRecord", node: str) -> None:
        """The stop of a COMPLETING job that ``node`` still runs, as it was first sent."""
        await self.send_signal(job, "TERM", grace=self._config().head.kill_grace, reason=_stop_kind(job),
                               nodes=[node])

    async def kill_parts(self, job: "JobRecord", reason: str, *, besides: str | None = None) -> None:
        """SIGKILL what a gang job still runs on its nodes (all but ``besides``)."""
        for node in gang.job_nodes(job):
            if node != besides:
                await self.bus.publish(node_cmd(node), Kill(((job.job_id, job.attempt),), reason))


def _stop_kind(job: "JobRecord") -> str:
    stop = StopReason.of(job.stop_reason)
    return "preempted" if stop is not None and stop.kind == "preempted" else "cancelled"
