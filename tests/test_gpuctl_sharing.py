"""gpuctl's side of GPU sharing: --gpus PROFILE:N, --gres=gpu:PROFILE:N, --gpu-mem, sinfo -G."""

from __future__ import annotations

import pytest

from gpuctl import columns, converters, options, script
from gpuctl.format import sinfo_gpus_table
from gpud.model import JobSpec, SpecError


def cli(option: str, value: str) -> dict:
    return options.convert(options.BY_NAME[option][0], value)


@pytest.mark.parametrize("text, want", [
    ("2", {"gpus": 2}),
    ("h100:2", {"gpus": 2, "gpu_type": "h100"}),
    ("1g.10gb:2", {"gpus": 2, "mig_profile": "1g.10gb"}),
    ("3g.40gb", {"gpus": 1, "mig_profile": "3g.40gb"}),
    ("MIG-1g.10gb.me:1", {"gpus": 1, "mig_profile": "1g.10gb+me"}),
])
def test_gpus_option(text, want):
    assert cli("--gpus", text) == want


@pytest.mark.parametrize("text, want", [
    ("gpu:1g.10gb:2", {"gpus_per_node": 2, "mig_profile": "1g.10gb"}),   # --gres counts per node
    ("gpu:2g.20gb", {"gpus_per_node": 1, "mig_profile": "2g.20gb"}),
    ("gpu:a100:3", {"gpus_per_node": 3, "gpu_type": "a100"}),
])
def test_gres_option(text, want):
    assert cli("--gres", text) == want


@pytest.mark.parametrize("text", [":2", "a:b:2", "1g.10gb:x"])
def test_bad_gpus_are_usage_errors(text):
    with pytest.raises(converters.ScriptError):
        cli("--gpus", text)


def test_gpu_mem_and_layers():
    assert cli("--gpu-mem", "20G") == {"gpu_mem_mb": 20480}
    with pytest.raises(converters.ScriptError):
        cli("--gpu-mem", "0")
    text = "#!/bin/bash\n#SBATCH --gpus 4\n#SBATCH --gres=gpu:1g.10gb:2\ntrue\n"
    spec = script.build_spec(text, {}, default_name="x", cwd="/tmp", env={})
    assert (spec["gpus"], spec["mig_profile"]) == (2, "1g.10gb")
    # the command line's kind of GPU request replaces the script's, whatever its kind
    spec = script.build_spec(text, cli("--gpu-mem", "20G"), default_name="x", cwd="/tmp", env={})
    assert JobSpec.from_request(spec).gpu_mem_mb == 20480 and spec.get("mig_profile") is None
    spec = script.build_spec(text, cli("--gpus", "3"), default_name="x", cwd="/tmp", env={})
    assert spec["gpus"] == 3 and spec.get("mig_profile") is None


def test_spec_validation():
    assert JobSpec.from_request({"script": "x", "mig_profile": "1G.10GB"}).gpus == 1
    with pytest.raises(SpecError, match="cannot be combined"):
        JobSpec.from_request({"script": "x", "mig_profile": "1g.10gb", "gpu_mem_mb": 1024})
    with pytest.raises(SpecError, match="one device"):
        JobSpec.from_request({"script": "x", "gpus": 2, "gpu_mem_mb": 1024})
    with pytest.raises(SpecError, match="invalid MIG profile"):
        JobSpec.from_request({"script": "x", "mig_profile": "big"})
    assert script.api_settings({"gpu_mem_mb": "8G"}) == {"gpu_mem_mb": 8192}


def test_sinfo_gpus_table_says_how_each_gpu_is_shared():
    nodes = [{"name": "gpu01", "gpus": [
        {"index": 0, "model": "A100-80GB", "memory_mb": 81920, "mode": "mig", "dynamic": True,
         "slices": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a", "memory_mb": 40192, "job_id": 41,
                     "user": "ann"},
                    {"profile": "3g.40gb", "start": 4, "uuid": "MIG-b", "memory_mb": 40192, "job_id": None,
                     "user": None}],
         "holders": [{"job_id": 41, "user": "ann", "kind": "mig", "slice_start": 0}]},
        {"index": 1, "model": "H100-80GB", "memory_mb": 81920, "mode": "mps", "mps_max_clients": 48,
         "holders": [{"job_id": 42, "user": "bob", "mem_mb": 20480}]},
        {"index": 2, "model": "H100-80GB", "memory_mb": 81920, "mode": "timeslice", "replicas": 4,
         "holders": []},
        {"index": 3, "model": "H100-80GB", "memory_mb": 81920, "job_ids": [7]},      # an older head
    ]}]
    lines = sinfo_gpus_table(nodes).splitlines()
    assert lines[0].split() == ["NODELIST", "GPU", "MODEL", "MODE", "USED", "JOBS"]
    assert "mig dynamic" in lines[1] and "1/2 slices" in lines[1] and lines[1].endswith("41(ann)")
    assert "0:3g.40gb@0" in lines[2] and "MIG-a" in lines[2] and lines[2].endswith("41(ann)")
    assert "0:3g.40gb@4" in lines[3] and lines[3].endswith("-")
    assert "a fatal fault in one job ends all" in lines[4] and "1/48 20G/80G" in lines[4]
    assert "timeslice (no memory isolation)" in lines[5] and "0/4" in lines[5]
    assert "whole" in lines[6] and lines[6].endswith("7(?)")


def test_squeue_tres_names_the_profile():
    assert columns.tres({"gpus": 2, "mig_profile": "1g.10gb"}) == "gres/gpu:1g.10gb:2"
    assert columns.tres({"gpus": 2}) == "gres/gpu:2"
