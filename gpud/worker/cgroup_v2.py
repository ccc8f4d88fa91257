"""Confinement on the unified hierarchy (cgroup v2): the worker's delegated subtree.

The worker's own cgroup is a delegated one (systemd's ``Delegate=yes``).  A cgroup with
processes cannot enable controllers for its children, so ``setup`` first moves the
worker (and every process of its unit) into a leaf ``worker`` beside the jobs' subtree.
Each job's cgroup carries its limits (``memory.max`` with no swap, ``cpuset.cpus``,
``pids.max``) and, for its GPUs, a BPF_PROG_TYPE_CGROUP_DEVICE program (gpud.worker.bpfdev);
``kill`` writes ``cgroup.kill`` (before Linux 5.14: freeze, SIGKILL every member, thaw).
See gpud.worker.cgroups for the whole design.
"""

from __future__ import annotations

import errno
import os
from typing import Callable

from .bpfdev import attach_device_program, device_program
from .cgroupfs import (CgroupError, CgroupFs, RealFs, cpulist, ensure_dir, join, keyed, pids_in, pids_in_tree,
                       read_int, remove_tree, sigkill)
from .cgroups import BATCH, JOB_NAME, V2_MOUNT, Cgroups, Limits, Usage

V2_CONTROLLERS = ("memory", "pids", "cpuset")


class V2(Cgroups):
    """The unified hierarchy: the worker's delegated subtree (``Delegate=yes``)."""

    kind = "v2"

    def __init__(self, base: str, fs: CgroupFs | None = None, *,
                 attach: Callable[[str, list[bytes]], None] | None = None) -> None:
        super().__init__()
        self.fs = fs or RealFs()
        self.base = base
        self._attach = attach or attach_device_program
        self.controllers: set[str] = set()

    @classmethod
    def setup(cls, tag: str, mount: str = V2_MOUNT, fs: CgroupFs | None = None, *,
              self_cgroup: str | None = None, pid: int | None = None,
              attach: Callable[[str, list[bytes]], None] | None = None) -> "V2":
        """Find the worker's cgroup, keep the worker in a leaf and make the jobs' subtree."""
        fs = fs or RealFs()
        own = self_cgroup if self_cgroup is not None else _own_v2_path()
        pid = os.getpid() if pid is None else pid
        here = join(mount, own)
        if own in ("", "/"):
            parent = mount   # not under a service manager: the root may hold processes
        else:
            if os.path.basename(here.rstrip("/")) == "worker":   # put there by an earlier start
                parent = os.path.dirname(here.rstrip("/"))
            else:
                parent = here
                leaf = join(parent, "worker")
                if not fs.exists(leaf):
                    fs.mkdir(leaf)
                # every process of the unit (the fork server, wrappers) goes to the leaf
                for p in pids_in(fs, parent):
                    try:
                        fs.write(join(leaf, "cgroup.procs"), str(p))
                    except OSError as e:
                        if e.errno != errno.ESRCH:
                            raise
                fs.write(join(leaf, "cgroup.procs"), str(pid))
        self = cls(join(parent, tag), fs, attach=attach)
        available = set(fs.read(join(parent, "cgroup.controllers")).split())
        self.controllers = {c for c in V2_CONTROLLERS if c in available}
        self.missing = [c for c in V2_CONTROLLERS if c not in available]
        self._enable(parent)
        if not fs.exists(self.base):
            fs.mkdir(self.base)
        self._enable(self.base)
        return self

    def _enable(self, path: str) -> None:
        if self.controllers:
            self.fs.write(join(path, "cgroup.subtree_control"),
                          " ".join(f"+{c}" for c in sorted(self.controllers)))

    def _dir(self, name: str, *parts: str) -> str:
        return join(self.base, name, *parts)

    def create(self, name: str, limits: Limits) -> None:
        path = self._dir(name)
        ensure_dir(self.fs, path)
        c = self.controllers
        if "cpuset" in c and limits.cpus:
            self.fs.write(join(path, "cpuset.cpus"), cpulist(limits.cpus))
        if "memory" in c and limits.mem_bytes:
            self.fs.write(join(path, "memory.max"), str(limits.mem_bytes))
            if self.fs.exists(join(path, "memory.swap.max")):
                self.fs.write(join(path, "memory.swap.max"), "0")
        if "pids" in c and limits.pids_max:
            self.fs.write(join(path, "pids.max"), str(limits.pids_max))
        if limits.devices is not None:
            self._attach(path, device_program(limits.devices))
        self._enable(path)    # per-step accounting

    def step(self, name: str, step: str) -> list[str]:
        path = self._dir(name, step)
        ensure_dir(self.fs, path)
        return [join(path, "cgroup.procs")]

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._dir(name))

    def pids(self, name: str) -> list[int]:
        return pids_in_tree(self.fs, self._dir(name))

    def populated(self, name: str) -> bool:
        path = self._dir(name)
        try:
            events = keyed(self.fs.read(join(path, "cgroup.events")))
        except FileNotFoundError:
            return False
        return events.get("populated", 0) == 1

    def kill(self, name: str) -> None:
        path = self._dir(name)
        if not self.fs.exists(path):
            return
        if self.fs.exists(join(path, "cgroup.kill")):
            self.fs.write(join(path, "cgroup.kill"), "1")
            return
        # kernels before 5.14: freeze, kill, thaw
        self.fs.write(join(path, "cgroup.freeze"), "1")
        try:
            for pid in self.pids(name):
                sigkill(pid)
        finally:
            self.fs.write(join(path, "cgroup.freeze"), "0")

    def usage(self, name: str, step: str | None = None) -> Usage:
        path = self._dir(name, step) if step else self._dir(name)
        peak = read_int(self.fs, join(path, "memory.peak"))
        if peak is None:
            peak = read_int(self.fs, join(path, "memory.current"))
        try:
            cpu = keyed(self.fs.read(join(path, "cpu.stat"))).get("usage_usec")
        except OSError:
            cpu = None
        try:
            oom = keyed(self.fs.read(join(path, "memory.events"))).get("oom_kill", 0)
        except OSError:
            oom = 0
        return Usage(peak, cpu, oom)

    def remove(self, name: str) -> bool:
        try:   # the usual job: its batch step only, removed without listing anything
            self.fs.rmdir(self._dir(name, BATCH))
        except OSError:
            pass
        return remove_tree(self.fs, self._dir(name))

    def close(self) -> None:
        if not self.jobs():
            remove_tree(self.fs, self.base)

    def jobs(self) -> list[str]:
        try:
            return sorted(n for n in self.fs.listdir(self.base) if JOB_NAME.match(n))
        except OSError:
            return []


def _own_v2_path(cgroup_file: str = "/proc/self/cgroup") -> str:
    with open(cgroup_file, encoding="ascii", errors="replace") as f:
        for line in f:
            hid, _, rest = line.rstrip("\n").partition(":")
            ctrls, _, path = rest.partition(":")
            if hid == "0" and ctrls == "":
                return path
    raise CgroupError(errno.ENOENT, "the worker is in no cgroup v2")
