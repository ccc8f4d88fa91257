"""``gpuctl squeue``: pending and running jobs, Slurm's columns, formats, or ``--json``.

Without ``-o``/``-O``/``-l``/``--start`` the table is gpud's (with a GPUS column); with them,
Slurm's layouts (``gpuctl.columns``).  Pending tasks of an array show as one line
(``123_[4-99%10]``) unless ``-r``; ``-j 123`` lists the whole array, ``-j 123_4`` one task.
"""

from __future__ import annotations

import time

import click

from .. import columns as cols
from .. import format as fmt
from ..clusters import per_cluster
from .common import job_refs, session, split_list

_STATES = {**{code: name for name, code in fmt.STATE_CODES.items()}, **{n: n for n in fmt.STATE_CODES}}
clock = time.time  # replaceable in tests
_FINISHED = frozenset(fmt.STATE_CODES) - {"PENDING", "RUNNING", "COMPLETING"}


def parse_states(values: tuple[str, ...]) -> tuple[list[str] | None, bool]:
    """(state names or None for any, whether finished jobs are wanted) from ``-t`` values."""
    words = [w.upper() for w in split_list(values)]
    if not words:
        return None, False
    if "ALL" in words:
        return None, True
    states = []
    for w in words:
        if w not in _STATES:
            raise click.UsageError(
                f"invalid job state {w!r}: use names or codes like PENDING, PD, RUNNING, R, or all")
        states.append(_STATES[w])
    return sorted(set(states)), any(s in _FINISHED for s in states)


def select_refs(records: list[dict], refs: list[int | str]) -> list[dict]:
    """Records named by ``refs`` (``42`` also means every task of array 42; ``42_7`` one task)."""
    ids = {r for r in refs if isinstance(r, int)}
    tasks = {tuple(int(x) for x in r.split("_")) for r in refs if isinstance(r, str)}
    return [j for j in records if j.get("job_id") in ids or j.get("array_job_id") in ids
            or (j.get("array_job_id"), j.get("array_task_id")) in tasks]


@click.command("squeue")
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Only jobs of these users.")
@click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True,
              help="Only these jobs (42, 42_7, 42_[1-3]).")
@click.option("-t", "--states", "states", metavar="STATE[,STATE...]", multiple=True,
              help="Only jobs in these states (names or codes; 'all' adds finished jobs).")
@click.option("-p", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
              help="Only jobs in these partitions.")
@click.option("-A", "--account", "accounts", metavar="ACCOUNT[,ACCOUNT...]", multiple=True,
              help="Only jobs charged to these accounts.")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("-o", "--format", "format_", metavar="FORMAT", help="Slurm's %-fields, e.g. '%.18i %.9P %j %R'.")
@click.option("-O", "--Format", "format_long", metavar="FIELDS", help="Named fields, e.g. jobid:10,name:30,state.")
@click.option("-l", "--long", "long_", is_flag=True, help="Slurm's long layout (state, time limit).")
@click.option("--start", is_flag=True, help="Pending jobs with their expected start times.")
@click.option("-S", "--sort", "sort", metavar="KEYS", help="Sort by %-letters, e.g. -p,i ('-' descending).")
@click.option("-r", "--array", "expand_arrays", is_flag=True, help="One line per array task.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
@per_cluster
def command(ctx: click.Context, users: tuple[str, ...], jobs: tuple[str, ...], states: tuple[str, ...],
            partitions: tuple[str, ...], accounts: tuple[str, ...], me: bool, format_: str | None,
            format_long: str | None, long_: bool, start: bool, sort: str | None, expand_arrays: bool,
            as_json: bool, noheader: bool) -> None:
    """List pending and running jobs (all users unless -u or --me)."""
    refs = job_refs(jobs, "--jobs")
    wanted, finished = parse_states(states)
    if start:
        wanted, finished = ["PENDING"], False
    user_list = split_list(users)
    try:
        layout = _layout(format_, format_long, long_, start)
    except cols.FormatError as e:
        raise click.UsageError(str(e), ctx) from None
    client = session(ctx).client
    if me:
        user_list.append(str(client.ping()["user"]))
    ids = sorted({int(str(r).split("_")[0]) for r in refs}) or None
    records = client.jobs(job_ids=ids, users=user_list or None, states=wanted, all=finished)
    if refs:
        records = select_refs(records, refs)
    parts, accts = set(split_list(partitions)), set(split_list(accounts))
    if parts:
        records = [j for j in records if j.get("partition") in parts]
    if accts:
        records = [j for j in records if j.get("account") in accts]
    now = clock()
    records = fmt.squeue_order(records)
    if start:
        records = sorted(records, key=lambda j: (j.get("expected_start") or float("inf"), j.get("job_id") or 0))
    if sort:
        try:
            records = cols.sort_records(records, sort, now)
        except cols.FormatError as e:
            raise click.UsageError(str(e), ctx) from None
    if as_json:
        click.echo(fmt.to_json("jobs", records))
        return
    if not expand_arrays:
        records = cols.collapse_arrays(records)
    if layout is None:
        out = fmt.squeue_table(_displayed(records), now, header=not noheader)
    else:
        out = cols.render(layout, records, now, header=not noheader)
        if long_ and not noheader:
            out = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "\n" + out
    if out:
        click.echo(out)


def _layout(format_: str | None, format_long: str | None, long_: bool, start: bool) -> list[cols.Column] | None:
    if format_:
        return cols.parse_percent(format_, cols.SQUEUE, "--format")
    if format_long:
        return cols.parse_named(format_long, cols.SQUEUE_NAMES, cols.SQUEUE, "--Format")
    if start:
        return cols.parse_percent(cols.SQUEUE_START, cols.SQUEUE, "--start")
    if long_:
        return cols.parse_percent(cols.SQUEUE_LONG, cols.SQUEUE, "--long")
    return None


def _displayed(records: list[dict]) -> list[dict]:
    """gpud's own table shows array tasks by their display id."""
    return [dict(j, job_id=j["display_id"]) if j.get("display_id") else j for j in records]
