"""MPS control daemons: lifecycle with the stub, the rules MPS imposes, and the real runner
against a stand-in ``nvidia-cuda-mps-control`` that records how it was called."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import tempfile
import textwrap

import pytest

from gpud.gpu.mps import ControlDaemonRunner, MpsDaemons, MpsError, StubRunner
from gpud.model import GpuInfo
from tests.users import needs_root, temp_users

H100 = GpuInfo(index=3, uuid="GPU-h100", model="H100-80GB", memory_mb=81920, mode="mps",
               mps_thread_percentage=25)
MB_20G = 20 * 1024


def daemons(tmp_path, runner=None) -> MpsDaemons:
    return MpsDaemons(str(tmp_path / "mps"), runner or StubRunner())


def attach(d: MpsDaemons, job: int, user: str = "alice", gpu: GpuInfo = H100, mem: int | None = MB_20G,
           position: int = 0) -> dict[str, str]:
    return d.attach((job, 1), gpu, position=position, user=user, uid=1000, gid=1000, mem_mb=mem)


def test_first_job_starts_the_daemon_and_gets_the_environment(tmp_path):
    d = daemons(tmp_path)
    env = attach(d, 1)
    pipe = str(tmp_path / "mps" / "3" / "pipe")
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M"}
    assert d.runner.events == [("start", 3, "alice")]
    assert os.path.isdir(pipe) and stat.S_IMODE(os.stat(pipe).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "mps").st_mode) == 0o711


def test_four_shares_of_one_user_share_one_daemon_and_a_fifth_does_not_fit(tmp_path):
    d = daemons(tmp_path)
    for job in range(1, 5):
        attach(d, job)
    assert d.runner.events == [("start", 3, "alice")]
    assert d.clients(3) == 4 and d.user_of(3) == "alice"
    with pytest.raises(MpsError, match="would add up to 102400 MB; it has 81920 MB"):
        attach(d, 5)


def test_another_user_waits_until_the_first_users_jobs_leave(tmp_path):
    d = daemons(tmp_path)
    attach(d, 1)
    attach(d, 2)
    with pytest.raises(MpsError, match="serves MPS jobs of alice; one user at a time"):
        attach(d, 3, user="bob")
    d.sync([(2, 1)])                     # job 1 ended: alice still has job 2
    assert d.runner.events == [("start", 3, "alice")]
    d.sync([])                           # the GPU is free: the daemon stops
    assert d.user_of(3) is None
    attach(d, 3, user="bob")
    assert d.runner.events == [("start", 3, "alice"), ("stop", 3, "alice"), ("start", 3, "bob")]


def test_client_limit(tmp_path):
    d = daemons(tmp_path)
    small = GpuInfo(index=0, uuid="GPU-a", model="A30-24GB", memory_mb=24576, mode="mps", mps_max_clients=2)
    attach(d, 1, gpu=small, mem=None)
    attach(d, 2, gpu=small, mem=None)
    with pytest.raises(MpsError, match="has 2 MPS clients, its limit"):
        attach(d, 3, gpu=small, mem=None)


def test_repeat_and_position(tmp_path):
    d = daemons(tmp_path)
    first = attach(d, 1, position=2)
    assert first["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "2=20480M"
    assert attach(d, 1, position=2) == first          # a repeated launch changes nothing
    assert d.clients(3) == 1 and len(d.runner.events) == 1
    no_limit = attach(d, 2, mem=None)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in no_limit


def test_adopted_clients_start_nothing_and_stop_their_daemon_when_gone(tmp_path):
    d = daemons(tmp_path)
    d.adopt((7, 1), H100, user="carol", uid=1001, gid=1001, mem_mb=MB_20G)
    assert d.runner.events == [] and d.user_of(3) == "carol"
    with pytest.raises(MpsError, match="of carol"):
        attach(d, 8, user="dave")
    d.sync([])
    assert d.runner.events == [("stop", 3, "carol")]


def test_a_daemon_that_does_not_start_leaves_no_record(tmp_path):
    class Failing(StubRunner):
        def start(self, server):
            raise MpsError("boom")

    d = daemons(tmp_path, Failing())
    with pytest.raises(MpsError, match="boom"):
        attach(d, 1)
    assert d.user_of(3) is None


# -- the real runner, with a stand-in command --------------------------------------------------

def fake_control(tmp_path, exit_code: int = 0) -> str:
    """A stand-in for nvidia-cuda-mps-control that appends its call to a log."""
    log = tmp_path / "calls.log"
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        input=""
        [ "$1" = "-d" ] || input=$(cat)
        echo "uid=$(id -u) args=$* input=$input vis=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> {log}
        [ {exit_code} = 0 ] || echo "cannot open the pipe" >&2
        exit {exit_code}
        """))
    script.chmod(0o755)
    log.touch()
    log.chmod(0o666)
    return str(script)


def test_control_daemon_runner_starts_and_quits_with_the_gpus_directories(tmp_path):
    d = daemons(tmp_path, ControlDaemonRunner(fake_control(tmp_path)))
    d.attach((1, 1), H100, position=0, user="root", uid=0, gid=0, mem_mb=None)
    d.sync([])
    pipe, log = tmp_path / "mps" / "3" / "pipe", tmp_path / "mps" / "3" / "log"
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"uid=0 args=-d input= vis=GPU-h100 pipe={pipe} log={log}",
        f"uid=0 args= input=quit vis=GPU-h100 pipe={pipe} log={log}",
    ]


def test_control_daemon_runner_reports_a_failed_start_in_one_line(tmp_path):
    d = daemons(tmp_path, ControlDaemonRunner(fake_control(tmp_path, exit_code=3)))
    with pytest.raises(MpsError) as e:
        d.attach((1, 1), H100, position=0, user="root", uid=0, gid=0, mem_mb=None)
    assert str(e.value) == "GPU 3: the MPS control daemon did not start (exit 3: cannot open the pipe)"


def test_control_daemon_runner_without_the_command(tmp_path):
    d = daemons(tmp_path, ControlDaemonRunner(str(tmp_path / "missing")))
    with pytest.raises(MpsError, match="not found; install the CUDA toolkit's MPS tools"):
        d.attach((1, 1), H100, position=0, user="root", uid=0, gid=0, mem_mb=None)


@pytest.fixture
def open_dir():
    """A directory every user can reach (pytest's tmp_path is root's own)."""
    path = tempfile.mkdtemp(prefix="gpud-mps-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_control_daemon_runs_as_the_jobs_user_with_directories_only_they_reach(open_dir):
    tmp_path = open_dir
    with temp_users(1, extra_group=False) as (user,):
        d = daemons(tmp_path, ControlDaemonRunner(fake_control(tmp_path)))
        d.attach((1, 1), H100, position=0, user=user.name, uid=user.uid, gid=user.gid, mem_mb=None)
        pipe = tmp_path / "mps" / "3" / "pipe"
        st = os.stat(pipe)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.uid, user.gid, 0o700)
        d.sync([])
        calls = (tmp_path / "calls.log").read_text().splitlines()
        assert [c.split()[0] for c in calls] == [f"uid={user.uid}", f"uid={user.uid}"]
