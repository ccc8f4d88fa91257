"""``gpud simulate`` end to end through click, on real traces where they are present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpud.sim.command import simulate

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MSFT = SHARED / "traces" / "msft_itp_2021" / "jobs.csv"
OPENB = SHARED / "traces" / "alibaba_openb_2023" / "jobs.csv"

needs_msft = pytest.mark.skipif(not MSFT.exists(), reason=f"trace {MSFT} not present")


def run(*args: str):
    return CliRunner().invoke(simulate, list(args), prog_name="gpud simulate")


@needs_msft
def test_msft_slice_as_json():
    r = run("--cluster", "2x8xH100-80GB", "--trace", str(MSFT), "--until", "12h", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["end_time"] == 12 * 3600
    assert report["cluster"] == {"nodes": 2, "gpus": 16}
    assert report["jobs"]["submitted"] > 100
    # 16-GPU jobs run on both 8-GPU nodes at once
    assert report["jobs"]["multi_node"] > 0
    assert report["jobs"]["infeasible"].get("too_many_gpus", 0) == 0
    assert set(report["accounts"]) <= {f"cluster{i:02d}" for i in range(1, 11)}
    used = sum(a["gpu_seconds_allocated"] for a in report["accounts"].values())
    assert 0 < used <= 16 * 12 * 3600
    assert 0 < report["gpu_allocation"] <= 1
    assert report["makespan_s"] is None  # jobs still queued at the cut
    assert sum(a["jobs_started"] for a in report["accounts"].values()) == report["jobs"]["started"]


@needs_msft
def test_msft_slice_as_text():
    r = run("--cluster", "2x8xH100-80GB", "--trace", str(MSFT), "--until", "6h")
    assert r.exit_code == 0, r.output
    assert "allocated while jobs waited" in r.output
    assert "cluster07" in r.output


@pytest.mark.skipif(not OPENB.exists(), reason=f"trace {OPENB} not present")
def test_openb_shares_and_cpu_only_pods():
    r = run("--cluster", "4x8xV100-32GB", "--trace", str(OPENB), "--until", "120d", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["trace"]["skipped"].get("zero_gpu", 0) > 0
    (acct,) = report["accounts"].values()
    assert acct["gpu_seconds"] < acct["gpu_seconds_allocated"]  # shares billed a fraction


def test_config_file_is_read(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,gpus,duration_s\nj,0,1,10\n")
    cfg = tmp_path / "gpud.toml"
    cfg.write_text('cluster = "sim"\n')
    r = run("--config", str(cfg), "--cluster", "1x1xH100-80GB", "--trace", str(trace), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["makespan_s"] == 10 and list(report["accounts"]) == ["default"]


@pytest.mark.parametrize("args, words", [
    (["--trace", "t.csv"], "--cluster SPEC or --nodes CSV"),
    (["--cluster", "2x8xH100", "--trace", "t.csv"], "invalid GPU model"),
    (["--cluster", "1x1xH100-80GB", "--trace", "absent.csv"], "no such trace file"),
    (["--cluster", "1x1xH100-80GB", "--trace", "t.csv", "--until", "soon"], "invalid --until"),
    (["--cluster", "1x1xH100-80GB", "--trace", "t.csv", "--pass-interval", "x"],
     "invalid --pass-interval"),
    (["--cluster", "1x1xH100-80GB", "--trace", "t.csv", "--config", "absent.toml"],
     "no such config file"),
    (["--cluster", "1x1xH100-80GB", "--trace", "bad.toml"], "missing column(s)"),
    (["--cluster", "1x1xH100-80GB", "--trace", "t.csv", "--config", "bad.toml"], "bad.toml"),
    (["--cluster", "1x1xH100-80GB", "--trace", "t.csv", "--bogus"], "No such option"),
    (["--cluster", "1x2xV100-32GB", "--trace", "t.csv", "--gpu-modes", "mig:dynamic"],
     "does not support MIG"),
    (["--cluster", "1x2xH100-80GB", "--trace", "t.csv", "--gpu-modes", "0=shared"],
     "unknown GPU mode"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("job_id,submit_s,gpus,duration_s\nj,0,1,10\n")
    (tmp_path / "bad.toml").write_text("this is = = not toml\n")
    r = run(*args)
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert lines[0].startswith("gpud simulate: error: ") and words in lines[0]
