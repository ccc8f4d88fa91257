"""Slurm habits end to end: a head and a sim worker as processes over a real Mosquitto, driven
by the gpuctl CLI.  Jobs record their own start and end times, so limits are checked from
the jobs' point of view."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.users import gpuctl_as, needs_root, temp_users

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
RECORD = 's=$(date +%s.%N); sleep {sleep}; e=$(date +%s.%N); echo "$GPUD_JOB_ID {tag} $s $e" >> {log}'


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url)
    yield c
    c.close()


def head_setting(c: Cluster, line: str) -> None:
    """Add a [head] setting to the cluster's config (before the head starts)."""
    c.config.write_text(c.config.read_text().replace("[head]\n", f"[head]\n{line}\n", 1))


def records(path: Path) -> list[tuple[int, str, float, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job, tag, start, end = line.split()
        out.append((int(job), tag, float(start), float(end)))
    return out


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])   # an end before a start at a tie
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_an_array_of_100_never_runs_more_than_its_limit(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "16xH100-80GB")
    log = tmp_path / "runs.log"
    r = cluster.gpuctl("sbatch", "--parsable", "--array=0-99%10", "--gres=gpu:1", "-o", "/dev/null",
                       "--wrap", RECORD.format(sleep="0.3", tag="$GPUD_ARRAY_TASK_ID", log=log))
    array_id = int(r.stdout)
    queue = cluster.gpuctl("squeue", "-h", "-o", "%i %t").stdout
    assert f"{array_id}_[" in queue          # pending tasks on one line
    wait_for(lambda: len(records(log)) >= 100, 240, "100 tasks to run")
    runs = records(log)
    assert sorted(int(tag) for _, tag, _, _ in runs) == list(range(100))
    assert {job for job, *_ in runs} == set(range(array_id, array_id + 100))
    assert most_at_once([(s, e) for _, _, s, e in runs]) <= 10
    out = cluster.gpuctl("sacct", "-a", "-S", "2000-01-01", "-j", str(array_id), "-P", "-n", "-o", "JobID,State")
    lines = out.stdout.splitlines()
    assert len(lines) == 100 and all(line.endswith("|COMPLETED") for line in lines)
    assert lines[0] == f"{array_id}_0|COMPLETED"


def test_afterok_chain_runs_in_order_and_a_failed_parent_leaves_the_child_waiting(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    log = tmp_path / "runs.log"
    first = cluster.sbatch("-o", "/dev/null", "--wrap", RECORD.format(sleep="0.5", tag="a", log=log))
    second = cluster.sbatch("-o", "/dev/null", f"--dependency=afterok:{first}", "--wrap",
                            RECORD.format(sleep="0.5", tag="b", log=log))
    third = cluster.sbatch("-o", "/dev/null", "-d", f"afterok:{second}", "--wrap",
                           RECORD.format(sleep="0.1", tag="c", log=log) + "; exit 3")
    child = cluster.sbatch("-o", "/dev/null", "-d", f"afterok:{third}", "--wrap", "true")
    on_failure = cluster.sbatch("-o", "/dev/null", "-d", f"afternotok:{third}", "--wrap", "true")
    cluster.wait_job_state(on_failure, "COMPLETED", 60)
    runs = {tag: (s, e) for _, tag, s, e in records(log)}
    assert runs["a"][1] <= runs["b"][0] and runs["b"][1] <= runs["c"][0]
    assert cluster.job(third)["state"] == "FAILED"
    waiting = wait_for(lambda: (j := cluster.job(child)) and j["reason"] == "DependencyNeverSatisfied" and j, 30,
                       "the child to be never satisfied")
    assert waiting["state"] == "PENDING"
    line = cluster.gpuctl("squeue", "-h", "-j", str(child), "-o", "%i %t %r").stdout.strip()
    assert line == f"{child} PD DependencyNeverSatisfied"
    r = cluster.gpuctl("sbatch", "-d", "afterok:987654", "--wrap", "true", check=False)
    assert (r.returncode, r.stderr.strip()) == (1, "sbatch: error: Batch job submission failed: "
                                                   "Job dependency problem: no job 987654")


def test_wait_returns_the_jobs_exit_code(cluster):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    r = cluster.gpuctl("sbatch", "--wait", "-o", "/dev/null", "--wrap", "sleep 0.2; exit 7", check=False)
    assert r.returncode == 7 and r.stdout.startswith("Submitted batch job ")
    r = cluster.gpuctl("sbatch", "-W", "--parsable", "-o", "/dev/null", "--wrap", "true", check=False)
    assert r.returncode == 0 and r.stdout.strip().isdigit()
    r = cluster.gpuctl("sbatch", "-W", "-a", "0-2", "-o", "/dev/null", "--wrap",
                       'exit "$GPUD_ARRAY_TASK_ID"', check=False)
    assert r.returncode == 2    # the highest of the tasks'


def test_cron_style_submissions_never_stack_up(cluster, tmp_path):
    """Overlapping 'cron' runs of sbatch --skip-if-active: never two nightly jobs active."""
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    log = tmp_path / "runs.log"
    ids: list[int] = []
    stop = threading.Event()

    def cron_line() -> None:       # one crontab line firing every few seconds, runs overlapping
        while not stop.is_set():
            r = cluster.gpuctl("sbatch", "--parsable", "--skip-if-active", "-J", "nightly", "-o", "/dev/null",
                               "--wrap", RECORD.format(sleep="1.5", tag="n", log=log), check=False, timeout=60)
            if r.returncode == 0:
                ids.append(int(r.stdout))
            stop.wait(0.3)

    threads = [threading.Thread(target=cron_line) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: len(records(log)) >= 4, 120, "several nightly runs")
    stop.set()
    for t in threads:
        t.join(60)
    distinct = sorted(set(ids))
    jobs = wait_for(lambda: (js := cluster.jobs()) and all(js[i]["state"] in TERMINAL for i in distinct) and js,
                    60, "the nightly jobs to end")
    assert len(ids) > len(distinct) >= 4        # most firings found one active and submitted nothing
    spans = sorted((jobs[i]["submit_time"], jobs[i]["end_time"]) for i in distinct)
    assert most_at_once(spans) == 1, spans      # from submission to end, one at a time
    assert most_at_once([(s, e) for _, _, s, e in records(log)]) == 1


def test_scrontab_fires_once_per_minute_across_a_head_restart(cluster, tmp_path):
    tick = 2.0                                   # a scrontab "minute" of 2 s for this test
    head_setting(cluster, f'cron_tick = "{tick}s"')
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    log = tmp_path / "ticks.log"
    crontab = tmp_path / "crontab"
    crontab.write_text(f"#SCRON -J tick -o /dev/null\n* * * * * {RECORD.format(sleep='0', tag='t', log=log)}\n")
    cluster.gpuctl("scrontab", str(crontab))
    assert cluster.gpuctl("scrontab", "-l").stdout == crontab.read_text()
    wait_for(lambda: len(records(log)) >= 3, 60, "three runs")
    cluster.stop(cluster.head, signal.SIGKILL)
    cluster.start_head()
    before = len(records(log))
    wait_for(lambda: len(records(log)) >= before + 3, 60, "three more runs after the restart")
    cluster.gpuctl("scrontab", "-r")
    runs = cluster.jobs()
    ticks = [j for j in runs.values() if j["name"] == "tick"]
    slots = [int(j["submit_time"] // tick) for j in ticks]
    assert len(slots) == len(set(slots)), sorted(slots)    # never twice in one slot
    assert len(ticks) >= 6
    assert all(j["cron_entry"] for j in ticks)


# -- scontrol: owners versus admins, with real users ------------------------------------------------------

@pytest.fixture
def world_dir():
    d = tempfile.mkdtemp(prefix="gpud-slurm-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_scontrol_update_rules_for_owners_and_admins(world_dir, mosquitto):  # noqa: F811
    import gpuctl.commands.scontrol  # noqa: F401  (loaded before gpuctl_as drops privileges)

    with temp_users(3) as (alice, bob, boss), Cluster(os.path.join(world_dir, "c"), mosquitto.url) as c:
        c.config.write_text(c.config.read_text().replace("[head]\n", f'[head]\nadmins = ["{boss.name}"]\n', 1))
        c.start_head()
        c.start_worker("w1", "4xH100-80GB")
        home = os.path.join(world_dir, alice.name)
        os.mkdir(home)
        os.chown(home, alice.uid, alice.gid)

        def as_(user, *args):
            return gpuctl_as(user, list(args), c.socket, cwd=home)

        rc, out, err = as_(alice, "sbatch", "--parsable", "-H", "-t", "60", "--wrap", "sleep 60")
        assert rc == 0, err
        job = out.strip()

        def check(user, args, code, message=""):
            rc, out, err = as_(user, "scontrol", *args)
            assert rc == code, (args, err)
            assert message in err, (args, err)

        check(alice, ["update", "job", job, "TimeLimit=30"], 0)                 # the owner lowers
        check(alice, ["update", "job", job, "TimeLimit=90"], 1, "only root or an admin may raise a time limit")
        check(bob, ["update", "job", job, "TimeLimit=10"], 1, "Access/permission denied")
        check(boss, ["update", "job", job, "TimeLimit=120"], 0)                 # an admin raises
        check(alice, ["update", "job", job, "Nice=10"], 0)
        check(alice, ["update", "job", job, "Nice=-10"], 1, "only root or an admin may lower a nice value")
        check(boss, ["update", "job", job, "Nice=-10"], 0)
        check(bob, ["hold", job], 1, "Access/permission denied")
        check(alice, ["hold", job], 0)                                           # still a user hold
        check(boss, ["hold", job], 0)                                            # now an admin hold
        assert "Reason=JobHeldAdmin" in c.gpuctl("scontrol", "show", "job", job).stdout
        check(alice, ["release", job], 1, "held by an administrator")
        check(boss, ["uhold", job], 0)                                           # back to a user hold
        check(alice, ["update", "node", "w1", "State=DRAIN", "Reason=mine"], 1, "only root and the users")
        check(boss, ["update", "node", "w1", "State=DRAIN", "Reason=maintenance"], 0)
        assert c.node_state("w1") == "DRAIN"
        check(boss, ["update", "node", "w1", "State=RESUME"], 0)
        shown = c.gpuctl("scontrol", "show", "job", job).stdout
        assert "TimeLimit=02:00:00" in shown and "Nice=-10" in shown and "Reason=JobHeldUser" in shown
        history = c.gpuctl("sacct", "-a", "-j", job, "-P", "-n", "-o", "JobID,Timelimit").stdout.strip()
        assert history == f"{job}|02:00:00"
        check(alice, ["release", job], 0)
        c.wait_job_state(int(job), "RUNNING", 30)
        check(alice, ["update", "job", job, "TimeLimit=180"], 1, "only root or an admin may raise a time limit")
        check(boss, ["update", "job", job, "TimeLimit=180"], 0)                 # a running job's too
        assert "TimeLimit=03:00:00" in c.gpuctl("scontrol", "show", "job", job).stdout
        c.gpuctl("scancel", job)


def test_gpuctl_needs_no_terminal(cluster):
    """From cron: no prompts, no colour; stdin closed is fine."""
    cluster.start_head()
    cmd = [sys.executable, "-m", "gpuctl.main", "--socket", cluster.socket, "squeue"]
    r = subprocess.run(cmd, env=cluster.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "\x1b[" not in r.stdout + r.stderr
    cmd = [sys.executable, "-m", "gpuctl.main", "--socket", cluster.socket, "scrontab", "-e"]
    r = subprocess.run(cmd, env=cluster.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs a terminal" in r.stderr
