"""The simulator and the head make the same decisions (must-show 4).

One small trace goes through the simulator and through a real head with two simulated-GPU
workers (real processes, Mosquitto, SQLite): the same jobs must start in the same passes,
on the same nodes and GPUs.  Both run ``gpud.sched.core.schedule``; what this checks is
everything around it: the snapshot each builds, how plans are applied, when passes run.

Making the head deterministic: both nodes are drained while the jobs are submitted and
resumed in one request, so its first pass, like the simulator's, sees every job and both
nodes.  Run times are distinct and far enough apart that jobs end in the same order even
on a slow machine, and time limits (which backfill plans with) are minutes while jobs
run seconds, so a few hundred milliseconds of launch latency change no decision.
"""

from __future__ import annotations

import io
from collections import defaultdict

import pytest

from gpud.sched.config import SchedConfig
from gpud.sim.cluster import parse_cluster
from gpud.sim.engine import Simulation
from gpud.sim.trace import iter_trace
from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

SCALE = 3.0           # seconds per unit of run time: ends stay >= 1 unit apart
# (GPUs, run time in units, time limit in seconds), in submission order, on 2 x 4 GPUs.
# Bigger jobs rank higher (job size), so Y and Z take a node each and X waits.  At 3 Y
# ends: X and S1 fill its node while S2 waits; at 5 S1 ends and S3 (limit 30 s) is
# backfilled past S2, which holds a reservation; at 8 Z ends and S2 starts.  Ends
# (units): Y 3, S1 5, Z 8, S2 11, S3 12, X 13.
JOBS = [
    ("X", 3, 10, 600), ("Y", 4, 3, 600), ("Z", 4, 8, 600),
    ("S1", 1, 2, 60), ("S2", 2, 3, 120), ("S3", 1, 7, 30),
]


def waves(starts: list[tuple[float, str, str, tuple[int, ...]]]) -> list[dict[str, tuple]]:
    """Starts grouped by pass (one start time each), in time order: job -> (node, GPUs)."""
    by_time: dict[float, dict[str, tuple]] = defaultdict(dict)
    for t, job, node, gpus in starts:
        by_time[t][job] = (node, tuple(sorted(gpus)))
    return [by_time[t] for t in sorted(by_time)]


def simulated() -> list[dict[str, tuple]]:
    text = "job_id,submit_s,gpus,duration_s,user,group,time_limit_s\n" + "".join(
        f"{name},0,{gpus},{units * SCALE},root,default,{limit}\n" for name, gpus, units, limit in JOBS)
    sim = Simulation(parse_cluster("2x4xH100-80GB"), iter_trace(io.StringIO(text)), SchedConfig(),
                     record_starts=True)
    report = sim.run()
    assert report["jobs"]["completed"] == len(JOBS)
    return waves(sim.start_log)


def test_same_starts_in_the_same_passes_on_the_same_gpus(tmp_path, mosquitto):  # noqa: F811
    expected = simulated()
    assert len(expected) >= 4, expected          # the scenario exercises several passes
    with Cluster(tmp_path / "c", mosquitto.url) as c:
        c.start_head()
        c.start_worker("n0001", "4xH100-80GB")    # named as the simulator names its nodes
        c.start_worker("n0002", "4xH100-80GB")
        with c.client() as client:
            assert client.update_node("n000[1-2]", "DRAIN", reason="hold for the test")["done"]
            ids = {}
            for name, gpus, units, limit in JOBS:
                ids[client.submit(wrap=f"sleep {units * SCALE}", gpus=gpus, time_limit=limit,
                                  stdout="/dev/null", work_dir=str(tmp_path))] = name
            assert client.update_node("n000[1-2]", "RESUME")["done"] == ["n0001", "n0002"]
        done = wait_for(lambda: (js := c.jobs()) and all(js.get(j, {}).get("state") == "COMPLETED" for j in ids)
                        and js, 180, "every job to complete")
    got = waves([(done[j]["start_time"], ids[j], done[j]["node"], tuple(done[j]["gpu_indices"]))
                 for j in ids])
    assert got == expected
