"""The simulator with shared GPUs: trace rows asking for MIG slices or GPU memory, re-layouts
applied on virtual time as a worker applies them."""

from __future__ import annotations

import pytest

from gpud.gpu import mig
from gpud.sched.config import sched_config_from_dict
from gpud.sched.plan import Relayout
from gpud.sched.snapshot import Device, GpuView, NodeView, RunningJob, SliceView
from gpud.sim import sharing
from gpud.sim.cluster import ClusterSpecError, apply_gpu_modes, parse_cluster
from gpud.sim.engine import Simulation
from gpud.sim.trace import TraceJob

A100 = "A100-80GB"


def node(name: str = "a01", gpus: int = 2, dynamic: bool = True, layout: str | None = None) -> NodeView:
    cat = mig.catalog(A100)
    views = []
    for i in range(gpus):
        slices = tuple(SliceView(s.profile, s.start, f"MIG-{name}-{i}-{s.start}", cat[s.profile].memory_mb)
                       for s in (mig.named_layout(A100, layout) if layout else []))
        views.append(GpuView(i, f"GPU-{name}-{i}", A100, 81920, mode="mig", dynamic=dynamic, slices=slices))
    return NodeView(name, 64, 512 * 1024, tuple(views))


def row(seq: int, submit: float, run: float, profile: str | None = None, mem: str | None = None) -> TraceJob:
    return TraceJob(seq=seq, trace_id=f"t{seq}", submit_s=submit, gpus=1, share=0.5, duration_s=run,
                    user="u", account=None, gpu_type=None, status=None, time_limit_s=run,
                    mig_profile=profile, gpu_mem=mem)


def test_slices_are_cut_and_jobs_served_on_virtual_time():
    cfg = sched_config_from_dict({"scheduler": {"mig_min_interval": "10m"}}, "<test>")
    jobs = ([row(k + 1, 0.0, 600.0, "1g.10gb") for k in range(14)]
            + [row(15 + k, 60.0, 600.0, "7g.80gb") for k in range(2)]
            + [row(17, 120.0, 300.0, mem="30G")])
    sim = Simulation((node(),), jobs, cfg, record_starts=True)
    report = sim.run()
    assert report["jobs"]["completed"] == 17 and report["jobs"]["pending"] == 0
    starts = {trace_id: t for t, trace_id, _, _ in sim.start_log}
    assert all(starts[f"t{k + 1}"] == sharing.RELAYOUT_S for k in range(14))   # 14 slices, one re-layout each
    assert min(starts["t15"], starts["t16"]) >= 600.0                           # after the 1g jobs
    layouts = {g.index: {s.profile for s in g.slices} for g in sim.nodes[0].gpus}
    assert all(g.relaid_at is not None for g in sim.nodes[0].gpus)
    assert any("7g.80gb" in p or "3g.40gb" in p for p in layouts.values())


def test_a_static_layout_serves_its_own_profile_only():
    jobs = [row(1, 0.0, 60.0, "1g.10gb"), row(2, 0.0, 60.0, mem="8G")]
    sim = Simulation((node(dynamic=False, layout="all-1g.10gb"),), jobs, record_starts=True)
    report = sim.run()
    assert report["jobs"]["completed"] == 2
    assert {t for t, *_ in sim.start_log} == {0.0}


def test_apply_relayout_refuses_what_a_worker_refuses():
    n = node(gpus=1, layout="all-1g.10gb")
    busy = RunningJob(1, "u", "a", "gpu", "normal", "a01", (), 1, 1, 0.0, None,
                      devices=(Device(0, "mig", "MIG-a01-0-3", 3, 9728, "1g.10gb"),))
    assert sharing.apply_relayout((n,), Relayout("a01", 0, (3,), (), "x"), [busy], 0.0) is None
    assert sharing.apply_relayout((n,), Relayout("a01", 0, (), (mig.Slice("1g.10gb", 3),), "x"), [], 0.0) is None
    static = node(gpus=1, dynamic=False)
    assert sharing.apply_relayout((static,), Relayout("a01", 0, (), (mig.Slice("7g.80gb", 0),), "x"), [], 0.0) is None
    done = sharing.apply_relayout((n,), Relayout("a01", 0, (0, 1, 2), (mig.Slice("2g.20gb", 0),), "x"),
                                  [busy], 42.0)
    g = done[0].gpus[0]
    assert g.relaid_at == 42.0 and [(s.profile, s.start) for s in g.slices][:2] == [("2g.20gb", 0), ("1g.10gb", 3)]


def test_fractions_no_gpu_can_serve_are_refused_at_arrival_as_the_head_refuses_them():
    from gpud.sched.admission import Resolved, infeasible, refusal
    from gpud.sched.config import SchedConfig

    # a static layout of 1g.10gb slices: no 7g.80gb ever, and no slice holds 40 GiB
    static = node(gpus=1, dynamic=False, layout="all-1g.10gb")
    jobs = [row(1, 0.0, 60.0, "1g.10gb"), row(2, 0.0, 60.0, "7g.80gb"), row(3, 0.0, 60.0, mem="40G")]
    report = Simulation((static,), jobs).run()
    assert report["jobs"]["infeasible"] == {"gpu_mem_too_large": 1, "no_such_mig_profile": 1}
    assert report["jobs"]["completed"] == 1 and report["jobs"]["pending"] == 0
    # the kinds are those of the head's own refusals, whose messages go to the user
    cfg = SchedConfig()
    resolved = Resolved("default", "gpu", "normal", 60.0, cfg.default_mem_mb)
    for request, kind in (({"gpus": 1, "mig_profile": "7g.80gb"}, "no_such_mig_profile"),
                          ({"gpus": 1, "gpu_mem_mb": 40960}, "gpu_mem_too_large")):
        why = infeasible(request, resolved, "u", cfg, (static,))
        assert why.kind == kind and why.message == refusal(request, resolved, "u", cfg, (static,))


def test_pending_fields():
    assert sharing.pending_fields(row(1, 0, 1, "MIG 2G.20GB")) == {"mig_profile": "2g.20gb", "gpu_mem_mb": None}
    assert sharing.pending_fields(row(1, 0, 1, mem="20G")) == {"mig_profile": None, "gpu_mem_mb": 20480}
    assert sharing.pending_fields(row(1, 0, 1, "nonsense", "lots")) == {"mig_profile": None, "gpu_mem_mb": None}


# -- fractional trace rows on shared GPUs ---------------------------------------------------

def frac(seq: int, submit: float, run: float, share: float, gpus: int = 1) -> TraceJob:
    return TraceJob(seq=seq, trace_id=f"f{seq}", submit_s=submit, gpus=gpus, share=share, duration_s=run,
                    user="u", account=None, gpu_type=None, status=None, time_limit_s=run)


def test_gpu_modes_spec_sets_up_gpus_as_a_worker_would():
    nodes = apply_gpu_modes(parse_cluster("2x4xA100-80GB"),
                            "0-1=mps:max_clients=8; 2=mig:dynamic; 3=mig:all-1g.10gb; n0002:*=timeslice:4")
    first, second = nodes
    assert [g.mode for g in first.gpus] == ["mps", "mps", "mig", "mig"]
    assert first.gpus[0].mps_max_clients == 8 and first.gpus[2].dynamic and not first.gpus[2].slices
    assert len(first.gpus[3].slices) == 7 and not first.gpus[3].dynamic
    assert {(g.mode, g.replicas) for g in second.gpus} == {("timeslice", 4)}      # a node's own entry wins
    assert [g.mode for g in apply_gpu_modes(parse_cluster("1x2xV100-32GB"), "mps")[0].gpus] == ["mps", "mps"]
    assert apply_gpu_modes(nodes, None) == nodes


@pytest.mark.parametrize("spec, words", [
    ("0-1=sliced", "unknown GPU mode"),
    ("mig:dynamic", "does not support MIG"),          # V100: no MIG
    ("mps:max_clients=99", "max_clients"),
])
def test_gpu_modes_spec_errors_are_one_line(spec, words):
    with pytest.raises(ClusterSpecError, match=words) as e:
        apply_gpu_modes(parse_cluster("1x2xV100-32GB"), spec)
    assert "\n" not in str(e.value)


def test_fractions_map_to_the_clusters_sharing():
    mps = sharing.Fractions(apply_gpu_modes(parse_cluster("1x2xV100-32GB"), "0=mps"))
    assert mps.kind == "memory" and mps.request(0.5, None) == {"mig_profile": None, "gpu_mem_mb": 16384}
    migs = sharing.Fractions(apply_gpu_modes(parse_cluster("1x2xA100-80GB"), "mig:dynamic"))
    assert migs.kind == "mig"
    assert [migs.request(f, None)["mig_profile"] for f in (0.1, 0.15, 0.23, 0.47, 0.81)] == \
        ["1g.10gb", "2g.20gb", "2g.20gb", "4g.40gb", "7g.80gb"]
    assert sharing.Fractions(parse_cluster("1x2xA100-80GB")).kind == "whole"
    # a row that names its memory keeps it
    assert sharing.pending_fields(row(1, 0, 1, mem="4G"), mps) == {"mig_profile": None, "gpu_mem_mb": 4096}


def test_fractions_share_an_mps_gpu_and_count_their_fraction():
    # one whole GPU and one MPS GPU: four 0.25 jobs share the MPS GPU at once; the 1-GPU job
    # takes the whole one.  Allocation counts 1 + 4 x 0.25 of 2 GPUs while the 0.5 job waits.
    nodes = apply_gpu_modes(parse_cluster("1x2xV100-32GB"), "1=mps")
    jobs = [frac(k + 1, 0.0, 100.0, 0.25) for k in range(4)] + [frac(5, 0.0, 100.0, 1.0),
                                                                 frac(6, 0.0, 50.0, 0.5)]
    sim = Simulation(nodes, jobs, record_starts=True)
    report = sim.run()
    starts = {trace_id: t for t, trace_id, _, _ in sim.start_log}
    assert [starts[f"f{k}"] for k in range(1, 6)] == [0.0] * 5 and starts["f6"] == 100.0
    assert report["gpu_allocation"] == 1.0
    assert report["utilization"] == pytest.approx((2 * 100 + 0.5 * 50) / (2 * 150))
    assert report["jobs"]["completed"] == 6


def test_fractions_hold_a_whole_gpu_without_shared_gpus():
    jobs = [frac(1, 0.0, 100.0, 0.25), frac(2, 0.0, 100.0, 0.25)]
    report = Simulation(parse_cluster("1x1xV100-32GB"), jobs).run()
    assert report["gpu_allocation"] == 1.0 and report["makespan_s"] == 200.0
    assert report["accounts"]["default"]["gpu_seconds"] == pytest.approx(50.0)


def test_mps_dynamic_gpus_take_whole_jobs_and_shares_in_the_simulator(caplog):
    """An mps:dynamic node serves whole-GPU jobs and shares (never both on one GPU at once):
    every start the core plans is one the engine's re-check accepts."""
    from gpud.sim.cluster import apply_gpu_modes, parse_cluster
    from gpud.sim.engine import Simulation
    from gpud.sim.trace import TraceJob
    from gpud.sched.config import SchedConfig

    nodes = apply_gpu_modes(parse_cluster("1x2xV100-32GB"), "mps:dynamic")
    rows = [TraceJob(seq=k, trace_id=str(k), submit_s=float(k), gpus=1, share=share, duration_s=100.0,
                     user="u", account=None, gpu_type=None, status=None)
            for k, share in enumerate([0.5, 1.0, 0.4, 1.0, 0.3], start=1)]
    report = Simulation(nodes, iter(rows), SchedConfig()).run()
    assert report["jobs"]["started"] == 5 and report["jobs"]["completed"] == 5
    assert "does not fit" not in caplog.text
