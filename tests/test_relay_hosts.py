"""Three hosts: the head (with the broker), a GPU worker that also serves gpuctl, and a login node
running ``gpud relay``.  gpuctl answers the same on all three, and a user is the same user
through a relay as on the head.

Each host is a network namespace when the tests run as root (tests/netns.py), so the worker
and the login node reach the head only over the (private) network; otherwise all three are
this machine on loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cluster import env_for_children, wait_for
from tests.mqtt_broker import require_mosquitto
from tests.netns import Network, host_dir
from tests.users import gpuctl_as, needs_root, temp_users

pytestmark = pytest.mark.slow

HOSTS = ("head", "worker", "login")


class Hosts:
    """gpud daemons and gpuctl calls, each on its host, all with one cluster key."""

    def __init__(self, root: Path, net: Network) -> None:
        self.root, self.net = root, net
        self.env = env_for_children()
        self.key = root / "cluster.key"
        subprocess.run([sys.executable, "-m", "gpud.cli", "keygen", str(self.key)], check=True,
                       env=self.env, capture_output=True)
        self.dirs = {h: host_dir(root, net.hosts[h]) for h in HOSTS}
        self.sockets = {h: str(self.dirs[h] / "gpud.sock") for h in HOSTS}
        self.broker = net.start_broker(root / "mosquitto")
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    def config(self, host: str, extra: str = "") -> str:
        path = self.dirs[host] / "gpud.toml"
        path.write_text(
            f'cluster = "multi"\nstate_dir = "{self.dirs[host] / "state"}"\nkey_file = "{self.key}"\n'
            f'[broker]\nurl = "{self.broker.url}"\n'
            f'[head]\nsocket = "{self.sockets["head"]}"\nnode_timeout = "5s"\n'
            # Passes only on events: between them squeue --json (priorities) holds still.
            f'schedule_interval = "10m"\n'
            f'kill_grace = "2s"\n[worker]\nheartbeat_interval = "0.5s"\n{extra}')
        return str(path)

    def spawn(self, host: str, *args: str, extra_config: str = "") -> subprocess.Popen:
        log = open(self.dirs[host] / "daemon.log", "ab")
        self._logs.append(log)
        argv = [sys.executable, "-m", "gpud.cli", *args, "--config", self.config(host, extra_config)]
        p = subprocess.Popen(self.net.hosts[host].wrap(argv), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             cwd=self.dirs[host])
        self.procs[host] = p
        return p

    def log(self, host: str) -> str:
        return (self.dirs[host] / "daemon.log").read_text(errors="replace")[-5000:]

    def gpuctl(self, host: str, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "gpuctl.main", "--socket", self.sockets[host], *args]
        return subprocess.run(self.net.hosts[host].wrap(argv), env=self.env, capture_output=True, text=True,
                              cwd=cwd or self.dirs[host], timeout=60)

    def ok(self, host: str, *args: str, cwd: str | None = None) -> str:
        r = self.gpuctl(host, *args, cwd=cwd)
        assert r.returncode == 0, f"gpuctl {' '.join(args)} on {host}: {r.stderr.strip()}\n{self.log(host)}"
        return r.stdout

    def start(self) -> "Hosts":
        self.spawn("head", "head")
        wait_for(lambda: self.gpuctl("head", "squeue").returncode == 0 or self.procs["head"].poll() is not None,
                 30, "the head")
        assert self.procs["head"].poll() is None, self.log("head")
        self.spawn("worker", "worker", "--name", "w1", "--sim", "2xH100-80GB",
                   extra_config=f'relay_socket = "{self.sockets["worker"]}"\n')
        self.spawn("login", "relay", "--name", "login", "--socket", self.sockets["login"], "--timeout", "15")
        wait_for(lambda: "w1" in self.ok("head", "sinfo", "-h") and "down" not in self.ok("head", "sinfo", "-h"),
                 30, "worker w1 to register")
        for h in ("worker", "login"):
            wait_for(lambda: self.gpuctl(h, "squeue").returncode == 0 or self.procs[h].poll() is not None, 30,
                     f"gpuctl on the {h} host")
            assert self.procs[h].poll() is None, self.log(h)
        return self

    def close(self) -> None:
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.broker.stop()
        for f in self._logs:
            f.close()


@pytest.fixture
def world_dir():
    # Reachable by the test users: their jobs' work dirs and the hosts' sockets live here.
    d = tempfile.mkdtemp(prefix="gpud-hosts-", dir="/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hosts(world_dir):
    require_mosquitto()
    with Network(HOSTS) as net:
        h = Hosts(world_dir, net)
        try:
            yield h.start()
        finally:
            h.close()


def queued(hosts: Hosts) -> set[str]:
    """The ids in the head's queue (whole ids: user names carry digits too)."""
    return set(hosts.ok("head", "squeue", "-h", "-o", "%i").split())


def same_everywhere(hosts: Hosts, *args: str) -> str:
    """gpuctl's output on every host, which must be the head's (asked before and after the
    others, so that a change in between is not mistaken for a difference)."""
    for _ in range(10):
        before = hosts.ok("head", *args)
        others = {h: hosts.ok(h, *args) for h in ("login", "worker")}
        if hosts.ok("head", *args) == before:
            for h, out in others.items():
                assert out == before, f"gpuctl {' '.join(args)} on {h}:\n{out}\non the head:\n{before}"
            return before
    raise AssertionError(f"gpuctl {' '.join(args)} kept changing")


def test_gpuctl_on_the_login_and_worker_hosts_answers_as_on_the_head(hosts):
    if hosts.net.mode == "netns":
        # The login host really is elsewhere: the head's broker is not on its loopback.
        probe = subprocess.run(hosts.net.hosts["login"].wrap(
            [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {hosts.broker.port}), 2)"]),
            capture_output=True)
        assert probe.returncode != 0
    held = {h: int(hosts.ok(h, "sbatch", "--parsable", "--hold", "-J", f"from-{h}", "--wrap", "true"))
            for h in HOSTS}
    assert len(set(held.values())) == 3
    queue = same_everywhere(hosts, "squeue")
    assert all(f"from-{h}" in queue for h in HOSTS)
    same_everywhere(hosts, "squeue", "--json")
    same_everywhere(hosts, "sinfo")

    # Refusals read the same, with the same exit code.
    refusals = {h: hosts.gpuctl(h, "sbatch", "--gpus", "64", "--wrap", "true") for h in HOSTS}
    assert {(r.returncode, r.stderr) for r in refusals.values()} == {(1, refusals["head"].stderr)}
    assert "not available" in refusals["head"].stderr

    # Cancel from the login node; everyone sees it.
    assert hosts.gpuctl("login", "scancel", str(held["head"])).returncode == 0
    wait_for(lambda: str(held["head"]) not in queued(hosts), 30, "the cancel")

    # A job submitted on the login node runs on the worker and reports back.
    job = int(hosts.ok("login", "sbatch", "--parsable", "--gpus", "1", "--wrap", "echo ran on $GPUD_NODENAME"))
    wait_for(lambda: f"{job} " in hosts.ok("head", "sacct", "-j", str(job), "-n") and "COMPLETED" in
             hosts.ok("head", "sacct", "-j", str(job), "-n"), 60, "the job to complete")
    assert (hosts.dirs["login"] / f"gpud-{job}.out").read_text() == "ran on w1\n"
    same_everywhere(hosts, "sacct", "-j", str(job))
    for h in ("login", "worker"):
        assert "relay" in hosts.log(h) and "ready" in hosts.log(h)


@needs_root
def test_a_user_through_a_relay_is_themselves_and_cannot_be_anyone_else(hosts, world_dir):
    with temp_users(2) as (alice, bob):
        home = world_dir / alice.name
        home.mkdir()
        os.chown(home, alice.uid, alice.gid)
        login = hosts.sockets["login"]
        rc, out, err = gpuctl_as(alice, ["sbatch", "--parsable", "--gpus", "1", "--wrap", "id -u; id -g"], login,
                                 cwd=str(home))
        assert rc == 0, err
        ran = int(out)
        rc, out, err = gpuctl_as(alice, ["sbatch", "--parsable", "--hold", "--wrap", "true"], login, cwd=str(home))
        assert rc == 0, err
        held = int(out)
        wait_for(lambda: "COMPLETED" in hosts.ok("head", "sacct", "-a", "-n", "-j", str(ran)), 60, "alice's job")
        assert (home / f"gpud-{ran}.out").read_text().split() == [str(alice.uid), str(alice.gid)]
        queue = hosts.ok("head", "squeue", "-h", "-j", str(held))
        assert alice.name in queue

        # bob, through the same relay, is bob: he may not cancel alice's job ...
        rc, out, err = gpuctl_as(bob, ["scancel", str(held)], login)
        assert rc == 1 and "denied" in err.lower() and len(err.strip().splitlines()) == 1
        rc, out, err = gpuctl_as(bob, ["scancel", "-u", alice.name], login)
        assert str(held) in hosts.ok("head", "squeue", "-h", "-j", str(held))
        # ... and what he submits is his.
        bob_home = world_dir / bob.name
        bob_home.mkdir()
        os.chown(bob_home, bob.uid, bob.gid)
        rc, out, err = gpuctl_as(bob, ["sbatch", "--parsable", "--hold", "--wrap", "true"], login, cwd=str(bob_home))
        assert rc == 0, err
        assert bob.name in hosts.ok("head", "squeue", "-h", "-j", out.strip())
        # alice may cancel her own job, through the relay as on the head.
        rc, out, err = gpuctl_as(alice, ["scancel", str(held)], login)
        assert rc == 0, err
        wait_for(lambda: str(held) not in queued(hosts), 30, "alice's cancel")
