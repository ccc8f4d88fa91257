"""Fewest groups, best fit: which GPUs of a node, and which nodes of a cluster, a job takes.

Theory of operation
-------------------
Placing a job inside a node and placing a gang across nodes ask the same question at two
scales: take ``k`` items out of groups (NVLink islands, then NUMA nodes, for GPUs; leaf
switches, then racks, for nodes) so the job spans as few groups as possible.  ``choose``
answers it for a list of grouping levels, outermost first:

* when one group holds enough, take the one with the *least* room that still fits (best
  fit): a 2-GPU job goes to the half-used island, so the empty one stays whole for a
  4-GPU job later;
* otherwise take the biggest groups whole until what is left fits in one more group, and
  best-fit that rest; this spans the fewest groups possible;
* inside the chosen group(s) the next level decides the same way, and at the end the
  items' own order (GPU index; binpack order for nodes) breaks every tie, so the answer is
  deterministic.

``required`` items (a gang's ``--nodelist``) are always taken, and the groups holding them
come first: they are spanned anyway.

``NodeTopology`` derives a node's levels from its GPUs: islands are the connected parts of
the ``nvlink_peers`` graph (a GPU with no peers is an island of its own), NUMA nodes come
from ``numa_node`` (unknown ones share a group).  A node that reports neither has no
levels, and the placer keeps its plain lowest-indices pick at no extra cost.
"""

from __future__ import annotations

from typing import Callable, Collection, Hashable, Sequence, TypeVar

from .snapshot import GpuView

T = TypeVar("T")
Level = Callable[[T], Hashable]


def choose(items: Sequence[T], k: int, levels: Sequence[Level], required: Collection[T] = ()) -> list[T]:
    """``k`` of ``items`` (which must hold at least ``k``) spanning the fewest groups at each
    level, best fit first, every item of ``required`` included; see the module docstring."""
    if k <= 0:
        return []
    if not levels:
        if required:
            first = [x for x in items if x in required]
            return (first + [x for x in items if x not in required])[:k]
        return list(items[:k])
    key, inner = levels[0], levels[1:]
    groups: dict[Hashable, list[T]] = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    rest = list(groups.values())
    out: list[T] = []
    need = k
    if required:
        must = [g for g in rest if any(x in required for x in g)]
        if must:
            pooled = [x for g in must for x in g]
            if len(pooled) >= need:
                return choose(pooled, need, inner, required)
            out, need = pooled, need - len(pooled)
            rest = [g for g in rest if not any(x in required for x in g)]
    while need > 0 and rest:
        fitting = [g for g in rest if len(g) >= need]
        if fitting:
            out.extend(choose(min(fitting, key=len), need, inner))
            return out
        biggest = max(rest, key=len)          # the first of equals: items keep their order
        out.extend(biggest)
        need -= len(biggest)
        rest.remove(biggest)
    return out


def spans(items: Sequence[T], key: Level) -> int:
    """How many groups of ``key`` the items touch."""
    return len({key(x) for x in items})


class NodeTopology:
    """One node's GPU grouping levels: NVLink islands, then NUMA nodes (each when known)."""

    __slots__ = ("island", "numa", "levels")

    def __init__(self, gpus: Sequence[GpuView]) -> None:
        index = {g.index for g in gpus}
        parent = {i: i for i in index}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        linked = False
        for g in gpus:
            for p in g.nvlink_peers:
                if p in index and p != g.index:
                    linked = True
                    a, b = root(g.index), root(p)
                    if a != b:
                        parent[max(a, b)] = min(a, b)   # an island is named by its lowest GPU
        self.island: dict[int, int] = {i: root(i) for i in index} if linked else {}
        self.numa: dict[int, int | None] = ({g.index: g.numa_node for g in gpus}
                                            if any(g.numa_node is not None for g in gpus) else {})
        levels: list[Level] = []
        if self.island:
            levels.append(self.island.__getitem__)
        if self.numa:
            levels.append(self.numa.__getitem__)
        self.levels: tuple[Level, ...] = tuple(levels)

    def pick(self, free: Sequence[int], k: int) -> tuple[int, ...]:
        """``k`` GPUs out of ``free`` (ascending): one island if any has room, best fit."""
        return tuple(sorted(choose(free, k, self.levels)))

    def fits_one_island(self, free: Sequence[int], k: int) -> bool:
        """Whether some island has ``k`` of ``free``; True on nodes without NVLink data."""
        if not self.island or k <= 1:
            return True
        count: dict[int, int] = {}
        for g in free:
            c = count[self.island[g]] = count.get(self.island[g], 0) + 1
            if c >= k:
                return True
        return False


def topology_of(gpus: Sequence[GpuView]) -> NodeTopology | None:
    """The node's topology, or None when its GPUs report no NVLink peers and no NUMA node."""
    for g in gpus:
        if g.nvlink_peers or g.numa_node is not None:
            break
    else:
        return None
    t = NodeTopology(gpus)
    return t if t.levels else None
