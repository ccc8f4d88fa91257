"""Every message of a real cluster at work is one the wire contract (gpud.bus.messages) reads.

A head, two sim workers (one with a dynamic MIG A100) and a login relay run as processes on
Mosquitto.  A recorder holding the cluster key subscribes to ``gpud/<cluster>/#`` before the
head starts and keeps every payload the broker routes: what the head publishes and what the
workers and the relay send.  Through them go a batch job, a job cancelled while it runs and
given a new time limit first, a MIG slice that needs a re-layout, a two-node job whose end
kills its other part, a ``gpuctl srun`` with input and output whose failing task kills its
step, and a request through the relay.  Every payload must open and ``decode`` without a
``MessageError``, carry the contract's version, and come back the same through ``encode``;
and the run must have used the kinds these jobs need.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import paho.mqtt.client as paho
import pytest

from gpud.bus.envelope import peek
from gpud.bus.messages import VERSION, MessageError, decode, encode
from gpud.keys import load_keys
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

CLUSTER = "test"
EXTRA = """sample_interval = "0.5s"
gpu_modes = { "w1:0" = "mig:dynamic" }
[scheduler]
mig_min_interval = "0s"
"""
# What the jobs below make the daemons say (hello and step_resize are not among them: no
# worker is unknown to the head, and no step runs on a terminal).
EXPECTED = {"launch", "lease", "signal", "kill", "ack", "mig", "time_limit", "step", "step_kill", "step_ack",
            "step_input", "step_output", "step_exit", "register", "heartbeat", "started", "finished", "samples",
            "head_status", "node_status", "request", "reply"}


class Recorder:
    """A client of the broker subscribed to the whole cluster, keeping (topic, payload)."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="wire-recorder")
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(f"gpud/{CLUSTER}/#", qos=1)
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self._lock:
            self.got.append((msg.topic, bytes(msg.payload)))

    def payloads(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def opened(keys, payloads):
    """(topic suffix, kind, sender, body) of every payload; a cleared retained message is none."""
    out = []
    for topic, payload in payloads:
        if payload:
            suffix = topic[len(f"gpud/{CLUSTER}/"):]
            env = peek(keys, payload, topic=suffix)
            out.append((suffix, env.kind, env.sender, env.body))
    return out


def gpuctl(c: Cluster, socket_path: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", socket_path, *args], env=c.env,
                          capture_output=True, text=True, timeout=120, cwd=str(c.root), input=input)


def test_every_message_of_a_real_run_decodes(tmp_path, mosquitto):  # noqa: F811
    work = tmp_path / "work"
    work.mkdir()
    relay_sock = str(tmp_path / "login.sock")
    recorder = Recorder(mosquitto.port)
    try:
        assert recorder.subscribed.wait(10)
        with Cluster(tmp_path / "c", mosquitto.url, cluster=CLUSTER, extra_toml=EXTRA) as c:
            c.start_head()
            c.start_worker("w1", "1xA100-80GB,1xH100-80GB")
            c.start_worker("w2", "2xH100-80GB")
            relay = c._spawn(["relay", "--name", "login", "--socket", relay_sock], "relay-login")
            c.workers["relay-login"] = relay          # stopped with the cluster
            wait_for(lambda: gpuctl(c, relay_sock, "squeue").returncode == 0 or relay.poll() is not None, 30,
                     "the relay")
            assert relay.poll() is None, c.log("relay-login")

            # a batch job, through the relay
            r = gpuctl(c, relay_sock, "sbatch", "--parsable", "-o", str(work / "batch.out"), "--wrap", "echo hi")
            assert r.returncode == 0, r.stderr
            batch = int(r.stdout.strip())
            # a MIG slice: the idle A100 is re-laid for it
            sliced = c.sbatch("--gpus", "1g.10gb", "-o", "/dev/null", "--wrap", "true")
            # two nodes: rank 0 ends, the head kills the other part
            gang = c.sbatch("-N", "2", "--gpus", "2", "--gpu-type", "H100-80GB", "-o", "/dev/null", "--wrap",
                            "sleep 1")
            for job in (batch, sliced, gang):
                c.wait_job_state(job, "COMPLETED", 90)
            assert (work / "batch.out").read_text() == "hi\n"

            # a new time limit for a running job, then scancel
            long = c.sbatch("--gpus", "1", "-o", "/dev/null", "--wrap", "sleep 600")
            c.wait_job_state(long, "RUNNING", 60)
            c.gpuctl("scontrol", "update", "job", str(long), "TimeLimit=120")
            c.gpuctl("scancel", str(long))
            c.wait_job_state(long, "CANCELLED", 60)

            # srun with input and output; its task fails, which kills the step
            r = c.gpuctl("srun", "--gpus", "1", "--gpu-type", "H100-80GB", "sh", "-c",
                         "read x; echo got $x; exit 3", input="hello\n", check=False, timeout=120)
            assert (r.returncode, r.stdout) == (3, "got hello\n"), r.stderr

            keys = load_keys(c.key_file)
            wait_for(lambda: EXPECTED <= {kind for _, kind, _, _ in opened(keys, recorder.payloads())}, 60,
                     "every expected kind to reach the recorder")
    finally:
        recorder.close()

    seen = opened(keys, recorder.payloads())
    failures = []
    for topic, kind, sender, body in seen:
        try:
            msg = decode(kind, body)
        except MessageError as e:
            failures.append(f"{kind} from {sender} on {topic}: {e}")
            continue
        if body.get("v") != VERSION:
            failures.append(f"{kind} from {sender} on {topic}: no version {VERSION}")
        if decode(*encode(msg)) != msg:
            failures.append(f"{kind} from {sender} on {topic}: not the same once sent on")
    assert not failures, "\n".join(failures[:20])
    kinds = {kind for _, kind, _, _ in seen}
    assert EXPECTED <= kinds, EXPECTED - kinds
    senders = {sender for _, _, sender, _ in seen}
    assert {"head", "worker:w1", "worker:w2", "relay:login"} <= senders
    assert len(seen) > 100      # a real run's worth: heartbeats, leases, samples...
