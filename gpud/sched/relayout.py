"""Re-layouts of ``mig:dynamic`` GPUs: what one could cut, and which GPU should cut one slice.

An ``Option`` is a re-layout of one GPU for some new slices (``option_now``): placed in
unused memory slots, destroying nothing, or, past ``mig_min_interval``, placed beside the
slices in use only, destroying exactly the free slices in the way (and, rarely, a few more
to respect compute and count limits).  A slice in use, or one the job itself keeps, is never
destroyed.

Which GPU cuts one new slice (``LayoutIndex.best``): the busiest that destroys nothing,
else the one that destroys fewest, then the busiest; then node and GPU order.  What a GPU
could cut depends only on its state (model, slices, which are in use, whether the minimum
interval is over), and a big cluster has few distinct states, so GPUs that may take a
re-layout are kept grouped by state, each group's option is computed once, and a search
costs the number of states, not GPUs.  A GPU leaves the index for the pass once it is
re-laid (``busy``), claimed by a waiting job (only the claimant could use it, and a job is
considered once a pass), or backing off a refused re-layout.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

from ..gpu import mig
from .gpustate import GpuState, catalog, place
from .shared import INF, SharedGpus
from .snapshot import PendingJob


@dataclass
class Option:
    """A re-layout of one GPU: the free slices it destroys and the slices it creates."""

    gpu: GpuState
    destroy: tuple[mig.Slice, ...]
    create: tuple[mig.Slice, ...]


def interval_end(g: GpuState, min_interval: float) -> float:
    """When a re-layout that destroys slices is next allowed on ``g``."""
    last, after = g.view.relaid_at, g.view.relayout_after
    end = -INF if last is None else last + min_interval
    return end if after is None else max(end, after)


def option_now(g: GpuState, profiles: list[str], destroying: bool, keep: frozenset[int],
               interval_over: bool) -> Option | None:
    """New slices for ``profiles`` on ``g`` as it is now (module docstring), or None."""
    existing = list(g.slices.values())
    if not destroying:
        new = place(g.model, profiles, existing)
        return None if new is None else Option(g, (), tuple(new))
    if not interval_over:
        return None
    in_use = [s for s in existing if s.start in g.used or s.start in keep]
    new = place(g.model, profiles, in_use)
    if new is None:
        return None
    taken = 0
    for s in new:
        taken |= g.mask(s)
    free = [s for s in existing if s.start not in g.used and s.start not in keep]
    destroy = [s for s in free if g.mask(s) & taken]
    kept = [s for s in free if not g.mask(s) & taken]
    while kept and not mig.is_valid_layout(g.model, in_use + kept + new):
        destroy.append(kept.pop())          # compute or count limits: drop the highest free slice
    return Option(g, tuple(sorted(destroy)), tuple(new))


State = tuple      # (model, slices, starts in use, minimum interval over)


class LayoutIndex:
    """The dynamic MIG GPUs that may take a re-layout now, grouped by state (module docstring)."""

    def __init__(self, pool: SharedGpus, min_interval: float) -> None:
        self.pool, self.now, self.min_interval = pool, pool.now, min_interval
        self.groups: dict[State, list[tuple[int, int, GpuState]]] = {}   # members in node, GPU order
        self._state: dict[GpuState, State | None] = {}
        self._members: set[GpuState] = set()
        self._options: dict[tuple, tuple[tuple[mig.Slice, ...], tuple[mig.Slice, ...]] | None] = {}
        for g in pool.gpus:
            if g.view.mode == "mig" and g.view.dynamic:
                self._members.add(g)
                state = self._state[g] = self.state(g)
                if state is not None:
                    self.groups.setdefault(state, []).append((g.node, g.index, g))
        for members in self.groups.values():
            members.sort(key=lambda e: e[:2])

    def state(self, g: GpuState) -> State | None:
        """What decides ``g``'s options; None once it may take no re-layout in this pass."""
        v = g.view
        if g.busy or g.claims or not g.layout_ok or (v.relayout_after is not None and v.relayout_after > self.now):
            return None
        return (g.model, g.layout_key, frozenset(g.used), interval_end(g, self.min_interval) <= self.now)

    def touch(self, g: GpuState) -> None:
        """``g`` changed: file it under its new state."""
        if g not in self._members:
            return
        old, new = self._state.get(g), self.state(g)
        if old == new and g in self._state:
            return
        entry = (g.node, g.index, g)
        if old is not None:
            members = self.groups[old]
            del members[bisect.bisect_left(members, entry[:2])]
            if not members:
                del self.groups[old]
        self._state[g] = new
        if new is not None:
            bisect.insort(self.groups.setdefault(new, []), entry, key=lambda e: e[:2])

    def best(self, job: PendingJob, usable: frozenset[GpuState],
             profile_of: Callable[[str], str | None]) -> tuple[Option, str] | None:
        """The re-layout cutting one slice of ``profile_of(model)`` for the job, on a GPU in
        ``usable`` whose node has the job's CPUs and memory free: the busiest GPU that
        destroys nothing, else the one destroying fewest, then the busiest; node, GPU order."""
        ok = self.pool.node_ok_later
        for destroying in (False, True):
            best: tuple[tuple, GpuState, str, tuple] | None = None
            for state, members in self.groups.items():
                q = profile_of(state[0])
                if q is None or q not in catalog(state[0]):
                    continue
                found = self._option(state, members[0][2], q, destroying)
                if found is None:
                    continue
                g = next((g for _, _, g in members if g in usable and ok(g.node, job)), None)
                if g is None:
                    continue
                busy = -g.used_compute()
                rank = (len(found[0]), busy, g.node, g.index) if destroying else (busy, g.node, g.index)
                if best is None or rank < best[0]:
                    best = (rank, g, q, found)
            if best is not None:
                _, g, q, (destroy, create) = best
                return Option(g, destroy, create), q
        return None

    def _option(self, state: State, g: GpuState, q: str, destroying: bool) -> tuple | None:
        key = (state, q, destroying)
        if key not in self._options:
            o = option_now(g, [q], destroying, frozenset(), state[3])
            self._options[key] = None if o is None else (o.destroy, o.create)
        return self._options[key]
