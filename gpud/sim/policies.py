"""The policies ``gpud simulate`` compares: three settings of the one scheduling core.

Theory of operation
-------------------
There is one scheduler, ``gpud.sched.core.schedule``.  A policy here is only a rewrite of
the ``SchedConfig`` it runs with, so every difference between the three columns of
``--compare`` comes from a setting the head also has:

* ``fifo``: what a cluster without a scheduler gets (people queue and take GPUs as they
  come free): every priority weight is zero, so the queue is in submission order; no
  backfill, so nothing passes a job that waits; no preemption and no quotas (there is no
  one to reclaim them).
* ``priority``: a classic multifactor batch queue: the config's priority weights (age,
  Fair Tree fair-share, size, QOS, partition), still without backfill, preemption or
  quotas.
* ``full``: the config as the head runs it: fair-share, quotas and their reclaim,
  backfill, bin-packing, QOS preemption within its caps.  This is the default policy.

All three keep the config's partitions, accounts, hard limits (``gpu_limit``,
``max_gpus_per_user``) and node placement (``binpack`` unless the config says
``spread``), so placement never explains a difference.
"""

from __future__ import annotations

from dataclasses import replace

from ..sched.config import SchedConfig, Weights

__all__ = ["POLICIES", "DEFAULT_POLICY", "policy_config"]

POLICIES = ("fifo", "priority", "full")
DEFAULT_POLICY = "full"


def policy_config(config: SchedConfig, policy: str) -> SchedConfig:
    """``config`` as ``policy`` runs it; ValueError for an unknown policy."""
    if policy == "full":
        return config
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    plain = replace(
        config,
        backfill=False,
        qos={n: replace(q, preempt=()) for n, q in config.qos.items()},
        accounts={n: replace(a, gpu_quota=None) for n, a in config.accounts.items()},
    )
    if policy == "fifo":
        plain = replace(plain, weights=Weights(age=0.0, fairshare=0.0, job_size=0.0, qos=0.0,
                                               partition=0.0))
    return plain
