"""Confinement on the v1 hierarchies (also a hybrid host's): one directory per controller.

``setup`` finds where each controller is mounted and where the worker sits in it, and
makes the jobs' subtree in each; the freezer is required, since ``kill`` freezes the
job's cgroup, SIGKILLs every member and thaws it.  The batch script stays in the job's
own cgroup (v1 allows that, and creating and removing a cgroup in each of six
hierarchies is most of what confinement costs a job); ``gpuctl srun`` steps get
children.  GPUs are fenced with the devices controller: a deny line for every other GPU
and capability minor the node has.  See gpud.worker.cgroups for the whole design.
"""

from __future__ import annotations

import errno
import os
import time

from .cgroupfs import (CgroupError, CgroupFs, RealFs, cpulist, ensure_dir, join, keyed, pids_in, pids_in_tree,
                       read_int, remove_tree, sigkill)
from .cgroups import BATCH, JOB_NAME, Cgroups, Limits, Usage

V1_CONTROLLERS = ("freezer", "memory", "cpuset", "pids", "devices", "cpuacct")


class V1(Cgroups):
    """The v1 controllers (also a hybrid host's): one directory per controller."""

    kind = "v1"

    def __init__(self, bases: dict[str, str], fs: CgroupFs | None = None) -> None:
        super().__init__()
        self.fs = fs or RealFs()
        self.bases = bases      # controller -> the jobs' subtree in its hierarchy
        self.base = bases["freezer"]
        self._flat: set[str] = set()   # jobs made here that have no step cgroups (nothing to list)
        self.missing = [c for c in V1_CONTROLLERS if c not in bases]

    @classmethod
    def setup(cls, tag: str, fs: CgroupFs | None = None, *, mountinfo: str = "/proc/self/mountinfo",
              cgroup_file: str = "/proc/self/cgroup") -> "V1":
        fs = fs or RealFs()
        mounts = _v1_mounts(mountinfo)
        own = _own_v1_paths(cgroup_file)
        if "freezer" not in mounts:
            raise CgroupError(errno.ENOENT, "the v1 freezer controller is not mounted")
        bases = {}
        for ctrl in V1_CONTROLLERS:
            if ctrl not in mounts:
                continue
            mount_point, root = mounts[ctrl]
            rel = own.get(ctrl, "/")
            if root != "/" and rel.startswith(root):
                rel = rel[len(root):]
            parent = join(mount_point, rel)
            base = join(parent, tag)
            if not fs.exists(base):
                fs.mkdir(base)
            if ctrl == "cpuset":
                _copy_cpuset(fs, parent, base)
            bases[ctrl] = base
        return cls(bases, fs)

    def _dirs(self, name: str, *parts: str) -> dict[str, str]:
        return {c: join(b, name, *parts) for c, b in self.bases.items()}

    def create(self, name: str, limits: Limits) -> None:
        self._flat.add(name)
        for ctrl, path in self._dirs(name).items():
            ensure_dir(self.fs, path)
            if ctrl == "cpuset":
                _copy_cpuset(self.fs, self.bases[ctrl], path)
                if limits.cpus:
                    self.fs.write(join(path, "cpuset.cpus"), cpulist(limits.cpus))
            elif ctrl == "memory" and limits.mem_bytes:
                self.fs.write(join(path, "memory.limit_in_bytes"), str(limits.mem_bytes))
                if self.fs.exists(join(path, "memory.memsw.limit_in_bytes")):
                    self.fs.write(join(path, "memory.memsw.limit_in_bytes"), str(limits.mem_bytes))
                elif self.fs.exists(join(path, "memory.swappiness")):
                    self.fs.write(join(path, "memory.swappiness"), "0")
            elif ctrl == "pids" and limits.pids_max:
                self.fs.write(join(path, "pids.max"), str(limits.pids_max))
            elif ctrl == "devices" and limits.devices is not None:
                for major, minor in limits.known_devices:
                    if minor not in limits.devices.get(major, frozenset({minor})):
                        self.fs.write(join(path, "devices.deny"), f"c {major}:{minor} rwm")

    def step(self, name: str, step: str) -> list[str]:
        if step == BATCH:   # v1 lets the job's own cgroup hold it: half the cgroups per job
            return [join(path, "cgroup.procs") for path in self._dirs(name).values()]
        self._flat.discard(name)
        out = []
        for ctrl, path in self._dirs(name, step).items():
            ensure_dir(self.fs, path)
            if ctrl == "cpuset":
                _copy_cpuset(self.fs, os.path.dirname(path), path)
            out.append(join(path, "cgroup.procs"))
        return out

    def exists(self, name: str) -> bool:
        return self.fs.exists(join(self.base, name))

    def pids(self, name: str) -> list[int]:
        if name in self._flat:
            return pids_in(self.fs, join(self.base, name))
        return pids_in_tree(self.fs, join(self.base, name))

    def populated(self, name: str) -> bool:
        return bool(self.pids(name))

    def kill(self, name: str) -> None:
        path = join(self.base, name)
        if not self.fs.exists(path):
            return
        state = join(path, "freezer.state")
        self.fs.write(state, "FROZEN")
        try:
            deadline = time.monotonic() + 1.0   # FREEZING while a task finishes a syscall
            while self.fs.read(state).strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)
            for pid in self.pids(name):
                sigkill(pid)
        finally:
            self.fs.write(state, "THAWED")

    def steps(self, name: str) -> list[str]:
        return [BATCH] + super().steps(name)

    def usage(self, name: str, step: str | None = None) -> Usage:
        parts = (name, step) if step and step != BATCH else (name,)
        mem = self.bases.get("memory")
        acct = self.bases.get("cpuacct")
        peak = read_int(self.fs, join(mem, *parts, "memory.max_usage_in_bytes")) if mem else None
        oom = 0
        if mem and name in self._flat and step in (None, BATCH):
            oom = keyed(_read_or_empty(self.fs, join(mem, name, "memory.oom_control"))).get("oom_kill", 0)
        elif mem:
            oom = _oom_kills_v1(self.fs, join(mem, *parts))
        ns = read_int(self.fs, join(acct, *parts, "cpuacct.usage")) if acct else None
        return Usage(peak, None if ns is None else ns // 1000, oom)

    def remove(self, name: str) -> bool:
        ok = True
        for path in self._dirs(name).values():
            ok = remove_tree(self.fs, path) and ok
        if ok:
            self._flat.discard(name)
        return ok

    def close(self) -> None:
        if not self.jobs():
            for path in self.bases.values():
                remove_tree(self.fs, path)

    def jobs(self) -> list[str]:
        try:
            return sorted(n for n in self.fs.listdir(self.base) if JOB_NAME.match(n))
        except OSError:
            return []


def _read_or_empty(fs: CgroupFs, path: str) -> str:
    try:
        return fs.read(path)
    except OSError:
        return ""


def _oom_kills_v1(fs: CgroupFs, path: str) -> int:
    """v1 counts an OOM kill in the cgroup of the killed process only: add up the subtree."""
    try:
        n = keyed(fs.read(join(path, "memory.oom_control"))).get("oom_kill", 0)
        children = [c for c in fs.listdir(path) if fs.isdir(join(path, c))]
    except OSError:
        return 0
    return n + sum(_oom_kills_v1(fs, join(path, c)) for c in children)


def _copy_cpuset(fs: CgroupFs, parent: str, child: str) -> None:
    """v1 starts a cpuset empty: it takes no task until it has CPUs and memory nodes."""
    for f in ("cpuset.mems", "cpuset.cpus"):
        if not fs.read(join(child, f)).strip():
            fs.write(join(child, f), fs.read(join(parent, f)).strip())


def _own_v1_paths(cgroup_file: str) -> dict[str, str]:
    out = {}
    with open(cgroup_file, encoding="ascii", errors="replace") as f:
        for line in f:
            _, _, rest = line.rstrip("\n").partition(":")
            ctrls, _, path = rest.partition(":")
            for c in ctrls.split(","):
                if c:
                    out[c] = path
    return out


def _v1_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """controller -> (mount point, root of the hierarchy mounted there)."""
    out: dict[str, tuple[str, str]] = {}
    with open(mountinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            try:
                sep = fields.index("-")
            except ValueError:
                continue
            if fields[sep + 1] != "cgroup":
                continue
            root, point = fields[3], fields[4].replace("\\040", " ")
            for opt in fields[sep + 3].split(","):
                if opt in V1_CONTROLLERS and opt not in out:
                    out[opt] = (point, root)
    return out
