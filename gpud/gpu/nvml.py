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
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from ..model import GpuInfo
from .backend import NO_DRIVER_MESSAGE, GpuError, NoGpuError

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30

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

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.warning("NVML shutdown failed: %s", e)
