"""GPU topology reporting: NUMA nodes and NVLink peers from both backends, rack and switch
labels from the config, and how sinfo --topology and scontrol show node print them."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from gpud import config
from gpud.gpu.backend import SimSpecError
from gpud.gpu.nvml import NvmlBackend
from gpud.gpu.sim import SimBackend, parse_spec
from gpud.gpu.topology import normalize_bus_id
from gpud.model import GpuInfo, NodeInfo
from gpud.worker.nodeinfo import build_node_info
from gpuctl.main import cli
from gpuctl.topology import feature_lines, islands, node_lines, numa_text, sinfo_table
from tests.cluster import REPO, Cluster
from tests.fake_head import FakeHead, node
from tests.fake_pynvml import FakeNvml
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

ALL8 = [tuple(j for j in range(8) if j != i) for i in range(8)]
TWO_FOURS = [tuple(j for j in range(4) if j != i) for i in range(4)] + \
            [tuple(j for j in range(4, 8) if j != i) for i in range(4, 8)]


def wiring(gpus: list[GpuInfo]) -> tuple[list, list]:
    return [g.numa_node for g in gpus], [g.nvlink_peers for g in gpus]


# -- simulated GPUs -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, peers", [
    ("8xH100-80GB", ALL8),
    ("8xH200-141GB", ALL8),
    ("8xA100-40GB", ALL8),
    ("8xH100-80GB@nvswitch", ALL8),
    ("8xH100-80GB@islands4", TWO_FOURS),
    ("8xH100-80GB@none", [()] * 8),
    ("8xL40S-48GB", [()] * 8),                 # PCIe cards: no NVLink unless the spec says so
    ("4xH100-80GB", [()] * 4),                 # not a full HGX board
    ("4xH100-80GB,4xA100-80GB", [()] * 8),
    ("4xL40S-48GB@islands2", [(1,), (0,), (3,), (2,)]),
    ("1xH100-80GB@nvswitch", [()]),
])
def test_sim_wiring_from_the_spec(spec, peers):
    assert [g.nvlink_peers for g in SimBackend(spec, "n1").discover()] == peers


@pytest.mark.parametrize("spec, numa", [
    ("8xH100-80GB", [0, 0, 0, 0, 1, 1, 1, 1]),
    ("3xA30-24GB", [0, 0, 1]),
    ("1xH100-80GB", [0]),
])
def test_sim_gpus_are_split_evenly_over_two_numa_nodes(spec, numa):
    assert [g.numa_node for g in SimBackend(spec, "n1").discover()] == numa


def test_every_old_spec_means_what_it_meant():
    assert parse_spec("4xA100-80GB,2xA30-24GB") == ["A100-80GB"] * 4 + ["A30-24GB"] * 2
    assert parse_spec("8xH100-80GB@islands4") == ["H100-80GB"] * 8


@pytest.mark.parametrize("spec, message", [
    ("8xH100-80GB@ring", "unknown topology 'ring'; use @nvswitch, @islandsN (e.g. @islands4) or @none"),
    ("6xH100-80GB@islands4", "@islands4 needs a multiple of 4 GPUs, not 6"),
    ("8xH100-80GB@islands1", "an NVLink island has at least 2 GPUs, not 1"),
    ("8xH100-80GB@", "unknown topology ''"),
])
def test_a_bad_topology_is_one_line(spec, message):
    with pytest.raises(SimSpecError) as e:
        SimBackend(spec, "n1")
    assert str(e.value).startswith(f"invalid --sim spec {spec!r}: {message}")


def test_the_config_checks_the_topology_of_worker_sim():
    assert config.from_text('[worker]\nsim = "8xH100-80GB@islands4"\n').worker.sim == "8xH100-80GB@islands4"
    with pytest.raises(config.ConfigError) as e:
        config.from_text('[worker]\nsim = "8xH100-80GB@islands3"\n', "gpud.toml")
    assert e.value.lines == ["gpud.toml:2: worker.sim: invalid GPU spec '8xH100-80GB@islands3': "
                             "@islands3 needs a multiple of 3 GPUs, not 8"]


# -- NVML ---------------------------------------------------------------------------------------

def nvml(fake: FakeNvml, sysfs) -> NvmlBackend:
    return NvmlBackend(nvml=fake, sysfs_root=str(sysfs))


def test_nvml_hgx_board_is_one_nvswitch_island_with_sysfs_numa(tmp_path):
    fake = FakeNvml.machine(H100=8)
    fake.write_sysfs(str(tmp_path))
    assert wiring(nvml(fake, tmp_path).discover()) == ([0, 0, 0, 0, 1, 1, 1, 1], ALL8)


def test_nvml_a100_board_reaches_six_switches_on_twelve_links(tmp_path):
    fake = FakeNvml.machine(A100=8)
    assert len(fake.gpus[0].nvlinks) == 12
    assert wiring(nvml(fake, tmp_path).discover())[1] == ALL8


def test_nvml_nvl_cards_pair_up_and_pcie_cards_have_no_nvlink(tmp_path, caplog):
    fake = FakeNvml.machine(H100_NVL=4, L40S=2)
    fake.write_sysfs(str(tmp_path))
    with caplog.at_level(logging.DEBUG, logger="gpud.gpu.topology"):
        gpus = nvml(fake, tmp_path).discover()
    assert wiring(gpus) == ([0, 0, 0, 1, 1, 1], [(1,), (0,), (3,), (2,), (), ()])
    assert "GPU 4 has no NVLink: Not Supported" in caplog.text


def test_nvml_numa_without_sysfs_comes_from_a_coherent_gpu_or_stays_unknown(tmp_path):
    fake = FakeNvml.machine(H100=2)
    assert wiring(nvml(fake, tmp_path).discover())[0] == [None, None]   # x86: NOT_SUPPORTED
    fake = FakeNvml.machine(H100=2)
    for i, g in enumerate(fake.gpus):
        g.gpu_numa_node = 4 + i          # a GPU that is itself a NUMA node
    assert wiring(nvml(fake, tmp_path).discover())[0] == [4, 5]


def test_nvml_numa_of_a_gpu_missing_in_sysfs_comes_from_its_pcie_neighbour(tmp_path):
    fake = FakeNvml.machine(H100=8)
    fake.write_sysfs(str(tmp_path), skip=(1, 6))
    assert wiring(nvml(fake, tmp_path).discover())[0] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "nvmlDeviceGetTopologyCommonAncestor" in fake.calls


def test_nvml_old_driver_without_remote_device_type_still_finds_the_switches(tmp_path):
    fake = FakeNvml.machine(H100=8)
    fake.missing_functions = {"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNumaNodeId"}
    assert wiring(nvml(fake, tmp_path).discover()) == ([None] * 8, ALL8)


def test_nvml_inactive_links_are_not_peers(tmp_path):
    fake = FakeNvml.machine(H100_NVL=2)
    for link in fake.gpus[0].nvlinks + fake.gpus[1].nvlinks:
        link.active = False
    assert wiring(nvml(fake, tmp_path).discover())[1] == [(), ()]


def test_nvml_topology_failures_leave_the_fields_empty_and_discovery_works(tmp_path, caplog):
    fake = FakeNvml.machine(H100=4)
    fake.missing_functions = {"nvmlDeviceGetNvLinkState", "nvmlDeviceGetNumaNodeId"}
    with caplog.at_level(logging.DEBUG, logger="gpud.gpu.topology"):
        gpus = nvml(fake, tmp_path).discover()
    assert [g.model for g in gpus] == ["H100-80GB"] * 4
    assert wiring(gpus) == ([None] * 4, [()] * 4)
    assert "Function Not Found" in caplog.text


def test_nvml_reads_the_wiring_once(tmp_path):
    fake = FakeNvml.machine(H100=8)
    b = nvml(fake, tmp_path)
    first = b.discover()
    fake.calls.clear()
    assert b.discover() == first
    assert not [c for c in fake.calls if "NvLink" in c or "Pci" in c]


@pytest.mark.parametrize("raw, bus", [
    (b"00000000:18:00.0", "0000:18:00.0"),
    ("00000000:AB:1F.3", "0000:ab:1f.3"),
    ("0001:05:00.0\x00", "0001:05:00.0"),
    (b"", None),
    ("garbage", None),
])
def test_bus_ids_are_spelled_as_sysfs_does(raw, bus):
    assert normalize_bus_id(raw) == bus


# -- the node's record --------------------------------------------------------------------------

def test_gpu_info_carries_the_wiring_through_a_registration():
    g = GpuInfo(index=2, uuid="GPU-x", model="H100-80GB", memory_mb=81920, numa_node=1, nvlink_peers=(0, 1, 3))
    d = g.to_dict()
    assert (d["numa_node"], d["nvlink_peers"]) == (1, [0, 1, 3])
    assert GpuInfo.from_dict(json.loads(json.dumps(d))) == g
    old = {k: v for k, v in d.items() if k not in ("numa_node", "nvlink_peers")}   # an older worker
    assert (GpuInfo.from_dict(old).numa_node, GpuInfo.from_dict(old).nvlink_peers) == (None, ())
    assert GpuInfo.from_dict(dict(d, nvlink_peers=[3, 2, 0, 0])).nvlink_peers == (0, 3)


@pytest.mark.parametrize("bad", [{"numa_node": -1}, {"numa_node": "0"}, {"numa_node": True},
                                 {"nvlink_peers": "0,1"}, {"nvlink_peers": [-1]}, {"nvlink_peers": [1.5]}])
def test_malformed_wiring_is_refused(bad):
    d = dict(GpuInfo(index=0, uuid="GPU-x", model="H100-80GB", memory_mb=1).to_dict(), **bad)
    with pytest.raises(ValueError):
        GpuInfo.from_dict(d)


def test_the_worker_registers_its_rack_and_switch(tmp_path):
    cfg = config.from_text(f'state_dir = "{tmp_path}"\n[worker]\nname = "gpu01"\n'
                           'labels = { rack = "r1", switch = "s1" }\n')
    info = build_node_info(cfg, SimBackend("8xH100-80GB@islands4", "gpu01"))
    assert (info.labels["rack"], info.labels["switch"]) == ("r1", "s1")
    assert info.labels["addr"]   # where MASTER_ADDR points for multi-node jobs
    assert NodeInfo.from_dict(info.to_dict()) == info


@pytest.mark.parametrize("text, message", [
    ('labels = { rak = "r1" }', "worker.labels: unknown label 'rak'; did you mean rack?"),
    ('labels = { rack = "r 1" }', "worker.labels: rack: must be a name of letters, digits"),
    ('labels = "r1"', "worker.labels: must be a table such as"),
])
def test_bad_labels_are_one_line_each(text, message):
    with pytest.raises(config.ConfigError) as e:
        config.from_text(f"[worker]\n{text}\n", "gpud.toml")
    assert e.value.lines[0].startswith(f"gpud.toml:2: {message}")


# -- display ------------------------------------------------------------------------------------

def gpu_dicts(spec: str) -> list[dict]:
    return [g.to_dict() for g in SimBackend(spec, "n").discover()]


def wired(name: str, spec: str, **labels: str) -> dict:
    n = node(name, gpus=0)
    gpus = gpu_dicts(spec)
    n.update(gpus=gpus, gpus_total=len(gpus), labels=labels)
    return n


def test_islands_and_numa_as_text():
    assert islands(gpu_dicts("8xH100-80GB@islands4")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert islands(gpu_dicts("4xL40S-48GB")) == []
    assert numa_text(gpu_dicts("8xH100-80GB")) == "0:[0-3],1:[4-7]"
    assert numa_text([{"index": 0}]) is None
    assert islands([{"index": 0, "nvlink_peers": [1]}, {"index": 1, "nvlink_peers": [2]},
                    {"index": 2}]) == [[0, 1, 2]]   # one-sided and chained links: one island


def test_sinfo_topology_table_matches_the_man_page():
    nodes = [wired("gpu03", "4xL40S-48GB", rack="r2", switch="s2"),
             wired("gpu02", "8xH100-80GB@islands4", rack="r1", switch="s1", features="h100,ib"),
             wired("gpu01", "8xH100-80GB", rack="r1", switch="s1", features="h100,ib")]
    assert sinfo_table(nodes).splitlines() == [
        "NODELIST RACK SWITCH GPUS NVLINK      NUMA            FEATURES",
        "gpu01    r1   s1        8 [0-7]       0:[0-3],1:[4-7] h100,ib",
        "gpu02    r1   s1        8 [0-3],[4-7] 0:[0-3],1:[4-7] h100,ib",
        "gpu03    r2   s2        4 -           0:[0-1],1:[2-3] -",
    ]
    with open(REPO / "man" / "gpuctl-sinfo.1") as f:
        page = f.read().replace("\\-", "-")
    for line in sinfo_table(nodes).splitlines():
        assert line in page


def test_a_node_without_labels_or_wiring_shows_null():
    assert node_lines(node("gpu09", gpus=2)) == ["Rack=(null) Switch=(null)", "GpuIslands=(null) GpuNuma=(null)"]
    assert feature_lines(node("gpu09", gpus=2)) == ["AvailableFeatures=(null)", "ActiveFeatures=(null)"]


def test_sinfo_topology_and_scontrol_show_node_through_gpuctl():
    with FakeHead() as head:
        head.nodes = [wired("gpu01", "8xH100-80GB@islands4", rack="r1", switch="s1", features="h100,ib")]
        head.reply("show", {"nodes": [dict(head.nodes[0], partitions=["gpu"])]})
        r = CliRunner().invoke(cli, ["--socket", head.path, "sinfo", "--topology", "-h"], catch_exceptions=False)
        assert (r.exit_code, r.stdout) == (0, "gpu01 r1 s1 8 [0-3],[4-7] 0:[0-3],1:[4-7] h100,ib\n")
        r = CliRunner().invoke(cli, ["--socket", head.path, "scontrol", "show", "node", "gpu01"],
                               catch_exceptions=False)
        assert r.exit_code == 0
        assert "   Rack=r1 Switch=s1\n   GpuIslands=[0-3],[4-7] GpuNuma=0:[0-3],1:[4-7]\n" in r.stdout
        assert "   AvailableFeatures=h100,ib\n   ActiveFeatures=h100,ib\n" in r.stdout


# -- a real worker ------------------------------------------------------------------------------

def test_a_worker_reports_its_wiring_and_labels_to_the_head(tmp_path, mosquitto):  # noqa: F811
    with Cluster(tmp_path / "c", mosquitto.url, extra_toml='labels = { rack = "r7", switch = "leaf3" }\n') as c:
        c.start_head()
        c.start_worker("gpu01", sim="8xH100-80GB@islands4")
        r = c.gpuctl("scontrol", "show", "node", "gpu01")
        assert "Rack=r7 Switch=leaf3" in r.stdout
        assert "GpuIslands=[0-3],[4-7] GpuNuma=0:[0-3],1:[4-7]" in r.stdout
        gpus = c.nodes()["gpu01"]["gpus"]
        assert [(g["numa_node"], g["nvlink_peers"]) for g in gpus][:2] == [(0, [1, 2, 3]), (0, [0, 2, 3])]
