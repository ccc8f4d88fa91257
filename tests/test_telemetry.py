"""Head-side telemetry: aggregates, idle-GPU flags and actions, the bounded series, bad samples."""

from __future__ import annotations

import pytest

from gpud.bus.base import HEAD_EVENTS, Message
from gpud.bus.messages import MessageError, decode
from gpud.head.telemetry import IDLE_REASON, Telemetry
from gpud.model import JobState
from tests.telemetry_rig import T0, config, rig


async def count(store, table: str) -> int:
    async with store.db.execute(f"SELECT COUNT(*) FROM {table}") as cur:
        return (await cur.fetchone())[0]


async def test_job_aggregates_reach_the_job_record_and_the_database(tmp_path):
    async with rig(tmp_path) as r:
        await r.add_node("n1")
        busy = await r.submit(gpus=2, util="90,30")
        await r.schedule()
        await r.run_for(60, every=5)                      # 12 samples
        job = r.job(busy)
        assert job.gpu_util_mean == pytest.approx(60.0)   # (90 + 30) / 2 over every sample
        assert job.gpu_util_max == 90.0
        assert job.gpu_mem_max_mb == 36864                # sim: half of 80 GiB at 90 %
        # 637 W + 259 W: the first sample is watts x interval, the rest the energy counter
        assert job.energy_j == pytest.approx((637 + 259) * 60)
        await r.head.telemetry.flush()
        async with r.store.db.execute("SELECT gpu_s, util_gpu_s, idle_gpu_s, sampled_s FROM job_telemetry "
                                      "WHERE job_id=?", (busy,)) as cur:
            assert await cur.fetchone() == (120.0, pytest.approx(72.0), 0.0, 60.0)
        await r.finish(busy)
        (done,) = await r.store.find_jobs(job_ids=[busy])
        assert done.state is JobState.COMPLETED
        pub = done.to_public()
        assert (pub["gpu_util_mean"], pub["gpu_util_max"], pub["gpu_mem_max_mb"]) == (60.0, 90.0, 36864)
        assert busy not in r.head.telemetry.usage or r.head.telemetry.usage[busy].gpu_s == 120
        await r.head.telemetry.flush()
        assert busy not in r.head.telemetry.usage          # written and forgotten


async def test_aggregates_survive_a_head_restart_and_continue(tmp_path):
    async with rig(tmp_path) as r:
        await r.add_node("n1")
        jid = await r.submit(gpus=1, util="40")
        await r.schedule()
        await r.run_for(20, every=5)
        await r.head.telemetry.flush()
        r.head.telemetry = Telemetry.of(r.head)             # a new head process: memory is gone
        await r.run_for(20, every=5)
        usage = r.head.telemetry.usage[jid]
        assert usage.gpu_s == 40 and usage.util_mean == pytest.approx(40.0)


async def test_samples_of_an_old_attempt_or_a_job_the_worker_does_not_run_count_nothing(tmp_path):
    async with rig(tmp_path) as r:
        await r.add_node("n1")
        jid = await r.submit(gpus=1, util="50")
        await r.schedule()
        body = r.body("n1")
        body["jobs"] = [[jid, r.job(jid).attempt - 1, [0]]]      # a stale attempt
        await r.ingest("n1", body)
        body["jobs"] = []                                        # launch not arrived yet
        await r.ingest("n1", body)
        assert jid not in r.head.telemetry.usage
        assert r.head.telemetry.latest["n1"].gpus[0].util == 50.0   # the node's view still updates


async def test_an_idle_job_is_flagged_after_the_period_and_a_busy_one_is_not(tmp_path):
    async with rig(tmp_path, config(idle_period=60, idle_action="none")) as r:
        await r.add_node("n1")
        idle = await r.submit(gpus=1, util="0", name="idle")
        busy = await r.submit(gpus=1, util="85", name="busy")
        half = await r.submit(gpus=2, util="80,0", name="half")   # one busy GPU is enough to be busy
        await r.schedule()
        await r.run_for(55, every=5)
        assert r.job(idle).reason is None                         # 50 s of idling so far
        await r.run_for(10, every=5)
        assert r.job(idle).reason == IDLE_REASON
        assert r.job(idle).state is JobState.RUNNING              # action "none": only the flag
        assert r.job(busy).reason is None and r.job(half).reason is None
        events = [e["event"] for e in await r.store.job_events(idle)]
        assert events.count("gpu_idle") == 1
        await r.run_for(60, every=5)
        assert [e["event"] for e in await r.store.job_events(idle)].count("gpu_idle") == 1   # flagged once
        assert [k for k, _ in r.commands() if k != "launch"] == []      # action "none": no signal
        # The job gets to work: the flag goes.
        r.job(idle).spec.env["GPUD_SIM_UTIL"] = "70"
        await r.sample("n1")
        assert r.job(idle).reason is None
        assert [e["event"] for e in await r.store.job_events(idle)][-1] == "gpu_busy"


async def test_with_the_policy_on_the_idle_job_is_requeued(tmp_path):
    async with rig(tmp_path, config(idle_period=60, idle_action="requeue")) as r:
        await r.add_node("n1")
        idle = await r.submit(gpus=1, util="0")
        busy = await r.submit(gpus=1, util="85")
        await r.schedule()
        r.commands()
        await r.run_for(65, every=5)
        job = r.job(idle)
        assert (job.state, job.stop_reason, job.reason) == (JobState.COMPLETING, "idle:requeue", IDLE_REASON)
        signals = [b for k, b in r.commands() if k == "signal"]
        assert signals == [{"job": idle, "attempt": 1, "signal": "TERM", "grace": 30.0, "reason": "preempted"}]
        await r.finish(idle, exit_code=0, reason="preempted")
        back = r.job(idle)
        assert (back.state, back.requeue_count, back.reason) == (JobState.PENDING, 1, None)
        assert r.job(busy).state is JobState.RUNNING
        await r.schedule()                                         # runs again, a new attempt
        assert r.job(idle).attempt == 2 and r.job(idle).state is JobState.RUNNING
        await r.run_for(30, every=5)
        assert r.job(idle).state is JobState.RUNNING               # a fresh idle streak


async def test_cancel_policy_and_no_requeue_jobs(tmp_path):
    async with rig(tmp_path, config(idle_period=30, idle_action="cancel")) as r:
        await r.add_node("n1")
        idle = await r.submit(gpus=1, util="1")
        await r.schedule()
        await r.run_for(35, every=5)
        assert r.job(idle).stop_reason == "idle:cancel"
        await r.finish(idle, reason="cancelled")
        (done,) = await r.store.find_jobs(job_ids=[idle])
        assert done.state is JobState.CANCELLED
    async with rig(tmp_path / "b", config(idle_period=30, idle_action="requeue")) as r:
        await r.add_node("n1")
        stay = await r.submit(gpus=1, util="0", requeue=False)
        await r.schedule()
        await r.run_for(35, every=5)
        job = r.job(stay)
        assert (job.state, job.reason) == (JobState.RUNNING, IDLE_REASON)   # flagged, not stopped
        assert "--no-requeue" in (await r.store.job_events(stay))[-1]["detail"]


async def test_idle_detection_can_be_turned_off(tmp_path):
    async with rig(tmp_path, config(idle_period=None)) as r:
        await r.add_node("n1")
        idle = await r.submit(gpus=1, util="0")
        await r.schedule()
        await r.run_for(600, every=30)
        assert r.job(idle).reason is None


async def test_the_series_stays_bounded_over_a_long_run(tmp_path):
    """A day of samples every 30 s on three nodes, one-minute buckets kept for an hour."""
    async with rig(tmp_path, config(resolution=60, retention=3600)) as r:
        for n in ("n1", "n2", "n3"):
            await r.add_node(n, "2xA100-80GB")
        await r.submit(gpus=2, util="50")
        await r.schedule()
        bound = 3 * (3600 // 60 + 1)
        sizes = []
        for five in range(24 * 12):                      # a flush every five minutes
            await r.run_for(300, every=30)
            await r.head.telemetry.flush()
            sizes.append(await count(r.store, "node_series"))
        assert max(sizes) <= bound
        assert min(sizes[12:]) >= 3 * (3600 // 60 - 1)      # and after the first hour it is full
        async with r.store.db.execute("SELECT MIN(t), MAX(t), MIN(samples), MAX(gpus_alloc) FROM node_series") as cur:
            oldest, newest, samples, alloc = await cur.fetchone()
        assert oldest >= r.clock.t - 3600 and newest >= r.clock.t - 120
        assert samples == 2 and alloc == 2
        assert await count(r.store, "job_telemetry") == 1


async def test_series_rows_average_each_bucket(tmp_path):
    async with rig(tmp_path, config(resolution=60)) as r:
        await r.add_node("n1", "2xH100-80GB")
        await r.submit(gpus=1, util="100")
        await r.schedule()
        r.clock.t = T0 - T0 % 60 + 60                     # the start of a bucket
        await r.run_for(60, every=15)                     # four samples in it, the last opens the next
        r.clock.t += 60
        await r.head.telemetry.flush()
        async with r.store.db.execute("SELECT gpus, gpus_alloc, util_mean, util_max, power_w, samples "
                                      "FROM node_series ORDER BY t") as cur:
            rows = await cur.fetchall()
        assert rows[0] == (2, 1, 50.0, 100.0, 770.0, 3)    # 700 W busy + 70 W idle


BAD = [
    ("not a dict", "body must be an object"),
    ({"iv": 0, "gpus": []}, "iv must be"),
    ({"iv": 5, "gpus": [[0, 50, 1, 1, 1]]}, "gpus must be"),
    ({"iv": 5, "gpus": [[0, 150, 1, 1, 1, 1]]}, "util out of range"),
    ({"iv": 5, "gpus": [[-1, 50, 1, 1, 1, 1]]}, "gpus must be"),
    ({"iv": 5, "gpus": [[0, "50", 1, 1, 1, 1]]}, "util out of range"),
    ({"iv": 5, "gpus": [], "jobs": [[1, 1]]}, "jobs must be"),
    ({"iv": 5, "gpus": [], "jobs": [[1, True, [0]]]}, "jobs must be"),
    ({"iv": 5, "gpus": [], "procs": [[0, 1]]}, "procs must be"),
    ({"iv": 5, "gpus": [[0, None, None, None, None, float("nan")]]}, "energy_j out of range"),
    ({"iv": 5, "gpus": [[i, 1, 1, 1, 1, 1] for i in range(5000)]}, "gpus must be"),
]


@pytest.mark.parametrize("body, message", BAD)
def test_malformed_samples_are_refused_with_one_line(body, message):
    with pytest.raises(MessageError, match=message) as e:
        decode("samples", body)
    assert "\n" not in str(e.value) and len(str(e.value)) <= 200


async def test_the_head_drops_bad_samples_and_routes_good_ones(tmp_path, caplog):
    async with rig(tmp_path) as r:
        await r.add_node("n1")

        def msg(body) -> Message:
            return Message(HEAD_EVENTS, "samples", "worker:n1", "id", T0, body)

        await r.head.inbox.handle(msg({"iv": 5, "gpus": "lots"}))
        assert r.head.telemetry.dropped == 1 and "dropped samples from n1: gpus must be" in caplog.text
        await r.head.inbox.handle(msg(r.body("n1")))
        assert set(r.head.telemetry.latest) == {"n1"}


async def test_a_policy_turned_on_later_acts_on_a_job_flagged_already(tmp_path):
    async with rig(tmp_path, config(idle_period=30, idle_action="none")) as r:
        await r.add_node("n1")
        idle = await r.submit(gpus=1, util="0")
        await r.schedule()
        await r.run_for(35, every=5)
        assert (r.job(idle).reason, r.job(idle).state) == (IDLE_REASON, JobState.RUNNING)
        r.head.cfg = config(idle_period=30, idle_action="cancel")       # as a reload would
        await r.sample("n1")
        assert (r.job(idle).state, r.job(idle).stop_reason) == (JobState.COMPLETING, "idle:cancel")
        events = [e["event"] for e in await r.store.job_events(idle)]
        assert events.count("gpu_idle") == 2
