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

MIG, as the driver does it (its own tables below, not gpud's catalog, so a test that
compares the two checks something):

* ``nvmlDeviceGetGpuInstanceProfileInfo(dev, NVML_GPU_INSTANCE_PROFILE_*)`` gives the
  profile's driver id (19 for an A100's 1g.10gb), which every later call takes;
  NOT_SUPPORTED for a board or profile without MIG;
* placements and instance lists use pynvml's calling convention: a ctypes array (or None
  to ask for the count) and ``byref(c_uint)``; handles of GPU and compute instances are
  ctypes pointers, as pynvml returns them;
* ``nvmlDeviceCreateGpuInstanceWithPlacement``: NOT_SUPPORTED with MIG mode off,
  INVALID_ARGUMENT for a placement the profile cannot take, INSUFFICIENT_RESOURCES for an
  overlap, too many of a profile, too many compute slices or a second media engine;
* a GPU instance has a MIG device (UUID, handle) only once a compute instance exists;
  ``nvmlComputeInstanceDestroy`` is IN_USE while processes run on it and
  ``nvmlGpuInstanceDestroy`` IN_USE while it has compute instances;
* ``nvmlDeviceSetMigMode`` needs root; turning MIG off with GPU instances left is IN_USE;
  the new mode becomes current only when the GPU can be reset (no processes, and
  ``reset_blocked`` false), otherwise it stays pending and the activation status says why;
  ``reboot()`` forgets the mode on Hopper boards and keeps it (InfoROM) on Ampere ones.

Topology, read-only, as the driver reports it on an x86 server (``machine`` wires it):

* every GPU has a PCI bus id (``nvmlDeviceGetPciInfo``; ``busId`` is bytes, as pynvml's
  ctypes structure gives it) and hangs off a NUMA node and a PCIe switch;
  ``nvmlDeviceGetTopologyCommonAncestor`` answers from those (SINGLE under one switch,
  NODE within one NUMA node, SYSTEM across nodes); ``write_sysfs(root)`` writes the
  ``numa_node`` file the kernel keeps for each GPU's PCI device;
* ``nvmlDeviceGetNumaNodeId`` is NOT_SUPPORTED unless the GPU is itself a NUMA node
  (``gpu_numa_node``, coherent platforms);
* NVLink: SXM boards (H100, H200, A100) reach NVSwitches on every link (18 links over 4
  switches, 12 over 6 on an A100), NVL cards their bridged partner, PCIe cards nothing
  (NOT_SUPPORTED); a link past the board's last is INVALID_ARGUMENT.  A function named in
  ``missing_functions`` is FUNCTION_NOT_FOUND, as on a driver older than the binding.
"""

from __future__ import annotations

import ctypes
import itertools
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
    "RESET_REQUIRED": 16,
    "IN_USE": 19,
    "INSUFFICIENT_RESOURCES": 23,
    "INSUFFICIENT_SIZE": 7,
    "FUNCTION_NOT_FOUND": 13,
    "UNKNOWN": 999,
}
_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 5: "Already Initialized", 6: "Not Found",
    7: "Insufficient Size", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
    15: "GPU is lost", 16: "GPU requires restart", 19: "In use by another client",
    23: "Insufficient resources", 13: "Function Not Found", 999: "Unknown Error",
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
NVMLError_ResetRequired = _CLASSES["RESET_REQUIRED"]
NVMLError_InUse = _CLASSES["IN_USE"]
NVMLError_InsufficientResources = _CLASSES["INSUFFICIENT_RESOURCES"]
NVMLError_InsufficientSize = _CLASSES["INSUFFICIENT_SIZE"]
NVMLError_FunctionNotFound = _CLASSES["FUNCTION_NOT_FOUND"]
NVMLError_Unknown = _CLASSES["UNKNOWN"]

MIB = 1 << 20
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
# Topology (nvml.h): common-ancestor levels, link states, remote device types.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
# NVLink wiring by board: (links, NVSwitches) for SXM boards on an HGX baseboard, and the
# links to the partner card for NVL pairs.
NVSWITCH_BOARDS = {"H100": (18, 4), "H200": (18, 4), "A100": (12, 6), "A100_40": (12, 6)}
NVL_PAIR_LINKS = {"H100_NVL": 12}

# pynvml's profile constants (the NVML header's values).
GI_PROFILES = {"1_SLICE": 0, "2_SLICE": 1, "3_SLICE": 2, "4_SLICE": 3, "7_SLICE": 4, "8_SLICE": 5,
               "6_SLICE": 6, "1_SLICE_REV1": 7, "2_SLICE_REV1": 8, "1_SLICE_REV2": 9}
CI_PROFILES = {"1_SLICE": 0, "2_SLICE": 1, "3_SLICE": 2, "4_SLICE": 3, "7_SLICE": 4, "8_SLICE": 5,
               "6_SLICE": 6}


@dataclass(frozen=True)
class _GiProfile:
    """One GPU instance profile as a driver reports it for one board."""

    constant: int            # NVML_GPU_INSTANCE_PROFILE_*
    id: int                  # the driver's profile id (nvidia-smi mig -lgip "ID")
    name: str                # "MIG 1g.10gb"
    slice_count: int         # compute slices
    instance_count: int
    memory_mb: int
    starts: tuple[int, ...]
    size: int                # memory slots per placement
    media: bool = False      # holds the GPU's one OFA engine (+me)


def _mig_board(compute: int, slots: int, shapes, names_mib) -> tuple[int, int, tuple[_GiProfile, ...]]:
    profiles = tuple(_GiProfile(GI_PROFILES[c], pid, f"MIG {name}", sl, count, mib, starts, size,
                                name.endswith("+me"))
                     for (c, pid, sl, count, starts, size), (name, mib) in zip(shapes, names_mib))
    return compute, slots, profiles


# (constant, driver id, compute slices, instances, starts, memory slots) per board family
_HOPPER_AMPERE = (("1_SLICE", 19, 1, 7, tuple(range(7)), 1), ("1_SLICE_REV1", 20, 1, 1, tuple(range(7)), 1),
                  ("1_SLICE_REV2", 15, 1, 4, (0, 2, 4, 6), 2), ("2_SLICE", 14, 2, 3, (0, 2, 4), 2),
                  ("3_SLICE", 9, 3, 2, (0, 4), 4), ("4_SLICE", 5, 4, 1, (0,), 4),
                  ("7_SLICE", 0, 7, 1, (0,), 8))
_A30 = (("1_SLICE", 14, 1, 4, (0, 1, 2, 3), 1), ("1_SLICE_REV1", 21, 1, 1, (0, 1, 2, 3), 1),
        ("2_SLICE", 5, 2, 2, (0, 2), 2), ("2_SLICE_REV1", 6, 2, 1, (0, 2), 2), ("4_SLICE", 0, 4, 1, (0,), 4))
# driver name -> (compute slices, memory slots, profiles); names and MiB as nvidia-smi lists them
MIG_BOARDS = {
    "NVIDIA A100-SXM4-80GB": _mig_board(7, 8, _HOPPER_AMPERE, (
        ("1g.10gb", 9728), ("1g.10gb+me", 9728), ("1g.20gb", 19968), ("2g.20gb", 19968),
        ("3g.40gb", 40192), ("4g.40gb", 40192), ("7g.80gb", 80896))),
    "NVIDIA A100-SXM4-40GB": _mig_board(7, 8, _HOPPER_AMPERE, (
        ("1g.5gb", 4864), ("1g.5gb+me", 4864), ("1g.10gb", 9856), ("2g.10gb", 9856),
        ("3g.20gb", 19968), ("4g.20gb", 19968), ("7g.40gb", 40192))),
    "NVIDIA H100 80GB HBM3": _mig_board(7, 8, _HOPPER_AMPERE, (
        ("1g.10gb", 9984), ("1g.10gb+me", 9984), ("1g.20gb", 20096), ("2g.20gb", 20096),
        ("3g.40gb", 40448), ("4g.40gb", 40448), ("7g.80gb", 81152))),
    "NVIDIA H200": _mig_board(7, 8, _HOPPER_AMPERE, (
        ("1g.18gb", 16384), ("1g.18gb+me", 16384), ("1g.35gb", 33024), ("2g.35gb", 33024),
        ("3g.71gb", 71168), ("4g.71gb", 71168), ("7g.141gb", 143104))),
    "NVIDIA A30": _mig_board(4, 4, _A30, (
        ("1g.6gb", 5952), ("1g.6gb+me", 5952), ("2g.12gb", 11968), ("2g.12gb+me", 11968),
        ("4g.24gb", 24064))),
}
MIG_BOARDS["NVIDIA H100 PCIe"] = MIG_BOARDS["NVIDIA H100 80GB HBM3"]
# Ampere keeps its MIG mode in the InfoROM across reboots; Hopper forgets it.
MODE_SURVIVES_REBOOT = frozenset({"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A30"})
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
    """A GPU instance; with ``ci`` (its compute instance) also a MIG device with a UUID."""

    uuid: str
    memory_mib: int
    used_mib: int = 0
    procs: list[tuple[int, int]] = field(default_factory=list)   # (pid, MiB used)
    profile_id: int = 19     # the driver's profile id (19: 1g.10gb on A100/H100)
    start: int = 0           # placement: memory slots [start, start + size)
    size: int = 1
    gi_id: int = 0
    ci: bool = True


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
    mig_pending: bool | None = None  # a mode set but not yet active (None: as current)
    reset_blocked: bool = False      # the driver cannot reset this GPU (pass-through, ...)
    # topology
    bus_id: str = "00000000:00:00.0"   # NVML's spelling, 8-digit domain
    numa_node: int | None = None     # the NUMA node it hangs off (None: the kernel does not say)
    pcie_switch: int | None = None   # GPUs under one PCIe switch share this number
    gpu_numa_node: int | None = None  # set where the GPU is itself a NUMA node
    nvlinks: list["FakeLink"] | None = None   # None: no NVLink on this board
    minor: int | None = None         # of /dev/nvidia<minor>; None: the GPU's index (as on most hosts)


@dataclass
class FakeLink:
    """One NVLink of a GPU and what is at its far end."""

    remote_bus_id: str
    remote_type: int = NVML_NVLINK_DEVICE_TYPE_SWITCH
    active: bool = True


@dataclass(frozen=True)
class _PciInfo:
    busId: bytes


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


# pynvml's ctypes shapes: placements are structures, instance handles are pointers.
class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class _InstanceRef(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


c_nvmlGpuInstance_t = ctypes.POINTER(_InstanceRef)
c_nvmlComputeInstance_t = ctypes.POINTER(_InstanceRef)


@dataclass(frozen=True)
class _ProfileInfo:
    id: int
    sliceCount: int
    instanceCount: int
    memorySizeMB: int
    name: bytes = b""
    isP2pSupported: int = 0
    multiprocessorCount: int = 0


@dataclass(frozen=True)
class _GiInfo:
    device: object
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


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
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_InUse = NVMLError_InUse
    NVMLError_InsufficientResources = NVMLError_InsufficientResources
    NVMLError_InsufficientSize = NVMLError_InsufficientSize
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_Unknown = NVMLError_Unknown
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = c_nvmlComputeInstance_t

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver: bool = True,
                 bytes_strings: bool = False, root: bool = True) -> None:
        self.gpus = list(gpus or [])
        self.driver = driver
        self.bytes_strings = bytes_strings
        self.root = root             # MIG changes need root, as with the real driver
        self.refcount = 0
        self.calls: list[str] = []
        self._refs: dict[tuple[int, int, int], _InstanceRef] = {}   # keeps handles' targets alive
        self._serial = itertools.count(1)
        self.missing_functions: set[str] = set()   # FUNCTION_NOT_FOUND: an older driver

    @classmethod
    def machine(cls, *, driver: bool = True, bytes_strings: bool = False, host: str = "fake",
                **boards: int) -> "FakeNvml":
        """A host with the given boards, e.g. ``machine(H100=8)`` or ``machine(A100=4, A30=2)``."""
        gpus = []
        kinds = []
        for board, count in boards.items():
            name, mib = BOARDS[board]
            for _ in range(count):
                serial = uuid.uuid5(uuid.NAMESPACE_OID, f"{host}/{len(gpus)}/{board}")
                gpus.append(FakeGpu(name=name, memory_mib=mib, uuid=f"GPU-{serial}"))
                kinds.append(board)
        _wire(gpus, kinds)
        return cls(gpus, driver=driver, bytes_strings=bytes_strings)

    def write_sysfs(self, root: str, *, skip: tuple[int, ...] = ()) -> None:
        """The kernel's ``bus/pci/devices/<bus id>/numa_node`` for each GPU (-1 when it does
        not know), under ``root``; GPUs in ``skip`` get no file."""
        import os

        for i, gpu in enumerate(self.gpus):
            if i in skip:
                continue
            domain, rest = gpu.bus_id.split(":", 1)
            path = os.path.join(root, "bus", "pci", "devices", f"{int(domain, 16):04x}:{rest.lower()}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "numa_node"), "w") as f:
                f.write(f"{-1 if gpu.numa_node is None else gpu.numa_node}\n")

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

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        """The minor of the GPU's /dev/nvidia node; NOT_SUPPORTED for a MIG device, as the driver says."""
        self.calls.append("nvmlDeviceGetMinorNumber")
        if isinstance(handle, _MigHandle):
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        gpu = self._gpu(handle)
        return handle.index if gpu.minor is None else gpu.minor

    def write_mig_minors(self, path: str) -> None:
        """The driver's /proc/driver/nvidia-caps/mig-minors for the slices now: config and
        monitor caps 1 and 2, then per GPU instance an access cap and one per compute instance."""
        lines = ["config 1", "monitor 2"]
        cap = 3
        for i, gpu in enumerate(self.gpus):
            minor = i if gpu.minor is None else gpu.minor
            for s in gpu.mig or ():
                lines.append(f"gpu{minor}/gi{s.gi_id}/access {cap}")
                cap += 1
                if s.ci:
                    lines.append(f"gpu{minor}/gi{s.gi_id}/ci0/access {cap}")
                    cap += 1
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")

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

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self.calls.append("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle)
        if gpu.name not in MIG_BOARDS and gpu.mig is None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        current = int(gpu.mig is not None)
        return [current, current if gpu.mig_pending is None else int(gpu.mig_pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self.calls.append("nvmlDeviceGetMaxMigDeviceCount")
        gpu = self._gpu(handle)
        if gpu.mig is None:
            return 0
        return MIG_BOARDS[gpu.name][0] if gpu.name in MIG_BOARDS else 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:
        self.calls.append("nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < len(self._devices(self._gpu(handle))):
            raise NVMLError(_ERROR_CODES["NOT_FOUND"])
        return _MigHandle(handle, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _MigHandle) -> int:
        self.calls.append("nvmlDeviceGetGpuInstanceId")
        if not isinstance(handle, _MigHandle):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])   # not a MIG device
        return self._slice(handle).gi_id

    # -- MIG management -------------------------------------------------------------------

    def nvmlDeviceSetMigMode(self, handle: _Handle, mode: int) -> int:
        """The activation status: SUCCESS when ``mode`` is now current, else why not."""
        self.calls.append("nvmlDeviceSetMigMode")
        gpu = self._gpu(handle)
        if gpu.name not in MIG_BOARDS:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        if not self.root:
            raise NVMLError(_ERROR_CODES["NO_PERMISSION"])
        if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        if not mode and gpu.mig:
            raise NVMLError(_ERROR_CODES["IN_USE"])       # GPU instances left
        if bool(mode) == (gpu.mig is not None):
            gpu.mig_pending = None
            return NVML_SUCCESS
        gpu.mig_pending = bool(mode)
        if gpu.procs:                                     # the reset needs an idle GPU
            return _ERROR_CODES["IN_USE"]
        if gpu.reset_blocked:
            return _ERROR_CODES["RESET_REQUIRED"]
        gpu.mig, gpu.mig_pending = ([] if mode else None), None
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: _Handle, profile: int,
                                            version: int = 2) -> _ProfileInfo:
        self.calls.append("nvmlDeviceGetGpuInstanceProfileInfo")
        p = self._profile_by(self._gpu(handle), constant=profile)
        return _ProfileInfo(id=p.id, sliceCount=p.slice_count, instanceCount=p.instance_count,
                            memorySizeMB=p.memory_mb, name=p.name.encode())

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: _Handle, profile_id: int,
                                                   placements, count_ref) -> int:
        self.calls.append("nvmlDeviceGetGpuInstancePossiblePlacements")
        p = self._profile_by(self._gpu(handle), id=profile_id)
        count = _out(count_ref)
        count.value = len(p.starts)
        if placements is None:
            return NVML_SUCCESS
        if len(placements) < len(p.starts):
            raise NVMLError(_ERROR_CODES["INSUFFICIENT_SIZE"])
        for i, start in enumerate(p.starts):
            placements[i].start, placements[i].size = start, p.size
        return NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: _Handle, profile_id: int, placement):
        self.calls.append("nvmlDeviceCreateGpuInstanceWithPlacement")
        gpu = self._gpu(handle)
        p = self._profile_by(gpu, id=profile_id)
        if not self.root:
            raise NVMLError(_ERROR_CODES["NO_PERMISSION"])
        if gpu.mig is None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        where = _out(placement)
        if where.start not in p.starts or where.size != p.size:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        compute, _, profiles = MIG_BOARDS[gpu.name]
        by_id = {q.id: q for q in profiles}
        mine = ((1 << p.size) - 1) << where.start
        taken = sum(((1 << s.size) - 1) << s.start for s in gpu.mig)
        if (mine & taken
                or sum(s.profile_id == p.id for s in gpu.mig) >= p.instance_count
                or sum(by_id[s.profile_id].slice_count for s in gpu.mig) + p.slice_count > compute
                or (p.media and any(by_id[s.profile_id].media for s in gpu.mig))):
            raise NVMLError(_ERROR_CODES["INSUFFICIENT_RESOURCES"])
        gi_id = min(set(range(1, 64)) - {s.gi_id for s in gpu.mig})
        serial = uuid.uuid5(uuid.NAMESPACE_OID, f"{gpu.uuid}/{gi_id}/{next(self._serial)}")
        gpu.mig.append(FakeMigSlice(uuid=f"MIG-{serial}", memory_mib=p.memory_mb, profile_id=p.id,
                                    start=where.start, size=p.size, gi_id=gi_id, ci=False))
        gpu.mig.sort(key=lambda s: s.start)
        return self._ref(handle.index, gi_id, 0)

    def nvmlDeviceGetGpuInstances(self, handle: _Handle, profile_id: int, instances, count_ref) -> int:
        self.calls.append("nvmlDeviceGetGpuInstances")
        gpu = self._gpu(handle)
        self._profile_by(gpu, id=profile_id)
        found = [s for s in (gpu.mig or []) if s.profile_id == profile_id]
        count = _out(count_ref)
        if instances is None or len(instances) < len(found):
            count.value = len(found)
            raise NVMLError(_ERROR_CODES["INSUFFICIENT_SIZE"])
        for i, s in enumerate(found):
            instances[i] = self._ref(handle.index, s.gi_id, 0)
        count.value = len(found)
        return NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gi) -> _GiInfo:
        self.calls.append("nvmlGpuInstanceGetInfo")
        gpu, s = self._gi(gi)
        return _GiInfo(device=_Handle(self, self.gpus.index(gpu)), id=s.gi_id, profileId=s.profile_id,
                       placement=c_nvmlGpuInstancePlacement_t(s.start, s.size))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile: int, eng_profile: int,
                                                     version: int = 2) -> _ProfileInfo:
        self.calls.append("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        gpu, s = self._gi(gi)
        slices = self._profile_by(gpu, id=s.profile_id).slice_count
        wanted = next((int(k.split("_")[0]) for k, v in CI_PROFILES.items() if v == profile), None)
        if wanted is None or wanted > slices or eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        return _ProfileInfo(id=profile, sliceCount=wanted, instanceCount=slices // wanted,
                            memorySizeMB=s.memory_mib)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id: int):
        self.calls.append("nvmlGpuInstanceCreateComputeInstance")
        gpu, s = self._gi(gi)
        if not self.root:
            raise NVMLError(_ERROR_CODES["NO_PERMISSION"])
        slices = self._profile_by(gpu, id=s.profile_id).slice_count
        wanted = next((int(k.split("_")[0]) for k, v in CI_PROFILES.items() if v == profile_id), None)
        if wanted is None or wanted > slices:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        if s.ci:
            raise NVMLError(_ERROR_CODES["INSUFFICIENT_RESOURCES"])   # one CI spans it already
        if wanted != slices:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])   # partial CIs: not modelled here
        s.ci = True
        return self._ref(self.gpus.index(gpu), s.gi_id, 1)

    def nvmlGpuInstanceGetComputeInstances(self, gi, profile_id: int, instances, count_ref) -> int:
        self.calls.append("nvmlGpuInstanceGetComputeInstances")
        gpu, s = self._gi(gi)
        slices = self._profile_by(gpu, id=s.profile_id).slice_count
        found = [1] if s.ci and CI_PROFILES.get(f"{slices}_SLICE") == profile_id else []
        count = _out(count_ref)
        if instances is None or len(instances) < len(found):
            count.value = len(found)
            raise NVMLError(_ERROR_CODES["INSUFFICIENT_SIZE"])
        for i, ci in enumerate(found):
            instances[i] = self._ref(self.gpus.index(gpu), s.gi_id, ci)
        count.value = len(found)
        return NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, ci) -> int:
        self.calls.append("nvmlComputeInstanceDestroy")
        gpu, s = self._gi(ci)
        if not self.root:
            raise NVMLError(_ERROR_CODES["NO_PERMISSION"])
        if not s.ci or ci.contents.ci == 0:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        if s.procs:
            raise NVMLError(_ERROR_CODES["IN_USE"])
        s.ci = False
        return NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gi) -> int:
        self.calls.append("nvmlGpuInstanceDestroy")
        gpu, s = self._gi(gi)
        if not self.root:
            raise NVMLError(_ERROR_CODES["NO_PERMISSION"])
        if s.ci:
            raise NVMLError(_ERROR_CODES["IN_USE"])   # destroy its compute instances first
        gpu.mig.remove(s)
        return NVML_SUCCESS

    # -- test controls --------------------------------------------------------------------

    def reboot(self) -> None:
        """The host restarts: slices and processes are gone; Hopper forgets MIG mode."""
        for gpu in self.gpus:
            gpu.procs = []
            keep = gpu.mig is not None and gpu.name in MODE_SURVIVES_REBOOT
            pending = gpu.mig_pending
            gpu.mig = [] if keep else None
            if pending is not None and gpu.name in MODE_SURVIVES_REBOOT:
                gpu.mig = [] if pending else None   # a reboot is also the pending reset
            gpu.mig_pending = None

    # -- topology ---------------------------------------------------------------------------

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:
        self.calls.append("nvmlDeviceGetPciInfo")
        return _PciInfo(busId=self._gpu(handle).bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        self._topology_call("nvmlDeviceGetNumaNodeId")
        return self._reading(self._gpu(handle).gpu_numa_node)

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: _Handle, handle2: _Handle) -> int:
        self._topology_call("nvmlDeviceGetTopologyCommonAncestor")
        a, b = self._gpu(handle1), self._gpu(handle2)
        if a is b:
            return NVML_TOPOLOGY_INTERNAL
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return NVML_TOPOLOGY_SINGLE
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return NVML_TOPOLOGY_NODE
        return NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._topology_call("nvmlDeviceGetNvLinkState")
        return NVML_FEATURE_ENABLED if self._link(handle, link).active else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> _PciInfo:
        self._topology_call("nvmlDeviceGetNvLinkRemotePciInfo")
        return _PciInfo(busId=self._link(handle, link).remote_bus_id.encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        self._topology_call("nvmlDeviceGetNvLinkRemoteDeviceType")
        return self._link(handle, link).remote_type

    def _topology_call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.missing_functions:
            raise NVMLError(_ERROR_CODES["FUNCTION_NOT_FOUND"])

    def _link(self, handle: _Handle, link: int) -> FakeLink:
        gpu = self._gpu(handle)
        if gpu.nvlinks is None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        if not isinstance(link, int) or not 0 <= link < min(len(gpu.nvlinks), NVML_NVLINK_MAX_LINKS):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        return gpu.nvlinks[link]

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

    @staticmethod
    def _devices(gpu: FakeGpu) -> list[FakeMigSlice]:
        """The MIG devices: GPU instances with their compute instance, by instance id."""
        return sorted((s for s in gpu.mig or [] if s.ci), key=lambda s: s.gi_id)

    def _slice(self, handle: _MigHandle) -> FakeMigSlice:
        slices = self._devices(self._gpu(handle.parent))
        if not 0 <= handle.slot < len(slices):
            raise NVMLError(_ERROR_CODES["NOT_FOUND"])
        return slices[handle.slot]

    def _profile_by(self, gpu: FakeGpu, *, constant: int | None = None, id: int | None = None) -> _GiProfile:
        board = MIG_BOARDS.get(gpu.name)
        for p in board[2] if board else ():
            if (constant is not None and p.constant == constant) or (id is not None and p.id == id):
                return p
        if board is None or constant is not None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])

    def _ref(self, gpu: int, gi: int, ci: int):
        key = (gpu, gi, ci)
        target = self._refs.get(key)
        if target is None:
            target = self._refs[key] = _InstanceRef(gpu, gi, ci)
        return ctypes.pointer(target)

    def _gi(self, ref) -> tuple[FakeGpu, FakeMigSlice]:
        self._check_init()
        if not isinstance(ref, ctypes._Pointer) or not ref:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])
        target = ref.contents
        if self._refs.get((target.gpu, target.gi, target.ci)) is None or target.gpu >= len(self.gpus):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])   # another machine's handle
        gpu = self.gpus[target.gpu]
        if gpu.lost:
            raise NVMLError(_ERROR_CODES["GPU_IS_LOST"])
        found = next((s for s in gpu.mig or [] if s.gi_id == target.gi), None)
        if found is None:
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"])   # destroyed: a stale handle
        return gpu, found

    @staticmethod
    def _reading(value: int | None) -> int:
        if value is None:
            raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"])
        return value

    def _string(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value


def _wire(gpus: list[FakeGpu], boards: list[str]) -> None:
    """An x86 server's wiring: two NUMA nodes split evenly, two GPUs per PCIe switch, SXM
    boards on one NVSwitch fabric, NVL cards in bridged pairs."""
    n = len(gpus)
    switch_bus = [f"00000000:{0x05 + s:02X}:00.0" for s in range(8)]
    nvl: list[int] = []
    for i, (gpu, board) in enumerate(zip(gpus, boards)):
        gpu.bus_id = f"00000000:{0x18 + 8 * i:02X}:00.0"
        gpu.numa_node = i * 2 // n
        gpu.pcie_switch = i // 2
        if board in NVSWITCH_BOARDS:
            links, switches = NVSWITCH_BOARDS[board]
            gpu.nvlinks = [FakeLink(switch_bus[k % switches]) for k in range(links)]
        elif board in NVL_PAIR_LINKS:
            nvl.append(i)
    for a, b in zip(nvl[::2], nvl[1::2]):
        for x, y in ((a, b), (b, a)):
            gpus[x].nvlinks = [FakeLink(gpus[y].bus_id, NVML_NVLINK_DEVICE_TYPE_GPU)
                               for _ in range(NVL_PAIR_LINKS[boards[x]])]


def _out(ref):
    """The object behind ``byref(x)`` (or ``x`` itself)."""
    return getattr(ref, "_obj", ref)


# The NVML_ERROR_* and profile constants, on the module and on each fake, as pynvml has them.
for _name, _code in _ERROR_CODES.items():
    globals()["NVML_ERROR_" + _name] = _code
    setattr(FakeNvml, "NVML_ERROR_" + _name, _code)
for _name in ("NVML_TOPOLOGY_INTERNAL", "NVML_TOPOLOGY_SINGLE", "NVML_TOPOLOGY_MULTIPLE",
              "NVML_TOPOLOGY_HOSTBRIDGE", "NVML_TOPOLOGY_NODE", "NVML_TOPOLOGY_SYSTEM",
              "NVML_FEATURE_DISABLED", "NVML_FEATURE_ENABLED", "NVML_NVLINK_MAX_LINKS",
              "NVML_NVLINK_DEVICE_TYPE_GPU", "NVML_NVLINK_DEVICE_TYPE_IBMNPU", "NVML_NVLINK_DEVICE_TYPE_SWITCH"):
    setattr(FakeNvml, _name, globals()[_name])
for _name, _code in GI_PROFILES.items():
    globals()["NVML_GPU_INSTANCE_PROFILE_" + _name] = _code
    setattr(FakeNvml, "NVML_GPU_INSTANCE_PROFILE_" + _name, _code)
for _name, _code in CI_PROFILES.items():
    globals()["NVML_COMPUTE_INSTANCE_PROFILE_" + _name] = _code
    setattr(FakeNvml, "NVML_COMPUTE_INSTANCE_PROFILE_" + _name, _code)
del _name, _code
