"""``gpuctl seff JOBID``: one job's efficiency, as Slurm's seff prints it, with its GPUs.

GPU efficiency is the job's mean GPU utilization over the GPU-time that was sampled (the
head's telemetry, every few seconds), shown against the GPU-walltime it was allocated;
idle GPU-time is sampled GPU-time under 5 % utilization.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gpud.units import format_duration

from .common import job_refs, session

IDLE_UTIL = 5  # percent, as the head counts idle GPU-time


def group_name(gid: Any) -> str:
    try:
        import grp

        return grp.getgrgid(int(gid)).gr_name
    except (KeyError, TypeError, ValueError, OverflowError):
        return str(gid)


def gigabytes(mb: float) -> str:
    return f"{mb / 1024:.2f} GB"


def seff_text(r: dict[str, Any]) -> str:
    """seff's report for one ``seff`` op result."""
    j = r["job"]
    state = str(j.get("state", "?"))
    lines = [f"Job ID: {j.get('job_id')}", f"Cluster: {r.get('cluster', '?')}",
             f"User/Group: {j.get('user')}/{group_name(j.get('gid'))}"]
    if state in ("RUNNING", "PENDING", "COMPLETING"):
        lines.append(f"State: {state}")
    else:
        lines.append(f"State: {state} (exit code {j.get('exit_code') or 0})")
    cores = j.get("cpus", 1)
    lines.append(f"Cores: {cores}")
    start, end = j.get("start_time"), j.get("end_time")
    wall = 0.0 if start is None else max(0.0, (end if end is not None else float(r.get("now") or start)) - start)
    lines += _cpu_lines(j, int(cores or 1) * wall)
    lines.append(f"Job Wall-clock time: {format_duration(wall)}")
    lines += _memory_lines(j)
    nodes = int(j.get("nodes") or 1)
    gpus = int(j.get("gpus") or 0) if nodes > 1 else len(j.get("gpu_indices") or []) or int(j.get("gpus") or 0)
    shared = sorted({str(d.get("kind")) for d in j.get("devices") or [] if d.get("kind") not in (None, "gpu")})
    where = f" on {j.get('nodelist') or j['node']}" if j.get("node") else ""
    model = r.get("gpu_model")
    if not gpus:
        lines.append("GPUs: none requested")
    elif shared:
        lines.append(f"GPUs: {_shared_text(j, shared[0])}" + (f" of {'an' if model and model[0] in 'AEIOU' else 'a'} "
                                                             f"{model}" if model else "") + where)
        lines += _shared_gpu_lines(r, shared[0])
    else:
        lines.append(f"GPUs: {gpus}" + (f" x {model}" if model else "") + where)
        lines += _gpu_lines(r, j)
    if state in ("RUNNING", "COMPLETING"):
        lines.append("WARNING: Efficiency statistics may be misleading for RUNNING jobs.")
    return "\n".join(lines)


def _cpu_lines(j: dict[str, Any], core_walltime: float) -> list[str]:
    """Slurm's: the job's CPU time (from its cgroup) against its cores times its wall time."""
    used = j.get("total_cpu")
    if not isinstance(used, (int, float)):
        return ["CPU Efficiency: not measured (the job's node does not confine jobs in cgroups)"]
    eff = 100.0 * used / core_walltime if core_walltime > 0 else 0.0
    return [f"CPU Utilized: {format_duration(used)}",
            f"CPU Efficiency: {eff:.2f}% of {format_duration(core_walltime)} core-walltime"]


def memory_text(mb: float) -> str:
    """seff's sizes: MB below a GB, GB above."""
    return f"{mb:.2f} MB" if mb < 1024 else gigabytes(mb)


def _memory_lines(j: dict[str, Any]) -> list[str]:
    """Slurm's: the job's peak memory (its cgroup's) against what it asked for."""
    asked = j.get("mem_mb") or 0
    rss = j.get("max_rss")
    if not isinstance(rss, (int, float)):
        return [f"Memory Efficiency: not measured ({gigabytes(asked)} requested)"]
    used = rss / (1 << 20)
    out = [f"Memory Utilized: {memory_text(used)}"]
    if asked:
        out.append(f"Memory Efficiency: {100.0 * used / asked:.2f}% of {gigabytes(asked)}")
    else:
        out.append("Memory Efficiency: no memory limit requested")
    return out


def _shared_text(j: dict[str, Any], kind: str) -> str:
    n = len([d for d in j.get("devices") or [] if d.get("kind") == kind]) or int(j.get("gpus") or 1)
    if kind == "mig":
        return f"{n} x MIG {j.get('mig_profile') or 'slice'} slice" + ("s" if n > 1 else "")
    if kind == "mps":
        mem = j.get("gpu_mem_mb")
        return f"{n} MPS share" + ("s" if n > 1 else "") + (f" ({gigabytes(mem)})" if mem else "")
    return f"{n} time-slice replica" + ("s" if n > 1 else "")


def _shared_gpu_lines(r: dict[str, Any], kind: str) -> list[str]:
    """What can be said of a slice or share: NVML reports utilization for a whole GPU (none
    for a GPU in MIG mode), so the samples are not this job's alone."""
    held = float(r.get("gpus_held") or 0)
    out = [f"GPU-walltime: {format_duration(r.get('alloc_gpu_s') or 0)}"
           + (f" ({held:.4g} of a GPU, as billed)" if held else "")]
    if kind == "mig":
        out.append("GPU Efficiency: not measured: NVML reports no utilization for MIG slices")
    else:
        out.append(f"GPU Efficiency: not measured: NVML measures the whole GPU, which this "
                   f"{'MPS share' if kind == 'mps' else 'replica'} shares with other jobs")
    out.append("GPU Memory Utilized: not measured per job on a shared GPU")
    return out


def _gpu_lines(r: dict[str, Any], j: dict[str, Any]) -> list[str]:
    walltime = format_duration(r.get("alloc_gpu_s") or 0)
    gpu_s = float(r.get("gpu_s") or 0)
    if gpu_s <= 0:
        return [f"GPU Efficiency: not sampled (0 of {walltime} GPU-walltime); telemetry may be off "
                "or the job ran for less than one sample interval"]
    mean = 100.0 * float(r.get("util_gpu_s") or 0) / gpu_s
    idle = float(r.get("idle_gpu_s") or 0)
    # samples are counted a whole interval each, so they may run past the allocation's end:
    # the time shown is never more than the GPU-walltime (the shares stay those of the samples)
    shown = min(gpu_s, float(r.get("alloc_gpu_s") or 0) or gpu_s)
    out = [f"GPU Utilized: {format_duration(shown * min(1.0, float(r.get('util_gpu_s') or 0) / gpu_s))} of "
           f"{format_duration(shown)} sampled "
           f"GPU-time (mean {mean:.2f}%, max {float(j.get('gpu_util_max') or 0):.2f}%)",
           f"GPU Efficiency: {mean:.2f}% of {walltime} GPU-walltime",
           f"GPU Idle: {format_duration(shown * min(1.0, idle / gpu_s))} of sampled GPU-time under {IDLE_UTIL}% "
           f"({100.0 * idle / gpu_s:.2f}%)"]
    peak = j.get("gpu_mem_max_mb")
    if peak is not None:
        size = r.get("gpu_memory_mb")
        share = f" ({100.0 * peak / size:.2f}% of {gigabytes(size)})" if size else ""
        out.append(f"GPU Memory Utilized: {gigabytes(peak)} at most on one GPU{share}")
    energy = j.get("energy_j")
    if energy is not None:
        out.append(f"GPU Energy: {energy / 3.6e6:.3f} kWh")
    return out


@click.command("seff")
@click.argument("job", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="Print the head's numbers as JSON.")
@click.pass_context
def command(ctx: click.Context, job: str, as_json: bool) -> None:
    """Summarize one job's CPU, memory and GPU efficiency, as Slurm's seff does."""
    refs = job_refs((job,), "JOBID")
    if len(refs) != 1:
        raise click.UsageError("give exactly one job id, e.g. gpuctl seff 42 or 42_7 for an array task")
    client = session(ctx).client
    ref = refs[0]
    if isinstance(ref, str):          # an array task, 11_1: seff's report is of that task's own job
        from .common import CommandFailed
        from .squeue import select_refs

        array_id = int(ref.split("_")[0])
        found = select_refs(client.jobs(job_ids=[array_id], all=True), [ref])
        if not found:
            raise CommandFailed(f"Job {ref} not found")
        ref = int(found[0]["job_id"])
    result = client.seff(ref)
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        click.echo(seff_text(result))
