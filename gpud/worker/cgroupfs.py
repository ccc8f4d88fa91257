"""The cgroup files, and the helpers both hierarchies read and write them with.

All file access of the cgroup backends (cgroup_v1.py, cgroup_v2.py) goes through a
``CgroupFs``: ``RealFs`` is the kernel's files, and tests run the v2 code against
``tests/fake_cgroup2.py``, an in-memory model of the kernel's rules.  The helpers keep to
what a cgroup directory is in both hierarchies: a ``cgroup.procs`` file of member pids,
child cgroups as subdirectories, and ``rmdir`` that fails while processes remain.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Iterable, Protocol


class CgroupError(OSError):
    pass


class CgroupFs(Protocol):
    def read(self, path: str) -> str: ...
    def write(self, path: str, text: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def mkdir(self, path: str) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def isdir(self, path: str) -> bool: ...


class RealFs:
    """The kernel's cgroup files."""

    def read(self, path: str) -> str:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()

    def write(self, path: str, text: str) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o755)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)


# -- helpers ---------------------------------------------------------------------------------------

def join(*parts: str) -> str:
    out = parts[0].rstrip("/") or "/"
    for p in parts[1:]:
        p = p.strip("/")
        if p:
            out = out.rstrip("/") + "/" + p
    return out


def cpulist(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


def keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def ensure_dir(fs: CgroupFs, path: str) -> None:
    """A cgroup that may exist already (an adopted job; two tasks of one srun step at once)."""
    try:
        fs.mkdir(path)
    except FileExistsError:
        pass


def read_int(fs: CgroupFs, path: str) -> int | None:
    try:
        text = fs.read(path).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pids_in(fs: CgroupFs, path: str) -> list[int]:
    try:
        return [int(x) for x in fs.read(join(path, "cgroup.procs")).split() if x.isdigit()]
    except FileNotFoundError:
        return []


def pids_in_tree(fs: CgroupFs, path: str) -> list[int]:
    out = pids_in(fs, path)
    try:
        children = [c for c in fs.listdir(path) if fs.isdir(join(path, c))]
    except OSError:
        return out
    for c in children:
        out += pids_in_tree(fs, join(path, c))
    return out


def remove_tree(fs: CgroupFs, path: str) -> bool:
    """rmdir ``path`` and its child cgroups; False while any holds processes.  The plain
    rmdir comes first: a job without steps needs nothing else (listing a cgroup is dear)."""
    try:
        fs.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise
    try:
        children = [c for c in fs.listdir(path) if fs.isdir(join(path, c))]
    except OSError:
        children = []
    if not children or not all([remove_tree(fs, join(path, c)) for c in children]):
        return False
    try:
        fs.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True


def sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
