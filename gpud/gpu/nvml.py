"""Real GPUs through NVML (pynvml from nvidia-ml-py).  The only module that imports pynvml.

Theory of operation
-------------------
``NvmlBackend`` initialises NVML once and keeps it open until ``close``; discovery only
reads (count, handle, UUID, name, memory; and once, the NUMA nodes and NVLink peers that
gpud.gpu.topology reads).  Marketing names are turned into the short model names that
users type in ``--gpu-type`` and admins use for billing weights::

    "NVIDIA H100 80GB HBM3"  -> "H100-80GB"
    "NVIDIA A100-SXM4-40GB"  -> "A100-40GB"
    "NVIDIA H200" (141 GB)   -> "H200-141GB"

When the name carries no size, the size comes from the memory NVML reports.  Drivers
report less than the marketed size (ECC and firmware reservations: an H200 shows ~140.4
GiB, an L40S ~45 GiB), so the measured GiB is rounded up to the next marketed size.

pynvml returns ``bytes`` in old releases and ``str`` in new ones; both are accepted.  A GPU
that fails to answer (say, "GPU is lost") is left out with a warning rather than taking the
whole node down with it.

Telemetry (``sample``) reads utilization, memory, power, temperature, the energy counter and
the compute processes of each GPU, and for a GPU in MIG mode the memory and processes of
each slice (NVML has no utilization for slices).  Any one reading the board does not
support is None; only a GPU that cannot be reached at all is left out of the sample.

MIG goes through NVML's two levels.  A *GPU instance* is created at an explicit placement
(``nvmlDeviceCreateGpuInstanceWithPlacement``) with the driver's id for the profile, which
``nvmlDeviceGetGpuInstanceProfileInfo`` gives for each ``NVML_GPU_INSTANCE_PROFILE_*``
constant the catalog names (gpud.gpu.mig); one *compute instance* spanning it makes it a
MIG device with its own ``MIG-...`` UUID.  A slice is the pair, and is destroyed the other
way round (compute instances, then the GPU instance); the driver answers IN_USE while
processes run on it.  Listing walks every profile's GPU instances and matches each to its
MIG device by instance id.  A GPU instance left without a compute instance (a crash
between the two calls, or made by hand) is listed with an empty UUID so the worker can
replace it.  A creation the driver refuses is explained with the catalog's rules, so the
operator reads "3g.40gb at slot 4 overlaps ..." rather than "Insufficient resources".
"""

from __future__ import annotations

import ctypes
import logging
import math
import re
from typing import Any, Callable, Iterable, Sequence

from ..model import GpuInfo, SliceInfo
from . import mig, topology
from .backend import (NO_DRIVER_MESSAGE, Assignment, DeviceUse, GpuError, GpuInUseError, GpuSample,
                      MigRefusedError, NoGpuError, ResetRequiredError, SliceSample)
from .devices import GpuDevices, caps_major

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"   # "gpu<minor>/gi<id>[/ci<id>]/access <cap minor>"
_MIG_MINOR = re.compile(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access\s+(\d+)$")

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30
MAX_PROCS_PER_GPU = 64     # a sample stays small even on a GPU shared by many processes
NVML_TEMPERATURE_GPU = 0   # pynvml's constant, for fakes that lack it
NVML_DEVICE_MIG_ENABLE = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
NVML_ERROR_FUNCTION_NOT_FOUND = 13

# Sizes NVIDIA sells, in GB; a measured size rounds up to the nearest of these.
MARKETED_GB = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96,
               128, 141, 144, 180, 186, 192, 288)
# Words in marketing names that say nothing about which GPU it is.
_NOISE = frozenset({"NVIDIA", "GEFORCE", "TESLA", "QUADRO", "GENERATION"})
# Form factors and memory technologies: the same GPU, packaged differently.
_FORM = re.compile(r"^(SXM\d*|PCIE|HBM\d*E?|NVL|OAM|MXM)$", re.IGNORECASE)
_SIZE = re.compile(r"^(\d+)GB$", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")


def marketed_gb(total_bytes: int) -> int:
    """The marketed size of a board whose driver reports ``total_bytes``."""
    gib = total_bytes / GIB
    for size in MARKETED_GB:
        if size >= gib - 0.01:
            return size
    return math.ceil(gib)


def normalize_model(name: str | bytes, total_bytes: int) -> str:
    """A short ``FAMILY-<N>GB`` model name from NVML's device name and memory size."""
    text = _text(name)
    family: list[str] = []
    size: int | None = None
    for token in re.split(r"[\s\-]+", text):
        if not token or token.upper() in _NOISE or _FORM.match(token):
            continue
        m = _SIZE.match(token)
        if m:
            size = size or int(m.group(1))
            continue
        token = _UNSAFE.sub("", token)
        if token:
            family.append(token)
    if not size:
        size = marketed_gb(total_bytes)
    return f"{'-'.join(family) or 'GPU'}-{size}GB"


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvmlBackend:
    """The GPUs the NVIDIA driver sees on this host."""

    name = "nvml"

    def __init__(self, nvml: Any = None, *, sysfs_root: str = "/sys") -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise NoGpuError(NO_DRIVER_MESSAGE) from None
        self._nvml = nvml
        no_driver = tuple(
            cls for cls in (getattr(nvml, "NVMLError_LibraryNotFound", None),
                            getattr(nvml, "NVMLError_DriverNotLoaded", None))
            if cls is not None
        )
        try:
            nvml.nvmlInit()
        except no_driver:
            raise NoGpuError(NO_DRIVER_MESSAGE) from None
        except nvml.NVMLError as e:
            raise GpuError(f"NVML failed to start: {e}; check the NVIDIA driver with nvidia-smi") from None
        self._open = True
        self._models: dict[int, str] = {}      # index -> model name, for the MIG catalog
        self._profiles: dict[int, dict[str, Any]] = {}   # index -> profile name -> NVML info
        self._sysfs_root = sysfs_root                     # where the GPUs' PCI numa_node is read
        self._wiring: dict[int, topology.Wiring] | None = None   # read once: it does not change
        self._minors: dict[int, int] = {}                 # index -> /dev/nvidia<minor>, read once

    def _live(self) -> Any:
        """The pynvml module, once it is certain this backend is still open."""
        if not self._open:
            raise RuntimeError("NVML GPU backend used after close()")
        return self._nvml

    def discover(self) -> list[GpuInfo]:
        nv = self._live()
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise GpuError(f"NVML cannot count GPUs: {e}; check the NVIDIA driver with nvidia-smi") from None
        gpus: list[GpuInfo] = []
        handles: dict[int, Any] = {}
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                name = nv.nvmlDeviceGetName(handle)
                total = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
            except nv.NVMLError as e:
                log.warning("GPU %d left out: NVML says %s", index, e)
                continue
            gpus.append(GpuInfo(index=index, uuid=uuid, model=normalize_model(name, total),
                                memory_mb=total // MIB))
            self._models[index] = gpus[-1].model
            handles[index] = handle
        if self._wiring is None:
            self._wiring = topology.read_nvml(nv, handles, self._sysfs_root)
        return topology.apply(gpus, self._wiring)

    def sample(self, assignments: Sequence[Assignment] = ()) -> list[GpuSample]:
        """One reading per reachable GPU; ``assignments`` are not needed on real hardware."""
        nv = self._live()
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            log.warning("telemetry: NVML cannot count GPUs: %s", e)
            return []
        out: list[GpuSample] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as e:
                log.debug("telemetry: GPU %d left out: %s", index, e)
                continue
            out.append(self._sample_one(index, uuid, handle))
        return out

    def _sample_one(self, index: int, uuid: str, handle: Any) -> GpuSample:
        nv = self._nvml
        util = self._read(lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
        mem = self._read(lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).used) // MIB)
        power = self._read(lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        temp_kind = getattr(nv, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU)
        temp = self._read(lambda: float(nv.nvmlDeviceGetTemperature(handle, temp_kind)))
        energy = self._read(lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(handle)))
        procs = list(self._procs(handle))
        slices: list[SliceSample] = []
        mig_on = getattr(nv, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE)
        mode = self._read(lambda: nv.nvmlDeviceGetMigMode(handle)[0])
        if mode == mig_on:
            for mh in self._mig_handles(handle):
                s_uuid = self._read(lambda: _text(nv.nvmlDeviceGetUUID(mh)))
                s_mem = self._read(lambda: int(nv.nvmlDeviceGetMemoryInfo(mh).used) // MIB)
                if s_uuid is not None:
                    slices.append(SliceSample(uuid=s_uuid, mem_used_mb=s_mem or 0))
                procs.extend(self._procs(mh))
        return GpuSample(index=index, uuid=uuid, util=util, mem_used_mb=mem, power_w=power,
                         temp_c=temp, energy_mj=energy, slices=tuple(slices),
                         procs=tuple(procs[:MAX_PROCS_PER_GPU]))

    def _read(self, fn: Callable[[], Any]) -> Any:
        """One NVML reading, or None when the board does not offer it."""
        try:
            return fn()
        except (self._nvml.NVMLError, AttributeError, TypeError, ValueError):
            return None

    def _procs(self, handle: Any) -> list[tuple[int, int]]:
        nv = self._nvml
        found = self._read(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        out = []
        for p in found:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) // MIB if isinstance(used, int) else 0))
        return out

    def _mig_handles(self, handle: Any) -> list[Any]:
        nv = self._nvml
        out = []
        for i in range(self._read(lambda: int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))) or 0):
            mh = self._read(lambda: nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            if mh is not None:
                out.append(mh)
        return out

    # -- MIG ---------------------------------------------------------------------------------

    def devices(self, mig_minors: str = MIG_MINORS, proc_devices: str = "/proc/devices") -> GpuDevices:
        """Each GPU's minor (``/dev/nvidia<minor>``) and each MIG slice's capability minors
        (its GPU instance's and its compute instances' ``access`` caps, as the driver lists
        them in ``mig_minors``).  A GPU whose minor NVML will not say keeps its index.
        The executor asks at every launch: minors are read once, MIG caps each time."""
        nv = self._live()
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise GpuError(f"NVML cannot count GPUs: {e}") from None
        handles = {}
        for index in range(count):
            handle = self._read(lambda: nv.nvmlDeviceGetHandleByIndex(index))
            if handle is None:
                continue
            handles[index] = handle
            if index not in self._minors:
                minor = self._read(lambda: int(nv.nvmlDeviceGetMinorNumber(handle)))
                self._minors[index] = index if minor is None else minor
        minors = {i: self._minors[i] for i in handles}
        by_gi: dict[tuple[int, int], list[int]] = {}
        try:
            with open(mig_minors, encoding="ascii", errors="replace") as f:
                for line in f:
                    m = _MIG_MINOR.match(line.strip())
                    if m:
                        by_gi.setdefault((int(m.group(1)), int(m.group(2))), []).append(int(m.group(4)))
        except OSError:
            pass   # no MIG capability devices on this host
        caps: dict[tuple[int, int], tuple[int, ...]] = {}
        for index, handle in handles.items():
            try:
                on = nv.nvmlDeviceGetMigMode(handle)[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE)
            except nv.NVMLError:
                on = False
            if not on:
                continue
            for _, gi, start in self._instances(index, handle):
                gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
                caps[(index, start)] = tuple(sorted(by_gi.get((minors[index], gi_id), ())))
        return GpuDevices(minors=minors, caps=caps, caps_major=caps_major(proc_devices),
                          paths={i: f"/dev/nvidia{m}" for i, m in minors.items()})

    def mig_state(self, index: int) -> tuple[bool, tuple[SliceInfo, ...]]:
        nv = self._nvml
        handle = self._handle(index)
        try:
            current = nv.nvmlDeviceGetMigMode(handle)[0]
        except nv.NVMLError_NotSupported:
            return False, ()
        except nv.NVMLError as e:
            raise GpuError(f"GPU {index}: NVML cannot read its MIG mode: {e}") from None
        if current != getattr(nv, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE):
            return False, ()
        return True, tuple(sorted(self._list_slices(index, handle), key=lambda s: s.start))

    def possible_placements(self, index: int, profile: str) -> list[mig.Placement]:
        nv = self._nvml
        handle = self._handle(index)
        info = self._profile(index, handle, profile)[1]
        count = ctypes.c_uint(0)
        try:
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
            found = (nv.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, found, ctypes.byref(count))
        except nv.NVMLError as e:
            raise GpuError(f"GPU {index}: NVML cannot list placements of {profile}: {e}") from None
        return sorted(mig.Placement(int(p.start), int(p.size)) for p in found[:count.value])

    def create_slice(self, index: int, profile: str, start: int) -> SliceInfo:
        nv = self._nvml
        handle = self._handle(index)
        p, info = self._profile(index, handle, profile)
        where = nv.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = start, p.memory_slices
        try:
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(where))
        except nv.NVMLError as e:
            raise self._create_refused(index, handle, p, start, e) from None
        try:
            ci_kind = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{p.compute_slices}_SLICE")
            shared = getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
                             NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci_info = self._versioned(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_kind, shared)
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
        except (nv.NVMLError, AttributeError) as e:
            self._undo_instance(index, gi)
            raise GpuError(f"GPU {index}: NVML could not create the compute instance of "
                           f"{p.name} at slot {start}: {e}") from None
        uuid = self._mig_uuids(handle).get(gi_id)
        if uuid is None:
            raise GpuError(f"GPU {index}: the new {p.name} at slot {start} has no MIG device")
        return SliceInfo(profile=p.name, start=start, uuid=uuid, memory_mb=int(info.memorySizeMB))

    def destroy_slice(self, index: int, start: int) -> None:
        nv = self._nvml
        handle = self._handle(index)
        found = next(((p, gi) for p, gi, where in self._instances(index, handle) if where == start), None)
        if found is None:
            raise MigRefusedError(f"GPU {index}: no MIG slice starts at memory slot {start}")
        p, gi = found
        try:
            for ci in self._compute_instances(p, gi):
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError_InUse:
            raise GpuInUseError(f"GPU {index}: MIG slice {p.name} at slot {start} is in use") from None
        except nv.NVMLError as e:
            raise GpuError(f"GPU {index}: NVML could not destroy {p.name} at slot {start}: {e}") from None

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        nv = self._nvml
        handle = self._handle(index)
        on = getattr(nv, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE)
        off = getattr(nv, "NVML_DEVICE_MIG_DISABLE", NVML_DEVICE_MIG_DISABLE)
        want = on if enabled else off
        try:
            current, pending = nv.nvmlDeviceGetMigMode(handle)
            if current == want and pending == want:
                return
            status = nv.nvmlDeviceSetMigMode(handle, want)
        except nv.NVMLError_NotSupported:
            raise MigRefusedError(f"GPU {index} ({self._model(index, handle)}) does not support MIG") from None
        except nv.NVMLError_InUse:
            raise GpuInUseError(f"GPU {index} has MIG slices or processes; MIG mode changes only "
                                "on an idle GPU without slices") from None
        except nv.NVMLError_NoPermission:
            raise GpuError(f"GPU {index}: changing MIG mode needs root") from None
        except nv.NVMLError as e:
            raise GpuError(f"GPU {index}: NVML could not change MIG mode: {e}") from None
        if status == getattr(nv, "NVML_SUCCESS", 0):
            return
        if status == nv.NVML_ERROR_IN_USE:
            # The reset that activates the mode needs an idle GPU; take the request back so a
            # later reset does not switch a GPU the worker no longer wants switched.
            try:
                nv.nvmlDeviceSetMigMode(handle, current)
            except nv.NVMLError as e:
                log.warning("GPU %d: could not withdraw the pending MIG mode: %s", index, e)
            raise GpuInUseError(f"GPU {index} is in use; MIG mode changes only on an idle GPU")
        raise ResetRequiredError(
            f"GPU {index}: MIG mode {'on' if enabled else 'off'} is pending a GPU reset; with the "
            f"GPU idle run `nvidia-smi -r -i {index}` (or reboot), then restart gpud worker")

    def note_in_use(self, devices: Iterable[DeviceUse]) -> None:
        """The driver sees processes by itself."""

    # MIG helpers

    def _handle(self, index: int) -> Any:
        nv = self._live()
        try:
            return nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as e:
            raise GpuError(f"GPU {index}: NVML cannot reach it: {e}") from None

    def _model(self, index: int, handle: Any) -> str:
        if index not in self._models:
            nv = self._nvml
            try:
                self._models[index] = normalize_model(nv.nvmlDeviceGetName(handle),
                                                      int(nv.nvmlDeviceGetMemoryInfo(handle).total))
            except nv.NVMLError as e:
                raise GpuError(f"GPU {index}: NVML cannot read its model: {e}") from None
        return self._models[index]

    def _profiles_of(self, index: int, handle: Any) -> dict[str, Any]:
        """Profile name -> (catalog profile, the driver's profile info) for this GPU."""
        if index not in self._profiles:
            nv = self._nvml
            model = self._model(index, handle)
            if not mig.supports_mig(model):
                raise MigRefusedError(f"GPU {index} ({model}) does not support MIG")
            found: dict[str, Any] = {}
            for p in mig.catalog(model).values():
                kind = getattr(nv, p.nvml_profile, None)
                if kind is None:
                    continue
                try:
                    found[p.name] = (p, self._versioned(nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, kind))
                except nv.NVMLError:
                    continue   # this board or driver does not offer it
            self._profiles[index] = found
        return self._profiles[index]

    def _profile(self, index: int, handle: Any, profile: str) -> tuple[mig.MigProfile, Any]:
        model = self._model(index, handle)
        try:
            name = mig.parse_profile(profile, model)
        except mig.MigError as e:
            raise MigRefusedError(f"GPU {index}: {e}") from None
        found = self._profiles_of(index, handle).get(name)
        if found is None:
            raise MigRefusedError(f"GPU {index}: the driver does not offer MIG profile {name}")
        return found

    def _instances(self, index: int, handle: Any) -> list[tuple[mig.MigProfile, Any, int]]:
        """Every GPU instance: (profile, handle, start slot)."""
        nv = self._nvml
        out = []
        for p, info in self._profiles_of(index, handle).values():
            count = ctypes.c_uint(0)
            found = (nv.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
            try:
                nv.nvmlDeviceGetGpuInstances(handle, info.id, found, ctypes.byref(count))
                for gi in found[:count.value]:
                    out.append((p, gi, int(nv.nvmlGpuInstanceGetInfo(gi).placement.start)))
            except nv.NVMLError as e:
                raise GpuError(f"GPU {index}: NVML cannot list its {p.name} instances: {e}") from None
        return out

    def _list_slices(self, index: int, handle: Any) -> list[SliceInfo]:
        nv = self._nvml
        uuids = self._mig_uuids(handle)
        by_name = self._profiles_of(index, handle)
        out = []
        for p, gi, start in self._instances(index, handle):
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            out.append(SliceInfo(profile=p.name, start=start, uuid=uuids.get(gi_id, ""),
                                 memory_mb=int(by_name[p.name][1].memorySizeMB)))
        return out

    def _mig_uuids(self, handle: Any) -> dict[int, str]:
        """GPU instance id -> the UUID of its MIG device."""
        nv = self._nvml
        out = {}
        for mh in self._mig_handles(handle):
            gi_id = self._read(lambda: int(nv.nvmlDeviceGetGpuInstanceId(mh)))
            uuid = self._read(lambda: _text(nv.nvmlDeviceGetUUID(mh)))
            if gi_id is not None and uuid:
                out[gi_id] = uuid
        return out

    def _compute_instances(self, p: mig.MigProfile, gi: Any) -> list[Any]:
        nv = self._nvml
        shared = getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
                         NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        out = []
        for slices in range(1, p.compute_slices + 1):
            kind = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
            if kind is None:
                continue
            try:
                info = self._versioned(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, kind, shared)
            except nv.NVMLError:
                continue   # not a split this instance offers
            count = ctypes.c_uint(0)
            found = (nv.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            nv.nvmlGpuInstanceGetComputeInstances(gi, info.id, found, ctypes.byref(count))
            out.extend(found[:count.value])
        return out

    def _versioned(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A profile-info call; drivers older than the v2 structures get version 1."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if getattr(e, "value", None) != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return fn(*args, 1)

    def _undo_instance(self, index: int, gi: Any) -> None:
        try:
            self._nvml.nvmlGpuInstanceDestroy(gi)
        except self._nvml.NVMLError as e:
            log.warning("GPU %d: could not remove a half-made MIG instance: %s", index, e)

    def _create_refused(self, index: int, handle: Any, p: mig.MigProfile, start: int,
                        e: Exception) -> GpuError:
        nv = self._nvml
        if isinstance(e, nv.NVMLError_NotSupported):
            return MigRefusedError(f"GPU {index}: MIG mode is off; turn it on before creating slices")
        if isinstance(e, nv.NVMLError_NoPermission):
            return GpuError(f"GPU {index}: creating MIG slices needs root")
        if not isinstance(e, (nv.NVMLError_InvalidArgument, nv.NVMLError_InsufficientResources)):
            return GpuError(f"GPU {index}: NVML could not create {p.name} at slot {start}: {e}")
        try:   # say which rule it broke, in the catalog's words
            used = [mig.Slice(q.name, s) for q, _, s in self._instances(index, handle)]
            mig.validate_layout(p.gpu_model, used + [mig.Slice(p.name, start)])
        except mig.MigError as why:
            return MigRefusedError(f"GPU {index}: {why}")
        except GpuError:
            pass
        return MigRefusedError(f"GPU {index}: the driver refused {p.name} at slot {start}: {e}")

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.warning("NVML shutdown failed: %s", e)
