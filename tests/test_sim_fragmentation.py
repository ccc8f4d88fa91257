"""The simulator's fragmentation measures are gpud.sched.fragmentation's, averaged over the
time jobs waited."""

from __future__ import annotations

import pytest

from gpud.sched.config import SchedConfig
from gpud.sched.fragmentation import fragmentation
from gpud.sim.cluster import apply_gpu_modes, parse_cluster
from gpud.sim.engine import Simulation
from gpud.sim.synthetic import generate


class Checked(Simulation):
    """Checks, at every step of the clock, the engine's counts against the pure function."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.checked = 0
        self.index_s = self.waiting_s = 0.0

    def _advance(self, t: float) -> None:
        dt = t - self.clock
        if dt > 0 and self.pending:
            f = fragmentation(self.nodes, tuple(self.running.values()), self.tally.frag_size)
            free = sum(len(v) for v in self._free.values())
            assert f.free_gpus == free
            self.index_s += f.index * dt
            self.waiting_s += dt
            self.checked += 1
        super()._advance(t)


@pytest.mark.parametrize("spec, modes", [("6x8xH100-80GB", None),
                                          ("4x8xA100-80GB", "n0004:0-3=mps")])
def test_time_averaged_fragmentation_matches_the_pure_function(spec, modes):
    nodes = apply_gpu_modes(parse_cluster(spec), modes)
    jobs = generate("mixed", 600, 3, gpus=48, max_gpus=8, load=1.2)
    sim = Checked(nodes, jobs, SchedConfig())
    report = sim.run()
    frag = report["fragmentation"]
    assert sim.checked > 100
    assert frag["size"] == 8
    assert frag["index"] == pytest.approx(sim.index_s / sim.waiting_s, abs=1e-6)
    assert 0.0 <= frag["index"] <= 1.0 and 0.0 <= frag["stranded_gpus"] <= frag["free_gpus"]


def test_size_follows_the_biggest_node_and_nothing_waiting_is_none():
    report = Simulation(parse_cluster("2x4xH100-80GB"), []).run()
    assert report["fragmentation"]["size"] == 4 and report["fragmentation"]["index"] is None
