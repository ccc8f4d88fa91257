"""``gpuctl scancel``: cancel (or only signal) jobs by id or by user.

``123`` cancels job 123, or every task of array 123; ``123_4`` one task; ``123_[1-5]`` several.

Silent on success, like Slurm; each refusal is its own error line, and any refusal
makes the exit status 1.
"""

from __future__ import annotations

import click

from ..script import ScriptError, normalize_signal
from .common import CommandFailed, error_line, job_refs, session, split_list


@click.command("scancel")
@click.argument("ids", metavar="[JOBID[_TASK]]...", nargs=-1)
@click.option("-u", "--user", "users", metavar="USER[,USER...]", multiple=True,
              help="Cancel these users' jobs (with ids: only those of them).")
@click.option("-s", "--signal", "sig", metavar="SIG",
              help="Send this signal instead of cancelling (a name like USR1, or a number).")
@click.pass_context
def command(ctx: click.Context, ids: tuple[str, ...], users: tuple[str, ...], sig: str | None) -> None:
    """Cancel jobs, or send them a signal with -s."""
    id_list = job_refs(ids, "scancel")
    user_list = split_list(users)
    if not id_list and not user_list:
        raise click.UsageError("no job id given: name jobs by id, or all of a user's with -u USER", ctx)
    signal = None
    if sig is not None:
        try:
            signal = normalize_signal(sig, "--signal")
        except ScriptError as e:
            raise click.UsageError(str(e), ctx) from None
    result = session(ctx).client.cancel(job_ids=id_list or None, users=user_list or None, signal=signal)
    errors = [str(e) for e in result["errors"]]
    for message in errors[:-1]:
        error_line(message)
    if errors:
        raise CommandFailed(errors[-1])
