"""``gpuctl srun``: run a command's tasks on every node of a job, in a job or an allocation of its own.

Inside a job (``GPUD_JOB_ID`` set: a batch script, or a ``gpuctl salloc`` command) the
step uses the job's nodes and GPUs, and of sbatch's resource options only
``--ntasks-per-node`` counts.  Outside one, srun first makes an interactive allocation
from those options, as salloc does (gpuctl.commands.salloc: queued like any job, kept
alive while srun runs, released when the step ends), and says "job N queued and waiting
for resources" only when it has to wait.

The head starts the tasks through each node's worker (op ``step_launch``); srun reads the
output (gpuctl.commands.srun_io: long polls with a cursor, so a head restart loses or
doubles nothing) and prints it as it arrives, stdout to stdout and stderr to stderr,
each task's lines in order, prefixed by the task's rank with ``--label``.  Standard input
goes to task 0 (unless it is /dev/null).  With ``--pty`` the one task runs on a
terminal on its node: the local terminal is in raw mode, keys (Ctrl-C, Ctrl-Z, Ctrl-D
too) go to the remote terminal, and its size follows the local one.

srun exits with the status of the first task that failed (128 + the signal for a killed
one; the other tasks are killed then, like Slurm's ``--kill-on-bad-exit``), 0 when all
succeeded, 1 when the head refused, the allocation was revoked or the job ended under
it, and 2 for a usage mistake.  An interrupt (Ctrl-C, without ``--pty``) kills the
step's tasks.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from ..client import own_rlimits
from .common import CommandFailed, session
from .salloc import Allocation, allocation_spec, typed_options
from .sbatch import SbatchCommand, _table_options
from .srun_io import RawTerminal, StepStream, stdin_is_null, window_size


@click.command("srun", cls=SbatchCommand, context_settings={"allow_interspersed_args": False})
@_table_options
@click.option("-l", "--label", is_flag=True, help="Prefix each output line with its task's rank.")
@click.option("--pty", is_flag=True, help="Run the one task on a terminal on its node (srun --pty bash).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="COMMAND [ARGS]...")
@click.pass_context
def command(ctx: click.Context, label: bool, pty: bool, command: tuple[str, ...], **params: Any) -> int:
    """Run COMMAND's tasks on every node of the job this runs in (GPUD_JOB_ID), or of an
    allocation made for it from sbatch's resource options."""
    from .. import fastpath

    typed = typed_options(ctx, params)
    raw = os.environ.get("GPUD_JOB_ID")
    sess = session(ctx)
    alloc = None
    env = dict(os.environ)
    per_node = None
    if raw:
        if not raw.isdigit() or int(raw) <= 0:
            raise click.UsageError(f"GPUD_JOB_ID={raw!r} is not a job id", ctx)
        job_id = int(raw)
        if "ntasks_per_node" in typed:
            try:
                per_node = fastpath.typed_settings({"ntasks_per_node": typed.pop("ntasks_per_node")})["ntasks_per_node"]
            except fastpath.Usage as e:
                raise click.UsageError(str(e), ctx) from None
        for dest in typed:
            click.echo(f"srun: warning: {_option(dest)} is ignored inside a job: the step uses job {job_id}'s "
                       "allocation", err=True)
        client = sess.client
    else:
        spec = allocation_spec(typed, "srun", os.path.basename(command[0]))
        client = sess.client
        alloc = Allocation(client, client.socket_path, "srun", _say)
        status = alloc.obtain(spec, loud=False)
        if status is None:
            return 1
        alloc.keep_alive()
        job_id = alloc.job_id
        env.update(status.get("env", {}))
    try:
        return _run_step(client, job_id, list(command), env, per_node, label, pty)
    finally:
        if alloc is not None:
            alloc.release(loud=False)


def _run_step(client: Any, job_id: int, argv: list[str], env: dict[str, str], per_node: int | None,
              label: bool, pty: bool) -> int:
    forward = pty or not stdin_is_null()
    # srun's own limits, which its tasks inherit as a batch job inherits sbatch's
    args: dict[str, Any] = {"job_id": job_id, "argv": argv, "env": env, "rlimits": own_rlimits()}
    if per_node is not None:
        args["ntasks_per_node"] = per_node
    if forward:
        args["stdin"] = True
    if pty:
        rows, cols = window_size(0) or (24, 80)
        args.update(pty=True, rows=rows, cols=cols)
    launched = client.call("step_launch", **args)
    step = launched["step"]
    hints = {"ntasks_per_node": max(1, launched.get("ntasks", 1) // max(1, launched.get("nodes", 1)))}
    if pty:
        hints["pty"] = True
    stream = StepStream(client.socket_path, job_id, step, label=label, pty=pty, forward_input=forward, hints=hints)
    try:
        with RawTerminal() if pty else contextlib.nullcontext():
            answer = stream.run(client)
    except KeyboardInterrupt:
        # The interrupted poll's answer is still owed on this connection; a new one gets
        # the cancel's answer at once instead of after the long poll.
        client.close()
        client.call("step_cancel", job_id=job_id, step=step)
        raise CommandFailed(f"interrupted; the tasks of step {job_id}.{step} were killed") from None
    code = answer.get("exit_code") or 0
    if code and not pty:
        print(f"srun: error: {answer.get('message') or f'step {job_id}.{step} failed'}", file=sys.stderr)
    elif code and answer.get("bad_rank") is None:   # not the shell's own status: say why
        print(f"\r\nsrun: error: {answer.get('message') or f'step {job_id}.{step} failed'}", file=sys.stderr)
    return int(code)


def _say(message: str) -> None:
    print(f"srun: {message}", file=sys.stderr, flush=True)


def _option(dest: str) -> str:
    from .. import options

    return next((o.long for o in options.OPTIONS if o.dest == dest), dest)
