"""Worker-side telemetry: what the backends read, and the compact ``samples`` the sampler sends."""

from __future__ import annotations

import asyncio

import pytest

from gpud.bus.base import HEAD_EVENTS
from gpud.gpu.backend import Assignment, GpuSample, open_backend
from gpud.gpu.sim import SIM_DEFAULT_UTIL, SimBackend, declared_util
from gpud.worker.launch import GpuAssignment, Launch
from gpud.worker.telemetry import Sampler, assignments_from
from tests.fake_pynvml import FakeMigSlice, FakeNvml


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the sim backend: utilization is what the jobs declare --------------------------------------

def test_sim_gpus_follow_what_their_jobs_declare():
    clock = Clock()
    b = SimBackend("4xH100-80GB", "n1", clock=clock)
    jobs = [Assignment(1, 1, (0, 1), {"GPUD_SIM_UTIL": "90,20"}),
            Assignment(2, 1, (2,), {"GPUD_SIM_UTIL": "0", "GPUD_SIM_MEM_MB": "1000"})]
    s = b.sample(jobs)
    assert [g.util for g in s] == [90.0, 20.0, 0.0, 0.0]
    assert [g.mem_used_mb for g in s] == [36864, 8192, 1000, 0]     # half the memory at full load
    assert [g.power_w for g in s] == [637.0, 196.0, 70.0, 70.0]    # a tenth of 700 W idle
    assert [g.temp_c for g in s] == [75.0, 40.0, 30.0, 30.0]
    assert [g.energy_mj for g in s] == [0, 0, 0, 0]
    clock.t += 10
    again = b.sample(jobs)
    assert [g.energy_mj for g in again] == [6_370_000, 1_960_000, 700_000, 700_000]   # W x 10 s


@pytest.mark.parametrize("env, expected", [
    ({}, [SIM_DEFAULT_UTIL]),
    ({"GPUD_SIM_UTIL": "85"}, [85.0]),
    ({"GPUD_SIM_UTIL": "150,-3"}, [100.0, 0.0]),
    ({"GPUD_SIM_UTIL": "busy"}, [SIM_DEFAULT_UTIL]),
    ({"GPUD_SIM_UTIL": "nan"}, [SIM_DEFAULT_UTIL]),
])
def test_declared_utilization(env, expected):
    assert declared_util(env) == expected


def test_sim_ignores_gpus_it_does_not_have():
    b = SimBackend("1xA30-24GB", "n1")
    s = b.sample([Assignment(1, 1, (0, 5), {"GPUD_SIM_UTIL": "50"})])
    assert [(g.index, g.util) for g in s] == [(0, 50.0)]


# -- NVML over the fake driver ----------------------------------------------------------------

def test_nvml_reads_every_gpu_and_leaves_out_what_the_board_does_not_offer():
    nv = FakeNvml.machine(H100=2, A100=1)
    g0, g1, g2 = nv.gpus
    g0.util, g0.used_mib, g0.power_mw, g0.temp_c, g0.energy_mj = 87, 40_000, 612_500, 71, 5_000_000
    g0.procs = [(4242, 39_000)]
    g1.power_mw = g1.energy_mj = g1.temp_c = None          # an old board: no power, counter or sensor
    g2.lost = True
    g2.util = 10
    b = open_backend(None, "n1", nvml=nv)
    s = b.sample([])
    assert s == [
        GpuSample(0, g0.uuid, 87.0, 40_000, 612.5, 71.0, 5_000_000, (), ((4242, 39_000),)),
        GpuSample(1, g1.uuid, 0.0, 512, None, None, None, (), ()),
    ]
    b.close()


def test_nvml_mig_slices_report_memory_and_processes():
    nv = FakeNvml.machine(A100=1)
    nv.gpus[0].mig = [FakeMigSlice("MIG-aaa", 10_000, 3_000, [(77, 2_900)]), FakeMigSlice("MIG-bbb", 10_000)]
    b = open_backend(None, "n1", nvml=nv)
    (s,) = b.sample([])
    assert [(x.uuid, x.mem_used_mb, x.util) for x in s.slices] == [("MIG-aaa", 3_000, None), ("MIG-bbb", 0, None)]
    assert s.procs == ((77, 2_900),)
    b.close()


# -- the sampler --------------------------------------------------------------------------------

class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.readings: list[GpuSample] = []
        self.seen: list[list[Assignment]] = []
        self.fail = False

    def discover(self):
        return []

    def sample(self, assignments):
        self.seen.append(list(assignments))
        if self.fail:
            raise RuntimeError("driver wedged")
        return list(self.readings)

    def close(self):
        pass


def reading(index: int, energy_mj: int | None, power: float | None = 100.0) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", 50.0, 1000, power, 40.0, energy_mj)


async def test_sampler_sends_compact_samples_with_energy_between_sends():
    backend, sent, clock = FakeBackend(), [], Clock()

    async def publish(topic, msg):
        sent.append((topic, msg))

    jobs = [Assignment(7, 2, (0,), {})]
    s = Sampler(backend, publish, lambda: jobs, 5.0, clock=clock)
    backend.readings = [reading(0, 1_000_000), reading(1, None, power=80.0)]
    first = await s.sample_once()
    assert sent == [(HEAD_EVENTS, first)]
    # No counter history yet: watts x the interval; a board without a counter always so.
    assert first.to_body() == {"t": 1000.0, "iv": 5.0, "gpus": [[0, 50.0, 1000, 100.0, 40.0, 500.0],
                                                       [1, 50.0, 1000, 80.0, 40.0, 400.0]],
                     "jobs": [[7, 2, [0]]], "slices": [], "procs": []}
    clock.t += 5
    backend.readings = [reading(0, 1_450_000), reading(1, None, power=80.0)]
    second = await s.sample_once()
    assert [g[5] for g in second.gpus] == [450.0, 400.0]       # the counter's difference
    clock.t += 5
    backend.readings = [reading(0, 10), reading(1, None, power=80.0)]   # driver reloaded: counter reset
    third = await s.sample_once()
    assert [g[5] for g in third.gpus] == [500.0, 400.0]
    assert backend.seen[0] == jobs


async def test_sampler_skips_while_disconnected_and_never_raises():
    backend, sent, up = FakeBackend(), [], {"v": False}

    async def publish(topic, msg):
        sent.append(msg)

    s = Sampler(backend, publish, lambda: [], 1.0, connected=lambda: up["v"])
    backend.readings = [reading(0, 0)]
    assert await s.sample_once() is None and sent == [] and backend.seen == []
    up["v"] = True
    backend.fail = True
    assert await s.sample_once() is None and s.failures == 1

    async def broken(topic, msg):
        raise ConnectionError("gone")

    backend.fail = False
    s.publish = broken
    assert await s.sample_once() is None


async def test_interval_zero_turns_telemetry_off():
    s = Sampler(FakeBackend(), None, lambda: [], 0)  # type: ignore[arg-type]
    await asyncio.wait_for(s.run(), 1)   # returns at once instead of looping


def test_assignments_come_from_the_executors_launches():
    launch = Launch(job_id=3, attempt=1, name="j", user="u", uid=1, gid=1, script="x", work_dir="/",
                    stdout=None, stderr=None, env={"GPUD_SIM_UTIL": "5", "A": "1"},
                    gpus=(GpuAssignment(2, "GPU-x"), GpuAssignment(3, "GPU-y")), cpus=1, mem_mb=1,
                    time_limit=None, kill_grace=1, submit_dir="/", extra_env={"A": "2"})

    class Executor:
        def launches(self):
            return [launch]

    assert assignments_from(Executor()) == [Assignment(3, 1, (2, 3), {"GPUD_SIM_UTIL": "5", "A": "2"})]
    assert assignments_from(object()) == []
