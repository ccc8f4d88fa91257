"""``gpuctl sacct``: jobs that ran or are running, with their outcome.

The caller's own jobs unless ``-a`` or ``-u``: sacct asks the head who we are (ping)
and filters by that name, so it is the head's view of our identity that counts.
Like Slurm, jobs since midnight unless ``-S`` says otherwise or ``-j`` names jobs.
"""

from __future__ import annotations

import time

import click

from gpud.syntax import SyntaxProblem, parse_time

from .. import columns as cols
from .. import format as fmt
from ..clusters import per_cluster
from .common import job_refs, session, split_list
from .squeue import select_refs

clock = time.time  # replaceable in tests


def midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


def parse_start_time(text: str, now: float) -> float:
    """Epoch seconds for sacct's ``-S``/``-E``: Slurm's time formats, as sbatch --begin reads
    them (gpud.syntax), except that a time of day means today even when it has passed."""
    try:
        return parse_time(text, now, roll_forward=False)
    except SyntaxProblem as e:
        raise ValueError(str(e).replace("invalid time", "invalid start time", 1)) from None


_SACCT_STATES = {**{code: name for name, code in fmt.STATE_CODES.items()}, **{n: n for n in fmt.STATE_CODES},
                 "CANCELED": "CANCELLED"}


def parse_sacct_states(values: tuple[str, ...]) -> list[str] | None:
    words = [w.upper() for w in split_list(values)]
    bad = [w for w in words if w not in _SACCT_STATES]
    if bad:
        raise click.UsageError(f"invalid state {bad[0]!r}: use names or codes like COMPLETED, CD, FAILED, F, "
                               "CANCELLED, CA, TIMEOUT, TO")
    return sorted({_SACCT_STATES[w] for w in words}) or None


@click.command("sacct")
@click.option("-j", "--jobs", "jobs", metavar="ID[,ID...]", multiple=True,
              help="Only these jobs (42, 42_7, 42_[1-3]).")
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Jobs of these users instead of mine.")
@click.option("-a", "--allusers", is_flag=True, help="Jobs of all users.")
@click.option("--name", "names", metavar="NAME[,NAME...]", multiple=True, help="Only jobs with these names.")
@click.option("-r", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
              help="Only jobs that ran in these partitions.")
@click.option("-A", "--accounts", "accounts", metavar="ACCOUNT[,ACCOUNT...]", multiple=True,
              help="Only jobs charged to these accounts.")
@click.option("-S", "--starttime", metavar="TIME",
              help="Jobs since TIME (default: midnight; with -j: any time).")
@click.option("-E", "--endtime", metavar="TIME", help="Jobs submitted before TIME (default: now).")
@click.option("-s", "--state", "states", metavar="STATE[,STATE...]", multiple=True,
              help="Only jobs now in these states (names or codes).")
@click.option("-o", "--format", "format_", metavar="FIELDS", help="Columns, e.g. JobID,JobName%30,State,Elapsed.")
@click.option("-l", "--long", "long_", is_flag=True, help="Many columns.")
@click.option("-b", "--brief", is_flag=True, help="JobID, State and ExitCode only.")
@click.option("-D", "--duplicates", is_flag=True,
              help="Also each earlier run of a requeued job, with why it ended (NODE_FAIL, PREEMPTED, REQUEUED).")
@click.option("-X", "--allocations", is_flag=True, help="Jobs only, no steps (gpud jobs have no steps).")
@click.option("-P", "--parsable2", is_flag=True, help="Fields separated by '|', nothing cut.")
@click.option("-p", "--parsable", is_flag=True, help="Like -P with a '|' after the last field too.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("-n", "--noheader", is_flag=True, help="Leave out the header line.")
@click.pass_context
@per_cluster
def command(ctx: click.Context, jobs: tuple[str, ...], users: tuple[str, ...], allusers: bool,
            names: tuple[str, ...], partitions: tuple[str, ...], accounts: tuple[str, ...], starttime: str | None, endtime: str | None, states: tuple[str, ...], format_: str | None,
            long_: bool, brief: bool, duplicates: bool, allocations: bool, parsable2: bool, parsable: bool, as_json: bool,
            noheader: bool) -> None:
    """Show finished and running jobs: my own unless -a or -u."""
    current = clock()
    refs = job_refs(jobs, "--jobs")
    ids = sorted({int(str(r).split("_")[0]) for r in refs}) or None
    since: float | None = None
    until: float | None = None
    try:
        if starttime is not None:
            since = parse_start_time(starttime, current)
        elif ids is None:
            since = midnight(current)
        if endtime is not None:
            until = parse_start_time(endtime, current)
        layout = _layout(format_, long_, brief, parsable or parsable2)
    except (ValueError, cols.FormatError) as e:
        raise click.UsageError(str(e), ctx) from None
    wanted_states = parse_sacct_states(states)
    client = session(ctx).client
    user_list = split_list(users)
    if not user_list and not allusers:
        user_list = [str(client.ping()["user"])]
    records = client.jobs(job_ids=ids, users=user_list or None, all=True, since=since, attempts=duplicates,
                          **({"states": wanted_states} if wanted_states else {}))
    if refs:
        records = select_refs(records, refs)
    if until is not None:
        records = [j for j in records if (j.get("submit_time") or 0) <= until]
    for key, values in (("name", names), ("partition", partitions), ("account", accounts)):
        if split_list(values):
            records = [j for j in records if j.get(key) in set(split_list(values))]
    records = sorted(records, key=fmt.job_order)
    if as_json:
        click.echo(fmt.to_json("jobs", records))
        return
    if duplicates:
        records = with_earlier_runs(records)
    if layout is None:
        out = fmt.sacct_table([dict(j, job_id=j["display_id"]) if j.get("display_id") else j for j in records],
                              current, header=not noheader)
    else:
        out = cols.render_sacct(layout, records, current, header=not noheader,
                                delimiter="|" if parsable or parsable2 else None, trailing=parsable)
    if out:
        click.echo(out)


# What an earlier run does not share with the job's last one
_RUN_ONLY = ("gpu_indices", "gpu_ids", "gpu_uuids", "gpu_util_mean", "max_rss", "total_cpu", "exit_code", "signal")


def with_earlier_runs(records: list[dict]) -> list[dict]:
    """Slurm's ``--duplicates``: each requeued job's earlier runs as rows of their own, in
    order, before its last one; each with its state (NODE_FAIL, PREEMPTED, REQUEUED), node,
    times and the requeue's cause as Reason."""
    out: list[dict] = []
    for r in records:
        for run in r.get("earlier_attempts") or ():
            row = {k: v for k, v in r.items() if k not in _RUN_ONLY and k != "earlier_attempts"}
            row.update(attempt=run["attempt"], state=run["state"], start_time=run["start_time"],
                       end_time=run["end_time"], node=run["node"], nodelist=run["node"], nodes=1,
                       reason=run["reason"])
            out.append(row)
        out.append(r)
    return out


def _layout(format_: str | None, long_: bool, brief: bool, delimited: bool) -> list[cols.Column] | None:
    if format_:
        return cols.parse_sacct(format_)
    if long_:
        return cols.parse_sacct(cols.SACCT_LONG)
    if brief:
        return cols.parse_sacct(cols.SACCT_BRIEF)
    if delimited:
        return cols.parse_sacct(cols.SACCT_DEFAULT)
    return None
