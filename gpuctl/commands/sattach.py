"""``gpuctl sattach JOBID.STEP``: attach to a running step's output, and input for task 0.

The step's output is read from what the head still holds of it (up to 4 MiB) on, then as
it comes, with the same cursor as srun's (gpuctl.commands.srun_io), so several readers
see the same lines and a head restart loses none.  When the step takes input (srun
forwards input, or it runs on a terminal), sattach's standard input goes to task 0 too,
as a writer of its own; on a terminal step the local terminal is put in raw mode.
Interrupting sattach (Ctrl-C, when not in raw mode) detaches; the step runs on.

Exit status: the step's, once it ends (0 when detached); 1 when the head refused (no such
step, someone else's); 2 for a usage mistake.
"""

from __future__ import annotations

import sys

import click

from .common import session
from .srun_io import StepStream, stdin_is_null


@click.command("sattach")
@click.option("-l", "--label", is_flag=True, help="Prefix each output line with its task's rank.")
@click.argument("step_ref", metavar="JOBID.STEP")
@click.pass_context
def command(ctx: click.Context, label: bool, step_ref: str) -> int:
    """Attach to step STEP of job JOBID: its output here, and input for task 0."""
    job, dot, step = step_ref.partition(".")
    if not dot or not job.isdigit() or not step.isdigit() or int(job) <= 0:
        raise click.UsageError(f"invalid step {step_ref!r}: use JOBID.STEP, like 42.0", ctx)
    client = session(ctx).client
    stream = StepStream(client.socket_path, int(job), int(step), verb="sattach", label=label,
                        pty=False, forward_input=False if stdin_is_null() else "auto")
    try:
        answer = stream.run(client)
    except KeyboardInterrupt:
        print("sattach: detached; the step goes on", file=sys.stderr)
        return 0
    code = int(answer.get("exit_code") or 0)
    if code:
        print(f"sattach: error: {answer.get('message') or f'step {step_ref} failed'}", file=sys.stderr)
    return code
