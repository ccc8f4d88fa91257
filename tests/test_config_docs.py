"""The example configs, gpud.toml(5) and gpud(8) cover exactly what the code accepts.

A key added to gpud/config.py (or to the scheduler's KNOWN_KEYS) fails these tests until it
is in etc/gpud/gpud.toml and documented in man/gpud.toml.5; a gpud subcommand or option
fails them until gpud(8) describes it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import click
import pytest

from gpud import config
from gpud.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "etc" / "gpud" / "gpud.toml"
MAN = REPO / "man"
DAEMONS = ("head", "worker", "relay", "standalone")

# "#key = value" (no space after the #) is a disabled setting; "# text" is prose.
_DISABLED = re.compile(r"^#(?=[A-Za-z_\"][^=\n]*=)", re.M)


def enabled(text: str) -> str:
    """The example with every disabled setting switched on."""
    return _DISABLED.sub("", text)


def is_section(pattern: str, key: str, known: dict[str, frozenset[str]]) -> bool:
    sub = f"{pattern}.{key}" if pattern else key
    return sub in known or f"{sub}.*" in known or f"{sub}[]" in known


def keys_used(data: dict, known: dict[str, frozenset[str]]) -> set[tuple[str, str]]:
    """(section pattern, key) for every key in parsed TOML, walked as config.known_keys() names them."""
    found: set[tuple[str, str]] = set()

    def walk(table: dict, pattern: str) -> None:
        if pattern not in known:
            if f"{pattern}.*" in known:
                for value in table.values():
                    if isinstance(value, dict):
                        walk(value, f"{pattern}.*")
            return  # free-form: GPU models in [billing.weights]
        for key, value in table.items():
            found.add((pattern, key))
            sub = f"{pattern}.{key}" if pattern else key
            if isinstance(value, dict):
                walk(value, sub)
            elif isinstance(value, list) and f"{sub}[]" in known:
                for item in value:
                    walk(item, f"{sub}[]")

    walk(data, "")
    return found


def all_known() -> set[tuple[str, str]]:
    return {(p, k) for p, keys in config.known_keys().items() for k in keys}


# -- the example ----------------------------------------------------------------------------------

def test_the_example_holds_every_key_and_only_known_keys():
    known = config.known_keys()
    used = keys_used(tomllib.loads(enabled(EXAMPLE.read_text())), known)
    missing = sorted(f"[{p}] {k}" for p, k in all_known() - used)
    assert missing == [], f"keys the code reads but etc/gpud/gpud.toml does not show: {missing}"
    assert used - all_known() == set()


@pytest.mark.parametrize("name", ["gpud.toml", "standalone.toml"])
def test_the_examples_are_valid_with_their_disabled_settings_on(name, tmp_path):
    text = (REPO / "etc" / "gpud" / name).read_text()
    assert config.from_text(text, name).warnings == ()
    assert config.from_text(enabled(text), name).warnings == ()
    assert _DISABLED.search(text), "the example shows no disabled settings"


def test_enabled_leaves_prose_alone():
    assert enabled("# a comment = with an equals sign\n#key = 1\n") == "# a comment = with an equals sign\nkey = 1\n"


# -- gpud.toml(5) ---------------------------------------------------------------------------------

def _roff_text(line: str) -> str:
    return re.sub(r"\\f[BIRP]", "", line.replace("\\-", "-").replace('\\(dq', '"'))


def man_sections(page: str) -> dict[str, list[str]]:
    """``.SH`` title (``SH/SS`` inside a subsection) -> the tag lines after each ``.TP``."""
    lines = (MAN / page).read_text().split("\n")
    out: dict[str, list[str]] = {}
    section = current = ""
    for i, line in enumerate(lines):
        if line.startswith((".SH ", ".SS ")):
            title = _roff_text(line[4:].strip().strip('"'))
            if line.startswith(".SH "):
                section = current = title
            else:
                current = f"{section}/{title}"
            out.setdefault(current, [])
        elif line == ".TP" and i + 1 < len(lines):
            out.setdefault(current, []).append(_roff_text(lines[i + 1]))
    return out


def _pattern(title: str) -> str | None:
    if title == "TOP LEVEL":
        return ""
    m = re.fullmatch(r"\[(\[?)([a-z_.]+?)(\.NAME)?\]?\]", title)
    if not m:
        return None
    return m.group(2) + ("[]" if m.group(1) else "") + (".*" if m.group(3) else "")


def test_gpud_toml_5_documents_every_key_in_its_section():
    known = config.known_keys()
    documented: set[tuple[str, str]] = set()
    for title, tags in man_sections("gpud.toml.5").items():
        pattern = _pattern(title)
        if pattern is None:
            continue
        assert pattern in known, f"gpud.toml(5) has a section {title} the code does not know"
        for tag in tags:
            m = re.match(r"\.BR? (\w+)", tag)
            if m:
                documented.add((pattern, m.group(1)))
    expected = {(p, k) for p, k in all_known() if not (p == "" and is_section(p, k, known))}
    assert sorted(expected - documented) == [], "keys missing from man/gpud.toml.5"
    assert sorted(documented - expected) == [], "keys documented in man/gpud.toml.5 that the code rejects"


# -- gpud(8) --------------------------------------------------------------------------------------

def options_of(command: click.Command) -> set[str]:
    ctx = click.Context(command, info_name=command.name)
    return {o for p in command.get_params(ctx) if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)} - {"--help", "-h"}


def tag_options(tags: list[str]) -> set[str]:
    return {m for tag in tags for m in re.findall(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)", tag.replace('"', " "))}


def test_gpud_8_documents_every_command_and_option():
    sections = man_sections("gpud.8")
    ctx = click.Context(main, info_name="gpud")
    common = tag_options(sections["DAEMON OPTIONS"])
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        key = f"COMMANDS/gpud {name}"
        assert key in sections, f"gpud(8) has no subsection for gpud {name}"
        documented = tag_options(sections[key]) | (common if name in DAEMONS else set())
        accepted = options_of(command)
        assert accepted - documented == set(), f"gpud {name}: options missing from man/gpud.8"
        assert documented - accepted == set(), f"gpud {name}: options in man/gpud.8 it does not take"
    for name in set(DAEMONS) & set(main.list_commands(ctx)):
        assert common <= options_of(main.get_command(ctx, name))
    assert tag_options(sections["OPTIONS"]) == options_of(main) | {"--help", "-h"}
    subsections = {k.split("/", 1)[1] for k in sections if k.startswith("COMMANDS/")}
    assert subsections == {f"gpud {n}" for n in main.list_commands(ctx)}


@pytest.mark.skipif(shutil.which("mandoc") is None, reason="mandoc is not installed")
@pytest.mark.parametrize("page", ["gpud.8", "gpud.toml.5"])
def test_man_pages_are_lint_clean(page):
    r = subprocess.run(["mandoc", "-T", "lint", str(MAN / page)], capture_output=True, text=True)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
