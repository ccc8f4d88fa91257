"""A background load beside the main job stream: ``gpud simulate --background CSV``.

Theory of operation
-------------------
A serving workload (inference instances that run for weeks) is not a batch job stream: it
is the capacity batch work must share, and on a real cluster it runs in a QOS that comes
first and may take GPUs back.  ``--background CSV`` replays such a trace (the same CSV
schema) beside the main stream (``--trace`` or ``--synthetic``): both are read one row
at a time and merged by submit time into the one stream the engine pulls; on a tie the
background row comes first, so instances alive when the trace begins (submitted at 0) are
the cluster's initial state.  Merged rows are numbered again (the job ids) and every
background row gets ``--background-qos`` (default ``serving``), whatever its own ``qos``
column says; ``--qos`` puts every main-stream row in one QOS the same way.

QOS named on the command line that the config lacks are added to it, as a site would
define them:

* the background QOS: priority above every configured QOS, ``Preempt=`` every other QOS,
  requeue (``preempt_mode = "requeue"``); the config's ``[preemption]`` caps apply
  (exempt time, preemptions per job and per minute), as the head applies them.  The
  ``qos`` priority weight is raised, when lower, to the other weights together plus one,
  so that its jobs come before every other job in the queue.  Without that, a QOS is one
  factor among five: fair-share (weight 10,000 by default against 2,000) ranks a batch
  job of a light account above an instance of a service that holds hundreds of GPUs, and
  the GPUs that batch jobs free as they end go to batch jobs first (a preemption's GPUs
  go to its preemptor whatever the weights: Snapshot.claims);
* the main QOS: priority 0, no preemption, requeued when preempted.

A QOS the config defines is used as configured.  The policies then rewrite the config as
always (gpud/sim/policies.py): ``fifo`` and ``priority`` drop every preemption list, so
there serving instances only queue (``priority`` still orders them first by the QOS
factor; ``fifo`` by submit time alone), while ``full`` preempts.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Iterable, Iterator

from ..sched.config import QosConfig, SchedConfig
from .trace import TraceJob

__all__ = ["DEFAULT_BACKGROUND_QOS", "merge_streams", "with_qos", "with_stream_qos", "valid_qos_name"]

DEFAULT_BACKGROUND_QOS = "serving"
QOS_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def valid_qos_name(name: str) -> bool:
    return bool(name) and set(name) <= QOS_NAME_CHARS


def with_stream_qos(config: SchedConfig, background_qos: str | None,
                    main_qos: str | None) -> SchedConfig:
    """``config`` with the QOS the streams run in added when it lacks them."""
    qos = dict(config.qos)
    if main_qos is not None and main_qos not in qos:
        qos[main_qos] = QosConfig(name=main_qos)
    weights = config.weights
    if background_qos is not None and background_qos not in qos:
        top = max((q.priority for q in qos.values()), default=0)
        qos[background_qos] = QosConfig(
            name=background_qos, priority=max(1, top + 1),
            preempt=tuple(sorted(n for n in qos if n != background_qos)),
            preempt_mode="requeue")
        w = weights
        first = w.age + w.fairshare + w.job_size + w.partition + 1.0
        if w.qos < first:
            weights = replace(w, qos=first)
    if qos == config.qos:
        return config
    return replace(config, qos=qos, weights=weights)


def merge_streams(main: Iterable[TraceJob], background: Iterable[TraceJob],
                  background_qos: str) -> Iterator[TraceJob]:
    """Both streams by submit time, background first on a tie, numbered 1, 2, ... again;
    background rows marked and put in ``background_qos``.  Reads one row of each ahead."""
    tagged_bg = ((row.submit_s, 0, row) for row in background)
    tagged_main = ((row.submit_s, 1, row) for row in main)
    for seq, (_, stream, row) in enumerate(heapq.merge(tagged_bg, tagged_main,
                                                       key=lambda x: (x[0], x[1])), 1):
        if stream == 0:
            yield replace(row, seq=seq, qos=background_qos, background=True)
        else:
            yield replace(row, seq=seq)


def with_qos(rows: Iterable[TraceJob], qos: str | None) -> Iterator[TraceJob]:
    """``rows`` all in ``qos`` (unchanged when None)."""
    if qos is None:
        yield from rows
        return
    for row in rows:
        yield replace(row, qos=qos)
