"""The Alibaba openb formats (cluster-trace-gpu-v2023): node lists and pod lists.

A node list (``openb_node_list_gpu_node.csv``) is ``sn,cpu_milli,memory_mib,gpu,model``:
one node a row, its CPUs in thousandths, memory in MiB, GPU count and model.  A pod list
(``openb_pod_list_default.csv``) is ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,
gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``: per pod its CPUs and
memory, ``num_gpu`` GPUs of which it wants ``gpu_milli`` thousandths each (below 1,000
only with one GPU: a share), and in ``gpu_spec`` the GPU models it may use (``|``-joined;
empty: any).

Units.  A node built from a node list counts its CPUs in thousandths (``cpus`` =
``cpu_milli``) so that pod requests such as 2,152 milli-CPUs are exact; pods read for the
fill experiment are in the same unit.  The node list gives no GPU memory, and a share is a
fraction of *any* GPU, so every GPU gets ``GPU_MEMORY_MB`` (32 MiB per milli-GPU): a
share of ``m`` milli-GPU is a ``--gpu-mem`` of ``32 m`` MiB, and shares on one GPU add up to
1,000 milli exactly when their memory adds up to the GPU's.

Bad input never raises past ``OpenbError`` (a file that cannot be used, one line); a row
that cannot be read is skipped and counted.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field

from ..sched.snapshot import GpuView, NodeView

__all__ = ["OpenbError", "Pod", "PodList", "read_nodes", "read_pods", "is_pod_list", "GPU_MEMORY_MB",
           "MB_PER_MILLI"]

MB_PER_MILLI = 32
GPU_MEMORY_MB = 1000 * MB_PER_MILLI
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
MAX_NODES = 100_000


class OpenbError(ValueError):
    """A node or pod list that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int                 # per GPU; below 1000 only with one GPU
    gpu_spec: tuple[str, ...]      # the models it may use; empty: any
    qos: str | None = None

    @property
    def milli(self) -> int:
        """The GPU it asks for in all, in thousandths."""
        return self.num_gpu * self.gpu_milli

    @property
    def share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < 1000


@dataclass
class PodList:
    pods: list[Pod] = field(default_factory=list)
    rows: int = 0
    skipped: Counter = field(default_factory=Counter)


def _rows(path: str, need: tuple[str, ...], what: str):
    try:
        f = open(path, newline="", encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise OpenbError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise OpenbError(f"{path}: is a directory, not a {what} file") from None
    except OSError as e:
        raise OpenbError(f"{path}: {e.strerror}") from None
    with f:
        reader = csv.reader(line.replace("\0", "") for line in f)
        try:
            header = [c.strip().lstrip("\ufeff").lower() for c in next(reader, [])]
        except csv.Error as e:
            raise OpenbError(f"{path}: unreadable header: {e}") from None
        missing = [c for c in need if c not in header]
        if missing:
            raise OpenbError(f"{path}: missing column(s) {', '.join(missing)}; a {what} names "
                             f"{', '.join(need)}")
        index = {c: i for i, c in reversed(list(enumerate(header)))}
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error:
                yield None
                continue
            if row and any(c.strip() for c in row):
                yield {c: (row[i].strip() if i < len(row) else "") for c, i in index.items()}


def _int(text: str) -> int | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return int(v) if v == int(v) and v >= 0 else None


def read_nodes(path: str) -> tuple[NodeView, ...]:
    """The nodes of an openb node list, in file order (names must be unique)."""
    out: list[NodeView] = []
    seen: set[str] = set()
    for n, row in enumerate(_rows(path, NODE_COLUMNS, "node list"), start=2):
        if row is None:
            raise OpenbError(f"{path}: line {n}: unreadable row")
        name = row["sn"]
        cpus, mem, gpus = _int(row["cpu_milli"]), _int(row["memory_mib"]), _int(row["gpu"])
        model = row["model"]
        if not name or cpus is None or mem is None or gpus is None or (gpus and not model):
            raise OpenbError(f"{path}: line {n}: want sn,cpu_milli,memory_mib,gpu,model with "
                             f"whole numbers and a model for GPU nodes")
        if name in seen:
            raise OpenbError(f"{path}: line {n}: node {name!r} is listed twice")
        if gpus > 1024 or len(out) >= MAX_NODES:
            raise OpenbError(f"{path}: line {n}: at most 1024 GPUs a node and {MAX_NODES} nodes")
        seen.add(name)
        views = tuple(GpuView(index=i, uuid=f"GPU-sim-{name}-{i}", model=model, memory_mb=GPU_MEMORY_MB)
                      for i in range(gpus))
        out.append(NodeView(name=name, cpus=cpus, mem_mb=mem, gpus=views))
    if not out:
        raise OpenbError(f"{path}: no nodes")
    return tuple(out)


def is_pod_list(path: str) -> bool:
    """Whether ``path``'s header is an openb pod list's (else a jobs.csv-style trace)."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            header = {c.strip().lstrip("\ufeff").lower() for c in next(csv.reader(f), [])}
    except (OSError, csv.Error):
        return False
    return all(c in header for c in POD_COLUMNS)


def read_pods(path: str) -> PodList:
    """The pods of an openb pod list; unreadable rows are skipped and counted."""
    out = PodList()
    for row in _rows(path, POD_COLUMNS, "pod list"):
        out.rows += 1
        if row is None:
            out.skipped["malformed"] += 1
            continue
        cpus, mem, num, milli = (_int(row[c]) for c in POD_COLUMNS)
        if cpus is None or mem is None or num is None or milli is None or milli > 1000 \
                or (num > 1 and milli != 1000) or (num == 0 and milli) or (num and not milli):
            out.skipped["malformed"] += 1
            continue
        spec = tuple(sorted({s.strip() for s in row.get("gpu_spec", "").split("|") if s.strip()}))
        out.pods.append(Pod(row.get("name") or f"row {out.rows}", cpus, mem, num, milli, spec,
                            row.get("qos") or None))
    return out
