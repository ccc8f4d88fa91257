"""Usage accrual and decay."""

from __future__ import annotations

import math

import pytest

from gpud.sched.usage import accrue, charge, decay, decayed_integral, prune

from .sched_builders import config, node, running

DAY = 86400.0


@pytest.mark.parametrize("value, dt, hl, want", [
    (100.0, 0.0, DAY, 100.0),
    (100.0, DAY, DAY, 50.0),
    (100.0, 2 * DAY, DAY, 25.0),
    (100.0, 10 * DAY, None, 100.0),      # no half-life: no decay
])
def test_decay(value, dt, hl, want):
    assert decay(value, dt, hl) == pytest.approx(want)


def test_integral_without_decay_is_plain_gpu_seconds():
    assert decayed_integral(8.0, 0.0, 100.0, 100.0, None) == 800.0
    assert decayed_integral(8.0, 100.0, 50.0, 100.0, DAY) == 0.0


def test_accrual_does_not_depend_on_how_often_it_runs():
    cfg = config(scheduler={"fairshare_half_life": "1d"})
    n = [node("n001")]
    jobs = [running(1, "n001", range(4), account="a", user="u", start_time=0.0)]
    once = accrue({}, jobs, n, cfg, 0.0, DAY)
    many: dict = {}
    for k in range(24):
        many = accrue(many, jobs, n, cfg, k * 3600.0, (k + 1) * 3600.0)
    assert many[("a", "u")] == pytest.approx(once[("a", "u")], rel=1e-9)
    # exact integral of 4 GPU over a day decaying with a 1-day half-life
    assert once[("a", "u")] == pytest.approx(4 * DAY / math.log(2) * 0.5)


def test_billing_weights_and_start_inside_the_window():
    cfg = config(billing={"weights": {"H100-80GB": 2.0}}, scheduler={"fairshare_half_life": "unlimited"})
    n = [node("n001"), node("n002", model="A100-80GB")]
    jobs = [running(1, "n001", (0, 1), account="a", user="u", start_time=50.0),
            running(2, "n002", (0,), account="b", user="v", start_time=0.0)]
    out = accrue({("a", "u"): 10.0}, jobs, n, cfg, 0.0, 100.0)
    assert out[("a", "u")] == pytest.approx(10.0 + 2 * 2.0 * 50)
    assert out[("b", "v")] == pytest.approx(100.0)


def test_charge_a_finished_job_and_prune():
    u = charge({}, ("a", "u"), 2.0, 10.0, 30.0, 40.0, None)
    assert u == {("a", "u"): 40.0}
    assert prune({("a", "u"): 1e-9, ("b", "v"): 5.0}) == {("b", "v"): 5.0}
