"""The head's metrics in-process: counters fed by committed transitions (by-hand numbers on a
fake clock), and the Grafana dashboard asking only for metrics the head exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpud.head.store import Txn
from gpud.model import JobState
from tests.telemetry_rig import config, rig

DASHBOARD = Path(__file__).resolve().parent.parent / "etc" / "grafana" / "gpud.json"


def parse(text: bytes) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


async def test_counters_follow_committed_transitions(tmp_path):
    async with rig(tmp_path, config(idle_period=30, idle_action="requeue")) as r:
        await r.add_node("n1", "4xH100-80GB")
        done = await r.submit(gpus=2, util="90", account="default")
        idle = await r.submit(gpus=1, util="0")
        await r.schedule()
        await r.run_for(40, every=10)                  # the idle job is flagged and stopped at +30 s
        assert r.job(idle).stop_reason == "idle:requeue"
        await r.finish(idle, reason="preempted")       # back to the queue: 1 GPU x 40 s charged
        await r.finish(done)                           # 2 GPUs x 40 s
        waiting = await r.submit(gpus=1, util="50")
        txn = Txn(r.store)
        txn.transition(r.job(waiting), JobState.CANCELLED, now=r.clock(), event="cancelled", end_time=r.clock())
        await r.store.commit(txn)
        await r.schedule()                             # the requeued job starts again
        r.clock.t += 20
        running = r.job(idle)
        txn = Txn(r.store)
        txn.transition(running, JobState.COMPLETING, now=r.clock(), event="preempted",
                       stop_reason="preempted:requeue", stop_time=r.clock())
        await r.store.commit(txn)

        m = parse(r.head.metrics.render())
        assert m[("gpud_job_outcomes_total", ("partition", "gpu"), ("state", "COMPLETED"))] == 1
        assert m[("gpud_job_outcomes_total", ("partition", "gpu"), ("state", "CANCELLED"))] == 1
        assert m[("gpud_job_requeues_total", ("partition", "gpu"))] == 1
        assert m[("gpud_idle_gpu_flags_total", ("action", "requeue"), ("partition", "gpu"))] == 1
        assert m[("gpud_preemptions_total", ("partition", "gpu"))] == 1
        # 2 x 40 + 1 x 40 ended, plus the running one's 1 GPU x 20 s so far
        assert m[("gpud_account_gpu_seconds_total", ("account", "default"))] == pytest.approx(140.0)
        assert m[("gpud_account_gpus_allocated", ("account", "default"))] == 1
        assert m[("gpud_jobs", ("partition", "gpu"), ("reason", ""), ("state", "COMPLETING"))] == 1
        assert m[("gpud_gpus_allocated", ("mode", "whole"), ("model", "H100-80GB"), ("node", "n1"))] == 1
        assert m[("gpud_scheduler_pass_seconds_count",)] == 2
        r.clock.t += 10
        later = parse(r.head.metrics.render())
        assert later[("gpud_account_gpu_seconds_total", ("account", "default"))] == pytest.approx(150.0)


async def test_stale_samples_are_not_exported(tmp_path):
    async with rig(tmp_path) as r:
        await r.add_node("n1", "1xA30-24GB")
        await r.sample("n1")
        uuid = r.head.store.nodes["n1"].info["gpus"][0]["uuid"]
        key = ("gpud_gpu_utilization_ratio", ("Hostname", "n1"), ("UUID", uuid), ("gpu", "0"),
               ("model", "A30-24GB"), ("modelName", "A30-24GB"), ("node", "n1"))
        assert key in parse(r.head.metrics.render())
        r.clock.t += 60                                     # twelve intervals without a sample
        m = parse(r.head.metrics.render())
        assert key not in m
        assert m[("gpud_gpus_busy", ("mode", "whole"), ("model", "A30-24GB"), ("node", "n1"))] == 0


async def test_the_grafana_dashboard_uses_only_exported_metrics(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bgpud_[a-z_]+", e)}
    async with rig(tmp_path) as r:
        exported = set()
        for family in text_string_to_metric_families(r.head.metrics.render().decode()):
            exported.add(family.name)
            exported |= {family.name + s for s in ("_total", "_bucket", "_count", "_sum")}
    assert used and used <= exported, used - exported
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


async def test_the_fast_writer_says_what_prometheus_client_would(tmp_path):
    from prometheus_client import generate_latest

    async with rig(tmp_path) as r:
        await r.add_node('n"1', "2xH100-80GB")               # a label value that needs escaping
        await r.submit(gpus=1, util="75")
        await r.schedule()
        await r.sample('n"1')
        r.head.metrics.observe_pass(0.003)
        fast, reference = r.head.metrics.render(), generate_latest(r.head.metrics.registry)
        assert parse(fast) == parse(reference)
        assert len(parse(fast)) > 30


async def test_fragmentation_per_partition_agrees_with_the_partition_records(tmp_path):
    from gpud.head.ops_slurm import partitions

    async with rig(tmp_path) as r:
        await r.add_node("n1", "8xH100-80GB")
        await r.add_node("n2", "8xH100-80GB")
        m = parse(r.head.metrics.render())
        assert m[("gpud_gpus_free", ("partition", "gpu"))] == 16
        assert m[("gpud_gpu_requests_servable", ("partition", "gpu"), ("size", "8"))] == 2
        assert m[("gpud_gpu_fragmentation", ("partition", "gpu"), ("size", "8"))] == 0.0
        await r.submit(gpus=1)
        await r.schedule()                             # one GPU taken: that node serves no 8-GPU job
        m = parse(r.head.metrics.render())
        assert m[("gpud_gpus_free", ("partition", "gpu"))] == 15
        assert m[("gpud_gpu_requests_servable", ("partition", "gpu"), ("size", "8"))] == 1
        assert m[("gpud_gpu_fragmentation", ("partition", "gpu"), ("size", "8"))] == pytest.approx(7 / 15)
        (part,) = partitions(r.head)
        assert (part["gpus_free"], part["gpus_servable"], part["servable_size"]) == (15, 1, 8)
        assert part["fragmentation"] == pytest.approx(7 / 15, abs=1e-4)


async def test_per_node_state_owners_memory_energy_and_dcgm_labels(tmp_path):
    """/metrics: no reason="None" for running jobs; one state series per node
    (to alert on one node down); jobs per account and user; GPU memory total/used/free;
    energy; the labels dcgm-exporter puts on its series (Hostname, UUID, modelName);
    utilization as a 0-1 ratio; and a Content-Type that names the format the body is in."""
    from gpud.head.metrics import CONTENT_TYPE

    async with rig(tmp_path) as r:
        await r.add_node("n1", "1xA30-24GB")
        await r.add_node("n2", "1xA30-24GB")
        await r.sample("n1")
        await r.sample("n1")
        r.head.store.nodes["n2"].state = "DOWN"
        await r.submit(gpus=1, user="bob", account="default")
        m = parse(r.head.metrics.render())
        assert m[("gpud_account_jobs", ("account", "default"), ("state", "PENDING"), ("user", "bob"))] == 1
        assert all(dict(k[1:]).get("reason") != "None" for k in m if k[0] == "gpud_jobs")
        assert m[("gpud_node_state", ("node", "n1"), ("state", "UP"))] == 1
        assert m[("gpud_node_state", ("node", "n2"), ("state", "DOWN"))] == 1
        uuid = r.head.store.nodes["n1"].info["gpus"][0]["uuid"]
        gpu = (("Hostname", "n1"), ("UUID", uuid), ("gpu", "0"), ("model", "A30-24GB"), ("modelName", "A30-24GB"),
               ("node", "n1"))
        total, used = m[("gpud_gpu_memory_total_bytes", *gpu)], m[("gpud_gpu_memory_used_bytes", *gpu)]
        assert total == 24 * 1024 ** 3 or total > used
        assert m[("gpud_gpu_memory_free_bytes", *gpu)] == total - used
        assert m[("gpud_gpu_energy_joules_total", *gpu)] > 0
        assert 0 <= m[("gpud_gpu_utilization_ratio", *gpu)] <= 1
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
