"""Simulated GPUs, described by a spec like ``8xH100-80GB`` or ``4xA100-80GB,2xA30-24GB``.

Theory of operation
-------------------
A spec is a comma-joined list of ``COUNTxMODEL`` groups; GPUs are numbered in spec order.
A model is ``<family>-<N>GB`` (``H100-80GB``, ``H200-141GB``, ``L40S-48GB``, any name of
that shape) and its memory is ``N`` GiB.  Each simulated GPU gets a UUID derived from
(node, index, model), so it is stable across restarts of the same worker and unique across
nodes, exactly like a real board's UUID would be.
"""

from __future__ import annotations

import re
import uuid

from ..model import GpuInfo
from .backend import SimSpecError

MAX_GPUS = 1024  # far beyond any real host; stops a typo from creating millions of GPUs

# A fixed namespace makes the UUIDs reproducible everywhere.
_UUID_NAMESPACE = uuid.UUID("6f1c2a8e-3d4b-5c6d-8e7f-0a1b2c3d4e5f")

_GROUP = re.compile(r"^(\d+)\s*[xX]\s*(\S+)$")
_MODEL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*)-(\d+)[gG][bB]$")
_USAGE = "use COUNTxMODEL[,COUNTxMODEL...], e.g. 8xH100-80GB"


def parse_model(model: str) -> tuple[str, int]:
    """(family, GiB) of a model name such as ``H100-80GB``; ValueError otherwise."""
    m = _MODEL.match(model)
    if not m or int(m.group(2)) <= 0:
        raise ValueError(f"invalid GPU model {model!r}: use NAME-<N>GB, e.g. H100-80GB")
    return m.group(1), int(m.group(2))


def parse_spec(spec: str) -> list[str]:
    """The model of each simulated GPU, in index order; SimSpecError with one line."""
    if not isinstance(spec, str) or not spec.strip():
        raise SimSpecError(f"invalid --sim spec {spec!r}: {_USAGE}")
    models: list[str] = []
    for group in spec.split(","):
        m = _GROUP.match(group.strip())
        if not m:
            raise SimSpecError(f"invalid --sim spec {spec!r}: {_USAGE}")
        count, model = int(m.group(1)), m.group(2)
        try:
            family, gib = parse_model(model)
        except ValueError as e:
            raise SimSpecError(f"invalid --sim spec {spec!r}: {e}") from None
        if count <= 0:
            raise SimSpecError(f"invalid --sim spec {spec!r}: a GPU count must be at least 1")
        models.extend([f"{family}-{gib}GB"] * count)
        if len(models) > MAX_GPUS:
            raise SimSpecError(f"invalid --sim spec {spec!r}: at most {MAX_GPUS} GPUs per node")
    return models


def sim_uuid(node: str, index: int, model: str) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}\x00{index}\x00{model}"))


class SimBackend:
    """GPUs that exist only on paper, with the same contract as the NVML backend."""

    name = "sim"

    def __init__(self, spec: str, node: str) -> None:
        self.spec = spec
        self.node = node
        self._gpus = [
            GpuInfo(index=i, uuid=sim_uuid(node, i, model), model=model,
                    memory_mb=parse_model(model)[1] * 1024)
            for i, model in enumerate(parse_spec(spec))
        ]
        self._closed = False

    def discover(self) -> list[GpuInfo]:
        if self._closed:
            raise RuntimeError("sim GPU backend used after close()")
        return list(self._gpus)

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"SimBackend({self.spec!r}, node={self.node!r})"
