"""Multi-node jobs and srun steps on an in-process head (gpud.head.gang, gpud.head.steps)."""

from __future__ import annotations

import pytest

from gpud.head import gang, steprecord
from tests.slurm_head import ALICE, BOB, HeadKit


@pytest.fixture
async def kit(tmp_path):
    async with HeadKit(tmp_path) as kit:
        for i in range(1, 5):
            kit.add_node(f"n{i}", gpus=4)
        kit.label_nodes(switch="s1")
        kit.record_sent()
        yield kit


def test_compressed_nodelist_and_port():
    assert gang.nodelist_text(["w3", "w1", "w2", "w7"]) == "w[1-3,7]"
    assert gang.master_port(12345) == 22345
    assert gang.master_port(1) == gang.master_port(1)


async def test_gang_start_launches_every_rank_with_one_view_of_the_job(kit):
    job = await kit.start_gang(nodes=3, gpus=12, ntasks_per_node=4)
    names = gang.job_nodes(job)
    assert len(names) == 3 and len(set(names)) == 3
    assert [len(p["gpu_indices"]) for p in job.parts] == [4, 4]
    launches = dict(kit.sent_to("launch"))
    assert sorted(launches) == sorted(names)
    rank0 = launches[job.node]
    assert "sleep 60" in rank0["script"]
    for rank, node in enumerate(names):
        env = launches[node]["extra_env"]
        assert env["GPUD_NODEID"] == str(rank) and env["GPUD_NNODES"] == "3"
        assert env["GPUD_NTASKS"] == "12" and env["GPUD_NTASKS_PER_NODE"] == "4"
        assert env["MASTER_ADDR"] == kit.store.nodes[job.node].info["labels"]["addr"]
        assert env["GPUD_JOB_NODELIST"] == gang.nodelist_text(names)
        assert len(launches[node]["gpus"]) == 4
        if rank:
            assert launches[node]["script"] == gang.HOLDER_SCRIPT and launches[node]["stdout"] == "/dev/null"
    public = job.to_public()
    assert public["nodes"] == 3 and public["nodelist"] == gang.nodelist_text(names)
    row = (await kit.record(job.job_id))
    assert row.parts == job.parts, "parts are stored with the job"


async def test_parts_count_as_used_and_are_fenced_by_node(kit):
    job = await kit.start_gang(nodes=4, gpus=16)
    other = await kit.submit(ALICE, "true", gpus=1)
    await kit.schedule()
    assert kit.job(other).state.value == "PENDING", "every GPU of every node is the gang job's"
    nodes = (await kit.call("nodes"))["nodes"]
    assert all(n["gpus_alloc"] == 4 for n in nodes)
    # A worker that runs the job where it holds no part is told to kill it; a part is fine.
    kit.sent.clear()
    part_node = job.parts[0]["node"]
    await kit.report(part_node, "heartbeat", {"running": [[job.job_id, job.attempt]], "done": []})
    assert not kit.sent_to("kill")
    kit.add_node("n9", gpus=4)
    await kit.report("n9", "heartbeat", {"running": [[job.job_id, job.attempt]], "done": []})
    assert kit.sent_to("kill") == [("n9", {"allocs": [[job.job_id, job.attempt]], "reason": "fenced"})]


async def test_rank0_ending_ends_the_job_and_stops_the_other_parts(kit):
    job = await kit.start_gang()
    kit.sent.clear()
    await kit.report(job.node, "finished", {"job": job.job_id, "attempt": job.attempt, "exit_code": 3,
                                            "signal": None, "reason": "exited"})
    done = await kit.record(job.job_id)
    assert done.state.value == "FAILED" and done.exit_code == 3
    assert [n for n, _ in kit.sent_to("kill")] == [job.parts[0]["node"]]
    # The holder's report after that is only acknowledged.
    await kit.report(job.parts[0]["node"], "finished", {"job": job.job_id, "attempt": job.attempt,
                                                        "exit_code": 0, "signal": 9, "reason": "killed"})
    assert (await kit.record(job.job_id)).exit_code == 3


async def test_a_part_that_dies_on_its_own_fails_the_job(kit):
    job = await kit.start_gang(nodes=3, gpus=12)
    kit.sent.clear()
    dead = job.parts[1]["node"]
    await kit.report(dead, "finished", {"job": job.job_id, "attempt": job.attempt, "exit_code": 0,
                                        "signal": 9, "reason": "exited"})
    done = await kit.record(job.job_id)
    assert done.state.value == "FAILED" and done.signal == 9
    events = await kit.store.job_events(job.job_id)
    assert "part 2 on " + dead in events[-1]["detail"]
    assert sorted(n for n, _ in kit.sent_to("kill")) == sorted(n for n in gang.job_nodes(job) if n != dead)


async def test_a_stop_goes_to_every_part_and_only_rank0_decides(kit):
    job = await kit.start_gang()
    kit.sent.clear()
    result = await kit.call("cancel", ALICE, job_ids=[job.job_id])
    assert result["cancelled"] == [job.job_id]
    assert sorted(n for n, _ in kit.sent_to("signal")) == sorted(gang.job_nodes(job))
    await kit.report(job.parts[0]["node"], "finished", {"job": job.job_id, "attempt": job.attempt,
                                                        "exit_code": 0, "signal": 15, "reason": "cancelled"})
    assert kit.job(job.job_id).state.value == "COMPLETING"
    await kit.report(job.node, "finished", {"job": job.job_id, "attempt": job.attempt, "exit_code": 0,
                                            "signal": 15, "reason": "cancelled"})
    assert (await kit.record(job.job_id)).state.value == "CANCELLED"


async def test_losing_a_parts_node_requeues_the_whole_job(kit):
    job = await kit.start_gang()
    kit.sent.clear()
    lost = job.parts[0]["node"]
    await kit.head.liveness.node_down(kit.store.nodes[lost], "test")
    await kit.head.liveness.node_failed(kit.store.nodes[lost])
    again = kit.job(job.job_id)
    assert again.state.value == "PENDING" and again.parts == () and again.node is None
    assert [n for n, _ in kit.sent_to("kill")] == [job.node]


async def test_gpu_hours_and_fair_share_count_every_part(kit):
    job = await kit.start_gang(nodes=2, gpus=8)
    start = kit.clock()
    kit.clock.advance(3600)
    await kit.report(job.node, "finished", {"job": job.job_id, "attempt": job.attempt, "exit_code": 0,
                                            "signal": None, "reason": "exited"})
    report = await kit.call("report", ALICE, since=start - 1, until=kit.clock() + 1)
    assert report["total"]["gpu_hours"] == pytest.approx(8.0)
    assert report["total"]["jobs"] == 1
    usage = kit.head.usage.advance((), (), kit.cfg.sched, kit.clock())
    assert sum(usage.values()) == pytest.approx(8 * 3600, rel=0.01)


# -- srun steps ----------------------------------------------------------------------------------

async def test_step_refusals(kit):
    job = await kit.start_gang()
    assert "belongs to alice" in await kit.refused("step_launch", BOB, job_id=job.job_id, argv=["true"])
    pending = await kit.submit(ALICE, "true", nodes=4, gpus=16)
    await kit.schedule()
    assert "not RUNNING" in await kit.refused("step_launch", ALICE, job_id=pending, argv=["true"])
    assert "not running" in await kit.refused("step_launch", ALICE, job_id=999, argv=["true"])
    assert "argv" in await kit.refused("step_launch", ALICE, job_id=job.job_id, argv=[])
    big = {"X": "y" * (300 << 10)}
    assert "larger than 256 KiB" in await kit.refused("step_launch", ALICE, job_id=job.job_id, argv=["true"], env=big)
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["true"])
    assert "not yours" in await kit.refused("step_poll", BOB, job_id=job.job_id, step=step["step"], offset=0)


async def test_step_output_and_kill_on_bad_exit(kit):
    job = await kit.start_gang(ntasks_per_node=2)
    kit.sent.clear()
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["hostname"], env={"A": "1"})
    assert step["ntasks"] == 4
    commands = dict(kit.sent_to("step"))
    assert sorted(commands) == sorted(gang.job_nodes(job))
    assert commands[job.parts[0]["node"]]["node_rank"] == 1
    n0, n1 = gang.job_nodes(job)
    base = {"job": job.job_id, "attempt": job.attempt, "step": step["step"]}
    await kit.report(n1, "step_output", {**base, "first": 0, "lines": [[2, 1, "two\n"], [3, 2, "oops\n"]]})
    await kit.report(n1, "step_output", {**base, "first": 1, "lines": [[3, 2, "oops\n"]]})   # a repeat
    await kit.report(n1, "step_output", {**base, "first": 2, "lines": [[0, 1, "not this node's\n"]]})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["lines"] == [[2, 1, "two\n"], [3, 2, "oops\n"]] and got["offset"] == 2 and not got["done"]
    assert got["cursor"] == {n1: 2}
    assert (n1, {**base, "next": 2, "resend": False}) in kit.sent_to("step_ack")   # read: the node may drop it
    kit.sent.clear()
    await kit.report(n1, "step_exit", {**base, "rank": 3, "exit_code": 7, "signal": None})
    assert sorted(n for n, _ in kit.sent_to("step_kill")) == sorted([n0, n1])
    for rank, node in ((0, n0), (1, n0), (2, n1)):
        await kit.report(node, "step_exit", {**base, "rank": rank, "exit_code": 0, "signal": 9})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=2)
    assert got["done"] and got["exit_code"] == 7 and got["bad_rank"] == 3


async def test_steps_end_with_their_job_and_output_is_bounded(kit, monkeypatch):
    monkeypatch.setattr(steprecord, "MAX_STEP_OUTPUT", 100)
    job = await kit.start_gang()
    step = await kit.call("step_launch", ALICE, job_id=job.job_id, argv=["yes"])
    n0 = job.node
    base = {"job": job.job_id, "attempt": job.attempt, "step": step["step"]}
    await kit.report(n0, "step_output", {**base, "first": 0, "lines": [[0, 1, "y" * 30 + "\n"]] * 10})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=0)
    assert got["dropped"] > 0 and sum(len(t) for _, _, t in got["lines"]) <= 100
    await kit.report(n0, "finished", {"job": job.job_id, "attempt": job.attempt, "exit_code": 0,
                                      "signal": None, "reason": "exited"})
    got = await kit.call("step_poll", ALICE, job_id=job.job_id, step=step["step"], offset=got["offset"])
    assert got["done"] and got["exit_code"] == 1 and "ended" in got["message"]
