"""``gpuctl top``: a live view of the cluster's GPUs: how busy each one is and who holds it.

On a terminal the view refreshes every ``--delay`` seconds until ``q`` or Ctrl-C (or ``-n``
refreshes); when stdout is not a terminal (a pipe, cron, a log) it prints the view once as
plain text with ASCII bars.  ``render`` is pure (the head's ``telemetry`` result, the width
and height in, a rich renderable out), so a test can pin its output.  rich is imported only
by this verb: the other verbs start without it.

A view wider than the terminal drops the GPU table's least telling columns first (TEMP,
POWER, MODEL, MEM GB), then shortens the holders and names; the utilization bar goes last.
A view taller than the terminal folds nodes whose GPUs are all free and idle into one line
per run of them (``gpu[05-99]  idle  760 GPUs free``), then shows the GPU rows that fit,
scrolled with the arrow keys, space and ``b``: the queue and the jobs stay on screen.
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


def _holders(g: dict[str, Any], shown: dict[int, str]) -> str:
    ids = [shown.get(j, str(j)) for j in g.get("job_ids") or []]   # array tasks as 11_0, as squeue
    if not ids:
        return "-"
    users = ",".join(dict.fromkeys(g.get("users") or []))
    return ",".join(ids) + (f" ({users})" if users else "")


GPU_COLUMNS = (("NODE", "left"), ("STATE", "left"), ("GPU", "right"), ("MODEL", "left"), ("UTIL", "left"),
               ("MEM GB", "right"), ("POWER", "right"), ("TEMP", "right"), ("JOB (USER)", "left"))
GPU_DROPPED = ("TEMP", "POWER", "MODEL", "MEM GB")          # first to go when the view is too wide
GPU_SHORTENED = ("JOB (USER)", "NODE")                      # then cut, with an ellipsis
JOB_COLUMNS = (("JOBID", "right"), ("USER", "left"), ("ACCOUNT", "left"), ("PARTITION", "left"),
               ("NAME", "left"), ("NODE", "left"), ("GPUS", "right"), ("TIME", "right"),
               ("GPU UTIL", "right"), ("FLAG", "left"))
JOB_DROPPED = ("ACCOUNT", "PARTITION", "NODE", "FLAG")
JOB_SHORTENED = ("NAME", "USER")
_GAP = 2   # between columns


def _idle(n: dict[str, Any]) -> bool:
    """All of the node's GPUs are free and idle (or unsampled): it may be folded."""
    gpus = n.get("gpus") or []
    return bool(gpus) and all(not g.get("job_ids") and (g.get("util") or 0) < 5 and not g.get("slices")
                              for g in gpus)


def gpu_rows(nodes: list[dict[str, Any]], *, ascii_only: bool, shown: dict[int, str],
             fold: bool = False) -> list[list[Any]]:
    """The GPU table's rows, one per GPU and MIG slice; with ``fold``, a run of idle nodes is one row."""
    rows: list[list[Any]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if len(run) > 1:
            free = sum(len(n.get("gpus") or []) for n in run)
            rows.append([fmt.compress_hostlist(str(n["name"]) for n in run), "idle", "", "", Text(""), "", "", "",
                         f"{free} GPUs free"])
        elif run:
            rows.extend(_node_rows(run[0], ascii_only=ascii_only, shown=shown))
        run.clear()

    for n in sorted(nodes, key=lambda n: _natural(str(n.get("name", "")))):
        if fold and _idle(n) and fmt.node_state(n) == "idle":
            run.append(n)
            continue
        flush()
        rows.extend(_node_rows(n, ascii_only=ascii_only, shown=shown))
    flush()
    return rows


def _node_rows(n: dict[str, Any], *, ascii_only: bool, shown: dict[int, str]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for g in n.get("gpus") or []:
        mem = f"{_gb(g.get('mem_used_mb'))}/{_gb(g.get('memory_mb'))}"
        power = "-" if g.get("power_w") is None else f"{g['power_w']:.0f}W"
        temp = "-" if g.get("temp_c") is None else f"{g['temp_c']:.0f}C"
        first = not rows
        rows.append([n["name"] if first else "", fmt.node_state(n) if first else "", str(g.get("index")),
                     str(g.get("model", "?")), bar(g.get("util"), ascii_only=ascii_only), mem, power, temp,
                     _holders(g, shown)])
        for s in g.get("slices") or []:
            rows.append(["", "", "", f"  {str(s.get('uuid'))[:12]}", Text(""), f"{_gb(s.get('mem_used_mb'))}",
                         "", "", ""])
    if not rows:  # a node without GPUs still gets a line
        rows.append([n["name"], fmt.node_state(n), "-", "-", Text(""), "", "", "", ""])
    return rows


def fitted_table(columns: tuple[tuple[str, str], ...], rows: list[list[Any]], width: int | None,
                 dropped: tuple[str, ...], shortened: tuple[str, ...]) -> Table:
    """A table of ``rows`` no wider than ``width``: the ``dropped`` columns go first, in order,
    then the ``shortened`` ones are cut (with an ellipsis); the others keep their width."""
    names = [c for c, _ in columns]
    widths = {c: max([len(c)] + [len(cell.plain if isinstance(cell, Text) else str(cell)) for cell in
                                 (r[i] for r in rows)]) for i, c in enumerate(names)}
    keep = list(names)

    def total() -> int:
        return sum(widths[c] for c in keep) + _GAP * (len(keep) - 1)

    for c in dropped:
        if width is None or total() <= width:
            break
        keep.remove(c)
    limits: dict[str, int] = {}
    for c in shortened:
        excess = 0 if width is None else total() - width
        if excess <= 0:
            break
        limits[c] = max(len(c) if len(c) < 6 else 6, widths[c] - excess)
        widths[c] = limits[c]
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for c, justify in columns:
        if c in keep:
            t.add_column(c, justify=justify, no_wrap=True, overflow="ellipsis", max_width=limits.get(c),
                         min_width=None if c in limits else widths[c])
    for r in rows:
        t.add_row(*(cell for cell, c in zip(r, names) if c in keep))
    return t


def gpu_table(nodes: list[dict[str, Any]], *, ascii_only: bool, width: int | None = None,
              shown: dict[int, str] | None = None) -> Table:
    rows = gpu_rows(nodes, ascii_only=ascii_only, shown=shown or {})
    return fitted_table(GPU_COLUMNS, rows, width, GPU_DROPPED, GPU_SHORTENED)


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


def jobs_table(jobs: list[dict[str, Any]], now: float, width: int | None = None) -> Table:
    rows = []
    for j in jobs:
        util = j.get("gpu_util_mean")
        rows.append([str(j.get("display_id") or j["job_id"]), str(j.get("user")), str(j.get("account")),
                     str(j.get("partition")), str(j.get("name"))[:20], str(j.get("node") or "-"),
                     str(j.get("gpus", 0)), fmt.squeue_time(fmt.elapsed(j, now)),
                     "-" if util is None else f"{util:.0f}%", str(j.get("reason") or "")])
    return fitted_table(JOB_COLUMNS, rows, width, JOB_DROPPED, JOB_SHORTENED)


def render(state: dict[str, Any], *, ascii_only: bool = True, width: int | None = None,
           height: int | None = None, scroll: int = 0) -> Group:
    """The whole view for one ``telemetry`` result, fitted to ``width`` and ``height`` when
    given (see the module docstring); ``scroll``: the first GPU row shown when they do not fit."""
    now = float(state.get("now") or 0)
    nodes = state.get("nodes") or []
    gpus = [g for n in nodes for g in n.get("gpus") or []]
    held = sum(1 for g in gpus if g.get("job_ids"))
    busy = sum(1 for g in gpus if (g.get("util") or 0) >= 5)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    title = Text(f"cluster {state.get('cluster', '?')} at {stamp}: {len(nodes)} nodes, {len(gpus)} GPUs, "
                 f"{held} allocated, {busy} busy", style="bold", no_wrap=True, overflow="ellipsis")
    jobs = state.get("jobs") or []
    shown = {int(j["job_id"]): str(j["display_id"]) for j in jobs if j.get("display_id")}
    if height is not None and len(jobs) > max(1, height // 3):     # the jobs get a third at most
        jobs = jobs[:max(1, height // 3)]
    rows = gpu_rows(nodes, ascii_only=ascii_only, shown=shown)
    note = None
    if height is not None:
        room = max(1, height - 5 - (len(jobs) + 2 if jobs else 0) - 1)   # title, blanks, queue, header, note
        if len(rows) > room:
            rows = gpu_rows(nodes, ascii_only=ascii_only, shown=shown, fold=True)
        if len(rows) > room:
            first = max(0, min(scroll, len(rows) - room))
            note = Text(f"GPU rows {first + 1}-{first + room} of {len(rows)}: arrows, space and b scroll, q quits",
                        style="dim", no_wrap=True, overflow="ellipsis")
            rows = rows[first:first + room]
    parts: list[Any] = [title, Text(""), fitted_table(GPU_COLUMNS, rows, width, GPU_DROPPED, GPU_SHORTENED)]
    if note is not None:
        parts.append(note)
    parts += [Text(""), queue_line(state.get("queue") or {})]
    if jobs:
        parts += [Text(""), jobs_table(jobs, now, width)]
    return Group(*parts)


def plain(state: dict[str, Any], width: int = 120) -> str:
    """The view as plain text, as printed when stdout is not a terminal."""
    console = Console(width=width, record=True, file=_Discard(), color_system=None, force_terminal=False)
    console.print(render(state, ascii_only=True, width=width))
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
    console = Console()
    scroll, note = 0, None

    def view() -> Any:
        size = console.size
        v = render(state, ascii_only=False, width=size.width, height=size.height - (1 if note else 0), scroll=scroll)
        return Group(v, Text(note, style="bold red")) if note else v

    try:
        with Keys() as keys, Live(view(), console=console, auto_refresh=False, screen=False) as live:
            shown = 1
            while iterations is None or shown < iterations:
                due = time.monotonic() + delay
                while (left := due - time.monotonic()) > 0:      # keys until the next refresh
                    key = keys.read(left)
                    if key in ("q", "Q"):
                        return
                    if key in SCROLL:
                        scroll = max(0, scroll + SCROLL[key] * (console.size.height // 2 if key in " b" else 1))
                        live.update(view(), refresh=True)
                try:
                    state, note = client.telemetry(), None
                except (HeadUnavailable, ProtocolError, RemoteError) as e:   # a head restart: keep trying
                    note = f"no answer from the head: {e}; retrying every {delay:g}s"
                live.update(view(), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass


SCROLL = {"\x1b[A": -1, "\x1b[B": 1, "k": -1, "j": 1, " ": 1, "b": -1}   # up, down; space, b: half a page


class Keys:
    """Single keys from a terminal on stdin (cbreak mode while open); none from anything else."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.saved: Any = None

    def __enter__(self) -> "Keys":
        try:
            import termios
            import tty

            if sys.stdin.isatty():
                self.fd = sys.stdin.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (ImportError, OSError, ValueError):   # termios.error is an OSError
            self.fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str | None:
        """The next key (an arrow as its escape sequence), or None after ``timeout`` seconds."""
        if self.fd is None:
            time.sleep(timeout)
            return None
        import os
        import select

        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self.fd, 8)
        return data.decode("utf-8", "replace") if data else None


def _width() -> int:
    import shutil

    return max(80, shutil.get_terminal_size((120, 24)).columns)
