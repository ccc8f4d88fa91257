"""squeue at scale: the head folds pending arrays and trims records (the ``jobs`` op's
``fold`` and ``fields``), and gpuctl's squeue fast path prints what the click path prints."""

from __future__ import annotations

import io
import os
import pwd
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl import columns as cols
from gpuctl import format as fmt
from gpuctl.commands import squeue
from gpuctl.main import cli
from gpud.ctlsocket import Caller
from gpud.head.ops_jobs import fold_arrays, fold_rows, op_jobs
from gpud.protocol import ProtocolError
from gpud.head.store import JobRecord
from gpud.model import JobSpec, JobState
from tests.fake_head import FakeHead
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.telemetry_rig import rig

T0 = 1_700_000_000.0
ROOT = str(Path(__file__).resolve().parent.parent)
ME = pwd.getpwuid(os.getuid()).pw_name
SPEC = JobSpec(script="#!/bin/sh\ntrue\n", name="job", gpus=1)


def record(job_id: int, state: str = "PENDING", priority: float = 0.0, array: int | None = None,
           task: int | None = None, throttle: int | None = None, **kw) -> JobRecord:
    running = state != "PENDING"
    return JobRecord(job_id=job_id, name="job", user="alice", uid=1000, gid=1000, account="default",
                     partition="gpu", qos="normal", state=JobState[state], spec=SPEC, gpus=1, cpus=1,
                     mem_mb=1024, time_limit=None, submit_time=T0, priority=priority,
                     node="gpu01" if running else None, start_time=T0 if running else None,
                     array_job_id=array, array_task_id=task, array_throttle=throttle, **kw)


def client_side(jobs: list[JobRecord]) -> list[dict]:
    """What gpuctl does with full, unfolded records."""
    return cols.collapse_arrays(fmt.squeue_order([j.to_public() for j in jobs]))


# -- the head folds as gpuctl would ------------------------------------------------------------

def test_fold_matches_gpuctl_on_a_typical_queue() -> None:
    jobs = [record(1, "RUNNING"), record(2, priority=5.0)]
    jobs += [record(10 + t, priority=3.0, array=10, task=t, throttle=4) for t in range(6)]
    jobs += [record(20, "RUNNING", array=10, task=99)]     # a running task stays on its own
    jobs += [record(30, priority=9.0, array=30, task=7)]   # a lone pending task: not folded
    folded = fold_arrays(jobs)
    assert folded == client_side(jobs)
    assert [r.get("display_id") for r in folded] == ["1", "10_99", "30_7", "2", "10_[0-5%4]"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["PENDING", "RUNNING", "COMPLETING"]),
                          st.integers(0, 3), st.sampled_from([None, 100, 200, 300])),
                max_size=40))
def test_fold_matches_gpuctl_for_any_queue(shape) -> None:
    jobs, tasks = [], {}
    for i, (state, prio, array) in enumerate(shape, start=1):
        task = None
        if array is not None:
            task = tasks[array] = tasks.get(array, -1) + 1 + (i % 3)
        jobs.append(record(i, state, float(prio), array, task, throttle=2 if array == 300 else None))
    assert fold_arrays(jobs) == client_side(jobs)
    fields = list(squeue.TABLE_FIELDS)
    assert squeue._records({"fields": fields, "rows": [list(r) for r in fold_rows(jobs, fields)]}) \
        == fold_arrays(jobs, fields)


def test_rows_are_the_folded_records_values_in_field_order() -> None:
    jobs = [record(1, "RUNNING", priority=2.5), record(2, priority=1.0, reason="Resources")]
    jobs += [record(10 + t, array=10, task=t, throttle=3) for t in range(4)]
    for fields in (list(squeue.TABLE_FIELDS), ["state"], ["display_id"], ["gpus", "display_id", "job_id"]):
        rows = fold_rows(jobs, fields)
        assert [list(r) for r in rows] == [[rec[f] for f in fields] for rec in fold_arrays(jobs, fields)]
    assert [r[0] for r in fold_rows(jobs, ["display_id"])] == ["1", "2", "10_[0-3%3]"]
    assert fold_rows(jobs, ["state"])[0] == ("RUNNING",) and type(fold_rows(jobs, ["state"])[0][0]) is str


@pytest.mark.parametrize("bad", [
    {"fields": "job_id", "rows": []}, {"fields": ["job_id"], "rows": {}}, {"fields": [1], "rows": []},
    {"fields": ["job_id"], "rows": [[1, 2]]}, {"fields": ["job_id"], "rows": [7]}, {"rows": [[1]]},
])
def test_a_malformed_listing_is_a_protocol_error(bad) -> None:
    with pytest.raises(ProtocolError, match="malformed job listing"):
        squeue._records(bad)
    assert squeue._records({"jobs": [{"job_id": 1}], "folded": True}) == [{"job_id": 1}]   # an older head


async def test_jobs_op_folds_filters_and_trims_records(tmp_path) -> None:
    async with rig(tmp_path) as r:
        await r.store.insert_jobs([record(0, array=None)], r.clock())
        tasks = [record(0, array=None) for _ in range(5)]
        saved = await r.store.insert_jobs(tasks, r.clock())
        first = saved[0].job_id
        for j in saved:
            r.store.active[j.job_id] = j.__class__(**{**j.__dict__, "array_job_id": first,
                                                      "array_task_id": j.job_id - first})
        caller = Caller(uid=0, gid=0, pid=1, user="root")
        full = await op_jobs(r.head, caller, {})
        assert "folded" not in full and len(full["jobs"]) == 6
        out = await op_jobs(r.head, caller, {"fold": True, "fields": ["job_id", "display_id", "state", "bogus"]})
        assert out["folded"] is True
        assert out["jobs"] == [{"job_id": 1, "display_id": "1", "state": "PENDING"},
                               {"job_id": first, "display_id": f"{first}_[0-4]", "state": "PENDING"}]
        rows = await op_jobs(r.head, caller, {"fold": True, "rows": True, "fields": ["job_id", "display_id"]})
        assert rows == {"fields": ["job_id", "display_id"], "folded": True,
                        "rows": [(1, "1"), [first, f"{first}_[0-4]"]]}
        # rows only for the table's own fields and a fold; otherwise records, as before
        for args in ({"rows": True, "fields": ["job_id"]}, {"fold": True, "rows": True},
                     {"fold": True, "rows": True, "fields": ["job_id", "bogus"]}):
            assert "rows" not in await op_jobs(r.head, caller, args)
        assert (await op_jobs(r.head, caller, {"partitions": ["other"]}))["jobs"] == []
        assert len((await op_jobs(r.head, caller, {"accounts": ["default"]}))["jobs"]) == 6
        with pytest.raises(Exception, match="fields must be a list of strings"):
            await op_jobs(r.head, caller, {"fields": "job_id"})


# -- the fast path says what the click path says ------------------------------------------------

@pytest.fixture
def head():
    with FakeHead() as h:
        h.add_job(job_id=5, name="train", user="alice", state="RUNNING", node="gpu01", gpus=2, start_time=T0)
        h.add_job(job_id=6, name="eval", user="bob", state="PENDING", reason="Resources", gpus=1, priority=3)
        h.add_job(job_id=7, user="bob", account="phys", partition="long", state="PENDING", priority=1)
        for t in range(4):
            h.add_job(job_id=10 + t, array_job_id=10, array_task_id=t, array_throttle=2, priority=2,
                      display_id=f"10_{t}")
        h.add_job(job_id=4, state="COMPLETED")
        yield h


def via_click(head, args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["--socket", head.path, "squeue", *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def via_fast(head, args: list[str]) -> tuple[int, str, str] | None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = squeue.fast_main(["--socket", head.path, "squeue", *args])
    return None if code is None else (code, out.getvalue(), err.getvalue())


FAST = [[], ["-h"], ["--noheader"], ["-r"], ["-hr"], ["-u", "bob"], ["-ubob,alice"], ["--user=bob"],
        ["-u", "bob", "-u", "alice"], ["--me"], ["-t", "pd"], ["-t", "R,PD"], ["--states", "PENDING"],
        ["-p", "long"], ["--partition=gpu,long"], ["-A", "phys"], ["--account", "default"],
        ["-j", "10"], ["-j", "5,6"], ["--jobs=7"], ["-t", "all"], ["-t", "CD"], ["-r", "-t", "pd", "-h"], ["--array", "--noheader"]]


@pytest.mark.parametrize("args", FAST, ids=" ".join)
def test_fast_path_prints_what_click_prints(head, args, monkeypatch) -> None:
    monkeypatch.setattr(squeue, "clock", lambda: T0 + 75)
    fast = via_fast(head, args)
    assert fast is not None, "the fast path should take these options"
    assert fast == via_click(head, args)


@pytest.mark.parametrize("args", [["-o", "%i"], ["-O", "jobid"], ["-l"], ["--start"], ["-S", "i"],
                                  ["--json"], ["--help"], ["-j", "10_2"], ["-j", "10_[1-2]"], ["-j", "05"], ["-t", "RUNNIN"], ["-j", "x"], ["-x"],
                                  ["-u"], ["extra"], ["--user"], ["-M", "a"]],
                         ids=" ".join)
def test_fast_path_leaves_everything_else_to_click(head, args) -> None:
    assert via_fast(head, args) is None
    assert head.ops() == []


def test_fast_path_global_options_and_other_verbs(head, tmp_path) -> None:
    assert squeue.fast_main(["sinfo"]) is None
    assert squeue.fast_main(["--socket"]) is None
    assert squeue.fast_main(["-M", "x", "squeue"]) is None
    missing = str(tmp_path / "nope.sock")
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = squeue.fast_main(["--socket", missing, "squeue"])
    assert (code, err.getvalue()) == (1, via_click_socket(missing)[2])


def via_click_socket(path: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["--socket", path, "squeue"], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_fast_path_asks_the_head_to_fold_and_trim(head) -> None:
    via_fast(head, [])
    args = head.last("jobs")
    assert args["fold"] is True and "display_id" in args["fields"]
    via_fast(head, ["-r"])
    assert "fold" not in head.last("jobs")


def test_the_console_script_takes_the_fast_path_without_click(head) -> None:
    head.reply("jobs", {"jobs": [], "folded": True})      # a head that folds
    code = (f"import sys; from gpuctl.fastpath import main\n"
            f"try: main(['--socket', {head.path!r}, 'squeue'])\n"
            f"except SystemExit as e: print(e.code, ' '.join(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    rc, _, loaded = r.stderr.strip().splitlines()[-1].partition(" ")
    assert rc == "0", r.stderr
    for heavy in ("click", "gpuctl.columns", "gpud.syntax", "asyncio", "gpuctl.main"):
        assert heavy not in loaded.split(), heavy
    assert "JOBID" in r.stdout


def test_trimmed_records_read_fields_as_to_public_does() -> None:
    from gpud.head.ops_jobs import _FIELD, public

    jobs = [record(1, "RUNNING", priority=2.5), record(2, array=2, task=0, throttle=3, reason="Priority")]
    for j in jobs:
        full = j.to_public()
        assert {f: g(j) for f, g in _FIELD.items()} == {f: full[f] for f in _FIELD}
        assert public(j, ["job_id", "nodes", "bogus"]) == {"job_id": j.job_id, "nodes": full["nodes"]}
        assert public(j, None) == full


def test_the_table_fields_are_all_the_table_reads() -> None:
    gang = record(3, "RUNNING", parts=({"node": "gpu02", "gpu_indices": [0]}, {"node": "gpu03", "gpu_indices": [0]}))
    jobs = [record(1, "RUNNING"), record(2, priority=1.0, reason="Resources"), gang]
    jobs += [record(10 + t, array=10, task=t, throttle=2) for t in range(3)]
    full = client_side(jobs)
    trimmed = [{k: r[k] for k in squeue.TABLE_FIELDS if k in r} for r in full]
    table = fmt.squeue_table(full, T0 + 60)
    assert fmt.squeue_table(trimmed, T0 + 60) == table
    assert fold_arrays(jobs, list(squeue.TABLE_FIELDS)) == trimmed
    assert "gpu[01-03]" in table.splitlines()[2]     # a multi-node job shows all its nodes


def test_the_fast_path_frames_a_closed_pipe_and_an_interrupt_as_click_does(head, monkeypatch) -> None:
    def interrupted(client, q):
        raise KeyboardInterrupt
    monkeypatch.setattr(squeue, "listing", interrupted)
    err = io.StringIO()
    with redirect_stderr(err):
        assert squeue.fast_main(["--socket", head.path, "squeue"]) == 130
    assert err.getvalue() == "\ngpuctl: interrupted\n"


@pytest.mark.slow
def test_a_real_head_folds_as_gpuctl_did(tmp_path, mosquitto) -> None:  # noqa: F811
    """The console script against a real head prints what gpuctl printed from full records."""
    from tests.cluster import Cluster, wait_for

    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        with c.client() as client:
            client.submit_spec({"script": "#!/bin/bash\ntrue\n", "name": "arr", "work_dir": "/tmp",
                                "env": {}, "gpus": 1, "array": "0-49%5"})
            client.submit_spec({"script": "#!/bin/bash\ntrue\n", "name": "one", "work_dir": "/tmp",
                                "env": {}, "gpus": 2})
            # after a scheduler pass has given every job its reason (stable: there are no nodes)
            wait_for(lambda: all(j["reason"] for j in client.jobs()), timeout=30)
            full = client.jobs()
        # pending only (no workers): TIME is 0:00 whenever it is printed
        expected = fmt.squeue_table(cols.collapse_arrays(fmt.squeue_order(full)), T0)
        for verb in (["-m", "gpuctl"], ["-m", "gpuctl.main"]):   # fast path, click path
            r = subprocess.run([sys.executable, *verb, "--socket", c.socket, "squeue"], capture_output=True,
                               text=True, env=c.env, timeout=60)
            assert (r.returncode, r.stderr) == (0, "")
            assert r.stdout == expected + "\n"
        assert "_[0-49%5]" in expected
