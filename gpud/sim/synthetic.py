"""Synthetic job traces: ``gpud simulate --synthetic KIND --jobs N --seed S``.

Theory of operation
-------------------
A generator makes ``N`` jobs from a seeded ``random.Random`` (same kind, count, seed and
cluster: the same trace, on any machine), then spreads their arrivals over as much time as
makes them offer ``load`` times the cluster's GPU-time.  So the trace always fits the
cluster it is simulated on, and ``load`` says how busy it is: below 1 the queue drains
between bursts, above 1 it only grows.

Kinds:

* ``mixed``: a shared training cluster as measured in published GPU cluster traces
  (Philly, Helios, ITP): mostly 1-GPU jobs (70 %), some 2 and 4, whole-node 8-GPU jobs,
  and a few of 16 to 64 GPUs; run times log-normal with a heavy tail (median 40 minutes,
  one job in a hundred over two days, none over a week); arrivals by day more than by
  night, and in bursts (one submission in ten is a sweep of 5 to 50 alike jobs within a
  minute); six accounts of unequal activity (35 % of the jobs down to 5 %), each with
  a few users.  Default load 0.9.
* ``saturating``: ``accounts`` accounts (two by default), each alone offering more than
  the whole cluster (default load 2.0 in all): 1 to 8 GPU jobs of 20 to 120 minutes,
  arriving at random.  The fair-share case: with every account always waiting, GPU-time
  should split in the ratio of the configured shares.

A job bigger than the largest node (``max_gpus``) stays that size: the simulator runs it
on several nodes at once (a gang, gpud/sim/engine.py).  Only a job bigger than the whole
cluster could hold on its biggest nodes is cut down, to as many whole nodes as there are
(``gpus // max_gpus`` of them), rather than generated to be refused.
"""

from __future__ import annotations

import math
import random
from typing import Iterable, TextIO

from .trace import TraceJob

__all__ = ["KINDS", "generate", "write_trace", "DEFAULT_LOAD"]

KINDS = ("mixed", "saturating")
DEFAULT_LOAD = {"mixed": 0.9, "saturating": 2.0}

DAY = 86400.0
MIXED_SIZES = ((1, 70.0), (2, 8.0), (4, 8.0), (8, 10.0), (16, 2.0), (32, 1.5), (64, 0.5))
MIXED_ACCOUNTS = (("vision", 35.0), ("language", 25.0), ("speech", 15.0), ("robotics", 12.0),
                  ("recsys", 8.0), ("infra", 5.0))
MEDIAN_RUN = 40 * 60.0
RUN_SIGMA = 1.6                # log-normal spread: p99 about 2 days at this median
MIN_RUN, MAX_RUN = 60.0, 7 * DAY
SWEEP_CHANCE = 0.1
DAY_NIGHT = 0.5                # arrival rate swings +-50 % over a day, peaking mid-afternoon


def generate(kind: str, jobs: int, seed: int, *, gpus: int, max_gpus: int,
             load: float | None = None, accounts: int = 2) -> list[TraceJob]:
    """``jobs`` jobs of ``kind`` for a cluster of ``gpus`` GPUs whose biggest node has
    ``max_gpus``, in submission order; ValueError for a bad argument (one line)."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic trace {kind!r}: use one of {', '.join(KINDS)}")
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    load = DEFAULT_LOAD[kind] if load is None else load
    if not (load > 0 and math.isfinite(load)):
        raise ValueError(f"--load must be a positive number, not {load!r}")
    if accounts < 1:
        raise ValueError("--accounts must be at least 1")
    rnd = random.Random(f"{kind}:{seed}")
    if kind == "mixed":
        shapes = _mixed(rnd, jobs, gpus, max_gpus)
    else:
        shapes = _saturating(rnd, jobs, max_gpus, accounts)
    work = sum(g * d for _, g, d, _, _ in shapes)
    span = work / (load * gpus)
    times = _arrivals(rnd, shapes, span, bursty=kind == "mixed")
    order = sorted(range(len(shapes)), key=lambda i: (times[i], i))
    out = []
    for seq, i in enumerate(order, 1):
        group, g, d, user, account = shapes[i]
        out.append(TraceJob(seq=seq, trace_id=f"{kind}-{i + 1}", submit_s=round(times[i], 3),
                            gpus=g, share=float(g), duration_s=float(round(d)), user=user,
                            account=account, gpu_type=None, status=None))
    return out


def _mixed(rnd: random.Random, n: int, gpus: int,
           max_gpus: int) -> list[tuple[int, int, float, str, str]]:
    """(group, GPUs, run time, user, account) for each job; a group is one submission."""
    sizes, size_w = zip(*MIXED_SIZES)
    most = max(1, max_gpus * max(1, gpus // max(1, max_gpus)))   # every node, whole
    names, acct_w = zip(*MIXED_ACCOUNTS)
    users = {a: [f"{a}-u{k}" for k in range(1, 3 + rnd.randrange(6))] for a in names}
    out: list[tuple[int, int, float, str, str]] = []
    group = 0
    while len(out) < n:
        group += 1
        account = rnd.choices(names, acct_w)[0]
        user = rnd.choice(users[account])
        g = min(rnd.choices(sizes, size_w)[0], most)
        run = _run_time(rnd)
        count = rnd.randint(5, 50) if rnd.random() < SWEEP_CHANCE else 1
        for _ in range(min(count, n - len(out))):
            # a sweep's runs differ (hyper-parameters), around one scale
            d = run if count == 1 else min(MAX_RUN, max(MIN_RUN, run * rnd.uniform(0.5, 1.5)))
            out.append((group, g, d, user, account))
    return out


def _run_time(rnd: random.Random) -> float:
    return min(MAX_RUN, max(MIN_RUN, rnd.lognormvariate(math.log(MEDIAN_RUN), RUN_SIGMA)))


def _saturating(rnd: random.Random, n: int, max_gpus: int,
                accounts: int) -> list[tuple[int, int, float, str, str]]:
    names = [chr(ord("a") + k) if accounts <= 26 else f"a{k}" for k in range(accounts)]
    out = []
    for i in range(n):
        account = names[i % accounts]
        g = min(rnd.choice((1, 2, 4, 8)), max_gpus)
        out.append((i, g, rnd.randint(20, 120) * 60.0, f"{account}-u{rnd.randint(1, 3)}", account))
    return out


def _arrivals(rnd: random.Random, shapes: list[tuple[int, int, float, str, str]], span: float,
              bursty: bool) -> list[float]:
    """A submission time per job: groups arrive over ``[0, span)``, more by day than by
    night when ``bursty``; a group's jobs follow each other within a minute."""
    times: list[float] = []
    group_at: dict[int, float] = {}
    for group, *_ in shapes:
        t = group_at.get(group)
        if t is None:
            t = group_at[group] = _when(rnd, span, bursty)
        else:
            t += rnd.uniform(0.0, 60.0 / 50)
            group_at[group] = t
        times.append(t)
    return times


def _when(rnd: random.Random, span: float, bursty: bool) -> float:
    while True:   # thinning: accept in proportion to the time of day's rate
        t = rnd.uniform(0.0, span)
        if not bursty:
            return t
        rate = 1.0 + DAY_NIGHT * math.sin(2 * math.pi * (t / DAY - 0.375))
        if rnd.random() * (1.0 + DAY_NIGHT) <= rate:
            return t


def write_trace(jobs: Iterable[TraceJob], f: TextIO) -> None:
    """Write jobs in the common CSV schema (what ``--trace`` reads back)."""
    f.write("job_id,submit_s,gpus,duration_s,user,group,gpu_type,status\n")
    for j in jobs:
        gpus = j.gpus if j.share >= 1 else j.share
        f.write(f"{j.trace_id},{j.submit_s!r},{gpus:g},{j.duration_s:g},{j.user},"
                f"{j.account or ''},{j.gpu_type or ''},{j.status or ''}\n")
