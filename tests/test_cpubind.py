"""CPU binding: the sysfs reader, the pure choice, and a real job's affinity."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.worker import cpubind
from gpud.worker.cpubind import (CpuBinder, format_cpulist, job_cpus, numa_cpus, parse_cpulist,
                                 sim_numa_cpus)

TWO_NODES = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}


def fake_sysfs(root, nodes: dict[str, str]) -> str:
    """``root`` laid out like /sys with one ``nodeN/cpulist`` per entry."""
    base = root / "devices" / "system" / "node"
    base.mkdir(parents=True)
    (base / "possible").write_text("0-1\n")        # not a node directory: ignored
    for name, text in nodes.items():
        (base / name).mkdir()
        (base / name / "cpulist").write_text(text)
    return str(root)


# -- cpulists -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, cpus", [
    ("0-3,8-11\n", [0, 1, 2, 3, 8, 9, 10, 11]),
    ("5", [5]),
    ("", []),
    ("\n", []),
    (" 0-1 ", [0, 1]),
    ("  2 ,\t0-1 ,\n", [0, 1, 2]),
    ("3,1-2,2", [1, 2, 3]),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["abc", "1-", "-1", "3-1", "0-99999999", "1;2", "0x1"])
def test_parse_cpulist_refuses_bad_text(text):
    with pytest.raises(ValueError, match="bad cpulist"):
        parse_cpulist(text)


@pytest.mark.parametrize("cpus, text", [([], ""), ([4], "4"), ([0, 1, 2, 5], "0-2,5"),
                                        ([7, 3, 2, 9, 8], "2-3,7-9")])
def test_format_cpulist_round_trips(cpus, text):
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == sorted(cpus)


# -- the sysfs reader -----------------------------------------------------------------------------

def test_numa_cpus_reads_nodes_and_keeps_only_allowed_cpus(tmp_path):
    root = fake_sysfs(tmp_path, {"node0": "0-3\n", "node1": "4-7\n", "node2": "8-9\n"})
    assert numa_cpus(root, allowed=range(8)) == TWO_NODES   # node2: none of ours, dropped
    assert numa_cpus(root, allowed={1, 5}) == {0: [1], 1: [5]}


def test_numa_cpus_skips_a_bad_node_with_a_log_line(tmp_path, caplog):
    root = fake_sysfs(tmp_path, {"node0": "0-3\n", "node1": "four to seven\n"})
    with caplog.at_level(logging.WARNING, "gpud.worker.cpubind"):
        assert numa_cpus(root, allowed=range(8)) == {0: [0, 1, 2, 3]}
    assert "NUMA node 1" in caplog.text and "bad cpulist" in caplog.text


def test_numa_cpus_without_numa_information_binds_nothing(tmp_path):
    assert numa_cpus(str(tmp_path), allowed=range(8)) == {}
    root = fake_sysfs(tmp_path / "empty", {"node0": ""})
    assert numa_cpus(root, allowed=range(8)) == {}


def test_numa_cpus_defaults_to_the_processes_own_cpus(tmp_path):
    mine = cpubind.allowed_cpus()
    root = fake_sysfs(tmp_path, {"node0": format_cpulist(mine)})
    assert numa_cpus(root) == {0: mine}


def test_sim_numa_cpus_splits_evenly_in_order():
    assert sim_numa_cpus(2, allowed=range(8)) == TWO_NODES
    assert sim_numa_cpus(2, allowed=[0, 1, 2]) == {0: [0], 1: [1, 2]}
    assert sim_numa_cpus(2, allowed=[1, 0]) == {0: [0], 1: [1]}
    assert sim_numa_cpus(2, allowed=[0]) == {}                # fewer CPUs than nodes


# -- the choice -----------------------------------------------------------------------------------

def test_gpus_on_numa_1_get_numa_1_cpus():
    assert job_cpus([1, 1], 2, TWO_NODES, set()) == [4, 5]
    assert job_cpus([0], 3, TWO_NODES, set()) == [0, 1, 2]


def test_never_more_than_wanted_and_nothing_for_no_cpus():
    assert job_cpus([1], 100, TWO_NODES, set()) == list(range(8))
    assert job_cpus([1], 0, TWO_NODES, set()) == []


def test_free_cpus_of_the_gpus_node_first_then_spill():
    assert job_cpus([1], 3, TWO_NODES, {4, 5}) == [0, 6, 7]          # node 0 has room: spill
    assert job_cpus([1], 6, TWO_NODES, set()) == [0, 1, 4, 5, 6, 7]   # node 1 too small
    # spills go to the freest other node first
    three = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    assert job_cpus([0], 4, three, {2}) == [0, 1, 4, 5]


def test_shared_cpus_only_when_no_cpu_is_free_least_shared_first():
    assert job_cpus([1], 1, TWO_NODES, set(range(8))) == [4]
    assert job_cpus([1], 2, TWO_NODES, {c: 2 for c in range(8)} | {1: 1, 6: 1}) == [1, 6]
    assert job_cpus([1], 1, TWO_NODES, {c: 1 for c in range(8)} | {4: 3}) == [5]


def test_gpus_on_two_nodes_prefer_the_node_with_more_of_them():
    assert job_cpus([0, 1, 1], 5, TWO_NODES, set()) == [0, 4, 5, 6, 7]
    assert job_cpus([1, 0], 5, TWO_NODES, set()) == [0, 1, 2, 3, 4]   # a tie: lower node


def test_unknown_numa_does_not_restrict():
    assert job_cpus([0, None], 1, TWO_NODES, set()) == list(range(8))
    assert job_cpus([5], 1, TWO_NODES, set()) == list(range(8))       # not a node we know
    assert job_cpus([0], 1, {}, set()) == []


def test_a_job_without_gpus_starts_on_the_freest_node():
    assert job_cpus([], 2, TWO_NODES, {0, 1, 2}) == [4, 5]
    assert job_cpus([], 2, TWO_NODES, set()) == [0, 1]


def test_the_choice_is_deterministic():
    busy = {3: 1, 5: 2, 6: 1}
    first = job_cpus([1, 0], 4, TWO_NODES, busy)
    assert all(job_cpus([1, 0], 4, dict(reversed(TWO_NODES.items())), dict(reversed(busy.items()))) == first
               for _ in range(3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.lists(st.integers(0, 3), max_size=4),
       st.integers(1, 20), st.dictionaries(st.integers(0, 15), st.integers(0, 3)))
def test_choice_properties(sizes, gpu_nodes, want, busy):
    numa, start = {}, 0
    for n, size in enumerate(sizes):
        numa[n], start = list(range(start, start + size)), start + size
    gpu_nodes = [n for n in gpu_nodes if n in numa]
    got = job_cpus(gpu_nodes, want, numa, busy)
    everything = [c for cpus in numa.values() for c in cpus]
    assert got == sorted(set(got)) and set(got) <= set(everything)
    assert len(got) == min(want, len(everything))
    free_home = [c for n in set(gpu_nodes) for c in numa[n] if not busy.get(c)]
    if len(free_home) >= want:         # room on the GPUs' nodes: nothing comes from elsewhere
        assert set(got) <= set(free_home)
    else:                              # every free CPU of theirs is taken before any other
        assert set(free_home) <= set(got)


# -- the binder -----------------------------------------------------------------------------------

def test_two_jobs_do_not_overlap_while_there_is_room():
    b = CpuBinder(TWO_NODES, {0: 0, 1: 0, 2: 1, 3: 1})
    a = b.choose("a", [2], 2)
    c = b.choose("c", [3], 2)
    assert a == [4, 5] and c == [6, 7]
    d = b.choose("d", [2, 3], 2)            # node 1 is full: node 0
    assert d == [0, 1]
    b.release("a")
    assert b.choose("e", [3], 2) == [4, 5]  # a's CPUs are free again
    assert b.busy() == {0: 1, 1: 1, 4: 1, 5: 1, 6: 1, 7: 1}


def test_adopted_bindings_count_as_busy():
    b = CpuBinder(TWO_NODES, {0: 1})
    b.adopt(("j", 0), [4, 5, "junk", True])
    assert b.held(("j", 0)) == [4, 5]
    assert b.choose("new", [0], 2) == [6, 7]


def test_a_gpu_of_unknown_numa_node_runs_unrestricted():
    b = CpuBinder(TWO_NODES, {0: None})
    assert b.choose("a", [0], 1) == list(range(8))
    assert b.choose("b", [7], 1) == list(range(8))          # a GPU the binder never heard of


def test_from_host_modes(tmp_path):
    gpus = {0: 0}
    assert cpubind.from_host("none", 2, gpus) is None
    root = fake_sysfs(tmp_path, {"node0": format_cpulist(cpubind.allowed_cpus())})
    b = cpubind.from_host("numa", None, gpus, sysfs_root=root)
    assert b is not None and b.numa == {0: cpubind.allowed_cpus()}
    assert cpubind.from_host("numa", None, gpus, sysfs_root=str(tmp_path / "nothing")) is None


# -- real jobs ------------------------------------------------------------------------------------

@pytest.fixture
async def two_node_host(tmp_path):
    """An executor on a host whose fake sysfs has two NUMA nodes of one CPU each; GPU 0
    hangs off node 0, GPU 1 off node 1.  Yields (harness, binder, [cpu of node 0, of node 1])."""
    from tests.test_executor import Harness

    mine = cpubind.allowed_cpus()
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    pair = mine[:2]
    root = fake_sysfs(tmp_path / "sys", {"node0": f"{pair[0]}\n", "node1": f"{pair[1]}\n"})
    binder = cpubind.from_host("numa", None, {0: 0, 1: 1}, sysfs_root=root)
    assert binder is not None and binder.numa == {0: [pair[0]], 1: [pair[1]]}
    h = Harness(tmp_path)
    yield h, binder, pair
    await h.cleanup()


AFFINITY = """grep Cpus_allowed_list: /proc/self/status | tr -d '[:blank:]'
echo "GPUD_JOB_CPUS=${GPUD_JOB_CPUS-unset}"
echo ready; while [ ! -e go ]; do sleep 0.02; done
"""


def affinity(h, job_id: int) -> dict[str, str]:
    from tests.test_executor import read

    return dict(line.split(":" if line.startswith("Cpus") else "=", 1)
                for line in read(h.work_dir / f"gpud-{job_id}.out").splitlines() if line != "ready")


async def test_a_launched_job_runs_on_its_gpus_numa_node(two_node_host):
    h, binder, (cpu0, cpu1) = two_node_host
    ex = h.executor()
    ex.cpu_binder = binder
    await ex.start()
    one = [{"index": 1, "uuid": "GPU-one"}]
    await ex.launch(h.launch(AFFINITY, job_id=1, gpus=one, cpus=1))
    await h.output("gpud-1.out", "ready")
    assert affinity(h, 1) == {"Cpus_allowed_list": str(cpu1), "GPUD_JOB_CPUS": str(cpu1)}
    # a second job on GPU 1 finds node 1 full and spills to node 0's free CPU
    await ex.launch(h.launch(AFFINITY, job_id=2, gpus=one, cpus=1))
    await h.output("gpud-2.out", "ready")
    assert affinity(h, 2) == {"Cpus_allowed_list": str(cpu0), "GPUD_JOB_CPUS": str(cpu0)}
    assert os.sched_getaffinity(0) >= {cpu0, cpu1}, "the worker itself is never bound"
    # a restarted executor takes the bindings back from the jobs' records
    await ex.close()
    fresh = cpubind.CpuBinder(binder.numa, binder.gpu_numa)
    again = h.executor()
    again.cpu_binder = fresh
    await again.start()
    assert (fresh.held((1, 0)), fresh.held((2, 0))) == ([cpu1], [cpu0])
    (h.work_dir / "go").touch()
    for job in (1, 2):
        assert (await h.outcome(job)).exit_code == 0
    assert fresh.busy() == {}, "a finished job's CPUs are free again"


async def test_no_binder_leaves_the_job_unbound(two_node_host):
    h, _, _ = two_node_host
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch(AFFINITY.replace("echo ready;", "echo ready; touch go;"), job_id=3,
                             gpus=[{"index": 0, "uuid": "GPU-zero"}]))
    assert (await h.outcome(3)).exit_code == 0
    got = affinity(h, 3)
    assert parse_cpulist(got["Cpus_allowed_list"]) == cpubind.allowed_cpus()
    assert got["GPUD_JOB_CPUS"] == "unset"
