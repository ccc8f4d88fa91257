"""Which CPUs a job may run on: the ones on its GPUs' NUMA node, least busy first.

Theory of operation
-------------------
A GPU hangs off one CPU socket; a job whose processes run on another socket pays for every
host-device copy crossing the inter-socket link.  So each job is bound (``sched_setaffinity``
in the wrapper's child, before it becomes the job's user) to ``cpus`` CPUs taken from the
NUMA node(s) of its GPUs.

Three pieces:

* ``numa_cpus`` reads the host's NUMA nodes from sysfs (``node*/cpulist``), keeping only
  the CPUs the worker itself may use.  Simulated GPUs have no real NUMA node, so
  ``sim_numa_cpus`` splits the worker's CPUs evenly into the simulator's nodes instead: a
  test box goes down the same path as a real server.
* ``job_cpus`` is the choice, a pure function: CPUs on the GPUs' nodes that no other job
  holds, then free CPUs of other nodes (a spill, only when the GPUs' nodes lack room), then
  the least shared CPUs, always in a fixed order.  A GPU of unknown NUMA node means no
  preference we can trust, and the job gets every CPU (no restriction).
* ``CpuBinder`` remembers which CPUs each running job holds, so two jobs do not share CPUs
  while there is room.  The executor records each job's CPUs with the job; after a restart
  it hands them back with ``adopt``.

An empty list always means "do not bind".  Binding never fails a job: a host without NUMA
information, or ``[worker] cpu_bind = "none"``, simply runs jobs unbound.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from typing import Collection, Hashable, Iterable, Mapping

log = logging.getLogger("gpud.worker.cpubind")

MODES = ("numa", "none")
MAX_CPU = 1 << 16          # far above any host; guards against "0-4294967295"
_NODE_DIR = re.compile(r"^node(\d+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


# -- cpulists -------------------------------------------------------------------------------------

def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist (``"0-3,8-11"``, ``"5"``, ``""``) as sorted CPU numbers;
    ValueError naming the bad part otherwise.  Whitespace around parts is ignored."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad cpulist part {part!r:.40}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi >= MAX_CPU:
            raise ValueError(f"bad cpulist range {part!r:.40}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """CPU numbers as a cpulist, runs folded: [0, 1, 2, 5] -> ``"0-2,5"``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(_run(run))
        run = [c]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


# -- the host's NUMA nodes ------------------------------------------------------------------------

def allowed_cpus() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return list(range(os.cpu_count() or 1))


def numa_cpus(sysfs_root: str = "/sys", allowed: Collection[int] | None = None) -> dict[int, list[int]]:
    """NUMA node -> its CPUs that are in ``allowed`` (default: the worker's own), from
    ``<sysfs_root>/devices/system/node/node*/cpulist``.  Nodes left without CPUs are
    dropped; no readable node gives ``{}`` (no binding).  A bad file is logged and skipped."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    ok = set(allowed_cpus() if allowed is None else allowed)
    try:
        names = os.listdir(base)
    except OSError as e:
        log.info("no NUMA information at %s (%s); jobs run unbound", base, e.strerror)
        return {}
    out: dict[int, list[int]] = {}
    for name in names:
        m = _NODE_DIR.match(name)
        if not m:
            continue
        path = os.path.join(base, name, "cpulist")
        try:
            with open(path, encoding="ascii") as f:
                cpus = parse_cpulist(f.read())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning("NUMA node %s: cannot use %s (%s); its CPUs are not bound to", m.group(1), path, e)
            continue
        mine = [c for c in cpus if c in ok]
        if mine:
            out[int(m.group(1))] = mine
    return dict(sorted(out.items()))


def sim_numa_cpus(nodes: int, allowed: Collection[int] | None = None) -> dict[int, list[int]]:
    """The worker's CPUs split evenly, in order, into ``nodes`` pretend NUMA nodes (for
    simulated GPUs); ``{}`` when there are fewer CPUs than nodes."""
    cpus = sorted(allowed_cpus() if allowed is None else allowed)
    if nodes < 1 or len(cpus) < nodes:
        return {}
    n = len(cpus)
    return {i: cpus[i * n // nodes:(i + 1) * n // nodes] for i in range(nodes)}


# -- the choice -----------------------------------------------------------------------------------

def job_cpus(gpu_numa: list[int | None], want: int, numa: Mapping[int, list[int]],
             busy: Collection[int] | Mapping[int, int] = ()) -> list[int]:
    """The CPUs for a job with GPUs on NUMA nodes ``gpu_numa`` (one entry per GPU, None:
    unknown) that asked for ``want`` CPUs, sorted; at most ``want`` of them.

    ``busy`` is the CPUs other jobs hold: a set, or CPU -> how many jobs hold it.  Order of
    preference: free CPUs on the GPUs' nodes (the node with most of the job's GPUs first),
    free CPUs elsewhere (the node with most free CPUs first), then shared CPUs, least shared
    first, the GPUs' nodes first again.  A job without GPUs starts on the freest node.
    Every CPU in ``numa`` when a GPU's node is unknown; ``[]`` when ``numa`` is empty."""
    if not numa or want < 1:
        return []
    everything = sorted({c for cpus in numa.values() for c in cpus})
    if any(n is None or n not in numa for n in gpu_numa):
        return everything
    load = busy if isinstance(busy, Mapping) else Counter(busy)
    gpus_on = Counter(gpu_numa)
    free = {n: sum(1 for c in cpus if not load.get(c, 0)) for n, cpus in numa.items()}
    # preferred nodes first, by how many of the job's GPUs they hold; then the freest
    order = sorted(numa, key=lambda n: (-gpus_on[n], -free[n], n))
    rank = {n: i for i, n in enumerate(order)}
    candidates = sorted(((load.get(c, 0), rank[n], c) for n, cpus in numa.items() for c in cpus))
    chosen: list[int] = []
    seen: set[int] = set()
    for _, _, c in candidates:       # a CPU listed under two nodes counts once
        if c not in seen:
            seen.add(c)
            chosen.append(c)
            if len(chosen) == want:
                break
    return sorted(chosen)


class CpuBinder:
    """The CPUs of this node's running jobs; picks each new job's (see the module docstring).

    ``gpu_numa`` maps a GPU index to its NUMA node (None: unknown).  Event-loop thread only."""

    def __init__(self, numa: Mapping[int, list[int]], gpu_numa: Mapping[int, int | None]) -> None:
        self.numa = {n: list(c) for n, c in numa.items()}
        self.gpu_numa = dict(gpu_numa)
        self._held: dict[Hashable, list[int]] = {}

    def choose(self, key: Hashable, gpus: Iterable[int], want: int) -> list[int]:
        """Pick and hold the CPUs of job ``key`` on GPUs ``gpus``; [] when not binding."""
        self.release(key)
        nodes = [self.gpu_numa.get(i) for i in dict.fromkeys(gpus)]
        cpus = job_cpus(nodes, want, self.numa, self.busy())
        if cpus:
            self._held[key] = cpus
        return cpus

    def adopt(self, key: Hashable, cpus: Iterable[int]) -> None:
        """A job found running again after a restart holds ``cpus`` (its recorded binding)."""
        held = sorted({c for c in cpus if isinstance(c, int) and not isinstance(c, bool)})
        if held:
            self._held[key] = held

    def release(self, key: Hashable) -> None:
        self._held.pop(key, None)

    def held(self, key: Hashable) -> list[int]:
        return list(self._held.get(key, ()))

    def busy(self) -> Counter:
        """CPU -> how many running jobs hold it."""
        return Counter(c for cpus in self._held.values() for c in cpus)


def from_host(mode: str, sim_nodes: int | None, gpu_numa: Mapping[int, int | None],
              sysfs_root: str = "/sys") -> CpuBinder | None:
    """The binder for this worker: ``mode`` is ``[worker] cpu_bind``; ``sim_nodes`` the
    simulator's NUMA node count for simulated GPUs, None for real ones.  None: no binding."""
    if mode == "none":
        return None
    numa = sim_numa_cpus(sim_nodes) if sim_nodes is not None else numa_cpus(sysfs_root)
    if not numa:
        return None
    log.info("jobs are bound to the CPUs of their GPUs' NUMA nodes: %s",
             "; ".join(f"node {n}: {format_cpulist(c)}" for n, c in numa.items()))
    return CpuBinder(numa, gpu_numa)
