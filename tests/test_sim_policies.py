"""Policies, time-limit estimates, synthetic traces and --compare; the three policies on
slices of the shared real traces (the numbers in docs/simulation.md come from longer runs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpud.sched.config import SchedConfig, sched_config_from_dict
from gpud.sim.cluster import parse_cluster
from gpud.sim.command import simulate as simulate_cmd
from gpud.sim.engine import Simulation, simulate
from gpud.sim.estimates import ROUND_LIMITS, Estimates, round_up
from gpud.sim.policies import POLICIES, policy_config
from gpud.sim.synthetic import generate, write_trace
from gpud.sim.trace import iter_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MSFT = TRACES / "msft_itp_2021" / "jobs.csv"
OPENB = TRACES / "alibaba_openb_2023" / "jobs.csv"
DLRM = TRACES / "alibaba_dlrm_2025" / "jobs.csv"
HEADER = "job_id,submit_s,gpus,duration_s,user,group,gpu_type,status,time_limit_s\n"


def run(*args: str):
    return CliRunner().invoke(simulate_cmd, list(args), prog_name="gpud simulate")


def trace(*rows: str) -> list:
    return list(iter_trace(io.StringIO(HEADER + "".join(r + "\n" for r in rows))))


# -- policies ------------------------------------------------------------------------------

POLICY = sched_config_from_dict({
    "qos": {"normal": {}, "high": {"priority": 10, "preempt": ["normal"]}},
    "accounts": {"a": {"gpu_quota": 4, "users": ["*"]}, "b": {"gpu_limit": 6, "users": ["*"]}},
})


def test_policies_are_settings_of_one_config():
    assert policy_config(POLICY, "full") is POLICY
    prio = policy_config(POLICY, "priority")
    assert not prio.backfill and prio.weights == POLICY.weights
    assert all(not q.preempt for q in prio.qos.values())
    assert prio.accounts["a"].gpu_quota is None and prio.accounts["b"].gpu_limit == 6
    fifo = policy_config(POLICY, "fifo")
    assert not fifo.backfill and fifo.weights.fairshare == fifo.weights.age == fifo.weights.qos == 0
    assert fifo.placement == prio.placement == POLICY.placement
    with pytest.raises(ValueError, match="unknown policy"):
        policy_config(POLICY, "sjf")


# Four GPUs: "big" (4 GPUs) waits behind "first"; "small" is short and fits beside it.
BLOCKED = (
    "first,0,2,100,u,a,,,100",
    "big,1,4,50,u,a,,,50",
    "small,2,1,20,u,a,,,30",
)


def starts(policy: str, rows=BLOCKED) -> dict[str, float]:
    sim = Simulation(parse_cluster("1x4xH100-80GB"), trace(*rows), policy_config(SchedConfig(), policy),
                     record_starts=True)
    sim.run()
    return {job: t for t, job, _, _ in sim.start_log}


def test_fifo_and_priority_never_pass_a_waiting_job_full_backfills():
    assert starts("fifo") == {"first": 0, "big": 100, "small": 150}
    assert starts("priority") == {"first": 0, "big": 100, "small": 150}
    assert starts("full") == {"first": 0, "small": 2, "big": 100}


def test_fifo_is_submission_order_priority_favours_the_less_served_account():
    # "a" has used the cluster; its later job goes first only under fifo
    rows = ("warm,0,4,1000,u,a,,,1000", "a2,10,4,10,u,a,,,10", "b1,20,4,10,v,b,,,10")
    assert starts("fifo", rows)["a2"] < starts("fifo", rows)["b1"]
    assert starts("priority", rows)["b1"] < starts("priority", rows)["a2"]


# -- time limits ---------------------------------------------------------------------------

def test_user_limits_are_round_and_over_the_run_time():
    est = Estimates("user", 2.0)
    for seq, d in enumerate([1, 59, 600, 3000, 5000, 40000, 300000, 900000], 1):
        limit = est.limit(seq, d, None)
        assert limit >= d and (limit in ROUND_LIMITS or limit % (7 * 86400) == 0)
    factors = [est.factor(s) for s in range(1, 2001)]
    assert 1.0 <= min(factors) and max(factors) <= 3.0
    assert sum(factors) / len(factors) == pytest.approx(2.0, abs=0.05)
    assert round_up(3601) == 7200 and round_up(8 * 86400) == 14 * 86400


def test_exact_max_and_the_partition_cap():
    assert Estimates("exact").limit(1, 123, None) == 123
    assert Estimates("max").limit(1, 123, None) is None
    assert Estimates("max").limit(1, 123, 3600) == 3600
    assert Estimates("user").limit(1, 5000, 3600) == 3600     # over max_time: ends TIMEOUT
    with pytest.raises(ValueError):
        Estimates("guess")


# -- synthetic traces ----------------------------------------------------------------------

def test_synthetic_mixed_is_seeded_sized_and_loaded():
    jobs = generate("mixed", 3000, 5, gpus=64, max_gpus=8)
    assert jobs == generate("mixed", 3000, 5, gpus=64, max_gpus=8)
    assert jobs != generate("mixed", 3000, 6, gpus=64, max_gpus=8)
    assert [j.seq for j in jobs] == list(range(1, 3001))
    assert all(a.submit_s <= b.submit_s for a, b in zip(jobs, jobs[1:]))
    sizes = [j.gpus for j in jobs]
    assert max(sizes) == 64 and sizes.count(1) / len(sizes) > 0.6   # 16-64: gangs of 8-GPU nodes
    assert max(j.gpus for j in generate("mixed", 3000, 5, gpus=32, max_gpus=8)) == 32  # the cluster
    assert len({j.account for j in jobs}) == 6
    durations = sorted(j.duration_s for j in jobs)
    assert durations[len(durations) // 2] < 3 * 3600 < durations[-1]   # heavy tail
    work = sum(j.gpus * j.duration_s for j in jobs)
    assert work / (64 * jobs[-1].submit_s) == pytest.approx(0.9, rel=0.1)
    assert len({j.submit_s for j in jobs}) < len(jobs) or \
        sum(1 for a, b in zip(jobs, jobs[1:]) if b.submit_s - a.submit_s < 2) > 100   # sweeps


def test_synthetic_round_trips_through_a_trace_file():
    jobs = generate("saturating", 50, 1, gpus=16, max_gpus=8, accounts=3)
    buf = io.StringIO()
    write_trace(jobs, buf)
    back = list(iter_trace(io.StringIO(buf.getvalue())))
    assert [(j.submit_s, j.gpus, j.duration_s, j.account) for j in back] == \
        [(j.submit_s, j.gpus, j.duration_s, j.account) for j in jobs]
    assert {j.account for j in jobs} == {"a", "b", "c"}


def test_compare_on_synthetic_jobs_prints_one_table_and_json(tmp_path):
    args = ["--cluster", "2x8xH100-80GB", "--synthetic", "mixed", "--jobs", "300", "--seed", "3"]
    r = run(*args, "--compare")
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "fifo" in line)
    assert header.split() == ["fifo", "priority", "full"]
    assert "GPU allocation while jobs waited" in r.output and "Jain's index" in r.output
    r = run(*args, "--compare", "--json", "--save-trace", str(tmp_path / "t.csv"))
    reports = json.loads(r.output)["policies"]
    assert list(reports) == list(POLICIES)
    assert {rep["jobs"]["submitted"] for rep in reports.values()} == {300}
    assert (tmp_path / "t.csv").read_text().count("\n") == 301


@pytest.mark.parametrize("args, words", [
    (["--cluster", "1x8xH100-80GB"], "--trace CSV or generate one"),
    (["--cluster", "1x8xH100-80GB", "--synthetic", "odd"], "Invalid value for '--synthetic'"),
    (["--cluster", "1x8xH100-80GB", "--synthetic", "mixed", "--drain"], "--drain needs --until"),
    (["--cluster", "1x8xH100-80GB", "--synthetic", "mixed", "--policy", "sjf"], "--policy"),
    (["--cluster", "1x8xH100-80GB", "--synthetic", "mixed", "--period", "0"], "--period"),
])
def test_bad_policy_arguments_are_one_line(args, words):
    r = run(*args)
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and words in r.output, r.output


def test_plot_draws_or_says_what_is_missing(tmp_path):
    out = tmp_path / "p.png"
    r = run("--cluster", "1x8xH100-80GB", "--synthetic", "mixed", "--jobs", "50", "--compare",
            "--plot", str(out))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert r.exit_code == 2 and "needs matplotlib" in r.output
        assert len(r.output.strip().splitlines()) == 1
        return
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_report_sizes_slowdown_and_fragmentation():
    r = simulate(parse_cluster("2x4xH100-80GB"), trace(
        "a,0,3,100,u,x,,,100", "b,0,3,100,u,x,,,100", "c,1,2,10,u,y,,,10"))
    # 2 GPUs are free, one per node, while c waits for 2 on one node: scattered
    assert r["fragmentation"]["idle_gpu_hours"] == pytest.approx(2 * 99 / 3600)
    assert r["fragmentation"]["scattered_gpu_hours"] == pytest.approx(2 * 99 / 3600)
    assert set(r["by_size"]) == {"2-4"}
    assert r["jct_s"]["mean"] == pytest.approx((100 + 100 + 109) / 3)
    assert r["bounded_slowdown"]["p50"] == 1.0
    assert r["accounts"]["y"]["wait_s"]["p95"] == 99


def test_preemption_loss_is_counted():
    config = sched_config_from_dict({
        "preemption": {"exempt_time": "0s"},
        "qos": {"low": {}, "high": {"priority": 10, "preempt": ["low"], "grace_time": "0s"}}})
    text = HEADER.replace("time_limit_s", "time_limit_s,qos") + \
        "lo,0,1,100,u,a,,,100,low\nhi,30,1,10,v,b,,,10,high\n"
    r = simulate(parse_cluster("1x1xH100-80GB"), list(iter_trace(io.StringIO(text))), config)
    # preempted at 30 s, stopped after the low QOS's 60 s grace: 90 GPU-seconds lost
    assert r["preemptions"] == 1 and r["preempted_gpu_hours"] == pytest.approx(90 / 3600)


# -- the shared traces: must-show 1 on slices -----------------------------------------------

def compare(*args: str) -> dict[str, dict]:
    r = run(*args, "--compare", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["policies"]


@pytest.mark.skipif(not MSFT.exists(), reason=f"trace {MSFT} not present")
def test_msft_first_half_day_full_beats_fifo_and_priority():
    # the ten ITP clusters are accounts sharing one merged cluster
    r = compare("--cluster", "16x8xH100-80GB", "--trace", str(MSFT), "--until", "12h", "--drain")
    assert {p["jobs"]["pending"] for p in r.values()} == {0}        # waits of the same jobs
    assert r["full"]["gpu_allocation"] >= 0.90
    assert r["full"]["wait_s"]["mean"] < r["fifo"]["wait_s"]["mean"]
    assert r["full"]["wait_s"]["mean"] < r["priority"]["wait_s"]["mean"]
    assert r["full"]["fairness"]["jain"] > r["fifo"]["fairness"]["jain"]


@pytest.mark.skipif(not OPENB.exists(), reason=f"trace {OPENB} not present")
def test_openb_busiest_days_full_waits_least():
    r = compare("--cluster", "2x8xV100-32GB", "--trace", str(OPENB), "--since", "144d",
                "--until", "146d", "--drain", "--skip-status", "Pending")
    assert r["full"]["wait_s"]["mean"] < r["priority"]["wait_s"]["mean"] < r["fifo"]["wait_s"]["mean"]
    # GPUs stay busier, but not 90 %: pods running for days (censored at the trace's end)
    # hold GPUs on every node while whole-node jobs wait (docs/simulation.md)
    assert r["full"]["gpu_allocation"] > r["priority"]["gpu_allocation"] > r["fifo"]["gpu_allocation"]


@pytest.mark.skipif(not OPENB.exists(), reason=f"trace {OPENB} not present")
def test_openb_fractions_share_mps_gpus_and_count_their_fraction():
    # the pods' gpu_milli on an MPS node as memory shares, beside two nodes of whole GPUs
    args = ["--trace", str(OPENB), "--since", "144d", "--until", "146d", "--drain",
            "--skip-status", "Pending", "--cluster", "2x8xV100-32GB,1x2xV100-32GB"]
    shared = compare(*args, "--gpu-modes", "n0003:*=mps")
    whole = compare(*args)
    for name in POLICIES:
        s, w = shared[name], whole[name]
        assert s["jobs"]["completed"] == w["jobs"]["completed"] == s["jobs"]["submitted"]
        assert s["gpu_seconds"] == pytest.approx(w["gpu_seconds"])          # the same work
        # a share holds its fraction of a GPU, not the whole GPU
        held = s["accounts"]["default"]["gpu_seconds_allocated"]
        assert held < w["accounts"]["default"]["gpu_seconds_allocated"]
        # (a share finding the MPS GPUs full may take a free whole GPU: the core's least waste)
        assert held == pytest.approx(s["gpu_seconds"], rel=0.05)
    assert shared["full"]["wait_s"]["mean"] < shared["priority"]["wait_s"]["mean"]
    assert shared["full"]["wait_s"]["mean"] < shared["fifo"]["wait_s"]["mean"]
    assert shared["full"]["by_size"]["<1"]["jobs_started"] > 0


@pytest.mark.skipif(not DLRM.exists(), reason=f"trace {DLRM} not present")
def test_dlrm_serving_load_is_the_same_under_every_policy():
    # month-long 1-GPU instances: any free GPU serves whoever waits first, so no policy can
    # do better; the trace is a background load, not a batch stream
    r = compare("--cluster", "40x8xH100-80GB", "--trace", str(DLRM), "--ignore-gpu-type",
                "--until", "2d")
    assert r["full"]["gpu_allocation"] == 1.0
    assert len({json.dumps(p["wait_s"]) for p in r.values()}) == 1


@pytest.mark.skipif(not DLRM.exists(), reason=f"trace {DLRM} not present")
def test_dlrm_as_background_serving_preempts_batch_under_full_only():
    # the instances alive at the start (about 3,120) are the initial state of 3,160 GPUs;
    # saturating batch jobs fill the rest, and serving instances created later need GPUs back
    r = compare("--cluster", "395x8xH100-80GB", "--background", str(DLRM), "--ignore-gpu-type",
                "--synthetic", "saturating", "--jobs", "300", "--load", "0.06",
                "--until", "6h", "--drain", "--pass-interval", "5m")
    assert {p["jobs"]["pending"] for p in r.values()} == {0}        # waits of the same jobs
    assert r["fifo"]["preemptions"] == r["priority"]["preemptions"] == 0
    full = r["full"]
    assert full["preemptions"] > 0 and full["qos"]["normal"]["preempted"] == full["preemptions"]
    assert full["qos"]["serving"]["preempted"] == 0
    assert full["gpu_allocation"] >= 0.90
    for name in ("fifo", "priority"):
        assert full["wait_s"]["mean"] < r[name]["wait_s"]["mean"]
        assert full["qos"]["normal"]["wait_s"]["mean"] < r[name]["qos"]["normal"]["wait_s"]["mean"]
    # serving starts within a minute on average under full; in submission order it waits
    assert full["qos"]["serving"]["wait_s"]["mean"] < 60
    assert full["qos"]["serving"]["wait_s"]["mean"] < r["fifo"]["qos"]["serving"]["wait_s"]["mean"]


def test_plot_shares_axes_draws_the_configured_shares_and_keeps_the_legend_off_the_data(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import copy

    import matplotlib.pyplot as plt

    from gpud.sim import plot as plotting

    drawn = {}
    monkeypatch.setattr(plotting, "plot", lambda reports, path: drawn.update(copy.deepcopy(reports)))
    cfg = tmp_path / "gpud.toml"
    cfg.write_text("[accounts.a]\nshares = 3\nusers = ['*']\n[accounts.b]\nshares = 1\nusers = ['*']\n")
    trace_file = tmp_path / "t.csv"
    trace_file.write_text("job_id,submit_s,gpus,duration_s,user,group\n"
                          + "".join(f"j{i},{i * 60},4,3600,u,{'ab'[i % 2]}\n" for i in range(40)))
    r = run("--cluster", "1x8xH100-80GB", "--config", str(cfg), "--trace", str(trace_file), "--compare",
            "--plot", str(tmp_path / "p.png"))
    assert r.exit_code == 0, r.output
    assert drawn["full"]["series"]["targets"] == {"a": 0.75, "b": 0.25}
    fig = plotting.figure(drawn)
    try:
        axes = fig.axes
        top = [a for a in axes if a.get_ylabel().startswith("GPUs")]
        low = [a for a in axes if a.get_ylabel().startswith("share")]
        assert top[0].get_shared_y_axes().joined(top[0], top[1]) and low[0].get_shared_x_axes().joined(low[0], low[1])
        # the configured shares, stacked as the bands are: 75 % for a, then 100 % with b's
        levels = sorted(round(line.get_ydata()[0]) for line in low[0].lines if line.get_linestyle() == "--")
        assert levels == [75, 100]
        assert not any(a.get_legend() for a in axes) and fig.legends
        fig.canvas.draw()
        legend = fig.legends[0].get_window_extent()
        assert legend.y1 <= min(a.get_window_extent().y0 for a in axes)     # below every panel
    finally:
        plt.close(fig)
