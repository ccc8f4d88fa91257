"""Attacks on the head from a user of the cluster, each performed and shown to fail.
In-process head (tests/slurm_head.py): the callers' identities are what SO_PEERCRED or a
relay would have given."""

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


def caps_config(kit, text: str):
    from dataclasses import replace

    from gpud import config

    cfg = config.from_text(text, "caps.toml")
    kit.head.cfg = replace(kit.cfg, head=replace(kit.cfg.head, max_jobs=cfg.head.max_jobs), sched=cfg.sched)


async def test_max_jobs_refuses_a_submission_that_would_pass_it_whole(kit):
    caps_config(kit, "[head]\nmax_jobs = 5\n")
    for _ in range(3):
        await kit.submit(BOB, hold=True)
    message = await kit.refused("submit", ALICE, spec={**spec_of("true"), "array": "0-2"})
    assert message.startswith("Batch job submission failed: Slurm temporarily unable to accept job")
    assert "takes at most 5 ([head] max_jobs)" in message
    assert len(kit.store.active) == 3
    await kit.submit(ALICE, array="0-1")
    assert len(kit.store.active) == 5


async def test_max_submit_jobs_per_user_on_a_qos_and_an_account(kit):
    caps_config(kit, "[qos.normal]\nmax_submit_jobs = 2\n[qos.big]\n"
                     "[accounts.lab]\nusers = [\"*\"]\nmax_submit_jobs = 3\n")
    await kit.submit(ALICE, hold=True)
    await kit.submit(ALICE, hold=True)
    message = await kit.refused("submit", ALICE, spec=spec_of("true"))
    assert "Job violates accounting/QOS policy" in message
    assert "QOSMaxSubmitJobPerUserLimit: QOS normal allows 2 jobs per user and alice has 2" in message
    await kit.submit(BOB, hold=True)                       # per user: bob has his own two
    await kit.submit(ALICE, hold=True, qos="big")          # another QOS, the same account
    message = await kit.refused("submit", ALICE, spec={**spec_of("true"), "qos": "big"})
    assert "AssocMaxSubmitJobLimit: account lab allows 3 jobs per user and alice has 3" in message
    await kit.call("cancel", ALICE, job_ids=[1])           # an ended job no longer counts
    await kit.submit(ALICE, hold=True)


async def test_moving_a_job_to_another_qos_is_held_to_that_qos_cap(kit):
    # bob is no admin (alice is: an admin may move jobs past a cap, as past a MaxTime)
    caps_config(kit, "[qos.normal]\n[qos.small]\nmax_submit_jobs = 1\n")
    ids = [await kit.submit(BOB, hold=True), await kit.submit(BOB, hold=True)]
    assert (await kit.call("update_job", BOB, job_ids=[ids[0]], changes={"QOS": "small"}))["errors"] == []
    errors = (await kit.call("update_job", BOB, job_ids=[ids[1]], changes={"QOS": "small"}))["errors"]
    assert len(errors) == 1 and "QOSMaxSubmitJobPerUserLimit: QOS small allows 1 jobs per user and bob has 1" in errors[0]
    assert kit.store.active[ids[1]].qos == "normal"
    # both in one request: the first takes the place, the second is refused
    assert (await kit.call("update_job", BOB, job_ids=[ids[0]], changes={"QOS": "normal"}))["errors"] == []
    both = await kit.call("update_job", BOB, job_ids=ids, changes={"QOS": "small"})
    assert len(both["done"]) == 1 and len(both["errors"]) == 1
    assert sorted(j.qos for j in kit.store.active.values()) == ["normal", "small"]


async def test_submissions_in_one_group_commit_cannot_both_take_the_last_place(kit):
    import asyncio

    caps_config(kit, "[qos.normal]\nmax_submit_jobs = 1\n")
    results = await asyncio.gather(*(kit.call("submit", ALICE, spec=spec_of("true")) for _ in range(5)),
                                   return_exceptions=True)
    assert sum(isinstance(r, dict) for r in results) == 1
    assert len(kit.store.active) == 1


def spec_of(command: str) -> dict:
    from tests.slurm_head import spec

    return spec(command, hold=True)


# -- a script too large for one bus message ----------------------------------------------------

async def test_a_script_larger_than_one_launch_message_is_refused_at_submit(kit):
    from gpud.head.jobcaps import LAUNCH_ROOM

    big = spec_of("true")
    big["script"] = "#!/bin/bash\n" + "# padding\n" * ((2 << 20) // 10) + "true\n"     # ~2 MiB
    message = await kit.refused("submit", ALICE, spec=big)
    assert message.startswith("Batch job submission failed: the script and its environment take")
    assert f"more than one launch message carries ({LAUNCH_ROOM // 1024} KiB)" in message and "\n" not in message
    env = spec_of("true")
    env["env"] = {"BLOB": "é" * (LAUNCH_ROOM // 5)}   # few characters, but six bytes each when sent
    assert "launch message carries" in await kit.refused("submit", ALICE, spec=env)
    assert kit.store.active == {}
    ok = spec_of("true")
    ok["script"] = "#!/bin/bash\n" + "x" * (LAUNCH_ROOM - 4096) + "\n"
    await kit.call("submit", ALICE, spec=ok)


async def test_an_unsendable_launch_fails_its_job_and_the_node_goes_on(kit):
    """A job already in the database with a script no message carries (say, from before the
    submit check): its launch fails the job with the reason; the pass, the node and the next
    job are unharmed."""
    from dataclasses import replace as dc_replace

    from tests.test_store import new_job

    huge = new_job(user="bob", uid=BOB.uid, gid=BOB.gid, partition="gpu", account="default")
    huge = dc_replace(huge, spec=dc_replace(huge.spec, script="#!/bin/bash\n" + "x" * (3 << 20) + "\n"))
    await kit.store.insert_jobs([huge], now=kit.clock())
    await kit.schedule()
    (rec,) = await kit.store.find_jobs(job_ids=[1])
    assert rec.state.value == "FAILED"
    events = await kit.store.job_events(1)
    assert "could not send the launch to n1" in events[-1]["detail"] and "too large" in events[-1]["detail"]
    kit.sent.clear()
    job_id = await kit.submit(ALICE, "true", gpus=1)
    await kit.schedule()
    assert kit.job(job_id).state.value == "RUNNING" and [b["job_id"] for _, b in kit.sent_to("launch")] == [job_id]
    await kit.report("n1", "heartbeat", {"running": [[job_id, kit.job(job_id).attempt]], "done": []})
    assert kit.store.nodes["n1"].state == "UP"


async def test_a_scrontab_entry_does_not_pass_max_jobs_either(kit, caplog):
    caps_config(kit, "[head]\nmax_jobs = 1\n")
    await kit.submit(BOB, hold=True)
    await install(kit, [entry(1, "* * * * *")], ALICE)
    kit.clock.advance(120)
    assert await kit.head.slurm.cron.tick() == []
    assert "not submitted: Batch job submission failed: Slurm temporarily unable to accept job" in caplog.text
    assert len(kit.store.active) == 1
