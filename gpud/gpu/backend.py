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

The protocol is deliberately small today: discovery is read-only and repeatable,
``sample`` reads what each GPU is doing now (telemetry), and ``close`` releases the driver.  MIG and MPS management will add methods here (listing and
applying slice layouts, starting control daemons); each will be a capability that both
implementations provide, so the sim stays a faithful stand-in for real hardware.  Backends
report problems as ``GpuError`` subclasses with one-line messages meant for operators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from ..model import GpuInfo

NO_DRIVER_MESSAGE = (
    "no NVIDIA driver found on this host; use --sim SPEC to simulate GPUs (e.g. --sim 8xH100-80GB)"
)


class GpuError(RuntimeError):
    """A GPU backend could not do what was asked; the message is one line for operators."""


class NoGpuError(GpuError):
    """The host has no usable NVIDIA driver."""


class SimSpecError(GpuError, ValueError):
    """A ``--sim`` spec that cannot be parsed."""


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

    def close(self) -> None:
        """Release the driver.  Idempotent; discover() must not be called afterwards."""
        ...


def open_backend(sim_spec: str | None, node: str, *, nvml: Any = None) -> GpuBackend:
    """The backend for this host: simulated when ``sim_spec`` is given, else NVML.

    ``nvml`` replaces the pynvml module (tests pass a fake).  Raises ``SimSpecError`` for a
    bad spec and ``NoGpuError`` when there is no NVIDIA driver.
    """
    if sim_spec is not None:
        from .sim import SimBackend

        return SimBackend(sim_spec, node)
    from .nvml import NvmlBackend

    return NvmlBackend(nvml=nvml)
