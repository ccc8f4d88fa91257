"""Real GPUs through NVML (pynvml from nvidia-ml-py).  The only module that imports pynvml.

Theory of operation
-------------------
``NvmlBackend`` initialises NVML once and keeps it open until ``close``; discovery only
reads (count, handle, UUID, name, memory).  Marketing names are turned into the short model
names that users type in ``--gpu-type`` and admins use for billing weights::

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
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Sequence

from ..model import GpuInfo
from .backend import NO_DRIVER_MESSAGE, Assignment, GpuError, GpuSample, NoGpuError, SliceSample

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30
MAX_PROCS_PER_GPU = 64     # a sample stays small even on a GPU shared by many processes
NVML_TEMPERATURE_GPU = 0   # pynvml's constant, for fakes that lack it
NVML_DEVICE_MIG_ENABLE = 1

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

    def __init__(self, nvml: Any = None) -> None:
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

    def discover(self) -> list[GpuInfo]:
        nv = self._nvml
        if not self._open:
            raise RuntimeError("NVML GPU backend used after close()")
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise GpuError(f"NVML cannot count GPUs: {e}; check the NVIDIA driver with nvidia-smi") from None
        gpus: list[GpuInfo] = []
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
        return gpus

    def sample(self, assignments: Sequence[Assignment] = ()) -> list[GpuSample]:
        """One reading per reachable GPU; ``assignments`` are not needed on real hardware."""
        nv = self._nvml
        if not self._open:
            raise RuntimeError("NVML GPU backend used after close()")
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

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.warning("NVML shutdown failed: %s", e)
