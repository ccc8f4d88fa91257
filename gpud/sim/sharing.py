"""Shared GPUs in the simulator: fractional requests from trace rows, re-layouts as a worker
applies them.

The core places MIG slices, MPS shares and time-slice replicas itself (gpud/sched/sharing.py);
the engine only has to carry a row's ``mig_profile`` and ``gpu_mem`` into the pending job,
keep each start's ``devices`` on the running job, and apply ``Plan.relayouts`` to its nodes.
``apply_relayout`` does that the way a worker does: a GPU that is not a dynamic MIG GPU, a
slice in use in the destroy list or an invalid end state refuses the whole command (the
core plans again), new slices get stable ``MIG-`` UUIDs, and ``relaid_at`` becomes the
virtual time, which the core's minimum interval reads.  A re-layout takes effect at once;
the engine wakes ``RELAYOUT_S`` later for the pass that starts the jobs waiting on it
(nvidia-smi takes seconds to re-cut a GPU).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Iterable

from ..gpu import mig
from ..sched.plan import Relayout
from ..sched.snapshot import NodeView, RunningJob, SliceView
from ..units import UnitError, parse_size_mb

log = logging.getLogger("gpud.sim")

RELAYOUT_S = 5.0


def pending_fields(row: Any) -> dict[str, Any]:
    """``mig_profile`` and ``gpu_mem_mb`` for a trace row (None when absent or unreadable)."""
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
