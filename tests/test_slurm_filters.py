"""The everyday filters of scancel, squeue, sinfo and sacct, with their man pages as the oracle."""

from __future__ import annotations

import os
import pwd

import pytest
from click.testing import CliRunner

from gpuctl.main import cli
from tests.fake_head import FakeHead

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def run(head, *args):
    return CliRunner().invoke(cli, ["--socket", head.path, *args], catch_exceptions=False)


def jobs(head):
    head.add_job(job_id=1, name="train", user=ME, uid=os.getuid(), state="RUNNING", node="gpu01",
                 nodelist="gpu01", partition="gpu", account="vision", qos="high")
    head.add_job(job_id=2, name="train", user=ME, uid=os.getuid(), state="PENDING", account="physics")
    head.add_job(job_id=3, name="eval", user=ME, uid=os.getuid(), state="RUNNING", node="gpu02",
                 nodelist="gpu[02-03]", partition="debug", account="vision")
    head.add_job(job_id=4, name="train", user="bob", uid=4242, state="RUNNING", node="gpu01", nodelist="gpu01")


# scancel(1): "-n, --name=job_name Restrict the scancel operation to jobs with this job name."
# "-t, --state=job_state_name Restrict the scancel operation to jobs in this state."
# "-p, --partition=partition_name Restrict the scancel operation to jobs in this partition."
# "-A, --account=account Restrict the scancel operation to jobs under this charge account."
# "-w, --nodelist=host1,host2,... Cancel any jobs using any of the given hosts."
# "--me Restrict the scancel operation to jobs owned by the current user."
# Filters combine: a job is cancelled only when it matches all of them.
@pytest.mark.parametrize("args, cancelled", [
    (["--me", "-n", "train"], [1, 2]),
    (["--me", "-n", "train", "-t", "R"], [1]),
    (["--me", "-t", "PENDING"], [2]),
    (["--me", "-p", "debug"], [3]),
    (["--me", "-A", "vision"], [1, 3]),
    (["--me", "-w", "gpu03"], [3]),
    (["-w", "gpu01"], [1, 4]),                    # an admin's filters pick from every job
    (["-u", "bob", "-n", "train"], [4]),
    (["--me", "-n", "nothing"], None),            # nothing matches: nothing asked, nothing said
    (["1", "3", "-A", "vision", "-t", "R", "--me"], [1, 3]),
])
def test_scancel_filters(head, args, cancelled):
    jobs(head)
    r = run(head, "scancel", *args)
    assert (r.exit_code, r.output) == (0, "")
    if cancelled is None:
        assert "cancel" not in head.ops()
    else:
        assert head.last("cancel") == {"job_ids": cancelled}


def test_scancel_filters_of_a_user_pick_from_their_own_jobs(head):
    jobs(head)
    head.admins = set()
    assert run(head, "scancel", "-w", "gpu01").exit_code == 0
    assert head.last("cancel") == {"job_ids": [1]}       # not bob's job 4 on the same node


# squeue(1): "-n, --name=<name_list> Request jobs or job steps having one of the specified names."
# "-w, --nodelist=<hostlist> Report only on jobs allocated to the specified node or list of nodes."
# "-q, --qos=<qos_list> Specify the qos(s) of the jobs or steps to view."
# "-A, --account=<account_list> Specify the accounts of the jobs to view."
# "--me Equivalent to --user=<my username>."
@pytest.mark.parametrize("args, shown", [
    (["-n", "train"], ["1", "4", "2"]),
    (["-w", "gpu03"], ["3"]),
    (["--nodelist=gpu[01-02]"], ["1", "3", "4"]),
    (["-q", "high"], ["1"]),
    (["-A", "physics"], ["2"]),
    (["-n", "train", "-w", "gpu01", "--me"], ["1"]),
])
def test_squeue_filters(head, args, shown):
    jobs(head)
    for argv in (["squeue", "-h", "-o", "%i", *args], ["squeue", "-h", *args]):
        r = run(head, *argv)
        assert r.exit_code == 0, r.output
        assert [line.split()[0] for line in r.output.splitlines()] == shown


def test_squeue_filters_on_the_fast_path(head, capsys):
    from gpuctl.commands.squeue import fast_main

    jobs(head)
    assert fast_main(["--socket", head.path, "squeue", "-h", "-n", "eval", "-q", "normal", "-w", "gpu02"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["3"]


def nodes(head):
    from tests.fake_head import node

    drained = dict(node("gpu03", state="DRAIN"), reason="bad fan", reason_user="root", reason_time=1_800_000_000.0)
    draining = dict(node("gpu04", state="DRAIN", gpus_alloc=2, cpus_alloc=8), reason="bad fan",
                    reason_user="root", reason_time=1_800_000_000.0)
    head.reply("nodes", {"nodes": [node("gpu01"), node("gpu02", state="MIXED", gpus_alloc=4, cpus_alloc=4),
                                   drained, draining, dict(node("gpu05", state="DOWN"), reason="not responding")]})


# sinfo(1) node states: "DRAINING The node is currently allocated a job, but will not be
# allocated additional jobs." (drng) and "DRAINED The node is unavailable for use per system
# administrator request." (drain)
def test_sinfo_tells_draining_from_drained(head, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    nodes(head)
    r = run(head, "sinfo", "-N", "-h", "-o", "%N %t %T")
    assert r.output.splitlines() == ["gpu01 idle idle", "gpu02 mix mixed", "gpu03 drain drained",
                                     "gpu04 drng draining", "gpu05 down down"]


# sinfo(1): "-t, --states=<states> List nodes only having the given state(s). Multiple states
# may be comma separated and the comparison is case insensitive." DRAIN covers both.
@pytest.mark.parametrize("states, shown", [
    ("idle", ["gpu01"]), ("DRAIN", ["gpu03", "gpu04"]), ("drng", ["gpu04"]), ("drained", ["gpu03"]),
    ("mix,down", ["gpu02", "gpu05"]),
])
def test_sinfo_states(head, states, shown):
    nodes(head)
    r = run(head, "sinfo", "-N", "-h", "-o", "%N", "-t", states)
    assert r.output.split() == shown


# sinfo(1): "-R, --list-reasons List reasons nodes are in the down, drained, fail or failing
# state." Its layout is "%20E %9u %19H %N"; nodes with one reason share a line.
def test_sinfo_list_reasons(head, monkeypatch):
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    nodes(head)
    r = run(head, "sinfo", "-R")
    assert r.output.splitlines() == [
        "REASON               USER      TIMESTAMP           NODELIST",
        "bad fan              root      2027-01-15T08:00:00 gpu[03-04]",
        "not responding       Unknown   Unknown             gpu05",
    ]


# sinfo(1): "-l, --long Print more detailed information." (long state names)
def test_sinfo_long(head):
    nodes(head)
    head.reply("show", {"partitions": [{"name": "gpu", "default": True, "node_names": ["gpu01", "gpu04"]}]})
    r = run(head, "sinfo", "-l", "-h")
    assert sorted(line.split()[4] for line in r.output.splitlines()) == ["draining", "idle"]
    r = run(head, "sinfo", "-N", "-l", "-h")
    assert [line.split()[3] for line in r.output.splitlines()] == ["idle", "draining"]


def finished(head):
    for job_id, extra in ((1, {}), (2, {"array_job_id": 2, "array_task_id": 0}), (10, {"name": "eval"}),
                          (11, {"array_job_id": 11, "array_task_id": 0, "partition": "debug"}),
                          (12, {"array_job_id": 11, "array_task_id": 1, "account": "vision"}),
                          (13, {"array_job_id": 11, "array_task_id": 10})):
        display = f"{extra['array_job_id']}_{extra['array_task_id']}" if "array_job_id" in extra else str(job_id)
        head.add_job(job_id=job_id, user=ME, uid=os.getuid(), state="COMPLETED", exit_code=0, display_id=display,
                     submit_time=1_800_000_000.0 + job_id, start_time=1_800_000_100.0, end_time=1_800_000_200.0,
                     **extra)


def test_sacct_sorts_job_ids_as_numbers(head):
    finished(head)
    r = run(head, "sacct", "-n", "-S", "2020-01-01")
    assert [line.split()[0] for line in r.output.splitlines()] == ["1", "2_0", "10", "11_0", "11_1", "11_10"]


# sacct(1): "--name=<jobname_list> Display jobs that have any of these name(s)."
# "-r, --partition Comma separated list of partitions to select jobs and job steps from."
# "-A, --accounts=<account_list> Displays jobs when a comma separated list of accounts are given"
# "-E, --endtime: Select jobs in any state before the specified time."
# "-X, --allocations Only show statistics relevant to the job allocation itself" (gpud jobs have no steps)
@pytest.mark.parametrize("args, shown", [
    (["--name", "eval"], ["10"]),
    (["-r", "debug"], ["11_0"]),
    (["--partition=debug,gpu", "-A", "vision"], ["11_1"]),
    (["-E", "2027-01-15T08:00:05", "-X"], ["1", "2_0"]),
    (["-u", ME, "--name=job", "-A", "default"], ["1", "2_0", "11_0", "11_10"]),
])
def test_sacct_filters(head, args, shown):
    finished(head)
    r = run(head, "sacct", "-n", "-S", "2020-01-01", "-o", "JobID", *args)
    assert r.exit_code == 0, r.output
    assert [line.split()[0] for line in r.output.splitlines()] == shown


def test_seff_takes_an_array_task_id(head):
    finished(head)
    head.handle("jobs", lambda args, uid: {"jobs": [j for j in head.jobs.values()
                                                    if j.get("array_job_id") in args.get("job_ids", [])]})
    head.handle("seff", lambda args, uid: {"job": dict(head.jobs[args["job_id"]], gpus=0), "cluster": "c"})
    r = run(head, "seff", "11_1")
    assert r.exit_code == 0, r.output
    assert head.last("seff") == {"job_id": 12}
    assert r.output.startswith("Job ID: 12\n")
    r = run(head, "seff", "11_7")
    assert (r.exit_code, r.output.strip()) == (1, "seff: error: Job 11_7 not found")
