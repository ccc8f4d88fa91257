"""The head's Slurm controls (gpud/head/ops_slurm.py): holds, requeue, updates and their rules,
nodes, show, and the submit options --begin, --deadline, --skip-if-active, --test-only, mail."""

from __future__ import annotations

import asyncio
import os

import pytest

from gpud.head.ops_slurm import expand_hostlist
from gpud.head.mail import mail_event
from gpud.head.slurm import resolve_gpu_type
from gpud.ctlsocket import RequestError
from gpud.model import JobState
from tests.slurm_head import ALICE, BOB, ROOT, HeadKit, T0, spec


async def test_hold_and_release_user_and_admin_holds(tmp_path):
    async with HeadKit(tmp_path, admins=("boss",)) as kit:
        kit.add_node("n1")
        a = await kit.submit()
        assert await kit.call("hold", ALICE, job_ids=[a]) == {"done": [str(a)], "errors": []}
        await kit.schedule()
        assert (kit.job(a).state, kit.job(a).reason, kit.job(a).hold_kind) == (JobState.PENDING, "JobHeldUser", "user")
        assert await kit.call("release", BOB, job_ids=[a]) == {"done": [], "errors": [f"job {a}: Access/permission denied"]}
        assert await kit.call("release", ALICE, job_ids=[a]) == {"done": [str(a)], "errors": []}
        await kit.call("hold", ROOT, job_ids=[a])
        await kit.schedule()
        assert kit.job(a).reason == "JobHeldAdmin"
        r = await kit.call("release", ALICE, job_ids=[a])
        assert r["errors"] == [f"job {a}: held by an administrator; only root or an admin may release it"]
        boss = ALICE.__class__(uid=50009, gid=50009, pid=1, user="boss")
        assert (await kit.call("release", boss, job_ids=[a]))["done"] == [str(a)]
        await kit.schedule()
        assert kit.job(a).state is JobState.RUNNING
        assert (await kit.call("hold", ALICE, job_ids=[a]))["errors"] == [f"job {a}: Job is no longer pending execution"]
        assert (await kit.call("release", ALICE, job_ids=[a]))["errors"] == [f"job {a}: Job is not held"]
        events = [e["event"] for e in await kit.store.job_events(a)]
        assert events == ["submitted", "held", "released", "held", "released", "allocated"]


async def test_submitted_held_is_a_user_hold(tmp_path):
    async with HeadKit(tmp_path) as kit:
        a = await kit.submit(hold=True)
        assert (kit.job(a).hold_kind, kit.job(a).reason) == ("user", "JobHeldUser")
        assert (await kit.call("release", ALICE, job_ids=[a]))["done"] == [str(a)]


async def test_requeue_stops_a_running_job_and_queues_it_again(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1)
        assert (await kit.call("requeue", ALICE, job_ids=[a]))["errors"] == [
            f"job {a}: Job is pending execution; nothing to requeue"]
        await kit.schedule()
        assert await kit.call("requeue", ALICE, job_ids=[a]) == {"done": [str(a)], "errors": []}
        assert (kit.job(a).state, kit.job(a).stop_reason) == (JobState.COMPLETING, "requeue")
        await kit.finish(a, exit_code=0, reason="cancelled")      # the worker reports the stop
        assert (kit.job(a).state, kit.job(a).requeue_count) == (JobState.PENDING, 1)
        await kit.schedule()
        assert (kit.job(a).state, kit.job(a).attempt) == (JobState.RUNNING, 2)


# -- update rules: owners may only lower limits, admins anything --------------------------------------

@pytest.mark.parametrize("changes, owner_ok, message", [
    ({"TimeLimit": "30"}, True, None),
    ({"TimeLimit": "90"}, False, "only root or an admin may raise a time limit (from 01:00:00 to 01:30:00)"),
    ({"TimeLimit": "UNLIMITED"}, False, "only root or an admin may raise a time limit (from 01:00:00 to UNLIMITED)"),
    ({"Nice": "50"}, True, None),
    ({"Nice": "-5"}, False, "only root or an admin may lower a nice value (from 0 to -5)"),
    ({"QOS": "low"}, True, None),
    ({"QOS": "high"}, False, "only root or an admin may move a job to a QOS of higher priority (normal -> high)"),
    ({"Partition": "short"}, True, None),
    ({"Partition": "long"}, True, None),
    ({"Account": "physics"}, True, None),
    ({"Account": "secret"}, False, "user alice is not a member of account secret"),
    ({"Comment": "hello", "JobName": "renamed"}, True, None),
    ({"StartTime": "now+1hour"}, True, None),
    ({"Deadline": "now+1day"}, True, None),
])
async def test_update_job_rules_owner_versus_admin(tmp_path, changes, owner_ok, message):
    async with HeadKit(tmp_path) as kit:
        kit.head.cfg = policy(kit.head.cfg)
        a = await kit.submit(time_limit=3600, qos="normal", account="physics")
        r = await kit.call("update_job", ALICE, job_ids=[a], changes=changes)
        if owner_ok:
            assert r == {"done": [str(a)], "errors": []}
        else:
            assert r["errors"] == [f"job {a}: {message}"]
        r = await kit.call("update_job", ROOT, job_ids=[a], changes=changes)
        assert r == {"done": [str(a)], "errors": []}


def policy(cfg):
    from dataclasses import replace

    from gpud.sched.config import AccountConfig, PartitionConfig, QosConfig

    sched = replace(cfg.sched,
                    partitions={"gpu": PartitionConfig("gpu", default=True), "short": PartitionConfig("short"),
                                "long": PartitionConfig("long", max_time=86400.0)},
                    qos={"normal": QosConfig("normal", priority=10), "low": QosConfig("low", priority=0),
                         "high": QosConfig("high", priority=100)},
                    accounts={"default": AccountConfig("default", users=("*",)),
                              "physics": AccountConfig("physics", users=("alice",)),
                              "secret": AccountConfig("secret", users=("carol",))})
    return replace(cfg, sched=sched)


async def test_update_refusals_that_hold_for_everyone(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.head.cfg = policy(kit.head.cfg)
        kit.add_node("n1")
        a = await kit.submit(gpus=1, time_limit=3600)
        await kit.schedule()
        for changes, message in [
            ({"Partition": "short"}, "Partition can only change while the job is pending"),
            ({"Partition": "nope"}, "Partition can only change while the job is pending"),
            ({"ArrayTaskThrottle": "3"}, "ArrayTaskThrottle applies to array jobs only"),
            ({"Nice": "x"}, "Nice must be a whole number, not 'x'"),
        ]:
            r = await kit.call("update_job", ROOT, job_ids=[a], changes=changes)
            assert r["errors"] == [f"job {a}: {message}"], changes
        assert "cannot update 'Gres'" in await kit.refused("update_job", ROOT, job_ids=[a], changes={"Gres": "gpu:2"})
        assert "nothing to update" in await kit.refused("update_job", ROOT, job_ids=[a], changes={})
        b = await kit.submit()
        r = await kit.call("update_job", ROOT, job_ids=[b], changes={"Partition": "nope"})
        assert r["errors"] == [f"job {b}: no partition 'nope'; partitions: gpu, long, short"]


async def test_a_lowered_time_limit_stops_a_running_job(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1, time_limit=3600)
        await kit.schedule()
        kit.clock.advance(600)
        assert (await kit.call("update_job", ALICE, job_ids=[a], changes={"TimeLimit": "5"}))["done"] == [str(a)]
        await kit.schedule()
        assert (kit.job(a).state, kit.job(a).stop_reason) == (JobState.COMPLETING, "timeout")
        await kit.finish(a, exit_code=0, reason="timeout")
        assert (await kit.record(a)).state is JobState.TIMEOUT


# -- nodes and show -------------------------------------------------------------------------------------

async def test_drain_and_resume_nodes(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("gpu01")
        kit.add_node("gpu02")
        assert "only root and the users in [head] admins" in await kit.refused(
            "update_node", ALICE, nodes="gpu01", state="DRAIN", reason="x")
        assert "needs a Reason" in await kit.refused("update_node", ROOT, nodes="gpu01", state="DRAIN")
        assert "use State=DRAIN or State=RESUME" in await kit.refused("update_node", ROOT, nodes="gpu01", state="UP")
        r = await kit.call("update_node", ROOT, nodes="gpu[01-03]", state="drain", reason="fans")
        assert r == {"done": ["gpu01", "gpu02"], "errors": ["node gpu03: no such node"]}
        assert (kit.store.nodes["gpu01"].state, kit.store.nodes["gpu01"].reason) == ("DRAIN", "fans [root]")
        a = await kit.submit(gpus=1)
        await kit.schedule()
        assert kit.job(a).state is JobState.PENDING
        r = await kit.call("update_node", ROOT, nodes="gpu01", state="RESUME")
        assert r == {"done": ["gpu01"], "errors": []}
        await kit.schedule()
        assert kit.job(a).node == "gpu01"
        r = await kit.call("update_node", ROOT, nodes="gpu01", state="RESUME")
        assert r["errors"] == ["node gpu01: not drained or down; nothing to resume"]


def test_hostlists():
    assert expand_hostlist("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    with pytest.raises(RequestError):
        expand_hostlist("n[a-b]")


async def test_show_jobs_nodes_partitions(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        a = await kit.submit(gpus=2, mail_type="END", comment="c")
        arr = (await kit.call("submit", spec=spec("true", array="0-3%2")))["job_id"]
        await kit.schedule()
        shown = (await kit.call("show", kind="job", job_ids=[a]))["jobs"]
        assert [(j["job_id"], j["mail_type"], j["comment"], j["requeue"]) for j in shown] == [(a, "END", "c", True)]
        tasks = (await kit.call("show", kind="job", array_tasks=[[arr, 3]]))["jobs"]
        assert [(j["display_id"], j["array_summary"]) for j in tasks] == [(f"{arr}_3", f"{arr}_[0-3%2]")]
        assert len((await kit.call("show", kind="job"))["jobs"]) == 5
        assert "Invalid job id specified: 999" in await kit.refused("show", kind="job", job_ids=[999])
        [node] = (await kit.call("show", kind="node", names=["n1"]))["nodes"]
        assert (node["name"], node["partitions"], node["gpus_alloc"]) == ("n1", ["gpu"], 2)
        [part] = (await kit.call("show", kind="partition"))["partitions"]
        assert (part["name"], part["node_names"], part["gpus_total"], part["jobs_running"], part["jobs_pending"]) == (
            "gpu", ["n1"], 8, 3, 2)
        assert "cannot show 'frob'" in await kit.refused("show", kind="frob")


# -- submit options ----------------------------------------------------------------------------------------

async def test_begin_time(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(begin_time=T0 + 300)
        await kit.schedule()
        assert kit.job(a).reason == "BeginTime"
        kit.clock.advance(300)
        await kit.schedule()
        assert kit.job(a).state is JobState.RUNNING


async def test_deadline(tmp_path):
    async with HeadKit(tmp_path) as kit:
        assert "Incompatible begin and deadline" in await kit.refused("submit", spec=spec("true", deadline=T0 - 1))
        a = await kit.submit(time_limit=600, deadline=T0 + 1200)     # no node: it waits
        await kit.schedule()
        assert kit.job(a).state is JobState.PENDING
        kit.clock.advance(601)                                        # could not end in time now
        await kit.schedule()
        rec = await kit.record(a)
        assert (rec.state, rec.reason) == (JobState.CANCELLED, "DeadLine")


async def test_skip_if_active_is_atomic(tmp_path):
    async with HeadKit(tmp_path) as kit:
        s = spec("true", name="nightly", skip_if_active=True)
        results = await asyncio.gather(*(kit.call("submit", spec=s) for _ in range(20)))
        assert len({r["job_id"] for r in results}) == 1
        assert sum(1 for r in results if not r.get("skipped")) == 1
        assert len(kit.store.active) == 1
        other = await kit.call("submit", BOB, spec=s)          # someone else's job of that name
        assert not other.get("skipped")
        await kit.call("cancel", ALICE, job_ids=[results[0]["job_id"]])
        again = await kit.call("submit", spec=s)
        assert not again.get("skipped") and again["job_id"] != results[0]["job_id"]


async def test_test_only_estimates_without_submitting(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        r = await kit.call("submit", spec=spec("true", gpus=2, cpus=3, test_only=True))
        assert {k: r[k] for k in ("start_time", "node", "partition", "cpus", "gpus", "reason")} == {
            "start_time": T0, "node": "n1", "partition": "gpu", "cpus": 3, "gpus": 2, "reason": None}
        assert kit.store.active == {}
        big = await kit.submit(gpus=4, time_limit=3600)
        await kit.schedule()
        r = await kit.call("submit", spec=spec("true", gpus=2, test_only=True, time_limit=60))
        assert (r["start_time"], r["node"]) == (T0 + 3600, "n1")   # when the running job's limit runs out
        assert list(kit.store.active) == [big]
        r = await kit.call("submit", spec=spec("true", test_only=True, begin_time=T0 + 7200))
        assert (r["start_time"], r["reason"]) == (T0 + 7200, "BeginTime")


async def test_short_gpu_type_names(tmp_path):
    assert resolve_gpu_type("h100", {"H100-80GB", "A100-40GB"}) == "H100-80GB"
    assert resolve_gpu_type("H100-80GB", {"H100-80GB"}) == "H100-80GB"
    assert resolve_gpu_type("a100-40gb", {"A100-40GB"}) == "A100-40GB"
    assert resolve_gpu_type("v100", {"H100-80GB"}) == "v100"   # admission says what exists
    with pytest.raises(RequestError) as e:
        resolve_gpu_type("h100", {"H100-80GB", "H100-94GB"})
    assert "could mean H100-80GB, H100-94GB" in str(e.value)
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", model="H100-80GB")
        a = await kit.submit(gpus=2, gpu_type="h100")
        assert kit.job(a).spec.gpu_type == "H100-80GB"


# -- mail ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, types, task, expected", [
    ("PENDING", "RUNNING", "BEGIN", False, "Began"),
    ("PENDING", "RUNNING", "END", False, None),
    ("RUNNING", "COMPLETED", "END", False, "Ended"),
    ("RUNNING", "FAILED", "FAIL", False, "Failed"),
    ("RUNNING", "FAILED", "END", False, "Ended"),
    ("RUNNING", "COMPLETED", "FAIL", False, None),
    ("RUNNING", "TIMEOUT", "TIME_LIMIT", False, "Reached time limit"),
    ("RUNNING", "PENDING", "REQUEUE", False, "Requeued"),
    ("RUNNING", "COMPLETED", "ALL", False, "Ended"),
    ("RUNNING", "COMPLETED", "END", True, None),
    ("RUNNING", "COMPLETED", "END,ARRAY_TASKS", True, "Ended"),
    ("RUNNING", "COMPLETED", "NONE", False, None),
])
def test_mail_events(old, new, types, task, expected):
    assert mail_event(JobState(old), JobState(new), types, task) == expected


# A stand-in for GNU mailutils' mail: it runs the command of any --exec option it is given (the
# option that made --mail-user a way to root) and logs its uid and its recipients.
FAKE_MAIL = """#!/bin/sh
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        -s) shift 2 ;;
        --exec=*) sh -c "${1#--exec=}"; shift ;;
        *) break ;;
    esac
done
echo "uid=$(id -u) home=$HOME path=$PATH ld=${LD_PRELOAD:-} to=$*" >> LOG
"""


def _fake_mail(tmp_path):
    """The stand-in and its log in a directory every user may enter: as root the head runs
    the mail program unprivileged, and pytest's own tmp_path is root's alone."""
    import tempfile

    where = tempfile.mkdtemp(prefix="gpud-mail-")
    os.chmod(where, 0o777)
    log = os.path.join(where, "mail.log")
    prog = os.path.join(where, "mail")
    with open(prog, "w") as f:
        f.write(FAKE_MAIL.replace("LOG", log))
    os.chmod(prog, 0o755)
    return prog, log


async def test_mail_goes_through_the_configured_command(tmp_path, monkeypatch):
    from dataclasses import replace

    prog, log = _fake_mail(tmp_path)
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        r = await kit.call("submit", spec=spec("true", mail_type="END"))
        assert r["warnings"] == ["--mail-type: this cluster sends no mail (no [head] mail_command); no notifications"]
        kit.head.cfg = replace(kit.head.cfg, head=replace(kit.head.cfg.head, mail_command=prog))
        a = await kit.submit(gpus=1, mail_type="BEGIN,END", mail_user="me@example.org,ops")
        await kit.schedule()
        await kit.finish(a, exit_code=0)
        await asyncio.wait_for(_until(lambda: os.path.exists(log) and len(open(log).read().splitlines()) == 2), 10)
        lines = open(log).read().splitlines()
        uid = os.geteuid()
        for line in lines:
            # A fixed environment: the head's LD_PRELOAD, PATH and HOME do not reach it.
            assert " home=/ path=/usr/sbin:/usr/bin:/sbin:/bin ld= to=me@example.org ops" in line
            # Run unprivileged when the head is root.
            assert (line.split()[0] == f"uid={uid}") == (uid != 0)


@pytest.mark.parametrize("who", ["--exec=!id >/tmp/x", "-fexec", "a b", "|/bin/sh", "/etc/passwd",
                                 "x@-evil.org", "a,--exec=id", "", "me@example.org\n-x"])
async def test_mail_user_that_is_not_an_address_is_refused_at_submit(tmp_path, who):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        with pytest.raises(RequestError) as e:
            await kit.call("submit", spec=spec("true", mail_type="BEGIN", mail_user=who))
        assert "mail_user: " in str(e.value) and "\n" not in str(e.value)


async def test_mail_injection_never_reaches_the_mail_program(tmp_path):
    """Even a recipient stored before addresses were checked (an old database) is not passed
    on: the argument list is checked again, and '--' ends the options before it."""
    from gpud.head import mail

    prog, log = _fake_mail(tmp_path)
    marker = os.path.join(os.path.dirname(log), "pwned")
    assert mail.mail_argv(prog, "s", "a@b.org") == [prog, "-s", "s", "--", "a@b.org"]
    await mail.send(prog, "subject", f"--exec=touch {marker}", "7")
    await mail.send(prog, "-s", "ok@example.org", "8")           # a subject is never an option
    await asyncio.wait_for(_until(lambda: os.path.exists(log)), 10)
    assert not os.path.exists(marker)
    assert open(log).read().split("to=")[1].strip() == "ok@example.org"


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.02)


