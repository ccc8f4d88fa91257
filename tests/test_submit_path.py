"""The submission path's shortcuts keep their meaning: JobSpec built and encoded without
dataclasses' general machinery, node registrations parsed once, and gpuctl's start-up
importing neither ``dataclasses`` nor ``typing`` (nor the sbatch table for squeue)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import asdict, fields

import pytest

from gpud.head.ops_jobs import node_infos
from gpud.head.store import NodeRecord, encode_spec
from gpud.model import JobSpec

ROOT = pathlib.Path(__file__).resolve().parent.parent

REQUESTS = [
    {"script": "x"},
    {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {"A": "1", "B": "é"}, "gpus": 1},
    {"script": "x", "array": "0-9%2", "dependency": "afterok:1", "mail_type": "end,fail", "hold": True,
     "nodelist": ["a", "a", "b"], "exclude": ["c"], "nodes": 2, "gpus": 4, "time_limit": "1:00:00"},
    {"script": "x", "gpu_mem_mb": "10G", "switches": 2, "switches_wait": 5, "begin_time": 1.7e9},
    {"script": "x", "mig_profile": "1g.10gb", "gpus": 2, "constraint": "a100&ib", "mem_mb": "4G"},
]


@pytest.mark.parametrize("request_", REQUESTS)
def test_spec_from_request_is_the_dataclass_it_always_was(request_: dict) -> None:
    spec = JobSpec.from_request(request_)
    built = JobSpec(**{f.name: getattr(spec, f.name) for f in fields(JobSpec)})
    assert spec == built and repr(spec) == repr(built) and list(vars(spec)) == list(vars(built))
    assert isinstance(spec.nodelist, tuple) and isinstance(spec.exclude, tuple)


@pytest.mark.parametrize("request_", REQUESTS)
def test_spec_to_dict_is_asdict_with_lists_and_copies(request_: dict) -> None:
    spec = JobSpec.from_request(request_)
    expected = asdict(spec)
    expected["nodelist"], expected["exclude"] = list(spec.nodelist), list(spec.exclude)
    d = spec.to_dict()
    assert d == expected and list(d) == list(expected)
    d["env"]["NEW"] = "1"        # the caller's dict is its own
    assert "NEW" not in spec.env
    assert JobSpec(**json.loads(encode_spec(spec))) == spec


class _Store:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}


class _Head:
    def __init__(self) -> None:
        self.store = _Store()


def _register(head: _Head, name: str, model: str, gpus: int = 2) -> None:
    info = {"name": name, "cpus": 8, "mem_mb": 1024, "labels": {},
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_mb": 1000} for i in range(gpus)]}
    head.store.nodes[name] = NodeRecord(name, info, "UP", None, 0.0, 0.0)


def test_node_infos_follow_a_node_that_registers_again() -> None:
    head = _Head()
    _register(head, "cache-n1", "A100-40GB")
    first = node_infos(head)
    assert [g.model for n in first for g in n.gpus] == ["A100-40GB"] * 2
    assert node_infos(head) is first          # the same tuple until a node registers anew
    _register(head, "cache-n1", "H100-80GB", gpus=3)
    assert [g.model for n in node_infos(head) for g in n.gpus] == ["H100-80GB"] * 3
    _register(head, "cache-n2", "A100-40GB")
    assert [n.name for n in node_infos(head)] == ["cache-n1", "cache-n2"]
    del head.store.nodes["cache-n2"]
    assert [n.name for n in node_infos(head)] == ["cache-n1"]
    head.store.nodes["cache-n1"] = NodeRecord("cache-n1", {"name": "cache-n1"}, "UP", None, 0.0, 0.0)
    assert node_infos(head) == ()    # malformed: left out, as before


def _loaded(code: str) -> set[str]:
    """Modules a fresh Python loads for ``code``, run away from this tree but importing it."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, cwd="/",
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return set(out.stdout.split())


def test_gpuctl_starts_without_dataclasses_or_typing() -> None:
    before = _loaded("")
    for code in ("import gpuctl.fastpath, gpuctl.options, gpuctl.directives, gpuctl.script",
                 "from gpuctl.fastpath import parse_command_line as p; p(['sbatch', '-G', '1', 'x.sh'])",
                 "import gpuctl.commands.squeue"):
        new = _loaded(code) - before
        assert not new & {"dataclasses", "typing", "inspect", "ast"}, (code, sorted(new))


def test_squeue_does_not_load_the_sbatch_table() -> None:
    new = _loaded("import gpuctl.fastpath as f, gpuctl.commands.squeue\nf.parse_command_line(['squeue'])")
    assert not new & {"gpuctl.options", "gpuctl.converters", "gpuctl.directives", "gpuctl.script"}, sorted(new)
