"""A real test cluster: gpud head and worker processes, a broker, and gpuctl invocations.

Every daemon is its own process started from this checkout (``python -m gpud.cli``), talking
to a real MQTT broker, with real SQLite files and real job processes.  Waiting is always on a
condition with a timeout, never a bare sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent


def wait_for(cond: Callable[[], object], timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# Set in every process a Cluster starts (daemons, gpuctl, and so the jobs they export it to):
# close() kills what is still marked with its root, whatever a failed test left behind.
MARK = "GPUD_TEST_CLUSTER"


def kill_marked(root: str) -> int:
    """SIGKILL every process whose environment has MARK=root; how many there were."""
    needle = f"{MARK}={root}\0".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read() + b"\0":
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (OSError, ValueError):
            continue    # gone, or not ours to read
    return killed


def env_for_children() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("GPUD_SOCKET", None)
    env.pop("GPUD_CONFIG", None)
    return env


class Cluster:
    """Head + workers on one machine, configured through one gpud.toml in ``root``."""

    def __init__(self, root: Path, broker_url: str, *, cluster: str = "test", node_timeout: float = 3.0,
                 heartbeat: float = 0.3, kill_grace: float = 2.0, extra_toml: str = "",
                 lease: float = 10.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.broker_url = broker_url
        self.state_dir = self.root / "state"
        self.socket = str(self.root / "gpud.sock")
        self.key_file = str(self.root / "cluster.key")
        self.config = self.root / "gpud.toml"
        self.config.write_text(
            f'cluster = "{cluster}"\n'
            f'state_dir = "{self.state_dir}"\n'
            f'key_file = "{self.key_file}"\n'
            f'log_level = "info"\n'
            f'[broker]\nurl = "{broker_url}"\n'
            f'[head]\nsocket = "{self.socket}"\nnode_timeout = "{node_timeout}s"\nlease = "{lease}s"\n'
            f'schedule_interval = "1s"\nkill_grace = "{kill_grace}s"\n'
            f'[worker]\nheartbeat_interval = "{heartbeat}s"\n' + extra_toml
        )
        os.chmod(self.root, 0o755)
        self.env = env_for_children()
        self.env[MARK] = str(self.root)
        if not os.path.exists(self.key_file):
            subprocess.run([sys.executable, "-m", "gpud.cli", "keygen", self.key_file], check=True,
                           env=self.env, capture_output=True)
        self.head: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        self._spawned: list[subprocess.Popen] = []   # every daemon, restarted ones too

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.root / f"{log_name}.log", "ab")
        self._logs.append(log)
        p = subprocess.Popen([sys.executable, "-m", "gpud.cli", *args, "--config", str(self.config)],
                             env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self._spawned.append(p)
        return p

    def start_head(self, wait: bool = True) -> subprocess.Popen:
        self.head = self._spawn(["head"], "head")
        if wait:
            wait_for(lambda: self.gpuctl("squeue", check=False).returncode == 0 or self._dead(self.head),
                     30, "head to accept requests")
            assert self.head.poll() is None, self.log("head")
        return self.head

    def start_worker(self, name: str, sim: str = "4xH100-80GB", wait: bool = True,
                     args: tuple[str, ...] = ()) -> subprocess.Popen:
        p = self._spawn(["worker", "--name", name, "--sim", sim, *args], f"worker-{name}")
        self.workers[name] = p
        if wait:
            wait_for(lambda: self.node_state(name) not in (None, "DOWN", "UNKNOWN") or self._dead(p),
                     30, f"worker {name} to register")
            assert p.poll() is None, self.log(f"worker-{name}")
        return p

    @staticmethod
    def _dead(p: subprocess.Popen | None) -> bool:
        return p is not None and p.poll() is not None

    def log(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, p: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def close(self) -> None:
        for p in list(self.workers.values()) + [self.head] + self._spawned:
            self.stop(p)
        for p in self._spawned:   # the killed ones too: reaped, no zombies left to the next test
            if p.poll() is None:
                p.kill()
                p.wait(5)
        # what a failed test left behind: jobs that outlived their worker, stopped daemons, ...
        wait_for(lambda: kill_marked(str(self.root)) == 0, 10, "the cluster's processes to be gone", interval=0.05)
        for f in self._logs:
            f.close()

    # -- gpuctl -----------------------------------------------------------------------------

    def gpuctl(self, *args: str, check: bool = True, user: str | None = None, input: str | None = None,
               cwd: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "gpuctl.main", "--socket", self.socket, *args]
        kwargs = {}
        if user is not None:
            import pwd

            pw = pwd.getpwnam(user)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(user, pw.pw_gid))
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, input=input,
                           cwd=cwd or str(self.root), timeout=timeout, **kwargs)
        if check and r.returncode != 0:
            raise AssertionError(f"gpuctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def sbatch(self, *args: str, **kw) -> int:
        r = self.gpuctl("sbatch", "--parsable", *args, **kw)
        return int(r.stdout.strip().split(";")[0])

    def client(self):
        from gpuctl import Client

        return Client(self.socket)

    def jobs(self, all: bool = True) -> dict[int, dict]:
        args = ["sacct", "--json", "-a", "-S", "2000-01-01"] if all else ["squeue", "--json"]
        r = self.gpuctl(*args, check=False)
        if r.returncode != 0:
            return {}
        return {j["job_id"]: j for j in json.loads(r.stdout)["jobs"]}

    def job(self, job_id: int) -> dict | None:
        return self.jobs().get(job_id)

    def nodes(self) -> dict[str, dict]:
        r = self.gpuctl("sinfo", "--json", check=False)
        if r.returncode != 0:
            return {}
        return {n["name"]: n for n in json.loads(r.stdout)["nodes"]}

    def node_state(self, name: str) -> str | None:
        n = self.nodes().get(name)
        return n["state"] if n else None

    def wait_job_state(self, job_id: int, states: set[str] | str, timeout: float = 60) -> dict:
        want = {states} if isinstance(states, str) else set(states)
        return wait_for(lambda: (j := self.job(job_id)) and j["state"] in want and j, timeout,
                        f"job {job_id} to reach {want}")

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
