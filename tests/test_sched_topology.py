"""Topology inside a node: NVLink islands and NUMA nodes decide which GPUs a job gets."""

from __future__ import annotations

import random
from dataclasses import replace

from gpud.gpu.topology import sim_wiring
from gpud.sched.core import schedule
from gpud.sched.placement import Cluster
from gpud.sched.snapshot import GpuView, NodeView
from gpud.sched.topology import NodeTopology, choose, spans, topology_of

from .sched_builders import GiB, MODEL, ToyCluster, config, node, pending, running, snapshot

MIN = 60.0


def wired(name: str, suffix: str | None = "islands4", gpus: int = 8) -> NodeView:
    """A node wired the way a simulated worker reports ``<gpus>xH100-80GB@<suffix>``."""
    wiring = sim_wiring([MODEL] * gpus, suffix)
    return NodeView(name=name, cpus=64, mem_mb=512 * GiB, gpus=tuple(
        GpuView(i, f"GPU-{name}-{i}", MODEL, 80 * GiB, numa_node=wiring[i].numa_node,
                nvlink_peers=wiring[i].nvlink_peers) for i in range(gpus)))


def blind(n: NodeView) -> NodeView:
    """The same node with its topology forgotten: today's lowest-indices pick."""
    return replace(n, gpus=tuple(replace(g, numa_node=None, nvlink_peers=()) for g in n.gpus))


ISLANDS = NodeTopology(wired("x").gpus)          # islands 0-3 and 4-7, NUMA nodes alike
SWITCHED = NodeTopology(wired("x", "nvswitch").gpus)   # one island of 8, two NUMA nodes


def island(g: int) -> int:
    return g // 4


def test_choose_best_fit_then_fewest_groups():
    by_ten = [lambda x: x // 10]
    assert choose([1, 2, 3, 11, 12], 2, by_ten) == [11, 12]          # the fuller group that fits
    assert choose([1, 2, 3, 11, 12], 3, by_ten) == [1, 2, 3]
    assert choose([1, 2, 11, 12, 13, 21], 5, by_ten) == [11, 12, 13, 1, 2]   # two groups, not three
    assert choose([1, 2, 11, 12, 13, 21], 4, by_ten) == [11, 12, 13, 21]     # rest best-fit: 21
    assert choose([1, 2, 11, 12, 13], 3, by_ten, required={1}) == [1, 2, 11]
    assert choose([1, 2, 3], 2, []) == [1, 2]
    assert spans([1, 2, 11], by_ten[0]) == 2


def test_pick_keeps_a_job_in_one_island_best_fit():
    assert ISLANDS.pick(range(8), 4) == (0, 1, 2, 3)
    assert ISLANDS.pick([1, 2, 3, 4, 5, 6, 7], 4) == (4, 5, 6, 7)    # the island that still has 4
    assert ISLANDS.pick([2, 3, 4, 5, 6, 7], 2) == (2, 3)             # the half-used island
    assert ISLANDS.pick([1, 2, 3, 4, 5, 6, 7], 1) == (1,)
    assert ISLANDS.pick([3, 5, 6, 7], 4) == (3, 5, 6, 7)             # no island has 4: fewest islands
    assert ISLANDS.fits_one_island([1, 2, 3, 4, 5, 6, 7], 4)
    assert not ISLANDS.fits_one_island([2, 3, 4, 5, 6], 4)


def test_numa_breaks_the_tie_inside_one_island():
    assert SWITCHED.pick([0, 1, 2, 4, 5, 6, 7], 3) == (0, 1, 2)      # NUMA node 0 has exactly 3
    assert SWITCHED.pick([0, 1, 2, 4, 5, 6, 7], 4) == (4, 5, 6, 7)
    assert SWITCHED.pick([0, 1, 2, 4, 5, 6, 7], 1) == (0,)           # the fuller NUMA node


def test_nodes_without_topology_keep_the_lowest_indices():
    assert topology_of(node("plain").gpus) is None
    assert topology_of(wired("x", "none").gpus) is not None            # NUMA still known
    c = Cluster([node("plain")], [running(1, "plain", (0,))], config())
    assert c.pick(0, 4, None) == (1, 2, 3, 4)
    c = Cluster([wired("w")], [running(1, "w", (0,))], config())
    assert c.pick(0, 4, None) == (4, 5, 6, 7)


def test_among_equal_nodes_one_where_the_job_fits_an_island_wins():
    # both have 4 GPUs free; only on w2 are they one island
    run = [running(1, "w1", (0, 1, 4, 5)), running(2, "w2", (0, 1, 2, 3))]
    plan = schedule(snapshot([wired("w1"), wired("w2")], [pending(9, 4)], run), 0.0)
    assert (plan.starts[0].node, plan.starts[0].gpu_indices) == ("w2", (4, 5, 6, 7))
    # binpack still comes first: the fuller node wins even though the job spans islands there
    run = [running(1, "w1", (0, 1, 4, 5, 6)), running(2, "w2", (0, 1, 2, 3))]
    plan = schedule(snapshot([wired("w1"), wired("w2")], [pending(9, 3)], run), 0.0)
    assert plan.starts[0].node == "w1"


def test_backfill_uses_the_same_pick():
    """A reservation on the node: the backfill check sees the GPUs the start would take."""
    run = [running(1, "w1", (0, 1, 2, 3), time_limit=3600.0)]
    pend = [pending(2, 8, submit_time=0.0), pending(3, 4, submit_time=1.0, time_limit=600.0)]
    plan = schedule(snapshot([wired("w1")], pend, run), 0.0)
    assert plan.expected_starts[2] == 3600.0
    assert [(s.job_id, s.gpu_indices) for s in plan.starts] == [(3, (4, 5, 6, 7))]


def drive(node_list: tuple[NodeView, ...], seed: int, steps: int = 400) -> dict[int, list[int]]:
    """A seeded stream of 1/2/4-GPU jobs through the core; per job size 2 and 4: [starts,
    starts split across islands, splits made while one island had room for the job]."""
    toy = ToyCluster(node_list, config())
    rng = random.Random(seed)
    counts = {2: [0, 0, 0], 4: [0, 0, 0]}
    for _ in range(steps):
        for _ in range(rng.choice([0, 0, 1])):
            minutes = rng.uniform(5, 60)
            toy.submit(rng.choice([1, 1, 2, 4]), duration=minutes * MIN, time_limit=2 * minutes * MIN)
        snap = toy.snapshot()
        used = {n.name: set() for n in node_list}
        for r in snap.running:
            used[r.node].update(r.gpu_indices)
        plan = toy.step()
        for s in plan.starts:
            k = len(s.gpu_indices)
            free = [g for g in range(8) if g not in used[s.node]]
            used[s.node].update(s.gpu_indices)
            if k not in counts:
                continue
            counts[k][0] += 1
            if spans(s.gpu_indices, island) > 1:
                counts[k][1] += 1
                if any(sum(1 for g in free if island(g) == isl) >= k for isl in (0, 1)):
                    counts[k][2] += 1
        toy.advance(toy.now + 2 * MIN)
    return counts


def test_islands_keep_4_gpu_jobs_whole_against_a_blind_placer():
    """On nodes with two 4-GPU NVLink islands, a stream of mixed 1/2/4-GPU jobs never splits a
    job across islands when one island had room; the lowest-indices placer splits often."""
    ours_nodes = (wired("w1"), wired("w2"))
    blind_nodes = tuple(blind(n) for n in ours_nodes)
    for seed in (1, 2, 3):
        ours, theirs = drive(ours_nodes, seed), drive(blind_nodes, seed)
        for k in (4, 2):
            print(f"seed {seed}, {k}-GPU jobs [starts, split across islands, split while an island "
                  f"had room]: topology-aware {ours[k]}, topology-blind {theirs[k]}")
            assert ours[k][2] == 0
        assert theirs[4][2] > 0 and theirs[4][1] > ours[4][1]
        assert theirs[2][1] > ours[2][1]
