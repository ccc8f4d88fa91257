"""Trace reading: the common schema, what counts as unknown, what is skipped and why."""

from __future__ import annotations

import io
import itertools

import pytest

from gpud.sim.trace import UNKNOWN_USER, TraceError, TraceStats, iter_trace, open_trace

HEADER = "job_id,submit_s,gpus,duration_s,user,group,gpu_type,status\n"


def read(text: str) -> tuple[list, TraceStats]:
    stats = TraceStats()
    return list(iter_trace(io.StringIO(text), stats)), stats


def test_common_schema_row():
    jobs, stats = read(HEADER + "a1,10,8,3600,alice,research,H100-80GB,complete\n")
    (j,) = jobs
    assert (j.seq, j.trace_id, j.submit_s, j.gpus, j.share, j.duration_s) == \
        (1, "a1", 10.0, 8, 8.0, 3600.0)
    assert (j.user, j.account, j.gpu_type, j.status) == ("alice", "research", "H100-80GB", "complete")
    assert (j.time_limit_s, j.qos, j.gpu_mem, j.mig_profile) == (None, None, None, None)
    assert (stats.rows, stats.accepted, stats.skipped_total) == (1, 1, 0)


def test_empty_fields_are_unknown():
    (j,), _ = read(HEADER + ",5,1,60,,,,\n")
    assert j.trace_id == "row 1"
    assert j.user == UNKNOWN_USER
    assert j.account is None and j.gpu_type is None and j.status is None


def test_fractional_gpus_take_one_gpu_billed_their_share():
    (j,), _ = read(HEADER + "p,0,0.46,100,,,,Running\n")
    assert (j.gpus, j.share) == (1, 0.46)


def test_zero_gpu_jobs_are_skipped_and_counted():
    jobs, stats = read(HEADER + "c,0,0,100,,,,\nc2,0,0.0,100,,,,\ng,0,1,1,,,,\n")
    assert [j.trace_id for j in jobs] == ["g"]
    assert jobs[0].seq == 1
    assert stats.skipped == {"zero_gpu": 2}
    assert (stats.rows, stats.accepted) == (3, 1)


@pytest.mark.parametrize("row", [
    "x,abc,1,10,,,,",        # submit not a number
    "x,-1,1,10,,,,",         # negative submit
    "x,0,1,-5,,,,",          # negative duration
    "x,0,-1,10,,,,",         # negative gpus
    "x,0,1.5,10,,,,",        # fractional above one
    "x,nan,1,10,,,,",
    "x,0,inf,10,,,,",
    "x,0,1,,,,,",            # duration unknown: nothing to simulate
    "x,0",                   # short row
    "x,0,\ufffd,10,,,,",     # undecodable bytes end up here
])
def test_malformed_rows_are_skipped_and_counted(row):
    jobs, stats = read(HEADER + row + "\nok,1,1,10,,,,\n")
    assert [j.trace_id for j in jobs] == ["ok"]
    assert stats.skipped == {"malformed": 1}
    assert stats.rows == 2


def test_optional_columns_and_any_column_order():
    text = ("extra,duration_s,gpus,submit_s,group,time_limit_s,qos,gpu_mem,mig_profile\n"
            "zz,100,2,7,acct,50,high,20G,1g.10gb\n"
            "zz,100,2,8,acct,UNLIMITED,,,\n"
            "zz,100,2,9,acct,0,,,\n")
    jobs, stats = read(text)
    assert len(jobs) == 2
    a, b = jobs
    assert (a.submit_s, a.duration_s, a.gpus, a.account) == (7.0, 100.0, 2, "acct")
    assert (a.time_limit_s, a.qos, a.gpu_mem, a.mig_profile) == (50.0, "high", "20G", "1g.10gb")
    assert a.trace_id == "row 1" and a.user == UNKNOWN_USER
    assert b.time_limit_s is None and b.qos is None
    assert stats.skipped == {"malformed": 1}  # a zero time limit


def test_blank_lines_bom_and_nul_bytes():
    text = "\ufeff" + HEADER + "\n" + "a,0,1,10,,,,\n\n" + "b,1,1\x00,10,,,,\n"
    jobs, stats = read(text)
    assert [j.trace_id for j in jobs] == ["a", "b"]
    assert stats.rows == 2


def test_undecodable_bytes_in_a_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"a,0,1,10,\xff\xfe,,,\n" + b"b,\xff,1,10,,,,\n")
    stats = TraceStats()
    with open_trace(str(path)) as f:
        jobs = list(iter_trace(f, stats))
    assert [j.trace_id for j in jobs] == ["a"]
    assert stats.skipped == {"malformed": 1}


def test_oversized_field_is_a_counted_row_not_a_crash():
    big = "x" * (2 << 20)
    jobs, stats = read(HEADER + f'"{big}",0,1,10,,,,\n' + "ok,0,1,10,,,,\n")
    assert [j.trace_id for j in jobs] == ["ok"]
    assert stats.skipped == {"malformed": 1}


@pytest.mark.parametrize("text, words", [
    ("", "empty trace"),
    ("\n\n", "empty trace"),
    ("job_id,gpus,duration_s\n1,1,1\n", "missing column(s) submit_s"),
])
def test_unusable_files_raise_one_line(text, words):
    with pytest.raises(TraceError) as e:
        read(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_open_trace_errors(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        open_trace(str(tmp_path / "absent.csv"))
    with pytest.raises(TraceError, match="is a directory"):
        open_trace(str(tmp_path))


def test_reading_is_lazy():
    # An endless trace: only as many rows are read as are asked for.
    def rows():
        yield HEADER
        for i in itertools.count():
            yield f"j{i},{i},1,10,,,,\n"

    stats = TraceStats()
    first = list(itertools.islice(iter_trace(rows(), stats), 5))
    assert [j.seq for j in first] == [1, 2, 3, 4, 5]
    assert stats.rows == 5
