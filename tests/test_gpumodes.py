"""Per-GPU sharing modes on a worker: the gpu_modes setting, applying it idempotently, the
head's mig commands, and what launches on shared GPUs get."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.bus.messages import MessageError, MigRelayout
from gpud.gpu import mig
from gpud.gpu.mps import MpsDaemons, MpsError, StubRunner
from gpud.gpu.nvml import NvmlBackend
from gpud.gpu.sim import SimBackend
from gpud.gpu.modes import UNMANAGED, WHOLE, GpuMode, modes_for, parse_gpu_modes, parse_mode, parse_selector
from gpud.worker.gpumodes import GpuModes, LaunchRefused, SliceNeed, devices_in_use, slices_needed
from gpud.worker.launch import Launch
from tests.fake_pynvml import FakeNvml

NOW = 1_700_000_000.0
INTERVAL = 600.0


# -- the config form ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, mode", [
    ("whole", WHOLE),
    ("mig:dynamic", GpuMode("mig", dynamic=True)),
    ("MIG:All-1g.10gb", GpuMode("mig", layout="all-1g.10gb")),
    ("mig:all-balanced", GpuMode("mig", layout="all-balanced")),
    ("mig:all-1g.10gb.me", GpuMode("mig", layout="all-1g.10gb.me")),
    ("mps", GpuMode("mps")),
    ("mps:max_clients=16,thread_percentage=25", GpuMode("mps", max_clients=16, thread_percentage=25)),
    ("timeslice:4", GpuMode("timeslice", replicas=4)),
])
def test_modes(text, mode):
    assert parse_mode(text) == mode


@pytest.mark.parametrize("text, words", [
    ("mig", "unknown MIG layout ''"), ("mig:all-9g.1gb", "unknown MIG layout"),
    ("mps:max_clients=49", "max_clients must be 1-48"), ("mps:thread_percentage=0", "1-100"),
    ("mps:clients=4", "mps takes max_clients=N"), ("timeslice", "timeslice needs the number"),
    ("timeslice:0", "timeslice needs"), ("shared", "unknown GPU mode 'shared'"), (4, "must be a string"),
    ("whole:2", "unknown GPU mode"),
])
def test_bad_modes_say_what_to_write(text, words):
    with pytest.raises(ValueError, match=words):
        parse_mode(text)


@pytest.mark.parametrize("key, parsed", [
    ("*", (None, None)), ("3", (None, {3})), ("0-3", (None, {0, 1, 2, 3})),
    ("0,2,4-5", (None, {0, 2, 4, 5})), ("gpu07:1", ("gpu07", {1})), ("n-1.x:*", ("n-1.x", None)),
])
def test_selectors(key, parsed):
    node, indexes = parse_selector(key)
    assert (node, None if indexes is None else set(indexes)) == parsed


@pytest.mark.parametrize("key", ["", "a", "3-1", "-1", "0-2000", "bad node:1", ":1", "1,,2"])
def test_bad_selectors(key):
    with pytest.raises(ValueError):
        parse_selector(key)


def test_gpu_modes_table_names_each_gpu_once():
    assert parse_gpu_modes({"0-3": "mig:dynamic", "n1:2": "mps", "*": "timeslice:2"}) == {
        "0-3": "mig:dynamic", "n1:2": "mps", "*": "timeslice:2"}
    with pytest.raises(ValueError, match="GPU 2 is in both '0-3' and '2'"):
        parse_gpu_modes({"0-3": "mig:dynamic", "2": "mps"})
    with pytest.raises(ValueError, match="'4': unknown GPU mode"):
        parse_gpu_modes({"4": "bogus"})
    with pytest.raises(ValueError, match="must be a table"):
        parse_gpu_modes(["0", "mps"])


def test_a_nodes_own_entries_win_and_an_index_beats_star():
    table = {"*": "timeslice:2", "0-1": "mig:dynamic", "n1:1": "mps", "n1:*": "whole", "n2:0": "mps"}
    assert modes_for(table, "n1", range(3)) == {0: WHOLE, 1: GpuMode("mps"), 2: WHOLE}
    assert modes_for(table, "n3", range(3)) == {0: GpuMode("mig", dynamic=True),
                                                1: GpuMode("mig", dynamic=True),
                                                2: GpuMode("timeslice", replicas=2)}
    assert modes_for({}, "n1", range(2)) == {0: UNMANAGED, 1: UNMANAGED}


# -- applying modes at start ----------------------------------------------------------------------

class Recording:
    """A backend that records the changes made through it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.changes = inner, []
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_slice(self, index, profile, start):
        self.changes.append(("create", index, profile, start))
        return self.inner.create_slice(index, profile, start)

    def destroy_slice(self, index, start):
        self.changes.append(("destroy", index, start))
        return self.inner.destroy_slice(index, start)

    def set_mig_mode(self, index, enabled):
        self.changes.append(("mode", index, enabled))
        return self.inner.set_mig_mode(index, enabled)


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def manager(backend, table: dict[str, str], node: str = "n1", clock: Clock | None = None,
            mps: MpsDaemons | None = None) -> GpuModes:
    indexes = [g.index for g in backend.discover()]
    return GpuModes(backend, modes_for(parse_gpu_modes(table), node, indexes), mps=mps,
                    min_interval=INTERVAL, clock=clock or Clock())


def layout(m: GpuModes, index: int) -> list[tuple[str, int]]:
    return [(s.profile, s.start) for s in m.infos()[index].slices]


@pytest.fixture(params=["sim", "nvml"])
def backend(request):
    if request.param == "sim":
        return Recording(SimBackend("2xA100-80GB,1xH100-80GB,1xL40S-48GB", "n1"))
    return Recording(NvmlBackend(nvml=FakeNvml.machine(host="n1", A100=2, H100=1, L40S=1)))


def test_static_layout_at_start_and_again_changes_nothing_the_second_time(backend):
    table = {"0": "mig:all-1g.10gb", "1": "mig:all-balanced", "2": "mig:dynamic"}
    m = manager(backend, table)
    m.apply_at_start()
    assert layout(m, 0) == [("1g.10gb", s) for s in range(7)]
    assert layout(m, 1) == [(s.profile, s.start) for s in mig.named_layout("A100-80GB", "all-balanced")]
    info = m.infos()
    assert [g.mode for g in info] == ["mig", "mig", "mig", "whole"]
    assert [g.dynamic for g in info] == [False, False, True, False]
    assert info[2].slices == () and all(s.uuid.startswith("MIG-") for s in info[0].slices)
    backend.changes.clear()
    again = manager(backend, table)         # a worker restart on the same hardware
    again.apply_at_start()
    assert backend.changes == []
    assert again.infos() == info


def test_start_changes_only_the_difference(backend):
    backend.set_mig_mode(0, True)
    for p, s in (("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)):
        backend.create_slice(0, p, s)
    backend.changes.clear()
    m = manager(backend, {"0": "mig:all-1g.10gb"})
    m.apply_at_start()
    # 1g at 4, 5, 6 stay; the 3g goes and 1g are created at 0-3.
    assert backend.changes == [("destroy", 0, 0)] + [("create", 0, "1g.10gb", s) for s in range(4)]
    assert layout(m, 0) == [("1g.10gb", s) for s in range(7)]


def test_a_busy_slice_holds_a_layout_back_until_its_job_ends(backend):
    backend.set_mig_mode(0, True)
    backend.create_slice(0, "3g.40gb", 0)
    backend.create_slice(0, "3g.40gb", 4)
    busy = {(0, 4)}
    m = manager(backend, {"0": "mig:all-1g.10gb"})
    m.apply_at_start(busy)
    assert layout(m, 0) == [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]
    assert not m.converge(busy)                 # still busy: nothing to do
    assert m.converge(set())                    # the job ended
    assert layout(m, 0) == [("1g.10gb", s) for s in range(7)]


def test_whole_gpus_leave_mig_once_their_slices_are_free(backend):
    backend.set_mig_mode(0, True)
    backend.create_slice(0, "4g.40gb", 0)
    backend.create_slice(0, "3g.40gb", 4)
    m = manager(backend, {"0": "whole"})
    m.apply_at_start({(0, 4)})
    assert m.infos()[0].mode == "mig" and layout(m, 0) == [("3g.40gb", 4)]
    assert m.converge(set())
    assert m.infos()[0].mode == "whole" and backend.mig_state(0) == (False, ())


def test_a_gpu_not_named_is_left_in_mig_as_found(backend, caplog):
    backend.set_mig_mode(1, True)
    backend.create_slice(1, "7g.80gb", 0)
    backend.changes.clear()
    m = manager(backend, {"0": "whole"})
    with caplog.at_level(logging.INFO):
        m.apply_at_start()
    assert backend.changes == []
    g = m.infos()[1]
    assert (g.mode, g.dynamic, layout(m, 1)) == ("mig", False, [("7g.80gb", 0)])
    assert "GPU 1 is in MIG mode and gpu_modes does not name it" in caplog.text


def test_dynamic_gpu_gets_back_the_slices_surviving_jobs_hold(backend):
    m = manager(backend, {"2": "mig:dynamic"})
    m.apply_at_start({(2, 4)}, [SliceNeed(2, "3g.40gb", 4)])
    assert layout(m, 2) == [("3g.40gb", 4)]
    assert m.infos()[2].dynamic


def test_mig_on_a_gpu_without_it_is_logged_and_the_gpu_stays_whole(backend, caplog):
    m = manager(backend, {"3": "mig:dynamic", "0": "mig:all-1g.6gb"})
    m.apply_at_start()
    assert [g.mode for g in m.infos()] == ["whole", "whole", "whole", "whole"]
    assert "GPU 3: GPU model 'L40S-48GB' does not support MIG" in caplog.text
    assert "GPU 0: unknown MIG layout 'all-1g.6gb' for A100-80GB" in caplog.text


def test_mps_and_timeslice_are_reported_with_their_settings(backend):
    m = manager(backend, {"0": "mps:max_clients=8,thread_percentage=50", "1": "timeslice:3"})
    m.apply_at_start()
    a, b = m.infos()[:2]
    assert (a.mode, a.mps_max_clients, a.mps_thread_percentage) == ("mps", 8, 50)
    assert (b.mode, b.replicas) == ("timeslice", 3)


def test_hopper_forgets_mig_at_reboot_and_the_worker_sets_it_again():
    fake = FakeNvml.machine(host="n1", H100=1)
    b = NvmlBackend(nvml=fake)
    manager(b, {"0": "mig:all-3g.40gb"}).apply_at_start()
    fake.reboot()
    assert b.mig_state(0) == (False, ())
    m = manager(b, {"0": "mig:all-3g.40gb"})
    m.apply_at_start()
    assert layout(m, 0) == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_a_mode_waiting_for_a_reset_runs_nothing(caplog):
    fake = FakeNvml.machine(host="n1", A100=1)
    fake.gpus[0].reset_blocked = True
    m = manager(NvmlBackend(nvml=fake), {"0": "mig:dynamic"})
    m.apply_at_start()
    g = m.infos()[0]
    assert (g.mode, g.dynamic, g.slices) == ("mig", False, ())
    assert "pending a GPU reset" in caplog.text and "until then the GPU runs nothing" in caplog.text


# -- the head's mig command -------------------------------------------------------------------------

def relayout(m: GpuModes, body: dict, in_use):
    """A mig command as the worker gets it: decoded, then applied."""
    return m.apply_command(MigRelayout.from_body(body), in_use)


def dynamic(backend, clock=None) -> GpuModes:
    m = manager(backend, {"0": "mig:dynamic"}, clock=clock)
    m.apply_at_start()
    return m


def test_create_at_free_placements(backend):
    m = dynamic(backend)
    r = relayout(m, {"gpu": 0, "destroy": [], "create": [{"profile": "1g.10gb", "start": s}
                                                        for s in range(7)], "reason": "demand"}, set())
    assert r.changed and not r.refused
    assert layout(m, 0) == [("1g.10gb", s) for s in range(7)]
    assert m.infos()[0].relaid_at is None       # nothing destroyed: not a re-layout that counts


def test_re_layout_keeps_running_slices_untouched(backend):
    m = dynamic(backend)
    relayout(m, {"gpu": 0, "create": [{"profile": "1g.10gb", "start": s} for s in range(7)]}, set())
    keep = {s.start: s.uuid for s in m.infos()[0].slices if s.start >= 4}
    backend.changes.clear()
    r = relayout(m, {"gpu": 0, "destroy": [0, 1, 2, 3], "create": [{"profile": "3g.40gb", "start": 0}]},
                 {(0, 4), (0, 5), (0, 6)})
    assert r.changed and not r.refused, r.message
    assert backend.changes == [("destroy", 0, s) for s in range(4)] + [("create", 0, "3g.40gb", 0)]
    assert {s.start: s.uuid for s in m.infos()[0].slices if s.start >= 4} == keep
    assert m.infos()[0].relaid_at == NOW


def test_a_command_that_would_destroy_a_busy_slice_is_refused_whole(backend):
    m = dynamic(backend)
    relayout(m, {"gpu": 0, "create": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]},
             set())
    before = m.infos()
    backend.changes.clear()
    r = relayout(m, {"gpu": 0, "destroy": [0, 4], "create": [{"profile": "7g.80gb", "start": 0}]}, {(0, 4)})
    assert r.refused and not r.changed
    assert r.message == "GPU 0: will not destroy the MIG slice(s) at slot 4: running jobs use them"
    assert backend.changes == [] and m.infos() == before


def test_invalid_layouts_and_static_gpus_are_refused(backend):
    m = dynamic(backend)
    r = relayout(m, {"gpu": 0, "create": [{"profile": "4g.40gb", "start": 0},
                                         {"profile": "4g.40gb", "start": 4}]}, set())
    assert r.refused and "invalid" in r.message and backend.changes[-1][0] == "mode"
    s = manager(backend, {"1": "mig:all-1g.10gb"})
    s.apply_at_start()
    r = relayout(s, {"gpu": 1, "destroy": [0]}, set())
    assert r.refused and r.message == "GPU 1 is not a dynamic MIG GPU here"


def test_a_repeated_command_does_nothing(backend):
    m = dynamic(backend)
    body = {"gpu": 0, "destroy": [], "create": [{"profile": "2g.20gb", "start": 2}]}
    relayout(m, body, set())
    backend.changes.clear()
    r = relayout(m, body, set())
    assert (r.changed, r.refused, r.message) == (False, False, "GPU 0: the layout is already as asked")
    assert backend.changes == []


def test_destroying_re_layouts_keep_the_minimum_interval(backend):
    clock = Clock()
    m = dynamic(backend, clock)
    one = {"gpu": 0, "destroy": [], "create": [{"profile": "7g.80gb", "start": 0}]}
    to_small = {"gpu": 0, "destroy": [0], "create": [{"profile": "1g.10gb", "start": s} for s in range(7)]}
    to_big = {"gpu": 0, "destroy": list(range(7)), "create": [{"profile": "7g.80gb", "start": 0}]}
    assert relayout(m, one, set()).changed
    assert relayout(m, to_small, set()).changed        # the first destroying re-layout
    clock.t += INTERVAL / 2
    r = relayout(m, to_big, set())
    assert r.refused and "under the minimum interval of 600s" in r.message
    assert layout(m, 0) == [("1g.10gb", s) for s in range(7)]
    clock.t += INTERVAL / 2
    assert relayout(m, to_big, set()).changed
    assert m.infos()[0].relaid_at == clock.t


def test_the_last_re_layout_time_survives_a_worker_restart(tmp_path):
    b = SimBackend("1xA100-80GB", "n1")
    path = str(tmp_path / "mig-relaid.json")
    table = modes_for(parse_gpu_modes({"0": "mig:dynamic"}), "n1", [0])
    m = GpuModes(b, table, min_interval=INTERVAL, clock=Clock(), relaid_file=path)
    m.apply_at_start()
    relayout(m, {"gpu": 0, "create": [{"profile": "7g.80gb", "start": 0}]}, set())
    relayout(m, {"gpu": 0, "destroy": [0], "create": [{"profile": "3g.40gb", "start": 0}]}, set())
    again = GpuModes(b, table, min_interval=INTERVAL, clock=Clock(NOW + 60), relaid_file=path)
    again.apply_at_start()
    assert again.infos()[0].relaid_at == NOW
    r = relayout(again, {"gpu": 0, "destroy": [0], "create": [{"profile": "7g.80gb", "start": 0}]}, set())
    assert r.refused and "re-laid 60s ago" in r.message
    (tmp_path / "mig-relaid.json").write_text("{not json")
    assert GpuModes(b, table, relaid_file=path).infos()[0].relaid_at is None


@pytest.mark.parametrize("body, words", [
    ({}, "no GPU None here"), ({"gpu": True}, "no GPU True"),
    ({"gpu": 0, "destroy": "0"}, "short lists"), ({"gpu": 0, "destroy": [-1]}, "not a memory slot"),
    ({"gpu": 0, "create": [{"profile": "1g.10gb"}]}, "start slot must be an integer"),
    ({"gpu": 0, "create": [5]}, "must be an object"), ({"gpu": 0, "reason": 5}, "reason"),
])
def test_malformed_commands_are_refused_in_one_line(body, words):
    with pytest.raises(MessageError) as e:
        MigRelayout.from_body(body)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("body, words", [
    ({"gpu": 9}, "no GPU 9"), ({"gpu": 0, "create": [{"profile": "1g.6gb", "start": 0}]}, "no MIG profile 1g.6gb"),
])
def test_commands_this_node_cannot_carry_out_are_refused_in_one_line(backend, body, words):
    r = relayout(dynamic(backend), body, set())
    assert r.refused and not r.changed and words in r.message and "\n" not in r.message


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["gpu", "destroy", "create", "reason"]),
                       st.one_of(st.none(), st.integers(-2, 9), st.text(max_size=5),
                                 st.lists(st.one_of(st.integers(-1, 8), st.dictionaries(
                                     st.sampled_from(["profile", "start"]),
                                     st.one_of(st.integers(-1, 8), st.sampled_from(["1g.10gb", "3g.40gb", "x"]))),
                                 ), max_size=4))))
def test_any_command_leaves_a_valid_layout_and_never_raises(body):
    m = dynamic(SimBackend("1xA100-80GB", "n1"))
    relayout(m, {"gpu": 0, "create": [{"profile": "1g.10gb", "start": 6}]}, set())
    try:
        relayout(m, body, {(0, 6)})
    except MessageError:
        pass   # refused before it reaches the GPUs
    slices = m.infos()[0].slices
    mig.validate_layout("A100-80GB", [mig.Slice(s.profile, s.start) for s in slices])
    assert ("1g.10gb", 6) in [(s.profile, s.start) for s in slices]


# -- launches ------------------------------------------------------------------------------------

def launch(job: int, gpus: list[dict], user: str = "alice") -> Launch:
    return Launch.from_body({
        "job_id": job, "attempt": 1, "name": "j", "user": user, "uid": 1000, "gid": 1000,
        "script": "true", "work_dir": "/tmp", "gpus": gpus})


def test_slice_launches_must_name_a_slice_that_is_there():
    m = dynamic(SimBackend("1xA100-80GB", "n1"))
    relayout(m, {"gpu": 0, "create": [{"profile": "3g.40gb", "start": 4}]}, set())
    (s,) = m.infos()[0].slices
    good = launch(1, [{"index": 0, "uuid": s.uuid, "kind": "mig", "slice_start": 4, "profile": "3g.40gb"}])
    assert m.prepare_launch(good) is good
    assert devices_in_use([good]) == {(0, 4)}
    assert slices_needed([good]) == [SliceNeed(0, "3g.40gb", 4)]
    stale = launch(2, [{"index": 0, "uuid": "MIG-gone", "kind": "mig", "slice_start": 4}])
    with pytest.raises(LaunchRefused, match="MIG slice MIG-gone is not on GPU 0 here"):
        m.prepare_launch(stale)
    with pytest.raises(LaunchRefused, match="GPU 0 is in MIG mode here"):
        m.prepare_launch(launch(3, [{"index": 0, "uuid": "GPU-x"}]))


def test_mps_launches_get_their_environment_and_one_user_at_a_time(tmp_path):
    b = SimBackend("1xH100-80GB", "n1")
    runner = StubRunner()
    m = manager(b, {"0": "mps:thread_percentage=25"}, mps=MpsDaemons(str(tmp_path), runner))
    m.apply_at_start()
    uuid = b.discover()[0].uuid
    share = {"index": 0, "uuid": uuid, "kind": "mps", "mem_mb": 20480}
    got = m.prepare_launch(launch(1, [share]))
    assert got.extra_env == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "0" / "pipe"),
                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M"}
    with pytest.raises(MpsError, match="serves MPS jobs of alice"):
        m.prepare_launch(launch(2, [share], user="bob"))
    m.sync_mps([])
    assert runner.events == [("start", 0, "alice"), ("stop", 0, "alice")]


def test_pending_work_is_known_without_the_lock(backend):
    backend.set_mig_mode(0, True)
    backend.create_slice(0, "3g.40gb", 4)
    m = manager(backend, {"0": "mig:all-1g.10gb"})
    m.apply_at_start({(0, 4)})
    assert m.anything_pending()          # a busy slice holds the layout back
    assert m.converge(set())
    assert not m.anything_pending() and not m.converge(set())


def test_prepare_launch_now_decides_on_the_loop_only_what_cannot_block(tmp_path):
    m = manager(SimBackend("2xH100-80GB", "n1"), {})
    m.apply_at_start()
    whole = launch(1, [{"index": 0, "uuid": "GPU-x"}])
    assert m.prepare_launch_now(whole) is whole
    with pytest.raises(LaunchRefused, match="GPU 5 does not exist"):
        m.prepare_launch_now(launch(2, [{"index": 5, "uuid": "GPU-y"}]))
    assert m.prepare_launch_now(launch(3, [{"index": 0, "uuid": "GPU-x", "kind": "mps"}])) is None
    with m._lock:   # a re-layout in a thread holds it: the loop does not wait
        got = []
        t = threading.Thread(target=lambda: got.append(m.prepare_launch_now(whole)))
        t.start()
        t.join()
        assert got == [None]
