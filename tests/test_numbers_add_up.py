"""Every number adds up: scontrol show job, squeue --json, sacct --json, seff, report, sshare and
/metrics agree on each job's GPUs, GPU-seconds and billing, for whole GPUs, a MIG slice, an MPS
share and a multi-node job (within 0.1%).

A slice or share counts its fraction of its GPU (gpud.sched.gpustate.device_fraction: a
1g.10gb slice of an A100 is 1/7, an MPS share its memory over the GPU's), as the fair-share
usage has always billed it; a multi-node job counts the GPUs of all its nodes.  sshare's raw
usage is the oracle the others are held to (Slurm's sshare: "RawUsage The number of tres-secs
(cpu-secs if TRESBillingWeights is not defined) charged to the account by jobs").
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from gpud.gpu import mig
from gpuctl.commands.scontrol import job_record
from gpuctl.commands.seff import seff_text
from tests.slurm_head import ALICE
from tests.test_gpu_sharing_head import Kit, a100, h100

GiB = 1024
RUN = 100.0    # seconds each job runs


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b), 1e-9)


@pytest.fixture
async def kit(tmp_path):
    async with Kit(tmp_path) as k:
        k.head.cfg = replace(k.head.cfg, sched=replace(k.head.cfg.sched, fairshare_half_life=None))
        yield k


def setup_nodes(kit: Kit) -> None:
    from gpud.head.store import NodeRecord
    from gpud.model import GpuInfo, NodeInfo

    kit.put_node(a100(0, mig.named_layout("A100-80GB", "all-1g.10gb"), dynamic=False), h100(1, "mps"), name="n1")
    for name in ("w1", "w2"):
        gpus = tuple(GpuInfo(i, f"GPU-{name}-{i}", "H100-80GB", 80 * GiB) for i in range(4))
        info = NodeInfo(name, 64, 512 * GiB, gpus, labels={"addr": f"10.0.0.{name[1]}"})
        kit.store.nodes[name] = NodeRecord(name, info.to_dict(), "UP", None, kit.clock(), kit.clock())


def metric(kit: Kit, name: str, account: str = "default") -> float:
    text = kit.head.metrics.render().decode()
    m = re.search(rf'^{name}{{account="{account}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def raw_usage(kit: Kit) -> float:
    rows = (await kit.call("sshare"))["rows"]
    return sum(r["raw_usage"] for r in rows if r["user"] == ALICE.user)


@pytest.mark.parametrize("request_, held", [
    ({"gpus": 2, "nodelist": ["w1"]}, 2.0),                      # whole GPUs
    ({"mig_profile": "1g.10gb", "gpus": 1}, 1 / 7),              # a slice: 1/7 of an A100
    ({"gpu_mem_mb": "20G", "gpu_type": "H100-80GB"}, 0.25),      # an MPS share: 20 of 80 GB
    ({"nodes": 2, "gpus": 8}, 8.0),                              # four on each of two nodes
], ids=["whole", "mig", "mps", "multi-node"])
async def test_every_view_agrees_on_gpus_gpu_seconds_and_billing(kit, request_, held):
    setup_nodes(kit)
    usage0, seconds0 = await raw_usage(kit), metric(kit, "gpud_account_gpu_seconds_total")
    job_id = await kit.submit(ALICE, **request_)
    await kit.schedule()
    job = kit.job(job_id)
    assert job.state.value == "RUNNING", job.reason
    start = job.start_time
    kit.clock.advance(RUN)
    # while it runs: squeue --json, scontrol show job, /metrics
    [listed] = (await kit.call("jobs", job_ids=[job_id]))["jobs"]
    [shown] = (await kit.call("show", kind="job", job_ids=[job_id]))["jobs"]
    assert close(listed["gpus_held"], held) and close(shown["gpus_held"], held)
    assert close(listed["billing"], held) and f"billing={shown['billing']:g}" in " ".join(job_record(shown))
    assert close(metric(kit, "gpud_account_gpus_allocated"), held)
    assert close(metric(kit, "gpud_account_gpu_seconds_total") - seconds0, held * RUN)
    await kit.finish(job_id)
    await kit.schedule()                     # the usage ledger charges the ended job
    end = (await kit.record(job_id)).end_time
    assert close(end - start, RUN)
    # after: sacct --json, seff, report, sshare, /metrics
    [acct] = (await kit.call("jobs", job_ids=[job_id], all=True))["jobs"]
    assert close(acct["gpus_held"] * (acct["end_time"] - acct["start_time"]), held * RUN)
    seff = await kit.call("seff", job_id=job_id)
    assert close(seff["alloc_gpu_s"], held * RUN) and close(seff["gpus_held"], held)
    report = await kit.call("report", since=start, until=end + 1)
    assert close(report["total"]["gpu_hours"] * 3600, held * RUN)
    assert close(report["total"]["billed"] * 3600, held * RUN)
    assert close(await raw_usage(kit) - usage0, held * RUN)
    assert close(metric(kit, "gpud_account_gpu_seconds_total") - seconds0, held * RUN)
    assert metric(kit, "gpud_account_gpus_allocated") == 0
    text = seff_text(seff)
    if request_.get("nodes"):
        assert "GPUs: 8 x H100-80GB on w[1-2]" in text
    if held < 1:   # a slice or share: only what NVML can measure for it
        assert "not measured" in text and "GPU Utilized" not in text


async def test_seven_slice_jobs_bill_one_gpu_between_them(kit):
    """Seven 4 s 1g.10gb jobs on one A100 are 4 GPU-seconds, as sshare charges."""
    setup_nodes(kit)
    jobs = [await kit.submit(ALICE, mig_profile="1g.10gb", gpus=1) for _ in range(7)]
    await kit.schedule()
    start = kit.clock()
    assert all(kit.job(j).state.value == "RUNNING" for j in jobs)
    kit.clock.advance(4)
    for j in jobs:
        await kit.finish(j)
    await kit.schedule()
    report = await kit.call("report", since=start, until=start + 5)
    assert close(report["total"]["gpu_hours"] * 3600, 4.0)
    assert close(await raw_usage(kit), 4.0)
    assert close(metric(kit, "gpud_account_gpu_seconds_total"), 4.0)
