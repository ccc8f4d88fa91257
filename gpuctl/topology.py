"""Where nodes and GPUs sit, as text: ``sinfo --topology`` and ``scontrol show node``.

A node's ``labels`` carry its ``rack`` and ``switch`` (from its ``[worker] labels``) and
its ``features`` (``[worker] features``, comma-joined: what ``sbatch -C`` selects by); each
of its GPUs carries ``numa_node`` and ``nvlink_peers`` (gpud.gpu.topology).  GPUs joined by
NVLink, directly or through others, form an *island*, written as GPU indices in brackets:
``[0-7]`` is an all-to-all board, ``[0-3],[4-7]`` two islands of four; a GPU alone is in
no island.  NUMA nodes are written ``NODE:[GPUS]``: ``0:[0-3],1:[4-7]``.  Unknown or
absent values read ``(null)`` in scontrol's way and ``-`` in sinfo's table.  Pure text.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from gpud.syntax import format_indices

from . import format as fmt


def islands(gpus: Iterable[dict[str, Any]]) -> list[list[int]]:
    """GPU indices joined by NVLink, each island sorted, islands by their first GPU."""
    links: dict[int, set[int]] = {}
    for g in gpus:
        i = int(g.get("index", 0))
        links.setdefault(i, set())
        for p in g.get("nvlink_peers") or ():
            links[i].add(int(p))
            links.setdefault(int(p), set()).add(i)
    seen: set[int] = set()
    out = []
    for start in sorted(links):
        if start in seen or not links[start]:
            continue
        island, todo = set(), [start]
        while todo:
            i = todo.pop()
            if i not in island:
                island.add(i)
                todo += links[i] - island
        seen |= island
        out.append(sorted(island))
    return out


def islands_text(gpus: list[dict[str, Any]]) -> str | None:
    found = islands(gpus)
    return ",".join(f"[{format_indices(i)}]" for i in found) if found else None


def numa_text(gpus: list[dict[str, Any]]) -> str | None:
    """``0:[0-3],1:[4-7]``; None when no GPU's NUMA node is known."""
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        if g.get("numa_node") is not None:
            by_node.setdefault(int(g["numa_node"]), []).append(int(g.get("index", 0)))
    return ",".join(f"{n}:[{format_indices(ix)}]" for n, ix in sorted(by_node.items())) or None


def node_lines(node: dict[str, Any]) -> list[str]:
    """``scontrol show node``'s lines for where the node and its GPUs sit."""
    labels = node.get("labels") or {}
    gpus = node.get("gpus") or []
    return [f"Rack={labels.get('rack') or '(null)'} Switch={labels.get('switch') or '(null)'}",
            f"GpuIslands={islands_text(gpus) or '(null)'} GpuNuma={numa_text(gpus) or '(null)'}"]


def feature_lines(node: dict[str, Any]) -> list[str]:
    """``scontrol show node``'s feature lines, Slurm's way (every feature is always active)."""
    features = (node.get("labels") or {}).get("features") or "(null)"
    return [f"AvailableFeatures={features}", f"ActiveFeatures={features}"]


def sinfo_table(nodes: list[dict[str, Any]], *, header: bool = True) -> str:
    """``sinfo --topology``: one line per node, by rack, switch and name."""
    def key(n: dict[str, Any]) -> tuple:
        labels = n.get("labels") or {}
        m = re.match(r"^(.*?)(\d+)$", str(n.get("name", "")))
        name = (m.group(1), int(m.group(2))) if m else (str(n.get("name", "")), -1)
        return (labels.get("rack") or "~", labels.get("switch") or "~", name)

    rows = []
    for n in sorted(nodes, key=key):
        labels = n.get("labels") or {}
        gpus = n.get("gpus") or []
        rows.append((n.get("name", "?"), labels.get("rack") or "-", labels.get("switch") or "-",
                     n.get("gpus_total", len(gpus)), islands_text(gpus) or "-", numa_text(gpus) or "-",
                     labels.get("features") or "-"))
    return fmt.table(("NODELIST", "RACK", "SWITCH", "GPUS", "NVLINK", "NUMA", "FEATURES"), rows, right=(3,),
                     header=header)
