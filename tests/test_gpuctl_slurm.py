"""gpuctl's Slurm habits through click's CliRunner against the fake head: sbatch's Slurm
options, warnings and exit codes, array ids, squeue/sacct/sinfo formats, scontrol, scrontab."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuctl import converters
from gpuctl.commands import sacct, squeue
from gpuctl.commands.sbatch import job_exit_code
from gpuctl.main import cli
from tests.fake_head import FakeHead, job, node

T0 = 1_700_000_000.0


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def run(head, *args, input=None, env=None):
    return CliRunner().invoke(cli, ["--socket", head.path, *args], input=input, env=env, catch_exceptions=False)


def submitted(head):
    return head.last("submit")["spec"]


# -- sbatch -----------------------------------------------------------------------------------------

def test_slurm_resource_options_become_the_spec(head):
    r = run(head, "sbatch", "--gres=gpu:h100:2", "-N", "1", "-n", "1", "--ntasks-per-node=1",
            "--cpus-per-gpu", "6", "--mem-per-gpu", "20G", "--wrap", "true")
    assert r.exit_code == 0, r.stderr
    spec = submitted(head)
    assert (spec["gpus"], spec["gpu_type"], spec["cpus"], spec["mem_mb"]) == (2, "h100", 12, 40960)
    run(head, "sbatch", "-G", "a100:3", "--mem-per-cpu", "2G", "-c", "4", "--wrap", "true")
    spec = submitted(head)
    assert (spec["gpus"], spec["gpu_type"], spec["cpus"], spec["mem_mb"]) == (3, "a100", 4, 8192)


def test_command_line_overrides_per_gpu_amounts_of_the_script(head, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n#SBATCH --gpus=2 --mem-per-gpu=10G --cpus-per-gpu=4\ntrue\n")
    assert run(head, "sbatch", "--mem", "5G", "-c", "3", str(path)).exit_code == 0
    spec = submitted(head)
    assert (spec["gpus"], spec["cpus"], spec["mem_mb"]) == (2, 3, 5120)
    assert run(head, "sbatch", "--gpus", "4", str(path)).exit_code == 0
    spec = submitted(head)
    assert (spec["gpus"], spec["cpus"], spec["mem_mb"]) == (4, 16, 40960)


def test_arrays_dependencies_times_and_the_rest(head, monkeypatch):
    monkeypatch.setattr(converters, "clock", lambda: T0)
    r = run(head, "sbatch", "-a", "0-9%2", "-d", "afterok:5:6_1", "--kill-on-invalid-dep=yes",
            "-b", "now+1hour", "--deadline", "now+1day", "--open-mode=append", "--mail-type=END,fail",
            "--mail-user", "a@b.c", "--signal=B:USR1@60", "--wrap", "true")
    assert r.exit_code == 0, r.stderr
    spec = submitted(head)
    assert {k: spec[k] for k in ("array", "dependency", "kill_on_invalid_dep", "begin_time", "deadline",
                                 "open_mode", "mail_type", "mail_user", "signal")} == {
        "array": "0-9%2", "dependency": "afterok:5:6_1", "kill_on_invalid_dep": True,
        "begin_time": T0 + 3600, "deadline": T0 + 86400, "open_mode": "append", "mail_type": "END,FAIL",
        "mail_user": "a@b.c", "signal": "SIGUSR1"}


def test_export(head, monkeypatch):
    env = {"KEEP": "1", "DROP": "2"}
    run(head, "sbatch", "--export=NONE", "--wrap", "true", env=env)
    assert submitted(head)["env"] == {}
    run(head, "sbatch", "--export=KEEP,NEW=x", "--wrap", "true", env=env)
    assert submitted(head)["env"] == {"KEEP": "1", "NEW": "x"}
    run(head, "sbatch", "--export=ALL,NEW=x", "--wrap", "true", env=env)
    assert {k: submitted(head)["env"][k] for k in ("KEEP", "DROP", "NEW")} == {"KEEP": "1", "DROP": "2", "NEW": "x"}


def test_unsupported_slurm_options_warn_or_fail_under_strict(head, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n#SBATCH --hint=nomultithread --gpu-bind=closest\nhostname\n")
    r = run(head, "sbatch", "--tmp", "10G", "--reservation", "maint", "--gpus", "1", str(path), "--lr", "3")
    assert r.exit_code == 0
    assert r.stderr.splitlines() == [
        "sbatch: warning: --tmp is not supported by gpud and was ignored",
        "sbatch: warning: --reservation is not supported by gpud and was ignored",
        "sbatch: warning: line 2: --hint is not supported by gpud and was ignored",
        "sbatch: warning: line 2: --gpu-bind is not supported by gpud and was ignored "
        "(CUDA_VISIBLE_DEVICES lists exactly the job's GPUs)",
    ]
    spec = submitted(head)
    assert spec["gpus"] == 1 and "set -- --lr 3" in spec["script"]
    ops = len(head.ops())
    r = run(head, "sbatch", "--strict", str(path))
    assert r.exit_code == 2
    assert r.stderr.startswith("sbatch: error: line 2: --hint is not supported by gpud and was ignored")
    assert "(refused: --strict)" in r.stderr and len(head.ops()) == ops
    r = run(head, "sbatch", "-Q", str(path))
    assert (r.exit_code, r.stderr) == (0, "")


@pytest.mark.parametrize("args, message", [
    (["-N", "2-4"], "--nodes=2-4: gpud does not take a range of node counts; give one number"),
    (["--nodes=1-4"], "give one number, e.g. -N 4"),
    (["-N", "2", "--ntasks=3"], "--ntasks=3 does not divide evenly among 2 nodes"),
    (["--gres=nvme:1"], "--gres=nvme:1: gpud schedules GPUs only"),
    (["--mem-per-gpu=4G"], "--mem-per-gpu needs GPUs: add --gpus N or --gres=gpu:N"),
    (["--array=5-1"], "invalid --array '5-1'"),
    (["-d", "afterwards:4"], "unknown type 'afterwards'"),
    (["--begin", "whenever"], "--begin: invalid time 'whenever'"),
    (["--open-mode", "sideways"], "--open-mode takes append or truncate"),
    (["--kill-on-invalid-dep=maybe"], "--kill-on-invalid-dep takes yes or no"),
    (["--mail-type", "WEEKLY"], "--mail-type: unknown type 'WEEKLY'"),
    (["--mail-type=BEGIN", "--mail-user=--exec=!id >/tmp/x"], "--mail-user: invalid mail address '--exec=!id >/tmp/x'"),
    (["--mail-user=|/bin/sh"], "--mail-user: invalid mail address '|/bin/sh'"),
    (["--export", "1BAD"], "--export: '1BAD' is not ALL, NONE, NAME or NAME=VALUE"),
    (["--mem-per-gpu=0", "-G", "1"], "--mem-per-gpu must be positive"),
])
def test_slurm_mistakes_exit_2(head, args, message):
    r = run(head, "sbatch", *args, "--wrap", "true")
    assert r.exit_code == 2
    assert message in r.stderr.splitlines()[0]
    assert "submit" not in head.ops()


def test_test_only_prints_the_estimate_and_submits_nothing(head):
    head.reply("submit", {"test_only": True, "start_time": T0, "node": "gpu07", "partition": "gpu", "cpus": 8,
                          "gpus": 2, "reason": None, "warnings": []})
    r = run(head, "sbatch", "--test-only", "--gpus", "2", "--wrap", "true")
    assert r.exit_code == 0 and r.stdout == ""
    assert r.stderr.startswith("sbatch: Job to start at ")
    assert r.stderr.rstrip().endswith("using 8 processors and 2 GPUs on nodes gpu07 in partition gpu")
    assert submitted(head)["test_only"] is True
    head.reply("submit", {"test_only": True, "start_time": None, "reason": "Dependency", "warnings": []})
    r = run(head, "sbatch", "--test-only", "--wrap", "true")
    assert r.stderr == "sbatch: Job would not start soon: Dependency\n"


def test_skip_if_active_prints_the_active_jobs_id(head):
    head.reply("submit", {"job_id": 41, "skipped": True, "warnings": []})
    r = run(head, "sbatch", "--parsable", "--skip-if-active", "-J", "nightly", "--wrap", "true")
    assert (r.exit_code, r.stdout) == (0, "41\n")
    assert submitted(head)["skip_if_active"] is True
    r = run(head, "sbatch", "--skip-if-active", "-J", "nightly", "--wrap", "true")
    assert (r.exit_code, r.stdout) == (0, "Job 41 named 'nightly' is still pending or running; nothing submitted\n")


def test_head_warnings_are_printed(head):
    head.reply("submit", {"job_id": 3, "warnings": ["--mail-type: this cluster sends no mail"]})
    r = run(head, "sbatch", "--mail-type=END", "--wrap", "true")
    assert (r.stdout, r.stderr) == ("Submitted batch job 3\n", "sbatch: warning: --mail-type: this cluster sends no mail\n")


@pytest.mark.parametrize("state, code, signal, expected", [
    ("COMPLETED", 0, None, 0), ("FAILED", 3, None, 3), ("FAILED", 0, 9, 1), ("CANCELLED", None, None, 1),
    ("TIMEOUT", 0, 15, 1), ("NODE_FAIL", None, None, 1),
])
def test_wait_exits_with_the_jobs_exit_code(head, state, code, signal, expected):
    head.add_job(job_id=1, state="RUNNING")
    polls = []

    def jobs(args, uid):
        polls.append(1)
        if len(polls) > 2:
            head.jobs[1].update(state=state, exit_code=code, signal=signal)
        return {"jobs": [dict(head.jobs[1])]}
    head.reply("submit", {"job_id": 1, "warnings": []})
    head.handle("jobs", jobs)
    r = run(head, "sbatch", "--parsable", "-W", "--wrap", "true")
    assert (r.exit_code, r.stdout) == (expected, "1\n")
    assert len(polls) == 3


def test_wait_on_an_array_takes_the_highest_exit_code():
    tasks = [job(1, state="COMPLETED", exit_code=0), job(2, state="FAILED", exit_code=4),
             job(3, state="FAILED", exit_code=2)]
    assert max(job_exit_code(t) for t in tasks) == 4


# -- array ids in scancel, squeue, sacct ---------------------------------------------------------------

def test_scancel_array_tasks(head):
    r = run(head, "scancel", "7_3", "8", "9_[1-2]")
    assert r.exit_code == 1   # the fake head knows none of them
    assert head.last("cancel") == {"job_ids": [8], "array_tasks": [[7, 3], [9, 1], [9, 2]]}
    r = run(head, "scancel", "7_x")
    assert r.exit_code == 2 and "invalid job id '7_x'" in r.stderr


def array_jobs(head):
    for i, t in enumerate(range(4)):
        head.add_job(job_id=10 + i, name="sweep", array_job_id=10, array_task_id=t, display_id=f"10_{t}",
                     array_throttle=2, state="RUNNING" if t < 2 else "PENDING", node="gpu01" if t < 2 else None,
                     reason=None if t < 2 else "JobArrayTaskLimit", start_time=T0 if t < 2 else None)
    head.add_job(job_id=20, name="solo", state="PENDING", reason="Dependency", dependency="afterok:10",
                 priority=5)


def test_squeue_collapses_pending_array_tasks(head, monkeypatch):
    monkeypatch.setattr(squeue, "clock", lambda: T0 + 65)
    array_jobs(head)
    r = run(head, "squeue")
    assert r.stdout.splitlines() == [
        "     JOBID PARTITION NAME  USER  ST TIME GPUS NODELIST(REASON)",
        "      10_0 gpu       sweep alice R  1:05    1 gpu01",
        "      10_1 gpu       sweep alice R  1:05    1 gpu01",
        "        20 gpu       solo  alice PD 0:00    1 (Dependency)",
        "10_[2-3%2] gpu       sweep alice PD 0:00    1 (JobArrayTaskLimit)",
    ]
    r = run(head, "squeue", "-r", "-h", "-o", "%i %t")
    assert r.stdout.splitlines() == ["10_0 R", "10_1 R", "20 PD", "10_2 PD", "10_3 PD"]
    head.handle("jobs", lambda args, uid: {"jobs": list(head.jobs.values())})   # the head expands ids
    r = run(head, "squeue", "-h", "-j", "10_3", "-o", "%i")
    assert r.stdout == "10_3\n"
    assert head.last("jobs") == {"job_ids": [10]}


def test_squeue_formats(head, monkeypatch):
    monkeypatch.setattr(squeue, "clock", lambda: T0 + 65)
    array_jobs(head)
    r = run(head, "squeue", "-o", "%.6i|%-6j|%5T|%C|%b|%E|%R", "-j", "20")
    assert r.stdout.splitlines() == [" JOBID|NAME  |STATE|CPUS|TRES_PER_NODE|DEPENDENCY|NODELIST(REASON)",
                                     "    20|solo  |PENDI|1|gres/gpu:1|afterok:10|(Dependency)"]
    r = run(head, "squeue", "-O", "jobid:6,name:.8,state", "-h", "-j", "20")
    assert r.stdout == "20         solo PENDING\n"
    r = run(head, "squeue", "-l", "-j", "20")
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "TIME_LIMI", "NODES",
                                "NODELIST(REASON)"]
    assert lines[2].split() == ["20", "gpu", "solo", "alice", "PENDING", "0:00", "1:00:00", "1", "(Dependency)"]
    r = run(head, "squeue", "-h", "-r", "-o", "%i", "-S", "-i")
    assert r.stdout.split() == ["20", "10_3", "10_2", "10_1", "10_0"]
    r = run(head, "squeue", "-h", "-o", "%i", "-p", "other")
    assert r.stdout == ""


def test_squeue_start(head):
    head.add_job(job_id=1, state="RUNNING", node="gpu01", start_time=T0)
    head.add_job(job_id=2, expected_start=T0 + 3600)
    head.add_job(job_id=3)
    r = run(head, "squeue", "--start", "-h", "-o", "%i %S")
    assert r.stdout.splitlines()[0].startswith("2 20")
    assert r.stdout.splitlines()[1] == "3 N/A"
    assert head.last("jobs") == {"states": ["PENDING"]}


@pytest.mark.parametrize("args, message", [
    (["-o", "%i %Y"], "--format: unknown field %Y"),
    (["-O", "jobid,frob"], "--Format: unknown field 'frob'"),
    (["-S", "z"], "--sort: cannot sort by 'z'"),
])
def test_squeue_format_mistakes(head, args, message):
    r = run(head, "squeue", *args)
    assert r.exit_code == 2 and message in r.stderr


def test_sacct_formats(head, monkeypatch):
    monkeypatch.setattr(sacct, "clock", lambda: T0 + 100)
    head.add_job(job_id=5, name="train", state="COMPLETED", exit_code=0, start_time=T0, end_time=T0 + 61,
                 node="gpu01", gpu_indices=[0], submit_time=T0)
    head.add_job(job_id=6, name="a-very-long-job-name", state="FAILED", exit_code=2, start_time=T0,
                 end_time=T0 + 5, node="gpu02", submit_time=T0)
    r = run(head, "sacct", "-a", "-o", "JobID,JobName,State,ExitCode,Elapsed")
    assert r.stdout.splitlines() == [
        "       JobID    JobName      State ExitCode    Elapsed",
        "------------ ---------- ---------- -------- ----------",
        "           5      train  COMPLETED      0:0   00:01:01",
        "           6 a-very-lo+     FAILED      2:0   00:00:05",
    ]
    r = run(head, "sacct", "-a", "-P", "-n", "-o", "JobID,JobName%30,State")
    assert r.stdout.splitlines() == ["5|train|COMPLETED", "6|a-very-long-job-name|FAILED"]
    r = run(head, "sacct", "-a", "-p", "-b", "-X")
    assert r.stdout.splitlines() == ["JobID|State|ExitCode|", "5|COMPLETED|0:0|", "6|FAILED|2:0|"]
    r = run(head, "sacct", "-a", "-s", "F,CD", "-n", "-P", "-o", "jobid")
    assert head.last("jobs")["states"] == ["COMPLETED", "FAILED"]
    r = run(head, "sacct", "-a", "-E", "2000-01-01", "-n", "-P", "-o", "jobid")
    assert r.stdout == ""
    r = run(head, "sacct", "-a", "-o", "JobID,Nope")
    assert r.exit_code == 2 and "unknown field 'Nope'" in r.stderr
    r = run(head, "sacct", "-a", "-s", "XX")
    assert r.exit_code == 2 and "invalid state 'XX'" in r.stderr


def test_sacct_lists_array_tasks_by_array_id(head, monkeypatch):
    monkeypatch.setattr(sacct, "clock", lambda: T0 + 100)
    array_jobs(head)
    head.handle("jobs", lambda args, uid: {"jobs": list(head.jobs.values())})   # the head expands ids
    r = run(head, "sacct", "-a", "-j", "10", "-P", "-n", "-o", "JobID,State")
    assert r.stdout.splitlines() == ["10_0|RUNNING", "10_1|RUNNING", "10_2|PENDING", "10_3|PENDING"]


def test_sinfo_format(head):
    head.nodes = [node("gpu01", gpus=8), node("gpu02", gpus=8), node("gpu03", gpus=4, state="DRAIN",
                                                                       model="A100-40GB")]
    head.nodes[2]["reason"] = "fans [root]"
    head.reply("show", {"partitions": [
        {"name": "gpu", "default": True, "state": "UP", "node_names": ["gpu01", "gpu02", "gpu03"], "max_time": None},
        {"name": "short", "default": False, "state": "UP", "node_names": ["gpu01"], "max_time": 3600.0}]})
    r = run(head, "sinfo", "-o", "%9P %.5a %.10l %.6D %.6t %N")
    assert r.stdout.splitlines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "gpu*         up   infinite      2   idle gpu[01-02]",
        "gpu*         up   infinite      1  drain gpu03",
        "short        up   01:00:00      1   idle gpu01",
    ]
    r = run(head, "sinfo", "-h", "-o", "%N %G %E", "-N")
    assert r.stdout.splitlines() == ["gpu01 gpu:H100-80GB:8 none", "gpu02 gpu:H100-80GB:8 none",
                                     "gpu03 gpu:A100-40GB:4 fans [root]"]
    r = run(head, "sinfo", "-p", "short", "-N", "-h")
    assert r.stdout.split()[0] == "gpu01" and len(r.stdout.splitlines()) == 1


# -- scontrol ---------------------------------------------------------------------------------------------

def test_scontrol_job_actions_and_their_errors(head):
    head.reply("hold", {"done": ["4"], "errors": []})
    assert run(head, "scontrol", "hold", "4").exit_code == 0
    assert head.last("hold") == {"job_ids": [4], "user": False}
    assert run(head, "scontrol", "uhold", "jobid=4").exit_code == 0
    assert head.last("hold") == {"job_ids": [4], "user": True}
    head.reply("release", {"done": [], "errors": ["job 4: Access/permission denied", "job 5_1: Job is not held"]})
    r = run(head, "scontrol", "release", "4,5_1")
    assert head.last("release") == {"job_ids": [4], "array_tasks": [[5, 1]]}
    assert (r.exit_code, r.stderr) == (1, "scontrol: error: job 4: Access/permission denied\n"
                                          "scontrol: error: job 5_1: Job is not held\n")
    head.reply("requeue", {"done": ["4"], "errors": []})
    assert run(head, "scontrol", "REQUEUE", "4").exit_code == 0


def test_scontrol_update_forms(head):
    head.reply("update_job", {"done": ["4"], "errors": []})
    head.reply("update_node", {"done": ["gpu01"], "errors": []})
    assert run(head, "scontrol", "update", "job", "4", "TimeLimit=1:00:00", "Nice=10").exit_code == 0
    assert head.last("update_job") == {"job_ids": [4], "changes": {"TimeLimit": "1:00:00", "Nice": "10"}}
    assert run(head, "scontrol", "update", "JobId=4_2", "dependency=afterok:3").exit_code == 0
    assert head.last("update_job") == {"job_ids": [], "array_tasks": [[4, 2]], "changes": {"dependency": "afterok:3"}}
    assert run(head, "scontrol", "update", "NodeName=gpu[01-02]", "State=DRAIN", "Reason=fan failure").exit_code == 0
    assert head.last("update_node") == {"nodes": "gpu[01-02]", "state": "DRAIN", "reason": "fan failure"}
    assert run(head, "scontrol", "update", "node", "gpu01", "state=resume").exit_code == 0
    assert head.last("update_node") == {"nodes": "gpu01", "state": "resume", "reason": None}


@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["frob"], "unknown command 'frob'"),
    (["hold"], "hold needs job ids"),
    (["update", "job", "4"], "nothing to update"),
    (["update", "job", "4", "TimeLimit"], "expected Key=Value, not 'TimeLimit'"),
    (["update", "Nice=3"], "update needs JobId=ID or NodeName=NAME"),
    (["update", "node", "gpu01", "Gres=gpu:2"], "cannot update 'gres' of a node"),
    (["update", "node", "gpu01", "Reason=x"], "update node needs State=DRAIN or State=RESUME"),
    (["show"], "show what?"),
    (["show", "frob"], "cannot show 'frob'"),
    (["reconfigure", "now"], "reconfigure takes no arguments"),
])
def test_scontrol_mistakes_exit_2(head, args, message):
    r = run(head, "scontrol", *args)
    assert r.exit_code == 2 and message in r.stderr.splitlines()[0]
    assert head.ops() == []


def test_scontrol_show(head):
    head.reply("show", {"jobs": [job(4, name="train", state="PENDING", reason="Dependency", dependency="afterok:3",
                                      array_job_id=4, array_task_id=0, array_throttle=2, hold="user", nice=5,
                                      gpus=2, gpu_type="H100-80GB", mail_type="END")]})
    r = run(head, "scontrol", "show", "job", "4")
    lines = r.stdout.splitlines()
    assert lines[0] == "JobId=4 ArrayJobId=4 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=train"
    assert "   JobState=PENDING Reason=Dependency Dependency=afterok:3" in lines
    assert "   Priority=0 Nice=5 Account=default QOS=normal Hold=user" in lines
    assert any(line.strip().startswith("NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 Gres=gpu:H100-80GB:2")
               for line in lines)
    assert lines[-1] == ""
    r = run(head, "scontrol", "-o", "show", "job")
    assert len(r.stdout.splitlines()) == 1 and r.stdout.startswith("JobId=4 ")
    r = run(head, "scontrol", "--json", "show", "job", "4")
    assert json.loads(r.stdout)["jobs"][0]["job_id"] == 4
    head.reply("show", {"nodes": [dict(node("gpu01"), partitions=["gpu"])]})
    r = run(head, "scontrol", "show", "node", "gpu01")
    assert r.stdout.splitlines()[0] == "NodeName=gpu01 State=IDLE"
    assert head.last("show") == {"kind": "node", "names": ["gpu01"]}
    head.reply("show", {"partitions": [{"name": "gpu", "default": True, "node_names": ["gpu01", "gpu02"],
                                        "default_time": 3600.0, "max_time": None, "cpus_total": 128,
                                        "gpus_total": 16, "jobs_pending": 1, "jobs_running": 2}]})
    r = run(head, "scontrol", "show", "partition")
    assert r.stdout.splitlines()[:2] == ["PartitionName=gpu Default=YES State=UP",
                                         "   Nodes=gpu[01-02] TotalNodes=2 TotalCPUs=128 TotalGPUs=16"]
    head.reply("show", {"jobs": []})
    assert run(head, "scontrol", "show", "jobs").stdout == "No jobs in the system\n"


def test_scontrol_config_and_reconfigure(head):
    head.reply("show_config", {"path": "/etc/gpud/gpud.toml",
                               "config": {"cluster": "c1", "head": {"admins": ["boss"], "kill_grace": 30.0}}})
    r = run(head, "scontrol", "show", "config")
    assert r.stdout.splitlines() == ["Configuration of the gpud head (from /etc/gpud/gpud.toml)", "cluster = c1",
                                     'head.admins = ["boss"]', "head.kill_grace = 30.0"]
    head.reply("reconfigure", {"path": "/etc/gpud/gpud.toml", "restart_needed": ["[head] socket changed"]})
    r = run(head, "scontrol", "reconfigure")
    assert (r.exit_code, r.stderr) == (0, "scontrol: warning: needs a restart to take effect: [head] socket changed\n")
    head.refuse("reconfigure", "Access/permission denied: only root and the users in [head] admins may reconfigure")
    r = run(head, "scontrol", "reconfigure")
    assert r.exit_code == 1 and r.stderr.startswith("scontrol: error: Access/permission denied")


# -- scrontab ---------------------------------------------------------------------------------------------

CRONTAB = """# nightly evaluation
#SCRON -J eval --gres=gpu:1 -t 30
#SCRON --hint=nomultithread
30 2 * * * /data/bin/eval.sh --latest

*/5 * * * * python3 poll.py
"""


def test_scrontab_install_builds_one_spec_per_entry(head, tmp_path):
    path = tmp_path / "cron"
    path.write_text(CRONTAB)
    head.reply("scrontab_set", {"entries": 2})
    r = run(head, "scrontab", str(path))
    assert r.exit_code == 0
    assert r.stderr == "scrontab: warning: line 4: --hint is not supported by gpud and was ignored\n"
    sent = head.last("scrontab_set")
    assert sent["text"] == CRONTAB
    first, second = sent["entries"]
    assert (first["line"], first["schedule"], second["line"], second["schedule"]) == (4, "30 2 * * *", 6, "*/5 * * * *")
    assert (first["spec"]["name"], first["spec"]["gpus"], first["spec"]["time_limit"]) == ("eval", 1, 1800.0)
    assert first["spec"]["script"] == "#!/bin/bash\n/data/bin/eval.sh --latest\n"
    assert second["spec"]["name"] == "python3"
    assert set(second["spec"]["env"]) == {"HOME", "USER", "LOGNAME", "SHELL", "PATH"}
    assert second["spec"]["work_dir"] == second["spec"]["env"]["HOME"]


def test_scrontab_list_remove_and_stdin(head):
    head.reply("scrontab_get", {"text": CRONTAB, "entries": []})
    r = run(head, "scrontab", "-l")
    assert (r.exit_code, r.stdout) == (0, CRONTAB)
    head.reply("scrontab_get", {"text": "", "entries": []})
    r = run(head, "scrontab", "-l")
    assert r.exit_code == 1 and r.stderr.startswith("scrontab: error: no crontab for ")
    head.reply("scrontab_set", {"entries": 0})
    assert run(head, "scrontab", "-r").exit_code == 0
    assert head.last("scrontab_set") == {"text": "", "entries": []}
    assert run(head, "scrontab", "-", input="@daily true\n").exit_code == 0
    assert head.last("scrontab_set")["entries"][0]["schedule"] == "@daily"


@pytest.mark.parametrize("args, stdin, message", [
    ([], None, "give exactly one of FILE, -l, -e or -r"),
    (["-l", "-r"], None, "give exactly one of"),
    (["-"], "61 * * * * true\n", "line 1: invalid schedule"),
    (["-"], "#SCRON --bogus\n* * * * * true\n", "#SCRON before line 2: unrecognized option '--bogus'"),
    (["-e"], None, "scrontab -e needs a terminal"),
])
def test_scrontab_mistakes_exit_2(head, args, stdin, message):
    r = run(head, "scrontab", *args, input=stdin)
    assert r.exit_code == 2 and message in r.stderr.splitlines()[0]
    assert "scrontab_set" not in head.ops()
