"""Real-world-style Slurm batch scripts (tests/sbatch_corpus/*.sh) parse into the requests and
warnings written beside them (*.json): {"spec": {...}, "warnings": [...], "env"?: {...}} for a
script gpud accepts, {"error": "..."} for one it refuses.

The spec is compared whole, apart from the script text and the environment (compared only
when the expectation names one), and must pass the head's own check (JobSpec.from_request).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpuctl import converters
from gpuctl import script as scripts
from gpuctl.directives import parse_directives
from gpud.model import JobSpec

CORPUS = Path(__file__).resolve().parent / "sbatch_corpus"
CASES = sorted(p.stem for p in CORPUS.glob("*.sh"))
NOW = 1_800_000_000.0          # 2027-01-15T08:00:00 UTC
CWD = "/home/alice/project"
ENV = {"HOME": "/home/alice", "PATH": "/usr/bin"}


@pytest.fixture(autouse=True)
def utc_and_a_fixed_clock(monkeypatch):
    monkeypatch.setattr(converters, "clock", lambda: NOW)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 25
    assert all((CORPUS / f"{name}.json").exists() for name in CASES)


@pytest.mark.parametrize("name", CASES)
def test_script_parses_into_the_expected_request(name):
    text = (CORPUS / f"{name}.sh").read_text()
    expect = json.loads((CORPUS / f"{name}.json").read_text())
    try:
        scripts.check_script(text, name)
        directives = parse_directives(text)
        spec = scripts.build_spec(text, {}, default_name=f"{name}.sh", cwd=CWD, env=ENV, directives=directives)
    except converters.ScriptError as e:
        assert "error" in expect, f"refused: {e}"
        assert str(e).startswith(expect["error"])
        return
    assert "error" not in expect, f"accepted, expected: {expect.get('error')}"
    assert {k: v for k, v in spec.items() if k not in ("script", "env")} == expect["spec"]
    assert directives.warnings == expect["warnings"]
    if "env" in expect:
        assert spec["env"] == expect["env"]
    assert spec["script"] == text
    JobSpec.from_request(spec)


def test_every_script_is_one_a_user_could_have_written():
    for name in CASES:
        text = (CORPUS / f"{name}.sh").read_text()
        assert text.startswith("#!"), name
        assert "#SBATCH" in text or "#GPUD" in text, name
        assert os.path.getsize(CORPUS / f"{name}.sh") < 4096
