"""``gpuctl scancel``: cancel (or only signal) jobs by id, by user, or by Slurm's filters.

``123`` cancels job 123, or every task of array 123; ``123_4`` one task; ``123_[1-5]`` several.
The filters (``--me``, ``-u``, ``-n``, ``-t``, ``-p``, ``-A``, ``-w``) narrow what is cancelled,
all of them at once, as in Slurm; filters without ids select from the jobs one may cancel
(one's own, or everyone's for root and admins).

Silent on success, like Slurm; each refusal is its own error line, and any refusal
makes the exit status 1.
"""

from __future__ import annotations

from typing import Any

import click

from ..converters import ScriptError, normalize_signal
from .common import CommandFailed, error_line, job_refs, session, split_list


@click.command("scancel")
@click.argument("ids", metavar="[JOBID[_TASK]]...", nargs=-1)
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Cancel these users' jobs (with ids: only those of them).")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("-n", "--name", "--jobname", "names", metavar="NAME[,NAME...]", multiple=True,
              help="Only jobs with these names.")
@click.option("-t", "--state", "states", metavar="STATE[,STATE...]", multiple=True,
              help="Only jobs in these states (PENDING, RUNNING; or PD, R).")
@click.option("-p", "--partition", "partitions", metavar="PART[,PART...]", multiple=True,
              help="Only jobs in these partitions.")
@click.option("-A", "--account", "accounts", metavar="ACCOUNT[,ACCOUNT...]", multiple=True,
              help="Only jobs charged to these accounts.")
@click.option("-w", "--nodelist", "nodes", metavar="HOSTLIST", multiple=True,
              help="Only jobs running on these nodes.")
@click.option("-s", "--signal", "sig", metavar="SIG",
              help="Send this signal instead of cancelling (a name like USR1, or a number).")
@click.pass_context
def command(ctx: click.Context, ids: tuple[str, ...], users: tuple[str, ...], me: bool, names: tuple[str, ...],
            states: tuple[str, ...], partitions: tuple[str, ...], accounts: tuple[str, ...],
            nodes: tuple[str, ...], sig: str | None) -> None:
    """Cancel jobs, or send them a signal with -s."""
    id_list = job_refs(ids, "scancel")
    user_list = split_list(users)
    filters = _filters(ctx, names, states, partitions, accounts, nodes)
    if not id_list and not user_list and not me and not filters:
        raise click.UsageError("no job id given: name jobs by id, all of a user's with -u USER, or your own "
                               "with --me (-n, -t, -p, -A, -w narrow them)", ctx)
    signal = None
    if sig is not None:
        try:
            signal = normalize_signal(sig, "--signal")
        except ScriptError as e:
            raise click.UsageError(str(e), ctx) from None
    client = session(ctx).client
    if me or filters:
        who = client.ping()
        if me:
            user_list.append(str(who["user"]))
        elif not user_list and not id_list and not who.get("admin"):
            user_list.append(str(who["user"]))      # a user's filters pick from their own jobs
        id_list = _selected(client, id_list, user_list, filters)
        if not id_list:
            return                                  # nothing matched: Slurm says nothing either
        user_list = []
    result = client.cancel(job_ids=id_list or None, users=user_list or None, signal=signal)
    errors = [str(e) for e in result["errors"]]
    for message in errors[:-1]:
        error_line(message)
    if errors:
        raise CommandFailed(errors[-1])


def _filters(ctx: click.Context, names: tuple[str, ...], states: tuple[str, ...], partitions: tuple[str, ...],
             accounts: tuple[str, ...], nodes: tuple[str, ...]) -> dict[str, set[str]]:
    from .squeue import QueryError, parse_states

    out: dict[str, set[str]] = {}
    for key, values in (("name", names), ("partition", partitions), ("account", accounts)):
        if split_list(values):
            out[key] = set(split_list(values))
    if states:
        try:
            wanted, _ = parse_states(states)
        except QueryError as e:
            raise click.UsageError(str(e), ctx) from None
        if wanted is not None:
            out["state"] = set(wanted)
    if nodes:
        from gpud.hostlist import expand

        try:
            out["nodes"] = set(expand(",".join(nodes)))
        except ValueError as e:
            raise click.UsageError(f"--nodelist: {e}", ctx) from None
    return out


def _selected(client: Any, ids: list[int | str], users: list[str], filters: dict[str, set[str]]) -> list[int | str]:
    """The ids of the unfinished jobs the ids, users and filters all select."""
    from .squeue import select_refs

    jobs = client.jobs(users=users or None)
    if ids:
        jobs = select_refs(jobs, ids)
    out: list[int | str] = []
    for j in jobs:
        if any(j.get(key) not in wanted for key, wanted in filters.items() if key != "nodes"):
            continue
        if "nodes" in filters and not filters["nodes"] & job_nodes(j):
            continue
        out.append(j["display_id"] if j.get("array_task_id") is not None else int(j["job_id"]))
    return out


def job_nodes(job: dict[str, Any]) -> set[str]:
    """The names of the nodes a JOB record holds."""
    from gpud.hostlist import expand

    text = job.get("nodelist") or job.get("node")
    return set(expand(text)) if text else set()
