"""Cluster specs for the simulator."""

from __future__ import annotations

import pytest

from gpud.sim.cluster import CPUS_PER_GPU, MEM_MB_PER_GPU, ClusterSpecError, parse_cluster


def test_one_group():
    nodes = parse_cluster("16x8xH100-80GB")
    assert [n.name for n in nodes] == [f"n{i:04d}" for i in range(1, 17)]
    n = nodes[0]
    assert [g.index for g in n.gpus] == list(range(8))
    assert {g.model for g in n.gpus} == {"H100-80GB"}
    assert n.gpus[0].memory_mb == 80 * 1024
    assert (n.cpus, n.mem_mb) == (8 * CPUS_PER_GPU, 8 * MEM_MB_PER_GPU)
    assert n.schedulable
    assert len({g.uuid for n in nodes for g in n.gpus}) == 16 * 8


def test_groups_number_nodes_across_the_spec():
    nodes = parse_cluster("2x8xH100-80GB, 3x4XA100-40GB")
    assert [n.name for n in nodes] == ["n0001", "n0002", "n0003", "n0004", "n0005"]
    assert [len(n.gpus) for n in nodes] == [8, 8, 4, 4, 4]
    assert nodes[2].gpus[0].model == "A100-40GB" and nodes[2].gpus[0].memory_mb == 40 * 1024


def test_wide_clusters_get_wider_names():
    nodes = parse_cluster("10000x1xL4-24GB")
    assert nodes[0].name == "n00001" and nodes[-1].name == "n10000"


@pytest.mark.parametrize("spec", [
    "", "  ", "16x8", "8xH100-80GB", "16x8xH100", "0x8xH100-80GB", "2x0xH100-80GB",
    "2x8xH100-0GB", "2x8xH100-80GB,", "axbxc", "2x2000xH100-80GB", "200000x1xH100-80GB",
    "2 x 8 x H100-80GB",
])
def test_bad_specs_are_one_line_errors(spec):
    with pytest.raises(ClusterSpecError) as e:
        parse_cluster(spec)
    assert "\n" not in str(e.value)
    assert "16x8xH100-80GB" in str(e.value) or "H100-80GB" in str(e.value)
