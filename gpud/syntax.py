"""Slurm's small languages, parsed the same way by gpuctl and by the head.

Theory of operation
-------------------
Four notations that Slurm users already write, each parsed into frozen data with a
one-line ``SyntaxProblem`` for anything else (and signal names, ``parse_signal``):

* job arrays (``--array``): ``0-99``, ``1,3,5-9:2``, ``0-99%10`` -> ``ArraySpec``;
* dependencies (``--dependency``): ``afterok:12:13,singleton`` (all of them) or
  ``afterany:12?afternotok:13`` (any of them) -> ``Dependency``; a job id may name one
  array task (``12_3``) or, bare, a whole array;
* times (``--begin``, ``--deadline``, ``sacct -S``): ``now+1hour``, ``16:00``,
  ``2025-01-31T08:00``, ``tomorrow``, ``teatime``, ``MM/DD[/YY]`` -> epoch seconds;
* crontab lines (``gpuctl scrontab``): five time fields or an ``@daily`` alias, then the
  command; ``#SCRON`` lines before an entry hold sbatch options for it -> ``CronEntry``.

gpuctl parses what the user typed and sends canonical text (``format_*``); the head parses
that text again with the same functions before it trusts it, so both sides agree on what
a request means.  Stdlib only: gpuctl imports this module on its start-up path.

Times are computed in the local time zone unless a ``tz`` is passed (tests pass UTC).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

__all__ = [
    "SyntaxProblem", "ArraySpec", "parse_array", "format_indices", "Target", "Term", "Dependency",
    "parse_dependency", "parse_job_ref", "parse_time", "format_time", "CronSchedule", "CronEntry",
    "parse_crontab", "parse_mail_users", "parse_signal", "MAX_ARRAY_TASKS", "MAX_ARRAY_INDEX",
]

MAX_ARRAY_TASKS = 10_000        # tasks in one submission
MAX_ARRAY_INDEX = 4_000_000     # largest task index


class SyntaxProblem(ValueError):
    """Text that is not valid in its notation; the message is one line for the user."""


# -- output file names ------------------------------------------------------------------------
# sbatch's -o/-e patterns: the head shows the file a job writes, the worker opens it.
_OUTPUT_SPEC = re.compile(r"%(\d*)([%jJxuNAastn])")
MAX_PAD = 10   # Slurm's widest zero padding
DEFAULT_OUTPUT = "gpud-%j.out"
DEFAULT_ARRAY_OUTPUT = "gpud-%A_%a.out"


def expand_output(pattern: str | None, *, work_dir: str, job_id: int, name: str, user: str, node: str | None,
                  array_job_id: int | None = None, array_task_id: int | None = None) -> str:
    """sbatch's file name pattern as the file it names: %j job id, %J job id.step (the batch
    script's: the job id), %x name, %u user, %N node (kept as written while there is none),
    %A array id (the job id outside arrays), %a task id (0 outside arrays), %s step
    (``batch``), %t task and %n node number (0), %% a percent.  Digits pad a number with
    zeros (``%6j``, ``%3a``, at most 10); a backslash anywhere turns all of this off (and is
    dropped), as in Slurm.  None: ``gpud-%j.out``, or ``gpud-%A_%a.out`` for an array task."""
    if pattern is None:
        pattern = DEFAULT_ARRAY_OUTPUT if array_task_id is not None else DEFAULT_OUTPUT
    if "\\" in pattern:
        return os.path.normpath(os.path.join(work_dir, pattern.replace("\\", "")))
    values = {"j": str(job_id), "J": str(job_id), "x": name, "u": user, "%": "%",
              "A": str(array_job_id if array_job_id is not None else job_id),
              "a": str(array_task_id if array_task_id is not None else 0), "s": "batch", "t": "0", "n": "0"}
    if node:
        values["N"] = node

    def expand(m: re.Match) -> str:
        width, spec = m.groups()
        if spec not in values:
            return m.group(0)
        return values[spec].zfill(min(int(width), MAX_PAD)) if width and spec in "jJAatn" else values[spec]

    return os.path.normpath(os.path.join(work_dir, _OUTPUT_SPEC.sub(expand, pattern)))


# -- mail recipients --------------------------------------------------------------------------
# --mail-user ends up as an argument of the head's mail program, so only plain addresses pass:
# a local user name or user@domain, from a conservative subset of addr-spec.  No leading '-'
# (an option: mailutils' --exec runs commands), no '|' or '/' (mailx pipes and files), no
# quotes, spaces or '!'.  The mail program is also called with '--' before the recipients.
MAX_MAIL_USERS = 8
_MAIL_LOCAL = r"[A-Za-z0-9_+=%][A-Za-z0-9._+=%-]{0,63}"
_MAIL_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_MAIL_ADDRESS = re.compile(rf"^{_MAIL_LOCAL}(?:@{_MAIL_LABEL}(?:\.{_MAIL_LABEL})*)?$")


def parse_mail_users(text: str) -> tuple[str, ...]:
    """``"a@example.org,bob"`` -> ("a@example.org", "bob"); SyntaxProblem for anything else."""
    if not isinstance(text, str):
        raise SyntaxProblem(f"invalid mail address {text!r}")
    users = tuple(w.strip() for w in text.split(","))
    if not 0 < len(users) <= MAX_MAIL_USERS:
        raise SyntaxProblem(f"give at most {MAX_MAIL_USERS} mail addresses, separated by commas")
    for u in users:
        if len(u) > 254 or not _MAIL_ADDRESS.match(u):
            raise SyntaxProblem(f"invalid mail address {u!r}: give a user name or user@domain "
                                "(letters, digits and . _ + = % -, not starting with - or .)")
    return users


# -- job arrays -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArraySpec:
    tasks: tuple[int, ...]       # sorted, distinct
    throttle: int | None = None  # at most this many tasks running at once

    def format(self) -> str:
        text = format_indices(self.tasks)
        return f"{text}%{self.throttle}" if self.throttle else text


_ARRAY_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_array(text: str) -> ArraySpec:
    """``--array`` text -> ArraySpec; SyntaxProblem says what is accepted."""
    if not isinstance(text, str) or not text.strip():
        raise SyntaxProblem("--array needs task indices like 0-99, 1,3,5-9:2 or 0-99%10")
    body, sep, limit = text.strip().partition("%")
    throttle = None
    if sep:
        if not limit.isdigit() or int(limit) < 1:
            raise SyntaxProblem(f"invalid --array {text!r}: the limit after % must be a positive number")
        throttle = int(limit)
    tasks: set[int] = set()
    for item in body.split(","):
        m = _ARRAY_ITEM.match(item.strip())
        if not m:
            raise SyntaxProblem(f"invalid --array {text!r}: use N, A-B or A-B:STEP, separated by commas, "
                                "and an optional %LIMIT")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise SyntaxProblem(f"invalid --array {text!r}: in A-B:STEP, A must not exceed B and STEP is at least 1")
        if hi > MAX_ARRAY_INDEX:
            raise SyntaxProblem(f"invalid --array {text!r}: task indices go up to {MAX_ARRAY_INDEX}")
        if (hi - lo) // step + 1 + len(tasks) > MAX_ARRAY_TASKS:
            raise SyntaxProblem(f"invalid --array {text!r}: at most {MAX_ARRAY_TASKS} tasks per array")
        tasks.update(range(lo, hi + 1, step))
    return ArraySpec(tuple(sorted(tasks)), throttle)


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """Sorted indices in the shortest plain ranges: ``[0,1,2,5,7,9]`` -> ``0-2,5-9:2``."""
    xs = sorted(set(indices))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        # the longest run with a constant step from xs[i]; steps > 1 only for 3+ members
        j = i
        step = xs[i + 1] - xs[i] if i + 1 < len(xs) else 1
        while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
            if step > 1 and j + 2 < len(xs) and xs[j + 2] - xs[j + 1] == 1:
                break  # leave xs[j + 1] to start a plain range
            j += 1
        if step > 1 and j - i < 2:
            j, step = i, 1
        if j == i:
            parts.append(str(xs[i]))
        elif step == 1:
            parts.append(f"{xs[i]}-{xs[j]}")
        else:
            parts.append(f"{xs[i]}-{xs[j]}:{step}")
        i = j + 1
    return ",".join(parts)


# -- dependencies -----------------------------------------------------------------------------

DEPENDENCY_KINDS = ("after", "afterany", "afterok", "afternotok", "singleton")
_UNSUPPORTED_KINDS = {"aftercorr": "aftercorr (task-by-task array dependencies)",
                      "afterburstbuffer": "afterburstbuffer (burst buffers)",
                      "expand": "expand (growing a running job)"}
_JOB_REF = re.compile(r"^(\d+)(?:_(\d+))?$")
_AFTER_TARGET = re.compile(r"^(\d+(?:_\d+)?)(?:\+(\d+))?$")


@dataclass(frozen=True)
class Target:
    job_id: int                 # a job id, or an array's id when ``task`` is None
    task: int | None = None     # one task of the array ``job_id``
    delay: int = 0              # minutes after the target started (``after`` only)

    def format(self) -> str:
        ref = str(self.job_id) if self.task is None else f"{self.job_id}_{self.task}"
        return f"{ref}+{self.delay}" if self.delay else ref


@dataclass(frozen=True)
class Term:
    kind: str                       # one of DEPENDENCY_KINDS
    targets: tuple[Target, ...] = ()

    def format(self) -> str:
        if self.kind == "singleton":
            return "singleton"
        return ":".join([self.kind] + [t.format() for t in self.targets])


@dataclass(frozen=True)
class Dependency:
    terms: tuple[Term, ...]
    any: bool = False               # joined by '?' (any term) instead of ',' (all terms)

    def format(self) -> str:
        return ("?" if self.any else ",").join(t.format() for t in self.terms)

    def job_ids(self) -> set[int]:
        return {t.job_id for term in self.terms for t in term.targets}


def parse_job_ref(text: str) -> tuple[int, int | None]:
    """``"12"`` -> (12, None); ``"12_3"`` -> (12, 3); SyntaxProblem otherwise."""
    m = _JOB_REF.match(text.strip()) if isinstance(text, str) else None
    if not m or int(m.group(1)) <= 0:
        raise SyntaxProblem(f"invalid job id {text!r}: use a number like 42, or 42_7 for one array task")
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


def parse_dependency(text: str) -> Dependency | None:
    """``--dependency`` text -> Dependency; None for an empty text (no dependency)."""
    if not isinstance(text, str):
        raise SyntaxProblem("--dependency must be text")
    s = text.strip()
    if not s or s.lower() == "none":
        return None
    if "," in s and "?" in s:
        raise SyntaxProblem(f"invalid --dependency {text!r}: join terms with ',' (all) or '?' (any), not both")
    any_of = "?" in s
    terms = []
    for raw in s.split("?" if any_of else ","):
        terms.append(_parse_term(raw.strip(), text))
    return Dependency(tuple(terms), any_of)


def _parse_term(raw: str, whole: str) -> Term:
    kind, _, rest = raw.partition(":")
    kind = kind.lower()
    if kind in _UNSUPPORTED_KINDS:
        raise SyntaxProblem(f"--dependency {_UNSUPPORTED_KINDS[kind]} is not supported by gpud")
    if kind not in DEPENDENCY_KINDS:
        raise SyntaxProblem(f"invalid --dependency {whole!r}: unknown type {kind!r}; "
                            f"use {', '.join(DEPENDENCY_KINDS)}")
    if kind == "singleton":
        if rest:
            raise SyntaxProblem(f"invalid --dependency {whole!r}: singleton takes no job ids")
        return Term("singleton")
    if not rest:
        raise SyntaxProblem(f"invalid --dependency {whole!r}: {kind} needs job ids, e.g. {kind}:42")
    targets = []
    for word in rest.split(":"):
        m = _AFTER_TARGET.match(word)
        if not m or (m.group(2) is not None and kind != "after"):
            extra = " (+MINUTES only with after)" if m else ""
            raise SyntaxProblem(f"invalid --dependency {whole!r}: bad job id {word!r}{extra}")
        job_id, task = parse_job_ref(m.group(1))
        targets.append(Target(job_id, task, int(m.group(2) or 0)))
    return Term(kind, tuple(targets))


# -- times ------------------------------------------------------------------------------------

_NAMED_HOURS = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_RELATIVE = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?$")
_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[t ](\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_MMDD = re.compile(r"^(\d{2})[/.]?(\d{2})(?:[/.]?(\d{2}))?$")
TIME_FORMATS = ("now[+COUNT[seconds|minutes|hours|days|weeks]], HH:MM[:SS] [AM|PM], "
                "YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], MMDD[YY], today, tomorrow, "
                "midnight, noon, elevenses, fika, teatime")


def parse_time(text: str, now: float, *, tz: tzinfo | None = None, roll_forward: bool = True) -> float:
    """Epoch seconds for a Slurm time specification, relative to ``now``.

    ``roll_forward`` (sbatch's --begin): a time of day that has passed today means tomorrow,
    and a month/day that has passed this year means next year.  sacct's -S/-E pass False.
    """
    if not isinstance(text, str):
        raise SyntaxProblem(f"invalid time {text!r}: use {TIME_FORMATS}")
    s = text.strip().lower()
    today = _to_datetime(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    m = _RELATIVE.match(s)
    if m:
        sign, count, unit = m.groups()
        if sign is None:
            return now
        if unit not in _UNITS:
            raise SyntaxProblem(f"invalid time {text!r}: unknown unit {unit!r}; use {TIME_FORMATS}")
        delta = int(count) * _UNITS[unit]
        return now + delta if sign == "+" else now - delta
    if s == "today":
        return _timestamp(today)
    if s == "tomorrow":
        return _timestamp(_add_days(today, 1))
    if s in _NAMED_HOURS:
        return _at(today, _NAMED_HOURS[s], 0, 0, now, roll_forward)
    m = _CLOCK.match(s)
    if m:
        h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if m.group(4):
            if not 1 <= h <= 12:
                raise SyntaxProblem(f"invalid time {text!r}: hours go from 1 to 12 with AM/PM")
            h = h % 12 + (12 if m.group(4) == "pm" else 0)
        if h > 23 or mi > 59 or sec > 59:
            raise SyntaxProblem(f"invalid time {text!r}: not a time of day")
        return _at(today, h, mi, sec, now, roll_forward)
    m = _ISO.match(s)
    if m:
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        h, mi, sec = int(m.group(4) or 0), int(m.group(5) or 0), int(m.group(6) or 0)
        return _timestamp(_make(y, mo, d, h, mi, sec, today.tzinfo, text))
    m = _MMDD.match(s)
    if m:
        mo, d = int(m.group(1)), int(m.group(2))
        if m.group(3) is not None:
            return _timestamp(_make(2000 + int(m.group(3)), mo, d, 0, 0, 0, today.tzinfo, text))
        t = _timestamp(_make(today.year, mo, d, 0, 0, 0, today.tzinfo, text))
        if roll_forward and t + 86400 <= now:
            t = _timestamp(_make(today.year + 1, mo, d, 0, 0, 0, today.tzinfo, text))
        return t
    raise SyntaxProblem(f"invalid time {text!r}: use {TIME_FORMATS}")


def _to_datetime(ts: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(ts, tz) if tz is not None else datetime.fromtimestamp(ts)


def _timestamp(dt: datetime) -> float:
    return dt.timestamp()  # naive datetimes are local time, as mktime reads them


def _add_days(day: datetime, n: int) -> datetime:
    d = day.date() + timedelta(days=n)
    return day.replace(year=d.year, month=d.month, day=d.day)


def _make(y: int, mo: int, d: int, h: int, mi: int, sec: int, tz: tzinfo | None, text: str) -> datetime:
    try:
        return datetime(y, mo, d, h, mi, sec, tzinfo=tz)
    except ValueError as e:
        raise SyntaxProblem(f"invalid time {text!r}: {e}") from None


def _at(today: datetime, h: int, mi: int, sec: int, now: float, roll_forward: bool) -> float:
    t = _timestamp(today.replace(hour=h, minute=mi, second=sec))
    if roll_forward and t < now:
        t = _timestamp(_add_days(today, 1).replace(hour=h, minute=mi, second=sec))
    return t


def format_time(ts: float | None, *, tz: tzinfo | None = None) -> str:
    """Slurm's ``YYYY-MM-DDTHH:MM:SS`` in local time; ``N/A`` for None."""
    if ts is None:
        return "N/A"
    return _to_datetime(ts, tz).strftime("%Y-%m-%dT%H:%M:%S")


# -- crontab ----------------------------------------------------------------------------------

_ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MONTHS = {n: i for i, n in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_DAYS = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, lowest, highest, names)
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS))
_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s*=")


@dataclass(frozen=True)
class CronSchedule:
    """When a crontab entry fires: the sets of matching minutes, hours, days, months, weekdays."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]     # 0 = Sunday
    any_day: bool                # day of month was '*'
    any_weekday: bool            # day of week was '*'

    @classmethod
    def parse(cls, text: str) -> "CronSchedule":
        """Five fields (``*/15 8-18 * * mon-fri``) or an alias (``@hourly``)."""
        s = " ".join(text.split())
        if s.lower() == "@reboot":
            raise SyntaxProblem("@reboot is not supported: the head has no boot to run it at")
        fields = _ALIASES.get(s.lower(), s).split()
        if len(fields) != 5:
            raise SyntaxProblem(f"invalid schedule {text!r}: give five fields (minute hour day month weekday) "
                                f"or one of {', '.join(sorted(_ALIASES))}")
        sets = [_cron_field(f, *spec, text) for f, spec in zip(fields, _FIELDS)]
        weekdays = frozenset(d % 7 for d in sets[4])  # 7 is Sunday too
        return cls(s, sets[0], sets[1], sets[2], sets[3], weekdays, fields[2] == "*", fields[4] == "*")

    def matches(self, dt: datetime) -> bool:
        return (dt.minute in self.minutes and dt.hour in self.hours and dt.month in self.months
                and self._day_matches(dt))

    def _day_matches(self, dt: datetime) -> bool:
        dom = dt.day in self.days
        dow = (dt.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow  # both restricted: either one matches, as in cron

    def next_minute(self, after_minute: int, *, tz: tzinfo | None = None, limit_days: int = 5 * 366) -> int | None:
        """The first matching minute (minutes since the epoch) after ``after_minute``."""
        t = (after_minute + 1) * 60
        end = t + limit_days * 86400
        while t < end:
            dt = _to_datetime(t, tz)
            if dt.month not in self.months:
                t = _timestamp(_start_of_next_month(dt))
            elif not self._day_matches(dt):
                t = _timestamp(_add_days(dt.replace(hour=0, minute=0, second=0), 1))
            elif dt.hour not in self.hours:
                t = _next_hour(t, dt)
            elif dt.minute not in self.minutes:
                t = t + 60
            else:
                return int(t // 60)
        return None


def _start_of_next_month(dt: datetime) -> datetime:
    y, m = (dt.year + 1, 1) if dt.month == 12 else (dt.year, dt.month + 1)
    return dt.replace(year=y, month=m, day=1, hour=0, minute=0, second=0)


def _next_hour(t: float, dt: datetime) -> float:
    # whole hours in epoch time: right across DST changes, where wall-clock hours repeat or skip
    return t - dt.minute * 60 - dt.second + 3600


def _cron_field(text: str, name: str, lo: int, hi: int, names: dict[str, int], whole: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        rng, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise SyntaxProblem(f"invalid schedule {whole!r}: bad step in {name} field {text!r}")
            step = int(step_text)
        if rng == "*":
            a, b = lo, (6 if name == "day of week" else hi)
        else:
            a_text, dash, b_text = rng.partition("-")
            a = _cron_value(a_text, name, lo, hi, names, whole)
            b = _cron_value(b_text, name, lo, hi, names, whole) if dash else (hi if slash else a)
            if b < a:
                raise SyntaxProblem(f"invalid schedule {whole!r}: range {rng!r} runs backwards in the {name} field")
        out.update(range(a, b + 1, step))
    return frozenset(out)


def _cron_value(text: str, name: str, lo: int, hi: int, names: dict[str, int], whole: str) -> int:
    t = text.lower()
    if t in names:
        return names[t]
    if not t.isdigit() or not lo <= int(t) <= hi:
        raise SyntaxProblem(f"invalid schedule {whole!r}: {text!r} is not a valid {name} ({lo}-{hi})")
    return int(t)


@dataclass(frozen=True)
class CronEntry:
    schedule: CronSchedule
    command: str
    options: tuple[str, ...]     # the text after each #SCRON before this entry
    line: int                    # 1-based line of the entry in the crontab


def parse_crontab(text: str) -> list[CronEntry]:
    """Entries of a scrontab file; SyntaxProblem naming the line of the first problem."""
    entries: list[CronEntry] = []
    options: list[str] = []
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#SCRON"):
            rest = line[len("#SCRON"):]
            if rest and not rest[0].isspace():
                continue  # "#SCRONX" is an ordinary comment
            options.append(rest.strip())
            continue
        if line.startswith("#"):
            continue
        if _ENV_LINE.match(line):
            raise SyntaxProblem(f"line {n}: variable assignments are not supported in scrontab; "
                                "set them in the command or with #SCRON --export")
        words = line.split(None, 1 if line.startswith("@") else 5)
        count = 1 if line.startswith("@") else 5
        if len(words) <= count:
            raise SyntaxProblem(f"line {n}: no command after the schedule")
        try:
            schedule = CronSchedule.parse(" ".join(words[:count]))
        except SyntaxProblem as e:
            raise SyntaxProblem(f"line {n}: {e}") from None
        entries.append(CronEntry(schedule, words[count].strip(), tuple(options), n))
        options = []
    if options:
        raise SyntaxProblem("#SCRON options at the end of the file apply to no entry")
    return entries


def parse_signal(sig: object):
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` -> ``signal.SIGTERM``; None when it names no signal."""
    import signal as signals   # here: gpuctl's start-up path does not need it

    if isinstance(sig, bool):
        return None
    try:
        if isinstance(sig, int) or (isinstance(sig, str) and sig.strip().isdigit()):
            return signals.Signals(int(sig))
        name = sig.strip().upper()  # type: ignore[union-attr]
        return signals.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError, AttributeError):
        return None
