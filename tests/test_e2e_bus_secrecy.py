"""What the broker sees of a cluster at work, and a cluster key rotated under a running job.

Real daemons (head, worker, login relay) on a real Mosquitto started from Debian's stock
mosquitto.conf with the shipped conf.d file and ``gpud broker-credentials``' files.

* A sniffer holding another role's valid broker credentials, and an observer allowed to
  read every topic (the broker's admin, or a stolen head password), both subscribed to
  ``#`` while a job with a secret in its environment runs and ``gpuctl srun`` prints it:
  no payload holds the script's text, an environment value or an output line.
* The cluster key rotated (add, promote, retire; daemons restarted one at a time, the key
  file changing under them) while a job runs: the job keeps running and completes, and the
  next job runs under the new key alone.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading

import paho.mqtt.client as paho
import pytest

from gpud.keys import load_keys
from tests.cluster import Cluster, wait_for
from tests.locked_broker import LockedMosquitto
from tests.mqtt_broker import require_mosquitto

CLUSTER = "test"


@pytest.fixture
def broker(tmp_path):
    require_mosquitto()
    proc = LockedMosquitto(tmp_path / "mosquitto", cluster=CLUSTER, nodes=["w1"], relays=["login", "spare"],
                           observer=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def locked_cluster(root, broker) -> Cluster:
    c = Cluster(root, broker.url, cluster=CLUSTER)
    text = c.config.read_text()
    section = f'[broker]\nurl = "{broker.url}"\n'
    assert section in text
    c.config.write_text(text.replace(section, section + f'credentials_dir = "{broker.creds_dir}"\n'))
    return c


class Sniffer:
    """A paho client subscribed to ``#``, keeping every (topic, payload) it is given."""

    def __init__(self, broker, user):
        self.got: list[tuple[str, bytes]] = []
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"sniffer-{user}")
        self.client.username_pw_set(user, broker.passwords[user])
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe("#", qos=1)
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_message(self, client, userdata, m):
        with self._lock:
            self.got.append((m.topic, bytes(m.payload)))

    def messages(self):
        with self._lock:
            return list(self.got)

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def gpuctl(c: Cluster, socket_path: str, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", socket_path, *args],
                          env=env or c.env, capture_output=True, text=True, timeout=60, cwd=str(c.root))


def start_relay(c: Cluster, name: str, socket_path: str):
    relay = c._spawn(["relay", "--name", name, "--socket", socket_path], f"relay-{name}")
    c.workers[f"relay-{name}"] = relay      # stopped with the cluster
    wait_for(lambda: gpuctl(c, socket_path, "squeue").returncode == 0 or relay.poll() is not None, 30,
             "the relay")
    assert relay.poll() is None, c.log(f"relay-{name}")
    return relay


def test_the_broker_sees_no_script_environment_or_output(tmp_path, broker):
    token = secrets.token_hex(8)
    secret = f"cloud-secret-{token}"
    work = tmp_path / "work"
    work.mkdir()
    relay_sock = str(tmp_path / "login.sock")
    with locked_cluster(tmp_path / "c", broker) as c:
        spare = Sniffer(broker, "relay-spare")      # another role's valid credentials
        observer = Sniffer(broker, "observer")      # may read every topic
        try:
            assert spare.subscribed.wait(10) and observer.subscribed.wait(10)
            c.start_head()
            c.start_worker("w1")
            start_relay(c, "login", relay_sock)
            script = work / "job.sh"
            script.write_text(
                "#!/bin/bash\n"
                f"# script-marker-{token}\n"
                f"{sys.executable} -m gpuctl.main --socket {c.socket} srun --ntasks-per-node 1 "
                f"bash -c 'echo output-marker-{token}; echo \"$GPUD_TEST_SECRET\"' > {work}/srun.out\n"
                f"echo $? > {work}/srun.rc\n")
            env = dict(c.env, GPUD_TEST_SECRET=secret)
            r = gpuctl(c, relay_sock, "sbatch", "--parsable", "--gpus", "1", "-o", str(work / "job.out"),
                       str(script), env=env)
            assert r.returncode == 0, r.stderr
            job = int(r.stdout.strip().split(";")[0])
            c.wait_job_state(job, "COMPLETED", 60)
            assert (work / "srun.rc").read_text().strip() == "0"
            assert (work / "srun.out").read_text().split() == [f"output-marker-{token}", secret]
            # Wait for the job's last traffic (the head's ack of its end) to reach the observer.
            wait_for(lambda: sum(t.endswith("/node/w1/cmd") for t, _ in observer.messages()) >= 3, 30,
                     "the observer to see the node's commands")
        finally:
            spare.close()
            observer.close()
    seen = observer.messages()
    topics = {t for t, _ in seen}
    # It saw the whole conversation: the relayed submission, the launch, the step, its output...
    for suffix in ("head/requests", "relay/login/replies", "node/w1/cmd", "head/events", "head/status"):
        assert f"gpud/{CLUSTER}/{suffix}" in topics, (suffix, topics)
    assert max(len(p) for t, p in seen if t.endswith("/node/w1/cmd")) > 200   # the launch, script inside
    # ...and learned nothing of it.
    for t, p in seen + spare.messages():
        for clear in (token.encode(), b"GPUD_TEST_SECRET", b"#!/bin/bash", b"srun", b"launch", b"bash -c"):
            assert clear not in p, (t, clear)
    # The other role's credentials read only what that role may: the head's status.
    assert {t for t, _ in spare.messages()} <= {f"gpud/{CLUSTER}/head/status"}
    assert "without a user name" not in c.log("head") + c.log("worker-w1")


def restart(c: Cluster, who: str) -> None:
    if who == "head":
        c.stop(c.head)
        c.start_head()
    else:
        c.stop(c.workers[who])
        c.start_worker(who)


def test_the_cluster_key_rotates_under_a_running_job(tmp_path, broker):
    work = tmp_path / "work"
    work.mkdir()
    flag = work / "flag"
    with locked_cluster(tmp_path / "c", broker) as c:
        c.start_head()
        c.start_worker("w1")
        old = load_keys(c.key_file)
        job = c.sbatch("--gpus", "1", "-o", str(work / "out"), "--wrap",
                       f"while [ ! -e {flag} ]; do sleep 0.1; done; echo finished")
        running = c.wait_job_state(job, "RUNNING", 30)
        for step, order in (("add", ("w1", "head")), ("promote", ("head", "w1")), ("retire", ("w1", "head"))):
            r = subprocess.run([sys.executable, "-m", "gpud.cli", "keygen", "--rotate", step, c.key_file],
                               env=c.env, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            for who in order:     # one daemon at a time: the other still runs on the previous file
                restart(c, who)
                j = c.job(job)
                assert j["state"] == "RUNNING", (step, who, j)
            wait_for(lambda: c.node_state("w1") in ("MIXED", "ALLOCATED", "IDLE"), 30, f"w1 back after {step}")
        new = load_keys(c.key_file)
        assert len(new) == 1 and new[0] != old[0]
        assert c.job(job).get("restarts", 0) == running.get("restarts", 0)
        flag.touch()
        c.wait_job_state(job, "COMPLETED", 30)
        assert (work / "out").read_text().strip() == "finished"
        later = c.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", "true")
        c.wait_job_state(later, "COMPLETED", 30)
        assert os.stat(c.key_file).st_mode & 0o777 == 0o600
