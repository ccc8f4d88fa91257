"""The ``gpuctl`` console script, and ``gpuctl sbatch`` without click.

Theory of operation
-------------------
gpuctl runs from shell loops, cron and SSH; for ``sbatch`` the process start is most of
its run time, and importing click costs more than everything else sbatch needs.  So the
console script (``main``) first looks at its arguments itself:

* ``[--socket PATH] [--config PATH] sbatch ARGS...``, where every ARG is one this module
  reads exactly as click would: options of ``gpuctl.options.OPTIONS`` (``--opt V``,
  ``--opt=V``, ``-xV``, ``-x V``, flags and their negations, ``--wrap``), Slurm options gpud
  ignores (``gpuctl.unsupported``, taken out first as the click command does), ``--``,
  then the script's path and its arguments.  These are parsed here and submitted; click is
  never imported.
* anything else (another verb, ``--help``, ``-M``, an unknown or misspelt option, a flag
  given a value, a value missing, bundled short flags, shell completion, standard streams
  click would re-wrap) goes to the click group (``gpuctl.main``), unchanged.  Nothing has
  been read or written by then, so click prints its own messages.

What happens once the options are known lives here too and the click command calls it
(``typed_settings``, ``prepare``, ``deliver``): both paths read the script, build the spec,
print warnings and answers, and fail with the same words and exit codes by construction.
The fast path only re-creates click's framing of failures: ``sbatch: error: ...`` with a
``--help`` hint and exit 2 for the user's mistakes, exit 1 for the head's refusals.
tests/test_gpuctl_fastpath.py runs a corpus of command lines through both and compares
the request, stdout, stderr and exit code.

Imports: the client, nothing else at start-up; the option table (``gpuctl.options``, with
its ``gpuctl.converters``), ``gpuctl.unsupported`` and the spec builder (``gpuctl.script``)
once the verb is sbatch, so that ``squeue`` and the click verbs do not pay for them; the
directive parser (``gpuctl.directives``) only for a script, not for ``--wrap``.  Neither
path loads ``json`` or ``re`` (with ``enum``, ``functools`` and ``collections`` they cost
more than all the rest in a plain virtual environment): requests and answers go through
``gpud.jsoncodec``, and the installed ``gpuctl`` is the script ``gpuctl/bin/gpuctl``, not
pip's wrapper, which imports ``re``; durations and sizes (``gpud.units``) and directive lines
(``gpuctl.shellwords``) are parsed by hand.  Only ANSI escapes in messages load ``re``, when
there are some.
"""

from __future__ import annotations

import os
import sys
import time

from gpud.protocol import ProtocolError, RemoteError

from .client import Client, HeadUnavailable

TYPE_CHECKING = False   # typing costs gpuctl's start-up; the annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any, Callable

    from .options import Option

    Echo = Callable[..., None]   # click.echo's (message, err=False)

PROG = "gpuctl"
VERB = "sbatch"
WAIT_POLL = (0.1, 2.0)  # --wait polls from every 0.1 s, backing off to every 2 s
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})
_GLOBAL_VALUES = {"--socket": "socket", "--config": "config"}   # gpuctl's options the fast path takes


class Usage(Exception):
    """The user's mistake in the options or the script: ``sbatch: error: ...``, exit 2."""


class Failed(Exception):
    """Not the user's typing (a job vanished while waited for): ``sbatch: error: ...``, exit 1."""


# -- the console script ------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    """``gpuctl``: sbatch through the fast path when it understands the arguments, else click."""
    args = sys.argv[1:] if argv is None else list(argv)
    code = run_sbatch(args)
    if code is None and _plain_environment():   # plain squeue listings skip click too
        from .commands.squeue import fast_main
        code = fast_main(args)
    if code is None:
        from .main import cli

        cli.main(args=args, prog_name=PROG)   # exits
    sys.exit(code)


def run_sbatch(argv: list[str]) -> int | None:
    """Run ``gpuctl ARGV`` here and return its exit status, or None (nothing done) for click."""
    line = parse_command_line(argv)
    if line is None or not _plain_environment():
        return None
    client: Client | None = None
    try:
        try:
            job = prepare(typed_settings(line.values), line.script_path, line.script_args, line.warnings)
        except Usage as e:
            _echo(f"{VERB}: error: {_one_line(str(e))}", err=True)
            _echo(f"Try '{PROG} {VERB} --help' for more information.", err=True)
            return 2
        job.warn(_echo)
        client = Client(line.socket, config_path=line.config)
        return deliver(client, job, _echo)
    except (Failed, RemoteError, HeadUnavailable, ProtocolError) as e:
        _echo(f"{VERB}: error: {_one_line(str(e))}", err=True)
        return 1
    except (KeyboardInterrupt, EOFError):
        _echo("", err=True)   # ends the terminal's ^C line, as click does
        _echo(f"{PROG}: interrupted", err=True)
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 1
    finally:
        if client is not None:
            client.close()


# -- the command line --------------------------------------------------------------------------

class CommandLine:
    """What ``parse_command_line`` read: gpuctl's options, sbatch's typed values, the script."""

    __slots__ = ("socket", "config", "values", "warnings", "script_path", "script_args")

    def __init__(self) -> None:
        self.socket: str | None = None
        self.config: str | None = None
        self.values: dict[str, str | bool] = {}   # option dest -> its last value, as click keeps it
        self.warnings: list[str] = []             # Slurm options gpud ignores
        self.script_path: str | None = None
        self.script_args: list[str] = []


def _tables() -> tuple[dict[str, tuple[Option, bool]], dict[str, Option], set[str]]:
    """From the table as it is now: long names (and negations), short names, value options."""
    from . import options   # here, not at start-up: only sbatch reads the table

    longs: dict[str, tuple[Option, bool]] = {}
    shorts: dict[str, Option] = {}
    for o in options.OPTIONS:
        longs[o.long] = (o, False)
        if o.negation:
            longs[o.negation] = (o, True)
        if o.short:
            shorts[o.short] = o
    values = {name for o in options.OPTIONS if not o.is_flag for name in (o.long, o.short) if name}
    return longs, shorts, values


def parse_command_line(argv: list[str]) -> CommandLine | None:
    """The sbatch command line as click would read it, or None wherever it might not."""
    line = CommandLine()
    i = 0
    while i < len(argv) and argv[i] != VERB:
        name, eq, value = argv[i].partition("=")
        if name not in _GLOBAL_VALUES:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        setattr(line, _GLOBAL_VALUES[name], value)
        i += 1
    if i >= len(argv):
        return None
    longs, shorts, value_options = _tables()
    from . import unsupported   # here, not at start-up, like the table: only sbatch needs it
    from .options import long_option

    # Unsupported Slurm options go first, with the very function the click command uses.
    words, line.warnings = unsupported.split_command_line(argv[i + 1:], value_options, long_option)
    j = 0
    while j < len(words):
        word = words[j]
        if word == "--":
            j += 1
            break
        if word[:1] != "-" or len(word) == 1:
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            entry = longs.get(name)
            if entry is None:
                return None
            option, negated = entry
            if option.is_flag:
                if eq:
                    return None
                line.values[option.dest] = not negated
                j += 1
                continue
            if not eq:
                if j + 1 >= len(words):
                    return None
                j += 1
                value = words[j]
        else:
            option = shorts.get(word[:2])
            if option is None:
                return None
            if option.is_flag:
                if len(word) > 2:       # bundled flags (-QH): click's business
                    return None
                line.values[option.dest] = True
                j += 1
                continue
            if len(word) > 2:
                value = word[2:]
            elif j + 1 < len(words):
                j += 1
                value = words[j]
            else:
                return None
        line.values[option.dest] = value
        j += 1
    if j < len(words):
        line.script_path, line.script_args = words[j], words[j + 1:]
    return line


def _plain_environment() -> bool:
    """Standard streams click would write to as they are, and no shell-completion request."""
    if os.environ.get(f"_{PROG.upper()}_COMPLETE"):
        return False
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if stream is None or not encoding or _is_ascii(encoding):
            return False
    return True


def _is_ascii(encoding: str) -> bool:
    import codecs

    try:
        return codecs.lookup(encoding).name == "ascii"
    except LookupError:
        return True


# -- what sbatch does with its options (shared with the click command) ------------------------

def typed_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Settings from the options the user typed (dest -> value), converted in table order."""
    from . import options
    from .converters import ScriptError

    out: dict[str, Any] = {}
    for opt in options.OPTIONS:
        if opt.dest not in values:
            continue
        try:
            out = options.merge(out, options.convert(opt, values[opt.dest]))
        except ScriptError as e:
            raise Usage(str(e)) from None
    return out


class Prepared:
    """A job ready to send: its spec, the settings that steer sbatch, warnings to print."""

    __slots__ = ("spec", "settings", "warnings")

    def __init__(self, spec: dict[str, Any], settings: dict[str, Any], warnings: list[str]) -> None:
        self.spec, self.settings, self.warnings = spec, settings, warnings

    @property
    def quiet(self) -> bool:
        return bool(self.settings.get("quiet"))

    def warn(self, echo: Echo, messages: list[str] | None = None) -> None:
        if not self.quiet:
            for w in self.warnings if messages is None else messages:
                echo(f"{VERB}: warning: {w}", err=True)


def prepare(cli: dict[str, Any], script_path: str | None, args: list[str], warnings: list[str]) -> Prepared:
    """Read the script (file, stdin or --wrap), apply its directives under ``cli``: the spec.
    ``warnings``: the command line's unsupported options; the directives' are added."""
    from . import script as scripts
    from .converters import ScriptError
    from .options import merge

    warnings = list(warnings)
    wrap = cli.pop("wrap", None)
    if wrap is not None:
        if script_path is not None:
            raise Usage("script arguments are not permitted with --wrap")
        text, source, default_name = scripts.wrap_script(wrap), "--wrap command", "wrap"
    elif script_path is not None:
        text, source, default_name = _read_file(script_path), script_path, os.path.basename(script_path)
    else:
        text, source, default_name = _read_stdin(), "the script on stdin", "sbatch"
    try:
        scripts.check_script(text, source)
        directives = False
        if wrap is None:
            from .directives import parse_directives   # --wrap has none

            directives = parse_directives(text)
            warnings += directives.warnings
        settings = merge(directives.settings if directives else {}, cli)
        if settings.get("strict") and warnings:
            raise ScriptError(f"{warnings[0]} (refused: --strict)")
        spec = scripts.build_spec(text, cli, default_name=default_name, args=list(args), directives=directives)
    except ScriptError as e:
        raise Usage(str(e)) from None
    return Prepared(spec, settings, warnings)


def deliver(client: Any, job: Prepared, echo: Echo, cluster: str = "") -> int:
    """Submit, print the answer Slurm's way; the exit status (--wait: the job's)."""
    spec, settings = job.spec, job.settings
    result = client.submit_request(spec)
    job.warn(echo, list(result.get("warnings") or ()))
    on = f" on cluster {cluster}" if cluster else ""
    if spec.get("test_only"):
        echo(estimate(result) + on, err=True)
        return 0
    job_id = int(result["job_id"])
    ident = f"{job_id};{cluster}" if cluster else str(job_id)   # Slurm's --parsable form
    parsable = settings.get("parsable")
    if result.get("skipped"):
        echo(ident if parsable else
             f"Job {job_id} named {spec['name']!r} is still pending or running{on}; nothing submitted")
        return 0
    echo(ident if parsable else f"Submitted batch job {job_id}{on}")
    if settings.get("wait"):
        return wait_exit_code(client, job_id)
    return 0


def estimate(result: dict[str, Any]) -> str:
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
            raise Failed(f"job {job_id} disappeared while waiting for it")
        if all(j.get("state") in FINISHED for j in jobs):
            return max(job_exit_code(j) for j in jobs)
        sleep(poll)
        poll = min(WAIT_POLL[1], poll * 1.5)


def job_exit_code(job: dict[str, Any]) -> int:
    """0 for COMPLETED; the exit code; 1 for a signal or an end without an exit code."""
    if job.get("state") == "COMPLETED":
        return 0
    code = job.get("exit_code")
    if job.get("signal") or not code:
        return 1
    return int(code)


def _read_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Usage(f"cannot read batch script {path!r}: {e.strerror or e}") from None
    return _decode(data, path)


def _read_stdin() -> str:
    stdin = sys.stdin.buffer
    if stdin.isatty():
        raise Usage("no batch script: give a script file, --wrap CMD, or pipe a script on stdin")
    data = stdin.read()
    if not data.strip():
        raise Usage("the script on stdin is empty")
    return _decode(data, "the script on stdin")


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Usage(f"{source} is not UTF-8 text") from None


# -- output as click.echo writes it ------------------------------------------------------------

_ANSI = r"\033\[[0-?]*[ -/]*[@-~]"   # click strips these when the stream is not a terminal


def _echo(message: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    if "\033" in message and not stream.isatty():
        import re

        message = re.sub(_ANSI, "", message)
    stream.write(message + "\n")
    stream.flush()


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): no complaint when Python flushes at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
