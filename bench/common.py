"""Helpers the benchmark scripts share: the machine's description, a head to measure, and
the sections of docs/benchmarks.md they fill.

A script that owns a section writes it with ``write_section(name, markdown)``: the text
between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in docs/benchmarks.md is
replaced (the pair is appended at the end the first time).  Nothing outside the markers is
touched, so hand-written sections stay as they are.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "benchmarks.md"


def machine() -> str:
    """One line: CPU model and count, memory, kernel, Python; and the load right now."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")))
        mem = f", {kb / 2 ** 20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} vCPU {model}{mem}, Linux {platform.release()}, "
            f"CPython {platform.python_version()}; load average {load:.1f} at the start")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds (every thread) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stamp() -> str:
    return f"Machine: {machine()}. Measured {datetime.date.today().isoformat()}."


def write_section(name: str, markdown: str, doc: Path = DOC) -> None:
    """Replace the ``name`` section of docs/benchmarks.md with ``markdown``."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


@contextlib.contextmanager
def head_cluster(extra_toml: str = "") -> Iterator:
    """A real head (own process) on a real Mosquitto, in a temporary directory; no workers."""
    from tests.cluster import Cluster
    from tests.mqtt_broker import start_mosquitto

    with tempfile.TemporaryDirectory() as d:
        broker = start_mosquitto(Path(d) / "mqtt")
        try:
            with Cluster(Path(d) / "c", broker.url, extra_toml=extra_toml) as c:
                c.start_head()
                yield c
        finally:
            broker.stop()


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
