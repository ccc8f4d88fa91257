"""Tables and JSON for gpuctl's listing verbs, in Slurm's shapes.

Every function here is pure: records and ``now`` in, text out, so the tests can pin a
clock.  Tables size their columns to the data (no fixed widths that cut job ids), pad
with single spaces like squeue, and leave no trailing blanks.

squeue's fast path imports this module on every call: ``json``, ``re`` and ``gpud.units``
(which imports ``re``) are imported by the functions that need them, not here.
"""

from __future__ import annotations

TYPE_CHECKING = False   # typing costs gpuctl's start-up; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any, Iterable, Sequence

STATE_CODES = {
    "PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F",
    "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR",
    "OUT_OF_MEMORY": "OOM",
}
# Reasons a running job can carry, shown after its node (the head flags idle GPUs).
RUNNING_FLAGS = frozenset({"GpuIdle"})
NODE_STATE_SHORT = {
    "IDLE": "idle", "MIXED": "mix", "ALLOCATED": "alloc", "DRAIN": "drain", "DOWN": "down",
    "UNKNOWN": "unk",
}


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Iterable[int] = (),
          header: bool = True) -> str:
    """Columns padded to their widest cell; indices in ``right`` are right-aligned.
    Padded a column at a time (squeue prints 10,000 rows in a loop's time)."""
    cells = [list(map(str, row)) for row in rows]
    if header:
        cells.insert(0, list(headers))
    if not cells:
        return ""
    right = set(right)
    last = len(headers) - 1
    columns = []
    for i, column in enumerate(zip(*cells)):
        width = max(map(len, column))
        if i in right:
            columns.append([c.rjust(width) for c in column])
        elif i == last:
            columns.append(column)
        else:
            columns.append([c.ljust(width) for c in column])
    return "\n".join([" ".join(line).rstrip() for line in zip(*columns)])


def to_json(key: str, records: list[dict[str, Any]]) -> str:
    import json

    return json.dumps({key: records}, indent=2, ensure_ascii=False)


def elapsed(job: dict[str, Any], now: float) -> float:
    start = job.get("start_time")
    if start is None:
        return 0.0
    end = job.get("end_time")
    return max(0.0, (end if end is not None else now) - start)


def squeue_time(seconds: float) -> str:
    """squeue's TIME: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``."""
    total = max(0, int(seconds))
    d, rem = divmod(total, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def _clip(text: Any, width: int) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= width else s[: width - 1] + "+"


def _user(job: dict[str, Any]) -> str:
    user = job.get("user")
    return str(user) if user else str(job.get("uid", "?"))


def squeue_table(jobs: list[dict[str, Any]], now: float, *, header: bool = True) -> str:
    """gpud's own squeue table; a job shows as its ``display_id`` (an array task as
    ``123_4``) when it has one."""
    rows = []
    append, codes, flags = rows.append, STATE_CODES, RUNNING_FLAGS
    for j in jobs:       # _clip and _user inline: one pass per line of a long queue
        get = j.get
        state, node, reason = str(get("state", "?")), get("node"), get("reason")
        if state == "PENDING" or not node:
            where = f"({reason or 'None'})"
        else:
            where = str(get("nodelist") or node)
            if reason in flags:
                where += f" ({reason})"
        name, user = get("name"), get("user")
        name = "" if name is None else str(name)
        user = str(user) if user else str(get("uid", "?"))
        append((get("display_id") or get("job_id", "?"), get("partition") or "-",
                name if len(name) <= 24 else name[:23] + "+", user if len(user) <= 16 else user[:15] + "+",
                codes.get(state, state),
                "0:00" if get("start_time") is None else squeue_time(elapsed(j, now)), get("gpus", 0), where))
    return table(("JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "GPUS", "NODELIST(REASON)"),
                 rows, right=(0, 5, 6), header=header)


def squeue_order(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Running jobs first by id, then pending ones by priority (highest first), then id."""
    def key(j: dict[str, Any]) -> tuple:
        pending = j.get("state") == "PENDING"
        prio = -(j.get("priority") or 0) if pending else 0
        return (pending, prio, j.get("job_id") or 0)
    return sorted(jobs, key=key)


def exit_code(job: dict[str, Any]) -> str:
    """Slurm's ``code:signal``."""
    return f"{job.get('exit_code') or 0}:{job.get('signal') or 0}"


def slurm_size(value: int | None, unit: str = "K") -> str:
    """sacct's sizes (convert_num_unit with CONVERT_NUM_UNIT_EXACT, its default): ``value``
    in ``unit``, moved to a larger unit only while it divides evenly (``5056K``, ``300M``,
    ``1G``); empty for None."""
    if value is None:
        return ""
    units = "KMGTP"
    i = units.index(unit)
    value = int(value)
    while value and value % 1024 == 0 and i < len(units) - 1:
        value //= 1024
        i += 1
    return f"{value}{units[i]}"


def max_rss(job: dict[str, Any]) -> str:
    """sacct's MaxRSS from the job's peak memory in bytes (``0`` where it was not measured)."""
    rss = job.get("max_rss")
    return slurm_size(int(rss) // 1024) if isinstance(rss, (int, float)) else ""


def slurm_cpu_time(seconds: float | None) -> str:
    """Slurm's TotalCPU: ``MM:SS.mmm`` under an hour, ``HH:MM:SS`` and ``D-HH:MM:SS`` above."""
    if seconds is None:
        return ""
    whole, ms = int(seconds), int(round((seconds - int(seconds)) * 1000))
    if ms == 1000:
        whole, ms = whole + 1, 0
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{minutes:02d}:{secs:02d}.{ms:03d}"


def cpu_time(job: dict[str, Any], now: float) -> float:
    """Slurm's CPUTime: the allocated CPUs times the elapsed time."""
    return (job.get("cpus") or 0) * elapsed(job, now) if job.get("start_time") else 0.0


def job_order(job: dict[str, Any]) -> tuple[int, int, int]:
    """Jobs in id order, an array's tasks after its id by task (1, 2, 10, 11_0, 11_1, 11_10),
    whether job_id holds the number or the shown id (``11_0``)."""
    own = str(job.get("job_id") or 0).split("_")[0]
    own_id = int(own) if own.isdigit() else 0
    task = job.get("array_task_id")
    return (int(job.get("array_job_id") or own_id), -1 if task is None else int(task), own_id)


def alloc_gpus(job: dict[str, Any]) -> int:
    if int(job.get("nodes") or 1) > 1 and job.get("start_time") is not None:
        return int(job.get("gpus") or 0)      # the job's over all its nodes, not rank 0's
    indices = job.get("gpu_indices") or job.get("gpu_ids") or []
    if indices:
        return len(indices)
    return int(job.get("gpus") or 0) if job.get("start_time") is not None else 0


def gpu_util(job: dict[str, Any]) -> str:
    """GPU efficiency: the job's mean GPU utilization, blank until it has been sampled."""
    mean = job.get("gpu_util_mean")
    return "" if mean is None else f"{mean:.1f}%"


def sacct_table(jobs: list[dict[str, Any]], now: float, *, header: bool = True) -> str:
    from gpud.units import format_duration

    rows = []
    for j in sorted(jobs, key=job_order):
        rows.append((j.get("job_id", "?"), _clip(j.get("name"), 24), _clip(_user(j), 16),
                     j.get("account") or "-", j.get("state", "?"), exit_code(j),
                     format_duration(elapsed(j, now)), j.get("node") or "None assigned",
                     alloc_gpus(j), gpu_util(j)))
    return table(("JobID", "JobName", "User", "Account", "State", "ExitCode", "Elapsed", "NodeList",
                  "AllocGPUS", "GPUUtil"), rows, right=(0, 5, 6, 8, 9), header=header)


def _models(node: dict[str, Any]) -> str:
    models = sorted({str(g.get("model")) for g in node.get("gpus") or [] if g.get("model")})
    return ",".join(models) or "-"


def node_state(node: dict[str, Any]) -> str:
    state = str(node.get("state", "UNKNOWN"))
    if state == "DRAIN" and draining(node):
        return "drng"
    return NODE_STATE_SHORT.get(state, state.lower())


def draining(node: dict[str, Any]) -> bool:
    """A draining node still runs jobs (Slurm's drng); a drained one runs none (drain)."""
    return bool(node.get("gpus_alloc") or node.get("cpus_alloc"))


def node_state_long(node: dict[str, Any]) -> str:
    """Slurm's long state name (sinfo %T): drained and draining apart."""
    state = str(node.get("state", "UNKNOWN"))
    if state == "DRAIN":
        return "draining" if draining(node) else "drained"
    return state.lower()


def sinfo_nodes_table(nodes: list[dict[str, Any]], *, header: bool = True) -> str:
    """``sinfo -N``: one line per node."""
    from gpud.units import format_size_mb

    rows = []
    for n in sorted(nodes, key=lambda n: _natural(str(n.get("name", "")))):
        rows.append((n.get("name", "?"), node_state(n),
                     f"{n.get('gpus_alloc', 0)}/{n.get('gpus_total', len(n.get('gpus') or []))}",
                     f"{n.get('cpus_alloc', 0)}/{n.get('cpus', 0)}",
                     format_size_mb(n.get("mem_mb")), _models(n)))
    return table(("NODELIST", "STATE", "GPUS(A/T)", "CPUS(A/T)", "MEMORY", "GPU_MODEL"), rows,
                 right=(2, 3, 4), header=header)


def sinfo_summary_table(nodes: list[dict[str, Any]], *, header: bool = True) -> str:
    """Plain ``sinfo``: nodes grouped by state and GPU model."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n in nodes:
        groups.setdefault((node_state(n), _models(n)), []).append(n)
    rows = []
    for (state, models), members in sorted(groups.items()):
        alloc = sum(int(n.get("gpus_alloc") or 0) for n in members)
        total = sum(int(n.get("gpus_total") or len(n.get("gpus") or [])) for n in members)
        rows.append((state, len(members), f"{alloc}/{total}", models,
                     compress_hostlist(str(n.get("name", "?")) for n in members)))
    return table(("STATE", "NODES", "GPUS(A/T)", "GPU_MODEL", "NODELIST"), rows, right=(1, 2),
                 header=header)


# How each sharing mode reads in ``sinfo -G``: the caveats belong next to the mode.
GPU_MODE_TEXT = {
    "whole": "whole",
    "mig": "mig",
    "mps": "mps (a fatal fault in one job ends all)",
    "timeslice": "timeslice (no memory isolation)",
}


def _holders(holders: Iterable[dict[str, Any]]) -> str:
    return ",".join(f"{h.get('display_id') or h.get('job_id')}({h.get('user')})" for h in holders) or "-"


def sinfo_gpus_table(nodes: list[dict[str, Any]], *, header: bool = True) -> str:
    """``sinfo -G``: one line per GPU (mode, use, jobs), then one per MIG slice."""
    from gpud.units import format_size_mb

    rows: list[tuple[Any, ...]] = []
    for n in sorted(nodes, key=lambda n: _natural(str(n.get("name", "")))):
        name = n.get("name", "?")
        for g in sorted(n.get("gpus") or [], key=lambda g: g.get("index", 0)):
            mode = str(g.get("mode") or "whole")
            holders = g.get("holders")
            if holders is None:      # a head without sharing: job ids only
                holders = [{"job_id": j, "user": "?"} for j in g.get("job_ids") or []]
            text = GPU_MODE_TEXT.get(mode, mode)
            slices = g.get("slices") or []
            if mode == "mig":
                text += " dynamic" if g.get("dynamic") else " fixed"
                used = f"{sum(1 for s in slices if s.get('job_id') is not None)}/{len(slices)} slices"
            elif mode == "mps":
                mem = sum(int(h.get("mem_mb") or 0) for h in holders)
                used = (f"{len(holders)}/{g.get('mps_max_clients', 48)} "
                        f"{format_size_mb(mem)}/{format_size_mb(g.get('memory_mb'))}")
                if g.get("mps_thread_percentage"):
                    text += f", {g['mps_thread_percentage']}% SMs each"
            elif mode == "timeslice":
                used = f"{len(holders)}/{g.get('replicas', 1)}"
            else:
                used = f"{min(1, len(holders))}/1"
            rows.append((name, g.get("index", "?"), g.get("model", "?"), text, used, _holders(holders)))
            for sl in sorted(slices, key=lambda s: s.get("start", 0)):
                job = sl.get("job_id")
                rows.append((name, f"{g.get('index', '?')}:{sl.get('profile')}@{sl.get('start')}",
                             format_size_mb(sl.get("memory_mb")), sl.get("uuid", ""),
                             "1/1" if job is not None else "0/1",
                             f"{sl.get('display_id') or job}({sl.get('user')})" if job is not None else "-"))
    return table(("NODELIST", "GPU", "MODEL", "MODE", "USED", "JOBS"), rows, header=header)


def _natural(name: str) -> tuple:
    import re

    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def compress_hostlist(names: Iterable[str]) -> str:
    """``gpu01,gpu02,gpu03,gpu07`` -> ``gpu[01-03,07]``; names a hostlist cannot hold are listed."""
    from gpud.hostlist import compress

    names = sorted(set(names), key=_natural)
    try:
        return compress(names)
    except ValueError:
        return ",".join(names)
