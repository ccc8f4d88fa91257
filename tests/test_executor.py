"""The job executor against real processes: bash jobs, process groups, restarts, users.

Nothing here sleeps to synchronise: tests wait for conditions (a line in an output file, an
outcome) with a timeout, and time limits run on an injected clock that the test advances.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid

import psutil
import pytest

from gpud.worker import wrappers
from gpud.worker.executor import Executor, GpuAssignment, Launch, Outcome, output_path, parse_signal

WAIT = 30.0  # seconds before a condition that should hold counts as failed (generous: loaded CI hosts)


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


async def until(pred, timeout: float = WAIT, what: str = "condition"):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = pred()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def read(path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def my_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return out


class Harness:
    """Executors on one state_dir, recording what they report; cleans up after the test."""

    def __init__(self, tmp_path) -> None:
        self.state_dir = str(tmp_path / "state")
        self.work_dir = tmp_path / "work"
        self.work_dir.mkdir()
        self.started: list[tuple[int, int, int, float]] = []
        self.finished: list[Outcome] = []
        self.executors: list[Executor] = []

    def executor(self, **kw) -> Executor:
        kw.setdefault("poll_interval", 0.05)
        if "clock" in kw:       # time limits run on the monotonic clock: the test's drives both
            kw.setdefault("mono", kw["clock"])

        async def on_finished(outcome: Outcome) -> None:  # async: both kinds are supported
            self.finished.append(outcome)

        ex = Executor(self.state_dir, "node7", on_started=lambda *a: self.started.append(a),
                      on_finished=on_finished, **kw)
        self.executors.append(ex)
        return ex

    def launch(self, script: str, job_id: int = 1, **kw) -> Launch:
        body = {"job_id": job_id, "attempt": 0, "name": "train", "user": my_name(),
                "uid": os.getuid(), "gid": os.getgid(), "script": script,
                "work_dir": str(self.work_dir), "env": {"PATH": os.defpath}, "kill_grace": 30}
        body.update(kw)
        return Launch.from_body(body)

    def pid(self, job_id: int, attempt: int = 0) -> int:
        return next(p for j, a, p, _ in self.started if (j, a) == (job_id, attempt))

    async def outcome(self, job_id: int, attempt: int = 0) -> Outcome:
        def found() -> Outcome | None:
            return next((o for o in self.finished if (o.job_id, o.attempt) == (job_id, attempt)), None)

        return await until(found, what=f"the outcome of job {job_id}")

    async def output(self, name: str, text: str) -> str:
        path = self.work_dir / name
        return await until(lambda: text in read(path) and read(path), what=f"{text!r} in {name}")

    async def cleanup(self) -> None:
        for ex in self.executors:
            await ex.close()
        for _, _, pid, _ in self.started:
            try:  # only a wrapper of ours that is still there: never a recycled pid
                if wrappers.WRAPPER in psutil.Process(pid).cmdline():
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, psutil.Error):
                pass
        wrappers.reap_detached()


@pytest.fixture
async def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    await harness.cleanup()


# -- launch bodies ----------------------------------------------------------------------------

def test_launch_body_round_trip_and_defaults(tmp_path):
    h = Harness(tmp_path)
    launch = h.launch("true", gpus=[{"index": 2, "uuid": "GPU-x"}], time_limit=60, extra_env={"A": "1"})
    assert Launch.from_body(launch.to_body()) == launch
    assert launch.gpus == (GpuAssignment(2, "GPU-x"),)
    assert launch.submit_dir == launch.work_dir and launch.stdout is None and launch.cpus == 1
    older = launch.to_body()
    older["job"] = older.pop("job_id")  # the bus docs' name for the same key
    assert Launch.from_body(older) == launch


@pytest.mark.parametrize("change, words", [
    ({"job_id": "7"}, "job_id must be an integer"),
    ({"uid": -1}, "uid must be an integer"),
    ({"attempt": True}, "attempt must be an integer"),
    ({"script": ""}, "script must be a non-empty string"),
    ({"user": None}, "user is missing"),
    ({"work_dir": "relative/dir"}, "work_dir must be an absolute path"),
    ({"env": {"A=B": "x"}}, "env must map variable names"),
    ({"env": ["A"]}, "env must be an object"),
    ({"gpus": [{"index": 0}]}, "gpu uuid"),
    ({"gpus": [{"index": 0, "uuid": "a"}, {"index": 0, "uuid": "b"}]}, "index twice"),
    ({"time_limit": 0}, "time_limit must be a positive number"),
    ({"kill_grace": float("nan")}, "kill_grace must be a non-negative number"),
    ({"stdout": "a\x00b"}, "stdout must be a non-empty string"),
])
def test_malformed_launch_bodies_are_refused_in_one_line(tmp_path, change, words):
    body = Harness(tmp_path).launch("true").to_body()
    body.update(change)
    with pytest.raises(ValueError) as err:
        Launch.from_body(body)
    assert words in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="launch body must be an object"):
        Launch.from_body(["not", "a", "dict"])  # type: ignore[arg-type]


def test_output_path_expansion(tmp_path):
    launch = Harness(tmp_path).launch("true", job_id=42, name="bert")
    wd = launch.work_dir
    assert output_path(None, launch, "n1") == f"{wd}/gpud-42.out"
    assert output_path("logs/%x-%j.%u@%N", launch, "n1") == f"{wd}/logs/bert-42.{launch.user}@n1"
    assert output_path("/abs/%%j-%6j-%q", launch, "n1") == "/abs/%j-000042-%q"


def test_parse_signal():
    assert parse_signal("TERM") == signal.SIGTERM == parse_signal("sigterm") == parse_signal(15)
    assert parse_signal("USR1") == signal.SIGUSR1 == parse_signal("10")
    assert parse_signal("NOPE") is None and parse_signal(True) is None and parse_signal(999) is None


# -- running jobs ---------------------------------------------------------------------------------

async def test_job_environment_stdin_and_process_group(h, monkeypatch):
    monkeypatch.setenv("GPUD_WORKER_ONLY", "leak")
    ex = h.executor()
    await ex.start()
    script = """
echo "CVD=$CUDA_VISIBLE_DEVICES"
echo "ORDER=$CUDA_DEVICE_ORDER"
for v in GPUD_JOB_ID GPUD_JOB_NAME GPUD_NODENAME GPUD_SUBMIT_DIR GPUD_GPUS GPUD_JOB_ATTEMPT \
         FROM_SUBMIT MPS USER LOGNAME HOME; do
  echo "$v=${!v}"
done
echo "LEAK=${GPUD_WORKER_ONLY-unset}"
read -r line; echo "read=$?"
echo "stdin=$(readlink /proc/$$/fd/0)"
read -ra st < /proc/$$/stat; echo "pgid=${st[4]} sid=${st[5]}"
echo "cwd=$PWD"
"""
    gpus = [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 3, "uuid": "MIG-bbbb"}]
    await ex.launch(h.launch(script, job_id=5, attempt=2, gpus=gpus, submit_dir="/submit",
                             env={"PATH": os.defpath, "FROM_SUBMIT": "yes", "MPS": "mine"},
                             extra_env={"MPS": "extra wins"}))
    outcome = await h.outcome(5, 2)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("exited", 0, None)
    lines = dict(line.split("=", 1) for line in read(h.work_dir / "gpud-5.out").splitlines())
    pw = pwd.getpwuid(os.getuid())
    pid = h.pid(5, 2)
    assert lines == {
        "CVD": "GPU-aaaa,MIG-bbbb", "ORDER": "PCI_BUS_ID", "GPUD_JOB_ID": "5", "GPUD_JOB_NAME": "train",
        "GPUD_NODENAME": "node7", "GPUD_SUBMIT_DIR": "/submit", "GPUD_GPUS": "0,3",
        "GPUD_JOB_ATTEMPT": "2", "FROM_SUBMIT": "yes", "MPS": "extra wins", "USER": pw.pw_name,
        "LOGNAME": pw.pw_name, "HOME": pw.pw_dir, "LEAK": "unset", "read": "1",
        "stdin": "/dev/null", "pgid": f"{pid} sid={pid}", "cwd": str(h.work_dir),
    }


async def test_no_gpus_hides_every_gpu(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch('echo "[${CUDA_VISIBLE_DEVICES-unset}] [$GPUD_GPUS]"'))
    await h.outcome(1)
    assert read(h.work_dir / "gpud-1.out") == "[] []\n"


async def test_output_files_patterns_separate_stderr_and_truncation(h):
    ex = h.executor()
    await ex.start()
    (h.work_dir / "logs").mkdir()
    (h.work_dir / "err-0042.log").write_text("old content that must go\n" * 10)
    await ex.launch(h.launch("echo to-out; echo to-err >&2", job_id=42, name="bert",
                             stdout="logs/%x-%j-%N.out", stderr="err-%4j.log"))
    assert (await h.outcome(42)).exit_code == 0
    assert read(h.work_dir / "logs/bert-42-node7.out") == "to-out\n"
    assert read(h.work_dir / "err-0042.log") == "to-err\n"
    await ex.launch(h.launch("echo both; echo both-err >&2", job_id=43, stdout=str(h.work_dir / "j%j")))
    await h.outcome(43)
    assert read(h.work_dir / "j43") == "both\nboth-err\n"


@pytest.mark.parametrize("script, exit_code, sig", [
    ("exit 42", 42, None),
    ("exit 143", 143, None),              # an exit code above 128 is not a signal
    ("ulimit -c 0; kill -SEGV $$", 0, signal.SIGSEGV),
])
async def test_exit_code_and_signal(h, script, exit_code, sig):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch(script))
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("exited", exit_code, sig)
    assert outcome.start_time is not None and outcome.end_time >= outcome.start_time
    body = outcome.finished().to_body()
    assert body == {"job": 1, "attempt": 0, "exit_code": exit_code, "signal": sig, "reason": "exited",
                    "time": outcome.end_time, "message": outcome.message}
    assert ex.running() == [] and ex.outcomes() == [outcome]


async def test_time_limit_sends_term_then_kill_after_grace(h):
    clock = FakeClock()
    ex = h.executor(clock=clock)
    await ex.start()
    script = "trap 'echo got TERM' TERM\necho ready\nwhile :; do sleep 0.05; done\n"
    await ex.launch(h.launch(script, time_limit=60, kill_grace=5))
    await h.output("gpud-1.out", "ready")
    clock.advance(61)  # past the limit: TERM, which the job traps and survives
    await h.output("gpud-1.out", "got TERM")
    assert ex.running() == [(1, 0)] and h.finished == []
    clock.advance(6)  # past the grace: SIGKILL
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("timeout", 0, signal.SIGKILL)
    assert "time limit of 00:01:00 reached" in outcome.message
    assert group_members(h.pid(1)) == []


async def test_cancel_kills_the_whole_tree(h):
    ex = h.executor()
    await ex.start()
    script = """
sleep 1000 &
bash -c 'trap "" TERM; echo stubborn-ready; sleep 1000' &
sleep 1000 &
echo all-started
wait
"""
    await ex.launch(h.launch(script))
    await h.output("gpud-1.out", "stubborn-ready")
    await h.output("gpud-1.out", "all-started")
    pgid = h.pid(1)
    assert len(group_members(pgid)) >= 5  # wrapper, bash, three children (and their sleeps)
    assert await ex.signal(1, 0)  # TERM, then SIGKILL only after the 30 s grace
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("cancelled", 0, signal.SIGTERM)
    # The batch script is gone, so nothing of the job may stay, not even what ignores TERM.
    assert group_members(pgid) == []
    assert not await ex.signal(1, 0) and not await ex.kill(1, 0)


async def test_cancel_while_launching_is_not_lost(h):
    ex = h.executor()
    await ex.start()
    launching = asyncio.create_task(ex.launch(h.launch("echo ready; sleep 1000", kill_grace=3600)))
    await until(lambda: ex.running() == [(1, 0)], what="the launch to begin")
    assert await ex.signal(1, 0, "TERM", reason="cancelled")  # before the wrapper exists
    await launching
    # Ends at once: the TERM was neither dropped nor swallowed while the job was starting.
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("cancelled", 0, signal.SIGTERM)


async def test_fencing_kill_is_immediate(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("trap '' TERM; sleep 1000 & echo ready; wait"))
    await h.output("gpud-1.out", "ready")
    assert await ex.kill(1, 0, reason="killed")
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("killed", 0, signal.SIGKILL)
    assert group_members(h.pid(1)) == []


async def test_plain_signal_is_delivered_without_stopping_the_job(h):
    ex = h.executor()
    await ex.start()
    script = "trap 'echo got USR1; exit 0' USR1\necho ready\nwhile :; do sleep 0.05; done\n"
    await ex.launch(h.launch(script))
    await h.output("gpud-1.out", "ready")
    assert not await ex.signal(1, 0, sig="NOSUCHSIG", reason="signal")
    assert await ex.signal(1, 0, sig="USR1", reason="signal")
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("exited", 0, None)
    assert "got USR1" in read(h.work_dir / "gpud-1.out")


async def test_launch_is_idempotent_through_finish_ack_and_restart(h):
    ex = h.executor()
    await ex.start()
    launch = h.launch("echo once")
    await asyncio.gather(ex.launch(launch), ex.launch(launch))
    await h.outcome(1)
    await ex.launch(launch)          # finished, not acknowledged
    assert len(h.started) == 1 and len(ex.outcomes()) == 1
    ex.ack(1, 0)
    assert ex.outcomes() == []
    await ex.launch(launch)          # acknowledged, files not yet written: the directory remembers
    await ex.settle()
    assert not os.path.exists(os.path.join(h.state_dir, "jobs", "1.0"))
    await ex.launch(launch)          # acknowledged: the tombstone remembers
    await ex.close()
    again = h.executor()
    await again.start()
    await again.launch(launch)       # and so does a new executor on the same state
    assert len(h.started) == 1 and read(h.work_dir / "gpud-1.out") == "once\n"
    assert again.running() == [] and again.outcomes() == []


async def test_outcomes_survive_a_restart_until_acked(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("exit 3"))
    first = await h.outcome(1)
    await ex.close()
    again = h.executor()
    await again.start()
    assert again.outcomes() == [first]
    again.ack(1, 0)
    await again.settle()
    third = h.executor()
    await third.start()
    assert third.outcomes() == []


# -- restarts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
async def test_restarted_executor_adopts_a_running_job(h, pidfd):
    ex = h.executor()
    ex._wrappers.use_pidfd = pidfd
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 7"))
    await h.output("gpud-1.out", "ready")
    await ex.close()
    assert psutil.pid_exists(h.pid(1)), "closing the executor must not kill its jobs"
    again = h.executor()
    again._wrappers.use_pidfd = pidfd
    await again.start()
    assert again.running() == [(1, 0)] and h.finished == []
    (h.work_dir / "go").touch()
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("exited", 7, None)
    assert again.running() == [] and again.outcomes() == [outcome]


async def test_adopted_job_keeps_its_time_limit(h):
    clock = FakeClock()
    ex = h.executor(clock=clock)
    await ex.start()
    await ex.launch(h.launch("echo ready; sleep 1000", time_limit=100, kill_grace=5))
    await h.output("gpud-1.out", "ready")
    await ex.close()
    again = h.executor(clock=clock)
    await again.start()
    clock.advance(101)
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.signal) == ("timeout", signal.SIGTERM)
    assert group_members(h.pid(1)) == []


async def test_job_spawned_just_before_a_crash_is_found_by_its_wrapper_pid(h):
    clock = FakeClock()
    ex = h.executor(clock=clock)
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 4", time_limit=50))
    await h.output("gpud-1.out", "ready")
    await ex.close()
    record_path = os.path.join(h.state_dir, "jobs", "1.0", "record.json")
    with open(record_path) as f:
        record = json.load(f)
    with open(record_path, "w") as f:  # the record as it was before the spawn
        json.dump(dict(record, pid=None, create_time=None, start_time=None, deadline=None), f)
    again = h.executor(clock=clock)
    await again.start()
    assert again.running() == [(1, 0)]
    with open(record_path) as f:
        assert json.load(f)["deadline"] == clock() + 50  # the time limit holds from adoption
    (h.work_dir / "go").touch()
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code) == ("exited", 4)


async def test_job_that_ended_unwatched_reports_its_exit_code(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 3"))
    await h.output("gpud-1.out", "ready")
    await ex.close()
    pid = h.pid(1)
    (h.work_dir / "go").touch()
    await until(lambda: group_members(pid) == [], what="the job to end")
    again = h.executor()
    await again.start()
    # Finished during start(): ready for the daemon's first heartbeat.
    [outcome] = again.outcomes()
    assert (outcome.reason, outcome.exit_code) == ("exited", 3)
    assert h.finished == [outcome]


async def test_job_killed_unwatched_without_status_is_lost(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo ready; sleep 1000"))
    await h.output("gpud-1.out", "ready")
    await ex.close()
    os.killpg(h.pid(1), signal.SIGKILL)  # e.g. the OOM killer while no worker ran
    await until(lambda: group_members(h.pid(1)) == [], what="the group to die")
    again = h.executor()
    await again.start()
    [outcome] = again.outcomes()
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("lost", None, None)


async def test_unreadable_record_is_reported_lost(h):
    ex = h.executor()
    await ex.start()
    os.makedirs(os.path.join(h.state_dir, "jobs", "9.1"))
    with open(os.path.join(h.state_dir, "jobs", "9.1", "record.json"), "w") as f:
        f.write("{not json")
    os.makedirs(os.path.join(h.state_dir, "jobs", "not-a-job"))
    await ex.close()
    again = h.executor()
    await again.start()
    assert [(o.job_id, o.attempt, o.reason) for o in again.outcomes()] == [(9, 1, "lost")]


# -- launch failures ------------------------------------------------------------------------------

async def test_missing_work_dir_is_a_launch_failure(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo never", work_dir="/nonexistent/gpud-test"))
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("launch_failed", None, None)
    assert outcome.message == ("cannot change to working directory /nonexistent/gpud-test: "
                               "No such file or directory")


async def test_unwritable_output_is_a_launch_failure(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo never", stderr="no/such/dir/err.txt"))
    outcome = await h.outcome(1)
    assert outcome.reason == "launch_failed"
    assert outcome.message == (f"cannot open output file {h.work_dir}/no/such/dir/err.txt: "
                               "No such file or directory")


async def test_missing_shell_is_a_launch_failure(h):
    ex = h.executor(shell="/nonexistent/bash")
    await ex.start()
    await ex.launch(h.launch("echo never"))
    outcome = await h.outcome(1)
    assert outcome.reason == "launch_failed"
    assert outcome.message == "cannot run /nonexistent/bash: No such file or directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker switches users")
async def test_unknown_user_is_a_launch_failure(h):
    ex = h.executor()
    await ex.start()
    free_uid = next(u for u in range(3_900_000_000, 3_900_001_000) if not _uid_exists(u))
    await ex.launch(h.launch("echo never", user="ghost", uid=free_uid))
    outcome = await h.outcome(1)
    assert outcome.reason == "launch_failed"
    assert outcome.message.startswith(f"user ghost (uid {free_uid}) does not exist on node node7")
    assert h.started == []


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


# -- users ----------------------------------------------------------------------------------------

@pytest.fixture
def job_user():
    """A throwaway user with a supplementary group, and a directory tree it can use."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a user and run a job as that user")
    if not shutil.which("useradd"):
        pytest.skip("useradd is not installed")
    tag = uuid.uuid4().hex[:8]
    name, extra = f"gpudt{tag}", f"gpudg{tag}"
    subprocess.run(["groupadd", extra], check=True)
    try:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--groups", extra,
                        "--home-dir", f"/nonexistent/{name}", "--shell", "/bin/bash", name], check=True)
        base = tempfile.mkdtemp(prefix="gpud-user-test-", dir="/tmp")
        try:
            os.chmod(base, 0o711)  # job users reach state/jobs/<id>/script by path
            pw = pwd.getpwnam(name)
            os.mkdir(os.path.join(base, "work"))
            os.chown(os.path.join(base, "work"), pw.pw_uid, pw.pw_gid)
            yield pw, subprocess.run(["getent", "group", extra], capture_output=True, text=True,
                                     check=True).stdout.split(":")[2], base
        finally:
            shutil.rmtree(base, ignore_errors=True)
            subprocess.run(["userdel", name], check=False)
    finally:
        subprocess.run(["groupdel", extra], check=False)


async def test_job_runs_as_its_user_with_its_groups(job_user, tmp_path):
    pw, extra_gid, base = job_user
    h = Harness(tmp_path)
    h.state_dir = os.path.join(base, "state")
    h.work_dir = pathlib.Path(base, "work")
    try:
        ex = h.executor()
        await ex.start()
        script = ('echo "uid=$(id -u)"; echo "gid=$(id -g)"; echo "groups=$(id -G)"; '
                  'echo "user=$USER"; echo "home=$HOME"; touch made-by-job')
        await ex.launch(h.launch(script, user=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid))
        outcome = await h.outcome(1)
        assert (outcome.reason, outcome.exit_code) == ("exited", 0), outcome.message
        out = h.work_dir / "gpud-1.out"
        seen = dict(line.split("=", 1) for line in read(out).splitlines())
        assert seen == {"uid": str(pw.pw_uid), "gid": str(pw.pw_gid), "groups": seen["groups"],
                        "user": pw.pw_name, "home": pw.pw_dir}
        assert set(seen["groups"].split()) == {str(pw.pw_gid), extra_gid}
        for made in (out, h.work_dir / "made-by-job"):
            st = os.stat(made)
            assert (st.st_uid, st.st_gid) == (pw.pw_uid, pw.pw_gid)
        # Output the user may not write is refused with the user's permissions, not root's.
        await ex.launch(h.launch("echo never", job_id=2, user=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid,
                                 stdout=os.path.join(base, "not-yours.out")))
        refused = await h.outcome(2)
        assert refused.reason == "launch_failed"
        assert refused.message == f"cannot open output file {base}/not-yours.out: Permission denied"
        # And a uid whose name differs on this node is refused rather than run as someone else.
        await ex.launch(h.launch("echo never", job_id=3, user="not-" + pw.pw_name, uid=pw.pw_uid,
                                 gid=pw.pw_gid))
        assert "make the user databases agree" in (await h.outcome(3)).message
    finally:
        await h.cleanup()


async def test_unprivileged_worker_runs_jobs_as_itself(h, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # what a non-root worker sees
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch('echo "uid=$(id -u) user=$USER"', user="somebody", uid=54321, gid=54321))
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code) == ("exited", 0), outcome.message
    assert read(h.work_dir / "gpud-1.out") == f"uid={os.getuid()} user={my_name()}\n"


# -- the wrapper on its own -----------------------------------------------------------------------

def test_wrapper_passes_on_a_signal_that_came_before_the_job(tmp_path):
    script = tmp_path / "script"
    script.write_text("echo ran\n")
    spec = {"user": "x", "uid": 0, "gid": 0, "groups": [], "switch_user": False,
            "work_dir": str(tmp_path), "stdout": str(tmp_path / "out"), "stderr": str(tmp_path / "out"),
            "shell": "/bin/bash", "script": str(script), "env": {}}
    code = ("import json, signal, sys; sys.path.insert(0, sys.argv[1]); import jobwrap; "
            "jobwrap.RECEIVED.append(signal.SIGTERM); "
            "print(json.dumps(jobwrap.run(json.loads(sys.argv[2]))))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, os.path.dirname(wrappers.WRAPPER),
                           json.dumps(spec)], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == {"exit_code": 0, "signal": signal.SIGTERM, "core": False}, \
        done.stderr
    assert not (tmp_path / "out").exists()  # the job never started


async def test_a_burst_of_jobs_leaves_no_descriptors_behind(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("true", job_id=1))   # the fork server is up before counting
    await h.outcome(1)
    before = len(os.listdir("/proc/self/fd"))
    await asyncio.gather(*(ex.launch(h.launch("true", job_id=j)) for j in range(2, 12)))
    for j in range(2, 12):
        await h.outcome(j)
        ex.ack(j, 0)
    await ex.settle()
    assert len(os.listdir("/proc/self/fd")) <= before
