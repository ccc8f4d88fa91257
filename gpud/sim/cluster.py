"""Virtual clusters for the simulator, from a spec like ``16x8xH100-80GB``.

A spec is a comma-joined list of ``NODESxGPUSxMODEL`` groups: ``16x8xH100-80GB`` is 16
nodes of 8 H100-80GB GPUs, ``8x8xH100-80GB,4x8xA100-80GB`` adds 4 nodes of A100s.  A model
is ``NAME-<N>GB`` (as in a worker's ``--sim`` spec) and each GPU has ``N`` GiB.  Nodes are
named ``n0001``, ``n0002``, ... across all groups in spec order.  A node gets
``CPUS_PER_GPU`` CPUs and ``MEM_MB_PER_GPU`` of memory per GPU, roughly a DGX-class box,
so that GPUs, not CPUs or memory, bound what fits.
"""

from __future__ import annotations

import re

from ..sched.snapshot import GpuView, NodeView

__all__ = ["ClusterSpecError", "parse_cluster", "CPUS_PER_GPU", "MEM_MB_PER_GPU"]

CPUS_PER_GPU = 16
MEM_MB_PER_GPU = 128 * 1024
MAX_NODES = 100_000        # stops a typo from building millions of nodes
MAX_GPUS_PER_NODE = 1024

_GROUP = re.compile(r"^(\d+)[xX](\d+)[xX](\S+)$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*-(\d+)[gG][bB]$")
_USAGE = "use NODESxGPUSxMODEL[,...], e.g. 16x8xH100-80GB"


class ClusterSpecError(ValueError):
    """An invalid cluster spec; the message is one line."""


def parse_cluster(spec: str) -> tuple[NodeView, ...]:
    """The nodes a spec describes, in name order; ClusterSpecError with one line."""
    if not isinstance(spec, str) or not spec.strip():
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: {_USAGE}")
    groups: list[tuple[int, int, str, int]] = []
    for part in spec.split(","):
        m = _GROUP.match(part.strip())
        if not m:
            raise ClusterSpecError(f"invalid cluster spec {spec!r}: {_USAGE}")
        nodes, gpus, model = int(m.group(1)), int(m.group(2)), m.group(3)
        mm = _MODEL.match(model)
        if not mm or int(mm.group(1)) <= 0:
            raise ClusterSpecError(
                f"invalid GPU model {model!r} in cluster spec: use NAME-<N>GB, e.g. H100-80GB")
        if nodes < 1 or gpus < 1:
            raise ClusterSpecError(
                f"invalid cluster spec {spec!r}: node and GPU counts must be at least 1")
        if gpus > MAX_GPUS_PER_NODE:
            raise ClusterSpecError(
                f"invalid cluster spec {spec!r}: at most {MAX_GPUS_PER_NODE} GPUs per node")
        groups.append((nodes, gpus, model, int(mm.group(1)) * 1024))
    total = sum(g[0] for g in groups)
    if total > MAX_NODES:
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: at most {MAX_NODES} nodes")
    width = max(4, len(str(total)))
    out: list[NodeView] = []
    for nodes, gpus, model, memory_mb in groups:
        for _ in range(nodes):
            name = f"n{len(out) + 1:0{width}d}"
            views = tuple(GpuView(index=i, uuid=f"GPU-sim-{name}-{i}", model=model,
                                  memory_mb=memory_mb) for i in range(gpus))
            out.append(NodeView(name=name, cpus=CPUS_PER_GPU * gpus,
                                mem_mb=MEM_MB_PER_GPU * gpus, gpus=views))
    return tuple(out)
