"""``gpuctl report``: GPU-hours, billing, cost and utilization by account, user, partition
or GPU type, over a window (default: this month so far).

The head computes the numbers (gpud/head/reports.py explains them); this verb parses the
window, and prints a table, CSV (for spreadsheets and billing scripts) or JSON.
"""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

import click

from .. import format as fmt
from .common import session
from .sacct import parse_start_time

clock = time.time  # replaceable in tests
GROUPINGS = ("account", "user", "partition", "gpu-type")
COLUMNS = ("gpu_hours", "billed", "cost", "util_mean", "idle_gpu_hours", "jobs")
HEADERS = ("GPU-HOURS", "BILLED", "COST", "UTIL%", "IDLE-GPU-HOURS", "JOBS")


def month_start(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))


def _cells(row: dict[str, Any]) -> list[str]:
    util = row.get("util_mean")
    return [f"{row['gpu_hours']:.2f}", f"{row['billed']:.2f}", f"{row['cost']:.2f}",
            "-" if util is None else f"{util:.1f}", f"{row['idle_gpu_hours']:.2f}", str(row["jobs"])]


def report_table(result: dict[str, Any], *, header: bool = True) -> str:
    by = str(result.get("by", "account"))
    rows = [[r["key"], *_cells(r)] for r in result.get("rows", [])]
    if rows:
        rows.append(["TOTAL", *_cells(result["total"])])
    out = fmt.table((by.upper(), *HEADERS), rows, right=range(1, 7), header=header)
    if not header:
        return out
    window = f"{_stamp(result['since'])} - {_stamp(result['until'])}"
    title = f"GPU usage {window}, by {by}"
    return f"{title}\n{out}" if out else f"{title}\n(no GPUs were allocated in this window)"


def report_csv(result: dict[str, Any], *, header: bool = True) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow([result.get("by", "account"), *COLUMNS])
    for r in [*result.get("rows", []), result["total"]]:
        w.writerow([r["key"], *("" if r[c] is None else r[c] for c in COLUMNS)])
    return buf.getvalue().rstrip("\n")


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


@click.command("report")
@click.option("-S", "--since", metavar="TIME", help="Start of the window (default: the 1st of this month).")
@click.option("-E", "--until", metavar="TIME", help="End of the window (default: now).")
@click.option("--by", "by", type=click.Choice(GROUPINGS), default="account", show_default=True,
              help="Group rows by account, user, partition or GPU type.")
@click.option("--csv", "as_csv", is_flag=True, help="Comma-separated values, one row per group and a TOTAL.")
@click.option("--json", "as_json", is_flag=True, help="The head's numbers as JSON.")
@click.option("-n", "--noheader", is_flag=True, help="Leave out the title and header lines.")
@click.pass_context
def command(ctx: click.Context, since: str | None, until: str | None, by: str, as_csv: bool, as_json: bool,
            noheader: bool) -> None:
    """Report GPU-hours, billed units, cost, utilization and idle GPU-hours."""
    if as_csv and as_json:
        raise click.UsageError("choose one of --csv and --json")
    now = clock()
    try:
        start = parse_start_time(since, now) if since else month_start(now)
        end = parse_start_time(until, now) if until else now
    except ValueError as e:
        raise click.UsageError(str(e).replace("start time", "time"), ctx) from None
    if start >= end:
        raise click.UsageError("the window is empty: --since must be earlier than --until", ctx)
    result = session(ctx).client.report(since=start, until=end, by=by)
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    elif as_csv:
        click.echo(report_csv(result, header=not noheader))
    else:
        out = report_table(result, header=not noheader)
        if out:
            click.echo(out)
