"""``gpud simulate`` with a production config: the simulated cluster carries the real node
names, and a config whose partitions name none of the simulated nodes is refused with the
reason rather than run with nothing started."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpud.sim.cluster import ClusterSpecError, parse_cluster
from gpud.sim.command import simulate

CONFIG = '[[partition]]\nname = "gpu"\nnodes = ["gpu*"]\ndefault = true\n'


def run(tmp_path, *args: str):
    (tmp_path / "t.csv").write_text("job_id,submit_s,gpus,duration_s\nj,0,1,10\nk,0,2,10\n")
    (tmp_path / "gpud.toml").write_text(CONFIG)
    return CliRunner().invoke(simulate, ["--config", str(tmp_path / "gpud.toml"), "--trace",
                                         str(tmp_path / "t.csv"), *args], prog_name="gpud simulate")


def test_nodes_carry_the_names_given():
    nodes = parse_cluster("2x8xH100-80GB@gpu[01-02],1x4xA100-80GB@big1,1x8xH100-80GB")
    assert [n.name for n in nodes] == ["gpu01", "gpu02", "big1", "n0004"]
    assert parse_cluster("2x1xH100-80GB@a[1,3]")[1].name == "a3"


@pytest.mark.parametrize("spec, words", [
    ("2x8xH100-80GB@gpu01", "2 nodes but 1 names"),
    ("1x8xH100-80GB@gpu01,1x8xH100-80GB@gpu01", "node gpu01 is named twice"),
    ("1x8xH100-80GB@gpu[1-", "'[' without ']'"),
])
def test_bad_names_are_refused(spec, words):
    with pytest.raises(ClusterSpecError, match=words.replace("[", r"\[")):
        parse_cluster(spec)


def test_a_config_whose_partitions_miss_the_nodes_is_refused(tmp_path):
    r = run(tmp_path, "--cluster", "2x8xH100-80GB")
    assert r.exit_code == 2
    [line] = r.output.strip().splitlines()
    assert line.startswith("gpud simulate: error: partition gpu has none of the simulated nodes (n[0001-0002])")
    assert "2x8xH100-80GB@gpu*" in line


def test_a_production_config_simulates_unchanged_with_the_real_names(tmp_path):
    r = run(tmp_path, "--cluster", "2x8xH100-80GB@gpu[01-02]", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert (report["makespan_s"], report["gpu_seconds"]) == (10.0, 30.0)     # both jobs ran
