"""What the head logs says what happened: a --no-requeue job lost with its node, and a gang's
allocation with all its nodes."""

from __future__ import annotations

import logging

from tests.slurm_head import HeadKit


async def test_a_no_requeue_job_lost_with_its_node_is_logged(tmp_path, caplog):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        a = await kit.submit(gpus=1, requeue=False)
        await kit.schedule()
        caplog.set_level(logging.INFO, logger="gpud")
        await kit.head.liveness.node_down(kit.store.nodes["n1"], "heartbeats stopped")
        await kit.head.liveness.node_failed(kit.store.nodes["n1"])      # its lease has ended
        assert f"job {a} (user alice) NODE_FAIL: node n1 DOWN (heartbeats stopped); its lease ended" in caplog.text


async def test_a_gang_allocation_line_names_every_node(tmp_path, caplog):
    async with HeadKit(tmp_path) as kit:
        for name in ("n1", "n2"):
            kit.add_node(name, gpus=4)
        kit.label_nodes()
        caplog.set_level(logging.INFO, logger="gpud")
        job = await kit.start_gang(nodes=2, gpus=8)
        assert f"job {job.job_id} (user alice) allocated on n[1-2] gpus=[0, 1, 2, 3, 0, 1, 2, 3]" in caplog.text
