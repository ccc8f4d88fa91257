"""The man pages and the CLI agree: every option is documented, every documented option exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import click
import pytest

from gpuctl.main import VERBS, cli

MAN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "man")
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


def cli_options(command: click.Command) -> set[str]:
    ctx = click.Context(command, info_name=command.name)
    return {o for p in command.get_params(ctx) if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)}


def _unroff(line: str) -> str:
    line = re.sub(r"\\f[BIRP]", "", line.replace("\\-", "-"))
    return line.replace('"', " ")


def page_options(page: str) -> set[str]:
    """Options named in the tags (the line after each .TP) of the page's OPTIONS section."""
    with open(os.path.join(MAN, page)) as f:
        lines = f.read().split("\n")
    start = lines.index(".SH OPTIONS")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(".SH "))
    section = lines[start + 1:end]
    tags = [section[i + 1] for i, line in enumerate(section[:-1]) if line == ".TP"]
    return {m for tag in tags for m in _OPTION.findall(_unroff(tag))}


def commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli, info_name="gpuctl")
    return [("gpuctl.1", cli)] + [(f"gpuctl-{v}.1", cli.get_command(ctx, v)) for v in VERBS]


@pytest.mark.parametrize("page, command", commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_options_and_man_page_agree(page, command):
    in_cli, in_page = cli_options(command), page_options(page)
    assert in_cli - in_page == set(), f"undocumented in man/{page}"
    assert in_page - in_cli == set(), f"documented in man/{page} but not accepted"


def test_every_verb_is_listed_in_the_overview():
    with open(os.path.join(MAN, "gpuctl.1")) as f:
        text = f.read()
    for verb in VERBS:
        assert f".B {verb}\n" in text
        assert f".BR gpuctl\\-{verb} (1)" in text


@pytest.mark.skipif(shutil.which("mandoc") is None, reason="mandoc not installed")
def test_man_pages_lint_clean():
    pages = sorted(p for p in os.listdir(MAN) if p.startswith("gpuctl") and p.endswith(".1"))
    assert len(pages) == 1 + len(VERBS)
    r = subprocess.run(["mandoc", "-T", "lint", "-W", "all", *pages], cwd=MAN, capture_output=True, text=True)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
