"""Slurm's output-format languages: ``squeue -o/-O``, ``sacct --format`` and ``sinfo -o``.

Theory of operation
-------------------
Each verb has a table of fields: a header, how to get the text from a record, and whether
it is right-aligned.  squeue and sinfo name fields by letter in a ``%``-format (``%.18i
%.9P %8j %R``: a dot right-aligns, a number pads and cuts to that width, other text is
copied), or by name in ``--Format`` (``jobid:10,name:.20``); sacct names them in
``--format`` (``JobID,JobName%30``).  ``parse_*`` turns a format into columns once, with a
usage error naming an unknown field; ``render`` lays records out with them.

Values come from the JOB, NODE and PARTITION records of ``gpud.protocol``; times are shown
as Slurm does (``2026-01-31T08:00:00``, ``N/A``; durations ``[D-]HH:MM:SS``).  Everything
here is pure: records and ``now`` in, text out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from gpud.syntax import format_indices, format_time
from gpud.units import format_duration, format_size_mb

from . import format as fmt

Getter = Callable[[dict[str, Any], float], Any]


class FormatError(ValueError):
    """An unknown field or a malformed format; the message names it."""


@dataclass(frozen=True)
class Field:
    header: str
    get: Getter
    right: bool = False


@dataclass(frozen=True)
class Column:
    field: Field | None      # None: literal text
    width: int | None = None
    right: bool = False
    text: str = ""


# -- values ---------------------------------------------------------------------------------

def _time(key: str) -> Getter:
    return lambda r, now: format_time(r.get(key))


def _start(r: dict[str, Any], now: float) -> str:
    if r.get("start_time") is not None:
        return format_time(r["start_time"])
    return format_time(r.get("expected_start"))


def _limit(r: dict[str, Any], now: float) -> str:
    limit = r.get("time_limit")
    return "UNLIMITED" if limit is None else fmt.squeue_time(limit)


def _left(r: dict[str, Any], now: float) -> str:
    limit = r.get("time_limit")
    if limit is None:
        return "UNLIMITED"
    return fmt.squeue_time(max(0.0, limit - fmt.elapsed(r, now)))


def _sacct_limit(r: dict[str, Any], now: float) -> str:
    return format_duration(r.get("time_limit"))


def _reason_or_nodes(r: dict[str, Any], now: float) -> str:
    if r.get("state") == "PENDING" or not r.get("node"):
        return f"({r.get('reason') or 'None'})"
    return str(r.get("nodelist") or r["node"])


def job_id(r: dict[str, Any]) -> str:
    return str(r.get("display_id") or r.get("job_id", "?"))


def tres(r: dict[str, Any]) -> str:
    gpus = int(r.get("gpus") or 0)
    if r.get("mig_profile"):            # MIG slices, typed as Slurm types MIG gres
        return f"gres/gpu:{r['mig_profile']}:{gpus}"
    return f"gres/gpu:{gpus}" if gpus else "N/A"


def alloc_tres(r: dict[str, Any]) -> str:
    parts = [f"cpu={r.get('cpus') or 1}", f"mem={format_size_mb(r.get('mem_mb'))}", "node=1"]
    gpus = fmt.alloc_gpus(r) if r.get("start_time") is not None else 0
    if gpus:
        parts.append(f"gres/gpu={gpus}")
    return ",".join(parts) if r.get("start_time") is not None else ""


def req_tres(r: dict[str, Any]) -> str:
    parts = [f"cpu={r.get('cpus') or 1}", f"mem={format_size_mb(r.get('mem_mb'))}", "node=1"]
    if r.get("gpus"):
        parts.append(f"gres/gpu={r['gpus']}")
    return ",".join(parts)


def _g(key: str, default: Any = "") -> Getter:
    return lambda r, now: default if r.get(key) is None else r.get(key)


SQUEUE: dict[str, Field] = {
    "A": Field("JOBID", lambda r, now: r.get("job_id"), True),
    "a": Field("ACCOUNT", _g("account")),
    "b": Field("TRES_PER_NODE", lambda r, now: tres(r)),
    "C": Field("CPUS", _g("cpus", 1), True),
    "D": Field("NODES", lambda r, now: r.get("nodes") or 1, True),
    "E": Field("DEPENDENCY", lambda r, now: r.get("dependency") or "(null)"),
    "e": Field("END_TIME", _time("end_time")),
    "F": Field("ARRAY_JOB_ID", lambda r, now: r.get("array_job_id") or r.get("job_id"), True),
    "G": Field("GPUS", _g("gpus", 0), True),
    "i": Field("JOBID", lambda r, now: job_id(r), True),
    "j": Field("NAME", _g("name")),
    "K": Field("ARRAY_TASK_ID", lambda r, now: "N/A" if r.get("array_task_id") is None else r["array_task_id"], True),
    "k": Field("COMMENT", lambda r, now: r.get("comment") or "(null)"),
    "L": Field("TIME_LEFT", _left, True),
    "l": Field("TIME_LIMIT", _limit, True),
    "M": Field("TIME", lambda r, now: fmt.squeue_time(fmt.elapsed(r, now)), True),
    "m": Field("MIN_MEMORY", lambda r, now: format_size_mb(r.get("mem_mb")), True),
    "N": Field("NODELIST", lambda r, now: r.get("nodelist") or r.get("node") or ""),
    "P": Field("PARTITION", _g("partition")),
    "p": Field("PRIORITY", lambda r, now: f"{float(r.get('priority') or 0):.10f}", True),
    "Q": Field("PRIORITY", lambda r, now: int(r.get("priority") or 0), True),
    "q": Field("QOS", _g("qos")),
    "R": Field("NODELIST(REASON)", _reason_or_nodes),
    "r": Field("REASON", lambda r, now: r.get("reason") or "None"),
    "S": Field("START_TIME", _start),
    "T": Field("STATE", _g("state")),
    "t": Field("ST", lambda r, now: fmt.STATE_CODES.get(str(r.get("state")), r.get("state"))),
    "U": Field("UID", _g("uid"), True),
    "u": Field("USER", lambda r, now: r.get("user") or r.get("uid")),
    "V": Field("SUBMIT_TIME", _time("submit_time")),
    "y": Field("NICE", _g("nice", 0), True),
    "Z": Field("WORK_DIR", _g("work_dir")),
}
# --Format names (lower case) -> %-letters
SQUEUE_NAMES = {
    "jobid": "i", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "name": "j", "username": "u",
    "userid": "U", "account": "a", "partition": "P", "qos": "q", "state": "T", "statecompact": "t",
    "timeused": "M", "timelimit": "l", "timeleft": "L", "numnodes": "D", "numcpus": "C",
    "tres-per-node": "b", "minmemory": "m", "nodelist": "N", "reasonlist": "R", "reason": "r",
    "starttime": "S", "submittime": "V", "endtime": "e", "priority": "p", "prioritylong": "Q", "nice": "y",
    "dependency": "E", "workdir": "Z", "comment": "k", "gpus": "G",
}
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
SQUEUE_LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
SQUEUE_START = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R"

# sacct --format names (lower case) -> (field, default width)
SACCT: dict[str, tuple[Field, int]] = {
    "jobid": (Field("JobID", lambda r, now: job_id(r)), 12),
    "jobidraw": (Field("JobIDRaw", _g("job_id")), 12),
    "jobname": (Field("JobName", _g("name")), 10),
    "user": (Field("User", lambda r, now: r.get("user") or r.get("uid")), 9),
    "uid": (Field("UID", _g("uid")), 6),
    "account": (Field("Account", _g("account")), 10),
    "partition": (Field("Partition", _g("partition")), 10),
    "qos": (Field("QOS", _g("qos")), 10),
    "state": (Field("State", _g("state")), 10),
    "exitcode": (Field("ExitCode", lambda r, now: fmt.exit_code(r)), 8),
    "elapsed": (Field("Elapsed", lambda r, now: format_duration(fmt.elapsed(r, now))), 10),
    "elapsedraw": (Field("ElapsedRaw", lambda r, now: int(fmt.elapsed(r, now))), 10),
    "start": (Field("Start", lambda r, now: format_time(r.get("start_time")) if r.get("start_time")
                    else "Unknown"), 19),
    "end": (Field("End", lambda r, now: format_time(r.get("end_time")) if r.get("end_time") else "Unknown"), 19),
    "submit": (Field("Submit", _time("submit_time")), 19),
    "eligible": (Field("Eligible", lambda r, now: format_time(r.get("begin_time") or r.get("submit_time"))), 19),
    "nodelist": (Field("NodeList", lambda r, now: r.get("nodelist") or r.get("node") or "None assigned"), 15),
    "nnodes": (Field("NNodes", lambda r, now: (r.get("nodes") or 1) if r.get("node") else 0), 8),
    "alloccpus": (Field("AllocCPUS", lambda r, now: r.get("cpus") if r.get("start_time") else 0), 10),
    "reqcpus": (Field("ReqCPUS", _g("cpus", 1)), 8),
    "allocgpus": (Field("AllocGPUS", lambda r, now: fmt.alloc_gpus(r)), 9),
    "reqgpus": (Field("ReqGPUS", _g("gpus", 0)), 8),
    "alloctres": (Field("AllocTRES", lambda r, now: alloc_tres(r)), 10),
    "reqtres": (Field("ReqTRES", lambda r, now: req_tres(r)), 10),
    "reqmem": (Field("ReqMem", lambda r, now: format_size_mb(r.get("mem_mb"))), 10),
    "maxrss": (Field("MaxRSS", lambda r, now: fmt.max_rss(r)), 10),
    "totalcpu": (Field("TotalCPU", lambda r, now: fmt.slurm_cpu_time(r.get("total_cpu"))), 10),
    "cputime": (Field("CPUTime", lambda r, now: format_duration(fmt.cpu_time(r, now))), 10),
    "cputimeraw": (Field("CPUTimeRAW", lambda r, now: int(fmt.cpu_time(r, now))), 10),
    "timelimit": (Field("Timelimit", _sacct_limit), 10),
    "timelimitraw": (Field("TimelimitRaw", lambda r, now: "UNLIMITED" if r.get("time_limit") is None
                           else int(r["time_limit"] // 60)), 12),
    "priority": (Field("Priority", lambda r, now: int(r.get("priority") or 0)), 10),
    "workdir": (Field("WorkDir", _g("work_dir")), 20),
    "comment": (Field("Comment", _g("comment")), 15),
    "reason": (Field("Reason", lambda r, now: r.get("reason") or "None"), 20),
    "nodes": (Field("NodeList", lambda r, now: r.get("nodelist") or r.get("node") or "None assigned"), 15),
    "gpuutil": (Field("GPUUtil", lambda r, now: fmt.gpu_util(r) if hasattr(fmt, "gpu_util") else ""), 8),
    "dependency": (Field("Dependency", _g("dependency")), 20),
    "restarts": (Field("Restarts", _g("requeue_count", 0)), 8),
}
SACCT_DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
SACCT_LONG = ("JobID,JobIDRaw,JobName,Partition,User,Account,QOS,State,ExitCode,Submit,Start,End,Elapsed,"
              "AllocCPUS,AllocGPUS,ReqMem,Timelimit,NodeList,WorkDir")
SACCT_BRIEF = "JobID,State,ExitCode"

# sinfo: fields over one row of nodes (a group, or one node with -N)
SINFO: dict[str, Field] = {
    "a": Field("AVAIL", lambda g, now: g.get("avail", "up")),
    "C": Field("CPUS(A/I/O/T)", lambda g, now: f"{g['cpus_alloc']}/{g['cpus_idle']}/0/{g['cpus']}"),
    "c": Field("CPUS", lambda g, now: g["cpus_per_node"]),
    "D": Field("NODES", lambda g, now: g["count"], True),
    "E": Field("REASON", lambda g, now: g.get("reason") or "none"),
    "G": Field("GRES", lambda g, now: g["gres"]),
    "l": Field("TIMELIMIT", lambda g, now: g.get("timelimit", "infinite"), True),
    "m": Field("MEMORY", lambda g, now: g["mem_per_node"], True),
    "N": Field("NODELIST", lambda g, now: g["nodelist"]),
    "n": Field("HOSTNAMES", lambda g, now: g["nodelist"]),
    "P": Field("PARTITION", lambda g, now: g.get("partition", "")),
    "R": Field("PARTITION", lambda g, now: g.get("partition_name", "")),
    "T": Field("STATE", lambda g, now: g["state_long"]),
    "t": Field("STATE", lambda g, now: g["state"]),
    "u": Field("USER", lambda g, now: g.get("reason_user") or "Unknown"),
    "H": Field("TIMESTAMP", lambda g, now: format_time(g["reason_time"]) if g.get("reason_time") else "Unknown"),
}
SINFO_AGGREGATE = frozenset("DNnC")   # letters summed or listed over a group, not grouped on
SINFO_DEFAULT = "%9P %.5a %.10l %.6D %.6t %N"
SINFO_NODES = "%N %.6D %9P %6t"
SINFO_LONG = "%9P %.5a %.10l %.6D %.11T %N"                 # sinfo -l
SINFO_NODES_LONG = "%N %.6D %9P %.11T %.4c %.8m %20E"       # sinfo -N -l
SINFO_REASONS = "%20E %9u %19H %N"                          # sinfo -R


# -- parsing ----------------------------------------------------------------------------------

_PERCENT = re.compile(r"%(\.?)(-?)(\d*)([A-Za-z])")


def parse_percent(text: str, fields: dict[str, Field], option: str) -> list[Column]:
    """A ``%``-format: ``%[.][width]letter`` fields and literal text between them."""
    out: list[Column] = []
    pos = 0
    for m in _PERCENT.finditer(text):
        if m.start() > pos:
            out.append(Column(None, text=text[pos:m.start()]))
        dot, _minus, width, letter = m.groups()
        if letter not in fields:
            raise FormatError(f"{option}: unknown field %{letter}; known: "
                              + " ".join(f"%{k}" for k in sorted(fields)))
        out.append(Column(fields[letter], int(width) if width else None, bool(dot)))
        pos = m.end()
    if pos < len(text):
        out.append(Column(None, text=text[pos:]))
    if not any(c.field for c in out):
        raise FormatError(f"{option}: no fields in {text!r}; use %-letters such as %i %j %T")
    return out


def parse_named(text: str, names: dict[str, str], fields: dict[str, Field], option: str,
                default_width: int = 20) -> list[Column]:
    """squeue's ``--Format``: ``name[:[.]width]`` separated by commas."""
    out: list[Column] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, _, spec = item.partition(":")
        letter = names.get(name.lower())
        if letter is None:
            raise FormatError(f"{option}: unknown field {name!r}; known: {', '.join(sorted(names))}")
        right = spec.startswith(".")
        width = spec.lstrip(".")
        if width and not width.isdigit():
            raise FormatError(f"{option}: bad width in {item!r}")
        if out:
            out.append(Column(None, text=" "))
        out.append(Column(fields[letter], int(width) if width else default_width, right))
    if not out:
        raise FormatError(f"{option}: no fields")
    return out


def parse_sacct(text: str, option: str = "--format") -> list[Column]:
    """sacct's ``--format``: ``Name[%width]`` separated by commas."""
    out: list[Column] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, _, width = item.partition("%")
        entry = SACCT.get(name.lower())
        if entry is None:
            raise FormatError(f"{option}: unknown field {name!r}; known: "
                              + ", ".join(f.header for f, _ in SACCT.values()))
        if width and not width.lstrip("-").isdigit():
            raise FormatError(f"{option}: bad width in {item!r}")
        field, default = entry
        w = abs(int(width)) if width else default
        out.append(Column(field, w, not width.startswith("-") if width else True))
    if not out:
        raise FormatError(f"{option}: no fields")
    return out


# -- rendering --------------------------------------------------------------------------------

def _cell(text: Any, col: Column) -> str:
    s = "" if text is None else str(text)
    if col.width is None:
        return s
    s = s[:col.width]
    return s.rjust(col.width) if col.right else s.ljust(col.width)


def render(columns: list[Column], records: Iterable[dict[str, Any]], now: float, *,
           header: bool = True) -> str:
    """One line per record (plus a header), trailing blanks removed."""
    lines = []
    if header:
        lines.append("".join(c.text if c.field is None else _cell(c.field.header, c) for c in columns).rstrip())
    for r in records:
        lines.append("".join(c.text if c.field is None else _cell(c.field.get(r, now), c) for c in columns).rstrip())
    return "\n".join(lines)


def render_sacct(columns: list[Column], records: Iterable[dict[str, Any]], now: float, *,
                 header: bool = True, delimiter: str | None = None, trailing: bool = False) -> str:
    """sacct's layout: fixed widths, a dashed rule under the header, ``+`` marking a cut
    value; or ``delimiter``-separated (``-P``/``-p``) with full values."""
    rows = [[str(c.field.get(r, now)) if c.field else "" for c in columns] for r in records]
    heads = [c.field.header if c.field else "" for c in columns]
    lines = []
    if delimiter is not None:
        end = delimiter if trailing else ""
        if header:
            lines.append(delimiter.join(heads) + end)
        lines += [delimiter.join(row) + end for row in rows]
        return "\n".join(lines)

    def cut(s: str, w: int) -> str:
        return s if len(s) <= w else s[: w - 1] + "+"

    def line(cells: list[str]) -> str:
        return " ".join(cut(s, c.width or 10).rjust(c.width or 10) if c.right
                        else cut(s, c.width or 10).ljust(c.width or 10) for s, c in zip(cells, columns)).rstrip()
    if header:
        lines.append(line(heads))
        lines.append(" ".join("-" * (c.width or 10) for c in columns))
    lines += [line(row) for row in rows]
    return "\n".join(lines)


# -- squeue helpers ---------------------------------------------------------------------------

def collapse_arrays(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pending tasks of one array as one record ``123_[4-99%10]``, as squeue shows them."""
    out: list[dict[str, Any]] = []
    groups: dict[int, list[dict[str, Any]]] = {}
    for j in jobs:
        if j.get("state") == "PENDING" and j.get("array_job_id") is not None and j.get("array_task_id") is not None:
            if j["array_job_id"] not in groups:
                groups[j["array_job_id"]] = []
                out.append({"_array": j["array_job_id"]})
            groups[j["array_job_id"]].append(j)
        else:
            out.append(j)
    result = []
    for j in out:
        if "_array" not in j:
            result.append(j)
            continue
        tasks = groups[j["_array"]]
        if len(tasks) == 1:
            result.append(tasks[0])
            continue
        first = min(tasks, key=lambda t: t["array_task_id"])
        limit = f"%{first['array_throttle']}" if first.get("array_throttle") else ""
        merged = dict(first)
        merged["display_id"] = f"{first['array_job_id']}_[{format_indices([t['array_task_id'] for t in tasks])}{limit}]"
        result.append(merged)
    return result


_SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "i": lambda r: (r.get("array_job_id") or r.get("job_id") or 0, r.get("array_task_id") or -1,
                    r.get("job_id") or 0),
    "A": lambda r: r.get("job_id") or 0,
    "j": lambda r: r.get("name") or "",
    "u": lambda r: r.get("user") or "",
    "U": lambda r: r.get("uid") or 0,
    "P": lambda r: r.get("partition") or "",
    "a": lambda r: r.get("account") or "",
    "q": lambda r: r.get("qos") or "",
    "t": lambda r: r.get("state") or "",
    "T": lambda r: r.get("state") or "",
    "p": lambda r: r.get("priority") or 0,
    "Q": lambda r: r.get("priority") or 0,
    "V": lambda r: r.get("submit_time") or 0,
    "S": lambda r: r.get("start_time") or r.get("expected_start") or float("inf"),
    "e": lambda r: r.get("end_time") or float("inf"),
    "l": lambda r: r.get("time_limit") or float("inf"),
    "C": lambda r: r.get("cpus") or 0,
    "G": lambda r: r.get("gpus") or 0,
    "y": lambda r: r.get("nice") or 0,
    "N": lambda r: r.get("node") or "",
    "r": lambda r: r.get("reason") or "",
}


def sort_records(records: list[dict[str, Any]], spec: str, now: float, option: str = "--sort") -> list[dict[str, Any]]:
    """squeue's ``-S``: letters with an optional ``-`` (descending) or ``+``, comma-separated."""
    keys = []
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        desc = item.startswith("-")
        letter = item.lstrip("+-")
        if letter == "M":
            key = (lambda r: fmt.elapsed(r, now))
        elif letter in _SORT_KEYS:
            key = _SORT_KEYS[letter]
        else:
            raise FormatError(f"{option}: cannot sort by {item!r}; use letters like i, j, u, P, t, p, V, S, M")
        keys.append((key, desc))
    out = list(records)
    for key, desc in reversed(keys):   # stable sorts, last key first
        out.sort(key=key, reverse=desc)
    return out


# -- sinfo helpers ----------------------------------------------------------------------------

def sinfo_rows(nodes: list[dict[str, Any]], partitions: list[dict[str, Any]] | None,
               columns: list[Column], per_node: bool) -> list[dict[str, Any]]:
    """The rows sinfo prints: nodes grouped by every shown value that is not an aggregate."""
    pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    if partitions:
        for p in partitions:
            members = set(p.get("node_names") or ())
            pairs += [(n, p) for n in nodes if n.get("name") in members]
    else:
        pairs = [(n, None) for n in nodes]
    letters = [c for c in columns if c.field is not None]
    grouped: dict[tuple, list[tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    for node, part in pairs:
        row = _node_values(node, part)
        key = tuple(str(c.field.get(row, 0)) for c in letters if _letter(c) not in SINFO_AGGREGATE)
        if per_node:
            key = (node.get("name"),) + key
        grouped.setdefault(key, []).append((node, part))
    out = []
    for members in grouped.values():
        row = _node_values(*members[0])
        names = [str(n.get("name")) for n, _ in members]
        row.update(count=len(members), nodelist=fmt.compress_hostlist(names),
                   cpus_alloc=sum(int(n.get("cpus_alloc") or 0) for n, _ in members),
                   cpus=sum(int(n.get("cpus") or 0) for n, _ in members))
        row["cpus_idle"] = row["cpus"] - row["cpus_alloc"]
        out.append(row)
    return out


def _letter(col: Column) -> str:
    for k, f in SINFO.items():
        if f is col.field:
            return k
    return ""


def _node_values(node: dict[str, Any], part: dict[str, Any] | None) -> dict[str, Any]:
    gpus = node.get("gpus") or []
    models: dict[str, int] = {}
    for g in gpus:
        models[str(g.get("model"))] = models.get(str(g.get("model")), 0) + 1
    gres = ",".join(f"gpu:{m}:{n}" for m, n in sorted(models.items())) or "(null)"
    row: dict[str, Any] = {
        "state": fmt.node_state(node), "state_long": fmt.node_state_long(node),
        "gres": gres, "cpus_per_node": node.get("cpus", 0), "mem_per_node": node.get("mem_mb", 0),
        "reason": node.get("reason"), "cpus_alloc": int(node.get("cpus_alloc") or 0),
        "reason_user": node.get("reason_user"), "reason_time": node.get("reason_time"),
        "cpus": int(node.get("cpus") or 0), "count": 1, "nodelist": node.get("name", "?"),
    }
    row["cpus_idle"] = row["cpus"] - row["cpus_alloc"]
    if part is not None:
        row["partition_name"] = part["name"]
        row["partition"] = part["name"] + ("*" if part.get("default") else "")
        row["timelimit"] = "infinite" if part.get("max_time") is None else format_duration(part["max_time"])
        row["avail"] = "up" if part.get("state", "UP") == "UP" else "down"
    return row
