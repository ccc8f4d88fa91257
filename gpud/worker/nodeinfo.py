"""This host as the head sees it: its CPUs, memory, GPUs, labels and address."""

from __future__ import annotations

import os
import socket

import psutil

from ..config import Config
from ..gpu.backend import GpuBackend
from ..model import NodeInfo

SIM_CPUS_PER_GPU = 16       # a simulated GPU server is sized like a real one,
SIM_MEM_MB_PER_GPU = 128 * 1024  # not like the small machine simulating it


def build_node_info(cfg: Config, backend: GpuBackend) -> NodeInfo:
    """This host as the head sees it: config overrides first, then what the machine has.

    With simulated GPUs the host's own CPUs and memory would make the GPUs unreachable
    (a 2-core test box could run two jobs on eight GPUs), so the defaults follow the GPUs.
    """
    gpus = tuple(backend.discover())
    sim = backend.name == "sim"
    cpus = os.cpu_count() or 1
    mem = psutil.virtual_memory().total // (1 << 20)
    if sim:
        cpus, mem = max(cpus, SIM_CPUS_PER_GPU * len(gpus)), max(mem, SIM_MEM_MB_PER_GPU * len(gpus))
    return NodeInfo(
        name=cfg.worker_name(),
        cpus=cfg.worker.cpus or cpus,
        mem_mb=cfg.worker.mem_mb or mem,
        gpus=gpus,
        labels={**(cfg.worker.labels or {}), "addr": cfg.worker.address or primary_address(),
                **({"features": ",".join(cfg.worker.features)} if cfg.worker.features else {})},
    )


def primary_address() -> str:
    """The IPv4 address this host's default route leaves by (no packet is sent), else its
    host name: what other nodes use to reach a multi-node job's rank 0."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))   # TEST-NET-1: only picks a route
            addr = s.getsockname()[0]
        if addr and not addr.startswith("127."):
            return addr
    except OSError:
        pass
    return socket.gethostname()
