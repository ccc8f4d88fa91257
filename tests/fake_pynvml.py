"""A stand-in for the ``pynvml`` module, covering what ``gpud.gpu.nvml`` uses.

A ``FakeNvml`` instance behaves like the module: the same function names, constants and
exception classes, with the driver's rules that matter to callers --

* ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` when the host has no driver (what a
  real GPU-less box does), and is reference-counted: every ``nvmlInit`` needs its
  ``nvmlShutdown``; calls made while not initialised raise ``NVMLError_Uninitialized``;
* ``NVMLError(code)`` builds the matching ``NVMLError_<Name>`` subclass and carries
  ``.value``, so ``except nvml.NVMLError_LibraryNotFound`` works as with the real module;
* handles are opaque and only valid for the machine that issued them;
* strings come back as ``str`` (current nvidia-ml-py) or ``bytes`` (older releases).

Machines are built from board presets: ``FakeNvml.machine(H100=8)`` is an 8-GPU H100 host
with the names and memory sizes real drivers report.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

NVML_SUCCESS = 0
_ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "GPU_IS_LOST": 15,
    "UNKNOWN": 999,
}
_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 5: "Already Initialized", 6: "Not Found",
    9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 15: "GPU is lost",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """Base of every NVML error; ``NVMLError(code)`` returns the code's subclass."""

    _by_code: dict[int, type["NVMLError"]] = {}
    value: int

    def __new__(cls, value: int = 999):
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)
        err = Exception.__new__(cls)
        err.value = value
        return err

    def __init__(self, value: int = 999) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls, *args):
        return NVMLError.__new__(cls, code)

    def init(self, *args):
        Exception.__init__(self, code)

    cls_name = "NVMLError_" + "".join(part.capitalize() for part in name.split("_"))
    cls = type(cls_name, (NVMLError,), {"__new__": new, "__init__": init})
    NVMLError._by_code[code] = cls
    return cls


_CLASSES = {name: _error_class(name, code) for name, code in _ERROR_CODES.items()}
NVMLError_Uninitialized = _CLASSES["UNINITIALIZED"]
NVMLError_InvalidArgument = _CLASSES["INVALID_ARGUMENT"]
NVMLError_NotSupported = _CLASSES["NOT_SUPPORTED"]
NVMLError_NoPermission = _CLASSES["NO_PERMISSION"]
NVMLError_AlreadyInitialized = _CLASSES["ALREADY_INITIALIZED"]
NVMLError_NotFound = _CLASSES["NOT_FOUND"]
NVMLError_DriverNotLoaded = _CLASSES["DRIVER_NOT_LOADED"]
NVMLError_LibraryNotFound = _CLASSES["LIBRARY_NOT_FOUND"]
NVMLError_GpuIsLost = _CLASSES["GPU_IS_LOST"]
NVMLError_Unknown = _CLASSES["UNKNOWN"]

MIB = 1 << 20
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1
# name as the driver reports it, memory the driver reports (MiB)
BOARDS: dict[str, tuple[str, int]] = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H100_PCIE": ("NVIDIA H100 PCIe", 81559),
    "H100_NVL": ("NVIDIA H100 NVL", 95830),
    "H200": ("NVIDIA H200", 143771),
    "A100": ("NVIDIA A100-SXM4-80GB", 81920),
    "A100_40": ("NVIDIA A100-SXM4-40GB", 40960),
    "A30": ("NVIDIA A30", 24576),
    "L40S": ("NVIDIA L40S", 46068),
}


@dataclass
class FakeMigSlice:
    uuid: str
    memory_mib: int
    used_mib: int = 0
    procs: list[tuple[int, int]] = field(default_factory=list)   # (pid, MiB used)


@dataclass
class FakeGpu:
    name: str
    memory_mib: int
    uuid: str
    lost: bool = False  # every query on it fails with NVMLError_GpuIsLost
    # telemetry readings; None: the board does not support it (NVMLError_NotSupported)
    util: int | None = 0
    used_mib: int = 512          # the driver's own reservation shows as used on an idle board
    power_mw: int | None = 60_000
    temp_c: int | None = 34
    energy_mj: int | None = 0
    procs: list[tuple[int, int]] = field(default_factory=list)   # (pid, MiB used)
    mig: list[FakeMigSlice] | None = None   # MIG mode on, with these slices


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int | None


@dataclass(frozen=True)
class _Memory:
    total: int
    free: int
    used: int


class _Handle:
    __slots__ = ("owner", "index")

    def __init__(self, owner: "FakeNvml", index: int) -> None:
        self.owner, self.index = owner, index

    def __repr__(self) -> str:
        return f"<nvmlDevice_t {self.index}>"


class _MigHandle:
    __slots__ = ("parent", "slot")

    def __init__(self, parent: _Handle, slot: int) -> None:
        self.parent, self.slot = parent, slot


class FakeNvml:
    """One fake host's NVML.  Pass it wherever code accepts the ``pynvml`` module."""

    NVML_SUCCESS = NVML_SUCCESS
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_AlreadyInitialized = NVMLError_AlreadyInitialized
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver: bool = True,
                 bytes_strings: bool = False) -> None:
        self.gpus = list(gpus or [])
        self.driver = driver
        self.bytes_strings = bytes_strings
        self.refcount = 0
        self.calls: list[str] = []

    @classmethod
    def machine(cls, *, driver: bool = True, bytes_strings: bool = False, host: str = "fake",
                **boards: int) -> "FakeNvml":
        """A host with the given boards, e.g. ``machine(H100=8)`` or ``machine(A100=4, A30=2)``."""
        gpus = []
        for board, count in boards.items():
            name, mib = BOARDS[board]
            for _ in range(count):
                serial = uuid.uuid5(uuid.NAMESPACE_OID, f"{host}/{len(gpus)}/{board}")
                gpus.append(FakeGpu(name=name, memory_mib=mib, uuid=f"GPU-{serial}"))
        return cls(gpus, driver=driver, bytes_strings=bytes_strings)

    # -- library lifetime -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if not self.driver:
            raise NVMLError(_ERROR_CODES["LIBRARY_NOT_FOUND"])
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._check_init()
        self.refcount -= 1

    # -- devices --------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self.calls.append("nvmlDeviceGetHandleByIndex")
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        return _Handle(self, index)

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str | bytes:
        self.calls.append("nvmlDeviceGetUUID")
        if isinstance(handle, _MigHandle):
            return self._string(self._slice(handle).uuid)
        return self._string(self._gpu(handle).uuid)

    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        self.calls.append("nvmlDeviceGetName")
        return self._string(self._gpu(handle).name)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle | _MigHandle, version: int | None = None) -> _Memory:
        self.calls.append("nvmlDeviceGetMemoryInfo")
        if isinstance(handle, _MigHandle):
            sl = self._slice(handle)
            return _Memory(total=sl.memory_mib * MIB, free=(sl.memory_mib - sl.used_mib) * MIB,
                           used=sl.used_mib * MIB)
        gpu = self._gpu(handle)
        total = gpu.memory_mib * MIB
        used = gpu.used_mib * MIB
        return _Memory(total=total, free=total - used, used=used)

    # -- telemetry ------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        self.calls.append("nvmlDeviceGetUtilizationRates")
        if isinstance(handle, _MigHandle):
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])  # as the real driver: none for slices
        return _Utilization(gpu=self._reading(self._gpu(handle).util), memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self.calls.append("nvmlDeviceGetPowerUsage")
        return self._reading(self._gpu(handle).power_mw)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self.calls.append("nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        return self._reading(self._gpu(handle).temp_c)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self.calls.append("nvmlDeviceGetTotalEnergyConsumption")
        return self._reading(self._gpu(handle).energy_mj)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle | _MigHandle) -> list[_Process]:
        self.calls.append("nvmlDeviceGetComputeRunningProcesses")
        procs = self._slice(handle).procs if isinstance(handle, _MigHandle) else self._gpu(handle).procs
        return [_Process(pid, used * MIB) for pid, used in procs]

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> tuple[int, int]:
        self.calls.append("nvmlDeviceGetMigMode")
        mode = int(self._gpu(handle).mig is not None)
        return (mode, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self.calls.append("nvmlDeviceGetMaxMigDeviceCount")
        return 7 if self._gpu(handle).mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:
        self.calls.append("nvmlDeviceGetMigDeviceHandleByIndex")
        slices = self._gpu(handle).mig or []
        if not 0 <= index < len(slices):
            raise NVMLError(_ERROR_CODES["NOT_FOUND"])
        return _MigHandle(handle, index)

    # -- helpers --------------------------------------------------------------------------

    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise NVMLError(_ERROR_CODES["UNINITIALIZED"])

    def _gpu(self, handle: object) -> FakeGpu:
        self._check_init()
        if not isinstance(handle, _Handle) or handle.owner is not self:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(_ERROR_CODES["GPU_IS_LOST"])
        return gpu

    def _slice(self, handle: _MigHandle) -> FakeMigSlice:
        slices = self._gpu(handle.parent).mig or []
        if not 0 <= handle.slot < len(slices):
            raise NVMLError(_ERROR_CODES["NOT_FOUND"])
        return slices[handle.slot]

    @staticmethod
    def _reading(value: int | None) -> int:
        if value is None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        return value

    def _string(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value


# The NVML_ERROR_* constants, on the module and on each fake, as pynvml has them.
for _name, _code in _ERROR_CODES.items():
    globals()["NVML_ERROR_" + _name] = _code
    setattr(FakeNvml, "NVML_ERROR_" + _name, _code)
del _name, _code
