"""Attacks on the head from a user of the cluster, each performed and shown to fail
(issue 16).  In-process head (tests/slurm_head.py): the callers' identities are what
SO_PEERCRED or a relay would have given."""

from __future__ import annotations

import pwd

import pytest

from tests.slurm_head import ALICE, BOB, ROOT, HeadKit
from tests.test_cron import entry, install

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
async def kit(tmp_path):
    # alice is an admin: what follows is what even an admin may not do.
    async with HeadKit(tmp_path, admins=("alice",)) as kit:
        kit.add_node("n1", gpus=4)
        kit.label_nodes()
        kit.record_sent()
        yield kit


# -- admins cannot run code as other users ---------------------------------------------------------

async def test_an_admins_step_into_another_users_job_is_refused_but_roots_is_not(kit):
    job_id = await kit.submit(BOB, "sleep 600", gpus=1)
    await kit.schedule()
    assert kit.job(job_id).state.value == "RUNNING"
    kit.sent.clear()
    message = await kit.refused("step_launch", ALICE, job_id=job_id, argv=["sh", "-c", "echo x >> ~/.bashrc"])
    assert message.startswith("srun: Access/permission denied: job") and "only its owner or root" in message
    assert kit.sent_to("step") == []
    assert (await kit.call("step_launch", BOB, job_id=job_id, argv=["true"]))["step"] == 0
    assert (await kit.call("step_launch", ROOT, job_id=job_id, argv=["true"]))["step"] == 1


async def test_an_admins_scrontab_for_another_user_is_refused_but_roots_is_not(kit):
    target = {"user": NOBODY.pw_name}
    message = await kit.refused("scrontab_set", ALICE, text="* * * * * true\n",
                                entries=[entry(1, "* * * * *")], **target)
    assert f"only {NOBODY.pw_name} or root may set" in message
    assert (await kit.call("scrontab_get", ALICE, **target))["entries"] == []   # reading is allowed
    assert (await install(kit, [entry(1, "@daily")], ROOT, **target))["entries"] == 1
    assert (await install(kit, [entry(1, "@daily")], ALICE))["entries"] == 1    # her own


async def test_admins_still_cancel_hold_requeue_and_change_limits_of_others_jobs(kit):
    running = await kit.submit(BOB, "sleep 600", gpus=4)
    await kit.schedule()
    pending = await kit.submit(BOB, "sleep 600", gpus=4)
    await kit.schedule()
    assert kit.states() == {running: "RUNNING", pending: "PENDING"}
    assert (await kit.call("hold", ALICE, job_ids=[pending]))["errors"] == []
    assert (await kit.call("update_job", ALICE, job_ids=[pending], changes={"TimeLimit": "10:00:00"}))["errors"] == []
    assert (await kit.call("requeue", ALICE, job_ids=[running]))["errors"] == []
    assert (await kit.call("cancel", ALICE, job_ids=[pending]))["errors"] == []


# -- small holes --------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [33, 1_000, 100_000])
def test_deeply_nested_json_is_a_one_line_refusal(depth):
    from gpud import protocol

    line = b'{"v":1,"op":"ping","args":{"x":' + b"[" * depth + b"]" * depth + b"}}\n"
    with pytest.raises(protocol.ProtocolError, match="nested more than 32 levels deep"):
        protocol.decode_request(line)
