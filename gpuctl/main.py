"""``gpuctl``: Slurm's verbs for gpud.  ``gpuctl [--socket PATH] [--config PATH] [-M CLUSTERS] VERB ...``

Theory of operation
-------------------
The group knows its verbs by name only (``VERBS``) and imports a verb's module when that
verb runs, so ``gpuctl squeue`` pays for squeue alone: gpuctl runs in loops, from cron
and over SSH, and its start-up time is most of its run time.  The console script is
``gpuctl.fastpath.main``: a plain ``sbatch`` command line never reaches this module (nor
click); everything else comes here.

Errors are shaped here, once, for every verb (Slurm's habits):

* the user's mistake (unknown option, bad value, missing script): ``VERB: error: ...``,
  a hint to ``--help``, exit 2;
* the head refused, or could not be reached, or answered nonsense: ``VERB: error: ...``,
  exit 1;
* never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from gpud.protocol import ProtocolError, RemoteError

from .client import HeadUnavailable
from .commands.common import CommandFailed, Session

VERBS = {
    "sbatch": "Submit a batch script.",
    "squeue": "List pending and running jobs.",
    "scancel": "Cancel or signal jobs.",
    "sinfo": "Show nodes and their GPUs.",
    "sacct": "Show finished and running jobs (accounting).",
    "scontrol": "Show or change jobs, nodes and partitions (hold, release, update, ...).",
    "scrontab": "Install, list or edit recurring batch jobs.",
    "seff": "Show one job's CPU, memory and GPU efficiency.",
    "sstat": "Show a running job's CPU time and memory so far, per step.",
    "report": "Report GPU-hours, cost and utilization by account, user, partition or GPU type.",
    "top": "Watch nodes and GPUs live: utilization and who holds each GPU.",
    "sprio": "Show pending jobs' priority factors.",
    "sshare": "Show fair-share usage and factors by account and user.",
    "srun": "Run a command's tasks on a job's nodes (in a job, or in an allocation of its own).",
    "salloc": "Get an interactive allocation and run a command (your shell) while it lasts.",
    "sattach": "Attach to a running step's output (and input for task 0).",
}


class VerbGroup(click.Group):
    """A click group that loads verbs lazily and prints errors Slurm's way."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in VERBS:
            return None
        return importlib.import_module(f"gpuctl.commands.{name}").command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Verbs"):
            formatter.write_dl(list(VERBS.items()))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RemoteError, HeadUnavailable, ProtocolError) as e:
            raise CommandFailed(str(e), prog=ctx.invoked_subcommand) from None

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        code = self._run(args, prog_name or "gpuctl", complete_var, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Any, prog_name: str, complete_var: str | None, **extra: Any) -> int:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help() if e.ctx else "", err=True)
            return 2
        except click.UsageError as e:
            prog = e.ctx.info_name if e.ctx is not None else prog_name
            click.echo(f"{prog}: error: {_one_line(e.format_message())}", err=True)
            if e.ctx is not None:
                click.echo(f"Try '{e.ctx.command_path} --help' for more information.", err=True)
            return 2
        except CommandFailed as e:
            click.echo(f"{e.prog}: error: {_one_line(e.format_message())}", err=True)
            return e.exit_code
        except click.ClickException as e:
            click.echo(f"{prog_name}: error: {_one_line(e.format_message())}", err=True)
            return e.exit_code
        except click.Abort:
            click.echo(f"{prog_name}: interrupted", err=True)
            return 130
        return rv if isinstance(rv, int) else 0


def _one_line(message: str) -> str:
    return " ".join(message.split())


@click.group("gpuctl", cls=VerbGroup, subcommand_metavar="VERB [ARGS]...", context_settings={"max_content_width": 100})
@click.option("--socket", "socket_path", metavar="PATH",
              help="The head's socket (default: $GPUD_SOCKET, the config file, /run/gpud/gpud.sock).")
@click.option("--config", "config_path", metavar="PATH",
              help="Config file to read the socket from (default: $GPUD_CONFIG, /etc/gpud/gpud.toml).")
@click.option("-M", "--clusters", "clusters", metavar="NAME[,NAME...]|all",
              help="Ask these clusters of the config's [clusters] table instead of the local head.")
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, config_path: str | None, clusters: str | None) -> None:
    """Submit and watch batch jobs on a gpud cluster, with Slurm's verbs and options."""
    ctx.obj = Session(socket_path, config_path)
    ctx.call_on_close(ctx.obj.close)
    if clusters is not None:
        from .clusters import ClusterError, select

        if socket_path is not None:
            raise click.UsageError("-M and --socket exclude each other: -M takes each cluster's socket "
                                   "from the config's [clusters] table", ctx)
        try:
            ctx.obj.targets = select(clusters, config_path)
        except ClusterError as e:
            raise click.UsageError(str(e), ctx) from None


def main(args: list[str] | None = None, prog_name: str = "gpuctl") -> None:
    """Runs one verb and exits with its status (sys.exit); a plain sbatch goes the fast path."""
    from . import fastpath

    argv = sys.argv[1:] if args is None else list(args)
    code = fastpath.run_sbatch(argv) if prog_name == fastpath.PROG else None
    if code is not None:
        sys.exit(code)
    cli.main(args=argv, prog_name=prog_name)


if __name__ == "__main__":
    main()
