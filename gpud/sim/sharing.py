"""Shared GPUs in the simulator: fractional requests from trace rows, re-layouts as a worker
applies them.

The core places MIG slices, MPS shares and time-slice replicas itself (gpud/sched/slices.py,
shares.py); the engine only has to carry a row's ``mig_profile`` and ``gpu_mem`` into the
pending job, keep each start's ``devices`` on the running job, and apply ``Plan.relayouts``
to its nodes.
``apply_relayout`` does that the way a worker does: a GPU that is not a dynamic MIG GPU, a
slice in use in the destroy list or an invalid end state refuses the whole command (the
core plans again), new slices get stable ``MIG-`` UUIDs, and ``relaid_at`` becomes the
virtual time, which the core's minimum interval reads.  A re-layout takes effect at once;
the engine wakes ``RELAYOUT_S`` later for the pass that starts the jobs waiting on it
(nvidia-smi takes seconds to re-cut a GPU).

Fractions.  A trace row asking for part of one GPU by count alone (``gpus`` = 0.46, as
the Alibaba openb trace's ``gpu_milli`` does) becomes a request the core's sharing code
places, chosen by how the cluster's GPUs are shared (``Fractions``): with MPS or
time-sliced GPUs, a ``--gpu-mem`` of that fraction of their memory (rounded up to a MiB),
which an MPS GPU packs until the fractions add up to one; with MIG GPUs only, the
smallest MIG profile with at least that fraction of the compute; with no shared GPU, one
whole GPU (billed its fraction).  A row that names ``gpu_mem`` or ``mig_profile`` keeps
them.  ``device_amount`` is what a start occupies, in GPUs: whole GPUs count one, a
slice or share its fraction (its compute slices over the GPU's, its pinned memory over
the GPU's, one over the replicas).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Iterable

from ..gpu import mig
from ..sched.gpustate import device_fraction
from ..sched.plan import Relayout
from ..sched.snapshot import Device, GpuView, NodeView, RunningJob, SliceView
from ..units import UnitError, parse_size_mb

log = logging.getLogger("gpud.sim")

RELAYOUT_S = 5.0


class Fractions:
    """How a row's fractional ``gpus`` becomes a request on this cluster (module docstring)."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        shared = [g for n in nodes for g in n.gpus if g.mode != "whole"]
        by_memory = [g for g in shared if g.mode in ("mps", "timeslice")]
        by_slice = [g for g in shared if g.mode == "mig"]
        self.kind = "memory" if by_memory else "mig" if by_slice else "whole"
        self._gpus = by_memory or by_slice
        self._memo: dict[tuple[str | None, float], dict[str, Any]] = {}

    def request(self, fraction: float, gpu_type: str | None) -> dict[str, Any]:
        """``mig_profile`` and ``gpu_mem_mb`` for ``fraction`` of a ``gpu_type`` GPU."""
        key = (gpu_type, fraction)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._request(fraction, gpu_type)
        return hit

    def _request(self, fraction: float, gpu_type: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"mig_profile": None, "gpu_mem_mb": None}
        gpus = [g for g in self._gpus if gpu_type is None or g.model == gpu_type]
        if self.kind == "memory" and gpus:
            # the smallest such GPU: the share fits on every one of them
            out["gpu_mem_mb"] = max(1, math.ceil(fraction * min(g.memory_mb for g in gpus)))
        elif self.kind == "mig" and gpus:
            cat = mig.catalog(gpus[0].model)
            fits = [p for p in cat.values() if not p.media_extensions and p.fraction >= fraction - 1e-9]
            if fits:
                out["mig_profile"] = min(fits, key=lambda p: (p.fraction, p.memory_mb)).name
        return out


def device_amount(devices: Iterable[Device], gpu_indices: tuple[int, ...],
                  gpus: dict[int, GpuView]) -> float:
    """GPUs a start occupies: whole ones count one, a slice or share its fraction."""
    devices = tuple(devices)
    if not devices:
        return float(len(gpu_indices))
    return sum(device_fraction(d, gpus.get(d.index)) for d in devices)


def pending_fields(row: Any, fractions: Fractions | None = None,
                   gpu_type: str | None = None) -> dict[str, Any]:
    """``mig_profile`` and ``gpu_mem_mb`` for a trace row (None when absent or unreadable);
    a fraction of a GPU with neither becomes what ``fractions`` maps it to."""
    out: dict[str, Any] = {"mig_profile": None, "gpu_mem_mb": None}
    profile = getattr(row, "mig_profile", None)
    if profile:
        try:
            out["mig_profile"] = mig.parse_profile(profile)
        except mig.MigError:
            log.warning("trace job %s: ignoring MIG profile %r", getattr(row, "trace_id", "?"), profile)
    mem = getattr(row, "gpu_mem", None)
    if mem and out["mig_profile"] is None:
        try:
            out["gpu_mem_mb"] = parse_size_mb(mem) or None
        except UnitError:
            log.warning("trace job %s: ignoring gpu_mem %r", getattr(row, "trace_id", "?"), mem)
    share = getattr(row, "share", 1.0)
    if (fractions is not None and 0 < share < 1 and out["mig_profile"] is None
            and out["gpu_mem_mb"] is None):
        return fractions.request(share, gpu_type)
    return out


def apply_relayout(nodes: tuple[NodeView, ...], r: Relayout, running: Iterable[RunningJob],
                   t: float) -> tuple[NodeView, ...] | None:
    """``nodes`` with ``r`` applied, or None (logged) when a worker would refuse it."""
    node = next((n for n in nodes if n.name == r.node), None)
    gpu = next((g for g in node.gpus if g.index == r.gpu), None) if node is not None else None
    if gpu is None or gpu.mode != "mig" or not gpu.dynamic:
        log.warning("re-layout of %s GPU %d refused: not a dynamic MIG GPU", r.node, r.gpu)
        return None
    used = {d.slice_start for j in running if j.node == r.node
            for d in j.devices if d.kind == "mig" and d.index == r.gpu}
    have = {s.start: s for s in gpu.slices}
    if any(s not in have or s in used for s in r.destroy):
        log.warning("re-layout of %s GPU %d refused: destroys a slice in use or absent", r.node, r.gpu)
        return None
    kept = [s for s in gpu.slices if s.start not in r.destroy]
    try:
        mig.validate_layout(gpu.model, [mig.Slice(s.profile, s.start) for s in kept] + list(r.create))
        cat = mig.catalog(gpu.model)
    except mig.MigError as e:
        log.warning("re-layout of %s GPU %d refused: %s", r.node, r.gpu, e)
        return None
    new = [SliceView(s.profile, s.start, f"MIG-{r.node}-{r.gpu}-{s.start}-{s.profile}",
                     cat[s.profile].memory_mb) for s in r.create]
    g2 = replace(gpu, slices=tuple(sorted(kept + new, key=lambda s: s.start)), relaid_at=t)
    n2 = replace(node, gpus=tuple(g2 if g.index == r.gpu else g for g in node.gpus))
    return tuple(n2 if n.name == r.node else n for n in nodes)
