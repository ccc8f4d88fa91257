"""How each GPU of a worker is shared: the ``gpu_modes`` setting, applying it, the head's
``mig`` commands, and what launches on shared GPUs need.

Theory of operation
-------------------
Config.  ``[worker] gpu_modes`` maps GPU selectors to modes::

    gpu_modes = { "0-3" = "mig:all-1g.10gb", "4" = "mig:dynamic",
                  "5" = "mps:thread_percentage=50", "6" = "timeslice:4", "gpu07:0-7" = "whole" }

A selector is ``*``, an index, a range or a comma list of them, optionally prefixed by a
node name and a colon; a node's own entries beat the plain ones, and an explicit index
beats ``*``.  GPUs no entry names are ``whole``, except that one found in MIG mode is
left so and its slices offered as they are (MIG managed by hand).  Modes: ``whole``; ``mig:LAYOUT`` (a
mig-parted style name, ``all-1g.10gb``, ``all-balanced``, ``all-enabled``: a static layout)
or ``mig:dynamic`` (the scheduler lays slices out as demand comes); ``mps`` with optional
``max_clients=N`` (at most 48) and ``thread_percentage=P``; ``timeslice:N`` (N jobs share
the GPU with no memory isolation).  ``gpud.gpu.modes.parse_gpu_modes`` checks all of it for ``gpud
check-config``; whether a layout exists on a GPU's model is checked at start.

Start.  ``GpuModes.apply_at_start`` asserts the desired state and acts only on the
difference, one GPU at a time (a failing GPU is logged, the others go on): MIG mode on or
off as configured, then for a static layout the free slices that are not in it are
destroyed and the missing ones created at their exact placements.  Slices that running
jobs use are never touched; a layout that cannot be completed because of them converges
when they end (``converge``, called after every job end).  A GPU that loses MIG mode at
reboot (H100, H200) therefore gets it back here; a dynamic GPU gets back the slices its
surviving jobs hold (the sim forgets them with the worker).

Head commands.  ``mig`` {gpu, destroy: [start], create: [{profile, start}], reason,
min_interval} is applied to a dynamic GPU when the end state is a valid layout that keeps
every slice in use; a command whose end state already holds does nothing (messages come
at least once).  A command that destroys slices sooner than its ``min_interval`` (the
head's ``[scheduler] mig_min_interval``, so ``scontrol reconfigure`` reaches it; the
worker's own only for a command without one) after the last one is refused; ``relaid_at`` is the time of the last command that destroyed any,
kept in the state directory so that a worker restart does not reset it.
The worker re-registers after every command, applied or refused, so the head sees what
is there, new ``MIG-...`` UUIDs included.

What is reported (``infos``) is what the hardware has, not what was wished for: a GPU that
could not leave MIG mode because slices are busy is reported as ``mig`` with those
slices, and one whose MIG mode waits for a reset as ``mig`` with no slices (nothing runs
there until an operator resets it).

Launches.  ``prepare_launch`` checks a launch against the GPUs (a slice it names must
exist with that UUID) and adds the MPS environment for ``mps`` devices through
gpud.gpu.mps; ``sync_mps`` stops the daemons of GPUs whose jobs have all ended.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from ..bus.messages import MigRelayout
from ..gpu import mig
from ..gpu.backend import DeviceUse, GpuBackend, GpuError, MigRefusedError, ResetRequiredError
from ..gpu.modes import UNMANAGED, WHOLE, GpuMode, modes_for
from ..gpu.mps import ControlDaemonRunner, MpsDaemons, StubRunner
from ..model import GpuInfo, SliceInfo

log = logging.getLogger("gpud.worker.gpumodes")

INTERVAL_SLACK = 5.0     # seconds of clock difference between head and worker forgiven



# -- the manager -----------------------------------------------------------------------------

class LaunchRefused(GpuError):
    """A launch this worker's GPUs cannot take; the message is one line for the job's owner."""


@dataclass(frozen=True)
class MigResult:
    """What a ``mig`` command did."""

    changed: bool       # slices may have changed (re-read before reporting)
    refused: bool       # not (fully) applied
    message: str        # one line for the log


@dataclass(frozen=True)
class SliceNeed:
    """A slice a surviving job holds, so that a dynamic GPU gets it back after a restart."""

    index: int
    profile: str
    start: int


class GpuModes:
    """The sharing state of one worker's GPUs.  Methods block (NVML): call them in a thread.
    They are serialised by a lock, so the worker may call them from several tasks."""

    def __init__(self, backend: GpuBackend, modes: Mapping[int, GpuMode], *,
                 mps: MpsDaemons | None = None, min_interval: float = 0.0,
                 clock: Callable[[], float] = time.time, relaid_file: str | None = None) -> None:
        """``relaid_file`` keeps ``relaid_at`` across worker restarts, so that a restart
        does not reset the minimum interval."""
        self.backend = backend
        self.base = {g.index: g for g in backend.discover()}
        self.modes = {i: modes.get(i, UNMANAGED) for i in self.base}
        self.mps = mps
        self._whole: dict[int, Any] = {}     # mps:dynamic GPU -> the whole-GPU launch holding it
        self.min_interval = min_interval
        self.clock = clock
        self._state: dict[int, tuple[bool, tuple[SliceInfo, ...]]] = {i: (False, ()) for i in self.base}
        self._relaid_file = relaid_file
        self._relaid_at: dict[int, float] = self._load_relaid()
        self._lock = threading.RLock()
        for i, mode in self.modes.items():
            if mode.kind != "mig":
                continue
            try:
                mig.named_layout(self.base[i].model, mode.layout or "all-enabled")
            except mig.MigError as e:
                log.error("gpu_modes: GPU %d: %s; it stays whole", i, e)
                self.modes[i] = WHOLE

    # -- start and convergence ---------------------------------------------------------------

    def apply_at_start(self, in_use: Iterable[DeviceUse] = (), needed: Iterable[SliceNeed] = ()) -> None:
        """Bring every GPU to its configured mode (see the module docstring)."""
        busy = set(in_use)
        wanted: dict[int, list[SliceNeed]] = {}
        for n in needed:
            wanted.setdefault(n.index, []).append(n)
        with self._lock:
            # Slices that jobs hold but the hardware no longer has (the sim forgets them with
            # the worker) cannot block anything until they are made again.
            self.backend.note_in_use({d for d in busy if d[1] is None})
            for i in self.base:
                self._converge_one(i, busy, wanted.get(i, ()), at_start=True)
            self.backend.note_in_use(busy)

    def converge(self, in_use: Iterable[DeviceUse]) -> bool:
        """After jobs end: finish what busy slices held up.  True when anything changed."""
        busy = set(in_use)
        with self._lock:
            self.backend.note_in_use(busy)
            before = dict(self._state)
            for i in self.base:
                if self._pending(i):
                    self._converge_one(i, busy, (), at_start=False)
            return self._state != before

    def anything_pending(self) -> bool:
        """Whether ``converge`` has anything to do (from the cache, without the lock: the
        event loop asks after every job end and calls it only then)."""
        return any(self._pending(i) for i in self.base)

    def _pending(self, index: int) -> bool:
        """Whether the GPU is not yet in its configured state (cheap: from the cache)."""
        mode, (on, slices) = self.modes[index], self._state[index]
        if mode.kind != "mig":
            return on and mode.managed
        if not on:
            return False   # waiting for a reset; nothing the worker can do
        if mode.layout is None:
            return False
        return {(s.profile, s.start) for s in slices if s.uuid} != {
            (s.profile, s.start) for s in self._layout(index)} or any(not s.uuid for s in slices)

    def _converge_one(self, i: int, busy: set[DeviceUse], needed: Iterable[SliceNeed], *,
                      at_start: bool) -> None:
        mode, model = self.modes[i], self.base[i].model
        try:
            if not mig.supports_mig(model):
                return
            self._refresh(i)
            on, slices = self._state[i]
            used = {s for (g, s) in busy if g == i}
            if mode.kind != "mig":
                if on and mode.managed:
                    self._leave_mig(i, slices, used)
                elif on and at_start:
                    log.info("GPU %d is in MIG mode and gpu_modes does not name it: its %d "
                             "slice(s) are offered as they are", i, len(slices))
                return
            if not on:
                self.backend.set_mig_mode(i, True)
                log.info("GPU %d (%s): MIG mode on", i, model)
                self._refresh(i)
                on, slices = self._state[i]
            desired = self._layout(i) if mode.layout is not None else [
                mig.Slice(n.profile, n.start) for n in needed]
            self._reach(i, slices, desired, used, remove_others=mode.layout is not None)
        except ResetRequiredError as e:
            log.error("%s; until then the GPU runs nothing", e)
        except GpuError as e:
            log.error("GPU %d: %s%s", i, e, "" if at_start else " (will retry after the next job ends)")
        finally:
            self._safe_refresh(i)

    def _leave_mig(self, i: int, slices: tuple[SliceInfo, ...], used: set[int | None]) -> None:
        for s in slices:
            if s.start not in used:
                self.backend.destroy_slice(i, s.start)
        if used:
            log.warning("GPU %d: MIG slices in use; MIG mode goes off when their jobs end", i)
            return
        self.backend.set_mig_mode(i, False)
        log.info("GPU %d (%s): MIG mode off", i, self.base[i].model)

    def _reach(self, i: int, slices: tuple[SliceInfo, ...], desired: list[mig.Slice],
               used: set[int | None], *, remove_others: bool) -> None:
        """Destroy free slices not in ``desired`` (when ``remove_others``), then create the
        desired ones that are missing and fit beside what is left."""
        want = {(s.profile, s.start) for s in desired}
        keep: list[mig.Slice] = []
        for s in slices:
            good = bool(s.uuid) and ((s.profile, s.start) in want or not remove_others)
            if good or s.start in used:
                keep.append(mig.Slice(s.profile, s.start))
            else:
                self.backend.destroy_slice(i, s.start)
                log.info("GPU %d: destroyed MIG slice %s at slot %d", i, s.profile, s.start)
        have = {(s.profile, s.start) for s in keep}
        for s in sorted(desired, key=lambda s: (s.start, s.profile)):
            if (s.profile, s.start) in have:
                continue
            if not mig.is_valid_layout(self.base[i].model, keep + [s]):
                log.warning("GPU %d: MIG slice %s at slot %d must wait for the slices in use", i,
                            s.profile, s.start)
                continue
            made = self.backend.create_slice(i, s.profile, s.start)
            keep.append(s)
            log.info("GPU %d: created MIG slice %s at slot %d (%s)", i, made.profile, made.start, made.uuid)

    def _layout(self, i: int) -> list[mig.Slice]:
        mode, model = self.modes[i], self.base[i].model
        try:
            return mig.named_layout(model, mode.layout or "all-enabled")
        except mig.MigError as e:
            raise MigRefusedError(f"gpu_modes: {e}") from None

    def _refresh(self, i: int) -> None:
        self._state[i] = self.backend.mig_state(i)

    def _safe_refresh(self, i: int) -> None:
        try:
            self._refresh(i)
        except GpuError as e:
            log.warning("GPU %d: cannot read its MIG state: %s", i, e)

    # -- the head's mig command ------------------------------------------------------------

    def apply_command(self, cmd: MigRelayout, in_use: Iterable[DeviceUse]) -> MigResult:
        """Apply a ``mig`` command (well formed: ``decode`` made it); never raises for one
        this node cannot carry out."""
        try:
            index, destroy, create = _command(cmd, self.base)
        except ValueError as e:
            return MigResult(False, True, f"malformed mig command: {e}")
        busy = set(in_use)
        with self._lock:
            mode = self.modes[index]
            if mode.kind != "mig" or not mode.dynamic:
                return MigResult(False, True, f"GPU {index} is not a dynamic MIG GPU here")
            try:
                self.backend.note_in_use(busy)
                self._refresh(index)
                return self._relayout(index, destroy, create, {s for g, s in busy if g == index},
                                      self.min_interval if cmd.min_interval is None else cmd.min_interval)
            except GpuError as e:
                return MigResult(True, True, f"GPU {index}: re-layout stopped half-way: {e}")
            finally:
                self._safe_refresh(index)

    def _relayout(self, i: int, destroy: list[int], create: list[mig.Slice],
                  used: set[int | None], min_interval: float) -> MigResult:
        on, slices = self._state[i]
        if not on:
            return MigResult(False, True, f"GPU {i}: MIG mode is off (waiting for a reset?)")
        current = {s.start: s for s in slices}
        gone = [s for s in destroy if s in current]
        new = [c for c in create if not (c.start in current and c.start not in gone
                                         and current[c.start].profile == c.profile)]
        if not gone and not new:
            return MigResult(False, False, f"GPU {i}: the layout is already as asked")
        held = sorted(s for s in gone if s in used)
        if held:
            return MigResult(False, True, f"GPU {i}: will not destroy the MIG slice(s) at slot "
                                          f"{', '.join(map(str, held))}: running jobs use them")
        now = self.clock()
        last = self._relaid_at.get(i)
        if gone and last is not None and now < last + min_interval - INTERVAL_SLACK:
            return MigResult(False, True, f"GPU {i}: re-laid {now - last:.0f}s ago, under the "
                                          f"minimum interval of {min_interval:.0f}s")
        result = [mig.Slice(s.profile, s.start) for s in slices if s.start not in gone] + new
        try:
            mig.validate_layout(self.base[i].model, result)
        except mig.MigError as e:
            return MigResult(False, True, f"GPU {i}: the asked layout is invalid: {e}")
        for start in gone:
            self.backend.destroy_slice(i, start)
        if gone:
            self._relaid_at[i] = now
            self._save_relaid()
        made = [self.backend.create_slice(i, c.profile, c.start) for c in new]
        return MigResult(True, False, f"GPU {i}: destroyed {len(gone)} slice(s), created "
                                      f"{', '.join(f'{m.profile}@{m.start}' for m in made) or 'none'}")

    def _load_relaid(self) -> dict[int, float]:
        """relaid_at by GPU index, from the file (kept by GPU UUID: indexes can change)."""
        if self._relaid_file is None:
            return {}
        try:
            with open(self._relaid_file, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable (%s); re-layout times start afresh", self._relaid_file, e)
            return {}
        by_uuid = {g.uuid: i for i, g in self.base.items()}
        return {by_uuid[u]: float(t) for u, t in (saved.items() if isinstance(saved, dict) else ())
                if u in by_uuid and isinstance(t, (int, float)) and not isinstance(t, bool)}

    def _save_relaid(self) -> None:
        if self._relaid_file is None:
            return
        data = {self.base[i].uuid: t for i, t in self._relaid_at.items()}
        tmp = f"{self._relaid_file}.tmp"
        try:
            os.makedirs(os.path.dirname(self._relaid_file) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self._relaid_file)
        except OSError as e:
            log.warning("cannot save re-layout times to %s: %s", self._relaid_file, e.strerror)

    # -- what the head sees --------------------------------------------------------------------

    def infos(self) -> tuple[GpuInfo, ...]:
        """Every GPU as it is now, for ``register``.  Reads the cache without the lock, so
        the event loop never waits for a re-layout running in a thread."""
        return tuple(self._info(i) for i in sorted(self.base))

    def _info(self, i: int) -> GpuInfo:
        g, mode = self.base[i], self.modes[i]
        on, slices = self._state[i]
        ready = tuple(s for s in slices if s.uuid)
        if mode.kind == "mig" or on:
            return replace(g, mode="mig", dynamic=mode.dynamic and on and mode.kind == "mig",
                           slices=ready if on else (), relaid_at=self._relaid_at.get(i))
        if mode.kind == "mps":
            return replace(g, mode="mps", dynamic=mode.dynamic, mps_max_clients=mode.max_clients,
                           mps_thread_percentage=mode.thread_percentage)
        if mode.kind == "timeslice":
            return replace(g, mode="timeslice", replicas=mode.replicas)
        return replace(g, mode="whole")

    def gpu(self, index: int) -> GpuInfo | None:
        return self._info(index) if index in self.base else None

    # -- launches ------------------------------------------------------------------------------

    def prepare_launch(self, launch: Any) -> Any:
        """``launch`` with the MPS environment added; LaunchRefused (or MpsError) when the
        GPUs here cannot take it."""
        extra: dict[str, str] = {}
        with self._lock:
            for pos, dev in enumerate(launch.gpus):
                info = self.gpu(dev.index)
                if info is None:
                    raise LaunchRefused(f"GPU {dev.index} does not exist on this node")
                kind = getattr(dev, "kind", "gpu")
                if kind == "gpu" and info.mode == "mig":
                    raise LaunchRefused(f"GPU {dev.index} is in MIG mode here; it has no whole GPU to give")
                if info.mode == "mps" and info.dynamic:   # whole or shares, never both at once
                    holder = self._whole.get(dev.index)
                    if kind == "gpu":
                        if self.mps is not None and self.mps.clients(dev.index):
                            raise LaunchRefused(f"GPU {dev.index} serves MPS shares now; a whole-GPU "
                                                "job waits until they end")
                        self._whole[dev.index] = (launch.job_id, launch.attempt)
                    elif holder is not None and holder != (launch.job_id, launch.attempt):
                        raise LaunchRefused(f"GPU {dev.index} is held whole by job {holder[0]}; its MPS "
                                            "shares wait until it ends")
                if kind == "mig":
                    found = next((s for s in info.slices if s.start == dev.slice_start), None)
                    if found is None or found.uuid != dev.uuid:
                        raise LaunchRefused(f"MIG slice {dev.uuid} is not on GPU {dev.index} here "
                                            "(it was re-laid); the job goes back to the queue")
                elif kind == "mps":
                    if info.mode != "mps" or self.mps is None:
                        raise LaunchRefused(f"GPU {dev.index} is not an MPS GPU here")
                    extra.update(self.mps.attach(
                        (launch.job_id, launch.attempt), info, position=pos, user=launch.user,
                        uid=launch.uid, gid=launch.gid, mem_mb=getattr(dev, "mem_mb", None)))
        if not extra:
            return launch
        return replace(launch, extra_env={**launch.extra_env, **extra})

    def prepare_launch_now(self, launch: Any) -> Any:
        """``prepare_launch`` when it cannot block, for the event loop: None when it might (an
        MPS device, whose daemon may have to start, or a re-layout holding the lock); the
        caller then runs ``prepare_launch`` in a thread."""
        if any(getattr(dev, "kind", "gpu") == "mps" for dev in launch.gpus):
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self.prepare_launch(launch)
        finally:
            self._lock.release()

    def adopt_launches(self, launches: Iterable[Any]) -> None:
        """At start: the MPS clients of jobs that outlived the last worker (and the whole-GPU
        jobs holding mps:dynamic GPUs)."""
        launches = list(launches)
        for launch in launches:
            for dev in launch.gpus:
                info = self.gpu(dev.index)
                if getattr(dev, "kind", "gpu") == "gpu" and info is not None and info.mode == "mps" and info.dynamic:
                    self._whole[dev.index] = (launch.job_id, launch.attempt)
        if self.mps is None:
            return
        for launch in launches:
            for dev in launch.gpus:
                info = self.gpu(dev.index)
                if getattr(dev, "kind", "gpu") == "mps" and info is not None:
                    self.mps.adopt((launch.job_id, launch.attempt), info, user=launch.user,
                                   uid=launch.uid, gid=launch.gid, mem_mb=getattr(dev, "mem_mb", None))

    def sync_mps(self, launches: Iterable[Any]) -> None:
        """Stop the MPS daemons of GPUs whose jobs have all ended."""
        active = [(launch.job_id, launch.attempt) for launch in launches]
        for index in [i for i, holder in self._whole.items() if holder not in active]:
            del self._whole[index]      # its whole-GPU job ended: shares may come
        if self.mps is None:
            return
        mps_gpus = [self._info(i) for i, m in self.modes.items() if m.kind == "mps"]
        self.mps.sync(active, mps_gpus)


def from_config(cfg: Any, backend: GpuBackend, node: str, state_dir: str, *,
                clock: Callable[[], float] = time.time) -> GpuModes:
    """The worker's GpuModes: modes from ``[worker] gpu_modes``, MPS daemons under
    ``<state_dir>/mps`` (a recording stub for simulated GPUs), the scheduler's interval."""
    indexes = [g.index for g in backend.discover()]
    modes = modes_for(cfg.worker.gpu_modes or {}, node, indexes)
    mps = None
    if any(m.kind == "mps" for m in modes.values()):
        runner = StubRunner() if backend.name == "sim" else ControlDaemonRunner()
        mps = MpsDaemons(os.path.join(state_dir, "mps"), runner)
    return GpuModes(backend, modes, mps=mps, clock=clock,
                    min_interval=float(getattr(cfg.sched, "mig_min_interval", 0.0) or 0.0),
                    relaid_file=os.path.join(state_dir, "mig-relaid.json"))


def devices_in_use(launches: Iterable[Any]) -> set[DeviceUse]:
    """(GPU index, slice start or None) for every device the running launches hold."""
    out: set[DeviceUse] = set()
    for launch in launches:
        for dev in launch.gpus:
            start = getattr(dev, "slice_start", None)
            out.add((dev.index, start if getattr(dev, "kind", "gpu") == "mig" else None))
    return out


def slices_needed(launches: Iterable[Any]) -> list[SliceNeed]:
    """The MIG slices running launches hold, with the profile the head named."""
    out = []
    for launch in launches:
        for dev in launch.gpus:
            profile = getattr(dev, "profile", None)
            if getattr(dev, "kind", "gpu") == "mig" and profile and dev.slice_start is not None:
                out.append(SliceNeed(dev.index, profile, dev.slice_start))
    return out


def _command(cmd: MigRelayout, gpus: Mapping[int, GpuInfo]) -> tuple[int, list[int], list[mig.Slice]]:
    """What to destroy and create on which GPU, the profiles named as this GPU's model names
    them; ValueError for a GPU or profile this node does not have."""
    index = cmd.gpu
    if index not in gpus:
        raise ValueError(f"no GPU {index!r} here")
    try:
        model = gpus[index].model
        made = [mig.Slice(mig.parse_profile(profile, model), start) for profile, start in cmd.create]
    except mig.MigError as e:
        raise ValueError(str(e)) from None
    return index, list(cmd.destroy), made
