"""The layering rules of docs/architecture.md, read off the source with ``ast``.

* the scheduling core (gpud/sched) imports only itself, the model and the pure helpers: no
  daemon, bus or GPU backend, no I/O, clock or asyncio module;
* nothing imports gpud.head or gpud.worker except the two modules that wire daemons together
  (gpud/cli.py and gpud/standalone.py), and the head and the worker do not import each other;
* gpuctl imports no daemon module (it starts on every call, and may run where no daemon is);
* the bus (and with it the wire contract, the package gpud/bus/messages/) imports only itself and the
  shared data and notations: never a daemon, the core or a GPU backend;
* the daemons send message objects (gpud.bus.messages): no ``publish`` call and no last will
  spells out a kind and a body by hand;
* SQL is written only in the store (gpud/head/store*.py, gpud/head/schema.py).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE_MAY_IMPORT = ("gpud.sched", "gpud.model", "gpud.gpu.mig", "gpud.units", "gpud.syntax", "gpud.hostlist")
CORE_STDLIB_REFUSED = {"asyncio", "aiosqlite", "aiomqtt", "pynvml", "time", "subprocess", "socket", "os",
                       "threading", "selectors", "signal", "sqlite3", "random", "datetime"}
WIRING = {"gpud/cli.py", "gpud/standalone.py"}
BUS_MAY_IMPORT = ("gpud.bus", "gpud.model", "gpud.protocol", "gpud.syntax", "gpud.units", "gpud.hostlist",
                  "gpud.keys")
SQL = re.compile(r"\b(SELECT\s.+\sFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
                 r"CREATE\s+(TABLE|INDEX)|ALTER\s+TABLE)\b", re.S)


def modules(*dirs: str) -> list[pathlib.Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def imported(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute (function-local ones too)."""
    package = rel(path)[:-3].replace("/", ".").split(".")
    package = package[:-1]      # a module's package; an __init__'s is its own directory
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package[:len(package) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # "from ..gpu import mig" imports gpud.gpu.mig; "from ..units import f", gpud.units.f
            out.update(f"{base}.{a.name}" if a.name != "*" else base for a in node.names)
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", modules("gpud/sched"), ids=rel)
def test_the_core_imports_nothing_but_itself_and_pure_helpers(path):
    bad = sorted(n for n in imported(path) if n.startswith("gpud.") and not any(under(n, ok) for ok in CORE_MAY_IMPORT))
    bad += sorted(n for n in imported(path) if n.split(".")[0] in CORE_STDLIB_REFUSED)
    assert not bad, f"{rel(path)} imports {bad}: the core is a pure function of snapshot and now"


@pytest.mark.parametrize("path", [p for p in modules("gpud", "gpuctl") if rel(p) not in WIRING], ids=rel)
def test_only_the_wiring_imports_the_daemons(path):
    me = rel(path)
    names = imported(path)
    for daemon in ("gpud.head", "gpud.worker"):
        if me.startswith(daemon.replace(".", "/") + "/"):
            continue
        bad = sorted(n for n in names if under(n, daemon))
        assert not bad, f"{me} imports {bad}: only {', '.join(sorted(WIRING))} may"


@pytest.mark.parametrize("path", modules("gpuctl"), ids=rel)
def test_gpuctl_imports_no_daemon_or_adapter(path):
    refused = ("gpud.head", "gpud.worker", "gpud.bus", "gpud.sim", "aiosqlite", "aiomqtt", "pynvml", "asyncio")
    bad = sorted(n for n in imported(path) if any(under(n, r) for r in refused))
    assert not bad, f"{rel(path)} imports {bad}"


@pytest.mark.parametrize("path", modules("gpud/bus"), ids=rel)
def test_the_bus_imports_no_daemon_core_or_backend(path):
    bad = sorted(n for n in imported(path) if n.startswith("gpud.") and not any(under(n, ok) for ok in BUS_MAY_IMPORT))
    assert not bad, f"{rel(path)} imports {bad}: the bus and its messages sit below the daemons"


def hand_made_messages(path: pathlib.Path) -> list[int]:
    """Lines of ``publish``/``_publish`` calls given anything but (topic, message object), and
    of last wills built from a kind and a body instead of ``Will.of``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("publish", "_publish"):
            if len(node.args) != 2 or any(k.arg not in ("retain",) for k in node.keywords) or \
                    isinstance(node.args[1], (ast.Constant, ast.Dict, ast.JoinedStr)):
                bad.append(node.lineno)
        elif name == "Will":
            bad.append(node.lineno)
    return bad


DAEMONS = [p for p in modules("gpud") if rel(p).startswith(("gpud/head/", "gpud/worker/"))
           or rel(p) in WIRING | {"gpud/relay.py"}]


@pytest.mark.parametrize("path", DAEMONS, ids=rel)
def test_daemons_send_message_objects_not_hand_made_bodies(path):
    bad = hand_made_messages(path)
    assert not bad, (f"{rel(path)} publishes a hand-made body at lines {bad}: build a gpud.bus.messages "
                     "class (Will.of for a last will)")


@pytest.mark.parametrize("path", modules("gpud", "gpuctl"), ids=rel)
def test_sql_is_written_only_in_the_store(path):
    me = rel(path)
    if re.fullmatch(r"gpud/head/(store\w*|schema)\.py", me):
        return
    tree = ast.parse(path.read_text(), me)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings and SQL.search(n.value)]
    assert not found, f"{me} writes SQL at lines {found}: give the store a verb for it (gpud/head/store*.py)"


def test_the_rules_see_what_they_check():
    """A rule that reads nothing would pass anything."""
    assert "gpud.sched.placement.Cluster" in imported(ROOT / "gpud/sched/core.py") or \
        any(under(n, "gpud.sched") for n in imported(ROOT / "gpud/sched/core.py"))
    assert any(under(n, "gpud.head") for n in imported(ROOT / "gpud/cli.py"))
    assert SQL.search("SELECT job_id FROM jobs") and not SQL.search("select a partition from the list")
    senders = [ROOT / f"gpud/head/{m}.py" for m in ("daemon", "commands", "liveness")]
    calls = [n for p in senders for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "publish"]
    assert len(calls) >= 5 and not any(hand_made_messages(p) for p in senders)
    sample = ROOT / "tests/test_worker_daemon.py"   # tests publish raw bodies on purpose
    assert hand_made_messages(sample)
