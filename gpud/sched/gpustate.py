"""Shared GPUs as one scheduling pass sees them: per-GPU state, device arithmetic, MIG caches.

``GpuState`` is a shared GPU's working copy in a pass (gpud/sched/slices.py and shares.py mutate it):
the slices it has and which are held (with when their holders end), its MPS or time-slice
clients, whether a re-layout is on its way, the claims waiting jobs put on it, and slices a
re-layout planned in this pass will bring.  ``used``, ``clients`` and ``claims`` only grow
during a pass and ``busy`` is only ever set, which is what makes the memoised answers in
``memo`` and the pass's pruning sound.  They change only through ``take``, ``add_client``,
``add_claim`` and ``set_busy``, which tell ``on_change`` (the pass's index of GPUs by state).

Device arithmetic: a slice's capacity for a ``--gpu-mem`` request is its real memory or the
size in its name, whichever is larger; a device's billed fraction of its GPU is
``device_fraction`` (gpud/sched/usage.py).  MIG catalog lookups and placement searches are
pure and repeat across jobs and passes, so their answers are kept (bounded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..gpu import mig
from .snapshot import Device, GpuView, PendingJob

SHARED_MODES = ("mig", "mps", "timeslice")


def nominal_mb(profile: str) -> int:
    """The memory a profile's name promises, in MiB (``3g.40gb`` -> 40960)."""
    size = profile.partition(".")[2].partition("gb")[0]
    return int(size) * 1024 if size.isdigit() else 0


def slice_capacity_mb(profile: str, memory_mb: int) -> int:
    """What a slice holds for a ``--gpu-mem`` request: its memory or its name's, the larger."""
    key = (profile, memory_mb)
    cap = _CAPACITY.get(key)
    if cap is None:
        cap = _CAPACITY[key] = max(memory_mb, nominal_mb(profile))
    return cap


_CAPACITY: dict[tuple[str, int], int] = {}


def device_fraction(dev: Device, gpu: GpuView | None) -> float:
    """The share of one GPU a device stands for, as it is billed."""
    if dev.kind == "gpu":
        return 1.0
    if gpu is None:       # the node is gone: a slice by the compute in its name, else whole
        compute = (dev.profile or "").partition("g.")[0] if dev.kind == "mig" else ""
        return min(1.0, int(compute) / 7) if compute.isdigit() else 1.0
    if dev.kind == "mig":
        try:
            profile = dev.profile or next(s.profile for s in gpu.slices if s.start == dev.slice_start)
            return catalog(gpu.model)[mig.parse_profile(profile)].fraction
        except (StopIteration, KeyError, mig.MigError):
            return 1.0 / 7
    if dev.kind == "mps":
        if dev.mem_mb and gpu.memory_mb > 0:
            return min(1.0, dev.mem_mb / gpu.memory_mb)
        return 1.0 / max(1, gpu.mps_max_clients)
    if dev.kind == "timeslice":
        return 1.0 / max(1, gpu.replicas)
    return 1.0


def serves_whole(g: GpuView) -> bool:
    """Whether ``g`` can be given whole to a ``--gpus N`` job: a ``whole`` GPU, or an
    ``mps:dynamic`` one while no share is on it (the core checks that; see shares.py)."""
    return g.mode == "whole" or (g.mode == "mps" and g.dynamic)


def is_shared(devices: Iterable[Device]) -> bool:
    return any(d.kind != "gpu" for d in devices)


@dataclass
class Claim:
    job_id: int
    at: float              # when the claimant expects to start
    mask: int = 0          # MIG: the memory slots it needs (0: the whole GPU)


@dataclass(eq=False, slots=True)   # one object per GPU: compared and hashed by identity
class GpuState:
    """One shared GPU's state during the pass."""

    node: int
    view: GpuView
    layout_ok: bool = True                          # MIG: a known model with a valid layout
    slices: dict[int, mig.Slice] = field(default_factory=dict)   # start -> slice (canonical)
    used: dict[int, float] = field(default_factory=dict)         # slice start -> holder's end
    clients: list[tuple[float, str, int]] = field(default_factory=list)  # MPS/timeslice: (end, user, mem)
    busy: bool = False                              # re-layout in flight or planned: no starts
    claims: list[Claim] = field(default_factory=list)
    incoming: dict[str, int] = field(default_factory=dict)   # profile -> slices planned, not yet made
    # earliest-start answers; ``used`` and ``clients`` only grow in a pass, so their sizes
    # say whether an answer is still current
    memo: dict = field(default_factory=dict)
    by_start: dict = field(default_factory=dict)        # start -> its SliceView (uuid, memory)
    layout_key: tuple = ()                              # its slices as sorted (start, profile): cheap to hash
    on_change: Callable[["GpuState"], None] | None = None
    shared_mb: int = 0                                  # the clients' memory, summed
    holders: set[str] = field(default_factory=set)      # the clients' users

    def take(self, start: int, end: float) -> None:
        """A job ending at ``end`` takes the free slice at ``start``."""
        self.used[start] = end
        if self.on_change is not None:
            self.on_change(self)

    def add_client(self, end: float, user: str, mem_mb: int) -> None:
        self.clients.append((end, user, mem_mb))
        self.shared_mb += mem_mb
        self.holders.add(user)
        if self.on_change is not None:
            self.on_change(self)

    def add_claim(self, claim: Claim) -> None:
        self.claims.append(claim)
        if self.on_change is not None:
            self.on_change(self)

    def set_busy(self) -> None:
        """A re-layout is planned: the GPU takes no other start or re-layout in the pass."""
        self.busy = True
        if self.on_change is not None:
            self.on_change(self)

    @property
    def index(self) -> int:
        return self.view.index

    @property
    def model(self) -> str:
        return self.view.model

    def mask(self, s: mig.Slice) -> int:
        """The memory slots slice ``s`` takes, as a bit mask."""
        key = (self.model, s.profile, s.start)
        m = _MASKS.get(key)
        if m is None:
            m = _MASKS[key] = mig.Placement(s.start, catalog(self.model)[s.profile].memory_slices).mask
        return m

    def used_compute(self) -> int:
        """How busy it is: compute slices held (MIG), else clients; for packing."""
        if self.view.mode != "mig":
            return len(self.clients)
        key = ("busy", len(self.used))
        if key not in self.memo:
            cat = catalog(self.model) if self.layout_ok else {}
            self.memo[key] = sum(cat[self.slices[s].profile].compute_slices
                                 if s in self.slices and self.slices[s].profile in cat else 1
                                 for s in self.used)
        return self.memo[key]

    def allowed(self, job_id: int, end: float, mask: int = 0) -> bool:
        """Whether a job ending at ``end`` may use (part of) this GPU despite its claims."""
        for c in self.claims:
            if c.job_id == job_id or end <= c.at:
                continue
            if mask and c.mask and not (mask & c.mask):
                continue
            return False
        return True

    def mem_used(self) -> int:
        return self.shared_mb

    def users(self) -> set[str]:
        return self.holders


# Placement searches repeat across jobs and passes (a few layouts, a few profiles): they are
# pure, so their answers are kept, up to a bound.
_PLACED: dict[tuple, tuple[mig.Slice, ...] | None] = {}
_LAYOUTS: dict[tuple, tuple[dict[int, mig.Slice], tuple] | None] = {}   # -> (slices by start, layout_key)
_CATALOGS: dict[str, dict[str, mig.MigProfile]] = {}
_MASKS: dict[tuple[str, str, int], int] = {}
_FOR_MEMORY: dict[tuple[str, int], str | None] = {}
_DEMANDED: dict[tuple, tuple[mig.Slice, ...]] = {}
_CACHE_MAX = 20000


def catalog(model: str) -> dict[str, mig.MigProfile]:
    """``mig.catalog``, kept (MigError for a model without MIG, as there)."""
    cat = _CATALOGS.get(model)
    if cat is None:
        cat = _CATALOGS[model] = mig.catalog(model)
    return cat


def _slices_key(slices: Iterable[mig.Slice]) -> tuple[tuple[str, int], ...]:
    """Slices as sorted (profile, start) pairs: a key that is quick to sort and hash."""
    return tuple(sorted([(s.profile, s.start) for s in slices]))


def place(model: str, profiles: list[str], used: Iterable[mig.Slice]) -> list[mig.Slice] | None:
    used = list(used)
    key = (model, tuple(profiles), _slices_key(used))
    if key not in _PLACED:
        if len(_PLACED) > _CACHE_MAX:
            _PLACED.clear()
        found = mig.place(model, profiles, sorted(used))
        _PLACED[key] = None if found is None else tuple(found)
    hit = _PLACED[key]
    return None if hit is None else list(hit)


def layouts_for_demand(model: str, demand: dict[str, int], used: Iterable[mig.Slice]) -> list[mig.Slice]:
    """``mig.layouts_for_demand``, kept: it sees no more of a profile than a GPU can hold, so
    counts past that are one answer."""
    cat = catalog(model)
    used = list(used)
    key = (model, tuple(sorted([(p, min(n, cat[p].max_count)) for p, n in demand.items()])), _slices_key(used))
    hit = _DEMANDED.get(key)
    if hit is None:
        if len(_DEMANDED) > _CACHE_MAX:
            _DEMANDED.clear()
        hit = _DEMANDED[key] = tuple(mig.layouts_for_demand(model, dict(key[1]), sorted(used)))
    return list(hit)


def load_layout(g: GpuState) -> bool:
    """Read a MIG GPU's reported slices; False (no MIG use) for an unknown model or bad layout."""
    view = g.view
    key = (view.model, tuple([(s.profile, s.start) for s in view.slices]))
    hit = _LAYOUTS.get(key, False)
    if hit is False:
        if len(_LAYOUTS) > _CACHE_MAX:
            _LAYOUTS.clear()
        try:
            slices = [mig.Slice(mig.parse_profile(p, view.model), start) for p, start in key[1]]
            mig.validate_layout(view.model, slices)
            hit = ({s.start: s for s in slices}, tuple(sorted((s.start, s.profile) for s in slices)))
        except mig.MigError:
            hit = None
        _LAYOUTS[key] = hit
    if hit is None:
        return False
    g.slices, g.layout_key = dict(hit[0]), hit[1]
    g.by_start = {v.start: v for v in view.slices}
    return True


def type_ok(job: PendingJob, g: GpuState | GpuView) -> bool:
    return job.gpu_type is None or g.model == job.gpu_type


def has_profile(g: GpuState, job: PendingJob) -> bool:
    if job.mig_profile is None:
        return True
    try:
        return job.mig_profile in catalog(g.model)
    except mig.MigError:
        return False


def slice_mem(v: GpuView, start: int) -> int:
    return next((s.memory_mb for s in v.slices if s.start == start), 0)


def most_memory(g: GpuState) -> int:
    """The largest device this GPU could ever give one job."""
    v = g.view
    if v.mode != "mig":
        return v.memory_mb
    if not g.layout_ok:
        return 0
    if v.dynamic:
        return max((slice_capacity_mb(p.name, p.memory_mb) for p in catalog(v.model).values()), default=0)
    return max((slice_capacity_mb(s.profile, slice_mem(v, s.start)) for s in g.slices.values()), default=0)


def profile_for_memory(model: str, want: int) -> str | None:
    """The smallest plain profile whose memory (real or nominal) holds ``want`` MiB."""
    key = (model, want)
    if key not in _FOR_MEMORY:
        if len(_FOR_MEMORY) > _CACHE_MAX:
            _FOR_MEMORY.clear()
        fits = [p for p in catalog(model).values()
                if not p.media_extensions and slice_capacity_mb(p.name, p.memory_mb) >= want]
        _FOR_MEMORY[key] = min(fits, key=lambda p: (p.memory_mb, p.compute_slices)).name if fits else None
    return _FOR_MEMORY[key]
