"""``gpuctl top``: a live view of the cluster's GPUs: how busy each one is and who holds it.

On a terminal the view refreshes every ``--delay`` seconds until Ctrl-C (or ``-n``
refreshes); when stdout is not a terminal (a pipe, cron, a log) it prints the view once as
plain text with ASCII bars.  ``render`` is pure (the head's ``telemetry`` result and the
width in, a rich renderable out), so a test can pin its output.  rich is imported only by
this verb: the other verbs start without it.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpud.protocol import ProtocolError, RemoteError

from .. import format as fmt
from ..client import HeadUnavailable
from .common import session

BAR_WIDTH = 10
BUSY_STYLES = ((75.0, "green"), (25.0, "yellow"), (0.0, "red"))   # utilization >= x: style
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _natural(name: str) -> tuple:
    m = _NUMBERED.match(name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def bar(util: float | None, *, ascii_only: bool) -> Text:
    """``[#####.....]  50%`` in ASCII, or coloured blocks on a terminal."""
    if util is None:
        return Text(" " * (BAR_WIDTH + 2) + "   -")
    filled = int(round(max(0.0, min(100.0, util)) * BAR_WIDTH / 100))
    full, empty = ("#", ".") if ascii_only else ("\u2588", "\u00b7")
    style = next(s for limit, s in BUSY_STYLES if util >= limit)
    text = Text("[" if ascii_only else " ")
    text.append(full * filled, style=style)
    text.append(empty * (BAR_WIDTH - filled), style="dim")
    text.append(("]" if ascii_only else " ") + f"{util:4.0f}%")
    return text


def _gb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.1f}"


def _holders(g: dict[str, Any]) -> str:
    ids = [str(j) for j in g.get("job_ids") or []]
    if not ids:
        return "-"
    users = ",".join(dict.fromkeys(g.get("users") or []))
    return ",".join(ids) + (f" ({users})" if users else "")


def gpu_table(nodes: list[dict[str, Any]], *, ascii_only: bool) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name, justify in (("NODE", "left"), ("STATE", "left"), ("GPU", "right"), ("MODEL", "left"),
                          ("UTIL", "left"), ("MEM GB", "right"), ("POWER", "right"), ("TEMP", "right"),
                          ("JOB (USER)", "left")):
        t.add_column(name, justify=justify, no_wrap=True)
    for n in sorted(nodes, key=lambda n: _natural(str(n.get("name", "")))):
        first = True
        for g in n.get("gpus") or []:
            mem = f"{_gb(g.get('mem_used_mb'))}/{_gb(g.get('memory_mb'))}"
            power = "-" if g.get("power_w") is None else f"{g['power_w']:.0f}W"
            temp = "-" if g.get("temp_c") is None else f"{g['temp_c']:.0f}C"
            t.add_row(n["name"] if first else "", fmt.node_state(n) if first else "", str(g.get("index")),
                      str(g.get("model", "?")), bar(g.get("util"), ascii_only=ascii_only), mem, power, temp,
                      _holders(g))
            for s in g.get("slices") or []:
                t.add_row("", "", "", f"  {str(s.get('uuid'))[:12]}", Text(""),
                          f"{_gb(s.get('mem_used_mb'))}", "", "", "")
            first = False
        if first:  # a node without GPUs still gets a line
            t.add_row(n["name"], fmt.node_state(n), "-", "-", Text(""), "", "", "", "")
    return t


def queue_line(queue: dict[str, dict[str, int]]) -> Text:
    if not queue:
        return Text("Queue: empty")
    parts = []
    for part in sorted(queue):
        q = queue[part]
        running = q.get("running", 0) + q.get("completing", 0)
        parts.append(f"{part}: {running} running, {q.get('pending', 0)} pending"
                     + (f" ({q['pending_gpus']} GPUs wanted)" if q.get("pending_gpus") else ""))
    return Text("Queue: " + "; ".join(parts))


def jobs_table(jobs: list[dict[str, Any]], now: float) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name, justify in (("JOBID", "right"), ("USER", "left"), ("ACCOUNT", "left"), ("PARTITION", "left"),
                          ("NAME", "left"), ("NODE", "left"), ("GPUS", "right"), ("TIME", "right"),
                          ("GPU UTIL", "right"), ("FLAG", "left")):
        t.add_column(name, justify=justify, no_wrap=True)
    for j in jobs:
        util = j.get("gpu_util_mean")
        t.add_row(str(j["job_id"]), str(j.get("user")), str(j.get("account")), str(j.get("partition")),
                  str(j.get("name"))[:20], str(j.get("node") or "-"), str(j.get("gpus", 0)),
                  fmt.squeue_time(fmt.elapsed(j, now)), "-" if util is None else f"{util:.0f}%",
                  str(j.get("reason") or ""))
    return t


def render(state: dict[str, Any], *, ascii_only: bool = True) -> Group:
    """The whole view for one ``telemetry`` result."""
    now = float(state.get("now") or 0)
    nodes = state.get("nodes") or []
    gpus = [g for n in nodes for g in n.get("gpus") or []]
    held = sum(1 for g in gpus if g.get("job_ids"))
    busy = sum(1 for g in gpus if (g.get("util") or 0) >= 5)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    title = Text(f"cluster {state.get('cluster', '?')} at {stamp}: {len(nodes)} nodes, {len(gpus)} GPUs, "
                 f"{held} allocated, {busy} busy", style="bold", no_wrap=True, overflow="ellipsis")
    parts: list[Any] = [title, Text(""), gpu_table(nodes, ascii_only=ascii_only), Text(""),
                        queue_line(state.get("queue") or {})]
    jobs = state.get("jobs") or []
    if jobs:
        parts += [Text(""), jobs_table(jobs, now)]
    return Group(*parts)


def plain(state: dict[str, Any], width: int = 120) -> str:
    """The view as plain text, as printed when stdout is not a terminal."""
    console = Console(width=width, record=True, file=_Discard(), color_system=None, force_terminal=False)
    console.print(render(state, ascii_only=True))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


class _Discard:
    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


@click.command("top")
@click.option("-d", "--delay", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              metavar="SECONDS", help="Seconds between refreshes.")
@click.option("-n", "--iterations", type=click.IntRange(min=1), metavar="N",
              help="Stop after N refreshes (default: until Ctrl-C).")
@click.option("--once", is_flag=True, help="Print the view once and exit (the default without a terminal).")
@click.pass_context
def command(ctx: click.Context, delay: float, iterations: int | None, once: bool) -> None:
    """Show nodes and GPUs live: utilization, memory, power, who holds each GPU, the queue."""
    client = session(ctx).client
    if once or not sys.stdout.isatty():
        click.echo(plain(client.telemetry(), width=_width()))
        return
    state = client.telemetry()   # the first answer must come, or top fails like any verb
    shown = 0
    try:
        with Live(render(state, ascii_only=False), console=Console(), auto_refresh=False, screen=False) as live:
            shown = 1
            while iterations is None or shown < iterations:
                time.sleep(delay)
                try:
                    state, note = client.telemetry(), None
                except (HeadUnavailable, ProtocolError, RemoteError) as e:   # a head restart: keep trying
                    note = f"no answer from the head: {e}; retrying every {delay:g}s"
                view = render(state, ascii_only=False)
                live.update(Group(view, Text(note, style="bold red")) if note else view, refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass


def _width() -> int:
    import shutil

    return max(80, shutil.get_terminal_size((120, 24)).columns)
