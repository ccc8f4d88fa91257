"""Multi-node jobs through the real daemons: a head, Mosquitto and eight sim workers.

A 4-node x 8-GPU job on a busy 8-node cluster gets all 32 GPUs at once, on the nodes of one
leaf switch, no later than its backfill reservation; ``gpuctl srun`` tasks on its four nodes
see one MASTER_ADDR, one node list and ranks 0..31; killing one part ends the job FAILED
with every part gone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.users import gpuctl_as, needs_root, temp_users

pytestmark = pytest.mark.slow

SWITCH = {f"w{i}": ("s1" if i <= 4 else "s2") for i in range(1, 9)}
ADDR = {f"w{i}": f"10.9.0.{i}" for i in range(1, 9)}
BUSY = "sleep 600"


class GangCluster(Cluster):
    """Workers with their own switch label and address (a config file per worker)."""

    def start_worker(self, name: str, sim: str = "8xH100-80GB", wait: bool = True) -> subprocess.Popen:
        text = self.config.read_text().replace(
            "[worker]\n", f'[worker]\nlabels = {{ switch = "{SWITCH[name]}" }}\naddress = "{ADDR[name]}"\n', 1)
        cfg = self.root / f"worker-{name}.toml"
        cfg.write_text(text)
        log = open(self.root / f"worker-{name}.log", "ab")
        self._logs.append(log)
        p = subprocess.Popen([sys.executable, "-m", "gpud.cli", "worker", "--name", name, "--sim", sim,
                              "--config", str(cfg)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             cwd=self.root)
        self.workers[name] = p
        if wait:
            wait_for(lambda: self.node_state(name) not in (None, "DOWN", "UNKNOWN") or self._dead(p),
                     60, f"worker {name} to register")
            assert p.poll() is None, self.log(f"worker-{name}")
        return p


    def start_two(self) -> None:
        """The head and two 2-GPU workers on different switches (w1, w5)."""
        self.start_head()
        self.start_worker("w1", "2xH100-80GB")
        self.start_worker("w5", "2xH100-80GB")


def shared_work(tmp_path: Path) -> Path:
    """A directory every user's job may write to."""
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o777)
    return work


def _gpuctl(c: Cluster) -> str:
    return f"{sys.executable} -m gpuctl.main --socket {c.socket}"


def _wrapper_pid(c: Cluster, node: str, job: int, attempt: int) -> int:
    path = c.state_dir / "worker" / node / "jobs" / f"{job}.{attempt}" / "wrapper.pid"
    return int(path.read_text().strip())


def test_gang_job_starts_whole_under_one_switch_and_dies_whole(tmp_path, mosquitto):  # noqa: F811
    work = shared_work(tmp_path)
    with GangCluster(tmp_path / "c", mosquitto.url, node_timeout=20.0, heartbeat=0.5) as c:
        c.start_head()
        for name in SWITCH:
            c.start_worker(name, wait=False)
        wait_for(lambda: all(n.get("state") == "IDLE" for n in c.nodes().values()) and len(c.nodes()) == 8,
                 90, "eight idle workers")
        # Busy: one 8-GPU job per node; the s1 nodes' jobs have the shorter limits, so the
        # reservation for 4 whole nodes falls on s1.
        busy = {}
        with c.client() as client:
            for name in SWITCH:
                limit = "20:00" if SWITCH[name] == "s1" else "40:00"
                busy[name] = client.submit(wrap=BUSY, gpus=8, nodelist=[name], time_limit=limit,
                                           stdout="/dev/null", work_dir=str(work))
        wait_for(lambda: all((j := c.job(i)) and j["state"] == "RUNNING" for i in busy.values()), 90,
                 "the busy jobs to run")
        assert {c.job(busy[n])["node"] for n in busy} == set(SWITCH)

        script = (
            "#!/bin/bash\n"
            f"{_gpuctl(c)} srun --ntasks-per-node 8 --label env > {work}/srun.out 2> {work}/srun.err\n"
            f"echo $? > {work}/srun.rc\n"
            "sleep 600\n"
        )
        with c.client() as client:
            gang = client.submit(script, nodes=4, gpus=32, time_limit="30:00", stdout=f"{work}/gang.out",
                                 work_dir=str(work))
        reserved = wait_for(lambda: (j := c.job(gang)) and j.get("expected_start") and j, 60,
                            "a backfill reservation for the gang job")
        expected = reserved["expected_start"]
        assert reserved["state"] == "PENDING"
        # Hold it while nodes free on both switches, so the choice is between them.
        c.gpuctl("scontrol", "hold", str(gang))
        for name in ("w5", "w6", "w1", "w2", "w3", "w4"):
            c.gpuctl("scancel", str(busy[name]))
        wait_for(lambda: sum(n["state"] == "IDLE" for n in c.nodes().values()) == 6, 60, "six idle nodes")
        c.gpuctl("scontrol", "release", str(gang))

        job = c.wait_job_state(gang, "RUNNING", 60)
        assert job["nodes"] == 4
        assert job["nodelist"] == "w[1-4]", "fewest switches: the four s1 nodes"
        assert job["node"] == "w1" and job["gpus"] == 32
        assert job["start_time"] <= expected
        nodes = c.nodes()
        assert all(nodes[f"w{i}"]["gpus_alloc"] == 8 for i in range(1, 5)), "32 GPUs at once"
        # The job's allocation is one event, with every part in it.
        events = c.gpuctl("scontrol", "show", "job", str(gang)).stdout
        assert "NodeList=w[1-4]" in events and "NumNodes=4" in events

        wait_for(lambda: (work / "srun.rc").exists(), 120, "srun to finish")
        assert (work / "srun.rc").read_text().strip() == "0", (work / "srun.err").read_text()
        env: dict[int, dict[str, str]] = {}
        for line in (work / "srun.out").read_text().splitlines():
            m = re.match(r"^(\d+): ([A-Z_]+)=(.*)$", line)
            if m:
                env.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
        assert sorted(env) == list(range(32))
        for rank, e in env.items():
            assert e["RANK"] == e["GPUD_PROCID"] == str(rank)
            assert e["LOCAL_RANK"] == str(rank % 8) and e["NODE_RANK"] == str(rank // 8)
            assert e["WORLD_SIZE"] == "32" and e["GPUD_NNODES"] == "4"
            assert e["GPUD_NODENAME"] == f"w{rank // 8 + 1}"
            assert len(e["CUDA_VISIBLE_DEVICES"].split(",")) == 8
        assert {e["MASTER_ADDR"] for e in env.values()} == {ADDR["w1"]}
        assert len({e["MASTER_PORT"] for e in env.values()}) == 1
        assert {e["GPUD_JOB_NODELIST"] for e in env.values()} == {"w[1-4]"}
        # Each node's tasks see that node's GPUs only, and no two nodes share a GPU.
        per_node = {e["CUDA_VISIBLE_DEVICES"] for e in env.values()}
        assert len(per_node) == 4

        # Kill one part's holder: the job ends FAILED and every part goes.
        os.kill(_wrapper_pid(c, "w3", gang, job["attempt"]), signal.SIGKILL)
        done = c.wait_job_state(gang, "FAILED", 60)
        assert done["state"] == "FAILED"
        wait_for(lambda: all(n["state"] in ("IDLE", "MIXED") and n["gpus_alloc"] == 0
                             for name, n in c.nodes().items() if name in ("w1", "w2", "w3", "w4")),
                 60, "every part of the gang job to be gone")
        for name in ("w1", "w2", "w3", "w4"):
            wrapper = c.state_dir / "worker" / name / "jobs" / f"{gang}.{job['attempt']}" / "wrapper.pid"
            if wrapper.exists():
                pid = int(wrapper.read_text())
                wait_for(lambda: not Path(f"/proc/{pid}").exists()
                         or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), 30,
                         f"the part on {name} to be gone")


def test_srun_kills_the_step_when_one_task_fails_and_tasks_die_with_the_job(tmp_path, mosquitto):  # noqa: F811
    work = shared_work(tmp_path)
    with GangCluster(tmp_path / "c", mosquitto.url) as c:
        c.start_two()
        script = (
            "#!/bin/bash\n"
            f"{_gpuctl(c)} srun --label sh -c 'if [ $RANK = 1 ]; then echo bad; exit 3; fi; exec sleep 600' "
            f"> {work}/bad.out 2> {work}/bad.err\n"
            f"echo $? > {work}/bad.rc\n"
            f"{_gpuctl(c)} srun sh -c 'echo $$ > {work}/task.$RANK; exec sleep 600'\n"
        )
        with c.client() as client:
            job = client.submit(script, nodes=2, gpus=4, stdout=f"{work}/job.out", work_dir=str(work))
        wait_for(lambda: (work / "bad.rc").exists(), 90, "the failing step to end")
        assert (work / "bad.rc").read_text().strip() == "3", (work / "bad.err").read_text()
        assert "1: bad" in (work / "bad.out").read_text()
        assert "task 1 on w5" in (work / "bad.err").read_text()
        # The second step runs until the job is cancelled; its tasks die with the job.
        wait_for(lambda: (work / "task.0").exists() and (work / "task.1").exists(), 60, "the second step's tasks")
        pids = [int((work / f"task.{r}").read_text()) for r in (0, 1)]
        assert all(Path(f"/proc/{p}").exists() for p in pids)
        c.gpuctl("scancel", str(job))
        c.wait_job_state(job, "CANCELLED", 60)
        for p in pids:
            wait_for(lambda: not Path(f"/proc/{p}").exists()
                     or "zombie" in Path(f"/proc/{p}/status").read_text().lower(), 30, f"task pid {p} to die")


@needs_root
def test_srun_tasks_run_as_the_jobs_user_and_only_owners_or_admins_may_start_them(mosquitto):  # noqa: F811
    world = tempfile.mkdtemp(prefix="gpud-gang-", dir="/tmp")   # users must reach it; tmp_path is root's
    os.chmod(world, 0o755)
    try:
        with temp_users(2) as (alice, bob), GangCluster(Path(world) / "c", mosquitto.url) as c:
            c.start_head()
            c.start_worker("w1", "2xH100-80GB")
            c.start_worker("w2", "2xH100-80GB")
            home = os.path.join(world, alice.name)
            os.mkdir(home)
            os.chown(home, alice.uid, alice.gid)
            rc, out, err = gpuctl_as(alice, ["sbatch", "--parsable", "-N", "2", "--gpus", "2", "--wrap",
                                             "sleep 300"], c.socket, cwd=home)
            assert rc == 0, err
            job = int(out.strip())
            c.wait_job_state(job, "RUNNING")
            os.environ["GPUD_JOB_ID"] = str(job)
            try:
                rc, out, err = gpuctl_as(bob, ["srun", "id", "-u"], c.socket)
            finally:
                del os.environ["GPUD_JOB_ID"]
            assert rc == 1 and f"belongs to {alice.name}" in err and len(err.strip().splitlines()) == 1
            env = dict(c.env, GPUD_JOB_ID=str(job))
            r = subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", c.socket, "srun", "--label",
                                "sh", "-c", 'echo "$(id -u) $(id -G) $(pwd)"'],
                               env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            groups = " ".join(str(g) for g in sorted(alice.groups))
            got = sorted(r.stdout.splitlines())
            assert len(got) == 2
            for rank, line in enumerate(got):
                label, uid, *rest = line.split()
                assert label == f"{rank}:" and int(uid) == alice.uid and rest[-1] == home
                assert " ".join(str(g) for g in sorted(int(x) for x in rest[:-1])) == groups
            c.gpuctl("scancel", str(job))
            c.wait_job_state(job, "CANCELLED")
    finally:
        shutil.rmtree(world, ignore_errors=True)
