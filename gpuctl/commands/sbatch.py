"""``gpuctl sbatch``: submit a batch script from a file, stdin, or ``--wrap``.

The options come from ``gpuctl.options.OPTIONS``; only the ones the user actually typed
override the script's directives (click's parameter source tells typed from default).
Options after the script's path belong to the script, as in Slurm.  Slurm options gpud
does not support are taken out before click parses the rest (``gpuctl.unsupported``) and
reported as warnings, or refused with ``--strict``.

This is the click side of sbatch: ``-M``, ``--help`` and the messages for options click
cannot parse.  What sbatch does with the options once they are known is
``gpuctl.fastpath``'s, shared with the console script's click-free path for plain command
lines, so both behave alike to the byte.

Exit status: 0 submitted (or, with ``--skip-if-active``, nothing to do; with
``--test-only``, estimated); 1 the head refused or could not be reached; 2 a mistake in
the options or the script.  With ``--wait``, the job's own exit code (1 when it was
killed by a signal or ended without one), as Slurm's sbatch does.
"""

from __future__ import annotations

from typing import Any, Callable

import click
from click.core import ParameterSource

from .. import fastpath, options, unsupported
from ..fastpath import WAIT_POLL, job_exit_code, wait_exit_code  # noqa: F401 (this module's API before)
from .common import CommandFailed, session

_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
_UNSUPPORTED_KEY = "gpuctl.unsupported"


def _table_options(f: Callable) -> Callable:
    for opt in reversed(options.OPTIONS):
        decls = [f"{opt.long}/{opt.negation}" if opt.negation else opt.long]
        if opt.short:
            decls.append(opt.short)
        if opt.negation:
            f = click.option(*decls, opt.dest, default=None, help=opt.help)(f)
        elif opt.is_flag:
            f = click.option(*decls, opt.dest, is_flag=True, default=False, help=opt.help)(f)
        else:
            f = click.option(*decls, opt.dest, metavar=opt.metavar, default=None, help=opt.help)(f)
    return f


class SbatchCommand(click.Command):
    """Takes Slurm's unsupported options out of the arguments before click parses them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        value_options = {name for o in options.OPTIONS if not o.is_flag for name in (o.long, o.short) if name}
        kept, warnings = unsupported.split_command_line(args, value_options, options.long_option)
        ctx.meta[_UNSUPPORTED_KEY] = warnings
        return super().parse_args(ctx, kept)


@click.command("sbatch", cls=SbatchCommand, context_settings={"allow_interspersed_args": False})
@_table_options
@click.argument("script_path", metavar="[SCRIPT [ARGS]...]", required=False)
@click.argument("args", nargs=-1, metavar="", type=click.UNPROCESSED)
@click.pass_context
def command(ctx: click.Context, script_path: str | None, args: tuple[str, ...], **params: Any) -> None:
    """Submit a batch script: from SCRIPT, from --wrap CMD, or piped on stdin.

    #SBATCH and #GPUD lines before the first command take the same options;
    options given here override them.  ARGS become the script's $1, $2, ...
    """
    typed = {opt.dest: params[opt.dest] for opt in options.OPTIONS if ctx.get_parameter_source(opt.dest) in _TYPED}
    try:
        job = fastpath.prepare(fastpath.typed_settings(typed), script_path, list(args),
                               list(ctx.meta.get(_UNSUPPORTED_KEY, ())))
    except fastpath.Usage as e:
        raise click.UsageError(str(e), ctx) from None
    job.warn(click.echo)
    sess = session(ctx)
    cluster = ""   # with -M: where the job goes (gpuctl.clusters), said after its id
    if sess.targets is None:
        client = sess.client
    else:
        from .. import clusters

        if job.spec.get("test_only") and len(sess.targets) > 1:
            clusters.test_everywhere(sess, job.spec, fastpath.estimate)
            return
        cluster, client = clusters.pick_cluster(sess, job.spec)
    try:
        code = fastpath.deliver(client, job, click.echo, cluster)
    except fastpath.Failed as e:
        raise CommandFailed(str(e)) from None
    if code:
        ctx.exit(code)
