"""Recorded usage: billed GPU-seconds per (account, user), decayed with a half-life.

Theory of operation
-------------------
A running job is billed, every second, the sum of its GPUs' billing weights (``[billing]
weights``, 1.0 for a model not listed).  A fraction of a GPU bills its fraction of the
weight (``gpustate.device_fraction``): a MIG slice its compute slices over the GPU's (a
``3g.40gb`` on an A100 is 3/7), an MPS share its pinned memory over the GPU's, a
time-slice replica one over the replicas.
Recorded usage decays exponentially: a GPU-second spent ``h`` ago (``h`` = the half-life)
counts half.  Because decay is exponential, usage "as of t1" is the usage as of t0 decayed
by ``t1 - t0`` plus what was spent in between, each second decayed by its own age; the
integral is exact, so the result does not depend on how often the head calls ``accrue``.

The head owns the numbers (it persists the dict in SQLite) and calls:

* ``accrue(usage, running, nodes, cfg, t0, t1)`` at every pass, with the jobs that ran
  during ``[t0, t1]``;
* ``charge(...)`` for a job that ended between passes, over ``[max(t0, start), end]``.

Everything here is pure: new dicts out, inputs untouched.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from .config import SchedConfig
from .gpustate import device_fraction
from .snapshot import NodeView, RunningJob

UsageKey = tuple[str, str]   # (account, user)

_LN2 = math.log(2.0)


def decay(value: float, dt: float, half_life: float | None) -> float:
    """``value`` after ``dt`` seconds of exponential decay (no decay without a half-life)."""
    if not half_life or half_life <= 0 or dt <= 0:
        return value
    return value * 2.0 ** (-dt / half_life)


def decayed_integral(rate: float, a: float, b: float, t: float, half_life: float | None) -> float:
    """``rate`` per second spent over ``[a, b]``, as valued at time ``t >= b``."""
    if b <= a or rate == 0:
        return 0.0
    if not half_life or half_life <= 0:
        return rate * (b - a)
    k = _LN2 / half_life
    return rate / k * (math.exp(-k * (t - b)) - math.exp(-k * (t - a)))


def billing_rate(job: RunningJob, node: NodeView | None, cfg: SchedConfig) -> float:
    """Billed GPU-seconds per second for ``job`` (its GPUs' weights summed)."""
    if node is None:
        return float(job.gpus) + sum(device_fraction(d, None) for d in job.devices if d.kind != "gpu")
    views = {g.index: g for g in node.gpus}
    models = {g.index: g.model for g in node.gpus}
    rate = sum(cfg.billing_weight(models.get(i, "")) for i in job.gpu_indices)
    for p in job.parts:          # a gang's other nodes: billed at rank 0's GPU models (gangs are uniform)
        rate += sum(cfg.billing_weight(models.get(i, "")) for i in p.gpu_indices)
    for d in job.devices:
        if d.kind != "gpu":      # whole GPUs are billed through gpu_indices above
            rate += cfg.billing_weight(models.get(d.index, "")) * device_fraction(d, views.get(d.index))
    return rate


def charge(usage: Mapping[UsageKey, float], key: UsageKey, rate: float, a: float, b: float,
           t: float, half_life: float | None) -> dict[UsageKey, float]:
    """A copy of ``usage`` with ``rate`` over ``[a, b]`` added to ``key``, valued at ``t``."""
    out = dict(usage)
    add = decayed_integral(rate, a, min(b, t), t, half_life)
    if add > 0:
        out[key] = out.get(key, 0.0) + add
    return out


def accrue(usage: Mapping[UsageKey, float], running: Iterable[RunningJob], nodes: Iterable[NodeView],
           cfg: SchedConfig, t0: float, t1: float) -> dict[UsageKey, float]:
    """Usage as of ``t1``: ``usage`` (as of ``t0``) decayed, plus what ``running`` spent since."""
    hl = cfg.fairshare_half_life
    dt = max(0.0, t1 - t0)
    out = {k: decay(v, dt, hl) for k, v in usage.items()}
    by_name = {n.name: n for n in nodes}
    for job in running:
        rate = billing_rate(job, by_name.get(job.node), cfg)
        add = decayed_integral(rate, max(t0, job.start_time), t1, t1, hl)
        if add > 0:
            key = (job.account, job.user)
            out[key] = out.get(key, 0.0) + add
    return out


def prune(usage: Mapping[UsageKey, float], floor: float = 1e-3) -> dict[UsageKey, float]:
    """Drop entries that decayed to (almost) nothing, so the table does not grow forever."""
    return {k: v for k, v in usage.items() if v >= floor}
