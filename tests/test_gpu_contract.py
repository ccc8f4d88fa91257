"""The MIG contract, run against the sim backend and against NVML over the pynvml fake.

Both backends must discover the same machine, offer the placements the catalog names,
create slices at explicit placements without touching the others, and refuse what the
hardware refuses.  The fake keeps its own driver tables (tests/fake_pynvml.py), so the
nvml runs also check gpud's catalog against them.
"""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.gpu import mig
from gpud.gpu.backend import (GpuBackend, GpuError, GpuInUseError, MigRefusedError, ResetRequiredError,
                              open_backend)
from gpud.gpu.nvml import NvmlBackend
from gpud.gpu.sim import SimBackend
from tests.fake_pynvml import FakeNvml

SPEC = "2xA100-80GB,1xA30-24GB,1xH100-80GB,1xL40S-48GB"
BOARDS = {"A100": 2, "A30": 1, "H100": 1, "L40S": 1}
A100, A30, H100, L40S = 0, 2, 3, 4


class Rig:
    """A backend plus a way to make a device busy, whichever backend it is."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fake = FakeNvml.machine(host="n1", **BOARDS) if kind == "nvml" else None
        self.backend: GpuBackend = open_backend(SPEC if kind == "sim" else None, "n1", nvml=self.fake)
        self.busy: set[tuple[int, int | None]] = set()

    def use(self, index: int, start: int | None = None) -> None:
        """A process now runs on the GPU (start None) or on its slice at ``start``."""
        self.busy.add((index, start))
        if self.fake is None:
            self.backend.note_in_use(self.busy)
            return
        gpu = self.fake.gpus[index]
        if start is None:
            gpu.procs.append((4242, 100))
        else:
            next(s for s in gpu.mig if s.start == start).procs.append((4243, 100))

    def layout(self, index: int) -> set[tuple[str, int]]:
        return {(s.profile, s.start) for s in self.backend.mig_state(index)[1]}


@pytest.fixture(params=["sim", "nvml"])
def rig(request) -> Rig:
    r = Rig(request.param)
    yield r
    r.backend.close()


# -- discovery ---------------------------------------------------------------------------------

def test_both_see_the_same_machine_with_mig_off():
    sim, nvml = Rig("sim"), Rig("nvml")
    assert [g.model for g in sim.backend.discover()] == [g.model for g in nvml.backend.discover()]
    for r in (sim, nvml):
        assert [r.backend.mig_state(i) for i in range(5)] == [(False, ())] * 5


@pytest.mark.parametrize("index", [A100, A30, H100])
def test_placements_are_the_catalogs(rig, index):
    model = rig.backend.discover()[index].model
    for name, profile in mig.catalog(model).items():
        assert rig.backend.possible_placements(index, name) == list(profile.placements), name


def test_a_gpu_without_mig_refuses_every_mig_verb(rig):
    assert rig.backend.mig_state(L40S) == (False, ())
    for verb in (lambda: rig.backend.set_mig_mode(L40S, True),
                 lambda: rig.backend.create_slice(L40S, "1g.10gb", 0),
                 lambda: rig.backend.possible_placements(L40S, "1g.10gb")):
        with pytest.raises(MigRefusedError, match="does not support MIG"):
            verb()


def test_unknown_profile_is_refused(rig):
    rig.backend.set_mig_mode(A100, True)
    with pytest.raises(MigRefusedError, match="no MIG profile 1g.6gb"):
        rig.backend.create_slice(A100, "1g.6gb", 0)


# -- static layouts and explicit placements -------------------------------------------------------

@pytest.mark.parametrize("index, layout", [
    (A100, "all-1g.10gb"), (A100, "all-balanced"), (A100, "all-3g.40gb"), (A100, "all-7g.80gb"),
    (A100, "all-2g.20gb"), (A30, "all-1g.6gb"), (A30, "all-balanced"), (H100, "all-1g.20gb"),
])
def test_named_layouts_are_created_exactly(rig, index, layout):
    model = rig.backend.discover()[index].model
    want = mig.named_layout(model, layout)
    rig.backend.set_mig_mode(index, True)
    made = [rig.backend.create_slice(index, s.profile, s.start) for s in want]
    on, slices = rig.backend.mig_state(index)
    assert on and list(slices) == sorted(made, key=lambda s: s.start)
    assert [(s.profile, s.start) for s in slices] == [(s.profile, s.start) for s in want]
    cat = mig.catalog(model)
    assert all(s.memory_mb == cat[s.profile].memory_mb for s in slices)
    assert all(s.uuid.startswith("MIG-") for s in slices)
    assert len({s.uuid for s in slices}) == len(slices)


def test_creating_and_destroying_one_slice_leaves_the_others_alone(rig):
    b = rig.backend
    b.set_mig_mode(A100, True)
    for start in range(7):
        b.create_slice(A100, "1g.10gb", start)
    before = {s.start: s.uuid for s in b.mig_state(A100)[1]}
    for start in (0, 1, 2, 3):
        b.destroy_slice(A100, start)
    made = b.create_slice(A100, "3g.40gb", 0)
    after = {s.start: s.uuid for s in b.mig_state(A100)[1]}
    assert after == {0: made.uuid, 4: before[4], 5: before[5], 6: before[6]}
    assert rig.layout(A100) == {("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)}


def test_other_gpus_are_not_touched(rig):
    b = rig.backend
    for i in (A100, A100 + 1):
        b.set_mig_mode(i, True)
    b.create_slice(A100 + 1, "7g.80gb", 0)
    b.create_slice(A100, "4g.40gb", 0)
    assert rig.layout(A100 + 1) == {("7g.80gb", 0)}
    assert b.mig_state(H100) == (False, ())


# -- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("existing, profile, start, words", [
    ([], "2g.20gb", 1, "cannot start at memory slot 1"),
    ([], "4g.40gb", 4, "cannot start at memory slot 4"),
    ([], "1g.10gb", 7, "cannot start at memory slot 7"),
    ([("3g.40gb", 4)], "1g.10gb", 5, "overlaps 3g.40gb at slot 4"),
    ([("4g.40gb", 0)], "3g.40gb", 0, "overlaps"),
    ([("4g.40gb", 0), ("3g.40gb", 4)], "1g.10gb", 6, "needs 8 compute slices"),
    ([("1g.10gb+me", 0)], "1g.10gb+me", 1, r"too many 1g.10gb\+me"),
    ([("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)], "2g.20gb", 6, "too many 2g.20gb"),
    ([("4g.40gb", 0), ("2g.20gb", 4)], "2g.20gb", 6, "needs 8 compute slices"),
    ([("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], "1g.20gb", 6, "overlaps"),
])
def test_invalid_placements_are_refused_and_change_nothing(rig, existing, profile, start, words):
    b = rig.backend
    b.set_mig_mode(A100, True)
    for p, s in existing:
        b.create_slice(A100, p, s)
    before = b.mig_state(A100)
    with pytest.raises(MigRefusedError, match=words):
        b.create_slice(A100, profile, start)
    assert b.mig_state(A100) == before


def test_too_much_compute_is_refused(rig):
    b = rig.backend
    b.set_mig_mode(A100, True)
    b.create_slice(A100, "4g.40gb", 0)
    b.create_slice(A100, "2g.20gb", 4)
    b.create_slice(A100, "1g.10gb", 6)
    with pytest.raises(MigRefusedError):
        b.create_slice(A100, "1g.10gb", 7)


def test_creating_with_mig_off_is_refused(rig):
    with pytest.raises(MigRefusedError, match="MIG mode is off"):
        rig.backend.create_slice(A100, "1g.10gb", 0)


def test_a_busy_slice_cannot_be_destroyed(rig):
    b = rig.backend
    b.set_mig_mode(A100, True)
    b.create_slice(A100, "3g.40gb", 0)
    b.create_slice(A100, "3g.40gb", 4)
    rig.use(A100, 4)
    with pytest.raises(GpuInUseError, match="in use"):
        b.destroy_slice(A100, 4)
    b.destroy_slice(A100, 0)            # its free neighbour goes
    assert rig.layout(A100) == {("3g.40gb", 4)}


def test_destroying_a_missing_slice_is_refused(rig):
    rig.backend.set_mig_mode(A100, True)
    with pytest.raises(MigRefusedError, match="no MIG slice starts at memory slot 3"):
        rig.backend.destroy_slice(A100, 3)


def test_mode_changes_only_on_an_idle_gpu(rig):
    b = rig.backend
    rig.use(H100)
    with pytest.raises(GpuInUseError):
        b.set_mig_mode(H100, True)
    assert b.mig_state(H100) == (False, ())
    b.set_mig_mode(A100, True)
    b.set_mig_mode(A100, True)          # idempotent
    b.create_slice(A100, "7g.80gb", 0)
    with pytest.raises(GpuInUseError):
        b.set_mig_mode(A100, False)     # slices left
    b.destroy_slice(A100, 0)
    b.set_mig_mode(A100, False)
    assert b.mig_state(A100) == (False, ())


def test_refusals_are_gpu_errors_in_one_line(rig):
    b = rig.backend
    b.set_mig_mode(A100, True)
    for bad in (lambda: b.create_slice(A100, "2g.20gb", 1), lambda: b.destroy_slice(A100, 0),
                lambda: b.create_slice(L40S, "1g.10gb", 0), lambda: b.create_slice(A100, "nonsense", 0)):
        with pytest.raises(GpuError) as e:
            bad()
        assert "\n" not in str(e.value) and str(e.value)


# -- both backends decide alike --------------------------------------------------------------------

_OPS = st.lists(st.one_of(
    st.tuples(st.just("create"), st.sampled_from(sorted(mig.catalog("A100-80GB"))), st.integers(0, 7)),
    st.tuples(st.just("destroy"), st.just(""), st.integers(0, 7)),
), max_size=25)


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_sim_and_nvml_accept_and_refuse_the_same_operations(ops):
    rigs = [Rig("sim"), Rig("nvml")]
    for r in rigs:
        r.backend.set_mig_mode(A100, True)
    for op, profile, start in ops:
        outcomes = []
        for r in rigs:
            try:
                if op == "create":
                    r.backend.create_slice(A100, profile, start)
                else:
                    r.backend.destroy_slice(A100, start)
                outcomes.append("ok")
            except MigRefusedError:
                outcomes.append("refused")
        assert outcomes[0] == outcomes[1], (op, profile, start)
        assert rigs[0].layout(A100) == rigs[1].layout(A100)
        mig.validate_layout("A100-80GB", [mig.Slice(p, s) for p, s in rigs[0].layout(A100)])


# -- NVML specifics: the driver's calls and its reset rules ----------------------------------------

def test_nvml_creates_through_placement_then_compute_instance():
    fake = FakeNvml.machine(A100=1)
    b = NvmlBackend(nvml=fake)
    b.set_mig_mode(0, True)
    fake.calls.clear()
    made = b.create_slice(0, "2g.20gb", 2)
    calls = fake.calls
    assert calls.index("nvmlDeviceCreateGpuInstanceWithPlacement") < calls.index(
        "nvmlGpuInstanceCreateComputeInstance")
    assert "nvmlDeviceCreateGpuInstance" not in calls   # never the driver's own choice of place
    gi = next(s for s in fake.gpus[0].mig if s.start == 2)
    assert (gi.profile_id, gi.size, gi.ci, gi.uuid) == (14, 2, True, made.uuid)


def test_nvml_destroys_compute_instances_before_the_gpu_instance():
    fake = FakeNvml.machine(H100=1)
    b = NvmlBackend(nvml=fake)
    b.set_mig_mode(0, True)
    b.create_slice(0, "3g.40gb", 4)
    fake.calls.clear()
    b.destroy_slice(0, 4)
    assert fake.calls.index("nvmlComputeInstanceDestroy") < fake.calls.index("nvmlGpuInstanceDestroy")
    assert fake.gpus[0].mig == []


def test_nvml_half_made_instance_is_listed_without_uuid():
    fake = FakeNvml.machine(A100=1)
    b = NvmlBackend(nvml=fake)
    b.set_mig_mode(0, True)
    b.create_slice(0, "1g.10gb", 3)
    fake.gpus[0].mig[0].ci = False            # as if the worker died between the two calls
    (s,) = b.mig_state(0)[1]
    assert (s.profile, s.start, s.uuid) == ("1g.10gb", 3, "")
    b.destroy_slice(0, 3)                     # and it can be cleaned up
    assert b.mig_state(0) == (True, ())


def test_nvml_mode_change_waiting_for_a_reset_is_reported_and_kept_pending():
    fake = FakeNvml.machine(A100=1)
    fake.gpus[0].reset_blocked = True
    b = NvmlBackend(nvml=fake)
    with pytest.raises(ResetRequiredError, match=r"nvidia-smi -r -i 0"):
        b.set_mig_mode(0, True)
    assert b.mig_state(0) == (False, ())
    assert fake.nvmlDeviceGetMigMode(fake.nvmlDeviceGetHandleByIndex(0)) == [0, 1]
    fake.reboot()                             # the reboot is the reset; Ampere keeps the mode
    assert b.mig_state(0) == (True, ())


def test_nvml_busy_gpu_withdraws_its_pending_mode():
    fake = FakeNvml.machine(H100=1)
    fake.gpus[0].procs.append((99, 10))
    b = NvmlBackend(nvml=fake)
    with pytest.raises(GpuInUseError):
        b.set_mig_mode(0, True)
    assert fake.nvmlDeviceGetMigMode(fake.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


def test_nvml_without_root_says_so():
    fake = FakeNvml.machine(A100=1)
    fake.root = False
    with pytest.raises(GpuError, match="needs root"):
        NvmlBackend(nvml=fake).set_mig_mode(0, True)


def test_sim_state_lives_in_memory_only():
    a = SimBackend("1xH100-80GB", "n1")
    a.set_mig_mode(0, True)
    made = a.create_slice(0, "1g.10gb", 3)
    b = SimBackend("1xH100-80GB", "n1")       # the worker restarted: as after a reboot
    assert b.mig_state(0) == (False, ())
    b.set_mig_mode(0, True)
    assert b.create_slice(0, "1g.10gb", 3).uuid == made.uuid   # same slice, same UUID


# -- the fake answers like the driver ----------------------------------------------------------------

def test_fake_error_codes_match_the_driver():
    fake = FakeNvml.machine(A100=1, L40S=1)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    info = fake.nvmlDeviceGetGpuInstanceProfileInfo(h, fake.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (9, 3, 2, 40192)

    def at(start: int, size: int = 4):
        p = fake.c_nvmlGpuInstancePlacement_t()
        p.start, p.size = start, size
        return ctypes.byref(p)

    with pytest.raises(fake.NVMLError_NotSupported):           # MIG mode off
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, at(0))
    assert fake.nvmlDeviceSetMigMode(h, fake.NVML_DEVICE_MIG_ENABLE) == fake.NVML_SUCCESS
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, at(2))
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, at(0))
    with pytest.raises(fake.NVMLError_InsufficientResources):
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, at(0))
    ci_info = fake.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, fake.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, fake.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    fake.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    with pytest.raises(fake.NVMLError_InUse):                  # a compute instance is on it
        fake.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(fake.NVMLError_InUse):                  # GPU instances left
        fake.nvmlDeviceSetMigMode(h, fake.NVML_DEVICE_MIG_DISABLE)
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetGpuInstanceProfileInfo(fake.nvmlDeviceGetHandleByIndex(1),
                                                 fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    count = ctypes.c_uint(0)
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
    assert count.value == 2


def test_fake_reboot_forgets_mig_on_hopper_and_keeps_it_on_ampere():
    fake = FakeNvml.machine(A100=1, H100=1)
    b = NvmlBackend(nvml=fake)
    for i in (0, 1):
        b.set_mig_mode(i, True)
        b.create_slice(i, "7g.80gb", 0)
    fake.reboot()
    assert b.mig_state(0) == (True, ())       # the InfoROM remembers; instances are gone
    assert b.mig_state(1) == (False, ())


def test_nvml_falls_back_to_version_1_profile_calls_on_older_drivers():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, profile, version=2):
            if version == 2:
                raise self.NVMLError(13)            # NVML_ERROR_FUNCTION_NOT_FOUND
            return super().nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, version)

        def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, eng, version=2):
            if version == 2:
                raise self.NVMLError(13)
            return super().nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, eng, version)

    fake = OldDriver(FakeNvml.machine(A100=1).gpus)
    b = NvmlBackend(nvml=fake)
    b.set_mig_mode(0, True)
    made = b.create_slice(0, "4g.40gb", 0)
    assert b.mig_state(0) == (True, (made,))
    b.destroy_slice(0, 0)
