"""The worker with shared GPUs: modes in ``register``, the head's ``mig`` command, and jobs
on MIG slices and MPS shares run by the real executor (over the in-memory bus, sim GPUs)."""

from __future__ import annotations

import asyncio
import os
import pwd
from contextlib import asynccontextmanager
from dataclasses import replace

from gpud.bus.base import HEAD_EVENTS, node_status
from gpud.bus.memory import MemoryBroker
from gpud.config import WorkerConfig
from gpud.gpu.sim import SimBackend
from gpud.worker.daemon import Worker
from tests.test_worker_daemon import CLOCK, NODE, WAIT, Rig, head_bus, make_cfg, worker_bus

SPEC = "1xA100-80GB,1xH100-80GB"
MODES = {"0": "mig:dynamic", "1": "mps:thread_percentage=50"}
ME = pwd.getpwuid(os.getuid()).pw_name


@asynccontextmanager
async def sharing_rig(tmp_path, modes=MODES, spec=SPEC):
    broker = MemoryBroker()
    head = head_bus(broker, HEAD_EVENTS, node_status(NODE))
    wbus = worker_bus(broker)
    cfg = make_cfg(tmp_path)
    cfg = replace(cfg, worker=WorkerConfig(name=NODE, sim=spec, heartbeat_interval=cfg.worker.heartbeat_interval,
                                           cpus=8, mem_mb=64000, gpu_modes=modes))
    async with head, wbus:
        r = Rig(worker=None, executor=None, head=head, broker=broker)  # type: ignore[arg-type]

        async def collect():
            async for m in head.messages():
                await r.received(m)

        collector = asyncio.create_task(collect())
        r.worker = Worker(cfg, wbus, SimBackend(spec, NODE), clock=lambda: CLOCK)
        runner = asyncio.create_task(r.worker.run(), name="worker")
        await asyncio.wait_for(r.worker.ready.wait(), WAIT)
        r.executor = r.worker.executor
        await r.wait("heartbeat")
        await r.leased()
        try:
            yield r
        finally:
            for job, attempt in r.executor.running():
                await r.executor.kill(job, attempt)
            await r.executor.close()
            r.worker.stop()
            await asyncio.wait_for(runner, WAIT)
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)


def gpus_of(msg) -> list[dict]:
    return msg.body["node"]["gpus"]


SAVE_ENV = 'env > "$GPUD_SUBMIT_DIR/env.tmp.$GPUD_JOB_ID" && mv "$GPUD_SUBMIT_DIR/env.tmp.$GPUD_JOB_ID" "$GPUD_SUBMIT_DIR/env.$GPUD_JOB_ID"'


def job_body(tmp_path, job: int, gpus: list[dict], script: str = SAVE_ENV, user: str = ME) -> dict:
    pw = pwd.getpwnam(user)
    return {"job_id": job, "attempt": 1, "name": f"job{job}", "user": user, "uid": pw.pw_uid,
            "gid": pw.pw_gid, "script": f"#!/bin/sh\n{script}\n", "work_dir": str(tmp_path),
            "gpus": gpus, "kill_grace": 1.0}


def job_env(tmp_path, job: int) -> dict[str, str]:
    text = (tmp_path / f"env.{job}").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


WAIT_FOR_STOP = 'while [ ! -e "$GPUD_SUBMIT_DIR/stop" ]; do sleep 0.05; done'


async def relay(r: Rig, body: dict) -> list[dict]:
    """Send a mig command; the GPUs the worker registers afterwards."""
    mark = len(r.inbox)
    await r.command("mig", body)
    (msg,) = await r.wait("register", after=mark)
    return gpus_of(msg)


async def test_register_reports_modes(tmp_path):
    async with sharing_rig(tmp_path) as r:
        a100, h100 = gpus_of(r.seen("register")[0])
        assert (a100["mode"], a100["dynamic"], a100["slices"]) == ("mig", True, [])
        assert (h100["mode"], h100["mps_max_clients"], h100["mps_thread_percentage"]) == ("mps", 48, 50)


async def test_static_layout_is_there_at_the_first_register(tmp_path):
    async with sharing_rig(tmp_path, {"*": "mig:all-3g.40gb"}) as r:
        a100, h100 = gpus_of(r.seen("register")[0])
        for g in (a100, h100):
            assert [(s["profile"], s["start"]) for s in g["slices"]] == [("3g.40gb", 0), ("3g.40gb", 4)]
            assert not g["dynamic"] and all(s["uuid"].startswith("MIG-") for s in g["slices"])


async def test_seven_slice_jobs_get_their_mig_uuids_and_a_busy_slice_is_never_destroyed(tmp_path):
    async with sharing_rig(tmp_path) as r:
        gpus = await relay(r, {"gpu": 0, "destroy": [], "reason": "7 jobs want 1g.10gb",
                               "create": [{"profile": "1g.10gb", "start": s} for s in range(7)]})
        slices = gpus[0]["slices"]
        assert [s["start"] for s in slices] == list(range(7))
        for n, s in enumerate(slices):
            dev = {"index": 0, "uuid": s["uuid"], "kind": "mig", "slice_start": s["start"],
                   "mem_mb": s["memory_mb"], "profile": "1g.10gb"}
            await r.command("launch", job_body(tmp_path, 10 + n, [dev], f"{SAVE_ENV}; {WAIT_FOR_STOP}"))
        await r.wait("started", count=7)
        for n, s in enumerate(slices):
            await wait_file(tmp_path / f"env.{10 + n}")
        envs = [job_env(tmp_path, 10 + n) for n in range(7)]
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [s["uuid"] for s in slices]
        assert all(e["GPUD_GPUS"] == "0" for e in envs)

        # The head, confused, asks for a 7g over busy slices: refused, nothing touched.
        after = await relay(r, {"gpu": 0, "destroy": list(range(7)),
                                "create": [{"profile": "7g.80gb", "start": 0}]})
        assert after[0]["slices"] == slices

        (tmp_path / "stop").touch()
        await r.wait("finished", count=7)
        after = await relay(r, {"gpu": 0, "destroy": list(range(7)),
                                "create": [{"profile": "7g.80gb", "start": 0}]})
        assert [(s["profile"], s["start"]) for s in after[0]["slices"]] == [("7g.80gb", 0)]
        assert after[0]["relaid_at"] == CLOCK


async def test_two_slices_of_one_gpu_in_one_job(tmp_path):
    async with sharing_rig(tmp_path) as r:
        gpus = await relay(r, {"gpu": 0, "create": [{"profile": "3g.40gb", "start": 0},
                                                     {"profile": "3g.40gb", "start": 4}]})
        devs = [{"index": 0, "uuid": s["uuid"], "kind": "mig", "slice_start": s["start"]}
                for s in gpus[0]["slices"]]
        await r.command("launch", job_body(tmp_path, 5, devs))
        await r.wait("finished", lambda b: b["job"] == 5)
        env = job_env(tmp_path, 5)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(d["uuid"] for d in devs)


async def test_mps_jobs_get_the_environment_and_the_daemon_stops_when_the_gpu_is_free(tmp_path):
    async with sharing_rig(tmp_path) as r:
        uuid = gpus_of(r.seen("register")[0])[1]["uuid"]
        stub = r.worker.gpus.mps.runner
        for job in (1, 2, 3, 4):
            share = {"index": 1, "uuid": uuid, "kind": "mps", "mem_mb": 20480}
            await r.command("launch", job_body(tmp_path, job, [share], f"{SAVE_ENV}; {WAIT_FOR_STOP}"))
        await r.wait("started", count=4)
        await wait_file(tmp_path / "env.4")
        env = job_env(tmp_path, 4)
        pipe = os.path.join(str(tmp_path), "worker", NODE, "mps", "1", "pipe")
        assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_MPS_PIPE_DIRECTORY"],
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == (
            uuid, pipe, "50", "0=20480M")
        assert stub.events == [("start", 1, ME)]

        # A fifth share does not fit in the GPU's memory: refused as launch_failed.
        await r.command("launch", job_body(tmp_path, 5, [{"index": 1, "uuid": uuid, "kind": "mps",
                                                          "mem_mb": 20480}]))
        (msg,) = await r.wait("finished", lambda b: b["job"] == 5)
        assert msg.body["reason"] == "launch_failed" and "would add up to" in msg.body["message"]

        (tmp_path / "stop").touch()
        await r.wait("finished", lambda b: b["job"] in (1, 2, 3, 4), count=4)
        await wait_for(lambda: stub.events[-1:] == [("stop", 1, ME)])
        assert r.worker.gpus.mps.user_of(1) is None


async def test_a_launch_on_a_slice_that_is_gone_ends_as_launch_failed(tmp_path):
    async with sharing_rig(tmp_path) as r:
        dev = {"index": 0, "uuid": "MIG-00000000-0000-0000-0000-000000000000", "kind": "mig", "slice_start": 0}
        await r.command("launch", job_body(tmp_path, 9, [dev]))
        (msg,) = await r.wait("finished", lambda b: b["job"] == 9)
        assert msg.body["reason"] == "launch_failed"
        assert "is not on GPU 0 here" in msg.body["message"]


async def test_bad_mig_commands_are_dropped_with_a_log_line_and_the_worker_goes_on(tmp_path, caplog):
    async with sharing_rig(tmp_path) as r:
        for body in ({"gpu": "0"}, {"gpu": 1, "create": []}, {"gpu": 0, "create": [{"profile": 3}]}):
            gpus = await relay(r, body)
            assert gpus[0]["slices"] == []
        assert "dropped mig from head: no GPU '0' here" in caplog.text
        assert "GPU 1 is not a dynamic MIG GPU here" in caplog.text


async def wait_for(pred, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


async def wait_file(path) -> None:
    await wait_for(path.exists)


async def test_an_mps_dynamic_gpu_runs_a_whole_job_or_shares_never_both(tmp_path):
    async with sharing_rig(tmp_path, modes={"0": "whole", "1": "mps:dynamic"}) as r:
        (gpu,) = [g for g in gpus_of(r.seen("register")[0]) if g["index"] == 1]
        assert gpu["mode"] == "mps" and gpu["dynamic"]
        stub = r.worker.gpus.mps.runner
        whole = {"index": 1, "uuid": gpu["uuid"], "kind": "gpu"}
        share = {"index": 1, "uuid": gpu["uuid"], "kind": "mps", "mem_mb": 20480}
        # empty: it takes a whole job, and then no share (no MPS daemon either)
        await r.command("launch", job_body(tmp_path, 1, [whole], WAIT_FOR_STOP))
        await r.wait("started", lambda b: b["job"] == 1)
        await r.command("launch", job_body(tmp_path, 2, [share]))
        (msg,) = await r.wait("finished", lambda b: b["job"] == 2)
        assert msg.body["reason"] == "launch_failed" and "held whole by job 1" in msg.body["message"]
        assert stub.events == []
        (tmp_path / "stop").touch()
        await r.wait("finished", lambda b: b["job"] == 1)
        os.unlink(tmp_path / "stop")
        # empty again: shares start its MPS daemon, and a whole job is refused beside them
        await wait_for(lambda: 1 not in r.worker.gpus._whole)
        await r.command("launch", job_body(tmp_path, 3, [share], WAIT_FOR_STOP))
        await r.wait("started", lambda b: b["job"] == 3)
        assert stub.events == [("start", 1, ME)]
        await r.command("launch", job_body(tmp_path, 4, [whole]))
        (msg,) = await r.wait("finished", lambda b: b["job"] == 4)
        assert msg.body["reason"] == "launch_failed" and "serves MPS shares now" in msg.body["message"]
        # the shares end: the daemon stops, and the GPU takes a whole job again
        (tmp_path / "stop").touch()
        await r.wait("finished", lambda b: b["job"] == 3)
        await wait_for(lambda: stub.events[-1:] == [("stop", 1, ME)])
        await r.command("launch", job_body(tmp_path, 5, [whole]))
        (msg,) = await r.wait("finished", lambda b: b["job"] == 5)
        assert msg.body.get("reason") != "launch_failed", msg.body


async def test_the_heads_interval_comes_with_the_relayout_and_beats_the_workers_own(tmp_path):
    # The worker's config says 10 minutes between re-layouts that destroy slices; the head,
    # reconfigured to 0, sends its interval with the command, and that is the one applied.
    async with sharing_rig(tmp_path) as r:
        cut = {"gpu": 0, "destroy": [], "create": [{"profile": "3g.40gb", "start": 0}]}
        gpus = await relay(r, cut)
        assert [s["profile"] for s in gpus[0]["slices"]] == ["3g.40gb"]
        swap = {"gpu": 0, "destroy": [0], "create": [{"profile": "7g.80gb", "start": 0}]}
        gpus = await relay(r, {**cut, "destroy": [0], "create": [{"profile": "4g.40gb", "start": 0}],
                               "min_interval": 0})
        assert [s["profile"] for s in gpus[0]["slices"]] == ["4g.40gb"]       # re-laid at once
        gpus = await relay(r, {**swap, "min_interval": 600})
        assert [s["profile"] for s in gpus[0]["slices"]] == ["4g.40gb"]       # refused: 600 s
        gpus = await relay(r, {**swap, "min_interval": 0})
        assert [s["profile"] for s in gpus[0]["slices"]] == ["7g.80gb"]       # the head's, again
