"""``gpuctl sacct``: jobs that ran or are running, with their outcome.

The caller's own jobs unless ``-a`` or ``-u``: sacct asks the head who we are (ping)
and filters by that name, so it is the head's view of our identity that counts.
Like Slurm, jobs since midnight unless ``-S`` says otherwise or ``-j`` names jobs.
"""

from __future__ import annotations

import re
import time

import click

from .. import format as fmt
from .common import job_ids, session, split_list

_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
clock = time.time  # replaceable in tests
_RELATIVE = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_START_FORMATS = ("YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS], now[-N{seconds,minutes,hours,days,weeks}], "
                  "today, midnight, noon")


def midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


def parse_start_time(text: str, now: float) -> float:
    """Epoch seconds for sacct's ``-S``, in local time; ValueError naming the accepted forms."""
    s = text.strip().lower()
    if s in ("today", "midnight"):
        return midnight(now)
    if s == "noon":
        return midnight(now) + 12 * 3600
    m = _RELATIVE.match(s)
    if m:
        sign, count, unit = m.groups()
        if sign is None:
            return now
        if unit not in _UNITS:
            raise ValueError(f"invalid start time {text!r}: unknown unit {unit!r}; use {_START_FORMATS}")
        delta = int(count) * _UNITS[unit]
        return now - delta if sign == "-" else now + delta
    m = _CLOCK.match(s)
    if m:
        h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if h < 24 and mi < 60 and sec < 60:
            return midnight(now) + h * 3600 + mi * 60 + sec
    else:
        from datetime import datetime

        try:
            return datetime.fromisoformat(text.strip()).timestamp()
        except ValueError:
            pass
    raise ValueError(f"invalid start time {text!r}: use {_START_FORMATS}")


@click.command("sacct")
@click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True, help="Only these jobs.")
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Jobs of these users instead of mine.")
@click.option("-a", "--allusers", is_flag=True, help="Jobs of all users.")
@click.option("-S", "--starttime", metavar="TIME",
              help="Jobs since TIME (default: midnight; with -j: any time).")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("-n", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
def command(ctx: click.Context, jobs: tuple[str, ...], users: tuple[str, ...], allusers: bool,
            starttime: str | None, as_json: bool, noheader: bool) -> None:
    """Show finished and running jobs: my own unless -a or -u."""
    current = clock()
    ids = job_ids(jobs, "--jobs") or None
    since: float | None = None
    if starttime is not None:
        try:
            since = parse_start_time(starttime, current)
        except ValueError as e:
            raise click.UsageError(str(e), ctx) from None
    elif ids is None:
        since = midnight(current)
    client = session(ctx).client
    user_list = split_list(users)
    if not user_list and not allusers:
        user_list = [str(client.ping()["user"])]
    records = client.jobs(job_ids=ids, users=user_list or None, all=True, since=since)
    if as_json:
        click.echo(fmt.to_json("jobs", sorted(records, key=lambda j: j.get("job_id") or 0)))
    else:
        out = fmt.sacct_table(records, current, header=not noheader)
        if out:
            click.echo(out)
