"""``gpuctl sstat -j ID[.STEP]``: a running job's usage so far, with Slurm's field names.

The numbers come from the job's cgroup on its node (gpud.worker.cgroups), as the worker
last sampled them (every ``sample_interval``): the peak memory and CPU time of the whole
job, of its batch script (``ID.batch``) and of each ``gpuctl srun`` step (``ID.N``).  A
step runs one task per node here, so Ave, Min and Max of a step are its own numbers.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .. import columns as cols
from .. import format as fmt
from .common import CommandFailed, session

# sstat --format names (lower case) -> (field, default width)
SSTAT: dict[str, tuple[cols.Field, int]] = {
    "jobid": (cols.Field("JobID", lambda r, now: r["id"]), 14),
    "ntasks": (cols.Field("NTasks", lambda r, now: 1), 8),
    "avecpu": (cols.Field("AveCPU", lambda r, now: fmt.slurm_cpu_time(_cpu(r))), 10),
    "mincpu": (cols.Field("MinCPU", lambda r, now: fmt.slurm_cpu_time(_cpu(r))), 10),
    "totalcpu": (cols.Field("TotalCPU", lambda r, now: fmt.slurm_cpu_time(_cpu(r))), 10),
    "maxrss": (cols.Field("MaxRSS", lambda r, now: fmt.max_rss(r)), 10),
    "averss": (cols.Field("AveRSS", lambda r, now: fmt.max_rss(r)), 10),
    "maxrssnode": (cols.Field("MaxRSSNode", lambda r, now: r.get("node") or ""), 10),
    "maxrsstask": (cols.Field("MaxRSSTask", lambda r, now: 0), 10),
}
SSTAT_DEFAULT = "JobID,NTasks,AveCPU,MaxRSS,MaxRSSNode,AveRSS"


def _cpu(r: dict[str, Any]) -> float | None:
    return None if r.get("cpu_usec") is None else r["cpu_usec"] / 1e6


def step_label(job: Any, step: str) -> str:
    if step == "total":
        return str(job)
    return f"{job}.{step.removeprefix('step_')}"


def rows(result: dict[str, Any], step: str | None) -> list[dict[str, Any]]:
    """One row per sampled step of the ``sstat`` op's answer (only ``step`` when given)."""
    job = result["job"]
    jid = job.get("display_id") or job.get("job_id")
    out = []
    for s in result.get("steps", []):
        name = s["step"]
        short = name.removeprefix("step_")
        if step is not None and short != step:
            continue
        out.append(dict(s, id=step_label(jid, name), node=job.get("node")))
    return out


def parse_format(text: str) -> list[cols.Column]:
    out = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, _, width = item.partition("%")
        entry = SSTAT.get(name.lower())
        if entry is None:
            raise click.UsageError(f"--format: unknown field {name!r}; known: "
                                   + ", ".join(f.header for f, _ in SSTAT.values()))
        if width and not width.isdigit():
            raise click.UsageError(f"--format: bad width in {item!r}")
        field, default = entry
        out.append(cols.Column(field, int(width) if width else default, True))
    if not out:
        raise click.UsageError("--format: no fields")
    return out


@click.command("sstat")
@click.option("-j", "--jobs", "job", metavar="ID[.STEP]", required=True,
              help="The running job (42), or one step of it (42.batch, 42.0).")
@click.option("-o", "--format", "--fields", "format_", metavar="FIELDS",
              help=f"Fields to show (default {SSTAT_DEFAULT}).")
@click.option("-n", "--noheader", is_flag=True, help="No header line.")
@click.option("-p", "--parsable", is_flag=True, help="Fields separated by |, with a trailing |.")
@click.option("-P", "--parsable2", is_flag=True, help="Fields separated by |.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def command(ctx: click.Context, job: str, format_: str | None, noheader: bool, parsable: bool,
            parsable2: bool, as_json: bool) -> None:
    """Show a running job's CPU time and peak memory so far, per step, as Slurm's sstat does."""
    jid, _, step = job.partition(".")
    if not jid.isdigit() or int(jid) <= 0 or (step and not (step == "batch" or step.isdigit())):
        raise click.UsageError(f"invalid job id {job!r}: use ID or ID.STEP, e.g. 42, 42.batch or 42.0")
    layout = parse_format(format_ or SSTAT_DEFAULT)
    result = session(ctx).client.sstat(int(jid))
    found = rows(result, step or None)
    if as_json:
        click.echo(json.dumps({"steps": found}, indent=2, ensure_ascii=False))
        return
    if not found:
        raise CommandFailed(f"no usage sampled yet for job {job} (sampled every few seconds "
                                   "on confined nodes; see gpuctl scontrol show node)")
    out = cols.render_sacct(layout, found, float(result.get("now") or 0), header=not noheader,
                            delimiter="|" if parsable or parsable2 else None, trailing=parsable)
    click.echo(out)
