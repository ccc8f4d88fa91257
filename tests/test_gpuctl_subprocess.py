"""gpuctl as users run it: a real process (``python -m gpuctl.main``) against the fake head."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap

import pytest

from tests.fake_head import FakeHead, node

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def gpuctl(head_path: str, *args: str, input: str | None = None, stdin=None, cwd: str = ROOT,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    full_env.pop("GPUD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", head_path, *args],
                          input=input, stdin=stdin, capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=60)


def test_sbatch_from_a_pipe_then_squeue(head, tmp_path):
    r = gpuctl(head.path, "sbatch", "-J", "piped", input="#!/bin/bash\n#SBATCH --gpus 1\nnvidia-smi\n",
               cwd=str(tmp_path), env={"MARKER": "42"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "Submitted batch job 1\n", "")
    spec = head.last("submit")["spec"]
    assert (spec["name"], spec["gpus"], spec["work_dir"], spec["env"]["MARKER"]) == ("piped", 1, str(tmp_path), "42")
    r = gpuctl(head.path, "squeue", "--noheader")
    assert r.returncode == 0
    assert r.stdout.split()[:5] == ["1", "gpu", "piped", head.jobs[1]["user"], "PD"]


def test_sbatch_parsable_prints_only_the_id(head):
    head.next_job_id = 977
    r = gpuctl(head.path, "sbatch", "--parsable", "--wrap", "true")
    assert (r.returncode, r.stdout) == (0, "977\n")


def test_sbatch_refuses_a_terminal_for_stdin(head):
    parent, child = pty.openpty()
    try:
        r = gpuctl(head.path, "sbatch", stdin=child)
    finally:
        os.close(parent)
        os.close(child)
    assert r.returncode == 2
    assert r.stderr.startswith("sbatch: error: no batch script: give a script file, --wrap CMD, or pipe")
    assert head.ops() == []


@pytest.mark.parametrize("args, code, first_line", [
    (["sbatch", "--gpus", "abc", "--wrap", "true"], 2, "sbatch: error: --gpus needs a whole number, not 'abc'"),
    (["sbatch", "/no/such.sh"], 2, "sbatch: error: cannot read batch script '/no/such.sh': No such file"),
    (["squeue", "-j", "abc"], 2, "squeue: error: invalid job id 'abc'"),
    (["frobnicate"], 2, "gpuctl: error: No such command 'frobnicate'."),
    (["scancel", "424242"], 1, "scancel: error: Kill job error on job id 424242: Invalid job id specified"),
])
def test_errors_are_one_line_with_the_right_exit_code(head, args, code, first_line):
    r = gpuctl(head.path, *args)
    assert r.returncode == code
    assert r.stderr.split("\n")[0].startswith(first_line)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().split("\n")) == (2 if code == 2 else 1)


def test_head_refusal_exits_1(head):
    head.refuse("submit", "Requested GPU configuration is not available: 64 GPUs")
    r = gpuctl(head.path, "sbatch", "--gpus", "64", "--wrap", "true")
    assert (r.returncode, r.stderr) == (1, "sbatch: error: Requested GPU configuration is not available: 64 GPUs\n")


def test_no_head_exits_1(tmp_path):
    path = str(tmp_path / "gone.sock")
    r = gpuctl(path, "sinfo")
    assert r.returncode == 1
    assert r.stderr == (f"sinfo: error: cannot connect to gpud head at {path}: No such file or directory "
                        "(is gpud running? set GPUD_SOCKET or --socket)\n")


def test_sinfo_json(head):
    head.nodes = [node("gpu01", gpus=2)]
    r = gpuctl(head.path, "sinfo", "--json")
    assert json.loads(r.stdout)["nodes"][0]["name"] == "gpu01"


def test_gpuctl_loads_only_what_the_verb_needs(head):
    """No asyncio, database, MQTT or NVML on gpuctl's path; sbatch does not even load the tables."""
    code = textwrap.dedent(f"""
        import sys
        from gpuctl.main import main
        for argv in (["--socket", {head.path!r}, "sbatch", "--wrap", "true"],):
            try:
                main(argv)
            except SystemExit as e:
                assert e.code == 0, e.code
        print(" ".join(sorted(sys.modules)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split("\n")[-2].split())
    for heavy in ("asyncio", "aiosqlite", "aiomqtt", "pynvml", "sqlite3", "gpud.model", "gpud.config",
                  "gpuctl.format", "gpuctl.commands.squeue"):
        assert heavy not in loaded, heavy
    assert {m for m in loaded if m.startswith("gpud.")} <= {"gpud.protocol", "gpud.jsoncodec", "gpud.units"}
