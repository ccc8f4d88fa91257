"""``gpuctl sbatch``: submit a batch script from a file, stdin, or ``--wrap``.

The options come from ``gpuctl.script.OPTIONS``; only the ones the user actually typed
override the script's directives (click's parameter source tells typed from default).
Options after the script's path belong to the script, as in Slurm.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import click
from click.core import ParameterSource

from .. import script as scripts
from .common import session

_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


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


@click.command("sbatch", context_settings={"allow_interspersed_args": False})
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
        spec = scripts.build_spec(text, cli, default_name=default_name, args=list(args),
                                  directives=wrap is None)
        parsable = cli.get("parsable") or (wrap is None and scripts.parse_directives(text).settings.get("parsable"))
    except scripts.ScriptError as e:
        raise click.UsageError(str(e), ctx) from None
    job_id = session(ctx).client.submit_spec(spec)
    click.echo(str(job_id) if parsable else f"Submitted batch job {job_id}")


def _typed_settings(ctx: click.Context, params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for opt in scripts.OPTIONS:
        if ctx.get_parameter_source(opt.dest) not in _TYPED:
            continue
        try:
            out.update(scripts.convert(opt, params[opt.dest]))
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
    stdin = click.get_binary_stream("stdin")
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
