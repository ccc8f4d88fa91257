"""Job wrappers forked by the wrapper server (gpud.worker.forkserver, jobwrap.py --serve),
against real processes."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from gpud.worker import wrappers
from gpud.worker.forkserver import ForkServer
from tests.test_executor import Harness, group_members, until

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the kernel has no pidfds")


@pytest.fixture
async def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    await harness.cleanup()


def server_of(ex) -> psutil.Process:
    assert ex._wrappers.server is not None and ex._wrappers.server.proc is not None
    return psutil.Process(ex._wrappers.server.proc.pid)


async def test_wrappers_are_children_of_one_server_in_sessions_of_their_own(h):
    ex = h.executor()
    await ex.start()
    for job_id in (1, 2):
        await ex.launch(h.launch("echo ready; read -t 30 x < /dev/zero; exit 7", job_id=job_id))
        await h.output(f"gpud-{job_id}.out", "ready")
    server = server_of(ex)
    pids = [h.pid(1), h.pid(2)]
    assert {psutil.Process(p).ppid() for p in pids} == {server.pid}
    assert all(os.getsid(p) == p and os.getpgid(p) == p for p in pids)  # session and group leaders
    assert wrappers.WRAPPER in server.cmdline() and "--serve" in server.cmdline()
    for p in pids:
        os.killpg(p, signal.SIGTERM)
    for job_id in (1, 2):  # the status the wrapper wrote, not the server's view
        outcome = await h.outcome(job_id)
        assert (outcome.exit_code, outcome.signal) == (0, signal.SIGTERM)


async def test_a_dead_server_is_started_again(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("exit 3", job_id=1))
    assert (await h.outcome(1)).exit_code == 3
    first = server_of(ex)
    first.kill()
    first.wait(10)
    await ex.launch(h.launch("exit 4", job_id=2))
    assert (await h.outcome(2)).exit_code == 4
    assert server_of(ex).pid != first.pid


async def test_without_a_server_the_wrapper_is_started_directly(h, caplog):
    ex = h.executor()
    ex._wrappers.server = ForkServer("/nonexistent/python3", wrappers.WRAPPER, wrappers.WRAPPER_ENV)
    await ex.start()
    await ex.launch(h.launch("exit 5"))
    assert (await h.outcome(1)).exit_code == 5
    assert "the job wrapper server failed" in caplog.text


async def test_closing_ends_the_server_and_the_jobs_run_on(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 6"))
    await h.output("gpud-1.out", "ready")
    server = server_of(ex)
    await ex.close()
    await until(lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE,
                what="the server to exit")
    wrappers.reap_detached()
    assert group_members(h.pid(1))  # the job is still there
    again = h.executor()
    await again.start()
    assert again.running() == [(1, 0)]
    (h.work_dir / "go").touch()
    assert (await h.outcome(1)).exit_code == 6


async def test_a_stop_right_after_the_launch_reaches_the_job(h):
    ex = h.executor()
    await ex.start()
    await ex.launch(h.launch("echo ready; sleep 1000", kill_grace=3600))
    assert await ex.signal(1, 0, "TERM", reason="cancelled")  # maybe before bash even starts
    outcome = await h.outcome(1)
    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("cancelled", 0, signal.SIGTERM)
