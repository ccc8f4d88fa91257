"""gpuctl's verbs through click's CliRunner, against the fake head on a real socket."""

from __future__ import annotations

import json
import os
import pwd

import pytest
from click.testing import CliRunner

from gpuctl.commands import sacct, squeue
from gpuctl.main import cli
from gpud.model import JobSpec
from tests.fake_head import FakeHead, node

T0 = 1_700_000_000.0
ME = pwd.getpwuid(os.getuid()).pw_name  # what the fake head calls us


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def run(head, *args, input=None, env=None):
    return CliRunner().invoke(cli, ["--socket", head.path, *args], input=input, env=env,
                              catch_exceptions=False)


def submitted(head):
    return head.last("submit")["spec"]


# -- sbatch -------------------------------------------------------------------------

def test_sbatch_maps_every_option_onto_the_spec(head, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(head, "sbatch", "--gpus", "2", "--gpu-type", "A100-40GB", "-c", "6", "--mem", "32G",
            "-t", "2:00:00", "-J", "big", "-o", "out-%j.txt", "-e", "/var/log/err", "-D", "sub",
            "-A", "phys", "-p", "long", "-q", "high", "--nice", "-10", "--signal", "USR1",
            "--no-requeue", "-H", "--comment", "first try", "--wrap", "python train.py",
            env={"PROJECT": "x"})
    assert (r.exit_code, r.stdout, r.stderr) == (0, "Submitted batch job 1\n", "")
    spec = submitted(head)
    assert {k: v for k, v in spec.items() if k != "env"} == {
        "script": "#!/bin/bash\npython train.py\n", "name": "big", "work_dir": f"{tmp_path}/sub",
        "gpus": 2, "gpu_type": "A100-40GB", "cpus": 6, "mem_mb": 32768, "time_limit": 7200.0,
        "stdout": f"{tmp_path}/sub/out-%j.txt", "stderr": "/var/log/err", "account": "phys",
        "partition": "long", "qos": "high", "nice": -10, "signal": "SIGUSR1", "signal_time": 60, "signal_batch": False, "requeue": False,
        "hold": True, "comment": "first try",
    }
    assert spec["env"]["PROJECT"] == "x"
    assert spec["env"] == {k: v for k, v in os.environ.items()} | {"PROJECT": "x"}
    JobSpec.from_request(spec)


def test_sbatch_script_file_directives_and_cli_overrides(head, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/bash\n#SBATCH --gpus=1 -c 4 --mem=8G\n#GPUD -t 30\npython x.py \"$@\"\n")
    r = run(head, "sbatch", "--gpus", "4", "train.sh", "--lr", "0.1")
    assert r.exit_code == 0, r.stderr
    spec = submitted(head)
    assert (spec["name"], spec["gpus"], spec["cpus"], spec["mem_mb"], spec["time_limit"]) == \
        ("train.sh", 4, 4, 8192, 1800.0)
    assert spec["work_dir"] == str(tmp_path)
    assert "set -- --lr 0.1\npython x.py" in spec["script"]


def test_sbatch_options_after_the_script_belong_to_it(head, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/sh\necho \"$@\"\n")
    assert run(head, "sbatch", str(path), "--gpus", "3").exit_code == 0
    spec = submitted(head)
    assert "gpus" not in spec
    assert "set -- --gpus 3" in spec["script"]


def test_sbatch_reads_the_script_from_stdin(head):
    r = run(head, "sbatch", "--parsable", input="#!/bin/bash\n#SBATCH -J piped\nhostname\n")
    assert (r.exit_code, r.stdout) == (0, "1\n")
    assert submitted(head)["name"] == "piped"
    r = run(head, "sbatch", input="#!/bin/bash\nhostname\n")
    assert submitted(head)["name"] == "sbatch"


def test_sbatch_parsable_from_a_directive(head):
    r = run(head, "sbatch", input="#!/bin/bash\n#SBATCH --parsable\nhostname\n")
    assert r.stdout == "1\n"


def test_sbatch_wrap_defaults(head):
    assert run(head, "sbatch", "--wrap", "sleep 1").stdout == "Submitted batch job 1\n"
    spec = submitted(head)
    assert (spec["name"], spec["script"]) == ("wrap", "#!/bin/bash\nsleep 1\n")
    assert set(spec) == {"script", "name", "work_dir", "env"}  # the head's defaults for the rest


def test_main_entry_point_exits_with_the_verb_status(head, capsys):
    from gpuctl.main import main

    with pytest.raises(SystemExit) as e:
        main(args=["--socket", head.path, "sbatch", "--parsable", "--wrap", "true"], prog_name="gpuctl")
    assert (e.value.code, capsys.readouterr().out) == (0, "1\n")
    with pytest.raises(SystemExit) as e:
        main(["--socket", head.path, "scancel", "99"])
    assert e.value.code == 1


@pytest.mark.parametrize("args, stdin, message", [
    (["--mem", "4X", "--wrap", "x"], None, "sbatch: error: --mem: invalid size '4X'"),
    (["--gpus", "many", "--wrap", "x"], None, "sbatch: error: --gpus needs a whole number, not 'many'"),
    (["-t", "soon", "--wrap", "x"], None, "sbatch: error: --time: invalid duration 'soon'"),
    (["--bogus", "--wrap", "x"], None, "sbatch: error: No such option"),
    (["/no/such/script.sh"], None,
     "sbatch: error: cannot read batch script '/no/such/script.sh': No such file or directory"),
    (["--wrap", "x", "script.sh"], None, "sbatch: error: script arguments are not permitted with --wrap"),
    ([], "", "sbatch: error: the script on stdin is empty"),
    ([], "echo no shebang\n", "sbatch: error: the script on stdin does not look like a batch script"),
    ([], "#!/bin/sh\n#SBATCH --gpus=lots\ntrue\n",
     "sbatch: error: line 2: #SBATCH --gpus needs a whole number, not 'lots'"),
])
def test_sbatch_user_mistakes_exit_2_with_one_line(head, args, stdin, message):
    r = run(head, "sbatch", *args, input=stdin)
    assert r.exit_code == 2
    first, hint = r.stderr.rstrip("\n").split("\n")
    assert first.startswith(message)
    assert hint == "Try 'gpuctl sbatch --help' for more information."
    assert r.stdout == ""
    assert "submit" not in head.ops()


def test_sbatch_refusal_by_the_head_exits_1_with_its_reason(head):
    head.refuse("submit", "invalid account specified: nope")
    r = run(head, "sbatch", "-A", "nope", "--wrap", "true")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", "sbatch: error: invalid account specified: nope\n")


def test_unreachable_head_exits_1(tmp_path):
    path = str(tmp_path / "none.sock")
    r = CliRunner().invoke(cli, ["--socket", path, "squeue"], catch_exceptions=False)
    assert r.exit_code == 1
    assert r.stderr == (f"squeue: error: cannot connect to gpud head at {path}: No such file or directory "
                        "(is gpud running? set GPUD_SOCKET or --socket)\n")


def test_socket_from_the_environment(head):
    r = CliRunner().invoke(cli, ["sinfo"], env={"GPUD_SOCKET": head.path}, catch_exceptions=False)
    assert r.exit_code == 0
    assert head.ops() == ["nodes"]


def test_malformed_answer_exits_1(head):
    head.raw("nodes", b"{]\n")
    r = run(head, "sinfo")
    assert (r.exit_code, r.stderr) == (1, "sinfo: error: malformed response from gpud head\n")


def test_unknown_verb_and_no_verb_are_usage_errors(head):
    r = run(head, "qsub")
    assert r.exit_code == 2
    assert r.stderr.startswith("gpuctl: error: No such command 'qsub'.\n")
    r = CliRunner().invoke(cli, [], catch_exceptions=False)
    assert r.exit_code == 2
    assert "sbatch" in r.stderr


# -- squeue -------------------------------------------------------------------------

def test_squeue_table(head, monkeypatch):
    monkeypatch.setattr(squeue, "clock", lambda: T0 + 75)
    head.add_job(job_id=5, name="train", user="alice", state="RUNNING", node="gpu01", gpus=2, start_time=T0)
    head.add_job(job_id=6, name="eval", user="bob", state="PENDING", reason="Resources", gpus=1)
    head.add_job(job_id=4, state="COMPLETED")
    r = run(head, "squeue")
    assert r.exit_code == 0
    assert r.stdout.split("\n") == [
        "JOBID PARTITION NAME  USER  ST TIME GPUS NODELIST(REASON)",
        "    5 gpu       train alice R  1:15    2 gpu01",
        "    6 gpu       eval  bob   PD 0:00    1 (Resources)",
        "",
    ]
    assert run(head, "squeue", "-h").stdout.startswith("5 gpu")


def test_squeue_json(head):
    head.add_job(job_id=5, state="RUNNING", node="gpu01", start_time=T0)
    r = run(head, "squeue", "--json")
    data = json.loads(r.stdout)
    assert [j["job_id"] for j in data["jobs"]] == [5]
    assert {"job_id", "state", "user", "name", "node", "gpus", "exit_code", "submit_time", "start_time",
            "end_time"} <= set(data["jobs"][0])


def filters(args):
    """The jobs op's filters, without how the answer is shaped (fields, fold, rows)."""
    assert args.pop("fields", None) in (None, list(squeue.TABLE_FIELDS))
    assert args.pop("rows", False) is ("fold" in args)
    args.pop("fold", None)
    return args


def test_squeue_filters_reach_the_head(head):
    assert run(head, "squeue", "-u", "alice,bob", "-u", "carol", "-j", "3,4", "-t", "pd,RUNNING").exit_code == 0
    assert filters(head.last("jobs")) == {"job_ids": [3, 4], "users": ["alice", "bob", "carol"],
                                          "states": ["PENDING", "RUNNING"]}
    run(head, "squeue", "-t", "CD")
    assert "fold" not in head.last("jobs")          # finished jobs: nothing to fold
    assert filters(head.last("jobs")) == {"states": ["COMPLETED"], "all": True}
    run(head, "squeue", "-t", "all")
    assert filters(head.last("jobs")) == {"all": True}
    run(head, "squeue", "-p", "b,a", "-A", "phys")
    assert filters(head.last("jobs")) == {"partitions": ["a", "b"], "accounts": ["phys"]}


def test_squeue_me_asks_the_head_who_i_am(head):
    run(head, "squeue", "--me")
    assert head.ops() == ["ping", "jobs"]
    assert filters(head.last("jobs")) == {"users": [ME]}
    assert head.connections == 1


@pytest.mark.parametrize("args, message", [
    (["-j", "x"], "squeue: error: invalid job id 'x' for --jobs"),
    (["-t", "RUNNIN"], "squeue: error: invalid job state 'RUNNIN'"),
])
def test_squeue_bad_filters_exit_2(head, args, message):
    r = run(head, "squeue", *args)
    assert r.exit_code == 2
    assert r.stderr.startswith(message)
    assert head.ops() == []


# -- scancel ------------------------------------------------------------------------

def test_scancel_is_silent_on_success(head):
    head.add_job(job_id=8, uid=os.getuid())
    r = run(head, "scancel", "8")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    assert head.jobs[8]["state"] == "CANCELLED"


def test_scancel_prints_each_refusal_and_exits_1(head):
    head.add_job(job_id=8, uid=os.getuid())
    head.add_job(job_id=9, state="COMPLETED", uid=os.getuid())
    r = run(head, "scancel", "8", "9", "10")
    assert r.exit_code == 1
    assert r.stderr.split("\n") == [
        "scancel: error: Kill job error on job id 9: Job/step already completing or completed",
        "scancel: error: Kill job error on job id 10: Invalid job id specified",
        "",
    ]
    assert head.last("cancel") == {"job_ids": [8, 9, 10]}


def test_scancel_by_user_with_a_signal(head):
    assert run(head, "scancel", "-u", "alice", "-s", "usr2").exit_code == 0
    assert head.last("cancel") == {"users": ["alice"], "signal": "SIGUSR2"}
    assert run(head, "scancel", "--signal=9", "4").exit_code == 1  # no such job 4
    assert head.last("cancel") == {"job_ids": [4], "signal": "SIGKILL"}


@pytest.mark.parametrize("args, message", [
    ([], "scancel: error: no job id given"),
    (["12a"], "scancel: error: invalid job id '12a'"),
    (["-s", "HUPP", "3"], "scancel: error: --signal: unknown signal 'HUPP'"),
])
def test_scancel_mistakes_exit_2(head, args, message):
    r = run(head, "scancel", *args)
    assert r.exit_code == 2
    assert r.stderr.startswith(message)
    assert head.ops() == []


# -- sinfo --------------------------------------------------------------------------

def test_sinfo_summary_per_node_and_json(head):
    head.nodes = [node("gpu01", gpus=4), node("gpu02", gpus=4, gpus_alloc=4, state="ALLOCATED")]
    r = run(head, "sinfo")
    assert r.stdout.split("\n") == [
        "STATE NODES GPUS(A/T) GPU_MODEL NODELIST",
        "alloc     1       4/4 H100-80GB gpu02",
        "idle      1       0/4 H100-80GB gpu01",
        "",
    ]
    r = run(head, "sinfo", "-N", "-h")
    assert r.stdout.split("\n")[:2] == ["gpu01 idle  0/4 0/64 512G H100-80GB",
                                         "gpu02 alloc 4/4 0/64 512G H100-80GB"]
    data = json.loads(run(head, "sinfo", "--json").stdout)
    assert [n["name"] for n in data["nodes"]] == ["gpu01", "gpu02"]
    assert len(data["nodes"][0]["gpus"]) == 4


# -- sacct --------------------------------------------------------------------------

def test_sacct_defaults_to_my_jobs_since_midnight(head, monkeypatch):
    monkeypatch.setattr(sacct, "clock", lambda: T0 + 500)
    me = ME
    head.add_job(job_id=1, user=me, state="FAILED", exit_code=3, node="gpu01", gpu_indices=[0],
                 start_time=T0, end_time=T0 + 61, name="bad")
    head.add_job(job_id=2, user="someone-else", state="COMPLETED")
    r = run(head, "sacct")
    assert r.exit_code == 0
    assert head.last("jobs") == {"users": [me], "all": True, "since": sacct.midnight(T0 + 500)}
    assert r.stdout.split("\n") == [
        f"JobID JobName {'User'.ljust(len(me))} Account State  ExitCode  Elapsed NodeList AllocGPUS GPUUtil",
        f"    1 bad     {me.ljust(4)} default FAILED      3:0 00:01:01 gpu01            1",
        "",
    ]


def test_sacct_all_users_jobs_and_start_time(head):
    run(head, "sacct", "-a", "-S", "2024-03-01T12:00")
    from datetime import datetime
    assert head.last("jobs") == {"all": True, "since": datetime(2024, 3, 1, 12, 0).timestamp()}
    run(head, "sacct", "-j", "4,5", "-u", "bob")
    assert head.last("jobs") == {"job_ids": [4, 5], "users": ["bob"], "all": True}
    assert "ping" not in head.ops()


def test_sacct_json(head):
    head.add_job(job_id=3, user="bob", state="COMPLETED", exit_code=0)
    data = json.loads(run(head, "sacct", "-a", "--json").stdout)
    assert [(j["job_id"], j["state"], j["exit_code"]) for j in data["jobs"]] == [(3, "COMPLETED", 0)]


@pytest.mark.parametrize("text, expected", [
    ("now", T0), ("now-90", T0 - 90), ("now-2hours", T0 - 7200), ("now-1days", T0 - 86400),
    ("today", None), ("noon", 12 * 3600), ("08:30", 8 * 3600 + 1800),
])
def test_sacct_start_times(text, expected):
    midnight = sacct.midnight(T0)
    value = sacct.parse_start_time(text, T0)
    if text.startswith("now"):
        assert value == expected
    else:
        assert value == midnight + (expected or 0)


@pytest.mark.parametrize("text", ["yesterday-ish", "now-3fortnights", "25:00", "2024-13-01"])
def test_sacct_bad_start_times(text):
    with pytest.raises(ValueError, match="invalid start time"):
        sacct.parse_start_time(text, T0)


def test_sinfo_summarize_shows_nodes_by_state_and_fragmentation(head):
    head.nodes = [node("gpu01", gpus=8), node("gpu02", gpus=8, gpus_alloc=1, state="MIXED"),
                  node("gpu03", gpus=8, state="DRAIN"), node("gpu04", gpus=8, gpus_alloc=8, state="ALLOCATED")]
    head.reply("show", {"partitions": [
        {"name": "gpu", "default": True, "state": "UP", "node_names": ["gpu01", "gpu02", "gpu03", "gpu04"],
         "max_time": None, "gpus_free": 15, "gpus_servable": 1, "servable_size": 8, "fragmentation": 0.4667},
        {"name": "short", "default": False, "state": "UP", "node_names": ["gpu02"], "max_time": 3600.0,
         "gpus_free": 7, "gpus_servable": 0, "servable_size": 8, "fragmentation": 1.0}]})
    r = run(head, "sinfo", "-s")
    assert r.exit_code == 0
    assert r.stdout.splitlines() == [
        "PARTITION AVAIL TIMELIMIT NODES(A/I/O/T) GPUS(A/T) GPUS_FREE SERVABLE(8) FRAG NODELIST",
        "gpu*         up  infinite        2/1/1/4      9/32        15           1 0.47 gpu[01-04]",
        "short        up  01:00:00        1/0/0/1       1/8         7           0 1.00 gpu02",
    ]
    assert head.last("show") == {"kind": "partition"}
    r = run(head, "sinfo", "--summarize", "-h", "-p", "short")
    assert r.stdout.splitlines() == ["short up 01:00:00 1/0/0/1 1/8 7 0 1.00 gpu02"]
    data = json.loads(run(head, "sinfo", "-s", "--json").stdout)
    assert [p["gpus_servable"] for p in data["partitions"]] == [1, 0]


def test_sinfo_summarize_against_an_older_head_and_with_clashing_options(head):
    head.nodes = [node("gpu01", gpus=8)]
    head.reply("show", {"partitions": [{"name": "gpu", "default": True, "node_names": ["gpu01"]}]})
    assert run(head, "sinfo", "-s", "-h").stdout.split() == ["gpu*", "up", "infinite", "0/1/0/1", "0/8",
                                                             "-", "-", "-", "gpu01"]
    for other in (["-N"], ["-G"], ["--topology"], ["-o", "%P"]):
        r = run(head, "sinfo", "-s", *other)
        assert r.exit_code == 2
        assert f"cannot be combined with {other[0]}" in r.stderr
