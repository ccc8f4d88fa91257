"""A job runs under its submitter's resource limits, not the worker's root ones (Slurm's
PropagateResourceLimits=ALL), and a submission can lower limits but never raise one above
the node's own.  Real head, worker, Mosquitto and gpuctl."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from gpud.protocol import RemoteError

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)


def test_a_job_gets_its_submitters_limits(tmp_path, mosquitto):  # noqa: F811
    out = tmp_path / "limits.out"
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        c.start_worker("n1")
        # the submitter's shell lowered its own limits, as a login node's limits.conf would
        r = subprocess.run(
            ["bash", "-c", 'ulimit -Sn 321 && ulimit -Ss 4096 && exec "$@"', "sbatch",
             sys.executable, "-m", "gpuctl.main", "--socket", c.socket, "sbatch", "--parsable", "-o", str(out),
             "--wrap", "echo $(ulimit -Sn) $(ulimit -Ss)"],
            env=c.env, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        c.wait_job_state(int(r.stdout.strip()), "COMPLETED")
        assert out.read_text().split() == ["321", "4096"]


def test_a_submission_cannot_raise_a_limit_above_the_nodes(tmp_path, mosquitto):  # noqa: F811
    out = tmp_path / "hard.out"
    _, node_hard = resource.getrlimit(resource.RLIMIT_NOFILE)   # the worker inherits this one
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        c.start_worker("n1")
        with c.client() as client:
            r = client.call("submit", spec={"script": "#!/bin/bash\nulimit -Hn\n", "work_dir": str(tmp_path),
                                            "stdout": str(out)},
                            rlimits={"NOFILE": [10**9, 10**9]})
        c.wait_job_state(r["job_id"], "COMPLETED")
        wait_for(lambda: out.exists() and out.read_text().strip(), 10, "the job's output")
        assert int(out.read_text()) == node_hard
        with c.client() as client, pytest.raises(RemoteError) as e:
            client.call("submit", spec={"script": "#!/bin/bash\ntrue\n"}, rlimits={"NOFILE": "lots"})
        assert "invalid resource limit 'NOFILE'" in str(e.value)


def test_gpuctl_reads_its_limits_as_the_kernel_reports_them():
    """own_rlimits reads /proc/self/limits (off the start-up path's imports): the same values
    getrlimit gives, -1 for unlimited."""
    from gpuctl.client import own_rlimits
    from gpud.protocol import RLIMIT_NAMES

    mine = own_rlimits()
    assert set(mine) == set(RLIMIT_NAMES)
    for name, pair in mine.items():
        want = resource.getrlimit(getattr(resource, "RLIMIT_" + name))
        assert pair == [-1 if v == resource.RLIM_INFINITY else v for v in want], name


def _srun(c: Cluster, job: int, *args: str, preexec=None) -> subprocess.CompletedProcess:
    """``gpuctl srun`` inside ``job`` (GPUD_JOB_ID), run by a process with ``preexec``'s limits."""
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", c.socket, "srun", *args],
                          env=dict(c.env, GPUD_JOB_ID=str(job)), capture_output=True, text=True, timeout=60,
                          cwd=str(c.root), preexec_fn=preexec)


def test_srun_tasks_get_the_limits_of_the_srun_that_started_them(tmp_path, mosquitto):  # noqa: F811
    _, node_hard = resource.getrlimit(resource.RLIMIT_NOFILE)   # the worker inherits this one
    hard = 1000 if node_hard == resource.RLIM_INFINITY else min(node_hard, 1000)
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        c.start_worker("n1")
        job = c.sbatch("-o", "/dev/null", "--wrap", "sleep 600")
        c.wait_job_state(job, "RUNNING", 60)
        # srun under a lowered NOFILE, as after `ulimit -n` in the user's shell; two tasks
        r = _srun(c, job, "--ntasks-per-node", "2", "grep", "Max open files", "/proc/self/limits",
                  preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (321, hard)))
        assert r.returncode == 0, r.stderr
        assert [line.split()[3:5] for line in r.stdout.splitlines()] == [["321", str(hard)]] * 2, r.stdout
        # an srun with the node's limits: its tasks have them (the worker's, not the first step's)
        r = _srun(c, job, "sh", "-c", "ulimit -Hn")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["unlimited" if node_hard == resource.RLIM_INFINITY else str(node_hard)]
        with c.client() as client, pytest.raises(RemoteError) as e:
            client.call("step_launch", job_id=job, argv=["true"], rlimits={"NOFILE": "lots"})
        assert str(e.value).startswith("srun: invalid resource limit 'NOFILE'") and "\n" not in str(e.value)
        c.gpuctl("scancel", str(job))
        c.wait_job_state(job, "CANCELLED", 60)
