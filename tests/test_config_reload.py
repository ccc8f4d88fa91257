"""Reloading the head's config: SIGHUP and the reconfigure op, good and bad files.

A real head and worker over a real Mosquitto: a reload applies the new policy, admins and
timeouts, reports what needs a restart, and never touches a running job; an invalid file is
refused, logged line by line, and the running config stays.  The in-process tests cover the
same rules on a ``Head`` object without processes.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from gpud import config
from gpud.bus.memory import MemoryBroker, MemoryBus
from gpud.config import ConfigError
from gpud.head import ops_admin
from gpud.ctlsocket import Caller, RequestError
from gpud.head.daemon import Head
from gpud.head.store import Store
from gpud.protocol import RemoteError
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

ROOT = Caller(uid=0, gid=0, pid=1, user="root")
STRANGER = Caller(uid=54321, gid=54321, pid=1, user="stranger")


# -- a real head --------------------------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url)
    yield c
    c.close()


def show(cluster: Cluster) -> dict:
    with cluster.client() as client:
        return client.call("show_config")["config"]


def running_snapshot(job: dict) -> tuple:
    return job["state"], job["node"], job["attempt"], job["start_time"], tuple(job["gpu_ids"])


@pytest.mark.slow
def test_reload_applies_good_configs_refuses_bad_ones_and_leaves_jobs_alone(cluster, tmp_path):
    original = cluster.config.read_text()
    cluster.start_head()
    cluster.start_worker("n1", "2xH100-80GB")
    job = cluster.sbatch("--gpus", "1", "--wrap", "sleep 600")
    before = running_snapshot(cluster.wait_job_state(job, "RUNNING"))
    assert show(cluster)["head"]["admins"] == []

    # 1. SIGHUP with a good file: admins, timeouts and policy change at once.
    good = original.replace("[head]\n", '[head]\nadmins = ["ops"]\n') + "[qos.normal]\n[qos.gold]\npriority = 500\n"
    cluster.config.write_text(good)
    cluster.head.send_signal(signal.SIGHUP)
    wait_for(lambda: show(cluster)["head"]["admins"] == ["ops"], 30, "SIGHUP reload to apply")
    assert show(cluster)["qos"]["gold"]["priority"] == 500

    # 2. SIGHUP with a bad file: refused, every problem logged, the running config kept.
    bad = good.replace("priority = 500", "priority = 500\npreempt = [\"bronze\"]") + "[head.extra]\n"
    cluster.config.write_text(bad)
    bad_line = bad.splitlines().index('preempt = ["bronze"]') + 1
    cluster.head.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload refused: the running configuration is kept" in cluster.log("head"), 30,
             "the refusal to be logged")
    log = cluster.log("head")
    assert f"reload refused: {cluster.config}:{bad_line}: qos.gold.preempt: no QOS 'bronze'" in log
    assert f"reload refused: {cluster.config}:{len(bad.splitlines())}: head.extra: unknown setting" in log
    assert show(cluster)["head"]["admins"] == ["ops"] and "gold" in show(cluster)["qos"]
    assert cluster.head.poll() is None

    # 3. The reconfigure op with a good file: live settings applied, the rest reported.
    cluster.config.write_text(good.replace('cluster = "test"', 'cluster = "renamed"')
                              .replace('kill_grace = "2.0s"', 'kill_grace = "7s"'))
    with cluster.client() as client:
        result = client.call("reconfigure")
    assert result["restart_needed"] == [
        "cluster changed from 'test' to 'renamed': needs a restart; the running value is kept"]
    cfg = show(cluster)
    assert cfg["cluster"] == "test" and cfg["head"]["kill_grace"] == 7.0

    # 4. The reconfigure op with a bad file: the caller hears the first problem.
    cluster.config.write_text(bad)
    with cluster.client() as client, pytest.raises(RemoteError) as e:
        client.call("reconfigure")
    assert str(e.value) == (f"reconfigure refused, running configuration kept: {cluster.config}:{bad_line}: "
                            "qos.gold.preempt: no QOS 'bronze'; define [qos.bronze] or remove it "
                            "(and 1 more: run gpud check-config)")
    assert show(cluster)["head"]["kill_grace"] == 7.0

    # The job ran through all of it, untouched, and the head still schedules.
    assert running_snapshot(cluster.job(job)) == before
    cluster.config.write_text(good)
    done = cluster.sbatch("--gpus", "1", "--qos", "gold", "--wrap", "true")
    assert cluster.wait_job_state(done, {"COMPLETED", "FAILED"})["state"] == "COMPLETED"
    assert running_snapshot(cluster.job(job)) == before


# -- the same rules in process --------------------------------------------------------------------

@pytest.fixture
async def head(tmp_path):
    path = tmp_path / "gpud.toml"
    path.write_text("cluster = \"c\"\n[head]\nkill_grace = 10\n")
    cfg = config.load(str(path))
    async with Store(str(tmp_path / "head.db")) as store:
        bus = MemoryBus(MemoryBroker(), "c", "head", b"k" * 32)
        yield Head(cfg, bus, store, socket_path=str(tmp_path / "s.sock"))


async def test_reconfigure_swaps_live_settings(head):
    notes = head.reconfigure(replace(head.cfg, cluster="other",
                                     head=replace(head.cfg.head, admins=("ops",), kill_grace=3.0)))
    assert head.cfg.head.kill_grace == 3.0 and head.admins == frozenset({"ops"}) and head.cfg.cluster == "c"
    assert notes == ["cluster changed from 'c' to 'other': needs a restart; the running value is kept"]


async def test_reload_reads_the_file_and_keeps_the_old_config_on_errors(head, caplog):
    path = Path(head.cfg.path)
    path.write_text("cluster = \"c\"\n[head]\nkill_grace = 20\n")
    assert head.reload("test") == [] and head.cfg.head.kill_grace == 20
    path.write_text("cluster = \"c\"\n[head]\nkill_grace = \"whenever\"\n")
    with pytest.raises(ConfigError):
        head.reload("test")
    assert head.cfg.head.kill_grace == 20
    assert f"reload refused: {path}:3: head.kill_grace: invalid duration 'whenever'" in caplog.text


async def test_reconfigure_op_is_for_admins_and_show_config_hides_the_password(head):
    if os.geteuid() == STRANGER.uid:
        pytest.skip("needs a uid other than the stranger's")
    with pytest.raises(RequestError, match="Access/permission denied"):
        await ops_admin.op_reconfigure(head, STRANGER, {})
    head.admins = frozenset({"stranger"})
    assert (await ops_admin.op_reconfigure(head, STRANGER, {}))["restart_needed"] == []
    head.cfg = replace(head.cfg, broker=replace(head.cfg.broker, password="hunter2"))
    shown = await ops_admin.op_show_config(head, STRANGER, {})
    assert shown["config"]["broker"]["password"] == config.REDACTED
    assert shown["config"]["head"]["database"] == head.cfg.database
    assert shown["path"] == head.cfg.path
