"""``gpuctl sbatch``: submit a batch script from a file, stdin, or ``--wrap``.

The options come from ``gpuctl.script.OPTIONS``; only the ones the user actually typed
override the script's directives (click's parameter source tells typed from default).
Options after the script's path belong to the script, as in Slurm.  Slurm options gpud
does not support are taken out before click parses the rest (``gpuctl.unsupported``) and
reported as warnings, or refused with ``--strict``.

Exit status: 0 submitted (or, with ``--skip-if-active``, nothing to do; with
``--test-only``, estimated); 1 the head refused or could not be reached; 2 a mistake in
the options or the script.  With ``--wait``, the job's own exit code (1 when it was
killed by a signal or ended without one), as Slurm's sbatch does.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import click
from click.core import ParameterSource

from .. import script as scripts
from .. import unsupported
from .common import CommandFailed, session

_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
_UNSUPPORTED_KEY = "gpuctl.unsupported"
WAIT_POLL = (0.1, 2.0)  # --wait polls from every 0.1 s, backing off to every 2 s


def _table_options(f: Callable) -> Callable:
    for opt in reversed(scripts.OPTIONS):
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
        value_options = {name for o in scripts.OPTIONS if not o.is_flag for name in (o.long, o.short) if name}
        kept, warnings = unsupported.split_command_line(args, value_options)
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
    cli = _typed_settings(ctx, params)
    warnings = list(ctx.meta.get(_UNSUPPORTED_KEY, ()))
    wrap = cli.pop("wrap", None)
    if wrap is not None:
        if script_path is not None:
            raise click.UsageError("script arguments are not permitted with --wrap", ctx)
        text, source, default_name = scripts.wrap_script(wrap), "--wrap command", "wrap"
    elif script_path is not None:
        text, source, default_name = _read_file(ctx, script_path), script_path, os.path.basename(script_path)
    else:
        text, source, default_name = _read_stdin(ctx), "the script on stdin", "sbatch"
    try:
        scripts.check_script(text, source)
        directives = scripts.parse_directives(text) if wrap is None else False
        if directives:
            warnings += directives.warnings
        settings = scripts.merge(directives.settings if directives else {}, cli)
        if settings.get("strict") and warnings:
            raise scripts.ScriptError(f"{warnings[0]} (refused: --strict)")
        spec = scripts.build_spec(text, cli, default_name=default_name, args=list(args), directives=directives)
    except scripts.ScriptError as e:
        raise click.UsageError(str(e), ctx) from None
    quiet = bool(settings.get("quiet"))
    for w in warnings:
        _warn(w, quiet)
    sess = session(ctx)
    cluster = ""   # with -M: where the job goes (gpuctl.clusters), said after its id
    if sess.targets is None:
        client = sess.client
    else:
        from .. import clusters

        if spec.get("test_only") and len(sess.targets) > 1:
            clusters.test_everywhere(sess, spec, _estimate)
            return
        cluster, client = clusters.pick_cluster(sess, spec)
    result = client.submit_request(spec)
    for w in result.get("warnings") or ():
        _warn(w, quiet)
    on = f" on cluster {cluster}" if cluster else ""
    if spec.get("test_only"):
        click.echo(_estimate(result) + on, err=True)
        return
    job_id = int(result["job_id"])
    parsable = settings.get("parsable")
    ident = f"{job_id};{cluster}" if cluster else str(job_id)   # Slurm's --parsable form
    if result.get("skipped"):
        click.echo(ident if parsable else
                   f"Job {job_id} named {spec['name']!r} is still pending or running{on}; nothing submitted")
        return
    click.echo(ident if parsable else f"Submitted batch job {job_id}{on}")
    if settings.get("wait"):
        ctx.exit(wait_exit_code(client, job_id))


def _warn(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(f"sbatch: warning: {message}", err=True)


def _estimate(result: dict[str, Any]) -> str:
    """Slurm's --test-only line."""
    from gpud.syntax import format_time

    if result.get("start_time") is None:
        return f"sbatch: Job would not start soon: {result.get('reason') or 'no estimate'}"
    where = f" on nodes {result['node']}" if result.get("node") else ""
    gpus = f" and {result['gpus']} GPUs" if result.get("gpus") else ""
    return (f"sbatch: Job to start at {format_time(result['start_time'])} using {result.get('cpus', 1)} "
            f"processors{gpus}{where} in partition {result.get('partition')}")


def wait_exit_code(client: Any, job_id: int, sleep: Callable[[float], None] = time.sleep) -> int:
    """Wait until the job (every task of an array) has ended; sbatch --wait's exit code."""
    poll = WAIT_POLL[0]
    while True:
        jobs = client.jobs(job_ids=[job_id], all=True)
        if not jobs:
            raise CommandFailed(f"job {job_id} disappeared while waiting for it")
        if all(j.get("state") in _FINISHED for j in jobs):
            return max(job_exit_code(j) for j in jobs)
        sleep(poll)
        poll = min(WAIT_POLL[1], poll * 1.5)


_FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})


def job_exit_code(job: dict[str, Any]) -> int:
    """0 for COMPLETED; the exit code; 1 for a signal or an end without an exit code."""
    if job.get("state") == "COMPLETED":
        return 0
    code = job.get("exit_code")
    if job.get("signal") or not code:
        return 1
    return int(code)


def _typed_settings(ctx: click.Context, params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for opt in scripts.OPTIONS:
        if ctx.get_parameter_source(opt.dest) not in _TYPED:
            continue
        try:
            out = scripts.merge(out, scripts.convert(opt, params[opt.dest]))
        except scripts.ScriptError as e:
            raise click.UsageError(str(e), ctx) from None
    return out


def _read_file(ctx: click.Context, path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise click.UsageError(f"cannot read batch script {path!r}: {e.strerror or e}", ctx) from None
    return _decode(ctx, data, path)


def _read_stdin(ctx: click.Context) -> str:
    stdin = sys.stdin.buffer
    if stdin.isatty():
        raise click.UsageError("no batch script: give a script file, --wrap CMD, or pipe a script on stdin", ctx)
    data = stdin.read()
    if not data.strip():
        raise click.UsageError("the script on stdin is empty", ctx)
    return _decode(ctx, data, "the script on stdin")


def _decode(ctx: click.Context, data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise click.UsageError(f"{source} is not UTF-8 text", ctx) from None
