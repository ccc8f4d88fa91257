"""``gpud simulate --background``: a serving load beside the jobs, in a QOS that preempts
them under ``full`` only; its options, the QOS it adds, and the per-QOS report."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from gpud.sched.config import SchedConfig, sched_config_from_dict
from gpud.sim.background import merge_streams, with_stream_qos
from gpud.sim.command import simulate
from gpud.sim.policies import POLICIES, policy_config
from gpud.sim.trace import iter_trace

HEADER = "job_id,submit_s,gpus,duration_s,user,group,gpu_type,status,time_limit_s\n"


def write(path, *rows: str) -> str:
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return str(path)


def run(*args: str):
    return CliRunner().invoke(simulate, list(args), prog_name="gpud simulate")


def rows(*lines: str) -> list:
    return list(iter_trace(io.StringIO(HEADER + "".join(r + "\n" for r in lines))))


@pytest.fixture
def files(tmp_path):
    # one GPU node of 2: a serving instance from the start, batch fills the other GPU,
    # a second instance arrives after the batch job's exempt time (600 s)
    serving = write(tmp_path / "serving.csv", "s1,0,1,5000,,svc,,,5000", "s2,700,1,5000,,svc,,,5000")
    batch = write(tmp_path / "batch.csv", "b1,1,1,3000,u,lab,,,3000", "b2,2,1,100,u,lab,,,100")
    return batch, serving


# -- options ---------------------------------------------------------------------------

@pytest.mark.parametrize("extra, words", [
    (["--background-qos", "serving"], "--background-qos names the QOS of --background's jobs"),
    (["--background", "/nonexistent/s.csv"], "/nonexistent/s.csv: no such trace file"),
    (["--background", "BG", "--qos", "serving"], "--qos and --background-qos are both 'serving'"),
    (["--background", "BG", "--background-qos", "a b"], "invalid --background-qos 'a b'"),
    (["--qos", "x/y"], "invalid --qos 'x/y'"),
])
def test_bad_background_options_are_one_line(files, extra, words):
    batch, serving = files
    extra = [serving if a == "BG" else a for a in extra]
    r = run("--cluster", "1x2xH100-80GB", "--trace", batch, *extra)
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and words in r.output, r.output
    assert r.output.startswith("gpud simulate: error: ")


def test_the_added_serving_qos_preempts_every_other_and_comes_first():
    config = with_stream_qos(sched_config_from_dict({"qos": {"normal": {}, "high": {"priority": 5}}}),
                             "serving", "batch")
    q = config.qos["serving"]
    assert q.priority > 5 and q.preempt == ("batch", "high", "normal")
    assert q.preempt_mode == "requeue"
    assert config.qos["batch"].priority == 0 and not config.qos["batch"].preempt
    # its jobs come first in the queue: the QOS weight outweighs every other factor together
    w = config.weights
    assert w.qos > w.age + w.fairshare + w.job_size + w.partition
    # the baselines keep no preemption, as for any QOS
    for name in ("fifo", "priority"):
        assert not any(x.preempt for x in policy_config(config, name).qos.values())
    assert policy_config(config, "full").qos["serving"].preempt


def test_a_configured_background_qos_is_used_as_it_is():
    base = sched_config_from_dict({"qos": {"normal": {}, "serving": {"priority": 3}}})
    assert with_stream_qos(base, "serving", None) is base
    assert with_stream_qos(base, "serving", "batch").weights == base.weights
    assert with_stream_qos(SchedConfig(), None, None) == SchedConfig()


def test_streams_merge_by_submit_time_background_first_and_renumbered():
    main = rows("b1,0,1,10,u,a,,,10", "b2,5,1,10,u,a,,,10")
    bg = rows("s1,0,1,10,,s,,,10", "s2,3,1,10,,s,,,10")
    merged = list(merge_streams(iter(main), iter(bg), "serving"))
    assert [(r.trace_id, r.seq, r.qos, r.background) for r in merged] == [
        ("s1", 1, "serving", True), ("b1", 2, None, False),
        ("s2", 3, "serving", True), ("b2", 4, None, False)]


# -- behaviour ---------------------------------------------------------------------------

def test_serving_preempts_batch_under_full_only(files):
    batch, serving = files
    r = run("--cluster", "1x2xH100-80GB", "--trace", batch, "--background", serving,
            "--limits", "exact", "--compare", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)["policies"]
    for name in ("fifo", "priority"):
        assert rep[name]["preemptions"] == 0
        assert rep[name]["qos"]["serving"]["wait_s"]["max"] > 0   # s2 waits for a GPU to end
    full = rep["full"]
    # b1 (the older batch job, past its exempt time) is requeued; s2 starts after its grace
    assert full["preemptions"] == 1
    assert full["qos"]["normal"]["preempted"] == 1
    assert full["qos"]["serving"]["preempted"] == 0
    assert full["qos"]["serving"]["wait_s"]["max"] == 60.0
    assert full["qos"]["serving"]["wait_s"]["max"] < rep["priority"]["qos"]["serving"]["wait_s"]["max"]
    assert full["background"] == {"qos": "serving", "rows": 2, "accepted": 2, "skipped": {}}
    for name in POLICIES:
        q = rep[name]["qos"]
        assert q["serving"]["jobs_started"] == 2 and q["normal"]["jobs_started"] == 2
        assert sum(x["jobs_submitted"] for x in q.values()) == rep[name]["jobs"]["submitted"]


def test_per_qos_rows_in_the_text_reports(files):
    batch, serving = files
    r = run("--cluster", "1x2xH100-80GB", "--trace", batch, "--background", serving,
            "--background-qos", "inference", "--qos", "batch", "--compare")
    assert r.exit_code == 0, r.output
    assert "background 2 jobs of 2 rows in QOS inference" in r.output
    assert "QOS batch" in r.output and "QOS inference" in r.output
    assert "GPU allocation while these waited" in r.output
    r = run("--cluster", "1x2xH100-80GB", "--trace", batch, "--background", serving)
    assert r.exit_code == 0, r.output
    assert "serving" in r.output and "PREEMPTED" in r.output


def test_drain_ends_with_the_main_stream_and_cuts_the_background(files, tmp_path):
    batch, _ = files
    serving = write(tmp_path / "long.csv", "s1,0,1,900000,,svc,,,900000")
    r = run("--cluster", "1x2xH100-80GB", "--trace", batch, "--background", serving,
            "--until", "100", "--drain", "--limits", "exact", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["jobs"]["running"] == 1 and rep["jobs"]["pending"] == 0
    assert rep["end_time"] == 3101.0          # b2's end (after b1's), not the instance's
    assert rep["qos"]["normal"]["jobs_started"] == 2
