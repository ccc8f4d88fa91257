"""GPU telemetry on a worker: sample every GPU every ``sample_interval`` seconds, send it compact.

Theory of operation
-------------------
``Sampler.run`` wakes every interval, asks the GPU backend for one reading of every GPU
(``GpuBackend.sample``, in a thread: NVML calls block), and publishes one ``samples``
message (``gpud.bus.messages.Samples``) on ``head/events``::

    {"t": worker clock, "iv": seconds this sample stands for,
     "gpus":   [[index, util %, MiB used, watts, deg C, joules since the last sample], ...],
     "jobs":   [[job, attempt, [gpu indices]], ...],
     "slices": [[gpu index, MIG slice UUID, MiB used], ...],
     "procs":  [[gpu index, pid, MiB used], ...],
     "usage":  [[job, attempt, step ("" for the whole job), peak bytes, CPU microseconds], ...]}

Unknown readings are null.  Energy is the difference of the board's energy counter between
two published samples, so a sample skipped while the broker was away loses nothing; a board
without a counter (or one that went backwards: a driver reload) falls back to watts times
the time since the last sample.  The jobs list comes from the executor's running allocations
(the same launches the head sent), which is also what the sim backend reads its declared
utilization from (``GPUD_SIM_UTIL``).

Samples are telemetry, not state: while the bus is disconnected none are queued (the head
would drop them as stale anyway), and a failing backend is logged and retried next time,
never fatal for the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Sequence

from ..bus.base import HEAD_EVENTS
from ..bus.messages import Body, Samples
from ..gpu.backend import Assignment, GpuBackend, GpuSample

log = logging.getLogger("gpud.worker.telemetry")

MAX_GAP_INTERVALS = 3   # watts x time never bridges more than this many intervals


def assignments_from(executor: Any) -> list[Assignment]:
    """The allocations running here, from the executor's launches (none when it has no list)."""
    launches = getattr(executor, "launches", None)
    if launches is None:
        return []
    out = []
    for launch in launches():
        env = dict(launch.env)
        env.update(launch.extra_env)
        out.append(Assignment(job_id=launch.job_id, attempt=launch.attempt,
                              gpus=tuple(g.index for g in launch.gpus), env=env))
    return out


class Sampler:
    """Samples a backend and publishes ``samples``; one per worker."""

    def __init__(self, backend: GpuBackend, publish: Callable[[str, Body], Awaitable[None]],
                 assignments: Callable[[], Sequence[Assignment]], interval: float, *,
                 clock: Callable[[], float] = time.time, connected: Callable[[], bool] = lambda: True,
                 usage: Callable[[], list[list]] | None = None) -> None:
        self.backend = backend
        self.usage = usage      # the running jobs' cgroup accounting rows (Executor.usage_rows)
        self.publish = publish
        self.assignments = assignments
        self.interval = interval
        self.clock = clock
        self.connected = connected
        self._counters: dict[int, int] = {}      # GPU index -> energy counter (mJ) at the last send
        self._last_sent: float | None = None
        self.sent = 0
        self.failures = 0

    async def run(self) -> None:
        if self.interval <= 0:
            log.info("telemetry off (sample_interval = 0)")
            return
        while True:
            await asyncio.sleep(self.interval)
            await self.sample_once()

    async def sample_once(self) -> Samples | None:
        """Take and publish one sample; the message, or None when nothing was sent."""
        if not self.connected():
            return None
        assigned = list(self.assignments())
        try:
            readings = await asyncio.to_thread(self.backend.sample, assigned)
        except Exception as e:  # a sick driver must not take the node's jobs offline
            self.failures += 1
            log.warning("telemetry: GPU sample failed: %s: %s", type(e).__name__, e)
            return None
        now = self.clock()
        msg = self.message(readings, assigned, now)
        if self.usage is not None:
            try:
                rows = await asyncio.to_thread(self.usage)
            except Exception as e:  # noqa: BLE001 - accounting must not stop GPU telemetry
                log.warning("telemetry: cgroup accounting failed: %s: %s", type(e).__name__, e)
                rows = []
            if rows:
                msg = replace(msg, usage=tuple(tuple(r) for r in rows))
        try:
            await self.publish(HEAD_EVENTS, msg)
        except Exception as e:
            log.warning("telemetry: could not publish samples: %s", e)
            return None
        self.sent += 1
        return msg

    def message(self, readings: Sequence[GpuSample], assigned: Sequence[Assignment], now: float) -> Samples:
        """The ``samples`` message for these readings; remembers counters for the next one."""
        since = self.interval if self._last_sent is None else max(0.0, now - self._last_sent)
        since = min(since, MAX_GAP_INTERVALS * self.interval)
        gpus, slices, procs = [], [], []
        for r in readings:
            gpus.append((r.index, _round(r.util), r.mem_used_mb, _round(r.power_w), _round(r.temp_c),
                         _round(self._energy(r, since))))
            slices += [(r.index, s.uuid, s.mem_used_mb) for s in r.slices]
            procs += [(r.index, pid, mib) for pid, mib in r.procs]
        self._last_sent = now
        return Samples(t=now, iv=self.interval, gpus=tuple(gpus),
                       jobs=tuple((a.job_id, a.attempt, tuple(a.gpus)) for a in assigned),
                       slices=tuple(slices), procs=tuple(procs))

    def _energy(self, r: GpuSample, since: float) -> float | None:
        previous = self._counters.get(r.index)
        if r.energy_mj is not None:
            self._counters[r.index] = r.energy_mj
            if previous is not None and r.energy_mj >= previous:
                return (r.energy_mj - previous) / 1000.0
        return None if r.power_w is None else r.power_w * since


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
