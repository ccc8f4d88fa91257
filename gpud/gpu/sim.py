"""Simulated GPUs, described by a spec like ``8xH100-80GB`` or ``4xA100-80GB,2xA30-24GB``.

Theory of operation
-------------------
A spec is a comma-joined list of ``COUNTxMODEL`` groups; GPUs are numbered in spec order.
A model is ``<family>-<N>GB`` (``H100-80GB``, ``H200-141GB``, ``L40S-48GB``, any name of
that shape) and its memory is ``N`` GiB.  Each simulated GPU gets a UUID derived from
(node, index, model), so it is stable across restarts of the same worker and unique across
nodes, exactly like a real board's UUID would be.  An optional suffix wires them:
``8xH100-80GB@islands4`` (NVLink islands and NUMA nodes: gpud.gpu.topology).

Telemetry: a simulated GPU is as busy as the job on it says it is.  A job declares its
utilization in its environment, ``GPUD_SIM_UTIL=85`` (percent; ``90,0`` gives its first GPU
90 and the rest 0: the last value repeats), and optionally its memory per GPU,
``GPUD_SIM_MEM_MB=20000``.  A job that declares nothing keeps its GPUs fully busy; a GPU
without a job is idle.  Power follows utilization between a tenth of the board's TDP and
all of it, and the energy counter integrates that power on the backend's clock.

MIG: a simulated GPU whose model is in the MIG catalog (gpud.gpu.mig) can be cut into
slices under the same rules as the hardware: MIG mode must be on; a slice must start at one
of its profile's placements and fit beside the others (``validate_layout``); a slice that
a job uses cannot be destroyed, and MIG mode cannot change while anything on the GPU is in
use or, to turn it off, while slices exist.  What jobs use comes from ``note_in_use``.  A
slice's UUID is derived from (node, GPU, start, profile), so re-creating the same slice
gives the same ``MIG-...`` UUID.  The state lives in memory only: a new backend starts with
MIG off everywhere, as an H100 does after a reboot, and the worker re-applies its configured
modes.  A mode change takes effect at once on every model (on a real A100 or A30 it waits
for a GPU reset, which the worker cannot do for the sim's GPUs anyway).

Device nodes (``devices_dir``, ``gpud worker --sim-devices DIR``): the backend makes
character devices like the driver's, ``DIR/nvidia<index>`` (195:<index>) and
``DIR/nvidiactl`` (195:255), and for MIG slices ``DIR/nvidia-caps/nvidia-cap<N>`` under a
character major that no driver of this host uses.  No driver answers behind them (opening
one that the job may open fails with ENXIO), but the kernel's device cgroup checks come
first, so a job's device fence (gpud.worker.cgroups) is tested for real without a GPU.
"""

from __future__ import annotations

import math
import os
import re
import stat
import time
import uuid
from typing import Callable, Iterable, Mapping, Sequence

from ..model import GpuInfo, SliceInfo
from . import mig, topology
from .backend import (Assignment, DeviceUse, GpuError, GpuInUseError, GpuSample, MigRefusedError,
                      SimSpecError)
from .devices import NVIDIA_MAJOR, GpuDevices, caps_major

MAX_GPUS = 1024  # far beyond any real host; stops a typo from creating millions of GPUs

# A fixed namespace makes the UUIDs reproducible everywhere.
_UUID_NAMESPACE = uuid.UUID("6f1c2a8e-3d4b-5c6d-8e7f-0a1b2c3d4e5f")

_GROUP = re.compile(r"^(\d+)\s*[xX]\s*(\S+)$")
_MODEL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*)-(\d+)[gG][bB]$")
_USAGE = "use COUNTxMODEL[,COUNTxMODEL...], e.g. 8xH100-80GB"

SIM_UTIL_ENV = "GPUD_SIM_UTIL"
SIM_MEM_ENV = "GPUD_SIM_MEM_MB"
SIM_DEFAULT_UTIL = 100.0      # a job that declares nothing keeps its GPUs busy
# Board power in watts by family (a simulated board draws a tenth of it when idle).
SIM_TDP_W = {"H100": 700.0, "H200": 700.0, "B200": 1000.0, "A100": 400.0, "A30": 165.0,
             "A10": 150.0, "L40S": 350.0, "L40": 300.0, "L4": 72.0, "V100": 300.0}
SIM_DEFAULT_TDP_W = 300.0


def parse_model(model: str) -> tuple[str, int]:
    """(family, GiB) of a model name such as ``H100-80GB``; ValueError otherwise."""
    m = _MODEL.match(model)
    if not m or int(m.group(2)) <= 0:
        raise ValueError(f"invalid GPU model {model!r}: use NAME-<N>GB, e.g. H100-80GB")
    return m.group(1), int(m.group(2))


def parse_spec(spec: str) -> list[str]:
    """The model of each simulated GPU, in index order; SimSpecError with one line.

    An ``@TOPOLOGY`` suffix (gpud.gpu.topology) is checked here and left to ``SimBackend``."""
    if not isinstance(spec, str) or not spec.strip():
        raise SimSpecError(f"invalid --sim spec {spec!r}: {_USAGE}")
    groups, suffix = topology.split_spec(spec)
    models: list[str] = []
    for group in groups.split(","):
        m = _GROUP.match(group.strip())
        if not m:
            raise SimSpecError(f"invalid --sim spec {spec!r}: {_USAGE}")
        count, model = int(m.group(1)), m.group(2)
        try:
            family, gib = parse_model(model)
        except ValueError as e:
            raise SimSpecError(f"invalid --sim spec {spec!r}: {e}") from None
        if count <= 0:
            raise SimSpecError(f"invalid --sim spec {spec!r}: a GPU count must be at least 1")
        models.extend([f"{family}-{gib}GB"] * count)
        if len(models) > MAX_GPUS:
            raise SimSpecError(f"invalid --sim spec {spec!r}: at most {MAX_GPUS} GPUs per node")
    try:
        topology.parse_topology(suffix, models)
    except ValueError as e:
        raise SimSpecError(f"invalid --sim spec {spec!r}: {e}") from None
    return models


def sim_uuid(node: str, index: int, model: str) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}\x00{index}\x00{model}"))


def sim_mig_uuid(node: str, index: int, start: int, profile: str) -> str:
    return "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}\x00{index}\x00{start}\x00{profile}"))


class SimBackend:
    """GPUs that exist only on paper, with the same contract as the NVML backend."""

    name = "sim"

    def __init__(self, spec: str, node: str, *, clock: Callable[[], float] = time.monotonic,
                 devices_dir: str | None = None) -> None:
        self.spec = spec
        self.devices_dir = devices_dir
        self.node = node
        self._clock = clock
        self._last: tuple[float, list[float]] | None = None   # (time, power per GPU) of the last sample
        models = parse_spec(spec)
        self._gpus = topology.apply(
            (GpuInfo(index=i, uuid=sim_uuid(node, i, model), model=model,
                     memory_mb=parse_model(model)[1] * 1024) for i, model in enumerate(models)),
            topology.sim_wiring(models, topology.split_spec(spec)[1]))
        self._energy_mj = [0.0] * len(self._gpus)   # per GPU, integrated at each sample
        self._mig_on = [False] * len(self._gpus)
        self._slices: list[dict[int, SliceInfo]] = [{} for _ in self._gpus]   # by start slot
        self._in_use: frozenset[DeviceUse] = frozenset()
        self._closed = False

    def discover(self) -> list[GpuInfo]:
        if self._closed:
            raise RuntimeError("sim GPU backend used after close()")
        return list(self._gpus)

    def devices(self) -> GpuDevices | None:
        """The device nodes of the GPUs and slices now (made in ``devices_dir`` when
        missing); None without ``devices_dir``.  GpuError when they cannot be made."""
        if self.devices_dir is None:
            return None
        root = self.devices_dir
        major = self._caps_major()
        caps = {(i, s): sim_cap_minors(i, s) for i, slices in enumerate(self._slices) for s in slices}
        try:
            os.makedirs(root, mode=0o755, exist_ok=True)
            nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(len(self._gpus))}
            nodes["nvidiactl"] = (NVIDIA_MAJOR, 255)
            if caps:
                os.makedirs(os.path.join(root, "nvidia-caps"), mode=0o755, exist_ok=True)
                for ms in caps.values():
                    for m in ms:
                        nodes[f"nvidia-caps/nvidia-cap{m}"] = (major, m)
            for name, (ma, mi) in nodes.items():
                _char_device(os.path.join(root, name), ma, mi)
        except OSError as e:
            raise GpuError(f"cannot make the simulated GPUs' device nodes in {root}: {e.strerror}") from None
        return GpuDevices(minors={i: i for i in range(len(self._gpus))}, caps=caps, caps_major=major,
                          paths={i: os.path.join(root, f"nvidia{i}") for i in range(len(self._gpus))})

    def _caps_major(self) -> int:
        """A character major for the simulated caps: the host's nvidia-caps one if it has
        one, else the highest free one of the local/experimental range (240-254)."""
        real = caps_major()
        if real is not None:
            return real
        try:
            with open("/proc/devices", encoding="ascii", errors="replace") as f:
                used = {int(p[0]) for p in (line.split() for line in f.read().split("Block devices:")[0].splitlines())
                        if len(p) == 2 and p[0].isdigit()}
        except OSError:
            used = set()
        return next((m for m in range(254, 239, -1) if m not in used), 254)

    def sample(self, assignments: Sequence[Assignment]) -> list[GpuSample]:
        if self._closed:
            raise RuntimeError("sim GPU backend used after close()")
        util = [0.0] * len(self._gpus)
        mem = [0] * len(self._gpus)
        for a in assignments:
            utils = declared_util(a.env)
            mem_mb = _declared_int(a.env.get(SIM_MEM_ENV))
            for n, index in enumerate(a.gpus):
                if not 0 <= index < len(self._gpus):
                    continue
                u = utils[min(n, len(utils) - 1)]
                util[index] = min(100.0, util[index] + u)   # shared GPUs add up, to a point
                total = self._gpus[index].memory_mb
                used = mem_mb if mem_mb is not None else int(total * u / 200)
                mem[index] = min(total, mem[index] + used)
        now = self._clock()
        power = [_tdp(g.model) * (0.1 + 0.9 * u / 100) for g, u in zip(self._gpus, util)]
        if self._last is not None:
            elapsed = max(0.0, now - self._last[0])
            for i, p in enumerate(self._last[1]):
                self._energy_mj[i] += p * elapsed * 1000
        self._last = (now, power)
        return [
            GpuSample(index=g.index, uuid=g.uuid, util=round(u, 1), mem_used_mb=m,
                      power_w=round(p, 1), temp_c=round(30 + 0.5 * u, 1), energy_mj=int(e))
            for g, u, m, p, e in zip(self._gpus, util, mem, power, self._energy_mj)
        ]

    # -- MIG -----------------------------------------------------------------------------------

    def mig_state(self, index: int) -> tuple[bool, tuple[SliceInfo, ...]]:
        self._gpu(index)
        slices = self._slices[index]
        return self._mig_on[index], tuple(slices[s] for s in sorted(slices))

    def possible_placements(self, index: int, profile: str) -> list[mig.Placement]:
        g = self._mig_gpu(index)
        try:
            return list(mig.catalog(g.model)[mig.parse_profile(profile, g.model)].placements)
        except mig.MigError as e:
            raise MigRefusedError(f"GPU {index}: {e}") from None

    def create_slice(self, index: int, profile: str, start: int) -> SliceInfo:
        g = self._mig_gpu(index)
        if not self._mig_on[index]:
            raise MigRefusedError(f"GPU {index}: MIG mode is off; turn it on before creating slices")
        slices = self._slices[index]
        try:
            name = mig.parse_profile(profile, g.model)
            wanted = mig.Slice(name, start)
            mig.validate_layout(g.model, [mig.Slice(s.profile, s.start) for s in slices.values()]
                                + [wanted])
        except mig.MigError as e:
            raise MigRefusedError(f"GPU {index}: {e}") from None
        made = SliceInfo(profile=name, start=start, uuid=sim_mig_uuid(self.node, index, start, name),
                         memory_mb=mig.catalog(g.model)[name].memory_mb)
        slices[start] = made
        return made

    def destroy_slice(self, index: int, start: int) -> None:
        self._mig_gpu(index)
        found = self._slices[index].get(start)
        if found is None:
            raise MigRefusedError(f"GPU {index}: no MIG slice starts at memory slot {start}")
        if (index, start) in self._in_use:
            raise GpuInUseError(f"GPU {index}: MIG slice {found.profile} at slot {start} is in use")
        del self._slices[index][start]

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self._mig_gpu(index)
        if self._mig_on[index] == enabled:
            return
        if any(i == index for i, _ in self._in_use):
            raise GpuInUseError(f"GPU {index} is in use; MIG mode changes only on an idle GPU")
        if self._slices[index]:
            raise GpuInUseError(f"GPU {index} still has MIG slices; destroy them before "
                                "turning MIG off")
        self._mig_on[index] = enabled

    def note_in_use(self, devices: Iterable[DeviceUse]) -> None:
        self._in_use = frozenset(devices)

    def _gpu(self, index: int) -> GpuInfo:
        if self._closed:
            raise RuntimeError("sim GPU backend used after close()")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise MigRefusedError(f"no GPU {index!r} on {self.node}")
        return self._gpus[index]

    def _mig_gpu(self, index: int) -> GpuInfo:
        g = self._gpu(index)
        if not mig.supports_mig(g.model):
            raise MigRefusedError(f"GPU {index} ({g.model}) does not support MIG")
        return g

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"SimBackend({self.spec!r}, node={self.node!r})"


def declared_util(env: Mapping[str, str]) -> list[float]:
    """The per-GPU utilization a job declares in ``GPUD_SIM_UTIL``; the default when it
    declares nothing usable."""
    raw = env.get(SIM_UTIL_ENV)
    if raw is None:
        return [SIM_DEFAULT_UTIL]
    out = []
    for word in str(raw).split(","):
        try:
            v = float(word)
        except ValueError:
            return [SIM_DEFAULT_UTIL]
        if not math.isfinite(v):
            return [SIM_DEFAULT_UTIL]
        out.append(max(0.0, min(100.0, v)))
    return out or [SIM_DEFAULT_UTIL]


def _declared_int(raw: str | None) -> int | None:
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


def _tdp(model: str) -> float:
    return SIM_TDP_W.get(model.split("-")[0], SIM_DEFAULT_TDP_W)


def sim_cap_minors(index: int, start: int) -> tuple[int, int]:
    """The simulated caps of the slice at ``start`` on GPU ``index``: its GPU instance's and
    its compute instance's (the driver numbers them from 3; 1 and 2 are config and monitor)."""
    gi = 3 + 2 * (index * 16 + start)
    return gi, gi + 1


def _char_device(path: str, major: int, minor: int) -> None:
    """A character device node ``major:minor`` at ``path``, replacing anything else there."""
    want = os.makedev(major, minor)
    try:
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mknod(path, 0o666 | stat.S_IFCHR, want)
    os.chmod(path, 0o666)
