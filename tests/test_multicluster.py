"""Several clusters from one gpuctl (``gpuctl -M``): the [clusters] table, merged listings,
one-cluster verbs, and sbatch choosing where the job would start earliest.

The first tests run gpuctl in-process against fake heads on real sockets; the last one is a
real pair of clusters, each with its own Mosquitto, head and simulated worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuctl.clusters import ClusterError, earliest, select
from gpuctl.main import cli
from tests.cluster import REPO, Cluster, env_for_children, wait_for
from tests.fake_head import FakeHead, node
from tests.mqtt_broker import require_mosquitto, start_mosquitto

MISSING = "/nonexistent/gpud-test.sock"


@pytest.fixture
def heads():
    with FakeHead(cluster="a") as a, FakeHead(cluster="b") as b:
        yield a, b


def client_config(tmp_path: Path, **clusters: str) -> str:
    path = tmp_path / "gpud.toml"
    path.write_text("[clusters]\n" + "".join(f'{name} = "{sock}"\n' for name, sock in clusters.items()))
    return str(path)


@pytest.fixture
def config(tmp_path, heads):
    a, b = heads
    return client_config(tmp_path, a=a.path, b=b.path)


def run(config, *args):
    return CliRunner().invoke(cli, ["--config", config, *args], catch_exceptions=False)


def estimating(start_time, job_id=7):
    """A submit handler: ``start_time`` for --test-only (None: would not start soon), else a job id."""
    def handle(args, uid):
        if args["spec"].get("test_only"):
            return {"test_only": True, "start_time": start_time, "node": "gpu01" if start_time else None,
                    "partition": "gpu", "cpus": 1, "gpus": 1, "reason": None if start_time else "Resources",
                    "warnings": []}
        return {"job_id": job_id, "warnings": []}
    return handle


# -- the [clusters] table ------------------------------------------------------------------------

def test_select_names_clusters_in_the_order_given_each_once(tmp_path):
    cfg = client_config(tmp_path, west="/run/w.sock", east="/run/e.sock", lab="/run/l.sock")
    assert select("all", cfg) == [("west", "/run/w.sock"), ("east", "/run/e.sock"), ("lab", "/run/l.sock")]
    assert select("lab,west,lab", cfg) == [("lab", "/run/l.sock"), ("west", "/run/w.sock")]
    assert select(" east ", cfg) == [("east", "/run/e.sock")]


@pytest.mark.parametrize("text, spec, message", [
    ('[clusters]\na = "/s"\n', "b", "no cluster named 'b' in {cfg}; its [clusters] table names a"),
    ('[head]\nsocket = "/s"\n', "all", "{cfg} names no clusters; add a [clusters] table"),
    ('[clusters]\na = ""\n', "a", "bad entry 'a' in the [clusters] table of {cfg}"),
    ('clusters = "a"\n', "a", "clusters in {cfg} must be a table"),
    ('[clusters\n', "a", "{cfg} is not valid TOML"),
    ('[clusters]\na = "/s"\n', ",", "give cluster names (a,b) or all"),
])
def test_a_bad_table_or_name_is_one_line_naming_the_file(tmp_path, text, spec, message):
    cfg = tmp_path / "gpud.toml"
    cfg.write_text(text)
    with pytest.raises(ClusterError) as e:
        select(spec, str(cfg))
    assert message.format(cfg=cfg) in str(e.value)


def test_a_missing_config_file_says_how_to_name_clusters(tmp_path):
    with pytest.raises(ClusterError, match=r"no config file .*/none.toml to name the clusters; add a \[clusters\]"):
        select("all", str(tmp_path / "none.toml"))


def test_unknown_cluster_is_a_usage_error_and_nothing_is_sent(heads, config):
    r = run(config, "-M", "c", "squeue")
    assert r.exit_code == 2
    assert r.stderr.startswith("gpuctl: error: -M: no cluster named 'c' in ")
    assert heads[0].ops() == heads[1].ops() == []


def test_socket_and_clusters_exclude_each_other(heads, config):
    r = run(config, "--socket", heads[0].path, "-M", "a", "squeue")
    assert r.exit_code == 2
    assert "-M and --socket exclude each other" in r.stderr


def test_the_config_from_the_environment_names_the_clusters(heads, config):
    r = CliRunner().invoke(cli, ["-M", "b", "sinfo", "--json"], env={"GPUD_CONFIG": config},
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    assert heads[1].ops() == ["nodes"] and heads[0].ops() == []


# -- listing verbs ------------------------------------------------------------------------------

def test_squeue_all_shows_each_cluster_under_its_header(heads, config):
    a, b = heads
    a.add_job(name="train", state="RUNNING", node="gpu01", start_time=None)
    b.add_job(name="eval", reason="Resources")
    r = run(config, "-M", "all", "squeue")
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == (
        "CLUSTER: a\n"
        "JOBID PARTITION NAME  USER  ST TIME GPUS NODELIST(REASON)\n"
        "    1 gpu       train alice R  0:00    1 gpu01\n"
        "\n"
        "CLUSTER: b\n"
        "JOBID PARTITION NAME USER  ST TIME GPUS NODELIST(REASON)\n"
        "    1 gpu       eval alice PD 0:00    1 (Resources)\n")


def test_json_merges_the_clusters_and_tags_each_record(heads, config):
    a, b = heads
    a.nodes = [node("gpu01", gpus=2)]
    b.nodes = [node("gpu01", gpus=4), node("gpu02", gpus=4)]
    r = run(config, "-M", "a,b", "sinfo", "--json")
    assert r.exit_code == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    assert [(n["cluster"], n["name"], n["gpus_total"]) for n in nodes] == [
        ("a", "gpu01", 2), ("b", "gpu01", 4), ("b", "gpu02", 4)]


def test_an_unreachable_cluster_is_one_warning_and_the_rest_answer(tmp_path, heads):
    a, b = heads
    b.add_job(name="eval")
    cfg = client_config(tmp_path, a=a.path, gone=MISSING, b=b.path)
    r = run(cfg, "-M", "all", "sacct", "-a", "-S", "2000-01-01", "--json")
    assert r.exit_code == 0
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"sacct: warning: cluster gone: cannot connect to gpud head at {MISSING}: ")
    assert "(is its head, or a relay for it, running on this host?)" in r.stderr
    assert [(j["cluster"], j["name"]) for j in json.loads(r.stdout)["jobs"]] == [("b", "eval")]


def test_when_no_cluster_answers_it_is_an_error(tmp_path):
    cfg = client_config(tmp_path, x=MISSING, y=MISSING + "2")
    r = run(cfg, "-M", "all", "squeue")
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-1] == "squeue: error: no cluster answered (x, y)"
    r = run(cfg, "-M", "x", "squeue")   # one cluster named: its error alone
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("squeue: error: cannot connect to gpud head at ")


def test_a_refusal_from_one_cluster_is_an_error_line_and_exit_1(heads, config):
    a, b = heads
    a.refuse("jobs", "jobs: the database is busy, try again")
    b.add_job(name="eval")
    r = run(config, "-M", "all", "squeue", "-h")
    assert r.exit_code == 1
    assert r.stderr == "squeue: error: cluster a: jobs: the database is busy, try again\n"
    assert r.stdout == "CLUSTER: b\n1 gpu eval alice PD 0:00 1 (Priority)\n"


# -- one-cluster verbs --------------------------------------------------------------------------

def test_scancel_acts_on_the_one_cluster_named(heads, config):
    a, b = heads
    for h in heads:
        h.add_job(uid=os.getuid(), user="me")
    r = run(config, "-M", "b", "scancel", "1")
    assert (r.exit_code, r.stderr) == (0, "")
    assert a.jobs[1]["state"] == "PENDING" and b.jobs[1]["state"] == "CANCELLED"


def test_a_one_cluster_verb_refuses_several(heads, config):
    r = run(config, "-M", "a,b", "scancel", "1")
    assert r.exit_code == 2
    assert r.stderr.startswith("scancel: error: scancel acts on one cluster at a time: name one with "
                               "-M NAME, not a,b\n")
    assert heads[0].ops() == heads[1].ops() == []


# -- sbatch -------------------------------------------------------------------------------------

def test_earliest_start_wins_ties_go_to_the_first_named_and_never_is_last():
    now = 1_700_000_000.0
    assert earliest([("a", {"start_time": now + 60}), ("b", {"start_time": now})])[0] == "b"
    assert earliest([("a", {"start_time": now}), ("b", {"start_time": now})])[0] == "a"
    assert earliest([("a", {"start_time": None}), ("b", {"start_time": now + 9e6})])[0] == "b"
    assert earliest([("a", {"start_time": None}), ("b", {"start_time": None})])[0] == "a"
    assert earliest([]) is None


def test_sbatch_submits_where_the_job_would_start_earliest(heads, config):
    a, b = heads
    a.handle("submit", estimating(2_000_000_000.0, job_id=40))
    b.handle("submit", estimating(1_900_000_000.0, job_id=12))
    r = run(config, "-M", "a,b", "sbatch", "--gpus", "1", "--wrap", "true")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "Submitted batch job 12 on cluster b\n", "")
    assert [x["spec"].get("test_only") for op, x, _ in a.requests if op == "submit"] == [True]
    assert [x["spec"].get("test_only") for op, x, _ in b.requests if op == "submit"] == [True, None]


def test_sbatch_parsable_says_id_and_cluster_and_a_refusing_cluster_is_passed_over(heads, config):
    a, b = heads
    a.refuse("submit", "Batch job submission failed: invalid partition specified: long")
    b.handle("submit", estimating(None, job_id=3))
    r = run(config, "-M", "a,b", "sbatch", "--parsable", "-p", "long", "--wrap", "true")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "3;b\n", "")


def test_sbatch_fails_when_every_cluster_refuses(heads, config):
    for h in heads:
        h.refuse("submit", "Batch job submission failed: invalid partition specified: long")
    r = run(config, "-M", "all", "sbatch", "-p", "long", "--wrap", "true")
    assert r.exit_code == 1
    assert r.stderr == "sbatch: error: cluster a: Batch job submission failed: invalid partition specified: long\n"


def test_sbatch_test_only_shows_every_cluster_and_submits_nothing(heads, config):
    a, b = heads
    a.handle("submit", estimating(None))
    b.handle("submit", estimating(1_900_000_000.0))
    r = run(config, "-M", "all", "sbatch", "--test-only", "--wrap", "true")
    assert r.exit_code == 0
    lines = r.stderr.splitlines()
    assert lines[0] == "sbatch: Job would not start soon: Resources on cluster a"
    assert lines[1].startswith("sbatch: Job to start at ") and lines[1].endswith(" in partition gpu on cluster b")
    assert r.stdout == ""


def test_sbatch_to_one_named_cluster_asks_for_no_estimate(heads, config):
    a, b = heads
    r = run(config, "-M", "b", "sbatch", "--wrap", "true")
    assert (r.exit_code, r.stdout) == (0, "Submitted batch job 1 on cluster b\n")
    assert b.ops() == ["submit"] and a.ops() == []


# -- two real clusters --------------------------------------------------------------------------

def gpuctl(config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuctl.main", "--config", config, *args], env=env_for_children(),
                          capture_output=True, text=True, cwd=str(REPO), timeout=60)


def test_two_clusters_each_with_its_own_broker_and_head(tmp_path):
    require_mosquitto()
    brokers = [start_mosquitto(tmp_path / f"mqtt-{n}") for n in ("alpha", "beta")]
    clusters = [Cluster(tmp_path / n, b.url, cluster=n) for n, b in zip(("alpha", "beta"), brokers)]
    try:
        for c in clusters:
            c.start_head()
            c.start_worker("gpu01", sim="2xH100-80GB")
        alpha, beta = clusters
        busy = alpha.sbatch("--gpus", "2", "-t", "1:00:00", "--wrap", "sleep 300")
        alpha.wait_job_state(busy, "RUNNING")
        cfg = client_config(tmp_path, alpha=alpha.socket, beta=beta.socket, gamma=MISSING)

        r = gpuctl(cfg, "-M", "alpha,beta", "sbatch", "--parsable", "--gpus", "2", "--wrap", "sleep 300")
        assert r.returncode == 0, r.stderr
        job_id, where = r.stdout.strip().split(";")
        assert where == "beta"
        beta.wait_job_state(int(job_id), "RUNNING")

        r = gpuctl(cfg, "-M", "all", "squeue")
        assert r.returncode == 0, r.stderr
        assert r.stderr.startswith("squeue: warning: cluster gamma: ") and r.stderr.count("\n") == 1
        sections = r.stdout.split("\n\n")
        assert [s.splitlines()[0] for s in sections] == ["CLUSTER: alpha", "CLUSTER: beta"]
        assert f"{busy} " in sections[0] and " gpu01" in sections[0]
        assert f"{job_id} " in sections[1] and " gpu01" in sections[1]

        r = gpuctl(cfg, "-M", "all", "sinfo")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("alloc") == 2 and "CLUSTER: alpha" in r.stdout and "CLUSTER: beta" in r.stdout

        r = gpuctl(cfg, "-M", "alpha,beta", "squeue", "--json")
        assert sorted((j["cluster"], j["job_id"]) for j in json.loads(r.stdout)["jobs"]) == [
            ("alpha", busy), ("beta", int(job_id))]

        assert gpuctl(cfg, "-M", "beta", "scancel", job_id).returncode == 0
        beta.wait_job_state(int(job_id), "CANCELLED")
        wait_for(lambda: alpha.job(busy)["state"] == "RUNNING", 5, "alpha's job to be untouched")
    finally:
        for c in clusters:
            c.close()
        for b in brokers:
            b.stop()
