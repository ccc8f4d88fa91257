"""The MIG catalog and placement rules (gpud.gpu.mig): table tests per model plus properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.gpu import mig
from gpud.gpu.mig import MigError, Placement, Slice

EIGHT_SLOT = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB"]
ALL_MODELS = EIGHT_SLOT + ["A30-24GB"]

# The profiles of each 8-slot model by role, smallest first, as NVIDIA names them.
NAMES = {
    "A100-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-94GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                   "7g.141gb"],
}
ROLES = ["1g", "me", "1g2", "2g", "3g", "4g", "7g"]
# role: (compute slices, memory slots, max count, starts, NVML constant)
SHAPE_8 = {
    "1g": (1, 1, 7, range(7), "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
    "me": (1, 1, 1, range(7), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"),
    "1g2": (1, 2, 4, (0, 2, 4, 6), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"),
    "2g": (2, 2, 3, (0, 2, 4), "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
    "3g": (3, 4, 2, (0, 4), "NVML_GPU_INSTANCE_PROFILE_3_SLICE"),
    "4g": (4, 4, 1, (0,), "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
    "7g": (7, 8, 1, (0,), "NVML_GPU_INSTANCE_PROFILE_7_SLICE"),
}
A30 = {  # name: (compute, memory slots, max count, starts, NVML constant)
    "1g.6gb": (1, 1, 4, range(4), "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
    "1g.6gb+me": (1, 1, 1, range(4), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"),
    "2g.12gb": (2, 2, 2, (0, 2), "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
    "2g.12gb+me": (2, 2, 1, (0, 2), "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1"),
    "4g.24gb": (4, 4, 1, (0,), "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
}


def role(model: str, r: str) -> str:
    return NAMES[model][ROLES.index(r)]


def layout(model: str, *items: tuple[str, int]) -> list[Slice]:
    return [Slice(role(model, r), s) for r, s in items]


def expected_shapes(model: str) -> dict[str, tuple]:
    if model == "A30-24GB":
        return A30
    return {role(model, r): SHAPE_8[r] for r in ROLES}


# --- the catalog ---------------------------------------------------------------------

@pytest.mark.parametrize("model", ALL_MODELS)
def test_catalog_matches_nvidia_tables(model):
    cat = mig.catalog(model)
    want = expected_shapes(model)
    assert list(cat) == list(want)
    for name, (compute, mem, count, starts, nvml) in want.items():
        p = cat[name]
        assert (p.name, p.gpu_model) == (name, model)
        assert (p.compute_slices, p.memory_slices, p.max_count) == (compute, mem, count)
        assert p.placements == tuple(Placement(s, mem) for s in starts)
        assert p.nvml_profile == nvml
        assert p.media_extensions == name.endswith("+me")


@pytest.mark.parametrize("model", ALL_MODELS)
def test_memory_sizes_are_close_to_the_names(model):
    cat = mig.catalog(model)
    total_gb = int(model.split("-")[1].removesuffix("GB"))
    for p in cat.values():
        gb = int(p.name.split(".")[1].split("gb")[0])
        # NVML reports a little less than the name's rounded size, never more.
        assert gb * 1024 * 0.85 <= p.memory_mb <= gb * 1024 + 256, p
        # memory grows with the memory slots a profile holds
        assert p.memory_mb == pytest.approx(
            total_gb * 1024 * p.memory_slices / mig.memory_slots(model), rel=0.15)


@pytest.mark.parametrize("model", ALL_MODELS)
def test_nvml_constants_exist_in_pynvml(model):
    pynvml = pytest.importorskip("pynvml")
    for p in mig.catalog(model).values():
        assert isinstance(getattr(pynvml, p.nvml_profile), int)
        assert mig.profile_for_nvml(model, p.nvml_profile) == p.name
    with pytest.raises(MigError):
        mig.profile_for_nvml(model, "NVML_GPU_INSTANCE_PROFILE_6_SLICE")


def test_fraction_is_the_compute_share():
    assert mig.catalog("A100-80GB")["1g.10gb"].fraction == pytest.approx(1 / 7)
    assert mig.catalog("A100-80GB")["1g.20gb"].fraction == pytest.approx(1 / 7)
    assert mig.catalog("H200-141GB")["3g.71gb"].fraction == pytest.approx(3 / 7)
    assert mig.catalog("H100-80GB")["7g.80gb"].fraction == 1.0
    assert mig.catalog("A30-24GB")["1g.6gb"].fraction == pytest.approx(1 / 4)
    assert mig.catalog("A30-24GB")["4g.24gb"].fraction == 1.0


def test_supports_mig_and_model_names():
    assert all(mig.supports_mig(m) for m in ALL_MODELS)
    assert mig.mig_models() == ["A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB",
                                "H100-94GB", "H200-141GB"]
    assert mig.supports_mig(" h100-80gb ")
    assert mig.catalog("H100-NVL") == mig.catalog("H100-94GB")
    for bad in ("V100-32GB", "L40S-48GB", "", None, 7, ["A100-80GB"]):
        assert not mig.supports_mig(bad)
    with pytest.raises(MigError, match="does not support MIG"):
        mig.catalog("V100-32GB")
    assert (mig.compute_slots("A30-24GB"), mig.memory_slots("A30-24GB")) == (4, 4)
    assert (mig.compute_slots("H200-141GB"), mig.memory_slots("H200-141GB")) == (7, 8)


def test_catalog_is_a_copy():
    mig.catalog("A100-80GB").clear()
    assert "1g.10gb" in mig.catalog("A100-80GB")


@pytest.mark.parametrize("text, want", [
    ("1g.10gb", "1g.10gb"), (" 1G.10GB ", "1g.10gb"), ("MIG 3g.40gb", "3g.40gb"),
    ("mig-1g.10gb", "1g.10gb"), ("nvidia.com/mig-2g.20gb", "2g.20gb"),
    ("1g.10gb+me", "1g.10gb+me"), ("1g.10gb.me", "1g.10gb+me"), ("7g.141gb", "7g.141gb"),
])
def test_parse_profile_normalises(text, want):
    assert mig.parse_profile(text) == want


@pytest.mark.parametrize("text", ["", "1g", "10gb", "1g.10", "g.10gb", "1g.10gb+xx", None, 3])
def test_parse_profile_refuses_garbage(text):
    with pytest.raises(MigError, match="invalid MIG profile"):
        mig.parse_profile(text)


def test_parse_profile_checks_the_model():
    assert mig.parse_profile("1g.5gb", "A100-40GB") == "1g.5gb"
    with pytest.raises(MigError, match="A100-80GB has no MIG profile 1g.5gb; it offers 1g.10gb"):
        mig.parse_profile("1g.5gb", "A100-80GB")


# --- valid and invalid layouts ------------------------------------------------------------

VALID_8 = {
    "seven 1g": [("1g", s) for s in range(7)],
    "four 1g with two slots": [("1g2", s) for s in (0, 2, 4, 6)],
    "three 2g": [("2g", 0), ("2g", 2), ("2g", 4)],
    "three 2g and a 1g": [("2g", 0), ("2g", 2), ("2g", 4), ("1g", 6)],
    "two 3g": [("3g", 0), ("3g", 4)],
    "4g and 3g": [("4g", 0), ("3g", 4)],
    "4g, 2g, 1g": [("4g", 0), ("2g", 4), ("1g", 6)],
    "4g and three 1g": [("4g", 0), ("1g", 4), ("1g", 5), ("1g", 6)],
    "balanced": [("1g", 0), ("1g", 1), ("2g", 2), ("3g", 4)],
    "3g, 1g with two slots, 1g": [("3g", 0), ("1g2", 4), ("1g", 6)],
    "3g at 4, two 1g with two slots": [("1g2", 0), ("1g2", 2), ("3g", 4)],
    "media extensions and six 1g": [("me", 0)] + [("1g", s) for s in range(1, 7)],
    "whole GPU": [("7g", 0)],
    "empty": [],
}
INVALID_8 = {
    "two 4g": ([("4g", 0), ("4g", 0)], "too many 4g"),
    "two 3g on the same slots": ([("3g", 0), ("3g", 0)], "overlaps"),
    "two media extensions": ([("me", 0), ("me", 1)], "too many 1g"),
    "1g on slot 7": ([("1g", 7)], "cannot start at memory slot 7"),
    "2g on an odd slot": ([("2g", 1)], "it may start at 0,2,4"),
    "3g at 2": ([("3g", 2)], "it may start at 0,4"),
    "4g at 4": ([("4g", 4)], "it may start at 0"),
    "1g with two slots at 1": ([("1g2", 1)], "cannot start at memory slot 1"),
    "2g over a 1g": ([("1g", 1), ("2g", 0)], "1g.* at slot 1 overlaps 2g.* at slot 0"),
    "eight 1g": ([("1g", s) for s in range(7)] + [("1g", 3)], "too many 1g"),
    "7g and a 1g": ([("7g", 0), ("1g", 6)], "compute slices"),
    "4g over a 3g": ([("3g", 0), ("4g", 0)], "overlaps"),
    "negative slot": ([("1g", -1)], "cannot start at memory slot -1"),
}


@pytest.mark.parametrize("model", EIGHT_SLOT)
@pytest.mark.parametrize("case", list(VALID_8))
def test_documented_layouts_are_valid(model, case):
    slices = layout(model, *VALID_8[case])
    mig.validate_layout(model, slices)
    assert mig.is_valid_layout(model, list(reversed(slices)))


@pytest.mark.parametrize("model", EIGHT_SLOT)
@pytest.mark.parametrize("case", list(INVALID_8))
def test_invalid_layouts_say_why(model, case):
    items, why = INVALID_8[case]
    slices = layout(model, *items)
    with pytest.raises(MigError, match=why) as err:
        mig.validate_layout(model, slices)
    assert "\n" not in str(err.value) and model in str(err.value)
    assert not mig.is_valid_layout(model, slices)


A30_VALID = [
    [("1g.6gb", s) for s in range(4)],
    [("2g.12gb", 0), ("2g.12gb", 2)],
    [("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)],
    [("1g.6gb+me", 0), ("1g.6gb", 1), ("2g.12gb", 2)],
    [("2g.12gb+me", 0), ("2g.12gb", 2)],
    [("4g.24gb", 0)],
]
A30_INVALID = [
    ([("4g.24gb", 0), ("1g.6gb", 3)], "compute slices"),
    ([("1g.6gb+me", 0), ("2g.12gb+me", 2)], "only one media-extension"),
    ([("2g.12gb", 1)], "it may start at 0,2"),
    ([("1g.6gb", 4)], "cannot start at memory slot 4"),
    ([("2g.12gb", 0), ("2g.12gb", 0)], "overlaps"),
    ([("1g.10gb", 0)], "A30-24GB has no MIG profile 1g.10gb"),
]


@pytest.mark.parametrize("items", A30_VALID)
def test_a30_valid_layouts(items):
    mig.validate_layout("A30-24GB", [Slice(*i) for i in items])


@pytest.mark.parametrize("items, why", A30_INVALID)
def test_a30_invalid_layouts(items, why):
    with pytest.raises(MigError, match=why):
        mig.validate_layout("A30-24GB", [Slice(*i) for i in items])


def test_layouts_from_messages_and_tuples():
    model = "A100-80GB"
    mig.validate_layout(model, [{"profile": "MIG 3g.40gb", "start": 4}, ("4g.40gb", 0)])
    assert Slice.from_dict(Slice("1g.10gb", 6).to_dict()) == Slice("1g.10gb", 6)
    assert str(Slice("1g.10gb", 6)) == "1g.10gb@6" and str(Placement(0, 4)) == "0:4"
    for bad in ("1g.10gb@0", {"profile": "1g.10gb", "start": 0}, [5], [("1g.10gb", "0")],
                [Slice("1g.10gb", True)], [{"profile": 1, "start": 0}], [{"start": 0}],
                [("1g.10gb",)], [None], 42):
        with pytest.raises(MigError):
            mig.validate_layout(model, bad)
        assert not mig.is_valid_layout(model, bad)
    with pytest.raises(MigError):
        Slice.from_dict("1g.10gb")


# --- free placements and place() ----------------------------------------------------------

@pytest.mark.parametrize("model", EIGHT_SLOT)
def test_free_placements_after_some_slices(model):
    def free(r, *used):
        return [(p.start, p.size) for p in mig.free_placements(model, role(model, r),
                                                                layout(model, *used))]
    assert free("1g") == [(s, 1) for s in range(7)]
    assert free("4g", ("3g", 4)) == [(0, 4)]
    assert free("3g", ("3g", 4)) == [(0, 4)]
    assert free("2g", ("3g", 4)) == [(0, 2), (2, 2)]
    assert free("1g", ("3g", 4)) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert free("7g", ("3g", 4)) == []
    assert free("4g", ("1g", 0)) == []
    assert free("3g", ("1g", 0)) == [(4, 4)]
    assert free("1g2", ("1g", 6)) == [(0, 2), (2, 2), (4, 2)]
    assert free("me", ("me", 3)) == []
    assert free("1g", ("4g", 0), ("2g", 4), ("1g", 6)) == []  # 7 compute slices used
    with pytest.raises(MigError, match="overlaps"):
        free("1g", ("2g", 0), ("2g", 0))


@pytest.mark.parametrize("model", EIGHT_SLOT)
def test_place_keeps_room_for_big_profiles(model):
    def alone(r):
        return mig.place(model, [role(model, r)])
    assert alone("1g") == [Slice(role(model, "1g"), 6)]
    assert alone("1g2") == [Slice(role(model, "1g2"), 6)]
    assert alone("2g") == [Slice(role(model, "2g"), 4)]
    assert alone("3g") == [Slice(role(model, "3g"), 4)]
    assert alone("4g") == [Slice(role(model, "4g"), 0)]
    assert alone("7g") == [Slice(role(model, "7g"), 0)]
    # after a small slice at the top, a 4g still fits
    used = mig.place(model, [role(model, "1g")])
    assert mig.place(model, [role(model, "4g")], used) == [Slice(role(model, "4g"), 0)]


@pytest.mark.parametrize("model", EIGHT_SLOT)
def test_place_around_used_slices_without_moving_them(model):
    used = layout(model, ("1g", 0))
    assert mig.place(model, [role(model, "3g")] * 2, used) is None
    assert mig.place(model, [role(model, "4g")], used) is None
    want = [role(model, "1g"), role(model, "3g"), role(model, "2g")]
    got = mig.place(model, want, used)
    assert [s.profile for s in got] == want          # in the order asked
    assert Slice(role(model, "1g"), 0) not in got
    mig.validate_layout(model, used + got)
    assert mig.place(model, [], used) == []
    assert mig.place(model, [role(model, "1g")] * 7) == [
        Slice(role(model, "1g"), s) for s in range(6, -1, -1)]
    assert mig.place(model, [role(model, "1g")] * 8) is None
    assert mig.place(model, [role(model, "me")] * 2) is None


def test_place_refuses_bad_input():
    with pytest.raises(MigError, match="list of MIG profile names"):
        mig.place("A100-80GB", "1g.10gb")
    with pytest.raises(MigError, match="no MIG profile"):
        mig.place("A100-80GB", ["1g.5gb"])
    with pytest.raises(MigError, match="too many"):
        mig.place("A100-80GB", ["1g.10gb"], [Slice("4g.40gb", 0)] * 2)
    with pytest.raises(MigError, match="does not support MIG"):
        mig.place("T4-16GB", ["1g.10gb"])


def test_a30_place():
    assert mig.place("A30-24GB", ["1g.6gb"]) == [Slice("1g.6gb", 3)]
    assert mig.place("A30-24GB", ["2g.12gb"]) == [Slice("2g.12gb", 2)]
    assert mig.place("A30-24GB", ["4g.24gb"], [Slice("1g.6gb", 3)]) is None
    assert mig.place("A30-24GB", ["2g.12gb+me", "1g.6gb+me"]) is None


# --- layouts for demand --------------------------------------------------------------------

M = "A100-80GB"


def test_demand_fills_and_stops_at_capacity():
    assert mig.layouts_for_demand(M, {}) == []
    assert mig.layouts_for_demand(M, {"1g.10gb": 0}) == []
    got = mig.layouts_for_demand(M, {"1g.10gb": 10})
    assert got == [Slice("1g.10gb", s) for s in range(7)]
    assert mig.layouts_for_demand(M, {"1g.10gb": 1}, got) == []
    assert mig.layouts_for_demand(M, {"1g.10gb+me": 3}) == [Slice("1g.10gb+me", 6)]


def test_demand_serves_the_most_compute_first():
    assert mig.layouts_for_demand(M, {"4g.40gb": 1, "3g.40gb": 2}) == [
        Slice("4g.40gb", 0), Slice("3g.40gb", 4)]
    got = mig.layouts_for_demand(M, {"3g.40gb": 2, "4g.40gb": 1, "1g.10gb": 3})
    assert sorted(s.profile for s in got) == ["1g.10gb"] * 3 + ["4g.40gb"]
    # equal compute: more jobs win
    used = [Slice("4g.40gb", 0)]
    assert mig.layouts_for_demand(M, {"3g.40gb": 1, "1g.10gb": 3}, used) == [
        Slice("1g.10gb", s) for s in (4, 5, 6)]
    # equal compute and jobs: fewer memory slots win
    assert mig.layouts_for_demand(M, {"1g.20gb": 1, "1g.10gb": 1}, used + [
        Slice("1g.10gb", 4), Slice("1g.10gb", 5)]) == [Slice("1g.10gb", 6)]


def test_demand_never_moves_used_slices():
    used = [Slice("1g.10gb", 6)]
    assert mig.layouts_for_demand(M, {"3g.40gb": 2}, used) == [Slice("3g.40gb", 0)]
    used = [Slice("2g.20gb", 2)]
    got = mig.layouts_for_demand(M, {"4g.40gb": 1, "2g.20gb": 2, "1g.10gb": 1}, used)
    assert Slice("4g.40gb", 0) not in got
    mig.validate_layout(M, used + got)
    assert [s.profile for s in got].count("2g.20gb") == 2


def test_demand_is_deterministic_and_ignores_key_order():
    a = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1, "1g.20gb": 3}
    b = dict(reversed(list(a.items())))
    first = mig.layouts_for_demand(M, a)
    assert first == mig.layouts_for_demand(M, b) == mig.layouts_for_demand(M, a)
    merged = mig.layouts_for_demand(M, {"MIG 1g.10gb": 1, "1g.10gb": 1})
    assert [s.profile for s in merged] == ["1g.10gb", "1g.10gb"]


@pytest.mark.parametrize("demand, why", [
    ({"5g.50gb": 1}, "no MIG profile 5g.50gb"),
    ({"1g.10gb": -1}, "must be a count"),
    ({"1g.10gb": 1.5}, "must be a count"),
    ({"1g.10gb": True}, "must be a count"),
    (["1g.10gb"], "must map profile names"),
])
def test_demand_refuses_bad_input(demand, why):
    with pytest.raises(MigError, match=why):
        mig.layouts_for_demand(M, demand)


# --- named layouts and memory requests ------------------------------------------------------

@pytest.mark.parametrize("model", ALL_MODELS)
def test_every_named_layout_is_valid_and_full(model):
    cat = mig.catalog(model)
    for name in mig.layout_names(model):
        slices = mig.named_layout(model, name)
        mig.validate_layout(model, slices)
        if name.startswith("all-") and name[4:] in cat:
            assert len(slices) == cat[name[4:]].max_count, name
    assert mig.named_layout(model, "all-enabled") == []


def test_named_layouts_match_mig_parted():
    def counts(model, name):
        out: dict[str, int] = {}
        for s in mig.named_layout(model, name):
            out[s.profile] = out.get(s.profile, 0) + 1
        return out
    assert counts("A100-80GB", "all-balanced") == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert counts("A100-40GB", "all-balanced") == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert counts("H200-141GB", "all-balanced") == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert counts("A30-24GB", "all-balanced") == {"1g.6gb": 2, "2g.12gb": 1}
    assert counts("A100-80GB", "all-1g.10gb") == {"1g.10gb": 7}
    assert counts("A100-40GB", "all-1g.10gb") == {"1g.10gb": 4}
    assert counts("A100-80GB", "all-3g.40gb") == {"3g.40gb": 2}
    assert counts("A100-80GB", "all-1g.10gb.me") == {"1g.10gb+me": 1}
    assert mig.named_layout("H100-80GB", "ALL-7G.80GB") == [Slice("7g.80gb", 0)]
    for bad in ("all-9g.90gb", "balanced", "", None, "all-1g.5gb"):
        with pytest.raises(MigError, match="unknown MIG layout"):
            mig.named_layout("A100-80GB", bad)
    with pytest.raises(MigError, match="turns MIG mode off"):
        mig.named_layout("A100-80GB", "all-disabled")


@pytest.mark.parametrize("model, mem, want", [
    ("A100-80GB", 0, "1g.10gb"),
    ("A100-80GB", 9000, "1g.10gb"),
    ("A100-80GB", 9728, "1g.10gb"),
    ("A100-80GB", 10240, "1g.20gb"),   # 1g.10gb holds 9.5 GiB: not enough
    ("A100-80GB", 30000, "3g.40gb"),
    ("A100-80GB", 50000, "7g.80gb"),
    ("A100-80GB", 90000, None),
    ("H200-141GB", 20000, "1g.35gb"),
    ("A30-24GB", 6000, "2g.12gb"),
    ("A30-24GB", 24064, "4g.24gb"),
])
def test_profile_for_memory(model, mem, want):
    assert mig.profile_for_memory(model, mem) == want


def test_profile_for_memory_refuses_bad_sizes():
    for bad in (-1, 1.5, "10G", None, True):
        with pytest.raises(MigError):
            mig.profile_for_memory("A100-80GB", bad)


# --- properties -------------------------------------------------------------------------------

@st.composite
def gpu_and_used(draw):
    """A model and a valid layout already on it, built by place() from random profiles."""
    model = draw(st.sampled_from(ALL_MODELS))
    names = list(mig.catalog(model))
    used: list[Slice] = []
    for name in draw(st.lists(st.sampled_from(names), max_size=5)):
        got = mig.place(model, [name], used)
        if got:
            used += got
    return model, names, used


@settings(max_examples=150, deadline=None)
@given(data=st.data(), setup=gpu_and_used())
def test_place_output_always_validates(data, setup):
    model, names, used = setup
    want = data.draw(st.lists(st.sampled_from(names), max_size=7))
    got = mig.place(model, want, used)
    if got is not None:
        assert [s.profile for s in got] == want
        mig.validate_layout(model, used + got)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), setup=gpu_and_used())
def test_place_finds_a_fit_whenever_one_exists(data, setup):
    model, names, used = setup
    want = data.draw(st.lists(st.sampled_from(names), max_size=3))
    cat = mig.catalog(model)
    exists = any(
        mig.is_valid_layout(model, used + [Slice(n, p.start) for n, p in zip(want, combo)])
        for combo in itertools.product(*(cat[n].placements for n in want)))
    assert (mig.place(model, want, used) is not None) == exists


@settings(max_examples=150, deadline=None)
@given(data=st.data(), setup=gpu_and_used())
def test_demand_output_validates_and_serves_what_fits(data, setup):
    model, names, used = setup
    demand = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, 8), max_size=4))
    got = mig.layouts_for_demand(model, demand, used)
    mig.validate_layout(model, used + got)
    assert got == mig.layouts_for_demand(model, dict(reversed(list(demand.items()))), used)
    for name in {s.profile for s in got}:
        assert sum(s.profile == name for s in got) <= demand[name]
    # when everything asked for fits at once, everything is served
    cat = mig.catalog(model)
    everything = [n for n, k in demand.items() for _ in range(min(k, cat[n].max_count))]
    if mig.place(model, everything, used) is not None:
        assert sorted(s.profile for s in got) == sorted(everything)
    # and never less compute than the best single slice that fits
    served = sum(cat[s.profile].compute_slices for s in got)
    for n, k in demand.items():
        if k and mig.free_placements(model, n, used):
            assert served >= cat[n].compute_slices
