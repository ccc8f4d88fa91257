"""scrontab: the crontab notation, when entries are due, and the head firing them exactly once."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpud.head.cron import due, slot_of
from gpud.syntax import CronSchedule, SyntaxProblem, parse_crontab
from tests.slurm_head import ALICE, BOB, ROOT, HeadKit

UTC = timezone.utc


def minute(text: str) -> int:
    """Minutes since the epoch of a UTC time like 2026-01-05T10:30."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() // 60)


def when(m: int | None) -> str | None:
    return None if m is None else datetime.fromtimestamp(m * 60, UTC).strftime("%Y-%m-%dT%H:%M")


# -- the notation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, after, expected", [
    ("* * * * *", "2026-01-05T10:30", "2026-01-05T10:31"),
    ("*/15 * * * *", "2026-01-05T10:30", "2026-01-05T10:45"),
    ("0 * * * *", "2026-01-05T10:30", "2026-01-05T11:00"),
    ("@hourly", "2026-01-05T10:00", "2026-01-05T11:00"),
    ("@daily", "2026-01-05T10:30", "2026-01-06T00:00"),
    ("30 2 * * *", "2026-01-05T02:30", "2026-01-06T02:30"),
    ("0 9 * * mon-fri", "2026-01-09T09:00", "2026-01-12T09:00"),    # Friday -> Monday
    ("0 0 1 * *", "2026-01-15T00:00", "2026-02-01T00:00"),
    ("@yearly", "2026-03-01T00:00", "2027-01-01T00:00"),
    ("0 0 29 2 *", "2026-03-01T00:00", "2028-02-29T00:00"),         # leap day
    ("0 12 13 * fri", "2026-01-05T00:00", "2026-01-09T12:00"),      # 13th OR Friday
    ("0 0 * * 7", "2026-01-05T00:00", "2026-01-11T00:00"),          # 7 is Sunday too
    ("5-10/5 8-9 * jan,feb *", "2026-01-05T08:05", "2026-01-05T08:10"),
    ("0 0 31 4 *", "2026-01-01T00:00", None),                       # no April 31st
])
def test_next_minute(text, after, expected):
    assert when(CronSchedule.parse(text).next_minute(minute(after), tz=UTC)) == expected


@pytest.mark.parametrize("text, message", [
    ("* * * *", "give five fields"),
    ("60 * * * *", "'60' is not a valid minute (0-59)"),
    ("* 24 * * *", "not a valid hour"),
    ("* * 0 * *", "not a valid day of month"),
    ("* * * 13 *", "not a valid month"),
    ("* * * * 8", "not a valid day of week"),
    ("*/0 * * * *", "bad step"),
    ("5-1 * * * *", "runs backwards"),
    ("* * * foo *", "not a valid month"),
    ("@reboot", "@reboot is not supported"),
    ("@often", "give five fields"),
])
def test_schedule_errors(text, message):
    with pytest.raises(SyntaxProblem) as e:
        CronSchedule.parse(text)
    assert message in str(e.value)


def test_crontab_lines_and_scron_options():
    text = ("# nightly things\n"
            "#SCRON -J eval --gres=gpu:1\n"
            "#SCRON -t 2:00:00\n"
            "30 2 * * * /data/bin/eval.sh --latest\n"
            "\n"
            "#SCRONX not an option line\n"
            "@hourly   echo hi   \n")
    entries = parse_crontab(text)
    assert [(e.line, e.schedule.text, e.command, e.options) for e in entries] == [
        (4, "30 2 * * *", "/data/bin/eval.sh --latest", ("-J eval --gres=gpu:1", "-t 2:00:00")),
        (7, "@hourly", "echo hi", ()),
    ]


@pytest.mark.parametrize("text, message", [
    ("PATH=/bin\n* * * * * true\n", "line 1: variable assignments are not supported"),
    ("* * * * *\n", "line 1: no command after the schedule"),
    ("61 * * * * true\n", "line 1: invalid schedule"),
    ("* * * * * true\n#SCRON -J x\n", "apply to no entry"),
])
def test_crontab_errors_name_the_line(text, message):
    with pytest.raises(SyntaxProblem) as e:
        parse_crontab(text)
    assert message in str(e.value)


def test_due_and_slots():
    every = CronSchedule.parse("* * * * *")
    hourly = CronSchedule.parse("0 * * * *")
    m = minute("2026-01-05T10:30")
    assert not due(every, m, m, UTC)
    assert due(every, m, m + 1, UTC)
    assert not due(hourly, m, m + 29, UTC)
    assert due(hourly, m, m + 30, UTC)
    assert due(hourly, m, m + 500, UTC)            # missed hours: due once
    assert slot_of(119.9, 60) == 1 and slot_of(120, 60) == 2 and slot_of(7, 2.0) == 3


# -- the head -------------------------------------------------------------------------------------

def entry(line: int, schedule: str, command: str = "true", **spec) -> dict:
    return {"line": line, "schedule": schedule,
            "spec": {"script": f"#!/bin/bash\n{command}\n", "name": "cron", "work_dir": "/tmp", **spec}}


async def install(kit, text_entries: list[dict], caller=ALICE, **args) -> dict:
    text = "".join(f"{e['schedule']} {e['spec']['script'].splitlines()[1]}\n" for e in text_entries)
    return await kit.call("scrontab_set", caller, text=text, entries=text_entries, **args)


def cron_jobs(kit) -> list:
    return sorted((j for j in kit.store.active.values() if j.cron_entry), key=lambda j: j.job_id)


async def test_an_entry_fires_once_per_minute_and_never_while_its_last_job_is_active(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.clock.t = minute("2026-01-05T10:30") * 60 + 10
        assert (await install(kit, [entry(1, "* * * * *")])) == {"entries": 1}
        cron = kit.head.slurm.cron
        assert await cron.tick() == []                 # installed during 10:30: first run at 10:31
        kit.clock.advance(50)
        [job_id] = await cron.tick()
        assert await cron.tick() == []                 # the same minute again: nothing
        job = kit.store.active[job_id]
        assert (job.user, job.uid, job.name, job.cron_entry) == ("alice", ALICE.uid, "cron", 1)
        kit.clock.advance(60)                          # 10:32, the 10:31 job still pending: skipped
        assert await cron.tick() == []
        await kit.call("cancel", ALICE, job_ids=[job_id])
        assert await cron.tick() == []                 # 10:32 was dealt with
        kit.clock.advance(60)
        assert len(await cron.tick()) == 1             # 10:33


async def test_a_restart_neither_repeats_nor_loses_a_slot(tmp_path):
    db = str(tmp_path / "head.db")
    start = minute("2026-01-05T10:30") * 60
    async with HeadKit(tmp_path, db=db) as kit:
        kit.clock.t = start
        await install(kit, [entry(1, "* * * * *")])
        kit.clock.t = start + 61
        [first] = await kit.head.slurm.cron.tick()
        await kit.call("cancel", ALICE, job_ids=[first])
    async with HeadKit(tmp_path, db=db) as kit:      # back within the same minute
        kit.clock.t = start + 75
        assert await kit.head.slurm.cron.tick() == []
    async with HeadKit(tmp_path, db=db) as kit:      # down for five minutes: one late run
        kit.clock.t = start + 60 * 6 + 5
        fired = await kit.head.slurm.cron.tick()
        assert len(fired) == 1
        assert await kit.head.slurm.cron.tick() == []


async def test_reinstalling_unchanged_keeps_the_slot(tmp_path):
    async with HeadKit(tmp_path) as kit:
        start = minute("2026-01-05T10:30") * 60
        kit.clock.t = start
        e = entry(1, "* * * * *")
        await install(kit, [e])
        kit.clock.t = start + 65
        [job] = await kit.head.slurm.cron.tick()
        await kit.call("cancel", ALICE, job_ids=[job])
        await install(kit, [e])                        # same entry: 10:31 already fired
        assert await kit.head.slurm.cron.tick() == []
        got = await kit.call("scrontab_get", ALICE)
        assert got["text"] == "* * * * * true\n"
        assert [(x["line"], x["schedule"], x["last_job_id"], x["active"]) for x in got["entries"]] == [
            (1, "* * * * *", job, False)]
        assert got["entries"][0]["next_run"] == start + 120
        await kit.call("scrontab_set", ALICE, text="", entries=[])
        assert (await kit.call("scrontab_get", ALICE)) == {"text": "", "entries": []}


async def test_short_ticks_for_tests(tmp_path):
    async with HeadKit(tmp_path, cron_tick=2.0) as kit:
        kit.clock.t = 1_000_000.0
        await install(kit, [entry(1, "* * * * *")])
        fired = []
        for _ in range(10):                            # 10 s at a 2 s "minute": five slots
            kit.clock.advance(1)
            new = await kit.head.slurm.cron.tick()
            for job_id in new:
                await kit.call("cancel", ALICE, job_ids=[job_id])
            fired += new
        assert len(fired) == 5


async def test_users_have_their_own_crontabs_and_admins_may_set_others(tmp_path):
    async with HeadKit(tmp_path) as kit:
        await install(kit, [entry(1, "@daily")])
        await install(kit, [entry(1, "@hourly"), entry(2, "@weekly")], BOB)
        assert len((await kit.call("scrontab_get", ALICE))["entries"]) == 1
        assert len((await kit.call("scrontab_get", BOB))["entries"]) == 2
        assert "only root and admins" in await kit.refused("scrontab_get", ALICE, user="root")
        assert (await kit.call("scrontab_get", ROOT, user="root")) == {"text": "", "entries": []}


@pytest.mark.parametrize("entries, text, message", [
    ([entry(1, "* * * * *", array="0-3")], None, "line 1: --array is not allowed in scrontab"),
    ([entry(1, "* * * * *", dependency="afterok:1")], None, "--dependency is not allowed"),
    ([entry(1, "* * * * *", gpus=-1)], None, "line 1: gpus must be between"),
    ([entry(1, "* * * * *")], "* * * * * true\n@daily x\n", "the request lists 1 entries but the text has 2"),
    ([entry(1, "*/5 * * * *")], "* * * * * true\n", "entry for line 1 does not match the text"),
    ([], "61 * * * * true\n", "scrontab: line 1: invalid schedule"),
])
async def test_the_head_checks_what_gpuctl_sent(tmp_path, entries, text, message):
    async with HeadKit(tmp_path) as kit:
        if text is None:
            text = "".join(f"{e['schedule']} true\n" for e in entries)
        assert message in await kit.refused("scrontab_set", ALICE, text=text, entries=entries)
