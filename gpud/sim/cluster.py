"""Virtual clusters for the simulator, from a spec like ``16x8xH100-80GB``.

A spec is a comma-joined list of ``NODESxGPUSxMODEL`` groups: ``16x8xH100-80GB`` is 16
nodes of 8 H100-80GB GPUs, ``8x8xH100-80GB,4x8xA100-80GB`` adds 4 nodes of A100s.  A model
is ``NAME-<N>GB`` (as in a worker's ``--sim`` spec) and each GPU has ``N`` GiB.  Nodes are
named ``n0001``, ``n0002``, ... across all groups in spec order, unless a group names its
own: ``16x8xH100-80GB@gpu[001-016]`` (a hostlist of exactly that many names), so that a
production config's partitions find their nodes (``unmatched_partitions``).  A node gets
``CPUS_PER_GPU`` CPUs and ``MEM_MB_PER_GPU`` of memory per GPU, roughly a DGX-class box,
so that GPUs, not CPUs or memory, bound what fits.

GPU sharing (``--gpu-modes``): every GPU is ``whole`` unless a modes spec says otherwise.
A spec is ``;``-joined ``SELECTOR=MODE`` entries, or one bare ``MODE`` for every GPU.
Modes are written as in a worker's ``[worker] gpu_modes`` (``whole``, ``mig:dynamic``,
``mig:all-1g.10gb``, ``mps[:max_clients=N]``, ``timeslice:N``); a selector is GPU indexes
as there (``*``, ``0-3``, ``0,2``), optionally after ``NODES:`` where ``NODES`` is a node
name or a shell pattern (``n000[1-2]``).  As on a worker, a node's own entry beats a plain
one and explicit indexes beat ``*``.  A static MIG layout starts cut; a dynamic one starts
empty and is cut by the core's re-layouts.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import replace

from ..gpu import mig
from ..sched.snapshot import GpuView, NodeView, SliceView

__all__ = ["ClusterSpecError", "parse_cluster", "apply_gpu_modes", "shared_gpus", "unmatched_partitions",
           "CPUS_PER_GPU", "MEM_MB_PER_GPU"]

CPUS_PER_GPU = 16
MEM_MB_PER_GPU = 128 * 1024
MAX_NODES = 100_000        # stops a typo from building millions of nodes
MAX_GPUS_PER_NODE = 1024

_GROUP = re.compile(r"^(\d+)[xX](\d+)[xX](\S+)$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*-(\d+)[gG][bB]$")
_USAGE = "use NODESxGPUSxMODEL[@HOSTLIST][,...], e.g. 16x8xH100-80GB or 4x8xH100-80GB@gpu[01-04]"


class ClusterSpecError(ValueError):
    """An invalid cluster spec; the message is one line."""


def parse_cluster(spec: str) -> tuple[NodeView, ...]:
    """The nodes a spec describes, in name order; ClusterSpecError with one line."""
    if not isinstance(spec, str) or not spec.strip():
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: {_USAGE}")
    groups: list[tuple[int, int, str, int]] = []
    names: list[list[str] | None] = []
    for part in _groups(spec):
        part, _, hosts = part.partition("@")
        names.append(_host_names(spec, hosts) if hosts else None)
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
    for (nodes, gpus, model, memory_mb), given in zip(groups, names):
        if given is not None and len(given) != nodes:
            raise ClusterSpecError(f"invalid cluster spec {spec!r}: {nodes} nodes but {len(given)} names "
                                   f"after @; give as many names as nodes")
        for k in range(nodes):
            name = given[k] if given is not None else f"n{len(out) + 1:0{width}d}"
            views = tuple(GpuView(index=i, uuid=f"GPU-sim-{name}-{i}", model=model,
                                  memory_mb=memory_mb) for i in range(gpus))
            out.append(NodeView(name=name, cpus=CPUS_PER_GPU * gpus,
                                mem_mb=MEM_MB_PER_GPU * gpus, gpus=views))
    seen = [n.name for n in out]
    if len(set(seen)) != len(seen):
        twice = next(n for n in seen if seen.count(n) > 1)
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: node {twice} is named twice")
    return tuple(out)


def _groups(spec: str) -> list[str]:
    """The spec's comma-joined groups; commas inside a hostlist's brackets stay."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def _host_names(spec: str, hosts: str) -> list[str]:
    from ..hostlist import NODE_NAME, expand

    try:
        names = expand(hosts.strip())
    except ValueError as e:
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: {e}") from None
    bad = next((n for n in names if not NODE_NAME.match(n)), None)
    if bad is not None or not names:
        raise ClusterSpecError(f"invalid cluster spec {spec!r}: {bad!r} is not a node name")
    return names


def unmatched_partitions(partitions: dict, nodes: tuple[NodeView, ...]) -> str | None:
    """Why a config cannot run on these nodes: a partition none of whose node patterns names
    a simulated node (every job sent there would wait forever); None when each has some."""
    names = [n.name for n in nodes]
    for p in partitions.values():
        if not any(fnmatch.fnmatchcase(n, pat) for pat in p.nodes for n in names):
            from ..hostlist import compress

            return (f"partition {p.name} has none of the simulated nodes ({compress(names)}): its nodes are "
                    f"{', '.join(p.nodes)}; name the cluster's nodes after @ in --cluster "
                    f"(e.g. {len(names)}x{len(nodes[0].gpus)}x{nodes[0].gpus[0].model if nodes[0].gpus else 'H100-80GB'}"
                    f"@{p.nodes[0]}) or simulate a config whose partitions name these nodes")
    return None


def apply_gpu_modes(nodes: tuple[NodeView, ...], spec: str | None) -> tuple[NodeView, ...]:
    """``nodes`` with their GPUs set up as ``spec`` says; ClusterSpecError with one line."""
    if spec is None or not spec.strip():
        return nodes
    from ..gpu.modes import parse_mode, parse_selector

    entries: list[tuple[int, str | None, frozenset[int] | None, object, str]] = []
    for item in filter(None, (w.strip() for w in spec.split(";"))):
        selector, eq, text = item.partition("=")
        node_pat, colon, gpus = selector.strip().rpartition(":")
        try:
            _, which = parse_selector(gpus) if eq else (None, None)
        except ValueError:             # no selector before "=": a bare mode such as mps:max_clients=8
            eq = ""
        if not eq:
            node_pat, colon, which, text = "", "", None, item
        try:
            mode = parse_mode(text)
        except ValueError as e:
            raise ClusterSpecError(f"invalid --gpu-modes entry {item!r}: {e}") from None
        rank = (2 if colon else 0) + (1 if which is not None else 0)
        entries.append((rank, node_pat if colon else None, which, mode, item))
    out = []
    for n in nodes:
        gpus = []
        for g in n.gpus:
            hits = [(rank, mode, item) for rank, pat, which, mode, item in entries
                    if (pat is None or fnmatch.fnmatchcase(n.name, pat))
                    and (which is None or g.index in which)]
            if not hits:
                gpus.append(g)
                continue
            _, mode, item = max(hits, key=lambda h: h[0])
            gpus.append(_with_mode(n.name, g, mode, item))
        out.append(replace(n, gpus=tuple(gpus)))
    return tuple(out)


def _with_mode(node: str, g: GpuView, mode, item: str) -> GpuView:
    if mode.kind == "whole":
        return replace(g, mode="whole")
    if mode.kind == "mps":
        return replace(g, mode="mps", dynamic=mode.dynamic, mps_max_clients=mode.max_clients,
                       mps_thread_percentage=mode.thread_percentage)
    if mode.kind == "timeslice":
        return replace(g, mode="timeslice", replicas=mode.replicas)
    try:
        cat = mig.catalog(g.model)
        layout = [] if mode.dynamic else mig.named_layout(g.model, mode.layout)
    except mig.MigError as e:
        raise ClusterSpecError(f"invalid --gpu-modes entry {item!r} for {g.model}: {e}") from None
    slices = tuple(SliceView(s.profile, s.start, f"MIG-{node}-{g.index}-{s.start}-{s.profile}",
                             cat[s.profile].memory_mb) for s in layout)
    return replace(g, mode="mig", dynamic=mode.dynamic, slices=slices)


def shared_gpus(nodes: tuple[NodeView, ...]) -> list[GpuView]:
    """The GPUs set up for sharing (not ``whole``)."""
    return [g for n in nodes for g in n.gpus if g.mode != "whole"]
