"""Jobs confined by the executor in this host's real cgroups (v1 controllers here and in CI).

Root only; each test skips cleanly where it is not root or the controller it needs is not
mounted.  Processes are real, waits are on conditions, and time limits run on the injected
clock.  The one CPU-hungry check (accounting) runs in tests/test_confinement_e2e.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid

import psutil
import pytest

from gpud.gpu.sim import SimBackend
from gpud.worker import cgroups as cg
from gpud.worker.cgroup_v2 import V2
from gpud.worker.cpubind import CpuBinder
from tests.test_executor import FakeClock, Harness, read, until

PY = sys.executable


def v1_or_skip(*controllers: str) -> cg.Cgroups:
    if os.geteuid() != 0:
        pytest.skip("confinement needs root")
    c = cg.detect("v1", f"gpud-test-{uuid.uuid4().hex[:8]}")
    if not c.active:
        pytest.skip(f"no cgroup v1 here: {c.reason}")
    missing = [x for x in controllers if x in c.missing]
    if missing:
        pytest.skip(f"cgroup v1 controllers not mounted: {', '.join(missing)}")
    return c


@pytest.fixture
def confined(tmp_path):
    made: list[cg.Cgroups] = []
    h = Harness(tmp_path)

    def executor(*controllers: str, **kw):
        c = v1_or_skip(*controllers)
        made.append(c)
        ex = h.executor(**kw)
        ex.cgroups = c
        return ex

    h.confined_executor = executor
    yield h
    for c in made:
        for name in c.jobs():
            c.kill(name)
            c.remove(name)
        c.close()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# A job that leaves two processes the old process-group kill missed: one in a session of
# its own (setsid nohup), one double-forked daemon that also ignores SIGTERM.
ESCAPEES = f"""
setsid nohup sleep 1000 >/dev/null 2>&1 &
echo $! > escapee.pids
{PY} -c '
import os, signal, time
if os.fork(): os._exit(0)
os.setsid()
if os.fork(): os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("escapee.pids", "a").write(f"{{os.getpid()}}\\n")
time.sleep(1000)' &
while [ "$(wc -l < escapee.pids)" -lt 2 ]; do sleep 0.05; done
echo ready
sleep 1000
"""


@pytest.mark.parametrize("how", ["cancel", "timeout", "preempt", "fence"])
async def test_every_process_of_the_job_dies_with_it(confined, how):
    clock = FakeClock()
    ex = confined.confined_executor("freezer", clock=clock)
    await ex.start()
    try:
        await ex.launch(confined.launch(ESCAPEES, kill_grace=0, time_limit=60))
        await confined.output("gpud-1.out", "ready")
        pids = [int(p) for p in read(confined.work_dir / "escapee.pids").split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        assert set(pids) <= set(ex.cgroups.pids("job_1_0"))
        if how == "cancel":
            await ex.signal(1, 0, "TERM", grace=0, reason="cancelled")
        elif how == "preempt":
            await ex.signal(1, 0, "TERM", grace=0, reason="preempted")
        elif how == "fence":
            await ex.kill(1, 0)
        else:
            clock.advance(61)
        outcome = await confined.outcome(1)
        assert outcome.reason == {"cancel": "cancelled", "timeout": "timeout", "preempt": "preempted",
                                  "fence": "killed"}[how]
        assert not any(alive(p) for p in pids)
        assert ex.cgroups.jobs() == []           # removed once empty
    finally:
        await confined.cleanup()


async def test_over_its_memory_limit_a_job_ends_out_of_memory_and_its_neighbour_runs_on(confined):
    ex = confined.confined_executor("memory")
    await ex.start()
    try:
        await ex.launch(confined.launch(f"{PY} -c 'import time; b = b\"x\" * (1 << 30); time.sleep(60)'\n",
                                        job_id=1, mem_mb=100))
        await ex.launch(confined.launch(f"{PY} -c 'b = b\"x\" * (50 << 20)'\necho neighbour ok\n",
                                        job_id=2, mem_mb=200))
        oom = await confined.outcome(1)
        assert (oom.reason, oom.exit_code, oom.signal) == ("oom", 0, 125)
        assert "out of memory" in oom.message and "100 MB" in oom.message
        assert oom.max_rss is not None and oom.max_rss <= 101 << 20
        neighbour = await confined.outcome(2)
        assert (neighbour.reason, neighbour.exit_code) == ("exited", 0)
        assert "neighbour ok" in read(confined.work_dir / "gpud-2.out")
    finally:
        await confined.cleanup()


async def test_max_rss_is_what_the_job_touched(confined):
    ex = confined.confined_executor("memory")
    await ex.start()
    try:
        await ex.launch(confined.launch(f"{PY} -c 'b = b\"x\" * (300 << 20)'\n", mem_mb=1024))
        outcome = await confined.outcome(1)
        assert (outcome.reason, outcome.exit_code) == ("exited", 0)
        assert abs(outcome.max_rss - (300 << 20)) <= 0.1 * (300 << 20), outcome.max_rss
    finally:
        await confined.cleanup()


async def test_a_job_cannot_widen_its_cpus(confined):
    ex = confined.confined_executor("cpuset")
    host = sorted(os.sched_getaffinity(0))
    ex.cpu_binder = CpuBinder({0: host}, {})
    await ex.start()
    try:
        script = (f"{PY} -c 'import os\n"
                  "try: os.sched_setaffinity(0, range(os.cpu_count()))\n"
                  "except OSError as e: print(\"refused\", e)\n"
                  "print(\"cpus\", sorted(os.sched_getaffinity(0)))'\n")
        await ex.launch(confined.launch(script, cpus=1))
        await confined.outcome(1)
        cpus = eval(read(confined.work_dir / "gpud-1.out").split("cpus", 1)[1])
        assert len(cpus) == 1 and cpus[0] in host
    finally:
        await confined.cleanup()


async def test_a_fork_loop_stops_at_pids_max_and_the_worker_keeps_serving(confined):
    ex = confined.confined_executor("pids")
    ex.max_tasks = 24
    await ex.start()
    try:
        script = (f"{PY} -c 'import os, time\n"
                  "n = 0\n"
                  "while n < 1000:\n"
                  "    try: pid = os.fork()\n"
                  "    except OSError as e: print(\"stopped at\", n, e.strerror, flush=True); break\n"
                  "    if pid == 0: time.sleep(1000); os._exit(0)\n"
                  "    n += 1\n'\n")
        await ex.launch(confined.launch(script, job_id=1))
        first = await confined.outcome(1)
        assert first.exit_code == 0
        out = read(confined.work_dir / "gpud-1.out")
        stopped = int(out.split("stopped at", 1)[1].split()[0])
        assert 0 < stopped < 24      # bash and python count too
        await ex.launch(confined.launch("echo still serving\n", job_id=2))
        assert (await confined.outcome(2)).exit_code == 0
        assert "still serving" in read(confined.work_dir / "gpud-2.out")
    finally:
        await confined.cleanup()


OPEN_ALL = (f"unset CUDA_VISIBLE_DEVICES\n{PY} -c '\n"
            "import errno, os, sys\n"
            "for p in sys.argv[1:]:\n"
            "    try: os.close(os.open(p, os.O_RDWR)); r = \"ok\"\n"
            "    except OSError as e: r = errno.errorcode[e.errno]\n"
            "    print(os.path.basename(p), r)' ")


async def test_a_job_opens_only_its_own_gpu_device_nodes(confined, tmp_path):
    ex = confined.confined_executor("devices")
    backend = SimBackend("4xH100-80GB", "node7", devices_dir=str(tmp_path / "dev"))
    ex.gpu_devices = backend.devices
    await ex.start()
    try:
        nodes = " ".join(str(tmp_path / "dev" / f"nvidia{i}") for i in (0, 1, 2, 3))
        gpus = [{"index": i, "uuid": g.uuid} for i, g in enumerate(backend.discover()) if i in (1, 2)]
        await ex.launch(confined.launch(OPEN_ALL + nodes + f" {tmp_path}/dev/nvidiactl\n", gpus=gpus))
        await confined.outcome(1)
        got = dict(line.split() for line in read(confined.work_dir / "gpud-1.out").splitlines())
        # no driver answers behind the sim's nodes: ENXIO is "the fence let it through"
        assert got == {"nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidia2": "ENXIO", "nvidia3": "EPERM",
                       "nvidiactl": "ENXIO"}
    finally:
        await confined.cleanup()


async def test_a_mig_slice_job_opens_only_its_own_caps(confined, tmp_path):
    ex = confined.confined_executor("devices")
    backend = SimBackend("1xH100-80GB", "node7", devices_dir=str(tmp_path / "dev"))
    backend.set_mig_mode(0, True)
    mine = backend.create_slice(0, "1g.10gb", 0)
    other = backend.create_slice(0, "1g.10gb", 1)
    ex.gpu_devices = backend.devices
    await ex.start()
    try:
        caps = backend.devices().caps
        paths = [f"{tmp_path}/dev/nvidia-caps/nvidia-cap{m}" for m in caps[(0, 0)] + caps[(0, 1)]]
        gpus = [{"index": 0, "uuid": mine.uuid, "kind": "mig", "slice_start": 0, "profile": "1g.10gb"}]
        await ex.launch(confined.launch(OPEN_ALL + " ".join(paths) + "\n", gpus=gpus))
        await confined.outcome(1)
        got = dict(line.split() for line in read(confined.work_dir / "gpud-1.out").splitlines())
        own = {f"nvidia-cap{m}" for m in caps[(0, 0)]}
        assert {k for k, v in got.items() if v != "EPERM"} == own
        assert other.uuid != mine.uuid and len(got) == 4
    finally:
        await confined.cleanup()


async def test_a_restarted_executor_adopts_confined_jobs_and_kills_them_whole(confined):
    first = confined.confined_executor("freezer")
    await first.start()
    await first.launch(confined.launch(ESCAPEES, kill_grace=0))
    await confined.output("gpud-1.out", "ready")
    pids = [int(p) for p in read(confined.work_dir / "escapee.pids").split()]
    await first.close()
    second = confined.executor()
    second.cgroups = first.cgroups
    await second.start()
    try:
        assert second.running() == [(1, 0)] and all(alive(p) for p in pids)
        assert second.usage(1, 0) is not None
        await second.signal(1, 0, "TERM", grace=0, reason="cancelled")
        assert (await confined.outcome(1)).reason == "cancelled"
        assert not any(alive(p) for p in pids)
    finally:
        await confined.cleanup()


async def test_a_cgroup_no_job_claims_is_emptied_at_start(confined):
    ex = confined.confined_executor("freezer")
    c = ex.cgroups
    c.create("job_99_0", cg.Limits())
    procs = c.step("job_99_0", "batch")
    child = await asyncio.create_subprocess_exec(
        PY, "-c", f"import os, time\nfor p in {procs!r}: open(p, 'w').write(str(os.getpid()))\nprint('in', flush=True)\n"
                  "time.sleep(1000)", stdout=asyncio.subprocess.PIPE)
    assert (await child.stdout.readline()).strip() == b"in"
    await ex.start()
    try:
        assert await asyncio.wait_for(child.wait(), 30) == -signal.SIGKILL
        await until(lambda: c.jobs() == [], what="the orphan cgroup removed")
    finally:
        await confined.cleanup()


# -- the v2 adapter for real: this host's unified hierarchy (no controllers on a hybrid host,
# but cgroup.kill, cgroup.events and device programs work there) ------------------------------

UNIFIED = "/sys/fs/cgroup/unified"


def v2_or_skip() -> cg.Cgroups:
    if os.geteuid() != 0:
        pytest.skip("confinement needs root")
    mount = UNIFIED if os.path.exists(UNIFIED + "/cgroup.procs") else "/sys/fs/cgroup"
    if not os.path.exists(mount + "/cgroup.controllers"):
        pytest.skip("no cgroup v2 hierarchy here")
    try:
        return V2.setup(f"gpud-test-{uuid.uuid4().hex[:8]}", mount, self_cgroup="/")
    except OSError as e:
        pytest.skip(f"cannot make cgroups in {mount}: {e}")


async def test_v2_for_real_kills_the_whole_job_and_fences_devices(tmp_path):
    c = v2_or_skip()
    h = Harness(tmp_path)
    ex = h.executor()
    ex.cgroups = c
    backend = SimBackend("4xH100-80GB", "node7", devices_dir=str(tmp_path / "dev"))
    ex.gpu_devices = backend.devices
    await ex.start()
    try:
        nodes = " ".join(str(tmp_path / "dev" / f"nvidia{i}") for i in range(4))
        gpus = [{"index": 3, "uuid": backend.discover()[3].uuid}]
        await ex.launch(h.launch(OPEN_ALL + nodes + "\n" + ESCAPEES, gpus=gpus, kill_grace=0))
        await until(lambda: "ready" in read(h.work_dir / "gpud-1.out") or h.finished, what="the job")
        if h.finished:
            pytest.skip(f"bpf device programs unavailable here: {h.finished[0].message}")
        got = dict(line.split() for line in read(h.work_dir / "gpud-1.out").splitlines()[:4])
        assert got == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidia2": "EPERM", "nvidia3": "ENXIO"}
        pids = [int(p) for p in read(h.work_dir / "escapee.pids").split()]
        assert set(pids) <= set(c.pids("job_1_0"))
        await ex.signal(1, 0, "TERM", grace=0, reason="cancelled")
        assert (await h.outcome(1)).reason == "cancelled"
        assert not any(alive(p) for p in pids) and c.jobs() == []
    finally:
        await h.cleanup()
        c.close()
