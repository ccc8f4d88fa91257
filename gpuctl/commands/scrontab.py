"""``gpuctl scrontab``: recurring batch jobs, in Slurm's scrontab format.

    gpuctl scrontab FILE     install FILE ('-': standard input) as my crontab
    gpuctl scrontab -l       print it          gpuctl scrontab -r   remove it
    gpuctl scrontab -e       edit it with $VISUAL or $EDITOR (needs a terminal)

Each entry is five crontab time fields (or ``@daily`` and friends) and a command; ``#SCRON``
lines before it carry sbatch options for it.  Here each entry becomes a job spec, exactly
as sbatch would build it, and the head checks everything again before it replaces the
user's entries (gpud/head/cron.py).  Jobs run in the home directory (or ``#SCRON -D``)
with a cron-like environment: HOME, USER, LOGNAME, SHELL and a standard PATH, plus what
``#SCRON --export`` adds.

Never prompts without a terminal: from cron or a pipe, ``-e`` is refused.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any

import click

from .. import script as scripts
from ..converters import ScriptError
from ..directives import parse_directives
from ..options import merge
from .common import CommandFailed, session

CRON_PATH = "/usr/local/bin:/usr/bin:/bin"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@click.command("scrontab")
@click.option("-l", "list_", is_flag=True, help="Print my crontab.")
@click.option("-e", "edit", is_flag=True, help="Edit my crontab with $VISUAL or $EDITOR.")
@click.option("-r", "remove", is_flag=True, help="Remove my crontab (its entries stop firing).")
@click.option("-u", "user", metavar="USER", help="Another user's crontab (root and admins only).")
@click.argument("path", metavar="[FILE]", required=False)
@click.pass_context
def command(ctx: click.Context, list_: bool, edit: bool, remove: bool, user: str | None, path: str | None) -> None:
    """Install, list, edit or remove recurring jobs (Slurm's scrontab)."""
    if sum([list_, edit, remove, path is not None]) != 1:
        raise click.UsageError("give exactly one of FILE, -l, -e or -r", ctx)
    client = session(ctx).client
    if list_:
        text = client.scrontab_get(user)["text"]
        if not text:
            raise CommandFailed(f"no crontab for {user or _me()}")
        click.echo(text, nl=not text.endswith("\n"))
        return
    if remove:
        client.scrontab_set("", [], user)
        return
    if edit:
        _edit(ctx, client, user)
        return
    text = _read(ctx, path)
    _install(ctx, client, text, user)


def _me() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _read(ctx: click.Context, path: str | None) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(str(path), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise click.UsageError(f"cannot read crontab {path!r}: {getattr(e, 'strerror', None) or e}", ctx) from None


def entries_for(text: str, *, home: str, user: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(entries for the head, warnings) from a crontab's text; ScriptError for a bad line."""
    from gpud.syntax import SyntaxProblem, parse_crontab

    try:
        parsed = parse_crontab(text)
    except SyntaxProblem as e:
        raise ScriptError(str(e)) from None
    env = {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash", "PATH": CRON_PATH}
    out, warnings = [], []
    for entry in parsed:
        settings: dict[str, Any] = {}
        for line in entry.options:
            try:
                found = parse_directives(f"#!/bin/bash\n#SBATCH {line}\ntrue\n")
            except ScriptError as e:
                raise ScriptError(f"#SCRON before line {entry.line}: {_unprefixed(str(e))}") from None
            settings = merge(settings, found.settings)
            warnings += [f"line {entry.line}: {_unprefixed(w)}" for w in found.warnings]
        spec = scripts.build_spec(scripts.wrap_script(entry.command), settings, default_name=_name(entry.command),
                                  directives=False, env=env, cwd=home)
        out.append({"line": entry.line, "schedule": entry.schedule.text, "spec": spec})
    return out, warnings


def _unprefixed(message: str) -> str:
    """A directive message without the ``line 2: #SBATCH`` of the one-line script it came from."""
    return re.sub(r"^line \d+: (#SBATCH )?", "", message)


def _name(command: str) -> str:
    try:
        first = shlex.split(command)[0]
    except (ValueError, IndexError):
        first = command.split()[0] if command.split() else "cron"
    name = "".join(c if c in _NAME_CHARS else "_" for c in os.path.basename(first))
    return name[:64] or "cron"


def _install(ctx: click.Context, client: Any, text: str, user: str | None) -> None:
    name = user or _me()
    try:
        home = pwd.getpwnam(name).pw_dir
    except KeyError:
        home = os.path.expanduser("~")
    try:
        entries, warnings = entries_for(text, home=home, user=name)
    except ScriptError as e:
        raise click.UsageError(str(e), ctx) from None
    for w in warnings:
        click.echo(f"scrontab: warning: {w}", err=True)
    client.scrontab_set(text, entries, user)


def _edit(ctx: click.Context, client: Any, user: str | None) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise click.UsageError("scrontab -e needs a terminal; install a file with 'gpuctl scrontab FILE'", ctx)
    text = client.scrontab_get(user)["text"] or "# min hour day month weekday command\n"
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w", suffix=".scrontab", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        while True:
            if subprocess.call(shlex.split(editor) + [path]) != 0:
                raise CommandFailed(f"{editor} failed; crontab not changed")
            with open(path, encoding="utf-8") as f:
                new = f.read()
            if new == text:
                click.echo("scrontab: no changes made to crontab", err=True)
                return
            try:
                _install(ctx, client, new, user)
                return
            except click.UsageError as e:
                click.echo(f"scrontab: error: {e.format_message()}", err=True)
                if not click.confirm("Edit again?", default=True):
                    raise CommandFailed("crontab not changed") from None
    finally:
        os.unlink(path)
