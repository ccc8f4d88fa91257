"""``/metrics`` of a real head process, scraped over HTTP and parsed with prometheus-client's own
text parser; every value is checked against the cluster state gpuctl reports at that moment."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_head_settings(cluster: Cluster, lines: str) -> None:
    """Add settings to the [head] table of the cluster's gpud.toml."""
    text = cluster.config.read_text()
    cluster.config.write_text(text.replace("[head]\n", "[head]\n" + lines, 1))


def scrape(url: str) -> dict[tuple, float]:
    """Every sample as {(name, (label, value)...): value}."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def get(samples: dict, name: str, **labels) -> float | None:
    """The one sample of ``name`` with these labels (and perhaps others, such as dcgm-exporter's)."""
    wanted = set(labels.items())
    found = [v for k, v in samples.items() if k[0] == name and wanted <= set(k[1:])]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@pytest.fixture
def cluster(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url, extra_toml='sample_interval = "0.3s"\n')
    port = free_port()
    with_head_settings(c, f'metrics_listen = "127.0.0.1:{port}"\n')
    c.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield c
    with c.client() as client:
        client.cancel(users=["root"])
    wait_for(lambda: all(j["state"] in TERMINAL for j in c.jobs().values()), 60, "jobs to end")
    c.close()


def submit(cluster: Cluster, tmp_path: Path, util: str, **kw) -> int:
    with cluster.client() as client:
        return client.submit(wrap=kw.pop("wrap", "sleep 120"), env={"GPUD_SIM_UTIL": util}, stdout="/dev/null",
                             work_dir=str(tmp_path), **kw)


def test_metrics_match_the_cluster_state(cluster, tmp_path):
    cluster.start_head()
    cluster.start_worker("w1", "4xH100-80GB")
    cluster.start_worker("w2", "2xA100-80GB")
    done = submit(cluster, tmp_path, "50", wrap="true", gpus=1)
    cluster.wait_job_state(done, "COMPLETED")
    busy = submit(cluster, tmp_path, "90", gpus=2, gpu_type="H100-80GB")
    idle = submit(cluster, tmp_path, "0", gpus=1, gpu_type="A100-80GB")
    cluster.wait_job_state(busy, "RUNNING")
    cluster.wait_job_state(idle, "RUNNING")
    huge = submit(cluster, tmp_path, "100", gpus=2, gpu_type="A100-80GB")     # waits for the idle job
    held = submit(cluster, tmp_path, "100", gpus=1, hold=True)
    with cluster.client() as client:
        client.cancel(job_ids=[held])

    def consistent():
        """A scrape and a gpuctl view that agree on what is running and sampled."""
        samples = scrape(cluster.metrics_url)
        jobs, nodes = cluster.jobs(all=False), cluster.nodes()
        if get(samples, "gpud_gpus_busy", node="w1", model="H100-80GB", mode="whole") != 2:
            return None   # the first samples are not in yet
        if get(samples, "gpud_jobs", state="PENDING", reason="Resources", partition="gpu") is None:
            return None   # no pass has given the big job its reason yet
        sampled = jobs.get(idle, {}).get("gpu_indices") or []
        if (not sampled or get(samples, "gpud_gpu_utilization_ratio", node="w2", gpu=str(sampled[0]),
                                   model="A100-80GB") is None
                or any(jobs.get(j, {}).get("gpu_util_mean") is None for j in (busy, idle))):
            return None   # w2's samples (a worker of its own, reporting on its own clock) are not in yet
        return samples, jobs, nodes

    samples, jobs, nodes = wait_for(consistent, 60, "metrics to catch up")

    # Jobs by state, reason and partition: as squeue lists them.
    by_state: dict[tuple, int] = {}
    for j in jobs.values():
        key = (j["state"], j["reason"] or "", j["partition"])
        by_state[key] = by_state.get(key, 0) + 1
    exported = {(dict(k[1:])["state"], dict(k[1:])["reason"], dict(k[1:])["partition"]): v
                for k, v in samples.items() if k[0] == "gpud_jobs"}
    assert exported == by_state
    assert by_state == {("RUNNING", "", "gpu"): 2, ("PENDING", "Resources", "gpu"): 1}
    assert jobs[huge]["reason"] == "Resources"

    # GPUs: totals and allocations as sinfo shows them; busy from the samples.
    for name, model, total, alloc, n_busy in (("w1", "H100-80GB", 4, 2, 2), ("w2", "A100-80GB", 2, 1, 0)):
        assert (nodes[name]["gpus_total"], nodes[name]["gpus_alloc"]) == (total, alloc)
        labels = {"node": name, "model": model, "mode": "whole"}
        assert get(samples, "gpud_gpus", **labels) == total
        assert get(samples, "gpud_gpus_allocated", **labels) == alloc
        assert get(samples, "gpud_gpus_busy", **labels) == n_busy
    for i in jobs[busy]["gpu_indices"]:
        assert get(samples, "gpud_gpu_utilization_ratio", node="w1", gpu=str(i), model="H100-80GB") == 0.9
    (i,) = jobs[idle]["gpu_indices"]
    assert get(samples, "gpud_gpu_utilization_ratio", node="w2", gpu=str(i), model="A100-80GB") == 0.0
    assert get(samples, "gpud_gpu_power_watts", node="w2", gpu=str(i), model="A100-80GB") == 40.0
    assert get(samples, "gpud_nodes", state="UP") == 2

    # What happened: outcomes, GPU-seconds by account, scheduler passes.
    assert get(samples, "gpud_job_outcomes_total", state="COMPLETED", partition="gpu") == 1
    assert get(samples, "gpud_job_outcomes_total", state="CANCELLED", partition="gpu") == 1
    assert get(samples, "gpud_account_gpus_allocated", account="default") == 3
    assert get(samples, "gpud_account_gpu_seconds_total", account="default") > 0
    assert get(samples, "gpud_scheduler_pass_seconds_count") >= 1
    assert get(samples, "gpud_jobs_gpu_idle", partition="gpu") == 0
    assert get(samples, "gpud_telemetry_samples_dropped_total") == 0

    # The running jobs' GPU utilization reaches squeue too.
    assert jobs[busy]["gpu_util_mean"] == pytest.approx(90.0)
    assert jobs[idle]["gpu_util_mean"] == 0.0


def test_metrics_endpoint_answers_only_what_it_serves(cluster):
    cluster.start_head()
    base = cluster.metrics_url.rsplit("/", 1)[0]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/nope", timeout=10)
    assert e.value.code == 404
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"\x00garbage\r\n\r\n")
        s.recv(100)
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")    # and hangs up half-way
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(cluster.metrics_url, method="POST", data=b"x"), timeout=10)
    assert e.value.code == 405
    assert cluster.head.poll() is None                                   # still serving
    assert "gpud_jobs" in urllib.request.urlopen(cluster.metrics_url, timeout=10).read().decode()


def test_a_head_whose_metrics_address_is_taken_says_so_and_exits(tmp_path, mosquitto):  # noqa: F811
    c = Cluster(tmp_path / "c", mosquitto.url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with_head_settings(c, f'metrics_listen = "127.0.0.1:{taken.getsockname()[1]}"\n')
        head = c.start_head(wait=False)
        assert head.wait(60) == 1
    c.close()
    last = c.log("head").strip().splitlines()[-1]
    assert last.startswith("gpud: error: cannot serve /metrics on 127.0.0.1:") and "metrics_listen" in last
    assert not (tmp_path / "c" / "gpud.sock").exists()
