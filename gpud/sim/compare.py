"""``gpud simulate --compare``: the same trace under each policy, one table.

Rows are the report's headline measures; columns the policies in ``POLICIES`` order
(``fifo``, ``priority``, ``full``).  Per-account GPU shares and waits follow, the biggest
accounts first (at most ``MAX_ACCOUNT_ROWS``; ``--json`` has them all).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .report import dur, num, pct

__all__ = ["format_compare", "MAX_ACCOUNT_ROWS"]

MAX_ACCOUNT_ROWS = 12


def _hours(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


# (label, getter, formatter)
ROWS: list[tuple[str, Callable[[dict], Any], Callable[[Any], str]]] = [
    ("GPU allocation while jobs waited", lambda r: r["gpu_allocation"], pct),
    ("GPU utilization overall", lambda r: r["utilization"], pct),
    ("jobs started", lambda r: r["jobs"]["started"], lambda v: f"{v:,}"),
    ("jobs pending at end", lambda r: r["jobs"]["pending"], lambda v: f"{v:,}"),
    ("wait mean", lambda r: r["wait_s"]["mean"], dur),
    ("wait p50", lambda r: r["wait_s"]["p50"], dur),
    ("wait p95", lambda r: r["wait_s"]["p95"], dur),
    ("completion time mean", lambda r: r["jct_s"]["mean"], dur),
    ("bounded slowdown mean", lambda r: r["bounded_slowdown"]["mean"], num),
    ("bounded slowdown p95", lambda r: r["bounded_slowdown"]["p95"], num),
    ("preemptions", lambda r: r["preemptions"], lambda v: f"{v:,}"),
    ("GPU-hours lost to preemption", lambda r: r["preempted_gpu_hours"], _hours),
    ("idle GPU-hours, job waiting (Resources)", lambda r: r["fragmentation"]["idle_gpu_hours"], _hours),
    ("  of which scattered over nodes", lambda r: r["fragmentation"]["scattered_gpu_hours"], _hours),
    ("fragmentation index while jobs waited", lambda r: r["fragmentation"]["index"], lambda v: num(v, ".3f")),
    ("  free GPUs stranded (mean)", lambda r: r["fragmentation"]["stranded_gpus"], lambda v: num(v, ".1f")),
    ("Jain's index (share / fair share)", lambda r: r["fairness"]["jain"], lambda v: num(v, ".3f")),
    ("makespan", lambda r: r["makespan_s"], dur),
    ("scheduler passes", lambda r: r["scheduler_passes"], lambda v: f"{v:,}"),
]


def _gangs(jobs: dict[str, Any]) -> str:
    if not jobs.get("multi_node"):
        return ""
    return f"; multi-node {jobs['multi_node']}, rounded up {jobs.get('rounded_up', 0)}"


# (label, getter, formatter) for each QOS, shown when jobs ran in more than one
QOS_ROWS: list[tuple[str, Callable[[dict], Any], Callable[[Any], str]]] = [
    ("jobs started", lambda q: q["jobs_started"], lambda v: f"{v:,}"),
    ("jobs pending at end", lambda q: q["jobs_pending"], lambda v: f"{v:,}"),
    ("wait mean", lambda q: q["wait_s"]["mean"], dur),
    ("wait p50", lambda q: q["wait_s"]["p50"], dur),
    ("wait p95", lambda q: q["wait_s"]["p95"], dur),
    ("GPUs held (mean)", lambda q: q["mean_gpus"], lambda v: num(v, ",.1f")),
    ("GPU allocation while these waited", lambda q: q["gpu_allocation"], pct),
    ("times preempted", lambda q: q["preempted"], lambda v: f"{v:,}"),
    ("GPU-hours lost to preemption", lambda q: q["preempted_gpu_hours"], _hours),
]


def _per_qos(reports: dict[str, dict[str, Any]], width: int, col: int) -> list[str]:
    names = list(dict.fromkeys(q for r in reports.values() for q in r.get("qos", {})))
    if len(names) < 2:
        return []
    out: list[str] = []
    for qos in names:
        out += ["", f"QOS {qos}"]
        for label, get, fmt in QOS_ROWS:
            cells = _cells(reports.values(), lambda r: get(r["qos"][qos]), fmt)
            out.append(f"{'  ' + label:<{width}}" + "".join(f"{c:>{col}}" for c in cells))
    return out


def _cells(reports: Iterable[dict[str, Any]], get: Callable[[dict], Any],
           fmt: Callable[[Any], str]) -> list[str]:
    """One cell per report: ``get``'s value through ``fmt``, or "-" where the report lacks it."""
    cells = []
    for r in reports:
        try:
            v = get(r)
        except (KeyError, TypeError):
            v = None
        cells.append("-" if v is None else fmt(v))
    return cells


def format_compare(reports: dict[str, dict[str, Any]]) -> str:
    """The reports of several policies (name -> report) side by side."""
    names = list(reports)
    first = reports[names[0]]
    cl, tr, jobs = first["cluster"], first["trace"], first["jobs"]
    infeasible = ", ".join(f"{k} {v}" for k, v in jobs["infeasible"].items()) or "none"
    width = 40
    col = max(12, *(len(n) + 2 for n in names))
    bg = first.get("background")
    background = (f"; background {bg['accepted']} jobs of {bg['rows']} rows in QOS {bg['qos']}"
                  if bg else "")
    head = [f"Cluster {cl['nodes']} nodes, {cl['gpus']} GPUs; trace {tr.get('accepted', 0)} jobs "
            f"accepted of {tr.get('rows', 0)} rows{background}, {jobs['submitted']} submitted "
            f"(refused: {infeasible}{_gangs(jobs)}); simulated {dur(first['simulated_s'])}",
            "",
            f"{'':<{width}}" + "".join(f"{n:>{col}}" for n in names)]
    for label, get, fmt in ROWS:
        cells = _cells(reports.values(), get, fmt)
        head.append(f"{label:<{width}}" + "".join(f"{c:>{col}}" for c in cells))
    head += _per_qos(reports, width, col)
    sizes = list(dict.fromkeys(s for r in reports.values() for s in r["by_size"]))
    if sizes:
        head += ["", f"{'mean wait by job size (GPUs)':<{width}}"]
        for s in sizes:
            cells = [dur(r["by_size"].get(s, {}).get("wait_s", {}).get("mean")) for r in reports.values()]
            head.append(f"{'  ' + s:<{width}}" + "".join(f"{c:>{col}}" for c in cells))
    accts = sorted(first["accounts"].items(), key=lambda kv: (-kv[1]["gpu_seconds"], kv[0]))
    if accts:
        head += ["", f"{'share of GPU-time (configured, fair)':<{width}}"]
        for name, a in accts[:MAX_ACCOUNT_ROWS]:
            label = f"  {name[:20]} ({pct(a['configured_share'])}, {pct(a['fair_share'])})"
            cells = [pct(r["accounts"].get(name, {}).get("share")) for r in reports.values()]
            head.append(f"{label:<{width}}" + "".join(f"{c:>{col}}" for c in cells))
        head += ["", f"{'mean wait by account':<{width}}"]
        for name, _ in accts[:MAX_ACCOUNT_ROWS]:
            cells = [dur(r["accounts"].get(name, {}).get("mean_wait_s")) for r in reports.values()]
            head.append(f"{'  ' + name[:36]:<{width}}" + "".join(f"{c:>{col}}" for c in cells))
        if len(accts) > MAX_ACCOUNT_ROWS:
            head.append(f"  ({len(accts) - MAX_ACCOUNT_ROWS} smaller accounts: see --json)")
    return "\n".join(head)
