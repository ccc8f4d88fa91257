"""Invariants of any simulation, over random small traces and clusters."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpud.sim.cluster import parse_cluster
from gpud.sim.engine import simulate
from gpud.sim.trace import iter_trace

row = st.tuples(
    st.integers(0, 5000),                                  # submit
    st.sampled_from(["1", "2", "4", "8", "0.5", "0"]),     # gpus
    st.integers(0, 4000),                                  # duration
    st.sampled_from(["a", "b", "c"]),                      # account
    st.sampled_from(["", "", "300", "2000"]),              # time limit
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(row, max_size=30), spec=st.sampled_from(["1x4xH100-80GB", "2x8xH100-80GB"]),
       until=st.sampled_from([None, 3000.0]))
def test_conservation_and_capacity(rows, spec, until):
    text = "job_id,submit_s,gpus,duration_s,group,time_limit_s\n" + "".join(
        f"j{i},{s},{g},{d},{a},{tl}\n" for i, (s, g, d, a, tl) in enumerate(sorted(rows)))
    jobs = list(iter_trace(io.StringIO(text)))
    nodes = parse_cluster(spec)
    r = simulate(nodes, jobs, until=until)
    j = r["jobs"]
    # every admitted job is somewhere: ended, waiting or running
    assert j["submitted"] == sum(j["ended"].values()) + j["pending"] + j["running"]
    arrived = [x for x in jobs if until is None or x.submit_s <= until]
    assert j["submitted"] + sum(j["infeasible"].values()) == len(arrived)
    # never more GPU-time than the cluster had
    total_gpus = r["cluster"]["gpus"]
    used = sum(a["gpu_seconds_allocated"] for a in r["accounts"].values())
    assert used <= total_gpus * r["simulated_s"] + 1e-6
    assert r["gpu_allocation"] is None or 0.0 <= r["gpu_allocation"] <= 1.0 + 1e-9
    if until is None:
        assert j["pending"] == 0 and j["running"] == 0  # everything feasible finishes
    assert simulate(nodes, jobs, until=until) == r
