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

This module is the interface the executor uses (``Cgroups``; ``Unconfined`` confines
nothing), ``detect`` and the accounting ``Sampler``; the hierarchies are ``cgroup_v2.py``
and ``cgroup_v1.py``.  All their file access goes through a ``CgroupFs``
(``cgroupfs.py``), so tests run the v2 code against ``tests/fake_cgroup2.py``, an
in-memory model of the kernel's rules, and the BPF program through a small interpreter.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field

from .cgroupfs import CgroupFs, RealFs, join

log = logging.getLogger("gpud.worker.cgroups")

MODES = ("auto", "v2", "v1", "off")
V2_MOUNT = "/sys/fs/cgroup"
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
            path = join(self.base, name)
            return sorted(c for c in self.fs.listdir(path) if self.fs.isdir(join(path, c)))
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
    pure_v2 = fs.exists(join(mount, "cgroup.controllers"))
    want = mode if mode != "auto" else ("v2" if pure_v2 else "v1")
    try:
        if want == "v2":
            if not fs.exists(join(mount, "cgroup.controllers")):
                return Unconfined(f"no cgroup v2 hierarchy at {mount}")
            from .cgroup_v2 import V2   # here, not at the top: the backends import this module

            return V2.setup(tag, mount, fs)
        from .cgroup_v1 import V1

        return V1.setup(tag, fs)
    except OSError as e:
        return Unconfined(f"cannot set up cgroup {want}: {e.strerror or e}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100]


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
