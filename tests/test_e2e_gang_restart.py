"""A part's worker crashes and comes back under a running srun step (real head, Mosquitto,
two sim workers): the part is adopted again and the job keeps running; the orphaned srun
task is killed and srun exits non-zero with the reason instead of waiting forever."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.cluster import wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.test_e2e_gang import GangCluster, _gpuctl, _wrapper_pid, shared_work

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text().lower()
    except OSError:
        return True


def test_a_parts_worker_restart_keeps_the_job_and_ends_the_step_it_orphaned(tmp_path, mosquitto):  # noqa: F811
    work = shared_work(tmp_path)
    # A node timeout well above a worker restart: the node must not be declared lost.
    with GangCluster(tmp_path / "c", mosquitto.url, node_timeout=30.0, heartbeat=0.5) as c:
        c.start_two()
        script = (
            "#!/bin/bash\n"
            f"{_gpuctl(c)} srun sh -c 'echo $$ > {work}/task.$RANK; exec sleep 600' "
            f"> {work}/srun.out 2> {work}/srun.err\n"
            f"echo $? > {work}/srun.rc\n"
            "exec sleep 600\n"
        )
        with c.client() as client:
            job_id = client.submit(script, nodes=2, gpus=4, stdout=f"{work}/job.out", work_dir=str(work))
        job = c.wait_job_state(job_id, "RUNNING", 60)
        part = next(n for n in ("w1", "w5") if n != job["node"])
        wait_for(lambda: all((work / f"task.{r}").exists() and (work / f"task.{r}").read_text().strip()
                             for r in (0, 1)), 60, "both srun tasks")
        orphan = int((work / "task.1").read_text())
        holder = _wrapper_pid(c, part, job_id, job["attempt"])

        c.stop(c.workers[part], signal.SIGKILL)          # the part's worker crashes
        assert not _gone(orphan) and not _gone(holder)
        c.start_worker(part, "2xH100-80GB")

        wait_for(lambda: (work / "srun.rc").exists(), 60, "srun to end")
        err = (work / "srun.err").read_text()
        assert (work / "srun.rc").read_text().strip() == str(128 + signal.SIGKILL), err
        assert f"task 1 on {part}" in err and "restarted" in err and len(err.splitlines()) == 1
        wait_for(lambda: _gone(orphan), 30, "the orphaned task to die")
        assert not _gone(holder), "the part itself is adopted again"
        assert c.job(job_id)["state"] == "RUNNING"
        assert "fenced" not in c.log(f"worker-{part}")

        c.gpuctl("scancel", str(job_id))
        c.wait_job_state(job_id, "CANCELLED", 60)
        wait_for(lambda: _gone(holder), 30, "the part to end with the job")
