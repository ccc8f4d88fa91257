"""Fair-share over a simulated week: saturating accounts get GPU-time in their shares' ratio."""

from __future__ import annotations

import io
import random

import pytest

from gpud.sim.cluster import parse_cluster
from gpud.sim.command import load_sched_config
from gpud.sim.engine import simulate
from gpud.sim.trace import iter_trace

WEEK = 7 * 86400.0
CLUSTER = "2x8xH100-80GB"          # 16 GPUs


SIZES = (2, 4, 8)                  # GPUs; few, big jobs keep the queue (and the test) short


def saturating_trace(seed: int, accounts: tuple[str, ...], gpus: int = 16) -> list:
    """Each account alone offers as much work as the cluster holds, for a week: jobs of
    2-8 GPUs running 40-80 minutes, arriving at random (Poisson)."""
    rnd = random.Random(seed)
    mean_gpu_hours = sum(SIZES) / len(SIZES) * 1.0
    rate = gpus / (mean_gpu_hours * 3600.0)   # jobs per second, per account
    rows = []
    for account in accounts:
        t = 0.0
        while t < WEEK:
            rows.append((round(t), rnd.choice(SIZES), rnd.randint(40, 80) * 60,
                         f"{account}-u{rnd.randint(1, 3)}", account))
            t += rnd.expovariate(rate)
    rows.sort(key=lambda r: (r[0], r[4]))
    text = "job_id,submit_s,gpus,duration_s,user,group\n" + "".join(
        f"j{i},{s},{g},{d},{u},{a}\n" for i, (s, g, d, u, a) in enumerate(rows))
    return list(iter_trace(io.StringIO(text)))


def config(tmp_path, shares: dict[str, int]):
    path = tmp_path / "gpud.toml"
    path.write_text("".join(f'[accounts.{a}]\nshares = {s}\nusers = ["*"]\n\n' for a, s in shares.items()))
    return load_sched_config(str(path))


def shares_of(report: dict) -> dict[str, float]:
    return {a: v["share"] for a, v in report["accounts"].items()}


def test_equal_shares_split_the_cluster_evenly(tmp_path):
    r = simulate(parse_cluster(CLUSTER), saturating_trace(1, ("a", "b")),
                 config(tmp_path, {"a": 1, "b": 1}), until=WEEK)
    assert r["gpu_allocation"] > 0.9  # both really kept it busy
    got = shares_of(r)
    assert got["a"] == pytest.approx(0.5, abs=0.025), got
    assert got["b"] == pytest.approx(0.5, abs=0.025), got


def test_shares_two_to_one_split_two_to_one(tmp_path):
    r = simulate(parse_cluster(CLUSTER), saturating_trace(2, ("a", "b")),
                 config(tmp_path, {"a": 2, "b": 1}), until=WEEK)
    assert r["gpu_allocation"] > 0.9
    a, b = r["accounts"]["a"]["gpu_seconds"], r["accounts"]["b"]["gpu_seconds"]
    assert a / b == pytest.approx(2.0, rel=0.05), shares_of(r)


@pytest.mark.parametrize("shares", [{"a": 1, "b": 1}, {"a": 2, "b": 1}])
def test_two_saturating_accounts_get_their_shares_every_week(tmp_path, shares):
    """Each account alone could fill the cluster for two weeks; in each simulated week,
    each one's share of the GPU-time is within 5 % of its configured share."""
    from gpud.sim.synthetic import generate

    jobs = generate("saturating", 2600, 7, gpus=16, max_gpus=8, accounts=2)
    r = simulate(parse_cluster(CLUSTER), jobs, config(tmp_path, shares), until=2 * WEEK)
    assert r["gpu_allocation"] > 0.95
    weeks = r["fairness"]["periods"]
    assert len(weeks) == 2
    total = sum(shares.values())
    for week in weeks:
        for account, s in shares.items():
            assert week["shares"][account] == pytest.approx(s / total, rel=0.05), week
        assert week["jain"] > 0.99
    assert r["accounts"]["a"]["configured_share"] == pytest.approx(shares["a"] / total)
