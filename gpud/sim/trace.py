"""Job traces for the simulator: a CSV of past jobs, read one row at a time.

Theory of operation
-------------------
A trace is a CSV with a header naming at least ``submit_s``, ``gpus`` and ``duration_s``;
the common schema of the traces under ``shared/traces`` is
``job_id,submit_s,gpus,duration_s,user,group,gpu_type,status`` and may carry the optional
columns ``time_limit_s``, ``qos``, ``gpu_mem`` and ``mig_profile``.  Other columns are
ignored, and an empty field means "unknown".

``iter_trace`` is a generator: it holds one row at a time, so a trace of millions of rows
costs no memory, and the engine pulls rows only as its virtual clock reaches them.  A row
that cannot be simulated is skipped and counted in ``TraceStats`` under a reason; reading
never raises on bad data, only when the file itself cannot be used (missing, no header,
a required column absent), with a ``TraceError`` whose message is one line.

Meanings chosen for the simulator:

* ``group`` is the job's account; an empty account is the configured default account and
  an empty user is ``UNKNOWN_USER``.
* ``gpus`` below one (``0.46``) is a share of one GPU: on a cluster with shared GPUs it
  becomes a request the core's sharing places (gpud/sim/sharing.py, ``Fractions``), else
  it takes one whole GPU; either way it is billed its fraction.  A non-integer above one
  is malformed.
* ``gpus`` of zero: the job needs no GPU, so it neither competes for nor uses what the
  simulator measures; it is skipped and counted as ``zero_gpu``.
* ``status`` is carried through untouched; the simulator runs every row for its
  ``duration_s`` whatever its recorded outcome.
* ``gpu_mem`` and ``mig_profile`` are requests for a slice or share, placed by the core's
  GPU sharing on MIG, MPS or time-sliced GPUs.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, TextIO

__all__ = ["TraceError", "TraceJob", "TraceStats", "iter_trace", "open_trace",
           "REQUIRED_COLUMNS", "UNKNOWN_USER"]

REQUIRED_COLUMNS = ("submit_s", "gpus", "duration_s")
UNKNOWN_USER = "unknown"
_UNLIMITED = frozenset({"unlimited", "infinite", "inf"})


class TraceError(ValueError):
    """A trace file that cannot be read at all; the message is one line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One simulatable row, in the simulator's terms."""

    seq: int                    # 1-based position among accepted rows: the job id
    trace_id: str               # the trace's own job id (or "row N" when empty)
    submit_s: float
    gpus: int                   # whole GPUs requested (a share takes one)
    share: float                # GPUs billed: ``gpus``, or the fraction for a share
    duration_s: float
    user: str
    account: str | None         # None: the configured default account
    gpu_type: str | None
    status: str | None
    time_limit_s: float | None = None
    qos: str | None = None
    gpu_mem: str | None = None
    mig_profile: str | None = None
    background: bool = False    # from ``--background``: not waited for by ``--drain``


@dataclass
class TraceStats:
    """What reading a trace saw: rows read, accepted, and skipped by reason."""

    rows: int = 0
    accepted: int = 0
    skipped: Counter = field(default_factory=Counter)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def open_trace(path: str) -> TextIO:
    """The trace file opened for ``iter_trace``; TraceError when it cannot be opened."""
    try:
        # Undecodable bytes become U+FFFD: the row then fails to parse and is counted.
        return open(path, newline="", encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}") from None


def iter_trace(lines: TextIO | Iterator[str], stats: TraceStats | None = None,
               *, name: str = "trace") -> Iterator[TraceJob]:
    """Yield the simulatable rows of a CSV trace, in file order, counting the rest."""
    stats = stats if stats is not None else TraceStats()
    reader = csv.reader(_without_nul(lines))
    header = _read_header(reader, name)
    if "submit_s" not in header and all(c in header for c in _POD_COLUMNS):
        reader, header = _pod_rows(reader, header), list(_AS_JOBS)
    index = {col: i for i, col in reversed(list(enumerate(header)))}
    missing = [c for c in REQUIRED_COLUMNS if c not in index]
    if missing:
        raise TraceError(f"{name}: missing column(s) {', '.join(missing)}; "
                         f"the header must name {', '.join(REQUIRED_COLUMNS)}")
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error:  # NUL-free but still broken, e.g. a field over csv's size limit
            stats.rows += 1
            stats.skip("malformed")
            continue
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        stats.rows += 1
        job = _parse_row(row, index, stats.accepted + 1, stats.rows, stats)
        if job is not None:
            stats.accepted += 1
            yield job


_POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
_AS_JOBS = ("job_id", "submit_s", "gpus", "duration_s", "status", "gpu_type")


def _pod_rows(reader, header: list[str]) -> Iterator[list[str]]:
    """An openb pod list's rows as jobs.csv rows (gpud/sim/openb.py): created at
    ``creation_time``, running from ``scheduled_time`` (else creation) to ``deletion_time``,
    ``gpu_milli`` / 1000 of one GPU for a share, else ``num_gpu``; a ``gpu_spec`` of one
    model is its ``gpu_type`` (of several: none, any model).  Its ``qos`` (LS, BE, ...) names
    no gpud QOS and is left out (``--qos`` sets one).  CPU and memory requests are for
    ``--fill-to``; a replay in time counts GPUs, as for jobs.csv."""
    col = {c: i for i, c in reversed(list(enumerate(header)))}

    def get(row: list[str], c: str) -> str:
        i = col.get(c)
        return row[i].strip() if i is not None and i < len(row) else ""
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            yield row
            continue
        num, milli = _number(get(row, "num_gpu")), _number(get(row, "gpu_milli"))
        created, deleted = _number(get(row, "creation_time")), _number(get(row, "deletion_time"))
        began = _number(get(row, "scheduled_time"))
        began = created if began is None else began
        gpus = "" if num is None or milli is None else (
            str(milli / 1000) if num == 1 and 0 < milli < 1000 else str(num))
        duration = "" if deleted is None or began is None else str(deleted - began)
        spec = [x for x in get(row, "gpu_spec").split("|") if x.strip()]
        yield [get(row, "name"), get(row, "creation_time"), gpus, duration, get(row, "pod_phase"),
               spec[0].strip() if len(spec) == 1 else ""]


def _without_nul(lines: TextIO | Iterator[str]) -> Iterator[str]:
    # csv refuses NUL bytes with an error per line; they are never meaningful here.
    for line in lines:
        yield line.replace("\0", "") if "\0" in line else line


def _read_header(reader, name: str) -> list[str]:
    try:
        for row in reader:
            if row and any(c.strip() for c in row):
                return [c.strip().lstrip("\ufeff").lower() for c in row]
    except csv.Error as e:
        raise TraceError(f"{name}: unreadable header: {e}") from None
    raise TraceError(f"{name}: empty trace (no header line)")


def _parse_row(row: list[str], index: dict[str, int], seq: int, rowno: int,
               stats: TraceStats) -> TraceJob | None:
    def get(col: str) -> str | None:
        i = index.get(col)
        if i is None or i >= len(row):
            return None
        v = row[i].strip()
        return v or None

    submit = _number(get("submit_s"))
    duration = _number(get("duration_s"))
    gpus_f = _number(get("gpus"))
    if submit is None or duration is None or gpus_f is None or submit < 0 or duration < 0 \
            or gpus_f < 0:
        stats.skip("malformed")
        return None
    if gpus_f == 0:
        stats.skip("zero_gpu")
        return None
    if gpus_f < 1:
        gpus, share = 1, gpus_f
    elif gpus_f == int(gpus_f):
        gpus = int(gpus_f)
        share = float(gpus)
    else:
        stats.skip("malformed")
        return None
    limit_text = get("time_limit_s")
    if limit_text is not None and limit_text.lower() in _UNLIMITED:
        limit_text = None
    limit = _number(limit_text) if limit_text is not None else None
    if limit_text is not None and (limit is None or limit <= 0):
        stats.skip("malformed")
        return None
    return TraceJob(
        seq=seq,
        trace_id=get("job_id") or f"row {rowno}",
        submit_s=submit,
        gpus=gpus,
        share=share,
        duration_s=duration,
        user=get("user") or UNKNOWN_USER,
        account=get("group"),
        gpu_type=get("gpu_type"),
        status=get("status"),
        time_limit_s=limit,
        qos=get("qos"),
        gpu_mem=get("gpu_mem"),
        mig_profile=get("mig_profile"),
    )


def _number(text: str | None) -> float | None:
    """A finite float, or None for empty or unparsable text."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None
