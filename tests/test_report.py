"""Usage reports: a scripted cluster with known jobs, GPU types and prices, checked against
totals computed by hand; then the same numbers through ``gpuctl report`` and ``gpuctl seff``."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
import sys
import time

import pytest

from gpud.ctlsocket import Caller
from gpud.head.ops_telemetry import op_report, op_seff
from gpud.head.reports import Allocation, JobShares, compute
from gpud.sched.config import AccountConfig, SchedConfig
from tests.cluster import env_for_children
from tests.telemetry_rig import T0, config, rig

H = 3600.0
ME = Caller(uid=0, gid=0, pid=1, user="root")
PRICES = {"H100-80GB": 2.5, "A100-80GB": 1.2}
WEIGHTS = {"H100-80GB": 2.0}
ACCOUNTS = {"physics": AccountConfig("physics", users=("alice", "bob")),
            "vision": AccountConfig("vision", users=("carol",))}


async def scenario(r):
    """Four jobs on two nodes, sampled every five minutes, as in the table below.

    job  user   account  GPUs       runs (hours from T0)  declared utilization
    1    alice  physics  2 x H100   0    - 2              80 %
    2    bob    physics  1 x A100   0    - 1              0 %
    3    carol  vision   2 x H100   0    - still running  50 % and 0 %
    4    alice  physics  1 x A100   1    - 1.5            100 %
    """
    await r.add_node("h1", "4xH100-80GB")
    await r.add_node("a1", "2xA100-80GB")
    j1 = await r.submit(user="alice", account="physics", gpus=2, gpu_type="H100-80GB", util="80")
    j2 = await r.submit(user="bob", account="physics", gpus=1, gpu_type="A100-80GB", util="0")
    j3 = await r.submit(user="carol", account="vision", gpus=2, gpu_type="H100-80GB", util="50,0")
    await r.schedule()
    assert {r.job(j).node for j in (j1, j3)} == {"h1"} and r.job(j2).node == "a1"
    await r.run_for(H, every=300)
    await r.finish(j2)
    j4 = await r.submit(user="alice", account="physics", gpus=1, gpu_type="A100-80GB", util="100")
    await r.schedule()
    await r.run_for(H / 2, every=300)
    await r.finish(j4)
    await r.run_for(H / 2, every=300)
    await r.finish(j1)
    await r.head.telemetry.flush()
    await r.run_for(H * 0.75, every=300)       # job 3 goes on; its latest samples are not flushed
    return j1, j2, j3, j4


def by_key(result) -> dict:
    return {row["key"]: row for row in result["rows"]} | {"TOTAL": result["total"]}


def check(row, gpu_hours, billed, cost, util, idle, jobs):
    assert row["gpu_hours"] == pytest.approx(gpu_hours)
    assert row["billed"] == pytest.approx(billed)
    assert row["cost"] == pytest.approx(cost)
    assert row["util_mean"] == (None if util is None else pytest.approx(util))
    assert row["idle_gpu_hours"] == pytest.approx(idle)
    assert row["jobs"] == jobs


async def test_report_totals_match_the_numbers_computed_by_hand(tmp_path):
    cfg = config(prices=PRICES, billing=WEIGHTS, accounts=ACCOUNTS, default_account="physics")
    async with rig(tmp_path, cfg) as r:
        await scenario(r)
        # The window: from an hour before T0 to T0 + 2.5 h; job 3 counts 2.5 h of its 2 GPUs.
        window = {"since": T0 - H, "until": T0 + 2.5 * H}
        acc = by_key(await op_report(r.head, ME, {**window, "by": "account"}))
        # physics: job 1 = 2 H100 x 2 h = 4 GPU-h, job 2 = 1 A100 x 1 h, job 4 = 1 A100 x 0.5 h
        #   billed 4 x 2 + 1.5 x 1 = 9.5; cost 4 x 2.5 + 1.5 x 1.2 = 11.8
        #   util (4 x 80 + 1 x 0 + 0.5 x 100) / 5.5; idle: job 2's hour
        check(acc["physics"], 5.5, 9.5, 11.8, 370 / 5.5, 1.0, 3)
        # vision: job 3 = 2 H100 x 2.5 h = 5; util (50 + 0) / 2 = 25 %; one of its two GPUs idle
        check(acc["vision"], 5.0, 10.0, 12.5, 25.0, 2.5, 1)
        check(acc["TOTAL"], 10.5, 19.5, 24.3, (370 + 125) / 10.5, 3.5, 4)
        assert list(acc) == ["physics", "vision", "TOTAL"]

        users = by_key(await op_report(r.head, ME, {**window, "by": "user"}))
        check(users["alice"], 4.5, 8.5, 10.6, 370 / 4.5, 0.0, 2)
        check(users["bob"], 1.0, 1.0, 1.2, 0.0, 1.0, 1)
        check(users["carol"], 5.0, 10.0, 12.5, 25.0, 2.5, 1)

        types = by_key(await op_report(r.head, ME, {**window, "by": "gpu-type"}))
        check(types["H100-80GB"], 9.0, 18.0, 22.5, (320 + 125) / 9.0, 2.5, 2)
        check(types["A100-80GB"], 1.5, 1.5, 1.8, 50 / 1.5, 1.0, 2)

        parts = by_key(await op_report(r.head, ME, {**window, "by": "partition"}))
        check(parts["gpu"], 10.5, 19.5, 24.3, (370 + 125) / 10.5, 3.5, 4)

        # A window after everything but job 3: only its 15 minutes up to now (T0 + 2.75 h).
        late = by_key(await op_report(r.head, ME, {"since": T0 + 2.5 * H, "until": T0 + 10 * H}))
        check(late["vision"], 0.5, 1.0, 1.25, 25.0, 0.25, 1)
        assert "physics" not in late


@pytest.mark.parametrize("args, message", [
    ({"since": T0, "until": T0}, "window is empty"),
    ({"by": "qos"}, "cannot group a report by 'qos'"),
    ({"since": "yesterday"}, "since must be a time"),
])
async def test_report_refuses_bad_arguments_with_one_line(tmp_path, args, message):
    from gpud.ctlsocket import RequestError

    async with rig(tmp_path) as r:
        with pytest.raises(RequestError, match=message):
            await op_report(r.head, ME, args)


def test_compute_splits_a_mixed_allocation_by_gpu_type_and_skips_unsampled_jobs():
    models = {("n", 0): "H100-80GB", ("n", 1): "A30-24GB"}
    allocs = [Allocation(1, 1, "u", "a", "p", "n", (0, 1), 0.0, 3600.0),
              Allocation(2, 1, "u", "a", "p", "n", (0,), 3600.0, None)]
    rows, total = compute(allocs, {1: JobShares(util=0.5, idle=0.25)}, lambda n, i: models[(n, i)],
                          SchedConfig(prices={"H100-80GB": 3.0}), since=0.0, until=7200.0, now=5400.0,
                          by="gpu-type")
    got = {r.key: (r.gpu_hours, r.cost, r.util_mean, r.idle_gpu_hours, r.jobs) for r in rows}
    assert got == {"A30-24GB": (1.0, 0.0, 50.0, 0.25, 1), "H100-80GB": (1.5, 4.5, 50.0, 0.25, 2)}
    assert (total.gpu_hours, total.util_mean, total.jobs) == (2.5, 50.0, 2)


# -- the same numbers through gpuctl ------------------------------------------------------------

def local(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def gpuctl(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", sock, *args], capture_output=True,
                          text=True, env=env_for_children(), timeout=60)


async def test_gpuctl_report_and_seff_print_them(tmp_path):
    cfg = config(prices=PRICES, billing=WEIGHTS, accounts=ACCOUNTS, default_account="physics")
    async with rig(tmp_path, cfg) as r:
        j1, j2, j3, j4 = await scenario(r)
        await r.head.server.start()
        try:
            sock = r.head.socket_path
            since, until = local(T0 - H), local(T0 + 2.5 * H)
            res = await asyncio.to_thread(gpuctl, sock, "report", "-S", since, "-E", until, "--csv")
            assert res.returncode == 0, res.stderr
            rows = list(csv.DictReader(io.StringIO(res.stdout)))
            assert [r_["account"] for r_ in rows] == ["physics", "vision", "TOTAL"]
            assert [float(r_["cost"]) for r_ in rows] == pytest.approx([11.8, 12.5, 24.3])
            assert [float(r_["gpu_hours"]) for r_ in rows] == pytest.approx([5.5, 5.0, 10.5])

            table = await asyncio.to_thread(gpuctl, sock, "report", "-S", since, "-E", until, "--by", "user")
            assert table.stdout.splitlines()[1:] == [
                "USER  GPU-HOURS BILLED  COST UTIL% IDLE-GPU-HOURS JOBS",
                "alice      4.50   8.50 10.60  82.2           0.00    2",
                "bob        1.00   1.00  1.20   0.0           1.00    1",
                "carol      5.00  10.00 12.50  25.0           2.50    1",
                "TOTAL     10.50  19.50 24.30  47.1           3.50    4",
            ]
            bad = await asyncio.to_thread(gpuctl, sock, "report", "-S", "soon")
            assert bad.returncode == 2 and bad.stderr.startswith("report: error: invalid time 'soon'")

            seff = await asyncio.to_thread(gpuctl, sock, "seff", str(j1))
            assert seff.returncode == 0, seff.stderr
            lines = seff.stdout.splitlines()
            assert lines[0] == f"Job ID: {j1}" and "State: COMPLETED (exit code 0)" in lines
            assert "GPUs: 2 x H100-80GB on h1" in lines
            assert "GPU Efficiency: 80.00% of 04:00:00 GPU-walltime" in lines
            assert "GPU Memory Utilized: 32.00 GB at most on one GPU (40.00% of 80.00 GB)" in lines
            running = await asyncio.to_thread(gpuctl, sock, "seff", str(j3))
            assert "GPU Efficiency: 25.00% of 05:30:00 GPU-walltime" in running.stdout
            assert running.stdout.rstrip().endswith("may be misleading for RUNNING jobs.")
            missing = await asyncio.to_thread(gpuctl, sock, "seff", "999")
            assert (missing.returncode, missing.stderr) == (1, "seff: error: Invalid job id specified: 999\n")
            data = json.loads((await asyncio.to_thread(gpuctl, sock, "seff", "--json", str(j2))).stdout)
            assert data["idle_gpu_s"] == data["gpu_s"] == 3600.0
        finally:
            await r.head.server.close()


async def test_seff_of_a_job_never_sampled(tmp_path):
    async with rig(tmp_path) as r:
        await r.add_node("n1")
        jid = await r.submit(gpus=1)
        await r.schedule()
        r.clock.t += 2
        await r.finish(jid)
        from gpuctl.commands.seff import seff_text

        text = seff_text(await op_seff(r.head, ME, {"job_id": jid}))
        assert "GPU Efficiency: not sampled (0 of 00:00:02 GPU-walltime)" in text
