"""``gpuctl srun``: inside a job, run a command's tasks on every node of the job.

gpud makes no allocation for srun: it runs only where ``GPUD_JOB_ID`` is set (in a batch
script), and the step uses the job's nodes and GPUs.  The head starts the tasks through
each node's worker (op ``step_launch``); srun long-polls the output (``step_poll``) and
prints it as it arrives, stdout to stdout and stderr to stderr, each line prefixed by the
task's rank with ``--label``.  It exits with the status of the first task that failed
(128 + the signal for a killed one; the other tasks are killed then, like Slurm's
``--kill-on-bad-exit``), 0 when all succeeded, 1 when the head refused or the job ended
under it, and 2 for a usage mistake.  An interrupt (Ctrl-C) kills the step's tasks.
"""

from __future__ import annotations

import os
import sys

import click

from .common import CommandFailed, session


@click.command("srun", context_settings={"allow_interspersed_args": False})
@click.option("--ntasks-per-node", type=click.IntRange(1, 256), metavar="N",
              help="Tasks to start on each node (default: the job's --ntasks-per-node).")
@click.option("-l", "--label", is_flag=True, help="Prefix each output line with its task's rank.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="COMMAND [ARGS]...")
@click.pass_context
def command(ctx: click.Context, ntasks_per_node: int | None, label: bool, command: tuple[str, ...]) -> int:
    """Run COMMAND on every node of the job this runs in (GPUD_JOB_ID)."""
    raw = os.environ.get("GPUD_JOB_ID")
    if not raw:
        raise click.UsageError("not inside a job (GPUD_JOB_ID is not set): gpud does not allocate for srun; "
                               "call gpuctl srun from a script submitted with gpuctl sbatch", ctx)
    if not raw.isdigit() or int(raw) <= 0:
        raise click.UsageError(f"GPUD_JOB_ID={raw!r} is not a job id", ctx)
    job_id = int(raw)
    client = session(ctx).client
    args = {"job_id": job_id, "argv": list(command), "env": dict(os.environ)}
    if ntasks_per_node is not None:
        args["ntasks_per_node"] = ntasks_per_node
    step = client.call("step_launch", **args)["step"]
    offset = 0
    try:
        while True:
            answer = client.call("step_poll", job_id=job_id, step=step, offset=offset)
            if answer.get("dropped"):
                click.echo(f"srun: warning: {answer['dropped']} line(s) of output were dropped "
                           "(the head keeps 4 MiB per step)", err=True)
            _write(answer["lines"], label)
            sys.stdout.flush()
            sys.stderr.flush()
            offset = answer["offset"]
            if answer["done"]:
                break
    except KeyboardInterrupt:
        # The interrupted poll's answer is still owed on this connection; a new one gets
        # the cancel's answer at once instead of after the long poll.
        client.close()
        client.call("step_cancel", job_id=job_id, step=step)
        raise CommandFailed(f"interrupted; the tasks of step {job_id}.{step} were killed") from None
    code = answer.get("exit_code") or 0
    if code:
        print(f"srun: error: {answer.get('message') or f'step {job_id}.{step} failed'}", file=sys.stderr)
    return int(code)


def _write(lines: list, label: bool) -> None:
    """Lines in order, each run of one stream in one write."""
    run: list[str] = []
    stream = 1
    for rank, fd, text in lines:
        if fd != stream and run:
            (sys.stdout if stream == 1 else sys.stderr).write("".join(run))
            run = []
        stream = fd
        run.append(f"{rank}: {text}" if label else text)
    if run:
        (sys.stdout if stream == 1 else sys.stderr).write("".join(run))
