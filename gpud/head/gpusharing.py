"""The head's side of GPU sharing: device records, plan re-checks, MIG re-layout commands.

Theory of operation
-------------------
Devices.  Every allocation records what it holds as ``devices`` (JobRecord, the launch
body's ``gpus``): ``{"index", "uuid", "kind", "slice_start", "mem_mb", "profile"}`` with
kind ``gpu`` (a whole GPU), ``mig`` (a slice, by its ``MIG-...`` UUID and first memory
slot), ``mps`` (a share with its pinned memory) or ``timeslice``.  A job's
``gpu_indices`` still lists the GPUs it touches (squeue, sinfo, telemetry); only the
scheduler's view drops them for fractions, which it tracks by device.  Allocations made
before devices existed have none: ``launch_devices`` rebuilds whole-GPU entries for them.

Re-checks.  ``plan_to_txn`` re-checks a plan with ``gpud.sched.apply``, which counts what
running jobs hold of shared GPUs from their devices: a planned fractional start still fits
when its slice exists with that UUID and is free, the MPS GPU has room and no other user,
the time-slice a replica; a planned re-layout when it destroys only free slices.  Anything
that no longer holds is skipped with a log line; the next pass plans again.

Re-layouts.  ``MigCommands`` sends each planned re-layout as a ``mig`` command to the
node and remembers it as *in flight* until the worker re-registers (it does after every
command, applied or refused) or ``REPLY_TIMEOUT`` passes.  While in flight the GPU is
shown to the core as ``reconfiguring`` (no starts, no second re-layout), and the time of
the last command that destroyed slices counts as the GPU's ``relaid_at`` even before the
worker reports it, so the minimum interval holds across a lost reply.  The command carries
the head's ``mig_min_interval`` (the one the worker applies).  A worker that re-registers
with the GPU's slices as they were refused it: the core is told (``relayout_after``) to
plan no re-layout there for ``REFUSED_BACKOFF`` seconds, twice that after a second refusal
in a row, up to ``REFUSED_BACKOFF_MAX``; its jobs wait as ``MigReconfig`` meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..bus.base import node_cmd
from ..bus.messages import MigRelayout
from ..model import GpuInfo, NodeInfo
from ..sched.plan import Relayout, Start
from ..sched.gpustate import is_shared
from ..sched.snapshot import Device, GpuView, NodeView, SliceView, Snapshot

if TYPE_CHECKING:
    from ..bus.base import Bus
    from ..config import Config
    from .store import JobRecord, Store

log = logging.getLogger("gpud.sharing")

REPLY_TIMEOUT = 60.0      # seconds a re-layout stays in flight without the worker re-registering
REFUSED_BACKOFF = 10.0    # a refused re-layout is not planned again for this long, doubling
REFUSED_BACKOFF_MAX = 600.0   # per refusal in a row, up to this


def _layout(info: dict | None, gpu: int) -> tuple | None:
    """A GPU's slices as a node record's info lists them (to see whether a command changed them)."""
    for g in (info or {}).get("gpus") or ():
        if isinstance(g, dict) and g.get("index") == gpu:
            return tuple(sorted((str(x.get("profile")), x.get("start")) for x in g.get("slices") or ()
                                if isinstance(x, dict)))
    return None


def gpu_view(g: GpuInfo) -> GpuView:
    return GpuView(g.index, g.uuid, g.model, g.memory_mb, mode=g.mode, dynamic=g.dynamic,
                   slices=tuple(SliceView(s.profile, s.start, s.uuid, s.memory_mb) for s in g.slices),
                   mps_max_clients=g.mps_max_clients, mps_thread_percentage=g.mps_thread_percentage,
                   replicas=g.replicas, relaid_at=g.relaid_at,
                   numa_node=g.numa_node, nvlink_peers=tuple(g.nvlink_peers))


def job_devices(job: "JobRecord") -> tuple[Device, ...]:
    """The job's recorded devices; malformed entries are dropped."""
    out = []
    for d in job.devices:
        try:
            out.append(Device.from_dict(d))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return tuple(out)


def launch_devices(job: "JobRecord") -> list[dict[str, Any]]:
    """The launch body's ``gpus``: the recorded devices, or whole GPUs for older records."""
    if job.devices:
        return [dict(d) for d in job.devices]
    return [Device(i, "gpu", u).to_dict() for i, u in zip(job.gpu_indices, job.gpu_uuids)]


def start_changes(s: Start, info: NodeInfo) -> dict[str, Any]:
    """JobRecord fields for a planned start: GPUs touched, their UUIDs, the devices."""
    if s.devices and is_shared(s.devices):
        indices = tuple(sorted({d.index for d in s.devices}))
        return {"gpu_indices": indices, "gpu_uuids": tuple(d.uuid for d in s.devices),
                "devices": tuple(d.to_dict() for d in s.devices)}
    by_index = {g.index: g for g in info.gpus}
    uuids = tuple(by_index[i].uuid for i in s.gpu_indices)
    return {"gpu_indices": tuple(s.gpu_indices), "gpu_uuids": uuids,
            "devices": tuple(Device(i, "gpu", u).to_dict() for i, u in zip(s.gpu_indices, uuids))}


def gpu_usage(gpus: list[dict[str, Any]], jobs: Iterable["JobRecord"]) -> list[dict[str, Any]]:
    """Per GPU of a node record: who holds it, and each slice's job (sinfo -G)."""
    holders: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        for d in job_devices(j) or tuple(Device(i, "gpu") for i in j.gpu_indices):
            holders[d.index].append({"job_id": j.job_id, "display_id": j.display_id, "user": j.user, "kind": d.kind,
                                     "slice_start": d.slice_start, "mem_mb": d.mem_mb})
    out = []
    for g in gpus:
        g = dict(g)
        mine = holders.get(g.get("index"), [])
        g["holders"] = mine
        by_start = {h["slice_start"]: h for h in mine if h["kind"] == "mig"}
        g["slices"] = [dict(s, job_id=by_start.get(s.get("start"), {}).get("job_id"),
                            display_id=by_start.get(s.get("start"), {}).get("display_id"),
                            user=by_start.get(s.get("start"), {}).get("user"))
                       for s in g.get("slices") or []]
        out.append(g)
    return out


class MigCommands:
    """Re-layouts sent to workers and not yet answered (see the module docstring)."""

    def __init__(self, store: "Store", bus: "Bus", *, config: Callable[[], "Config"]) -> None:
        self.store = store               # read: the layout a command finds
        self.bus = bus
        self._config = config            # the live config: mig_min_interval may change on reload
        self.in_flight: dict[tuple[str, int], float] = {}     # (node, gpu) -> sent at
        self.destroyed_at: dict[tuple[str, int], float] = {}  # last command that destroyed slices
        self.asked: dict[tuple[str, int], tuple | None] = {}  # the layout a command in flight found
        self.refused: dict[tuple[str, int], tuple[float, int]] = {}   # -> (no re-layout before, refusals)

    def adjust(self, snap: Snapshot, now: float) -> Snapshot:
        """The snapshot with in-flight GPUs marked ``reconfiguring``."""
        for key, sent in list(self.in_flight.items()):
            if now - sent > REPLY_TIMEOUT:
                log.warning("no answer from %s to the re-layout of GPU %d in %.0fs; planning again",
                            key[0], key[1], now - sent)
                del self.in_flight[key]
        if not self.in_flight and not self.destroyed_at and not self.refused:
            return snap
        nodes = tuple(self._node(n) for n in snap.nodes)
        return dataclasses.replace(snap, nodes=nodes)

    def _node(self, n: NodeView) -> NodeView:
        gpus = []
        for g in n.gpus:
            key = (n.name, g.index)
            if key in self.in_flight or key in self.destroyed_at or key in self.refused:
                last = self.destroyed_at.get(key)
                relaid = g.relaid_at if last is None else max(last, g.relaid_at or last)
                after = self.refused.get(key, (None, 0))[0]
                g = dataclasses.replace(g, reconfiguring=key in self.in_flight, relaid_at=relaid,
                                        relayout_after=after)
            gpus.append(g)
        return dataclasses.replace(n, gpus=tuple(gpus))

    async def send(self, relayouts: Iterable[Relayout], now: float) -> None:
        for r in relayouts:
            key = (r.node, r.gpu)
            self.in_flight[key] = now
            rec = self.store.nodes.get(r.node)
            self.asked[key] = _layout(rec.info if rec is not None else None, r.gpu)
            if r.destroy:
                self.destroyed_at[key] = now
            log.info("re-laying MIG GPU %s:%d: destroy slots %s, create %s (%s)", r.node, r.gpu,
                     list(r.destroy) or "none", ", ".join(str(s) for s in r.create) or "none", r.reason)
            # the head's interval goes with the command: one source of truth, reconfigurable
            await self.bus.publish(node_cmd(r.node), MigRelayout(
                r.gpu, tuple(r.destroy), tuple((c.profile, c.start) for c in r.create), r.reason,
                float(self._config().sched.mig_min_interval)))

    def registered(self, node: str, info: dict | None = None, now: float | None = None) -> None:
        """The worker reported its GPUs: whatever it had been asked is now visible.  A GPU whose
        layout the command left as it was was refused: no re-layout is planned on it for
        ``REFUSED_BACKOFF`` seconds, doubling with each refusal in a row."""
        for key in [k for k in self.in_flight if k[0] == node]:
            del self.in_flight[key]
            before = self.asked.pop(key, None)
            if info is None or now is None:
                continue
            if before is not None and _layout(info, key[1]) == before:
                _, count = self.refused.get(key, (0.0, 0))
                wait = min(REFUSED_BACKOFF_MAX, REFUSED_BACKOFF * 2 ** count)
                self.refused[key] = (now + wait, count + 1)
                log.warning("%s refused the re-layout of GPU %d; none planned there for %.0fs",
                            key[0], key[1], wait)
            else:
                self.refused.pop(key, None)
