"""``gpuctl salloc``: get an allocation, run a command on this host while it lasts, release it.

The allocation is a job like any other (queued, prioritised, limited, preempted and timed
out the same way), marked ``interactive``: its script is ``HOLDER``, which only waits.
salloc prints Slurm's messages on stderr while it waits ("Pending job allocation N",
"job N queued and waiting for resources", "Granted job allocation N"), then runs COMMAND
(default: ``$SHELL``) here with the job's environment (``GPUD_JOB_ID``, the node list,
``SLURM_JOB_ID`` when the head sets Slurm's variables), so that ``gpuctl srun`` in it runs
steps on the allocated nodes.

While it waits and while COMMAND runs, a keepalive (``alloc_status``) goes to the head
every quarter of ``[head] interactive_timeout``; a salloc that dies or loses the head for
longer than that loses its allocation (gpud.head.interactive).  When COMMAND ends, salloc
says "Relinquishing job allocation N" and releases it (``alloc_release``: the head stops
the holder, and the job ends COMPLETED).  Ctrl-C while pending withdraws the request;
while COMMAND runs, Ctrl-C belongs to COMMAND.  When the allocation ends under COMMAND
(time limit, preemption, scancel) salloc says so and sends COMMAND SIGHUP.

Exit status: COMMAND's (128 + the signal when it was killed), 1 when the allocation was
refused or revoked before it was granted, 2 for a usage mistake.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import click

from ..client import Client, HeadUnavailable
from gpud.protocol import RemoteError
from .common import CommandFailed, session
from .sbatch import _TYPED, SbatchCommand, _table_options

# The job's script: it holds the allocation and runs nothing.  Only a stop (TERM, KILL:
# salloc's release, a cancel, the time limit) ends it; the signals a job is sent to tell it
# something are ignored, as gang holders do.
HOLDER = ("#!/bin/sh\n"
          "# gpuctl salloc: holds this interactive allocation; gpuctl srun runs the work\n"
          "trap '' HUP INT QUIT USR1 USR2 ALRM PIPE TSTP TTIN TTOU\n"
          "exec sleep 2147483647\n")
# Settings that make no sense without a batch script.
NOT_FOR_ALLOCATIONS = {"wrap": "--wrap", "array": "--array", "output": "--output", "error": "--error",
                       "open_mode": "--open-mode", "parsable": "--parsable", "wait": "--wait",
                       "skip_if_active": "--skip-if-active", "test_only": "--test-only"}
WAIT_POLL = (0.1, 1.0)      # seconds between status calls while pending: first, at most
RECONNECT_FOR = 300.0       # seconds a waiting salloc keeps trying to reach a head that went away
QUEUED_AFTER = 0.5          # seconds pending before "queued and waiting for resources" is said
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})


class Revoked(Exception):
    """The allocation ended (or was refused) before it was granted."""


def allocation_spec(typed: dict[str, Any], verb: str, name: str = "interactive") -> dict[str, Any]:
    """The job spec of an interactive allocation from the sbatch options the user typed."""
    from .. import fastpath
    from .. import script as scripts
    from ..converters import ScriptError

    for key, option in NOT_FOR_ALLOCATIONS.items():
        if typed.get(key) not in (None, False):
            raise click.UsageError(f"{verb} does not take {option}: it makes an interactive allocation, "
                                   "not a batch job (use gpuctl sbatch for that)")
    try:
        cli = fastpath.typed_settings(typed)
        spec = scripts.build_spec(HOLDER, cli, default_name=name, directives=False)
    except (fastpath.Usage, ScriptError) as e:
        raise click.UsageError(str(e)) from None
    spec.update(interactive=True, requeue=False, stdout="/dev/null")
    spec.pop("stderr", None)
    return spec


def typed_options(ctx: click.Context, params: dict[str, Any]) -> dict[str, Any]:
    from .. import options

    return {o.dest: params[o.dest] for o in options.OPTIONS if ctx.get_parameter_source(o.dest) in _TYPED}


class Allocation:
    """One interactive allocation, from the request to its release; ``say`` prints a message."""

    def __init__(self, client: Client, socket_path: str, verb: str, say: Callable[[str], None]) -> None:
        self.client = client
        self.socket_path = socket_path
        self.verb = verb
        self.say = say
        self.job_id = 0
        self.status: dict[str, Any] = {}
        self.every = 5.0
        self.revoked: str | None = None      # why it ended under its command
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_revoked: Callable[[str], None] | None = None

    def request(self, spec: dict[str, Any]) -> int:
        result = self.client.submit_request(spec)
        self.job_id = int(result["job_id"])
        return self.job_id

    def obtain(self, spec: dict[str, Any], *, loud: bool) -> dict[str, Any] | None:
        """Ask for the allocation and wait until it is granted: its status; None when the
        user pressed Ctrl-C meanwhile (the request is withdrawn).  A revoked request is a
        CommandFailed."""
        try:
            self.request(spec)
            return self.wait_granted(loud=loud)
        except KeyboardInterrupt:
            self.release(loud=True)
            return None
        except Revoked as e:
            raise CommandFailed(str(e)) from None

    def wait_granted(self, *, loud: bool) -> dict[str, Any]:
        """Poll (each poll a keepalive) until the job runs; Revoked if it ends first."""
        if loud:
            self.say(f"Pending job allocation {self.job_id}")
        poll, queued, asked = WAIT_POLL[0], False, time.monotonic()
        gone_since: float | None = None
        while True:
            try:
                st = self.client.call("alloc_status", job_id=self.job_id)
            except HeadUnavailable:   # a head restart: the request waits in its queue meanwhile
                self.client.close()
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > RECONNECT_FOR:
                    raise
                time.sleep(WAIT_POLL[1])
                continue
            gone_since = None
            self.every = float(st.get("keepalive_every") or self.every)
            if st["state"] == "RUNNING" and st.get("nodelist"):
                self.status = st
                if queued or loud:
                    self.say(f"job {self.job_id} has been allocated resources" if not loud
                             else f"Granted job allocation {self.job_id}")
                return st
            if st["state"] in FINISHED or st["state"] == "COMPLETING":
                raise Revoked(f"Job allocation {self.job_id} has been revoked ({st['state'].lower()})")
            if not queued and time.monotonic() - asked >= QUEUED_AFTER:
                queued = True
                reason = f" (reason: {st['reason']})" if st.get("reason") else ""
                self.say(f"job {self.job_id} queued and waiting for resources{reason}")
            time.sleep(min(poll, self.every))
            poll = min(WAIT_POLL[1], poll * 1.5)

    def keep_alive(self) -> None:
        """From now on a thread of its own keeps the allocation, on a connection of its own."""
        self._thread = threading.Thread(target=self._keepalive, name="keepalive", daemon=True)
        self._thread.start()

    def _keepalive(self) -> None:
        client = Client(self.socket_path)
        warned = False
        while not self._stop.wait(self.every):
            try:
                st = client.call("alloc_status", job_id=self.job_id)
            except (HeadUnavailable, OSError):   # a head restart: keep trying, the head waits for us
                client.close()
                if not warned:
                    warned = True
                    self.say("warning: cannot reach the head; the allocation is kept while it comes back")
                continue
            except RemoteError as e:
                self._revoke(str(e))
                return
            warned = False
            if st["state"] != "RUNNING":
                self._revoke(f"Job allocation {self.job_id} has been revoked ({st['state'].lower()})")
                return
        client.close()

    def _revoke(self, why: str) -> None:
        self.revoked = why
        self.say(why)
        if self.on_revoked is not None:
            self.on_revoked(why)

    def release(self, *, loud: bool) -> None:
        """Give it back (withdraw it while pending); on failure the keepalive timeout does it."""
        self._stop.set()
        if not self.job_id:
            return
        if loud and self.status:
            self.say(f"Relinquishing job allocation {self.job_id}")
        elif loud:
            self.say(f"Job allocation {self.job_id} has been revoked.")
        for attempt in range(3):
            try:
                with Client(self.socket_path) as c:
                    c.call("alloc_release", job_id=self.job_id)
                return
            except RemoteError:
                return
            except (HeadUnavailable, OSError):
                time.sleep(0.5 * (attempt + 1))
        self.say(f"warning: could not reach the head to release job {self.job_id}; "
                 "it ends when its keepalive times out")


def _say(verb: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"{verb}: {message}", file=sys.stderr, flush=True)
    return say


@click.command("salloc", cls=SbatchCommand, context_settings={"allow_interspersed_args": False})
@_table_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[COMMAND [ARGS]...]")
@click.pass_context
def command(ctx: click.Context, command: tuple[str, ...], **params: Any) -> int:
    """Get an allocation, run COMMAND (default: your shell) here while it lasts, then release it.

    Takes sbatch's resource options.  gpuctl srun in COMMAND runs on the allocated nodes.
    """
    spec = allocation_spec(typed_options(ctx, params), "salloc",
                           os.path.basename(command[0]) if command else "interactive")
    for w in ctx.meta.get("gpuctl.unsupported", ()):
        click.echo(f"salloc: warning: {w}", err=True)
    sess = session(ctx)
    client = sess.client
    say = _say("salloc")
    alloc = Allocation(client, client.socket_path, "salloc", say)
    status = alloc.obtain(spec, loud=True)
    if status is None:
        return 1
    say(f"Nodes {status['nodelist']} are ready for job")
    argv = list(command) or [os.environ.get("SHELL") or "/bin/sh"]
    env = {**os.environ, **status.get("env", {}), "GPUD_SOCKET": client.socket_path}
    return run_holding(alloc, argv, env)


def run_holding(alloc: Allocation, argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` in the foreground while keeping ``alloc``; release it after; its status."""
    ignore = lambda signum, frame: None   # noqa: E731 - a Python handler: the child gets SIG_DFL
    old = {s: signal.signal(s, ignore) for s in (signal.SIGINT, signal.SIGQUIT)}
    try:
        try:
            child = subprocess.Popen(argv, env=env)
        except OSError as e:
            alloc.release(loud=True)
            raise CommandFailed(f"cannot run {argv[0]}: {e.strerror or e}") from None

        def hang_up(why: str) -> None:
            try:
                child.send_signal(signal.SIGHUP)
            except OSError:
                pass

        def forward(signum: int, frame: Any) -> None:
            try:
                child.send_signal(signum)
            except OSError:
                pass

        old.update({s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)})
        alloc.on_revoked = hang_up
        alloc.keep_alive()
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:   # only if a handler was replaced under us
                continue
        alloc.release(loud=alloc.revoked is None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc
