"""How a worker learns about, and later manages, the GPUs on its host.

Theory of operation
-------------------
A ``GpuBackend`` is the worker's only view of GPU hardware.  Two implementations share one
contract (tests/test_gpu_backends.py runs the same suite over both):

* ``gpud.gpu.nvml.NvmlBackend`` talks to the NVIDIA driver through pynvml, and is the only
  module that imports it;
* ``gpud.gpu.sim.SimBackend`` invents GPUs from a spec such as ``8xH100-80GB`` so a laptop
  or CI box can run a whole cluster.

``open_backend`` picks one: a sim spec always wins; otherwise NVML, and a host without a
driver is a clear ``NoGpuError`` that tells the operator about ``--sim``.

Discovery is read-only and repeatable, ``sample`` reads what each GPU is doing now
(telemetry), and ``close`` releases the driver.

MIG is managed through five verbs, the same on both backends (tests/test_gpu_contract.py):
``mig_state`` reads a GPU's mode and slices, ``possible_placements`` lists where a profile
may sit, ``create_slice`` makes one GPU instance (and the compute instance that spans it)
at an explicit placement, ``destroy_slice`` removes one, and ``set_mig_mode`` turns MIG on
or off.  Backends never move or touch a slice they were not asked about, and refuse what
the hardware refuses: a placement the profile cannot take, an overlap or a full GPU
(``MigRefusedError``), destroying a slice or changing the mode of a GPU that processes use
(``GpuInUseError``), a mode change that waits for a GPU reset (``ResetRequiredError``).  The
driver knows by itself which slices processes use; the sim learns it from
``note_in_use``, which the worker calls with its running jobs' devices.  MPS control
daemons are processes, not driver state: gpud.gpu.mps runs them.  Backends report problems
as ``GpuError`` subclasses with one-line messages meant for operators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from ..model import GpuInfo, SliceInfo
from .mig import Placement

NO_DRIVER_MESSAGE = (
    "no NVIDIA driver found on this host; use --sim SPEC to simulate GPUs (e.g. --sim 8xH100-80GB)"
)


class GpuError(RuntimeError):
    """A GPU backend could not do what was asked; the message is one line for operators."""


class NoGpuError(GpuError):
    """The host has no usable NVIDIA driver."""


class SimSpecError(GpuError, ValueError):
    """A ``--sim`` spec that cannot be parsed."""


class MigRefusedError(GpuError):
    """A MIG change the hardware will not make (no MIG, mode off, bad placement, no room)."""


class GpuInUseError(MigRefusedError):
    """The slice or GPU has processes on it; nothing was changed."""


class ResetRequiredError(GpuError):
    """A MIG mode change is pending until the GPU is reset (A100, A30) or the host reboots."""


# One device a job uses, as note_in_use takes it: (GPU index, slice start or None for the GPU).
DeviceUse = tuple[int, "int | None"]


@dataclass(frozen=True)
class Assignment:
    """One running allocation on this host, as telemetry needs it: which GPUs, which job."""

    job_id: int
    attempt: int
    gpus: tuple[int, ...]                 # GPU indices
    env: Mapping[str, str] = field(default_factory=dict)   # the job's environment (sim reads it)


@dataclass(frozen=True)
class SliceSample:
    """A MIG slice: NVML reports memory and processes for slices, but no utilization."""

    uuid: str
    mem_used_mb: int
    util: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """What one GPU is doing now; None where the driver does not say."""

    index: int
    uuid: str
    util: float | None            # percent of time a kernel ran, 0-100
    mem_used_mb: int | None
    power_w: float | None
    temp_c: float | None
    energy_mj: int | None = None  # the board's energy counter since driver load, millijoules
    slices: tuple[SliceSample, ...] = ()
    procs: tuple[tuple[int, int], ...] = ()   # (pid, MiB of GPU memory used)


@runtime_checkable
class GpuBackend(Protocol):
    """The GPUs of one host."""

    name: str  # "nvml" or "sim": shown in logs and node labels

    def discover(self) -> list[GpuInfo]:
        """Every working GPU, ordered by index.  Repeatable, no side effects."""
        ...

    def sample(self, assignments: Sequence[Assignment]) -> list[GpuSample]:
        """One reading of every GPU, ordered by index.  ``assignments`` are the jobs running
        here (the sim backend derives its numbers from what they declare).  A GPU that fails
        to answer is left out; never raises for one bad GPU."""
        ...

    def mig_state(self, index: int) -> tuple[bool, tuple[SliceInfo, ...]]:
        """(MIG mode on, its slices by start slot) of one GPU; (False, ()) without MIG."""
        ...

    def possible_placements(self, index: int, profile: str) -> list[Placement]:
        """Every placement ``profile`` may take on this GPU, free or not (as the driver
        lists them); MigRefusedError for a profile or GPU without MIG."""
        ...

    def create_slice(self, index: int, profile: str, start: int) -> SliceInfo:
        """One GPU instance of ``profile`` at memory slot ``start``, with a compute
        instance spanning it.  Other slices are not touched."""
        ...

    def destroy_slice(self, index: int, start: int) -> None:
        """Remove the slice at ``start``; GpuInUseError while processes use it."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Turn MIG on or off.  Never from tests on a real GPU.  GpuInUseError while the GPU
        (or, to turn it off, any slice) exists in use; ResetRequiredError when the change
        waits for a GPU reset."""
        ...

    def note_in_use(self, devices: Iterable[DeviceUse]) -> None:
        """The devices jobs use now (replacing the last call).  The driver sees processes
        itself, so only the sim needs this."""
        ...

    def close(self) -> None:
        """Release the driver.  Idempotent; discover() must not be called afterwards."""
        ...


def open_backend(sim_spec: str | None, node: str, *, nvml: Any = None,
                 sim_devices: str | None = None) -> GpuBackend:
    """The backend for this host: simulated when ``sim_spec`` is given, else NVML.

    ``nvml`` replaces the pynvml module (tests pass a fake).  Raises ``SimSpecError`` for a
    bad spec and ``NoGpuError`` when there is no NVIDIA driver.
    """
    if sim_spec is not None:
        from .sim import SimBackend

        return SimBackend(sim_spec, node, devices_dir=sim_devices)
    from .nvml import NvmlBackend

    return NvmlBackend(nvml=nvml)
