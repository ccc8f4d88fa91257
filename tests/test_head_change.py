"""head.change(): commit, then tell; nothing told of a change that did not commit."""

import pytest

from gpud.bus.messages import Hello
from gpud.model import JobState
from tests.slurm_head import ALICE, HeadKit


@pytest.fixture
async def kit(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        kit.record_sent()
        yield kit


async def test_what_a_change_tells_follows_its_commit_in_order(kit):
    job_id = await kit.submit(ALICE, hold=True)
    head, seen = kit.head, []
    head._kick.clear()
    async with head.change() as ch:
        job = ch.txn.transition(head.store.active[job_id], JobState.CANCELLED, now=ch.now, event="cancelled",
                                end_time=ch.now)
        ch.tell("node/n1/cmd", Hello())
        ch.then(lambda: seen.append(("then", head.lock.locked(), head.store.active.get(job_id))))
        ch.wake()
        assert kit.sent == [] and job_id in head.store.active    # nothing yet: not committed
        assert not head._kick.is_set()
    assert [k for _, k, _ in kit.sent] == ["hello"]
    assert seen == [("then", False, None)]      # after the commit, the lock released
    assert head._kick.is_set() and job.state is JobState.CANCELLED


async def test_a_change_that_fails_tells_nothing_and_commits_nothing(kit):
    job_id = await kit.submit(ALICE, hold=True)
    head, seen = kit.head, []
    head._kick.clear()
    with pytest.raises(RuntimeError):
        async with head.change() as ch:
            ch.txn.transition(head.store.active[job_id], JobState.CANCELLED, now=ch.now, event="cancelled")
            ch.tell("node/n1/cmd", Hello())
            ch.then(seen.append, "then")
            raise RuntimeError("refused halfway")
    with pytest.raises(Exception):
        async with head.change() as ch:   # a commit the database refuses
            ch.txn.transition(head.store.active[job_id], JobState.CANCELLED, now=ch.now, event="cancelled")
            ch.txn.execute("INSERT INTO no_such_table VALUES (1)")
            ch.tell("node/n1/cmd", Hello())
            ch.wake()
    assert kit.sent == [] and seen == [] and not head._kick.is_set()
    assert head.store.active[job_id].state is JobState.PENDING and not head.lock.locked()


async def test_a_send_that_fails_does_not_stop_the_others(kit):
    head, seen = kit.head, []

    async def broken() -> None:
        raise OSError("broker gone")
    async with head.change() as ch:
        ch.then(broken)
        ch.then(seen.append, "next")
    assert seen == ["next"]
