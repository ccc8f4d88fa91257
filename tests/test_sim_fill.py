"""``gpud simulate --nodes CSV --trace PODS --fill-to F``: the FGD protocol through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpud.sched.config import SchedConfig
from gpud.sim.cluster import apply_gpu_modes
from gpud.sim.command import simulate
from gpud.sim.fill import fill, fill_config, sample
from gpud.sim.openb import OpenbError, read_nodes, read_pods

RAW = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "alibaba_openb_2023" / "raw"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def run(*args: str):
    return CliRunner().invoke(simulate, list(args), prog_name="gpud simulate")


@pytest.fixture
def small(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     "a,32000,131072,4,V100M16\nb,8000,32768,1,P100\nc,64000,262144,2,T4\n")
    pods = tmp_path / "pods.csv"
    rows = ["p0,4000,8192,1,1000,,LS,Running,0,10,0", "p1,2000,4096,1,500,,BE,Running,0,10,0",
            "p2,12000,16384,0,0,,BE,Running,0,10,0", "p3,8000,16384,2,1000,,LS,Running,0,10,0",
            "p4,1000,2048,1,250,,LS,Running,0,10,0", "p5,3000,4096,1,1000,T4,LS,Running,0,10,0"]
    pods.write_text(POD_HEADER + "\n".join(rows) + "\n")
    return nodes, pods


def test_fill_through_the_cli_as_json(small):
    nodes, pods = small
    r = run("--nodes", str(nodes), "--trace", str(pods), "--gpu-modes", "mps:dynamic", "--fill-to", "1.3",
            "--seed", "42", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    f = out["fill"]
    assert out["cluster"] == {"nodes": 3, "gpus": 7}
    assert f["arrived_pct"] == list(range(1, len(f["arrived_pct"]) + 1)) and f["arrived_pct"][-1] >= 130
    assert len(f["allocated_pct"]) == len(f["fragmentation_pct"]) == len(f["arrived_pct"])
    # allocation never falls, never passes what arrived, and is what the library call gives
    assert all(a <= b for a, b in zip(f["allocated_pct"], f["allocated_pct"][1:]))
    assert all(al <= ar + 100 * 2 / 7 + 0.01 for ar, al in zip(f["arrived_pct"], f["allocated_pct"]))  # a pod: 2 GPUs at most
    ns = apply_gpu_modes(read_nodes(str(nodes)), "mps:dynamic")
    direct = fill(ns, read_pods(str(pods)).pods, fill_config(SchedConfig()), 1.3, 42)
    assert direct["allocated_pct"] == f["allocated_pct"]
    r = run("--nodes", str(nodes), "--trace", str(pods), "--fill-to", "1.3", "--placement", "shapes")
    assert r.exit_code == 0, r.output
    assert "arrived" in r.output and "100%" in r.output


def test_a_pod_that_does_not_fit_is_dropped_and_later_ones_still_placed(tmp_path):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,16000,65536,2,T4\n")
    pods = tmp_path / "p.csv"
    pods.write_text(POD_HEADER + "big,1000,1024,8,1000,,,,,,\nsmall,1000,1024,1,1000,,,,,,\n")
    ns = read_nodes(str(nodes))
    arrivals = sample(read_pods(str(pods)).pods, 2000, 1.0, 1)
    f = fill(ns, read_pods(str(pods)).pods, fill_config(SchedConfig()), 1.0, 1)
    placed = sum(p.milli for p in arrivals if p.name == "small")
    assert f["pods_placed"] == sum(1 for p in arrivals if p.name == "small") >= 1
    assert f["allocated_pct"][-1] == round(100 * min(placed, 2000) / 2000, 2)


def test_sampling_is_seeded_and_reaches_the_fraction():
    pods = read_pods_text(POD_HEADER + "a,1,1,1,1000,,,,,,\nb,1,1,1,500,,,,,,\nc,1,1,0,0,,,,,,\n")
    one, two = sample(pods, 10_000, 1.3, 5), sample(pods, 10_000, 1.3, 5)
    assert one == two and sum(p.milli for p in one) >= 13_000
    assert sample(pods, 10_000, 1.3, 6) != one


def read_pods_text(text: str):
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    return read_pods(f.name).pods


def test_bad_input_is_one_line(tmp_path, small):
    nodes, pods = small
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\na,x,1,1,T4\n")
    with pytest.raises(OpenbError):
        read_nodes(str(bad))
    for args, want in [
        (["--nodes", str(bad), "--trace", str(pods), "--fill-to", "1"], "line 2"),
        (["--nodes", str(nodes), "--trace", str(tmp_path / "none.csv"), "--fill-to", "1"], "no such"),
        (["--nodes", str(nodes), "--fill-to", "1"], "--trace"),
        (["--nodes", str(nodes), "--cluster", "1x8xH100-80GB", "--trace", str(pods)], "one of them"),
        (["--nodes", str(nodes), "--trace", str(pods), "--fill-to", "1", "--compare"], "--compare"),
    ]:
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and want in lines[0], (args, r.output)
    # a malformed pod row is skipped and counted
    pods.write_text(pods.read_text() + "bad,1,1,2,500,,,,,,\n")
    r = run("--nodes", str(nodes), "--trace", str(pods), "--fill-to", "1", "--json")
    assert json.loads(r.output)["pods"]["skipped"] == {"malformed": 1}


@pytest.mark.skipif(not RAW.exists(), reason=f"{RAW} not present")
def test_openb_node_list_reads_as_the_paper_counts():
    ns = read_nodes(str(RAW / "openb_node_list_gpu_node.csv"))
    assert len(ns) == 1213 and sum(len(n.gpus) for n in ns) == 6212


def test_a_pod_list_replays_in_time_as_its_jobs_csv_rows():
    import io

    from gpud.sim.trace import iter_trace
    pods = io.StringIO(POD_HEADER + "p0,4000,8192,1,460,,LS,Running,10,110,20\n"
                       "p1,1000,1024,8,1000,T4,BE,Failed,30,90,\n" "p2,1000,1024,0,0,,BE,Running,5,6,5\n")
    jobs = io.StringIO("job_id,submit_s,gpus,duration_s,status,gpu_type\n"
                       "p0,10,0.46,90,Running,\np1,30,8,60,Failed,T4\np2,5,0,1,Running,\n")
    assert list(iter_trace(pods)) == list(iter_trace(jobs))
