"""scrontab: recurring batch jobs that the head submits on a crontab schedule.

Theory of operation
-------------------
A user installs a crontab (``gpuctl scrontab FILE``): gpuctl parses it, turns each entry
and its ``#SCRON`` options into a job spec, and sends the text with the entries; the head
checks every schedule and spec again (``gpud.syntax``, ``JobSpec.from_request``) and
replaces the user's entries in one transaction.

Each entry row keeps ``last_slot``: the last crontab minute the entry was dealt with.  A
tick (about once a second) asks, per entry, whether a matching minute lies after
``last_slot`` and at or before now (``due``).  If so:

* the previous job of the entry is still pending or running: the slot is skipped
  (Slurm's rule: one run of an entry at a time);
* otherwise the job is inserted **in the same transaction** that moves ``last_slot`` to
  now, so no crash or restart can fire a slot twice or lose it.

After a head outage the missed minutes of an entry collapse into one late run, as in
Slurm.  New and changed entries start from the minute they were installed; an entry
installed again unchanged keeps its ``last_slot``, so re-installing never repeats a run.

Crontab minutes follow the local clock.  ``[head] cron_tick`` sets how many real seconds
a crontab minute lasts: 60, except in tests that cannot wait for real minutes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pwd
from dataclasses import dataclass
from datetime import tzinfo
from typing import TYPE_CHECKING, Any, Callable

from ..model import JobSpec, JobState, NodeInfo, SpecError
from ..syntax import CronSchedule, SyntaxProblem, parse_crontab
from ..sched import admission
from ..ctlsocket import Caller, RequestError
from .jobcaps import SubmitCaps, launch_refusal
from .store import JobRecord
from .store_cron import CronRepository

if TYPE_CHECKING:
    from ..config import Config
    from .daemon import Head
    from .store import Store

log = logging.getLogger("gpud.cron")

MAX_ENTRIES = 1000              # per user
MAX_TEXT = 256 * 1024           # bytes of crontab text
TICK_MAX = 1.0                  # s between checks at most
# Options that make no sense for a recurring entry.
REFUSED_OPTIONS = {"array": "--array", "dependency": "--dependency", "begin_time": "--begin",
                   "deadline": "--deadline", "test_only": "--test-only", "skip_if_active": "--skip-if-active",
                   "hold": "--hold"}


@dataclass
class Entry:
    entry_id: int
    uid: int
    gid: int
    user: str
    line: int
    schedule: CronSchedule
    spec: dict[str, Any]
    last_slot: int
    last_job_id: int | None
    # (last_slot it was computed from, next matching slot): checked every tick, computed once
    upcoming: tuple[int, int | None] | None = None

    def next_slot(self, tz: tzinfo | None) -> int | None:
        if self.upcoming is None or self.upcoming[0] != self.last_slot:
            self.upcoming = (self.last_slot, self.schedule.next_minute(self.last_slot, tz=tz))
        return self.upcoming[1]


def due(schedule: CronSchedule, last_slot: int, now_slot: int, tz: tzinfo | None = None) -> bool:
    """Whether a minute matching ``schedule`` lies in (last_slot, now_slot]."""
    if now_slot <= last_slot:
        return False
    nxt = schedule.next_minute(last_slot, tz=tz)
    return nxt is not None and nxt <= now_slot


def slot_of(now: float, tick: float) -> int:
    """The crontab minute that contains ``now``, with minutes ``tick`` real seconds long."""
    return int(now // tick)


class Cron:
    """The scrontab entries and their clock.  Given the store, the head's lock and kick, and
    getters for the live config, the wall clock and the registered nodes (for admission)."""

    def __init__(self, store: "Store", *, lock: asyncio.Lock, kick: Callable[[], None],
                 config: Callable[[], "Config"], clock: Callable[[], float],
                 node_infos: Callable[[], tuple[NodeInfo, ...]], tz: tzinfo | None = None) -> None:
        self.store = store
        self.lock = lock                 # the head's: a fired job is inserted as a submission is
        self.kick = kick
        self._config = config            # the live config: cron_tick may change on reload
        self._clock = clock
        self._node_infos = node_infos
        self.tz = tz
        self.entries: dict[int, Entry] | None = None   # loaded on first use
        self.rows = CronRepository(store)

    @property
    def tick_seconds(self) -> float:
        return float(getattr(self._config().head, "cron_tick", 60.0) or 60.0)

    def now_slot(self) -> int:
        return slot_of(self._clock(), self.tick_seconds)

    # -- storage ----------------------------------------------------------------------------
    async def load(self) -> dict[int, Entry]:
        if self.entries is None:
            entries: dict[int, Entry] = {}
            for eid, uid, gid, user, line, sched, spec, last, job in await self.rows.entries():
                try:
                    entries[eid] = Entry(eid, uid, gid, user, line, CronSchedule.parse(sched),
                                         json.loads(spec), last, job)
                except (SyntaxProblem, ValueError) as e:
                    log.warning("scrontab entry %d of %s ignored: %s", eid, user, e)
            self.entries = entries
        return self.entries

    # -- the clock --------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(TICK_MAX, self.tick_seconds / 4))
            try:
                await self.tick()
            except Exception:
                log.exception("scrontab tick failed; will retry")

    async def tick(self) -> list[int]:
        """Fire every due entry; the ids of the jobs submitted."""
        entries = await self.load()
        fired = []
        for entry in list(entries.values()):
            now_slot = self.now_slot()
            nxt = entry.next_slot(self.tz)
            if nxt is None or nxt > now_slot:
                continue
            async with self.lock:
                if entries.get(entry.entry_id) is not entry:
                    continue  # replaced meanwhile
                job_id = await self._fire(entry, now_slot)
            if job_id is not None:
                fired.append(job_id)
        if fired:
            self.kick()
        return fired

    async def _fire(self, entry: Entry, slot: int) -> int | None:
        store = self.store
        prev = store.active.get(entry.last_job_id) if entry.last_job_id is not None else None
        if prev is not None:
            log.info("scrontab entry %d of %s skipped: its previous job %d is still %s",
                     entry.entry_id, entry.user, prev.job_id, prev.state.value.lower())
            await self.rows.mark_slot(entry.entry_id, slot)
            entry.last_slot = slot
            return None
        now = self._clock()
        try:
            job = self._job(entry, now)
            refusal = (launch_refusal(job.spec.script, job.spec.env)
                       or SubmitCaps(store.active, self._config()).admit([job]))   # as sbatch's
            if refusal is not None:
                raise admission.Refused(refusal)
        except (SpecError, admission.Refused) as e:
            log.warning("scrontab entry %d of %s (line %d) not submitted: %s", entry.entry_id, entry.user,
                        entry.line, e)
            await self.rows.mark_slot(entry.entry_id, slot)
            entry.last_slot = slot
            return None
        saved = await store.insert_jobs([job], now, also=self.rows.fired(entry.entry_id, slot))
        entry.last_slot, entry.last_job_id = slot, saved[0].job_id
        log.info("scrontab entry %d of %s submitted job %d", entry.entry_id, entry.user, saved[0].job_id)
        return saved[0].job_id

    def _job(self, entry: Entry, now: float) -> JobRecord:
        spec = JobSpec.from_request(entry.spec)
        resolved = admission.resolve(spec, entry.user, self._config().sched, self._node_infos())
        return JobRecord(
            job_id=0, name=spec.name, user=entry.user, uid=entry.uid, gid=entry.gid,
            account=resolved.account, partition=resolved.partition, qos=resolved.qos,
            state=JobState.PENDING, spec=spec, gpus=spec.gpus, cpus=spec.cpus, mem_mb=resolved.mem_mb,
            time_limit=resolved.time_limit, submit_time=now, cron_entry=entry.entry_id)

    # -- installing ---------------------------------------------------------------------------
    async def replace(self, uid: int, gid: int, user: str, text: str,
                      new: list[tuple[int, CronSchedule, dict[str, Any]]]) -> list[Entry]:
        """Install ``new`` (line, schedule, spec) as the user's entries, in one transaction."""
        entries = await self.load()
        old = sorted((e for e in entries.values() if e.uid == uid), key=lambda e: e.entry_id)
        unused = list(old)
        now_slot = self.now_slot()
        rows = []
        for line, schedule, spec in new:
            same = next((e for e in unused if e.schedule.text == schedule.text and e.spec == spec), None)
            if same is not None:
                unused.remove(same)
            last, job = (same.last_slot, same.last_job_id) if same else (now_slot, None)
            rows.append((line, schedule, spec, last, job))
        ids = await self.rows.replace(uid, gid, user, text, [(line, schedule.text, spec, last, job)
                                                             for line, schedule, spec, last, job in rows],
                                      self._clock())
        for e in old:
            entries.pop(e.entry_id, None)
        installed = []
        for eid, (line, schedule, spec, last, job) in zip(ids, rows):
            entries[eid] = Entry(eid, uid, gid, user, line, schedule, spec, last, job)
            installed.append(entries[eid])
        return installed

    async def text_of(self, uid: int) -> str:
        return await self.rows.text_of(uid)


# -- socket operations ------------------------------------------------------------------------

def _target_user(head: "Head", caller: Caller, args: dict, *, write: bool = False) -> tuple[int, int, str]:
    """Whose scrontab: the caller's, or ``user``'s.  Admins may read anyone's; only root may
    set another user's, since its entries run as that user (as in Slurm)."""
    from .ops_jobs import is_admin

    name = args.get("user")
    if name is None or name == caller.user:
        return caller.uid, caller.gid, caller.user
    if not isinstance(name, str) or not is_admin(head, caller):
        raise RequestError("Access/permission denied: only root and admins may use another user's scrontab")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise RequestError(f"no user {name!r}") from None
    if write and caller.uid not in (0, pw.pw_uid):
        raise RequestError(f"Access/permission denied: only {pw.pw_name} or root may set {pw.pw_name}'s scrontab "
                           "(its jobs run as that user); an admin may read it and cancel or hold its jobs")
    return pw.pw_uid, pw.pw_gid, pw.pw_name


async def op_scrontab_get(head: "Head", caller: Caller, args: dict) -> dict:
    """{"user": str?} -> {"text": str, "entries": [{"entry_id", "line", "schedule", "next_run",
    "last_job_id", "active"}]}."""
    uid, _, _ = _target_user(head, caller, args)
    cron: Cron = head.slurm.cron
    entries = await cron.load()
    out = []
    for e in sorted((e for e in entries.values() if e.uid == uid), key=lambda e: e.line):
        nxt = e.schedule.next_minute(max(e.last_slot, cron.now_slot()), tz=cron.tz)
        job = head.store.active.get(e.last_job_id) if e.last_job_id is not None else None
        out.append({"entry_id": e.entry_id, "line": e.line, "schedule": e.schedule.text,
                    "next_run": None if nxt is None else nxt * cron.tick_seconds,
                    "last_job_id": e.last_job_id, "active": job is not None})
    return {"text": await cron.text_of(uid), "entries": out}


async def op_scrontab_set(head: "Head", caller: Caller, args: dict) -> dict:
    """{"text": str, "entries": [{"line", "schedule", "spec"}], "user": str?} -> {"entries": n}."""
    uid, gid, user = _target_user(head, caller, args, write=True)
    text = args.get("text", "")
    if not isinstance(text, str) or len(text.encode("utf-8", "surrogateescape")) > MAX_TEXT:
        raise RequestError(f"scrontab text must be at most {MAX_TEXT // 1024} KiB")
    try:
        parsed = parse_crontab(text)
    except SyntaxProblem as e:
        raise RequestError(f"scrontab: {e}") from None
    raw = args.get("entries", [])
    if not isinstance(raw, list) or len(raw) != len(parsed):
        raise RequestError(f"scrontab: the request lists {len(raw) if isinstance(raw, list) else '?'} entries "
                           f"but the text has {len(parsed)}")
    if len(parsed) > MAX_ENTRIES:
        raise RequestError(f"scrontab: at most {MAX_ENTRIES} entries per user")
    new = []
    for p, e in zip(parsed, raw):
        if not isinstance(e, dict) or e.get("line") != p.line or e.get("schedule") != p.schedule.text:
            raise RequestError(f"scrontab: entry for line {p.line} does not match the text")
        spec = e.get("spec")
        try:
            checked = JobSpec.from_request(spec)
        except SpecError as err:
            raise RequestError(f"scrontab: line {p.line}: {err}") from None
        for key, option in REFUSED_OPTIONS.items():
            if getattr(checked, key):
                raise RequestError(f"scrontab: line {p.line}: {option} is not allowed in scrontab")
        new.append((p.line, p.schedule, spec))
    async with head.lock:
        installed = await head.slurm.cron.replace(uid, gid, user, text, new)
    log.info("scrontab of %s (uid %d) set by %s: %d entries", user, uid, caller.user, len(installed))
    return {"entries": len(installed)}


OPS = {"scrontab_get": op_scrontab_get, "scrontab_set": op_scrontab_set}
