"""``[worker] gpu_modes``: how each GPU is meant to be shared, as written in the config.

The syntax alone (selectors, modes, which GPU gets which): ``gpud.config`` checks it, the
simulator applies it to its virtual nodes, and the worker (``gpud.worker.gpumodes``) brings
its GPUs to it.  See there for what each mode does on a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..model import MPS_MAX_CLIENTS
from . import mig

MAX_REPLICAS = 1024
_INDEXES = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# -- the config form ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuMode:
    """One GPU's configured sharing mode."""

    kind: str = "whole"                 # "whole" | "mig" | "mps" | "timeslice"
    layout: str | None = None           # mig: a named static layout; None when dynamic
    dynamic: bool = False               # mig: the scheduler lays slices out; mps: whole or shares, by demand
    max_clients: int = MPS_MAX_CLIENTS  # mps
    thread_percentage: int | None = None  # mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for every job
    replicas: int = 1                   # timeslice
    managed: bool = True                # False: not in gpu_modes; MIG is left as found


WHOLE = GpuMode()
UNMANAGED = GpuMode(managed=False)


def parse_mode(text: Any) -> GpuMode:
    """A mode as written in gpu_modes; ValueError saying what to write instead."""
    if not isinstance(text, str):
        raise ValueError(f"a mode must be a string such as \"mig:dynamic\", not {text!r}")
    kind, _, arg = text.strip().partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    if kind == "whole" and not arg:
        return WHOLE
    if kind == "mig":
        if arg.lower() == "dynamic":
            return GpuMode("mig", dynamic=True)
        _check_layout_name(arg)
        return GpuMode("mig", layout=arg.lower())
    if kind == "mps":
        if arg.lower() == "dynamic":
            return GpuMode("mps", dynamic=True)
        return _parse_mps(arg)
    if kind == "timeslice":
        if not arg.isdigit() or not 1 <= int(arg) <= MAX_REPLICAS:
            raise ValueError(f"timeslice needs the number of jobs that share the GPU, 1-{MAX_REPLICAS}, "
                             f"as in \"timeslice:4\", not {text!r}")
        return GpuMode("timeslice", replicas=int(arg))
    raise ValueError(f"unknown GPU mode {text!r}: use whole, mig:LAYOUT, mig:dynamic, "
                     "mps[:max_clients=N,thread_percentage=P], mps:dynamic or timeslice:N")


def _check_layout_name(name: str) -> None:
    key = name.lower()
    if key in ("all-enabled", "all-balanced"):
        return
    if key.startswith("all-"):
        try:
            profile = mig.parse_profile(key[4:])
        except mig.MigError:
            profile = None
        if any(profile in mig.catalog(m) for m in mig.mig_models()):
            return   # whether this GPU's model has it is checked at start
    raise ValueError(f"unknown MIG layout {name!r}: use dynamic, all-balanced, all-enabled or "
                     "all-PROFILE such as all-1g.10gb")


def _parse_mps(arg: str) -> GpuMode:
    values = {"max_clients": MPS_MAX_CLIENTS, "thread_percentage": None}
    for item in filter(None, (w.strip() for w in arg.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in values or not value.strip().isdigit():
            raise ValueError(f"mps takes max_clients=N and thread_percentage=P, as in "
                             f"\"mps:max_clients=16,thread_percentage=25\", not {item!r}")
        values[key] = int(value)
    if not 1 <= values["max_clients"] <= MPS_MAX_CLIENTS:
        raise ValueError(f"mps max_clients must be 1-{MPS_MAX_CLIENTS} (the most MPS serves), "
                         f"not {values['max_clients']}")
    pct = values["thread_percentage"]
    if pct is not None and not 1 <= pct <= 100:
        raise ValueError(f"mps thread_percentage must be 1-100, not {pct}")
    return GpuMode("mps", max_clients=values["max_clients"], thread_percentage=pct)


def parse_selector(key: Any) -> tuple[str | None, frozenset[int] | None]:
    """(node or None, indexes or None for every GPU) of a gpu_modes key."""
    if not isinstance(key, str):
        raise ValueError(f"a GPU selector must be a string, not {key!r}")
    node, colon, spec = key.strip().rpartition(":")
    if colon and not _NODE.match(node):
        raise ValueError(f"invalid node name {node!r} in GPU selector {key!r}")
    spec = spec.replace(" ", "")
    if spec == "*":
        return node or None, None
    if not _INDEXES.match(spec):
        raise ValueError(f"invalid GPU selector {key!r}: use *, 3, 0-3 or 0,2,4-7, "
                         "optionally after NODE:")
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if a > b or b >= 1024:
            raise ValueError(f"invalid GPU range {part!r} in {key!r}")
        out.update(range(a, b + 1))
    return node or None, frozenset(out)


class ModeTable(dict):
    """gpu_modes as written (selector -> mode text), checked.  Hashable so that it can sit
    in the frozen config; never changed after parsing."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


def parse_gpu_modes(value: Any) -> ModeTable:
    """The config parser for ``[worker] gpu_modes``; ValueError with the first problem."""
    if not isinstance(value, Mapping):
        raise ValueError("must be a table of GPU selectors and modes, such as "
                         "{ \"0-3\" = \"mig:all-1g.10gb\", \"4\" = \"mps\" }")
    seen: dict[tuple[str | None, int], str] = {}
    out = ModeTable()
    for key, text in value.items():
        try:
            node, indexes = parse_selector(key)
            parse_mode(text)
        except ValueError as e:
            raise ValueError(f"{key!r}: {e}") from None
        for i in indexes or ():
            other = seen.setdefault((node, i), key)
            if other != key:
                raise ValueError(f"GPU {i} is in both {other!r} and {key!r}; name each GPU once")
        out[str(key)] = str(text)
    return out


def modes_for(table: Mapping[str, str], node: str, indexes: Iterable[int]) -> dict[int, GpuMode]:
    """Each GPU's mode on ``node``: its own entry, else a plain one, else ``whole``."""
    ranked: list[tuple[int, frozenset[int] | None, GpuMode]] = []
    for key, text in table.items():
        who, which = parse_selector(key)
        if who is not None and who != node:
            continue
        rank = (2 if who else 0) + (1 if which is not None else 0)
        ranked.append((rank, which, parse_mode(text)))
    out = {}
    for i in indexes:
        hits = [(rank, mode) for rank, which, mode in ranked if which is None or i in which]
        out[i] = max(hits, key=lambda h: h[0])[1] if hits else UNMANAGED
    return out
