"""The device nodes behind a node's GPUs, as the worker fences them (gpud.worker.cgroups).

Every NVIDIA GPU is the character device 195:<minor> (``/dev/nvidia<minor>``); the driver's
control node is 195:255 (``/dev/nvidiactl``) and 195:254 is ``/dev/nvidia-modeset``.  A MIG
slice is reached through the GPU's node plus two capability nodes of the ``nvidia-caps``
driver (dynamic major, ``/dev/nvidia-caps/nvidia-cap<N>``): one for its GPU instance, one
for its compute instance.  ``nvidia-uvm`` has a dynamic major too and is shared by every
CUDA process, so it is never fenced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NVIDIA_MAJOR = 195
CONTROL_MINORS = frozenset({254, 255})   # nvidia-modeset, nvidiactl: every CUDA process opens them


@dataclass(frozen=True)
class GpuDevices:
    """One node's GPU device nodes: what a job's device fence is built from."""

    minors: dict[int, int] = field(default_factory=dict)      # GPU index -> minor of /dev/nvidia<minor>
    caps: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)  # (GPU, slice start) -> cap minors
    caps_major: int | None = None       # the nvidia-caps driver's major; None: no MIG caps here
    paths: dict[int, str] = field(default_factory=dict)       # GPU index -> its device node's path

    def allowed(self, gpus: list[tuple[int, int | None]]) -> dict[int, frozenset[int]]:
        """For each fenced major, the minors a job holding ``gpus`` ((index, slice start or
        None) pairs) may open; minors of other majors are not fenced."""
        out = {NVIDIA_MAJOR: frozenset(CONTROL_MINORS | {self.minors.get(i, i) for i, _ in gpus})}
        if self.caps_major is not None:
            out[self.caps_major] = frozenset(m for i, s in gpus if s is not None
                                             for m in self.caps.get((i, s), ()))
        return out

    def known(self) -> list[tuple[int, int]]:
        """Every (major, minor) of this node's GPUs and slices, for deny lists."""
        out = [(NVIDIA_MAJOR, m) for m in sorted(set(self.minors.values()))]
        if self.caps_major is not None:
            out += [(self.caps_major, m) for m in sorted({m for ms in self.caps.values() for m in ms})]
        return out


def caps_major(proc_devices: str = "/proc/devices") -> int | None:
    """The nvidia-caps driver's character major, from /proc/devices; None when not loaded."""
    try:
        with open(proc_devices, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    chars = text.split("Block devices:")[0]
    for line in chars.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
            return int(parts[0])
    return None
