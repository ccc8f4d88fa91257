"""Job confinement with cgroups: one cgroup per job, limits from its allocation, accounting.

Theory of operation
-------------------
Every allocation gets a cgroup ``job_<id>_<attempt>`` under the worker's own subtree, with
one child per step: ``batch`` for the batch script, ``step_<n>`` for ``gpuctl srun`` tasks
(v1 keeps the batch script in the job's own cgroup: it allows that, and creating and
removing a cgroup in each of six hierarchies is most of what confinement costs a job).
The limits sit on the job's cgroup, so every step shares them (as in Slurm):

* processes: the job's processes are exactly the cgroup's, whatever sessions or process
  groups they make; ``kill`` ends them all (v2: ``cgroup.kill``; v1: freeze the freezer
  cgroup, SIGKILL every member, thaw) and a job is over only when its cgroup is empty;
* memory: ``--mem`` as the hard limit with no swap on top; an OOM kill inside is counted
  by the kernel and read back by ``usage``;
* CPUs: the cpuset is the CPUs the worker bound the job to, so the job cannot widen its
  affinity;
* tasks: ``pids.max`` (``[worker] max_tasks_per_job``);
* GPU devices: character devices of the fenced majors (195 for ``/dev/nvidia*``, the
  ``nvidia-caps`` major for MIG capabilities) open only for the job's own minors and the
  control nodes.  v1 uses the devices controller (a deny line for every other GPU and cap
  minor the node has); v2 attaches a BPF_PROG_TYPE_CGROUP_DEVICE program to the job's
  cgroup (gpud.worker.bpfdev).

The executor creates the job's cgroup before it starts the job's wrapper; the wrapper's
child writes its own pid into the step's ``cgroup.procs`` files before it drops root and
execs the job, so no instruction of the job runs outside.  The wrapper itself stays in the
worker's cgroup: it is small, outlives the worker, and must survive the job's OOM kill to
record how the job ended.

``detect`` picks the hierarchy once at worker start: a pure v2 host (``cgroup.controllers``
at the mount) gets ``V2``, a v1 or hybrid host with the freezer mounted ``V1``; ``off``, a
worker that is not root, or a hierarchy it cannot write gives ``Unconfined`` with a reason
the worker reports (``Confinement=none`` in ``scontrol show node``).  On v2 the worker's
own cgroup is a delegated one (``Delegate=yes``): a cgroup with processes cannot enable
controllers for children, so the worker first moves itself into a leaf ``worker`` beside the
jobs' subtree.

All file access goes through a ``CgroupFs``, so tests run the v2 code against
``tests/fake_cgroup2.py``, an in-memory model of the kernel's rules, and the BPF program
through a small interpreter.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from .bpfdev import attach_device_program, device_program

log = logging.getLogger("gpud.worker.cgroups")

MODES = ("auto", "v2", "v1", "off")
V2_MOUNT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("freezer", "memory", "cpuset", "pids", "devices", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpuset")
JOB_NAME = re.compile(r"^job_(\d+)_(\d+)$")
BATCH = "batch"


def job_name(job_id: int, attempt: int) -> str:
    return f"job_{job_id}_{attempt}"


def step_name(step: int | None) -> str:
    return BATCH if step is None else f"step_{step}"


@dataclass(frozen=True)
class Limits:
    """What one job may use; None or () leaves that resource unconfined."""

    cpus: tuple[int, ...] = ()
    mem_bytes: int | None = None
    pids_max: int | None = None
    # fenced character majors -> the minors the job may open (gpud.gpu.devices.GpuDevices.allowed)
    devices: dict[int, frozenset[int]] | None = None
    # every (major, minor) of the node's GPUs, for the v1 deny list
    known_devices: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Usage:
    """A cgroup's accounting: peak memory in bytes, CPU time in microseconds, OOM kills."""

    max_rss: int | None = None
    cpu_usec: int | None = None
    oom_kills: int = 0

    def to_dict(self) -> dict:
        return {"max_rss": self.max_rss, "cpu_usec": self.cpu_usec, "oom_kills": self.oom_kills}


class CgroupError(OSError):
    pass


# -- file access ---------------------------------------------------------------------------------

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


# -- the adapters ----------------------------------------------------------------------------------

class Cgroups:
    """Confinement through one hierarchy; this base class confines nothing (``Unconfined``)."""

    kind = "none"

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        self.missing: list[str] = []    # controllers that are not available

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def describe(self) -> str:
        if not self.active:
            return f"jobs are not confined: {self.reason}"
        extra = f" (not available: {', '.join(self.missing)})" if self.missing else ""
        return f"jobs confined with cgroup {self.kind} under {self.base}{extra}"

    base = ""

    def create(self, name: str, limits: Limits) -> None:
        """The job's cgroup with its limits (and its batch step)."""

    def step(self, name: str, step: str) -> list[str]:
        """Create the step's cgroup; the files a process writes its pid into to join it."""
        return []

    def pids(self, name: str) -> list[int]:
        return []

    def populated(self, name: str) -> bool:
        return False

    def signal(self, name: str, sig: int) -> int:
        """Send ``sig`` to every process of the job; how many got it."""
        sent = 0
        for pid in self.pids(name):
            try:
                os.kill(pid, sig)
                sent += 1
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    def kill(self, name: str) -> None:
        """SIGKILL every process of the job, forks in flight included."""

    def usage(self, name: str, step: str | None = None) -> Usage:
        return Usage()

    def steps(self, name: str) -> list[str]:
        """The job's step cgroups (batch, step_N)."""
        try:
            path = _join(self.base, name)
            return sorted(c for c in self.fs.listdir(path) if self.fs.isdir(_join(path, c)))
        except (OSError, AttributeError):
            return []

    def remove(self, name: str) -> bool:
        """Remove the job's (empty) cgroups; False while processes remain."""
        return True

    def jobs(self) -> list[str]:
        """The job cgroups that exist under the worker's subtree."""
        return []

    def exists(self, name: str) -> bool:
        return False

    def close(self) -> None:
        """The worker stops: remove the jobs' subtree if no job is left in it."""


class Unconfined(Cgroups):
    pass


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
        here = _join(mount, own)
        if own in ("", "/"):
            parent = mount   # not under a service manager: the root may hold processes
        else:
            if os.path.basename(here.rstrip("/")) == "worker":   # put there by an earlier start
                parent = os.path.dirname(here.rstrip("/"))
            else:
                parent = here
                leaf = _join(parent, "worker")
                if not fs.exists(leaf):
                    fs.mkdir(leaf)
                # every process of the unit (the fork server, wrappers) goes to the leaf
                for p in _procs(fs, parent):
                    try:
                        fs.write(_join(leaf, "cgroup.procs"), str(p))
                    except OSError as e:
                        if e.errno != errno.ESRCH:
                            raise
                fs.write(_join(leaf, "cgroup.procs"), str(pid))
        self = cls(_join(parent, tag), fs, attach=attach)
        available = set(fs.read(_join(parent, "cgroup.controllers")).split())
        self.controllers = {c for c in V2_CONTROLLERS if c in available}
        self.missing = [c for c in V2_CONTROLLERS if c not in available]
        self._enable(parent)
        if not fs.exists(self.base):
            fs.mkdir(self.base)
        self._enable(self.base)
        return self

    def _enable(self, path: str) -> None:
        if self.controllers:
            self.fs.write(_join(path, "cgroup.subtree_control"),
                          " ".join(f"+{c}" for c in sorted(self.controllers)))

    def _dir(self, name: str, *parts: str) -> str:
        return _join(self.base, name, *parts)

    def create(self, name: str, limits: Limits) -> None:
        path = self._dir(name)
        _mkdir(self.fs, path)
        c = self.controllers
        if "cpuset" in c and limits.cpus:
            self.fs.write(_join(path, "cpuset.cpus"), _cpulist(limits.cpus))
        if "memory" in c and limits.mem_bytes:
            self.fs.write(_join(path, "memory.max"), str(limits.mem_bytes))
            if self.fs.exists(_join(path, "memory.swap.max")):
                self.fs.write(_join(path, "memory.swap.max"), "0")
        if "pids" in c and limits.pids_max:
            self.fs.write(_join(path, "pids.max"), str(limits.pids_max))
        if limits.devices is not None:
            self._attach(path, device_program(limits.devices))
        self._enable(path)    # per-step accounting

    def step(self, name: str, step: str) -> list[str]:
        path = self._dir(name, step)
        _mkdir(self.fs, path)
        return [_join(path, "cgroup.procs")]

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._dir(name))

    def pids(self, name: str) -> list[int]:
        return _procs_tree(self.fs, self._dir(name))

    def populated(self, name: str) -> bool:
        path = self._dir(name)
        try:
            events = _keyed(self.fs.read(_join(path, "cgroup.events")))
        except FileNotFoundError:
            return False
        return events.get("populated", 0) == 1

    def kill(self, name: str) -> None:
        path = self._dir(name)
        if not self.fs.exists(path):
            return
        if self.fs.exists(_join(path, "cgroup.kill")):
            self.fs.write(_join(path, "cgroup.kill"), "1")
            return
        # kernels before 5.14: freeze, kill, thaw
        self.fs.write(_join(path, "cgroup.freeze"), "1")
        try:
            for pid in self.pids(name):
                _sigkill(pid)
        finally:
            self.fs.write(_join(path, "cgroup.freeze"), "0")

    def usage(self, name: str, step: str | None = None) -> Usage:
        path = self._dir(name, step) if step else self._dir(name)
        peak = _read_int(self.fs, _join(path, "memory.peak"))
        if peak is None:
            peak = _read_int(self.fs, _join(path, "memory.current"))
        try:
            cpu = _keyed(self.fs.read(_join(path, "cpu.stat"))).get("usage_usec")
        except OSError:
            cpu = None
        try:
            oom = _keyed(self.fs.read(_join(path, "memory.events"))).get("oom_kill", 0)
        except OSError:
            oom = 0
        return Usage(peak, cpu, oom)

    def remove(self, name: str) -> bool:
        try:   # the usual job: its batch step only, removed without listing anything
            self.fs.rmdir(self._dir(name, BATCH))
        except OSError:
            pass
        return _remove_tree(self.fs, self._dir(name))

    def close(self) -> None:
        if not self.jobs():
            _remove_tree(self.fs, self.base)

    def jobs(self) -> list[str]:
        try:
            return sorted(n for n in self.fs.listdir(self.base) if JOB_NAME.match(n))
        except OSError:
            return []


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
            parent = _join(mount_point, rel)
            base = _join(parent, tag)
            if not fs.exists(base):
                fs.mkdir(base)
            if ctrl == "cpuset":
                _copy_cpuset(fs, parent, base)
            bases[ctrl] = base
        return cls(bases, fs)

    def _dirs(self, name: str, *parts: str) -> dict[str, str]:
        return {c: _join(b, name, *parts) for c, b in self.bases.items()}

    def create(self, name: str, limits: Limits) -> None:
        self._flat.add(name)
        for ctrl, path in self._dirs(name).items():
            _mkdir(self.fs, path)
            if ctrl == "cpuset":
                _copy_cpuset(self.fs, self.bases[ctrl], path)
                if limits.cpus:
                    self.fs.write(_join(path, "cpuset.cpus"), _cpulist(limits.cpus))
            elif ctrl == "memory" and limits.mem_bytes:
                self.fs.write(_join(path, "memory.limit_in_bytes"), str(limits.mem_bytes))
                if self.fs.exists(_join(path, "memory.memsw.limit_in_bytes")):
                    self.fs.write(_join(path, "memory.memsw.limit_in_bytes"), str(limits.mem_bytes))
                elif self.fs.exists(_join(path, "memory.swappiness")):
                    self.fs.write(_join(path, "memory.swappiness"), "0")
            elif ctrl == "pids" and limits.pids_max:
                self.fs.write(_join(path, "pids.max"), str(limits.pids_max))
            elif ctrl == "devices" and limits.devices is not None:
                for major, minor in limits.known_devices:
                    if minor not in limits.devices.get(major, frozenset({minor})):
                        self.fs.write(_join(path, "devices.deny"), f"c {major}:{minor} rwm")

    def step(self, name: str, step: str) -> list[str]:
        if step == BATCH:   # v1 lets the job's own cgroup hold it: half the cgroups per job
            return [_join(path, "cgroup.procs") for path in self._dirs(name).values()]
        self._flat.discard(name)
        out = []
        for ctrl, path in self._dirs(name, step).items():
            _mkdir(self.fs, path)
            if ctrl == "cpuset":
                _copy_cpuset(self.fs, os.path.dirname(path), path)
            out.append(_join(path, "cgroup.procs"))
        return out

    def exists(self, name: str) -> bool:
        return self.fs.exists(_join(self.base, name))

    def pids(self, name: str) -> list[int]:
        if name in self._flat:
            return _procs(self.fs, _join(self.base, name))
        return _procs_tree(self.fs, _join(self.base, name))

    def populated(self, name: str) -> bool:
        return bool(self.pids(name))

    def kill(self, name: str) -> None:
        path = _join(self.base, name)
        if not self.fs.exists(path):
            return
        state = _join(path, "freezer.state")
        self.fs.write(state, "FROZEN")
        try:
            deadline = time.monotonic() + 1.0   # FREEZING while a task finishes a syscall
            while self.fs.read(state).strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)
            for pid in self.pids(name):
                _sigkill(pid)
        finally:
            self.fs.write(state, "THAWED")

    def steps(self, name: str) -> list[str]:
        return [BATCH] + super().steps(name)

    def usage(self, name: str, step: str | None = None) -> Usage:
        parts = (name, step) if step and step != BATCH else (name,)
        mem = self.bases.get("memory")
        acct = self.bases.get("cpuacct")
        peak = _read_int(self.fs, _join(mem, *parts, "memory.max_usage_in_bytes")) if mem else None
        oom = 0
        if mem and name in self._flat and step in (None, BATCH):
            oom = _keyed(_read_or_empty(self.fs, _join(mem, name, "memory.oom_control"))).get("oom_kill", 0)
        elif mem:
            oom = _oom_kills_v1(self.fs, _join(mem, *parts))
        ns = _read_int(self.fs, _join(acct, *parts, "cpuacct.usage")) if acct else None
        return Usage(peak, None if ns is None else ns // 1000, oom)

    def remove(self, name: str) -> bool:
        ok = True
        for path in self._dirs(name).values():
            ok = _remove_tree(self.fs, path) and ok
        if ok:
            self._flat.discard(name)
        return ok

    def close(self) -> None:
        if not self.jobs():
            for path in self.bases.values():
                _remove_tree(self.fs, path)

    def jobs(self) -> list[str]:
        try:
            return sorted(n for n in self.fs.listdir(self.base) if JOB_NAME.match(n))
        except OSError:
            return []


def subtree_name(node: str, state_dir: str) -> str:
    """The jobs' subtree of one worker: its node and state directory (stable across its
    restarts, distinct for two workers on one host, as in tests)."""
    digest = hashlib.sha1(os.path.abspath(state_dir).encode()).hexdigest()[:8]
    return f"gpud-{_safe(node)}-{digest}"


def detect(mode: str, tag: str, *, euid: int | None = None, mount: str = V2_MOUNT,
           fs: CgroupFs | None = None) -> Cgroups:
    """The confinement for ``[worker] cgroups = mode`` with the jobs' subtree named ``tag``
    (``subtree_name``); never raises (Unconfined says why)."""
    if mode == "off":
        return Unconfined('turned off by [worker] cgroups = "off"')
    if (os.geteuid() if euid is None else euid) != 0:
        return Unconfined("the worker does not run as root")
    fs = fs or RealFs()
    pure_v2 = fs.exists(_join(mount, "cgroup.controllers"))
    want = mode if mode != "auto" else ("v2" if pure_v2 else "v1")
    try:
        if want == "v2":
            if not fs.exists(_join(mount, "cgroup.controllers")):
                return Unconfined(f"no cgroup v2 hierarchy at {mount}")
            return V2.setup(tag, mount, fs)
        return V1.setup(tag, fs)
    except OSError as e:
        return Unconfined(f"cannot set up cgroup {want}: {e.strerror or e}")


# -- helpers ---------------------------------------------------------------------------------------

def _join(*parts: str) -> str:
    out = parts[0].rstrip("/") or "/"
    for p in parts[1:]:
        p = p.strip("/")
        if p:
            out = out.rstrip("/") + "/" + p
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100]


def _cpulist(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _mkdir(fs: CgroupFs, path: str) -> None:
    """A cgroup that may exist already (an adopted job; two tasks of one srun step at once)."""
    try:
        fs.mkdir(path)
    except FileExistsError:
        pass


def _read_or_empty(fs: CgroupFs, path: str) -> str:
    try:
        return fs.read(path)
    except OSError:
        return ""


def _read_int(fs: CgroupFs, path: str) -> int | None:
    try:
        text = fs.read(path).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _procs(fs: CgroupFs, path: str) -> list[int]:
    try:
        return [int(x) for x in fs.read(_join(path, "cgroup.procs")).split() if x.isdigit()]
    except FileNotFoundError:
        return []


def _procs_tree(fs: CgroupFs, path: str) -> list[int]:
    out = _procs(fs, path)
    try:
        children = [c for c in fs.listdir(path) if fs.isdir(_join(path, c))]
    except OSError:
        return out
    for c in children:
        out += _procs_tree(fs, _join(path, c))
    return out


def _remove_tree(fs: CgroupFs, path: str) -> bool:
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
        children = [c for c in fs.listdir(path) if fs.isdir(_join(path, c))]
    except OSError:
        children = []
    if not children or not all([_remove_tree(fs, _join(path, c)) for c in children]):
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


def _oom_kills_v1(fs: CgroupFs, path: str) -> int:
    """v1 counts an OOM kill in the cgroup of the killed process only: add up the subtree."""
    try:
        n = _keyed(fs.read(_join(path, "memory.oom_control"))).get("oom_kill", 0)
        children = [c for c in fs.listdir(path) if fs.isdir(_join(path, c))]
    except OSError:
        return 0
    return n + sum(_oom_kills_v1(fs, _join(path, c)) for c in children)


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _copy_cpuset(fs: CgroupFs, parent: str, child: str) -> None:
    """v1 starts a cpuset empty: it takes no task until it has CPUs and memory nodes."""
    for f in ("cpuset.mems", "cpuset.cpus"):
        if not fs.read(_join(child, f)).strip():
            fs.write(_join(child, f), fs.read(_join(parent, f)).strip())


def _own_v2_path(cgroup_file: str = "/proc/self/cgroup") -> str:
    with open(cgroup_file, encoding="ascii", errors="replace") as f:
        for line in f:
            hid, _, rest = line.rstrip("\n").partition(":")
            ctrls, _, path = rest.partition(":")
            if hid == "0" and ctrls == "":
                return path
    raise CgroupError(errno.ENOENT, "the worker is in no cgroup v2")


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


@dataclass
class Sampler:
    """Peak memory and CPU time per job, sampled while it runs (v1 reports no peak per
    step, and a job's last reading must survive the removal of its cgroup)."""

    cgroups: Cgroups
    last: dict[str, Usage] = field(default_factory=dict)

    def sample(self, name: str) -> Usage:
        now = self.cgroups.usage(name)
        old = self.last.get(name)
        if old is not None:
            now = Usage(_max(old.max_rss, now.max_rss), _max(old.cpu_usec, now.cpu_usec),
                        max(old.oom_kills, now.oom_kills))
        self.last[name] = now
        return now

    def forget(self, name: str) -> Usage | None:
        return self.last.pop(name, None)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
