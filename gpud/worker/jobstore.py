"""The executor's state on disk: one directory per allocation, and tombstones.

Layout under ``<state_dir>/jobs/``::

  <job>.<attempt>/record.json    launch body + what the executor knows of the run (root, 0600)
  <job>.<attempt>/exec.json      what the wrapper needs to start the job (root, 0600)
  <job>.<attempt>/script         the batch script (the job's user, 0400)
  <job>.<attempt>/wrapper.pid    the wrapper's pid, written by the wrapper as it starts
  <job>.<attempt>/wrapper.log    the wrapper's own stderr (a crash trace, if ever)
  <job>.<attempt>/status         the job's wait status, written by the wrapper at the end
  <job>.<attempt>/outcome.json   the final outcome, until the head acknowledges it
  .acked/<job>.<attempt>         tombstone of an acknowledged allocation (mtime: ack time)
  .trash/<job>.<attempt>         an acknowledged allocation's directory, being removed

``jobs/`` and the allocation directories are mode 0711: a job's user reaches the script by
its path but cannot list anything, and every other file is root's.  Writes replace files
atomically (write, rename), so a crash leaves the old or the new version, never half.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass
from typing import Any, Callable

from .launch import Outcome

log = logging.getLogger("gpud.worker.executor")

TOMBSTONE_TTL = 86400.0   # seconds an acknowledged allocation is remembered
_DIR_NAME = re.compile(r"^(\d+)\.(\d+)$")

Key = tuple[int, int]


@dataclass(frozen=True)
class Saved:
    """One allocation directory as ``JobStore.load`` found it."""

    key: Key
    dir: str
    outcome: Outcome | None       # finished and not yet acknowledged
    record: dict[str, Any] | None  # None: missing or unreadable
    wrapper_pid: int | None


class JobStore:
    def __init__(self, state_dir: str, clock: Callable[[], float]) -> None:
        self.jobs_dir = os.path.join(os.path.abspath(state_dir), "jobs")
        self.acked_dir = os.path.join(self.jobs_dir, ".acked")
        self.trash_dir = os.path.join(self.jobs_dir, ".trash")   # acknowledged, being removed
        self._clock = clock
        self._ready = False

    def dir(self, key: Key) -> str:
        return os.path.join(self.jobs_dir, f"{key[0]}.{key[1]}")

    def setup(self) -> None:
        self._ready = True
        os.makedirs(self.jobs_dir, exist_ok=True)
        os.chmod(self.jobs_dir, 0o711)
        os.makedirs(self.acked_dir, 0o700, exist_ok=True)
        os.makedirs(self.trash_dir, 0o700, exist_ok=True)
        if os.geteuid() == 0 and not _searchable_by_all(self.jobs_dir):
            log.warning("%s is not searchable by everyone, so job users cannot read their "
                        "scripts: chmod o+x every directory above it", self.jobs_dir)

    def seen(self, key: Key) -> bool:
        """Launched here before: running, finished or acknowledged.  The directory is
        looked at first: ``acknowledge`` (maybe on another thread) writes the tombstone
        before it moves the directory away, so one of the two is always found."""
        name = f"{key[0]}.{key[1]}"
        return (os.path.exists(os.path.join(self.jobs_dir, name))
                or os.path.exists(os.path.join(self.acked_dir, name)))

    def create(self, key: Key, script: str, owner: tuple[int, int] | None,
               exec_spec: dict[str, Any], record: dict[str, Any]) -> None:
        """The allocation's directory with its script, exec.json and first record."""
        if not self._ready:
            self.setup()
        path = self.dir(key)
        os.mkdir(path, 0o711)
        os.chmod(path, 0o711)
        write_file(os.path.join(path, "script"), script.encode("utf-8", "surrogateescape"),
                   0o400, owner=owner)
        write_file(os.path.join(path, "exec.json"), json.dumps(exec_spec).encode(), 0o600)
        self.save_record(key, record)

    def save_record(self, key: Key, record: dict[str, Any]) -> None:
        write_file(os.path.join(self.dir(key), "record.json"), json.dumps(record).encode(), 0o600)

    def save_outcome(self, key: Key, outcome: Outcome) -> None:
        os.makedirs(self.dir(key), 0o711, exist_ok=True)
        write_file(os.path.join(self.dir(key), "outcome.json"),
                   json.dumps(outcome.to_dict()).encode(), 0o600, sync=True)

    def status(self, key: Key) -> dict[str, Any] | None:
        return read_json(os.path.join(self.dir(key), "status"))

    def wrapper_error(self, key: Key) -> str:
        """The last line the wrapper wrote to its stderr, if any."""
        try:
            with open(os.path.join(self.dir(key), "wrapper.log"), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 500))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def acknowledge(self, key: Key) -> str | None:
        """Tombstone first, then move the directory under ``.trash``: a crash in between
        leaves a tombstone and a directory, which ``load`` cleans up.  Returns the moved
        directory for ``discard`` (removing its files is the slow part, kept off the
        caller's path), or None when there was none."""
        name = f"{key[0]}.{key[1]}"
        path = os.path.join(self.acked_dir, name)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            now = self._clock()
            os.utime(path, (now, now))  # aged on the executor's clock, like everything else
        except OSError as e:
            log.error("job %d.%d: cannot write its tombstone: %s", *key, e.strerror)
        trash = os.path.join(self.trash_dir, name)
        try:
            os.rename(self.dir(key), trash)
        except FileNotFoundError:
            return None
        except OSError:  # no .trash (an old state dir) or a leftover of the same name
            shutil.rmtree(self.dir(key), ignore_errors=True)
            return None
        return trash

    @staticmethod
    def discard(path: str) -> None:
        """(thread) Remove a directory ``acknowledge`` moved away."""
        shutil.rmtree(path, ignore_errors=True)

    def prune_tombstones(self) -> None:
        now = self._clock()
        try:
            names = os.listdir(self.acked_dir)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.acked_dir, name)
            try:
                if now - os.stat(path).st_mtime > TOMBSTONE_TTL:
                    os.unlink(path)
            except OSError:
                pass

    def load(self) -> list[Saved]:
        """Every allocation directory, in job order."""
        self.prune_tombstones()
        for name in _listdir(self.trash_dir):  # acknowledged before a stop, not yet removed
            shutil.rmtree(os.path.join(self.trash_dir, name), ignore_errors=True)
        found = []
        for name in sorted(os.listdir(self.jobs_dir)):
            m = _DIR_NAME.match(name)
            path = os.path.join(self.jobs_dir, name)
            if not m or not os.path.isdir(path):
                continue
            if os.path.exists(os.path.join(self.acked_dir, name)):
                shutil.rmtree(path, ignore_errors=True)  # acknowledged just before a crash
                continue
            key = (int(m.group(1)), int(m.group(2)))
            found.append(Saved(key, path, _load_outcome(path),
                               read_json(os.path.join(path, "record.json")),
                               _read_pid(os.path.join(path, "wrapper.pid"))))
        return found


def write_file(path: str, data: bytes, mode: int, *, owner: tuple[int, int] | None = None,
               sync: bool = False) -> None:
    """Replace ``path`` atomically with ``data``."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _load_outcome(path: str) -> Outcome | None:
    saved = read_json(os.path.join(path, "outcome.json"))
    if saved is None:
        return None
    try:
        return Outcome.from_dict(saved)
    except (KeyError, TypeError, ValueError):
        log.error("%s: unreadable outcome.json; ignored", path)
        return None


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _searchable_by_all(path: str) -> bool:
    path = os.path.abspath(path)
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent
