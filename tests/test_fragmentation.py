"""gpud.sched.fragmentation: free GPUs against the 8-GPU requests they could serve now."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.sched.fragmentation import Fragmentation, fragmentation
from gpud.sched.snapshot import GpuView, Part, SliceView
from tests.sched_builders import node, nodes, running


def test_empty_cluster_has_nothing_free_and_index_zero() -> None:
    f = fragmentation([], [])
    assert (f.size, f.free_gpus, f.servable, f.stranded_gpus, f.index) == (8, 0, 0, 0, 0.0)
    assert f.by_model == {} and f.by_partition == {}


def test_idle_eight_gpu_nodes_are_all_servable() -> None:
    f = fragmentation(nodes(3), [])
    assert (f.free_gpus, f.servable, f.stranded_gpus, f.index) == (24, 3, 0, 0.0)


def test_one_gpu_job_per_node_strands_every_free_gpu() -> None:
    ns = nodes(4)
    run = [running(i, n.name, (i,)) for i, n in enumerate(ns)]
    f = fragmentation(ns, run)
    assert (f.free_gpus, f.servable, f.stranded_gpus) == (28, 0, 28)
    assert f.index == 1.0


def test_mixed_free_counts_sum_per_node_floor() -> None:
    ns = [node("a", gpus=16), node("b"), node("c")]
    run = [running(1, "a", range(4)), running(2, "b", (0, 1)), running(3, "b", (2,))]
    f = fragmentation(ns, run)
    # a: 12 free -> 1 request, 4 stranded; b: 5 free -> 0; c: 8 free -> 1
    assert (f.free_gpus, f.servable, f.stranded_gpus) == (25, 2, 9)
    assert f.index == pytest.approx(9 / 25)


def test_other_sizes() -> None:
    ns = nodes(2)
    run = [running(1, "n001", (0, 1, 2))]
    f = fragmentation(ns, run, size=4)
    assert (f.size, f.free_gpus, f.servable, f.stranded_gpus) == (4, 13, 3, 1)
    assert fragmentation(ns, run, size=1).index == 0.0
    with pytest.raises(ValueError, match="at least 1 GPU"):
        fragmentation(ns, run, size=0)


def test_unschedulable_nodes_contribute_nothing() -> None:
    ns = [node("a"), node("b", up=False)]
    f = fragmentation(ns, [])
    assert (f.free_gpus, f.servable) == (8, 1)


def test_shared_gpus_are_excluded() -> None:
    base = node("a")
    gpus = list(base.gpus)
    gpus[0] = replace(gpus[0], mode="mig", slices=(SliceView("1g.10gb", 0),))
    gpus[1] = replace(gpus[1], mode="mps")
    f = fragmentation([replace(base, gpus=tuple(gpus))], [])
    assert (f.free_gpus, f.servable, f.stranded_gpus) == (6, 0, 6)


def test_stopping_jobs_still_hold_their_gpus_and_unknown_nodes_are_ignored() -> None:
    run = [running(1, "a", (0,), stopping=True), running(2, "ghost", (0, 1))]
    f = fragmentation([node("a")], run)
    assert (f.free_gpus, f.servable) == (7, 0)


def test_multi_node_jobs_hold_gpus_on_every_node_and_exclusive_jobs_whole_nodes() -> None:
    ns = nodes(3)
    gang = running(1, "n001", range(4), parts=(Part("n002", (0, 1, 2, 3), 1, 1024),))
    f = fragmentation(ns, [gang])
    assert (f.free_gpus, f.servable) == (16, 1)
    alone = running(2, "n003", (0,), exclusive=True)
    f = fragmentation(ns, [gang, alone])
    assert (f.free_gpus, f.servable, f.stranded_gpus) == (8, 0, 8)


def test_per_model_counts_need_size_gpus_of_one_model_on_a_node() -> None:
    mixed = node("m", models=["A100"] * 4 + ["H100"] * 4)
    f = fragmentation([mixed, node("h", model="H100")], [])
    assert f.servable == 2                       # an untyped request takes the mixed node
    assert set(f.by_model) == {"A100", "H100"}
    a, h = f.by_model["A100"], f.by_model["H100"]
    assert (a.free_gpus, a.servable, a.stranded_gpus) == (4, 0, 4)
    assert (h.free_gpus, h.servable, h.stranded_gpus) == (12, 1, 4)
    assert a.by_model == {} and a.by_partition == {}


def test_full_model_still_listed_with_zeros() -> None:
    ns = [node("a", model="A100")]
    f = fragmentation(ns, [running(1, "a", range(8))])
    assert f.by_model["A100"] == Fragmentation(size=8, free_gpus=0, servable=0, stranded_gpus=0, index=0.0)


def test_per_partition_by_node_globs() -> None:
    ns = nodes(2, prefix="big") + nodes(2, prefix="small", gpus=4)
    parts = {"all": ("*",), "big": ("big*",), "small": ("small*",), "none": ("zz*",)}
    f = fragmentation(ns, [running(1, "big001", (0,))], partitions=parts)
    assert (f.by_partition["all"].free_gpus, f.by_partition["all"].servable) == (23, 1)
    assert (f.by_partition["big"].free_gpus, f.by_partition["big"].servable) == (15, 1)
    assert (f.by_partition["small"].free_gpus, f.by_partition["small"].servable) == (8, 0)
    assert f.by_partition["small"].index == 1.0
    assert f.by_partition["none"].free_gpus == 0


def test_result_is_frozen() -> None:
    f = fragmentation(nodes(1), [])
    with pytest.raises(AttributeError):
        f.servable = 3  # type: ignore[misc]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16), st.integers(0, 16), st.booleans()), max_size=12),
       st.integers(1, 9))
def test_invariants(shape: list[tuple[int, int, bool]], size: int) -> None:
    ns, run = [], []
    for i, (total, used, up) in enumerate(shape):
        used = min(used, total)
        ns.append(node(f"n{i}", gpus=total, up=up))
        if used:
            run.append(running(i, f"n{i}", range(used)))
    f = fragmentation(ns, run, size)
    assert f.free_gpus == sum(t - min(u, t) for t, u, up in shape if up)
    assert 0 <= f.stranded_gpus == f.free_gpus - f.servable * f.size
    assert 0.0 <= f.index <= 1.0
    assert f.servable * size <= f.free_gpus
    # serving one more request is never possible: every node has fewer than size left over
    assert f.stranded_gpus < size * max(1, sum(1 for *_, up in shape if up)) or f.free_gpus == 0


def test_gpu_view_defaults_are_whole() -> None:
    # the module relies on GpuView.mode defaulting to "whole" for plain GPUs
    assert GpuView(0, "u", "m", 1).mode == "whole"
