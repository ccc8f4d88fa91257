"""``gpuctl squeue``: pending and running jobs, Slurm's columns or ``--json``."""

from __future__ import annotations

import time

import click

from .. import format as fmt
from .common import job_ids, session, split_list

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


@click.command("squeue")
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Only jobs of these users.")
@click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True, help="Only these jobs.")
@click.option("-t", "--states", "states", metavar="STATE[,STATE...]", multiple=True,
              help="Only jobs in these states (names or codes; 'all' adds finished jobs).")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("-h", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
def command(ctx: click.Context, users: tuple[str, ...], jobs: tuple[str, ...], states: tuple[str, ...],
            me: bool, as_json: bool, noheader: bool) -> None:
    """List pending and running jobs (all users unless -u or --me)."""
    ids = job_ids(jobs, "--jobs") or None
    wanted, finished = parse_states(states)
    user_list = split_list(users)
    client = session(ctx).client
    if me:
        user_list.append(str(client.ping()["user"]))
    records = client.jobs(job_ids=ids, users=user_list or None, states=wanted, all=finished)
    records = fmt.squeue_order(records)
    if as_json:
        click.echo(fmt.to_json("jobs", records))
    else:
        out = fmt.squeue_table(records, clock(), header=not noheader)
        if out:
            click.echo(out)
