"""From a fresh virtual environment: `pip install .`, `gpud standalone`, one job end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.cluster import REPO, wait_for

pytestmark = pytest.mark.slow


def test_fresh_venv_standalone_runs_a_two_gpu_job(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(REPO)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUD_", "PYTHON"))}
    env["PATH"] = f"{venv}/bin:{env['PATH']}"
    state = tmp_path / "D"
    log = open(tmp_path / "standalone.log", "w+")
    daemon = subprocess.Popen([str(venv / "bin/gpud"), "standalone", "--sim", "4xH100-80GB",
                               "--state-dir", str(state)], stdout=log, stderr=subprocess.STDOUT,
                              env=env, cwd=tmp_path)
    try:
        line = wait_for(lambda: re.search(r"GPUD_SOCKET=(\S+)", (tmp_path / "standalone.log").read_text()),
                        60, "gpud standalone to print its GPUD_SOCKET line")
        env["GPUD_SOCKET"] = line.group(1)
        gpuctl = str(venv / "bin/gpuctl")

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([gpuctl, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                                  timeout=60)

        wait_for(lambda: run("sinfo", "-h").stdout.strip(), 60, "the local worker to register")
        sub = run("sbatch", "--gpus", "2", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
        assert sub.returncode == 0, sub.stderr
        m = re.fullmatch(r"Submitted batch job (\d+)", sub.stdout.strip())
        assert m, sub.stdout
        job_id = int(m.group(1))
        squeue = run("squeue")
        assert squeue.returncode == 0 and "JOBID" in squeue.stdout

        def done():
            r = run("sacct", "--json")
            jobs = {j["job_id"]: j for j in json.loads(r.stdout)["jobs"]} if r.returncode == 0 else {}
            j = jobs.get(job_id)
            return j if j and j["state"] not in ("PENDING", "RUNNING", "COMPLETING") else None

        job = wait_for(done, 60, "the job to finish")
        assert job["state"] == "COMPLETED" and job["exit_code"] == 0
        out = (tmp_path / f"gpud-{job_id}.out").read_text().split()
        gpus = out[0].split(",")
        assert len(gpus) == 2 and len(set(gpus)) == 2 and all(g.startswith("GPU-") for g in gpus)
        sacct = run("sacct")
        assert str(job_id) in sacct.stdout and "COMPLETED" in sacct.stdout
        sinfo = json.loads(run("sinfo", "--json").stdout)["nodes"]
        assert len(sinfo) == 1 and len(sinfo[0]["gpus"]) == 4
        assert str(job_id) in run("sacct", "-j", str(job_id)).stdout
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
    assert daemon.returncode == 0, (tmp_path / "standalone.log").read_text()[-3000:]
