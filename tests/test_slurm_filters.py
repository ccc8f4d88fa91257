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
