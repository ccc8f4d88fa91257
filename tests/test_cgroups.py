"""gpud.worker.cgroups and its backends (cgroup_v2, cgroup_v1): the v2 adapter against the fake
v2 filesystem, the device program through an interpreter, detection, and the real BPF attach on
this host's unified hierarchy."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpud.gpu.devices import GpuDevices
from gpud.worker import bpfdev, cgroup_v1, cgroup_v2
from gpud.worker import cgroups as cg
from tests.fake_cgroup2 import FakeCgroup2, run_device_program

MOUNT = "/sys/fs/cgroup"
UNIT = MOUNT + "/system.slice/gpud-worker.service"
CHAR, BLOCK = 2, 1


def delegate(fake: FakeCgroup2, controllers: str, pids=(100, 101)) -> None:
    """What systemd does for a Delegate=yes unit: the controllers down to it, the unit's processes in it."""
    for p in ("", "/system.slice"):
        fake.mkpath(MOUNT + p)
        fake.write(MOUNT + p + "/cgroup.subtree_control", controllers)
    fake.mkpath(UNIT, pids)


def v2(fake: FakeCgroup2, pids=(100, 101)) -> cgroup_v2.V2:
    delegate(fake, "+memory +pids +cpuset", pids)
    return cgroup_v2.V2.setup("gpud-n1-abc", MOUNT, fake, self_cgroup="/system.slice/gpud-worker.service",
                       pid=100, attach=fake.attach)


def test_v2_worker_moves_to_a_leaf_and_the_subtree_gets_controllers():
    fake = FakeCgroup2()
    c = v2(fake)
    assert fake.where(100) == UNIT + "/worker" and fake.where(101) == UNIT + "/worker"
    assert c.base == UNIT + "/gpud-n1-abc"
    assert fake.read(c.base + "/cgroup.subtree_control").split() == ["cpuset", "memory", "pids"]
    assert c.missing == []
    # started again (systemd puts the new worker in the leaf, DelegateSubgroup=worker)
    again = cgroup_v2.V2.setup("gpud-n1-abc", MOUNT, fake, self_cgroup="/system.slice/gpud-worker.service/worker",
                        pid=102, attach=fake.attach)
    assert again.base == c.base


def test_v2_job_limits_steps_kill_and_removal():
    fake = FakeCgroup2()
    c = v2(fake)
    fence = GpuDevices(minors={0: 0, 1: 1, 2: 2, 3: 3}).allowed([(1, None), (2, None)])
    c.create("job_7_0", cg.Limits(cpus=(2, 3), mem_bytes=100 << 20, pids_max=64, devices=fence))
    job = c.base + "/job_7_0"
    assert fake.read(job + "/memory.max") == str(100 << 20)
    assert fake.read(job + "/memory.swap.max") == "0"
    assert fake.read(job + "/cpuset.cpus") == "2,3"
    assert fake.read(job + "/pids.max") == "64"
    procs = c.step("job_7_0", "batch")
    assert procs == [job + "/batch/cgroup.procs"]
    fake.write(procs[0], "500")          # what the wrapper's child does
    fake.write(c.step("job_7_0", "step_0")[0], "501")
    assert c.populated("job_7_0") and sorted(c.pids("job_7_0")) == [500, 501]
    assert c.jobs() == ["job_7_0"]
    assert not c.remove("job_7_0")       # busy while processes remain
    c.kill("job_7_0")
    assert fake.killed == [500, 501] and not c.populated("job_7_0")
    assert c.remove("job_7_0") and c.jobs() == []
    assert job not in fake.programs


def test_v2_usage_reads_peak_cpu_and_oom_kills():
    fake = FakeCgroup2()
    c = v2(fake)
    c.create("job_1_0", cg.Limits(mem_bytes=1 << 30))
    job = c.base + "/job_1_0"
    fake.write(job + "/memory.peak", str(300 << 20))
    fake.write(job + "/cpu.stat", "usage_usec 20000000\nuser_usec 19000000\n")
    fake.write(job + "/memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert c.usage("job_1_0") == cg.Usage(300 << 20, 20_000_000, 1)


def test_v2_without_cgroup_kill_freezes_kills_and_thaws(monkeypatch):
    fake = FakeCgroup2(kill_file=False)
    c = v2(fake)
    c.create("job_1_0", cg.Limits())
    fake.write(c.step("job_1_0", "batch")[0], "700")
    killed = []
    monkeypatch.setattr(cgroup_v2, "sigkill", killed.append)
    c.kill("job_1_0")
    freezes = [t for p, t in fake.writes if p.endswith("job_1_0/cgroup.freeze")]
    assert killed == [700] and freezes == ["1", "0"]


def test_v2_missing_controllers_are_reported_and_limits_skipped():
    fake = FakeCgroup2(controllers=("pids",))
    delegate(fake, "+pids", (100,))
    c = cgroup_v2.V2.setup("t", MOUNT, fake, self_cgroup="/system.slice/gpud-worker.service", pid=100,
                    attach=fake.attach)
    assert c.missing == ["memory", "cpuset"]
    c.create("job_1_0", cg.Limits(cpus=(0,), mem_bytes=1 << 20, pids_max=10))
    assert fake.read(c.base + "/job_1_0/pids.max") == "10"
    assert "memory" in c.describe()


def test_device_program_allows_own_gpus_and_control_nodes_only():
    devices = GpuDevices(minors={0: 0, 1: 1, 2: 2, 3: 3}, caps={(0, 0): (3, 4), (0, 4): (5, 6)}, caps_major=237)
    prog = bpfdev.device_program(devices.allowed([(1, None), (0, 4)]))
    allowed = lambda t, ma, mi: run_device_program(prog, t, ma, mi) == 1  # noqa: E731
    assert allowed(CHAR, 195, 1) and allowed(CHAR, 195, 0)   # its GPU, and the MIG slice's GPU
    assert not allowed(CHAR, 195, 2) and not allowed(CHAR, 195, 3) and not allowed(CHAR, 195, 7)
    assert allowed(CHAR, 195, 255) and allowed(CHAR, 195, 254)      # nvidiactl, nvidia-modeset
    assert allowed(CHAR, 237, 5) and allowed(CHAR, 237, 6)           # its slice's caps
    assert not allowed(CHAR, 237, 3) and not allowed(CHAR, 237, 1)   # another slice's, config
    assert allowed(CHAR, 1, 3) and allowed(CHAR, 136, 0) and allowed(CHAR, 510, 0)  # null, pts, uvm
    assert allowed(BLOCK, 195, 2)                                    # a block device is no GPU


def test_device_program_for_no_gpu_denies_every_gpu():
    prog = bpfdev.device_program(GpuDevices(minors={0: 0, 1: 1}).allowed([]))
    assert [run_device_program(prog, CHAR, 195, m) for m in (0, 1, 255)] == [0, 0, 1]


def test_v2_attaches_the_program_to_the_job_cgroup():
    fake = FakeCgroup2()
    c = v2(fake)
    fence = GpuDevices(minors={0: 0, 1: 1}).allowed([(0, None)])
    c.create("job_2_0", cg.Limits(devices=fence))
    prog = fake.programs[c.base + "/job_2_0"]
    assert run_device_program(prog, CHAR, 195, 0) == 1 and run_device_program(prog, CHAR, 195, 1) == 0


class RecordingFs:
    """Plain directories whose files are whatever was last written (v1's cpuset files start empty)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.dirs: set[str] = set()
        self.writes: list[tuple[str, str]] = []

    def read(self, path):
        return self.files.get(path, "0-3" if path.startswith("/cg/cpuset/cpuset.") else "")

    def write(self, path, text):
        self.writes.append((path, text))
        self.files[path] = text

    def exists(self, path):
        return path in self.dirs or path in self.files or path.endswith("memsw.limit_in_bytes")

    def mkdir(self, path):
        self.dirs.add(path)

    def rmdir(self, path):
        self.dirs.discard(path)

    def listdir(self, path):
        return []

    def isdir(self, path):
        return path in self.dirs


def test_v1_writes_limits_and_deny_lines_for_the_other_gpus_and_caps():
    fs = RecordingFs()
    bases = {c: f"/cg/{c}/gpud-t" for c in ("freezer", "memory", "cpuset", "pids", "devices", "cpuacct")}
    c = cgroup_v1.V1(bases, fs)
    devices = GpuDevices(minors={0: 0, 1: 1, 2: 2}, caps={(2, 0): (3, 4), (2, 1): (5, 6)}, caps_major=237)
    c.create("job_1_0", cg.Limits(cpus=(1,), mem_bytes=100 << 20, pids_max=64,
                                  devices=devices.allowed([(0, None), (2, 1)]), known_devices=tuple(devices.known())))
    denied = [t for p, t in fs.writes if p.endswith("devices.deny")]
    assert denied == ["c 195:1 rwm", "c 237:3 rwm", "c 237:4 rwm"]
    assert fs.files["/cg/memory/gpud-t/job_1_0/memory.limit_in_bytes"] == str(100 << 20)
    assert fs.files["/cg/memory/gpud-t/job_1_0/memory.memsw.limit_in_bytes"] == str(100 << 20)
    assert fs.files["/cg/cpuset/gpud-t/job_1_0/cpuset.cpus"] == "1"
    assert fs.files["/cg/pids/gpud-t/job_1_0/pids.max"] == "64"
    assert c.step("job_1_0", "batch") == [f"{b}/job_1_0/cgroup.procs" for b in bases.values()]
    assert c.steps("job_1_0") == ["batch"]


def test_detect_says_why_jobs_are_not_confined():
    assert cg.detect("off", "t").reason == 'turned off by [worker] cgroups = "off"'
    assert cg.detect("auto", "t", euid=1000).reason == "the worker does not run as root"
    none = cg.detect("v2", "t", euid=0, mount="/nonexistent")
    assert not none.active and "no cgroup v2 hierarchy" in none.reason
    assert "not confined" in none.describe()


def test_subtree_names_differ_per_state_dir():
    a, b = cg.subtree_name("n1", "/var/lib/gpud/worker/n1"), cg.subtree_name("n1", "/tmp/x/worker/n1")
    assert a != b and a.startswith("gpud-n1-") and a == cg.subtree_name("n1", "/var/lib/gpud/worker/n1")


# -- for real: the device program in this host's unified hierarchy -----------------------------

UNIFIED = "/sys/fs/cgroup/unified"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_real_bpf_device_program_fences_gpu_nodes(tmp_path):
    """The v2 program loaded with the bpf syscall and attached to a real cgroup: a process
    in it opens its own GPU's node (ENXIO: no driver answers) and gets EPERM on another."""
    mount = UNIFIED if os.path.exists(UNIFIED + "/cgroup.procs") else "/sys/fs/cgroup"
    if not os.path.exists(mount + "/cgroup.procs"):
        pytest.skip("no cgroup v2 hierarchy mounted")
    path = os.path.join(mount, f"gpud-test-{os.getpid()}")
    os.mkdir(path)
    try:
        for m in (0, 1):
            os.mknod(tmp_path / f"nvidia{m}", 0o666 | stat.S_IFCHR, os.makedev(195, m))
        try:
            program = bpfdev.device_program(GpuDevices(minors={0: 0, 1: 1}).allowed([(0, None)]))
            bpfdev.attach_device_program(path, program)
        except OSError as e:
            pytest.skip(f"bpf device programs unavailable here: {e}")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                with open(path + "/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
                for m in (0, 1):
                    try:
                        os.close(os.open(tmp_path / f"nvidia{m}", os.O_RDWR))
                        code |= 0
                    except OSError as e:
                        os.write(w, f"{m}:{errno.errorcode[e.errno]}\n".encode())
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        out = os.read(r, 1000).decode()
        os.close(r)
        assert out.split() == ["0:ENXIO", "1:EPERM"]
    finally:
        os.rmdir(path)


# -- the backends' device nodes ------------------------------------------------------------------

def test_nvml_backend_reads_minors_and_mig_caps(tmp_path):
    from gpud.gpu.nvml import NvmlBackend
    from tests.fake_pynvml import FakeMigSlice, FakeNvml

    nv = FakeNvml.machine(H100=3)
    nv.gpus[1].minor = 7   # minors need not follow indices
    nv.gpus[2].mig = [FakeMigSlice(uuid="MIG-a", memory_mib=10240, start=0, gi_id=9),
                      FakeMigSlice(uuid="MIG-b", memory_mib=10240, start=1, gi_id=10)]
    nv.write_mig_minors(str(tmp_path / "mig-minors"))
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n\nBlock devices:\n  8 sd\n")
    backend = NvmlBackend(nvml=nv)
    try:
        d = backend.devices(str(tmp_path / "mig-minors"), str(tmp_path / "devices"))
    finally:
        backend.close()
    assert d.minors == {0: 0, 1: 7, 2: 2}
    assert d.caps == {(2, 0): (3, 4), (2, 1): (5, 6)} and d.caps_major == 237
    assert d.paths[1] == "/dev/nvidia7"
    assert d.allowed([(1, None)])[195] == {7, 254, 255}
    assert d.allowed([(2, 1)]) == {195: frozenset({2, 254, 255}), 237: frozenset({5, 6})}


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_sim_backend_makes_device_nodes(tmp_path):
    from gpud.gpu.sim import SimBackend

    b = SimBackend("2xH100-80GB", "n1", devices_dir=str(tmp_path / "dev"))
    b.set_mig_mode(1, True)
    b.create_slice(1, "1g.10gb", 0)
    d = b.devices()
    nodes = {p.name: os.stat(p).st_rdev for p in (tmp_path / "dev").iterdir() if not p.is_dir()}
    assert nodes == {"nvidia0": os.makedev(195, 0), "nvidia1": os.makedev(195, 1),
                     "nvidiactl": os.makedev(195, 255)}
    caps = d.caps[(1, 0)]
    for m in caps:
        st = os.stat(tmp_path / "dev" / "nvidia-caps" / f"nvidia-cap{m}")
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(d.caps_major, m)
    assert b.devices() == d   # made once, then found as they are
    assert SimBackend("1xH100-80GB", "n1").devices() is None


def test_slurm_units():
    from gpuctl import format as fmt

    assert fmt.slurm_size(5056) == "5056K" and fmt.slurm_size(307200) == "300M"
    assert fmt.slurm_size(1 << 20) == "1G"
    assert fmt.slurm_cpu_time(20.004) == "00:20.004" and fmt.slurm_cpu_time(3725) == "01:02:05"
    assert fmt.slurm_cpu_time(90061) == "1-01:01:01"
    assert fmt.max_rss({"max_rss": 300 << 20}) == "300M" and fmt.max_rss({}) == ""


def test_a_step_cgroup_made_twice_is_the_same_one():
    """Two tasks of one srun step on a node ask for its cgroup at once."""
    fake = FakeCgroup2()
    c = v2(fake)
    c.create("job_3_0", cg.Limits())
    c.create("job_3_0", cg.Limits())   # adopted and created again: no error either
    assert c.step("job_3_0", "step_0") == c.step("job_3_0", "step_0")
