"""The scheduling policy through the real daemons: quota reclaim with a grace time, sprio/sshare."""

from __future__ import annotations

import json

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

POLICY = """
[[partition]]
name = "gpu"
nodes = ["*"]
default = true
default_time = "1h"

[preemption]
exempt_time = "0s"   # B's jobs have only just started; the cap is tested in the core's tests

[qos.normal]
grace_time = "3s"

[accounts.a]
gpu_quota = 8
users = ["*"]

[accounts.b]
gpu_quota = 8
users = ["*"]
"""

# Stops cleanly on SIGTERM within the grace time, like a job that checkpoints.
SLEEPER = "trap 'exit 0' TERM; sleep 600 & wait"


def test_quota_reclaim_preempts_only_borrowed_jobs(tmp_path, mosquitto):  # noqa: F811
    with Cluster(tmp_path / "c", mosquitto.url, extra_toml=POLICY) as c:
        c.start_head()
        c.start_worker("w1", "8xH100-80GB")
        c.start_worker("w2", "8xH100-80GB")
        with c.client() as client:
            b_jobs = [client.submit(wrap=SLEEPER, gpus=1, account="b", stdout="/dev/null", work_dir=str(tmp_path))
                      for _ in range(16)]
        wait_for(lambda: all(c.jobs(all=False).get(j, {}).get("state") == "RUNNING" for j in b_jobs), 60,
                 "B to run on all 16 GPUs")
        before = c.jobs(all=False)
        borrowed = {j for j in b_jobs if before[j]["borrowed"]}
        assert len(borrowed) == 8, "B runs 8 GPUs beyond its quota of 8"

        with c.client() as client:
            a_jobs = [client.submit(wrap=SLEEPER, gpus=1, account="a", stdout="/dev/null", work_dir=str(tmp_path))
                      for _ in range(8)]
        wait_for(lambda: all(c.jobs(all=False).get(j, {}).get("state") == "RUNNING" for j in a_jobs), 60,
                 "A's jobs to run on reclaimed GPUs")
        after = c.jobs(all=False)
        for j in b_jobs:
            if j in borrowed:
                assert after[j]["state"] == "PENDING" and after[j]["preempt_count"] == 1
            else:
                assert after[j]["state"] == "RUNNING" and after[j]["attempt"] == 1 and after[j]["preempt_count"] == 0
        # The preempted jobs keep their ids and submit times.
        assert all(after[j]["submit_time"] == before[j]["submit_time"] for j in borrowed)

        prio = json.loads(c.gpuctl("sprio", "--json").stdout)["jobs"]
        assert {p["job_id"] for p in prio} == borrowed
        assert all(set(p["factors"]) >= {"age", "fairshare", "job_size", "qos", "partition"} for p in prio)
        shares = json.loads(c.gpuctl("sshare", "--json").stdout)["rows"]
        accounts = {r["account"] for r in shares if r["user"] is None}
        assert {"a", "b"} <= accounts
        c.gpuctl("scancel", "-u", "root")


CLAIMS = """
[scheduler.weights]   # age alone orders the queue: a requeued victim outranks its preemptor
qos = 0
fairshare = 0
job_size = 0
partition = 0

[preemption]
exempt_time = "0s"

[qos.normal]

[qos.high]
preempt = ["low"]

[qos.low]
grace_time = "2s"
"""


def test_the_gpu_a_preemption_frees_goes_to_the_preemptor(tmp_path, mosquitto):  # noqa: F811
    with Cluster(tmp_path / "c", mosquitto.url, extra_toml=CLAIMS) as c:
        c.start_head()
        c.start_worker("w1", "1xH100-80GB")
        with c.client() as client:
            low = client.submit(wrap=SLEEPER, gpus=1, qos="low", stdout="/dev/null", work_dir=str(tmp_path))
            wait_for(lambda: c.jobs(all=False).get(low, {}).get("state") == "RUNNING", 60, "low to run")
            high = client.submit(wrap=SLEEPER, gpus=1, qos="high", stdout="/dev/null", work_dir=str(tmp_path))
        # Without the claim the requeued low job (older, so first in the queue) took the GPU
        # back and was preempted again, up to max_per_job, while high never ran.
        wait_for(lambda: c.jobs(all=False).get(high, {}).get("state") == "RUNNING", 60, "high to run")
        jobs = c.jobs(all=False)
        assert jobs[low]["state"] == "PENDING" and jobs[low]["preempt_count"] == 1
        c.gpuctl("scancel", str(high))
        wait_for(lambda: c.jobs(all=False).get(low, {}).get("state") == "RUNNING", 60, "low to run again")
        assert c.jobs(all=False)[low]["preempt_count"] == 1
        c.gpuctl("scancel", "-u", "root")
