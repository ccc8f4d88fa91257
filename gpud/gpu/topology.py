"""How a host's GPUs are wired: each GPU's NUMA node and its NVLink peers.

Theory of operation
-------------------
Big jobs run fastest on GPUs that talk over NVLink and sit near the CPUs they use, so
every GPU a worker reports carries ``numa_node`` (None: unknown) and ``nvlink_peers`` (the
indices of the GPUs it reaches over NVLink; empty: none, or unknown).  GPUs that are each
other's peers form an *island*: all eight of an HGX board behind its NVSwitches, the two
cards of an NVLink-bridged pair, or nothing at all on plain PCIe cards.  Both backends fill
the fields here, after discovery, and never fail discovery over them.

Simulated GPUs take their wiring from the spec's optional suffix (``parse_topology``):
``8xH100-80GB@nvswitch`` (every GPU a peer of every other), ``@islandsN`` (consecutive
islands of N: ``@islands4`` is two 4-GPU islands of an 8-GPU host), ``@none`` (no NVLink).
Without a suffix, eight H100, H200, A100 or B200 (the HGX boards) are all-to-all and
anything else has no NVLink.  Simulated GPUs are split evenly over two NUMA nodes, in
index order, as on a two-socket server.

Real GPUs are read through NVML, read-only (``read_nvml``):

* NUMA node: the ``numa_node`` the kernel gives the GPU's PCI device in sysfs, which is
  the CPU socket the GPU hangs off; else ``nvmlDeviceGetNumaNodeId``, which answers only
  where the GPU is itself a NUMA node (coherent platforms); else, for a GPU still unknown,
  the node of another GPU that ``nvmlDeviceGetTopologyCommonAncestor`` places under the
  same NUMA node (a common ancestor no farther than ``NVML_TOPOLOGY_NODE``).
* peers: each active link (``nvmlDeviceGetNvLinkState``) leads to a remote PCI device
  (``nvmlDeviceGetNvLinkRemotePciInfo``): another GPU of this host, which is a peer, or an
  NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType``, or any device that is not one of our
  GPUs on drivers without that call).  GPUs that reach a common switch are all peers.

Any call the driver or the board does not support leaves that field empty, with a debug
line: a host without NVLink is a normal host.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from ..model import GpuInfo

log = logging.getLogger(__name__)

# NVML's values (nvml.h), for drivers whose pynvml lacks a constant.
NVML_TOPOLOGY_NODE = 40
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

SIM_NUMA_NODES = 2
HGX_FAMILIES = frozenset({"H100", "H200", "A100", "B200"})   # 8 of them: NVSwitch by default
HGX_SIZE = 8
_ISLANDS = re.compile(r"^islands(\d+)$")
TOPOLOGY_HELP = "use @nvswitch, @islandsN (e.g. @islands4) or @none"


@dataclass(frozen=True)
class Wiring:
    """One GPU's place in the host."""

    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()


def apply(gpus: Iterable[GpuInfo], wiring: dict[int, Wiring]) -> list[GpuInfo]:
    """``gpus`` with their NUMA node and peers filled in from ``wiring`` (by index)."""
    out = []
    for g in gpus:
        w = wiring.get(g.index, Wiring())
        out.append(replace(g, numa_node=w.numa_node, nvlink_peers=w.nvlink_peers))
    return out


# -- simulated GPUs ---------------------------------------------------------------------------

def split_spec(spec: str) -> tuple[str, str | None]:
    """(the GPU groups, the topology suffix or None): ``"8xH100-80GB@islands4"`` ->
    ``("8xH100-80GB", "islands4")``."""
    groups, at, suffix = spec.partition("@")
    return groups, (suffix.strip().lower() if at else None)


def parse_topology(suffix: str | None, models: list[str]) -> list[tuple[int, ...]]:
    """The NVLink islands of GPUs with these models (index order) under ``suffix``;
    ValueError with what to write instead."""
    n = len(models)
    if suffix is None:
        families = {m.split("-")[0] for m in models}
        hgx = n == HGX_SIZE and len(set(models)) == 1 and families <= HGX_FAMILIES
        return [tuple(range(n))] if hgx else []
    if suffix == "nvswitch":
        return [tuple(range(n))] if n > 1 else []
    if suffix == "none":
        return []
    m = _ISLANDS.match(suffix)
    if not m:
        raise ValueError(f"unknown topology {suffix!r}; {TOPOLOGY_HELP}")
    size = int(m.group(1))
    if size < 2:
        raise ValueError(f"an NVLink island has at least 2 GPUs, not {size}; {TOPOLOGY_HELP}")
    if n % size:
        raise ValueError(f"@islands{size} needs a multiple of {size} GPUs, not {n}")
    return [tuple(range(i, i + size)) for i in range(0, n, size)]


def sim_wiring(models: list[str], suffix: str | None) -> dict[int, Wiring]:
    """Each simulated GPU's NUMA node (two nodes, split evenly) and peers."""
    n = len(models)
    peers: dict[int, tuple[int, ...]] = {}
    for island in parse_topology(suffix, models):
        for i in island:
            peers[i] = tuple(j for j in island if j != i)
    return {i: Wiring(numa_node=i * SIM_NUMA_NODES // n, nvlink_peers=peers.get(i, ())) for i in range(n)}


# -- NVML -------------------------------------------------------------------------------------

def read_nvml(nv: Any, handles: dict[int, Any], sysfs_root: str = "/sys") -> dict[int, Wiring]:
    """The wiring of the GPUs behind ``handles`` (index -> NVML device handle)."""
    buses = {i: _bus_id(nv, h) for i, h in handles.items()}
    numa = {i: _numa_node(nv, h, buses[i], sysfs_root) for i, h in handles.items()}
    _numa_from_neighbours(nv, handles, numa)
    peers = _nvlink_peers(nv, handles, buses)
    return {i: Wiring(numa_node=numa[i], nvlink_peers=peers.get(i, ())) for i in handles}


def normalize_bus_id(raw: Any) -> str | None:
    """NVML's ``00000000:18:00.0`` as sysfs spells it: ``0000:18:00.0``."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    m = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", text.strip("\x00 "))
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _call(what: str, fn: Any, *args: Any) -> Any:
    """An NVML call whose failure (or absence, on an old pynvml) only means 'unknown'."""
    try:
        return fn(*args)
    except Exception as e:   # NVMLError of any kind, AttributeError for a missing binding
        log.debug("GPU topology: %s: %s", what, e)
        return None


def _bus_id(nv: Any, handle: Any) -> str | None:
    info = _call("nvmlDeviceGetPciInfo", lambda: nv.nvmlDeviceGetPciInfo(handle))
    return None if info is None else normalize_bus_id(getattr(info, "busId", ""))


def _numa_node(nv: Any, handle: Any, bus: str | None, sysfs_root: str) -> int | None:
    if bus is not None:
        path = os.path.join(sysfs_root, "bus", "pci", "devices", bus, "numa_node")
        try:
            with open(path, encoding="ascii") as f:
                node = int(f.read().strip())
            if node >= 0:        # -1: the kernel does not know
                return node
        except (OSError, ValueError) as e:
            log.debug("GPU topology: %s: %s", path, e)
    node = _call("nvmlDeviceGetNumaNodeId", lambda: nv.nvmlDeviceGetNumaNodeId(handle))
    return node if isinstance(node, int) and node >= 0 else None


def _numa_from_neighbours(nv: Any, handles: dict[int, Any], numa: dict[int, int | None]) -> None:
    """A GPU of unknown NUMA node shares the node of a GPU within one NUMA node of it."""
    limit = getattr(nv, "NVML_TOPOLOGY_NODE", NVML_TOPOLOGY_NODE)
    known = [j for j in handles if numa[j] is not None]
    for i in handles:
        if numa[i] is not None:
            continue
        for j in known:
            level = _call("nvmlDeviceGetTopologyCommonAncestor",
                          lambda: nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            if isinstance(level, int) and level <= limit:
                numa[i] = numa[j]
                break


def _nvlink_peers(nv: Any, handles: dict[int, Any], buses: dict[int, str | None]) -> dict[int, tuple[int, ...]]:
    by_bus = {b: i for i, b in buses.items() if b is not None}
    direct: dict[int, set[int]] = {i: set() for i in handles}
    switches: dict[int, set[str]] = {i: set() for i in handles}
    for i, h in handles.items():
        for remote, kind in _links(nv, i, h):
            if kind == NVML_NVLINK_DEVICE_TYPE_SWITCH or (kind is None and remote not in by_bus):
                switches[i].add(remote)
            elif remote in by_bus and by_bus[remote] != i:
                direct[i].add(by_bus[remote])
                direct[by_bus[remote]].add(i)
    for i in handles:          # GPUs behind a common NVSwitch reach each other
        for j in handles:
            if i != j and switches[i] & switches[j]:
                direct[i].add(j)
    return {i: tuple(sorted(p)) for i, p in direct.items() if p}


def _links(nv: Any, index: int, handle: Any) -> list[tuple[str, int | None]]:
    """(remote bus id, remote device type or None) of each active NVLink of one GPU."""
    enabled = getattr(nv, "NVML_FEATURE_ENABLED", NVML_FEATURE_ENABLED)
    not_supported = getattr(nv, "NVMLError_NotSupported", ())
    invalid = getattr(nv, "NVMLError_InvalidArgument", ())
    out: list[tuple[str, int | None]] = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVML_NVLINK_MAX_LINKS)):
        try:
            state = nv.nvmlDeviceGetNvLinkState(handle, link)
        except invalid:          # past the board's last link
            break
        except not_supported as e:
            if link == 0:        # a board without NVLink
                log.debug("GPU topology: GPU %d has no NVLink: %s", index, e)
                break
            continue
        except Exception as e:
            log.debug("GPU topology: GPU %d link %d: %s", index, link, e)
            continue
        if state != enabled:
            continue
        info = _call(f"GPU {index} link {link} remote", lambda: nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        remote = None if info is None else normalize_bus_id(getattr(info, "busId", ""))
        if remote is None:
            continue
        kind = _call(f"GPU {index} link {link} remote type",
                     lambda: nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        out.append((remote, kind if isinstance(kind, int) else None))
    return out
