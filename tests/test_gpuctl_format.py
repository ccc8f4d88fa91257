"""gpuctl.format: tables in Slurm's shapes, on a pinned clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctl import format as fmt
from tests.fake_head import job, node

T0 = 1_700_000_000.0


def test_squeue_table():
    jobs = [
        job(12, name="train", user="alice", state="RUNNING", node="gpu01", gpus=2, start_time=T0),
        job(13, name="a-very-long-job-name-that-goes-on", user="bob", state="PENDING", reason="Resources",
            gpus=8),
    ]
    assert fmt.squeue_table(jobs, T0 + 3723).split("\n") == [
        "JOBID PARTITION NAME                     USER  ST    TIME GPUS NODELIST(REASON)",
        "   12 gpu       train                    alice R  1:02:03    2 gpu01",
        "   13 gpu       a-very-long-job-name-th+ bob   PD    0:00    8 (Resources)",
    ]
    assert fmt.squeue_table(jobs, T0, header=False).startswith("12 gpu train ")
    assert fmt.squeue_table([], T0, header=False) == ""
    assert fmt.squeue_table([job(40, display_id="40_[1-3]")], T0, header=False).startswith("40_[1-3] gpu ")


def padded_cell_by_cell(headers, rows, right, header):
    """What table means: every cell padded to its column's widest, one space apart."""
    cells = ([list(headers)] if header else []) + [[str(c) for c in row] for row in rows]
    widths = [max([len(r[i]) for r in cells], default=0) for i in range(len(headers))]
    return "\n".join(" ".join(c.rjust(widths[i]) if i in right else c if i == len(headers) - 1 else c.ljust(widths[i])
                               for i, c in enumerate(r)).rstrip() for r in cells)


@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.text(max_size=6), min_size=n, max_size=n),
    st.lists(st.lists(st.text(max_size=6) | st.integers() | st.none(), min_size=n, max_size=n), max_size=5),
    st.sets(st.integers(0, n - 1)), st.booleans())))
def test_table_pads_every_cell_to_its_column(case):
    headers, rows, right, header = case
    assert fmt.table(headers, rows, right=right, header=header) == padded_cell_by_cell(headers, rows, right, header)


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59, "0:59"), (61, "1:01"), (3600, "1:00:00"),
                                           (90061, "1-01:01:01")])
def test_squeue_time(seconds, text):
    assert fmt.squeue_time(seconds) == text


def test_squeue_order_running_first_then_pending_by_priority():
    jobs = [job(1, state="PENDING", priority=5), job(2, state="RUNNING"), job(3, state="PENDING", priority=9),
            job(4, state="COMPLETING")]
    assert [j["job_id"] for j in fmt.squeue_order(jobs)] == [2, 4, 3, 1]


def test_every_state_has_its_slurm_code():
    assert fmt.STATE_CODES == {"PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD",
                               "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF",
                               "PREEMPTED": "PR", "OUT_OF_MEMORY": "OOM"}


def test_sacct_table():
    jobs = [
        job(21, name="ok", state="COMPLETED", exit_code=0, node="gpu01", gpu_indices=[0, 1],
            start_time=T0, end_time=T0 + 65, gpu_util_mean=87.25),
        job(20, name="killed", state="CANCELLED", exit_code=0, signal=15, node="gpu02", gpus=1,
            start_time=T0, end_time=T0 + 5),
        job(22, name="wait", state="PENDING", gpus=4),
    ]
    assert fmt.sacct_table(jobs, T0 + 100).split("\n") == [
        "JobID JobName User  Account State     ExitCode  Elapsed NodeList      AllocGPUS GPUUtil",
        "   20 killed  alice default CANCELLED     0:15 00:00:05 gpu02                 1",
        "   21 ok      alice default COMPLETED      0:0 00:01:05 gpu01                 2   87.2%",
        "   22 wait    alice default PENDING        0:0 00:00:00 None assigned         0",
    ]


def test_sinfo_tables():
    nodes = [node("gpu02", gpus=8, gpus_alloc=3, state="MIXED", cpus_alloc=12),
             node("gpu01", gpus=8), node("gpu03", gpus=8), node("cpu1", gpus=0, mem_mb=1000)]
    assert fmt.sinfo_nodes_table(nodes).split("\n") == [
        "NODELIST STATE GPUS(A/T) CPUS(A/T) MEMORY GPU_MODEL",
        "cpu1     idle        0/0      0/64  1000M -",
        "gpu01    idle        0/8      0/64   512G H100-80GB",
        "gpu02    mix         3/8     12/64   512G H100-80GB",
        "gpu03    idle        0/8      0/64   512G H100-80GB",
    ]
    assert fmt.sinfo_summary_table(nodes).split("\n") == [
        "STATE NODES GPUS(A/T) GPU_MODEL NODELIST",
        "idle      1       0/0 -         cpu1",
        "idle      2      0/16 H100-80GB gpu[01,03]",
        "mix       1       3/8 H100-80GB gpu02",
    ]


@pytest.mark.parametrize("names, text", [
    (["gpu01", "gpu02", "gpu03"], "gpu[01-03]"),
    (["gpu03", "gpu01", "gpu02", "gpu07", "gpu09", "gpu10"], "gpu[01-03,07,09-10]"),
    (["a", "n9", "n10"], "a,n[9-10]"),
    (["n1"], "n1"),
])
def test_compress_hostlist(names, text):
    assert fmt.compress_hostlist(names) == text


def test_tables_tolerate_missing_fields():
    assert "?" in fmt.squeue_table([{}], T0)
    assert "None assigned" in fmt.sacct_table([{"job_id": 1}], T0)
    assert "unk" in fmt.sinfo_nodes_table([{"name": "x"}])
