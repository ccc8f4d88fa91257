"""GPU backends: one contract for sim and NVML (over the fake), then each one's own rules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud.gpu.backend import (NO_DRIVER_MESSAGE, GpuBackend, GpuError, NoGpuError, SimSpecError,
                              open_backend)
from gpud.gpu.nvml import NvmlBackend, marketed_gb, normalize_model
from gpud.gpu.sim import SimBackend, parse_spec, sim_uuid
from gpud.model import GpuInfo
from tests.fake_pynvml import FakeGpu, FakeNvml

# -- the contract, over both backends --------------------------------------------------------

MACHINES = {
    # sim spec -> the same machine as fake NVML boards
    "8xH100-80GB": {"H100": 8},
    "4xA100-80GB,2xA30-24GB": {"A100": 4, "A30": 2},
}


def make_backend(kind: str, spec: str, node: str = "node1") -> GpuBackend:
    if kind == "sim":
        return open_backend(spec, node)
    return open_backend(None, node, nvml=FakeNvml.machine(host=node, **MACHINES[spec]))


@pytest.fixture(params=["sim", "nvml"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def backend(kind):
    b = make_backend(kind, "8xH100-80GB")
    yield b
    b.close()


def test_is_a_gpu_backend(backend, kind):
    assert isinstance(backend, GpuBackend)
    assert backend.name == kind


def test_discovers_every_gpu_in_index_order(backend):
    gpus = backend.discover()
    assert all(isinstance(g, GpuInfo) for g in gpus)
    assert [g.index for g in gpus] == list(range(8))
    assert [g.model for g in gpus] == ["H100-80GB"] * 8


def test_uuids_are_unique_and_look_like_nvidia_ones(backend):
    uuids = [g.uuid for g in backend.discover()]
    assert len(set(uuids)) == len(uuids)
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)


def test_memory_is_close_to_the_model_size(backend):
    for g in backend.discover():
        marketed_mb = int(re.search(r"-(\d+)GB$", g.model).group(1)) * 1024
        assert 0.9 * marketed_mb <= g.memory_mb <= marketed_mb


def test_discover_is_repeatable(backend):
    assert backend.discover() == backend.discover()


def test_close_is_idempotent_and_final(backend):
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError):
        backend.discover()


@pytest.mark.parametrize("spec", list(MACHINES))
def test_same_machine_gives_same_models(spec):
    sim, nvml = make_backend("sim", spec), make_backend("nvml", spec)
    assert [g.model for g in sim.discover()] == [g.model for g in nvml.discover()]
    assert [g.index for g in sim.discover()] == [g.index for g in nvml.discover()]


# -- sim --------------------------------------------------------------------------------------

def test_sim_spec_with_several_groups_numbers_gpus_in_order():
    gpus = SimBackend("4xA100-80GB,2xA30-24GB", "n1").discover()
    assert [(g.index, g.model, g.memory_mb) for g in gpus] == (
        [(i, "A100-80GB", 81920) for i in range(4)] + [(4, "A30-24GB", 24576), (5, "A30-24GB", 24576)]
    )


@pytest.mark.parametrize("spec, models", [
    ("1xH200-141GB", ["H200-141GB"]),
    (" 2 x L40S-48GB , 1xH100-94GB ", ["L40S-48GB", "L40S-48GB", "H100-94GB"]),
    ("1xRTX-6000-Ada-48gb", ["RTX-6000-Ada-48GB"]),
    ("3XA100-40GB", ["A100-40GB"] * 3),
])
def test_sim_accepts_any_name_with_a_size(spec, models):
    assert parse_spec(spec) == models


def test_sim_uuids_are_stable_per_node_and_unique_across_nodes():
    a1 = SimBackend("8xH100-80GB", "a").discover()
    a2 = SimBackend("8xH100-80GB", "a").discover()
    b = SimBackend("8xH100-80GB", "b").discover()
    assert a1 == a2
    assert not {g.uuid for g in a1} & {g.uuid for g in b}
    assert a1[3].uuid == sim_uuid("a", 3, "H100-80GB")


def test_sim_error_message_for_garbage():
    with pytest.raises(SimSpecError) as e:
        open_backend("x", "n1")
    assert str(e.value) == (
        "invalid --sim spec 'x': use COUNTxMODEL[,COUNTxMODEL...], e.g. 8xH100-80GB")


@pytest.mark.parametrize("spec", [
    "", " ", "x", "8x", "xH100-80GB", "8xH100", "8xH100-0GB", "8xH100-80GB,", ",8xH100-80GB",
    "8*H100-80GB", "0xH100-80GB", "-1xH100-80GB", "2000xH100-80GB", "8xH100-80TB", "8x-80GB",
    "8xH100 80GB", "8xH100-80GB;rm -rf /",
])
def test_sim_rejects_bad_specs_in_one_line(spec):
    with pytest.raises(SimSpecError) as e:
        SimBackend(spec, "n1")
    msg = str(e.value)
    assert msg.startswith(f"invalid --sim spec {spec!r}: ")
    assert "\n" not in msg
    assert isinstance(e.value, GpuError) and isinstance(e.value, ValueError)


@given(st.lists(st.tuples(st.integers(1, 16), st.sampled_from(
    ["H100-80GB", "H200-141GB", "A30-24GB", "L40S-48GB", "X-1GB"])), min_size=1, max_size=5))
def test_sim_spec_round_trip(groups):
    spec = ",".join(f"{n}x{m}" for n, m in groups)
    gpus = SimBackend(spec, "n").discover()
    assert [g.model for g in gpus] == [m for n, m in groups for _ in range(n)]
    assert len({g.uuid for g in gpus}) == len(gpus)


# -- nvml -------------------------------------------------------------------------------------

GIB = 1 << 30


@pytest.mark.parametrize("name, mib, model", [
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
    ("NVIDIA H200", 143771, "H200-141GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
    ("NVIDIA H100 NVL", 95830, "H100-94GB"),
    ("NVIDIA L40S", 46068, "L40S-48GB"),
    ("NVIDIA A30", 24576, "A30-24GB"),
    ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090-24GB"),
    ("NVIDIA RTX 6000 Ada Generation", 49140, "RTX-6000-Ada-48GB"),
    (b"NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA", 1024, "GPU-1GB"),
    ("NVIDIA Fut\u00fcre/X 1000", 1000 * 1024, "FutreX-1000-1000GB"),
])
def test_normalize_model(name, mib, model):
    assert normalize_model(name, mib * (1 << 20)) == model


def test_marketed_size_rounds_up_to_what_is_sold():
    assert marketed_gb(80 * GIB) == 80
    assert marketed_gb(int(79.6 * GIB)) == 80
    assert marketed_gb(int(140.4 * GIB)) == 141
    assert marketed_gb(300 * GIB + 1) == 301


@pytest.mark.parametrize("bytes_strings", [False, True])
def test_nvml_accepts_str_and_bytes(bytes_strings):
    fake = FakeNvml.machine(H200=2, bytes_strings=bytes_strings)
    gpus = NvmlBackend(nvml=fake).discover()
    assert [g.model for g in gpus] == ["H200-141GB"] * 2
    assert [g.uuid for g in gpus] == [g.uuid for g in fake.gpus]
    assert all(isinstance(g.uuid, str) for g in gpus)
    assert gpus[0].memory_mb == 143771


def test_nvml_only_reads_and_releases_the_driver_on_close(tmp_path):
    fake = FakeNvml.machine(H100=2)
    b = NvmlBackend(nvml=fake, sysfs_root=str(tmp_path))   # no sysfs: NUMA from NVML
    b.discover()
    b.close()
    b.close()
    assert fake.refcount == 0
    assert set(fake.calls) == {
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPciInfo", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemoteDeviceType"}


def test_nvml_leaves_out_a_lost_gpu(caplog):
    fake = FakeNvml.machine(H100=3)
    fake.gpus[1].lost = True
    gpus = NvmlBackend(nvml=fake).discover()
    assert [g.index for g in gpus] == [0, 2]
    assert "GPU 1 left out" in caplog.text


def test_nvml_with_no_gpus_is_an_empty_node():
    assert NvmlBackend(nvml=FakeNvml([])).discover() == []


def test_no_driver_is_a_clear_error():
    with pytest.raises(NoGpuError) as e:
        open_backend(None, "n1", nvml=FakeNvml.machine(H100=8, driver=False))
    assert str(e.value) == NO_DRIVER_MESSAGE
    assert str(e.value) == ("no NVIDIA driver found on this host; use --sim SPEC to simulate "
                            "GPUs (e.g. --sim 8xH100-80GB)")


def test_other_driver_failures_are_one_line_gpu_errors():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError(self.NVML_ERROR_NO_PERMISSION)

    with pytest.raises(GpuError) as e:
        NvmlBackend(nvml=Broken())
    assert not isinstance(e.value, NoGpuError)
    assert str(e.value) == ("NVML failed to start: Insufficient Permissions; "
                            "check the NVIDIA driver with nvidia-smi")


def test_no_driver_on_this_machine_without_a_fake():
    # This host has no GPU: the real pynvml must end in NoGpuError, not a traceback.
    try:
        b = open_backend(None, "n1")
    except NoGpuError:
        return
    b.close()  # a host with a driver: nothing to check here


# -- the fake itself behaves like pynvml ------------------------------------------------------

def test_fake_errors_map_codes_to_classes_like_pynvml():
    fake = FakeNvml()
    err = fake.NVMLError(fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert type(err) is fake.NVMLError_LibraryNotFound
    assert err.value == 12 and isinstance(err, fake.NVMLError)
    assert fake.NVMLError_GpuIsLost().value == 15
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(0)


def test_fake_handles_belong_to_their_machine():
    a, b = FakeNvml([FakeGpu("NVIDIA A30", 24576, "GPU-a")]), FakeNvml([FakeGpu("NVIDIA A30", 24576, "GPU-b")])
    a.nvmlInit()
    b.nvmlInit()
    with pytest.raises(b.NVMLError_InvalidArgument):
        b.nvmlDeviceGetUUID(a.nvmlDeviceGetHandleByIndex(0))
