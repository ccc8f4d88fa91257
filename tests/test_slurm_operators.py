"""What operators do to jobs, as scontrol(1) documents it.

scontrol(1), update TimeLimit: "The job's time limit. [...] Only the Slurm administrator or
root can increase job's TimeLimit." -- for a running job too: its workers enforce the new one.
scontrol(1), requeue: "Requeue a running, suspended or finished Slurm batch job into pending
state."
"""

from __future__ import annotations

from gpud.model import JobState
from tests.slurm_head import ALICE, ROOT, HeadKit
from tests.test_executor import FakeClock, Harness


async def test_root_raises_a_running_jobs_time_limit_and_every_node_hears_it(tmp_path):
    async with HeadKit(tmp_path) as kit:
        for name in ("n1", "n2"):
            kit.add_node(name, gpus=4)
        kit.label_nodes()
        job = await kit.start_gang(nodes=2, gpus=8, time_limit=3600)
        kit.record_sent()
        r = await kit.call("update_job", ALICE, job_ids=[job.job_id], changes={"TimeLimit": "2:00:00"})
        assert r["errors"] == [f"job {job.job_id}: only root or an admin may raise a time limit "
                               "(from 01:00:00 to 02:00:00)"]
        r = await kit.call("update_job", ROOT, job_ids=[job.job_id], changes={"TimeLimit": "2:00:00"})
        assert r == {"done": [str(job.job_id)], "errors": []}
        assert kit.job(job.job_id).time_limit == 7200
        sent = kit.sent_to("time_limit")
        grace = kit.head.cfg.head.kill_grace
        assert [(node, body["time_limit"]) for node, body in sent] == [
            ("n1", 7200), ("n2", 7200 + grace + 60)]
        kit.clock.advance(3600 + 30)            # past the old limit: the head stops nothing
        await kit.schedule()
        assert kit.job(job.job_id).state is JobState.RUNNING


async def test_the_worker_enforces_a_raised_limit(tmp_path):
    h = Harness(tmp_path)
    try:
        clock = FakeClock()
        ex = h.executor(clock=clock)
        await ex.start()
        await ex.launch(h.launch("echo ready; sleep 1000", time_limit=60, kill_grace=1))
        await h.output("gpud-1.out", "ready")
        assert await ex.set_time_limit(1, 0, 600)
        clock.advance(120)                      # the old limit has passed: still running
        assert await ex.set_time_limit(1, 0, 600)   # (a repeat is harmless, and makes it look again)
        assert ex.running() == [(1, 0)] and h.finished == []
        clock.advance(500)                      # the new one: stopped
        outcome = await h.outcome(1)
        assert outcome.reason == "timeout"
        assert not await ex.set_time_limit(1, 0, 900)   # no longer running here
    finally:
        await h.cleanup()


async def test_requeue_of_a_finished_job_queues_it_again(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1)
        await kit.schedule()
        await kit.finish(a, exit_code=3)
        assert (await kit.record(a)).state is JobState.FAILED
        r = await kit.call("requeue", ALICE, job_ids=[a])
        assert r == {"done": [str(a)], "errors": []}
        job = kit.job(a)
        assert (job.state, job.requeue_count, job.exit_code, job.node) == (JobState.PENDING, 1, None, None)
        await kit.schedule()
        assert kit.job(a).state is JobState.RUNNING
        # an array: its id requeues every finished task; a task id just that one
        arr = await kit.submit(array="0-1")
        await kit.schedule()
        for task in sorted(j.job_id for j in kit.store.active.values() if j.array_job_id == arr):
            await kit.finish(task)
        r = await kit.call("requeue", ALICE, array_tasks=[[arr, 1]])
        assert r == {"done": [f"{arr}_1"], "errors": []}
        r = await kit.call("requeue", ALICE, job_ids=[arr])
        assert r == {"done": [f"{arr}_0"], "errors": [f"job {arr}_1: Job is pending execution; nothing to requeue"]}
