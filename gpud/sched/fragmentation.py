"""GPU fragmentation: how many big requests the free GPUs could serve now.

Theory of operation.  A cluster can have many GPUs free and still be unable to start one
8-GPU job, because the free GPUs are scattered one or two per node.  This module puts a
number on that from the same picture the scheduler works from (gpud.sched.snapshot):

    free_gpus      whole GPUs no running job holds, on schedulable nodes
    servable       how many disjoint ``size``-GPU single-node requests those GPUs could
                   serve now: the sum over schedulable nodes of ``free_on_node // size``
    stranded_gpus  free_gpus - servable * size: free GPUs no such request can use
    index          stranded_gpus / free_gpus (0.0 when nothing is free): 0 means every
                   free GPU is usable by ``size``-GPU jobs, 1 means none is

Only whole GPUs count: MIG, MPS and time-sliced GPUs are handed out in fractions and
never serve a ``--gpus N`` job.  Drained, down and unknown nodes (``schedulable`` False)
contribute nothing.  CPUs and memory are not considered: the metric is about GPUs.
A GPU a stopping job still holds is not free yet; a multi-node job holds GPUs on each of
its nodes (``parts``), and an exclusive one leaves nothing free on its nodes.

The same numbers are given per GPU model (a typed request, ``--gpus a100:8``, needs
``size`` free GPUs of that model on one node) and, when the partitions are passed, per
partition (a node in two partitions counts in both).  Pure: no I/O, no clock.

Callers: the head's ``sinfo`` op and ``/metrics`` (gpud/head/metrics.py) and the
simulator's report (gpud/sim/report.py).  The signature
``fragmentation(nodes, running, size=8) -> Fragmentation`` is stable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from .snapshot import NodeView, RunningJob

DEFAULT_SIZE = 8


@dataclass(frozen=True)
class Fragmentation:
    """Free whole GPUs against ``size``-GPU requests servable; see the module docstring.

    ``by_partition`` and ``by_model`` map a name to the same numbers over that part of the
    cluster (their own ``by_*`` maps are empty).  A model or partition with nothing free
    still appears, with zeros, so a metric series does not vanish when the cluster fills.
    """

    size: int
    free_gpus: int
    servable: int
    stranded_gpus: int
    index: float
    by_partition: Mapping[str, "Fragmentation"] = field(default_factory=dict)
    by_model: Mapping[str, "Fragmentation"] = field(default_factory=dict)

    @classmethod
    def of(cls, free_per_node: Iterable[int], size: int) -> "Fragmentation":
        """The numbers for one group of nodes, given each node's free GPU count."""
        free = servable = 0
        for n in free_per_node:
            free += n
            servable += n // size
        stranded = free - servable * size
        return cls(size=size, free_gpus=free, servable=servable, stranded_gpus=stranded,
                   index=stranded / free if free else 0.0)


def fragmentation(nodes: Sequence[NodeView], running: Sequence[RunningJob], size: int = DEFAULT_SIZE,
                  *, partitions: Mapping[str, Sequence[str]] | None = None) -> Fragmentation:
    """How many ``size``-GPU single-node requests the free whole GPUs could serve now.

    ``nodes`` and ``running`` are gpud.sched.snapshot NodeView and RunningJob (a Snapshot's
    ``nodes`` and ``running``).  ``partitions`` optionally maps a partition name to its
    node globs (as in ``[[partition]] nodes``, "*" for all) to fill ``by_partition``;
    ``{n: p.nodes for n, p in cfg.partitions.items()}`` from a SchedConfig.
    Raises ValueError when ``size`` is below 1.
    """
    if size < 1:
        raise ValueError(f"fragmentation: request size must be at least 1 GPU, not {size}")
    held: dict[str, set[int]] = {}
    exclusive: set[str] = set()          # nodes an --exclusive job holds whole
    for r in running:
        for node, gpus in ((r.node, r.gpu_indices), *((p.node, p.gpu_indices) for p in r.parts)):
            held.setdefault(node, set()).update(gpus)
            if r.exclusive:
                exclusive.add(node)
    # each schedulable node's free whole GPUs, counted per model
    free_models: dict[str, dict[str, int]] = {}
    models: set[str] = set()
    for n in nodes:
        busy = held.get(n.name, ())
        counts: dict[str, int] = {}
        for g in n.gpus:
            if g.mode != "whole":
                continue
            models.add(g.model)
            if n.schedulable and g.index not in busy and n.name not in exclusive:
                counts[g.model] = counts.get(g.model, 0) + 1
        free_models[n.name] = counts

    def totals(names: Iterable[str]) -> list[int]:
        return [sum(free_models[x].values()) for x in names]

    by_model = {m: Fragmentation.of((c.get(m, 0) for c in free_models.values()), size)
                for m in sorted(models)}
    by_partition: dict[str, Fragmentation] = {}
    for pname, globs in (partitions or {}).items():
        members = (list(free_models) if "*" in globs else
                   [x for x in free_models if any(fnmatchcase(x, g) for g in globs)])
        by_partition[pname] = Fragmentation.of(totals(members), size)
    whole = Fragmentation.of(totals(free_models), size)
    return Fragmentation(size=size, free_gpus=whole.free_gpus, servable=whole.servable,
                         stranded_gpus=whole.stranded_gpus, index=whole.index,
                         by_partition=by_partition, by_model=by_model)
