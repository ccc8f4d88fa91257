"""MIG profile catalog and placement rules: pure data and functions, no NVML, no I/O.

Theory of operation
-------------------
A MIG-capable GPU is cut along two axes.  Its memory (with the L2 cache and memory
controllers in front of it) is split into *memory slots*, 8 on A100/H100/H200 and 4 on
A30; its SMs are grouped into *compute slices*, 7 (4 on A30).  A GPU instance profile
such as ``3g.40gb`` takes a number of compute slices (the ``3g``) and a run of adjacent
memory slots; the ``40gb`` in the name is the memory those slots hold, rounded.

NVIDIA fixes where each profile may sit.  A *placement* ``start:size`` is a run of memory
slots ``[start, start+size)``; each profile has a short list of them, which the driver
reports with ``nvidia-smi mig -lgipp`` and the MIG User Guide ("Supported MIG Profiles")
draws.  On the 8-slot GPUs::

    1g (and 1g+me)      starts 0..6, size 1     slot 7 is never a 1g's own slot
    1g with 2 slots     starts 0,2,4,6, size 2  e.g. 1g.20gb on A100-80GB
    2g                  starts 0,2,4, size 2
    3g                  starts 0,4, size 4      a 3g holds 4 slots but 3 compute slices
    4g                  start 0, size 4
    7g                  start 0, size 8         the whole GPU

and on A30 ``1g`` at 0..3 size 1, ``2g`` at 0,2 size 2, ``4g`` at 0 size 4.  So a 4g and a
3g share an A100 (slots 0-3 and 4-7) but two 4g do not, and seven 1g leave slot 7 idle.

A *layout* is a set of ``Slice(profile, start)``.  It is valid when every slice starts at
one of its profile's placements, no two slices share a memory slot, no profile exceeds
its instance count, the compute slices add up to at most 7 (4 on A30), and at most one
slice carries media extensions (``+me``: the GPU has a single OFA engine to give away).

Choosing positions.  ``place`` tries every way to put the requested profiles into the
free slots (a few hundred at most: there are only 8 slots) without moving what is
there, and keeps the one that leaves the most room: first the most compute still
placeable, then the largest profile that still fits, then the most free placements,
then the highest slots.  That pushes small slices to the top of the memory range and
keeps the low slots free for the 4g and 3g profiles, which start only at 0 (or 4).
``layouts_for_demand`` picks which of the wanted slices to create: the set that serves
the most compute slices, then the most jobs, then uses the fewest memory slots, and
hands it to ``place``.  Every choice ends in a fixed order, so the same input always
gives the same answer.

Memory sizes are what NVML reports for each instance, in MiB, as nvidia-smi lists them
(drivers move them a little); the GB in a name is the board's nominal share, a bit more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

__all__ = [
    "MigError", "Placement", "Slice", "MigProfile",
    "catalog", "supports_mig", "mig_models", "compute_slots", "memory_slots",
    "parse_profile", "profile_for_nvml", "validate_layout", "is_valid_layout",
    "free_placements", "place", "layouts_for_demand", "named_layout", "layout_names",
    "profile_for_memory",
]


class MigError(ValueError):
    """A MIG request or layout that cannot be; the message is one line for a user."""


@dataclass(frozen=True, order=True)
class Placement:
    """A run of memory slots ``[start, start + size)``."""

    start: int
    size: int

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True, order=True)
class Slice:
    """One GPU instance placed on a GPU: its profile and first memory slot."""

    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start}

    @classmethod
    def from_dict(cls, d: Any) -> "Slice":
        """Build from a decoded message; MigError on anything malformed."""
        if not isinstance(d, Mapping):
            raise MigError(f"a MIG slice must be an object, not {d!r}")
        profile, start = d.get("profile"), d.get("start")
        if not isinstance(profile, str):
            raise MigError(f"MIG slice without a profile name: {dict(d)!r}")
        if isinstance(start, bool) or not isinstance(start, int):
            raise MigError(f"MIG slice {profile}: start slot must be an integer, not {start!r}")
        return cls(profile, start)


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile on one GPU model."""

    name: str                 # "1g.10gb", "1g.10gb+me"
    gpu_model: str            # "A100-80GB"
    compute_slices: int       # of 7 (4 on A30)
    memory_slices: int        # of 8 (4 on A30); also the size of every placement
    memory_mb: int            # as NVML reports it, MiB
    max_count: int            # instances of this profile one GPU can hold
    placements: tuple[Placement, ...]
    nvml_profile: str         # pynvml constant name, e.g. "NVML_GPU_INSTANCE_PROFILE_1_SLICE"

    @property
    def fraction(self) -> float:
        """Share of the GPU's compute, which is what a slice is billed for."""
        gpu = _GPUS.get(self.gpu_model)
        return self.compute_slices / (gpu.compute_slots if gpu else 7)

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


# ---------------------------------------------------------------------------------
# The catalog.  Shapes are per GPU family; names and sizes per model, in shape order.

_NVML = "NVML_GPU_INSTANCE_PROFILE_"

# (compute slices, memory slots, max count, starts, NVML profile constant suffix)
_SHAPES_8_SLOT = (
    (1, 1, 7, (0, 1, 2, 3, 4, 5, 6), "1_SLICE"),
    (1, 1, 1, (0, 1, 2, 3, 4, 5, 6), "1_SLICE_REV1"),   # +me
    (1, 2, 4, (0, 2, 4, 6), "1_SLICE_REV2"),            # 1g with twice the memory
    (2, 2, 3, (0, 2, 4), "2_SLICE"),
    (3, 4, 2, (0, 4), "3_SLICE"),
    (4, 4, 1, (0,), "4_SLICE"),
    (7, 8, 1, (0,), "7_SLICE"),
)
_SHAPES_A30 = (
    (1, 1, 4, (0, 1, 2, 3), "1_SLICE"),
    (1, 1, 1, (0, 1, 2, 3), "1_SLICE_REV1"),            # +me
    (2, 2, 2, (0, 2), "2_SLICE"),
    (2, 2, 1, (0, 2), "2_SLICE_REV1"),                  # +me
    (4, 4, 1, (0,), "4_SLICE"),
)

# model: (compute slots, memory slots, shapes, ((profile name, MiB), ...))
_TABLE: dict[str, tuple[int, int, tuple, tuple[tuple[str, int], ...]]] = {
    "A100-40GB": (7, 8, _SHAPES_8_SLOT, (
        ("1g.5gb", 4864), ("1g.5gb+me", 4864), ("1g.10gb", 9856), ("2g.10gb", 9856),
        ("3g.20gb", 19968), ("4g.20gb", 19968), ("7g.40gb", 40192))),
    "A100-80GB": (7, 8, _SHAPES_8_SLOT, (
        ("1g.10gb", 9728), ("1g.10gb+me", 9728), ("1g.20gb", 19968), ("2g.20gb", 19968),
        ("3g.40gb", 40192), ("4g.40gb", 40192), ("7g.80gb", 80896))),
    "A30-24GB": (4, 4, _SHAPES_A30, (
        ("1g.6gb", 5952), ("1g.6gb+me", 5952), ("2g.12gb", 11968), ("2g.12gb+me", 11968),
        ("4g.24gb", 24064))),
    "H100-80GB": (7, 8, _SHAPES_8_SLOT, (
        ("1g.10gb", 9984), ("1g.10gb+me", 9984), ("1g.20gb", 20096), ("2g.20gb", 20096),
        ("3g.40gb", 40448), ("4g.40gb", 40448), ("7g.80gb", 81152))),
    "H100-94GB": (7, 8, _SHAPES_8_SLOT, (
        ("1g.12gb", 11008), ("1g.12gb+me", 11008), ("1g.24gb", 22144), ("2g.24gb", 22144),
        ("3g.47gb", 47488), ("4g.47gb", 47488), ("7g.94gb", 95360))),
    "H200-141GB": (7, 8, _SHAPES_8_SLOT, (
        ("1g.18gb", 16384), ("1g.18gb+me", 16384), ("1g.35gb", 33024), ("2g.35gb", 33024),
        ("3g.71gb", 71168), ("4g.71gb", 71168), ("7g.141gb", 143104))),
}

# Other spellings of the same boards (upper case): H100 NVL is the 94 GB part.
_ALIASES = {"H100-NVL": "H100-94GB", "H100NVL": "H100-94GB", "A30": "A30-24GB",
            "H200": "H200-141GB", "H200-NVL": "H200-141GB"}


@dataclass(frozen=True)
class _Gpu:
    model: str
    compute_slots: int
    memory_slots: int
    profiles: tuple[MigProfile, ...]      # smallest first, as NVIDIA lists them

    @property
    def by_name(self) -> dict[str, MigProfile]:
        return {p.name: p for p in self.profiles}


def _build(model: str) -> _Gpu:
    compute, slots, shapes, names = _TABLE[model]
    profiles = []
    for (c, m, count, starts, nvml), (name, mib) in zip(shapes, names, strict=True):
        if not name.startswith(f"{c}g.") or (nvml.endswith("REV1") != name.endswith("+me")):
            raise AssertionError(f"MIG table for {model}: {name} does not match its shape")
        profiles.append(MigProfile(name, model, c, m, mib, count,
                                   tuple(Placement(s, m) for s in starts), _NVML + nvml))
    return _Gpu(model, compute, slots, tuple(profiles))


_GPUS: dict[str, _Gpu] = {m: _build(m) for m in _TABLE}
_MODEL_KEYS = {m.upper(): m for m in _GPUS} | _ALIASES


def _gpu(model: Any) -> _Gpu:
    key = _MODEL_KEYS.get(model.strip().upper()) if isinstance(model, str) else None
    if key is None:
        raise MigError(f"GPU model {model!r} does not support MIG here; "
                       f"MIG models: {', '.join(_GPUS)}")
    return _GPUS[key]


def mig_models() -> list[str]:
    """The GPU models with a MIG catalog, by their gpud names."""
    return list(_GPUS)


def supports_mig(model: Any) -> bool:
    try:
        _gpu(model)
    except MigError:
        return False
    return True


def catalog(model: str) -> dict[str, MigProfile]:
    """Profiles of ``model`` by name, smallest first; MigError for a model without MIG."""
    return _gpu(model).by_name


def compute_slots(model: str) -> int:
    return _gpu(model).compute_slots


def memory_slots(model: str) -> int:
    return _gpu(model).memory_slots


_PREFIX = re.compile(r"^(?:nvidia\.com/)?mig[-_ ]*")
_NAME = re.compile(r"^(\d{1,2})g\.(\d{1,4})gb(\+me)?$")


def parse_profile(text: Any, model: str | None = None) -> str:
    """The canonical name for ``text`` (``MIG 1G.10GB`` -> ``1g.10gb``).

    Accepts nvidia-smi's ``MIG 1g.10gb``, Kubernetes' ``mig-1g.10gb`` and mig-parted's
    ``1g.10gb.me``.  With ``model``, the profile must exist on that model.
    """
    if not isinstance(text, str):
        raise MigError(f"invalid MIG profile {text!r}: expected a name like 1g.10gb")
    s = _PREFIX.sub("", text.strip().lower())
    if s.endswith(".me"):
        s = s[:-3] + "+me"
    m = _NAME.match(s)
    if not m:
        raise MigError(f"invalid MIG profile {text!r}: expected a name like 1g.10gb or 3g.40gb")
    name = f"{int(m[1])}g.{int(m[2])}gb{m[3] or ''}"
    if model is not None:
        gpu = _gpu(model)
        if name not in gpu.by_name:
            raise MigError(f"{gpu.model} has no MIG profile {name}; "
                           f"it offers {', '.join(gpu.by_name)}")
    return name


def profile_for_nvml(model: str, nvml_profile: str) -> str:
    """The profile name for an NVML GPU instance profile constant name on ``model``."""
    gpu = _gpu(model)
    for p in gpu.profiles:
        if p.nvml_profile == nvml_profile:
            return p.name
    raise MigError(f"{gpu.model} has no MIG profile for {nvml_profile!r}")


def profile_for_memory(model: str, mem_mb: int) -> str | None:
    """The smallest profile with at least ``mem_mb`` MiB (never a scarce +me one)."""
    gpu = _gpu(model)
    if isinstance(mem_mb, bool) or not isinstance(mem_mb, int) or mem_mb < 0:
        raise MigError(f"GPU memory must be a whole number of MB, not {mem_mb!r}")
    fits = [p for p in gpu.profiles if not p.media_extensions and p.memory_mb >= mem_mb]
    if not fits:
        return None
    return min(fits, key=lambda p: (p.memory_mb, p.compute_slices)).name


# ---------------------------------------------------------------------------------
# Layout state and the validity rules.

@dataclass
class _State:
    """What a set of slices holds: occupied slots, compute, counts, media extensions."""

    mask: int = 0
    compute: int = 0
    counts: dict[str, int] | None = None
    me: int = 0

    def count(self, name: str) -> int:
        return (self.counts or {}).get(name, 0)


def _fits(gpu: _Gpu, st: _State, p: MigProfile, start: int) -> bool:
    """Whether ``p`` at ``start`` can join the (valid) layout ``st``."""
    return (any(pl.start == start for pl in p.placements)
            and st.count(p.name) < p.max_count
            and not (p.media_extensions and st.me)
            and st.compute + p.compute_slices <= gpu.compute_slots
            and not Placement(start, p.memory_slices).mask & st.mask)


def _add(st: _State, p: MigProfile, start: int) -> None:
    st.mask |= Placement(start, p.memory_slices).mask
    st.compute += p.compute_slices
    st.counts = dict(st.counts or {})
    st.counts[p.name] = st.counts.get(p.name, 0) + 1
    st.me += p.media_extensions


def _coerce(gpu: _Gpu, slices: Any) -> list[tuple[MigProfile, int]]:
    if isinstance(slices, (str, bytes, Mapping)) or not isinstance(slices, Iterable):
        raise MigError(f"a MIG layout must be a list of slices, not {slices!r}")
    out = []
    for x in slices:
        if isinstance(x, Mapping):
            x = Slice.from_dict(x)
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            x = Slice(*x)
        if not isinstance(x, Slice):
            raise MigError(f"not a MIG slice: {x!r}")
        if isinstance(x.start, bool) or not isinstance(x.start, int):
            raise MigError(f"MIG slice {x.profile}: start slot must be an integer, not {x.start!r}")
        out.append((gpu.by_name[parse_profile(x.profile, gpu.model)], x.start))
    return out


def _state(gpu: _Gpu, slices: Any) -> _State:
    """The state of a layout, or MigError saying the first thing wrong with it."""
    items = sorted(_coerce(gpu, slices), key=lambda ps: (ps[1], ps[0].name))
    # Whole-layout rules first: "too many 4g" says more than "4g overlaps 4g".
    total = _State(counts={})
    for p, _ in items:
        total.counts[p.name] = total.count(p.name) + 1
        total.compute += p.compute_slices
        total.me += p.media_extensions
    for p in gpu.profiles:
        if total.count(p.name) > p.max_count:
            raise MigError(f"too many {p.name} on {gpu.model}: "
                           f"{total.count(p.name)}, at most {p.max_count}")
    if total.me > 1:
        raise MigError(f"only one media-extension (+me) instance fits on one {gpu.model} GPU")
    if total.compute > gpu.compute_slots:
        raise MigError(f"layout needs {total.compute} compute slices; "
                       f"{gpu.model} has {gpu.compute_slots}")
    st = _State()
    for i, (p, start) in enumerate(items):
        if all(pl.start != start for pl in p.placements):
            starts = ",".join(str(pl.start) for pl in p.placements)
            raise MigError(f"{p.name} cannot start at memory slot {start} on {gpu.model}; "
                           f"it may start at {starts}")
        mine = Placement(start, p.memory_slices).mask
        if mine & st.mask:
            q, qstart = next((q, s) for q, s in items[:i]
                             if Placement(s, q.memory_slices).mask & mine)
            raise MigError(f"{p.name} at slot {start} overlaps {q.name} at slot {qstart} "
                           f"on {gpu.model}")
        _add(st, p, start)
    return st


def validate_layout(model: str, slices: Iterable[Slice]) -> None:
    """Return if ``slices`` can coexist on one ``model`` GPU; else MigError with the reason."""
    _state(_gpu(model), slices)


def is_valid_layout(model: str, slices: Iterable[Slice]) -> bool:
    try:
        validate_layout(model, slices)
    except MigError:
        return False
    return True


def _profile(gpu: _Gpu, text: Any) -> MigProfile:
    return gpu.by_name[parse_profile(text, gpu.model)]


def free_placements(model: str, profile: str, used: Iterable[Slice] = ()) -> list[Placement]:
    """Placements where one more ``profile`` fits next to the valid layout ``used``."""
    gpu = _gpu(model)
    st, p = _state(gpu, used), _profile(gpu, profile)
    return [pl for pl in p.placements if _fits(gpu, st, p, pl.start)]


# ---------------------------------------------------------------------------------
# Choosing positions.

@lru_cache(maxsize=None)
def _potential(model: str, mask: int) -> int:
    """Most compute slices that plain (non +me) profiles could still add to ``mask``."""
    best = 0
    for p in _GPUS[model].profiles:
        if p.media_extensions:
            continue
        for pl in p.placements:
            if not pl.mask & mask:
                best = max(best, p.compute_slices + _potential(model, mask | pl.mask))
    return best


def _room(gpu: _Gpu, mask: int, compute: int) -> tuple[int, int, int]:
    """How much a layout leaves: (compute still placeable, largest profile, placements)."""
    spare = gpu.compute_slots - compute
    free = [p.compute_slices
            for p in gpu.profiles if not p.media_extensions and p.compute_slices <= spare
            for pl in p.placements if not pl.mask & mask]
    return min(spare, _potential(gpu.model, mask)), max(free, default=0), len(free)


def _solutions(gpu: _Gpu, todo: list[MigProfile], st: _State) -> Iterator[tuple[int, ...]]:
    """Every way to add ``todo`` to ``st``, as start slots in ``todo`` order.

    Equal profiles must be adjacent in ``todo``; they take strictly falling starts, so
    each layout comes once.  Starts are tried from the top slot down.
    """
    n = len(todo)
    need_compute = [sum(p.compute_slices for p in todo[i:]) for i in range(n + 1)]
    need_slots = [sum(p.memory_slices for p in todo[i:]) for i in range(n + 1)]
    full = (1 << gpu.memory_slots) - 1
    starts = [0] * n

    def rec(i: int, cur: _State) -> Iterator[tuple[int, ...]]:
        if i == n:
            yield tuple(starts)
            return
        if cur.compute + need_compute[i] > gpu.compute_slots:
            return
        if bin(full & ~cur.mask).count("1") < need_slots[i]:
            return
        p = todo[i]
        ceiling = starts[i - 1] if i and todo[i - 1] is p else gpu.memory_slots
        for pl in reversed(p.placements):
            if pl.start >= ceiling or not _fits(gpu, cur, p, pl.start):
                continue
            nxt = _State(cur.mask, cur.compute, cur.counts, cur.me)
            _add(nxt, p, pl.start)
            starts[i] = pl.start
            yield from rec(i + 1, nxt)

    yield from rec(0, st)


def _place(gpu: _Gpu, wanted: list[MigProfile], st: _State) -> list[Slice] | None:
    # Big profiles first: they have the fewest placements, so the search stays small.
    order = sorted(range(len(wanted)), key=lambda i: (
        -wanted[i].memory_slices, -wanted[i].compute_slices, wanted[i].name, i))
    todo = [wanted[i] for i in order]
    best, best_room = None, None
    for starts in _solutions(gpu, todo, st):
        mask = st.mask
        for p, s in zip(todo, starts):
            mask |= Placement(s, p.memory_slices).mask
        room = _room(gpu, mask, st.compute + sum(p.compute_slices for p in todo))
        if best_room is None or room > best_room:
            best, best_room = starts, room
    if best is None:
        return None
    result: list[Slice] = [Slice("", 0)] * len(wanted)
    for pos, i in enumerate(order):
        result[i] = Slice(todo[pos].name, best[pos])
    return result


def place(model: str, profiles: Sequence[str], used: Iterable[Slice] = ()) -> list[Slice] | None:
    """Positions for all of ``profiles`` (in their order) beside ``used``, or None.

    ``used`` is never moved and must itself be valid.  Among the ways that fit, the one
    leaving the most room for later slices wins (see the module docstring).
    """
    gpu = _gpu(model)
    if isinstance(profiles, (str, bytes)) or not isinstance(profiles, Iterable):
        raise MigError(f"profiles must be a list of MIG profile names, not {profiles!r}")
    wanted = [_profile(gpu, p) for p in profiles]
    return _place(gpu, wanted, _state(gpu, used))


def _demand(gpu: _Gpu, demand: Any) -> list[tuple[MigProfile, int]]:
    if not isinstance(demand, Mapping):
        raise MigError(f"MIG demand must map profile names to counts, not {demand!r}")
    counts: dict[str, int] = {}
    for name, n in demand.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MigError(f"demand for {name!r} must be a count, not {n!r}")
        p = _profile(gpu, name)
        counts[p.name] = counts.get(p.name, 0) + n
    return [(p, min(counts[p.name], p.max_count)) for p in gpu.profiles
            if counts.get(p.name)]


def layouts_for_demand(model: str, demand: Mapping[str, int],
                       used: Iterable[Slice] = ()) -> list[Slice]:
    """New slices beside ``used`` (never moved) that best serve ``demand``.

    ``demand`` maps profile names to how many slices of each are wanted.  The chosen set
    serves the most compute slices, then the most jobs, then takes the fewest memory
    slots; ties go to the catalog's order.  Returned sorted by start slot.
    """
    gpu = _gpu(model)
    st = _state(gpu, used)
    wanted = _demand(gpu, demand)
    spare_compute = gpu.compute_slots - st.compute
    spare_slots = bin(((1 << gpu.memory_slots) - 1) & ~st.mask).count("1")

    candidates: list[tuple[int, ...]] = []

    def rec(i: int, picked: tuple[int, ...], compute: int, slots: int, me: int) -> None:
        if i == len(wanted):
            candidates.append(picked)
            return
        p, most = wanted[i]
        for k in range(most, -1, -1):
            c = compute + k * p.compute_slices
            s = slots + k * p.memory_slices
            m = me + k * p.media_extensions
            if c <= spare_compute and s <= spare_slots and m + st.me <= 1:
                rec(i + 1, picked + (k,), c, s, m)

    rec(0, (), 0, 0, 0)

    def merit(picked: tuple[int, ...]) -> tuple[int, int, int]:
        return (sum(k * p.compute_slices for k, (p, _) in zip(picked, wanted)),
                sum(picked),
                -sum(k * p.memory_slices for k, (p, _) in zip(picked, wanted)))

    for picked in sorted(candidates, key=merit, reverse=True):   # stable: ties keep order
        profiles = [p for k, (p, _) in zip(picked, wanted) for _ in range(k)]
        if not profiles:
            return []
        slices = _place(gpu, profiles, st)
        if slices is not None:
            return sorted(slices, key=lambda s: (s.start, s.profile))
    return []


# ---------------------------------------------------------------------------------
# mig-parted style named layouts.

def _balanced(gpu: _Gpu) -> dict[str, int]:
    """mig-parted's all-balanced: two small 1g, one 2g, and a 3g where there is one."""
    plain = [p for p in gpu.profiles if not p.media_extensions]
    want = {(1, 1): 2, (2, 2): 1, (3, 4): 1}
    return {p.name: want[(p.compute_slices, p.memory_slices)] for p in plain
            if (p.compute_slices, p.memory_slices) in want}


def layout_names(model: str) -> list[str]:
    """The layout names ``named_layout`` knows for ``model``."""
    gpu = _gpu(model)
    return ["all-enabled", "all-balanced"] + [f"all-{p.name}" for p in gpu.profiles]


def named_layout(model: str, name: str) -> list[Slice]:
    """The slices of a mig-parted style layout name, sorted by start slot.

    ``all-<profile>`` fills the GPU with as many of that profile as fit,
    ``all-balanced`` mixes sizes as mig-parted does, ``all-enabled`` is MIG with no
    instances.  ``all-1g.10gb.me`` is read as ``all-1g.10gb+me``.
    """
    gpu = _gpu(model)
    key = name.strip().lower() if isinstance(name, str) else ""
    if key == "all-enabled":
        return []
    if key == "all-disabled":
        raise MigError("all-disabled turns MIG mode off; it has no slice layout")
    if key == "all-balanced":
        counts = _balanced(gpu)
    else:
        p = gpu.by_name.get(_try_parse(key[4:])) if key.startswith("all-") else None
        if p is None:
            raise MigError(f"unknown MIG layout {name!r} for {gpu.model}; "
                           f"known: {', '.join(layout_names(gpu.model))}")
        counts = {p.name: p.max_count}
    return layouts_for_demand(gpu.model, counts)


def _try_parse(text: str) -> str | None:
    try:
        return parse_profile(text)
    except MigError:
        return None
