"""The wire contract (gpud.bus.messages): every kind survives the trip, and nothing malformed,
unknown, hostile or from a newer major version gets past ``decode`` as anything but one
``MessageError`` line."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.bus import messages as m
from gpud.bus.base import Will, wire
from gpud.bus.messages import KINDS, VERSION, MessageError, decode, encode
from gpud.model import GpuInfo, NodeInfo, SliceInfo

NODE = NodeInfo("n1", 64, 512_000, (GpuInfo(0, "GPU-a", "A100-80GB", 81920, mode="mig", dynamic=True,
                                            slices=(SliceInfo("3g.40gb", 4, "MIG-b", 40192),), numa_node=0,
                                            nvlink_peers=(1,)),
                                    GpuInfo(1, "GPU-c", "H100-80GB", 81559, relaid_at=1.5e9)),
                {"addr": "10.0.0.1", "features": "a100,ib"})

# One realistic message of every kind, optional fields filled in.
EXAMPLES: list[m.Body] = [
    m.Launch(job_id=7, attempt=2, name="train", user="alice", uid=1000, gid=1000, script="#!/bin/sh\ntrue\n",
             work_dir="/home/alice", stdout="out-%j.log", stderr=None, env={"PATH": "/bin", "EMPTY": ""},
             gpus=(m.GpuAssignment(0, "MIG-b", "mig", 4, 40192, "3g.40gb"), m.GpuAssignment(1, "GPU-c"),
                   m.GpuAssignment(2, "GPU-d", "mps", mem_mb=20480)),
             cpus=8, mem_mb=65536, time_limit=3600.0, kill_grace=30.0, submit_dir="/home/alice",
             extra_env={"MASTER_PORT": "20007"}, rlimits={"NOFILE": (1024, 4096), "CORE": (-1, -1)},
             array_job_id=5, array_task_id=2, array_task_count=3, array_task_min=0, array_task_max=4,
             array_task_step=2, open_mode="append", slurm_compat_env=True, partition="gpu", account="phys",
             qos="high", cluster="c1", restart_count=1, warn_signal="USR1", warn_time=90.0, warn_batch=True,
             lease_seq=123456789),
    m.Lease(42, 10.0, ((7, 2), (8, 0)), ((7, 2, 3600.0), (8, 0, None))),
    m.Signal(7, 2, "USR1", 5.0, "preempted"),
    m.Signal(7, 2, 15, None, "cancelled"),
    m.Kill(((7, 2),), "fenced"),
    m.Ack(((7, 2), (8, 0))),
    m.Hello(),
    m.MigRelayout(0, (0, 1), (("3g.40gb", 0), ("1g.10gb", 6)), "demand", 600.0),
    m.TimeLimit(7, 2, 7200.0),
    m.TimeLimit(7, 2, None),
    m.StepStart(7, 2, 0, argv=("python", "train.py", ""), env={"FROM_SRUN": "1"}, ntasks_per_node=2,
                node_rank=1, nnodes=2, nodelist="n[1-2]", master_addr="10.0.0.1", master_port=27007,
                pty=False, stdin=True, rows=50, cols=132, rlimits={"NOFILE": (321, 4096), "CORE": (-1, -1)}),
    m.StepStart(7, 2, 1, argv=("true",), env={}, ntasks_per_node=1, node_rank=0, nnodes=1, nodelist="n1",
                master_addr="n1", master_port=27007),
    m.StepKill(7, 2, 0),
    m.StepAck(7, 2, 0, 17, resend=True),
    m.StepInput(7, 2, 0, "srun-1", 3, "typed\n\x03\xff", eof=True),
    m.StepResize(7, 2, 0, 40, 100),
    m.StepOutput(7, 2, 0, first=12, lines=((2, 1, "hello\n"), (3, 2, "oops\n"), (2, 3, "\x1b[0m")), seq=4,
                 input={"srun-1": 4}, tasks=2, pty=False),
    m.StepExit(7, 2, 0, rank=3, exit_code=1, signal=None, message="exited", next=14, tasks=2),
    m.StepExit(7, 2, 0, message="node n2 refused the step: job 7 does not run here"),
    m.Register(NODE),
    m.Heartbeat(12, ((7, 2),), ((6, 0),)),
    m.Heartbeat(None),
    m.Started(7, 2, 4242, 1.7e9),
    m.Finished(7, 2, 0, 9, "killed", 1.7e9, "killed by the head", 1 << 30, 12_000_000),
    m.Finished(7, 2, None, None, "launch_failed", 1.7e9, "no such user"),
    m.Samples(1.7e9, 5.0, ((0, 55.5, 1000, 300.25, 61.0, 1500.0), (1, None, None, None, None, None)),
              ((7, 2, (0, 1)),), ((0, "MIG-b", 512),), ((0, 4242, 512),), ((7, 2, "", 1 << 30, 5_000_000),)),
    m.Samples(1.7e9, 5.0, (), None),
    m.HeadStatus("online", "0.9.0", refresh=True),
    m.HeadStatus("offline"),
    m.NodeStatus("online"),
    m.Request("r-1", 0, 2, "{\"op\": \"submit\"", uid=1000, gid=1000, pid=99, user="alice", deadline=1.7e9),
    m.Reply("r-1", 1, 2, "}\n"),
]


def test_every_kind_has_an_example():
    assert {x.KIND for x in EXAMPLES} == set(KINDS)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: x.KIND)
def test_every_kind_survives_the_wire(msg):
    kind, body = encode(msg)
    assert kind == msg.KIND and body["v"] == VERSION
    wire_form = json.loads(json.dumps(body, allow_nan=False))   # what the envelope carries: lists, str keys
    assert decode(kind, wire_form) == msg
    assert type(msg).from_body(msg.to_body()) == msg


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: x.KIND)
def test_a_body_without_a_version_is_read_as_version_1(msg):
    """An older peer, still running during an upgrade, sends no version."""
    kind, body = encode(msg)
    del body["v"]
    assert decode(kind, json.loads(json.dumps(body))) == msg


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: x.KIND)
def test_keys_a_newer_minor_version_adds_are_ignored(msg):
    kind, body = encode(msg)
    assert decode(kind, {**body, "added_later": {"any": ["thing"]}}) == msg


# Bodies exactly as gpud sent them before the contract had classes (and older peers still do).
OLDER = [
    ("launch", {"job_id": 1, "attempt": 0, "name": "j", "user": "u", "uid": 1, "gid": 1, "script": "true",
                "work_dir": "/tmp", "stdout": None, "stderr": None, "env": {}, "rlimits": {},
                "gpus": [{"index": 0, "uuid": "GPU-x"}], "cpus": 1, "mem_mb": 0, "time_limit": None,
                "kill_grace": 30.0, "submit_dir": "/tmp", "extra_env": {}, "open_mode": None,
                "slurm_compat_env": False, "partition": "gpu", "account": "default", "qos": "normal",
                "cluster": "c", "restart_count": 0, "lease": {"seq": None}}),
    ("launch", {"job": 1, "attempt": 0, "user": "u", "uid": 1, "gid": 1, "script": "true", "work_dir": "/tmp"}),
    ("lease", {"seq": 5, "period": 60}),
    ("signal", {"job": 1, "attempt": 0}),
    ("kill", {"allocs": [[1, 0]]}),
    ("mig", {"gpu": 0, "destroy": [], "create": [{"profile": "7g.80gb", "start": 0}], "reason": "r"}),
    ("heartbeat", {"running": [[1, 0]], "done": []}),
    ("started", {"job": 1, "attempt": 0, "pid": 5, "time": 1.0}),
    ("finished", {"job": 1, "attempt": 0, "exit_code": 0, "signal": None, "reason": "exited", "time": 2.0,
                  "message": ""}),
    ("samples", {"t": 1.0, "iv": 5, "gpus": [[0, 50, 1000, 300, 60, 1500]]}),
    ("step_output", {"job": 1, "attempt": 0, "step": 0, "seq": 1, "lines": [[0, 1, "x\n"]]}),
    ("step_exit", {"job": 1, "attempt": 0, "step": 0, "rank": 0, "exit_code": 0, "signal": None, "message": None}),
    ("step", {"job": 1, "attempt": 0, "step": 0, "argv": ["true"], "env": {}, "ntasks_per_node": 1,
              "node_rank": 0, "nnodes": 1, "nodelist": "n1", "master_addr": "n1", "master_port": 20001}),
    ("head_status", {"state": "online", "version": "0.1"}),
    ("request", {"id": "r", "part": 0, "parts": 1, "data": "{}", "uid": 0, "gid": 0, "pid": 1, "deadline": 5.0}),
]


@pytest.mark.parametrize("kind, body", OLDER, ids=[k for k, _ in OLDER])
def test_what_older_peers_send_is_understood(kind, body):
    assert isinstance(decode(kind, body), KINDS[kind])


def test_the_sender_side_shapes_match_what_older_receivers_read():
    """Byte-compatible keys: an older peer reads a newer one's bodies by these names."""
    assert set(encode(m.Ack(((1, 0),)))[1]) == {"v", "done"}
    assert set(encode(m.HeadStatus("offline"))[1]) == {"v", "state"}
    assert set(encode(m.Heartbeat(3))[1]) == {"v", "seq", "running", "done"}
    launch = encode(EXAMPLES[0])[1]
    assert launch["job_id"] == 7 and launch["lease"] == {"seq": 123456789} and launch["gpus"][0]["kind"] == "mig"
    assert encode(m.Finished(1, 0, 0, None))[1].keys() == {"v", "job", "attempt", "exit_code", "signal", "reason",
                                                            "time", "message"}


def test_a_step_carries_sruns_limits_only_when_it_has_some():
    """``rlimits`` is optional: a step without limits sends no key, and one from an older
    head (no key) is read as none."""
    with_limits, without = (x for x in EXAMPLES if x.KIND == "step")
    body = encode(with_limits)[1]
    assert body["rlimits"] == {"NOFILE": [321, 4096], "CORE": [-1, -1]}
    assert decode("step", json.loads(json.dumps(body))).rlimits == {"NOFILE": (321, 4096), "CORE": (-1, -1)}
    assert "rlimits" not in encode(without)[1]
    older = dict(OLDER)["step"]
    assert decode("step", older).rlimits == {} and decode("step", {**older, "rlimits": None}).rlimits == {}


# -- refused ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, body, words", [
    ("frobnicate", {}, "unknown message kind 'frobnicate'"),
    (None, {}, "unknown message kind"),
    (["launch"], {}, "unknown message kind"),
    ("hello", None, "body must be an object"),
    ("hello", [], "body must be an object"),
    ("hello", {"v": 2}, "from a newer gpud (message version 2; this one reads 1)"),
    ("ack", {"v": 99, "done": []}, "newer gpud"),
    ("hello", {"v": 0}, "v must be a positive integer"),
    ("hello", {"v": "1"}, "v must be a positive integer"),
    ("hello", {"v": True}, "v must be a positive integer"),
    ("hello", {"v": 1.0}, "v must be a positive integer"),
])
def test_unknown_kinds_bad_bodies_and_newer_versions_are_refused(kind, body, words):
    with pytest.raises(MessageError) as e:
        decode(kind, body)
    assert words in str(e.value)


def _with(kind: str, **changes):
    base = next(encode(x)[1] for x in EXAMPLES if x.KIND == kind)
    return {**base, **changes}


MALFORMED = [
    ("launch", _with("launch", job_id="7"), "job_id must be an integer"),
    ("launch", _with("launch", job_id=-1), "job_id must be an integer"),
    ("launch", _with("launch", uid=2**32 - 1), "uid must be an integer"),
    ("launch", _with("launch", work_dir="relative"), "work_dir must be an absolute path"),
    ("launch", _with("launch", script=""), "script must be a non-empty string"),
    ("launch", _with("launch", env={"A=B": "x"}), "env must map variable names"),
    ("launch", _with("launch", gpus=[{"index": 0, "uuid": "a,b"}]), "gpu uuid"),
    ("launch", _with("launch", gpus=[{"index": 0, "uuid": "a"}, {"index": 0, "uuid": "b"}]), "index twice"),
    ("launch", _with("launch", gpus=[{"index": 0, "uuid": "a", "kind": "mig"}]), "needs its slice_start"),
    ("launch", _with("launch", time_limit=float("nan")), "time_limit must be a positive number"),
    ("launch", _with("launch", kill_grace=float("inf")), "kill_grace must be a non-negative number"),
    ("launch", _with("launch", rlimits={"NOFILE": [1]}), "invalid resource limit"),
    ("launch", _with("launch", warn_signal="SIGNOPE"), "warn_signal must name a signal"),
    ("launch", _with("launch", open_mode="sideways"), "open_mode must be append or truncate"),
    ("launch", _with("launch", lease=[1]), "lease must be an object"),
    ("launch", _with("launch", lease={"seq": -1}), "seq must be an integer"),
    ("lease", _with("lease", period=0), "period must be a number"),
    ("lease", _with("lease", period=float("nan")), "period must be a number"),
    ("lease", _with("lease", seq=True), "seq must be an integer"),
    ("lease", _with("lease", allocs="all"), "allocs must be a list"),
    ("signal", _with("signal", attempt=-1), "attempt must be an integer"),
    ("signal", _with("signal", signal=["TERM"]), "invalid signal"),
    ("signal", _with("signal", grace=-5), "invalid grace"),
    ("kill", _with("kill", allocs=[[1]]), "allocs must be a list of [job, attempt]"),
    ("kill", _with("kill", reason={"why": 1}), "reason must be a short string"),
    ("ack", _with("ack", done=[[1, None]]), "done must be a list"),
    ("ack", _with("ack", done=[[1, 2**63]]), "done must be a list"),
    ("mig", _with("mig", gpu=True), "no GPU True"),
    ("mig", _with("mig", destroy=[16]), "not a memory slot"),
    ("mig", _with("mig", create=[{"profile": "1g.10gb", "start": "0"}]), "start slot must be an integer"),
    ("mig", _with("mig", min_interval=-1), "min_interval must be a number"),
    ("time_limit", _with("time_limit", time_limit=0), "invalid time_limit"),
    ("step", _with("step", argv=[]), "argv must be a non-empty list"),
    ("step", _with("step", argv=["a\x00b"]), "argv must be a non-empty list"),
    ("step", _with("step", node_rank=2), "node_rank must be below nnodes"),
    ("step", _with("step", ntasks_per_node=0), "ntasks_per_node must be an integer"),
    ("step", _with("step", pty=True), "a step on a terminal has one task"),
    ("step", _with("step", master_port=70000), "master_port must be an integer"),
    ("step", _with("step", rlimits={"NOFILE": [1]}), "invalid resource limit 'NOFILE'"),
    ("step", _with("step", rlimits={"NOFILE": [1, 2**63]}), "invalid resource limit 'NOFILE'"),
    ("step", _with("step", rlimits={"NOFILE": [True, 1]}), "invalid resource limit 'NOFILE'"),
    ("step", _with("step", rlimits={"LOTS": [1, 1]}), "invalid resource limit 'LOTS'"),
    ("step", _with("step", rlimits=[[1, 1]]), "rlimits must map resource names"),
    ("step_ack", _with("step_ack", next=-1), "next must be an integer"),
    ("step_input", _with("step_input", writer=""), "writer must be a non-empty string"),
    ("step_input", _with("step_input", data="\u20ac"), "latin-1"),
    ("step_input", _with("step_input", data="x" * (m.MAX_INPUT_CHUNK + 1)), "latin-1"),
    ("step_resize", _with("step_resize", rows=0), "rows must be an integer"),
    ("step_output", _with("step_output", lines=[[0, 4, "fd 4\n"]]), "lines must be a list of [rank, stream, text]"),
    ("step_output", _with("step_output", lines="text"), "lines must be a list"),
    ("step_output", _with("step_output", input={"w": -1}), "input must map writers to counts"),
    ("step_exit", _with("step_exit", exit_code=256), "exit_code must be an integer from 0 to 255"),
    ("step_exit", _with("step_exit", signal=-3), "signal must be an integer"),
    ("step_exit", _with("step_exit", tasks=0), "tasks must be an integer"),
    ("register", {"node": {"name": "n1", "cpus": "64", "mem_mb": 1}}, "cpus must be an integer"),
    ("register", {"node": {**NODE.to_dict(), "gpus": [{"index": 0}]}}, "memory_mb is missing"),
    ("register", {"node": {**NODE.to_dict(), "labels": {"a": 1}}}, "node labels must map names to strings"),
    ("register", {"node": {**NODE.to_dict(), "gpus": [{**NODE.gpus[0].to_dict(), "mode": "shared"}]}},
     "GPU mode must be one of"),
    ("register", {}, "node must be an object"),
    ("heartbeat", _with("heartbeat", running=[[1, True]]), "running must be a list"),
    ("heartbeat", _with("heartbeat", seq=2**63), "seq must be an integer"),
    ("started", _with("started", job=[7]), "job must be an integer"),
    ("started", _with("started", time=float("nan")), "time must be a number"),
    ("finished", _with("finished", job=True), "job must be an integer"),
    ("finished", _with("finished", attempt="2"), "attempt must be an integer"),
    ("finished", _with("finished", exit_code=1.5), "exit_code must be an integer or null"),
    ("finished", _with("finished", reason=5), "reason must be a string"),
    ("samples", _with("samples", iv=0), "iv must be a number"),
    ("samples", _with("samples", gpus=[[0, 150, 1, 1, 1, 1]]), "util out of range"),
    ("samples", _with("samples", gpus=[[0, None, None, None, None, float("nan")]]), "energy_j out of range"),
    ("samples", _with("samples", jobs=[[1, 1]]), "jobs must be a list"),
    ("samples", _with("samples", usage=[[1, 1, "x" * 33, None, None]]), "usage must be a list"),
    ("head_status", {"state": "sleeping"}, "unknown head state 'sleeping'"),
    ("node_status", {"state": None}, "state is missing"),
    ("request", _with("request", uid=-1), "uid must be an integer"),
    ("request", _with("request", user="two words"), "user must be a short name"),
    ("request", _with("request", deadline=float("inf")), "deadline must be a finite number"),
    ("request", _with("request", part=2), "part must be an integer below parts"),
    ("reply", _with("reply", id=""), "missing or invalid id"),
    ("reply", _with("reply", data="x" * (m.CHUNK_CHARS + 1)), "data must be a string of at most"),
]


@pytest.mark.parametrize("kind, body, words", MALFORMED, ids=[f"{k}:{w}" for k, _, w in MALFORMED])
def test_malformed_bodies_are_refused_in_one_line(kind, body, words):
    with pytest.raises(MessageError) as e:
        decode(kind, body)
    text = str(e.value)
    assert words in text and "\n" not in text and len(text) <= 300, text


ITEMS = {("kill", "allocs"): lambda i: [i, 1], ("ack", "done"): lambda i: [i, 1],
         ("heartbeat", "running"): lambda i: [i, 1], ("lease", "allocs"): lambda i: [i, 1],
         ("samples", "gpus"): lambda i: [i % m.MAX_GPUS, 1, 1, 1, 1, 1], ("samples", "procs"): lambda i: [0, i, 1],
         ("launch", "gpus"): lambda i: {"index": i % m.MAX_GPUS, "uuid": f"u{i}", "kind": "mig", "slice_start": 0},
         ("mig", "create"): lambda i: {"profile": "1g.10gb", "start": 0},
         ("step_output", "lines"): lambda i: [0, 1, "x"]}
BOUNDS = {("kill", "allocs"): m.MAX_ALLOCS, ("ack", "done"): m.MAX_ALLOCS, ("heartbeat", "running"): m.MAX_ALLOCS,
          ("lease", "allocs"): m.MAX_ALLOCS, ("samples", "gpus"): m.MAX_GPUS, ("samples", "procs"): m.MAX_EXTRAS,
          ("launch", "gpus"): m.MAX_GPUS, ("mig", "create"): m.MAX_CHANGES, ("step_output", "lines"): m.MAX_LINES}


@pytest.mark.parametrize("kind, key", sorted(BOUNDS), ids=[f"{k}.{f}" for k, f in sorted(BOUNDS)])
def test_lists_past_their_bound_are_refused(kind, key):
    most, item = BOUNDS[(kind, key)], ITEMS[(kind, key)]
    decode(kind, _with(kind, **{key: [item(i) for i in range(most)]}))    # at the bound: taken
    with pytest.raises(MessageError) as e:
        decode(kind, _with(kind, **{key: [item(i) for i in range(most + 1)]}))
    assert key in str(e.value) and "list" in str(e.value)


def test_a_lease_skips_a_bad_item_rather_than_lapse():
    """A lease refused is a lease not renewed, and the node would kill its jobs."""
    got = decode("lease", {"seq": 1, "period": 60, "allocs": [[1, 1], ["x"], [2, -1]],
                           "limits": [[1, 1, 7200.0], ["bad"], [1, 1, -3], [1, 1, float("nan")]]})
    assert got == m.Lease(1, 60.0, ((1, 1),), ((1, 1, 7200.0),))


def test_a_finished_report_carries_absurd_values_for_the_head_to_clamp():
    """Refused, it would be repeated for ever and its job never end (gpud.head.outcomes)."""
    got = decode("finished", {"job": 1, "attempt": 0, "exit_code": 2**70, "signal": -(2**70), "reason": "x" * 10**5,
                              "message": "m" * 10**5})
    assert (got.exit_code, got.signal, len(got.reason)) == (2**70, -(2**70), 10**5)


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 1e308, -1, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["", "\x00", "x" * 70_000, "a,b", "../..", "\u20ac"]),
    st.lists(st.integers(-3, 3), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.just([[1, 1]] * 3), st.just([None] * 10),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_a_hostile_value_in_any_field_is_refused_or_read_never_a_crash(msg, data):
    kind, body = encode(msg)
    key = data.draw(st.sampled_from(sorted(body)), label="key")
    value = data.draw(HOSTILE, label="value")
    try:
        got = decode(kind, {**body, key: value})
    except MessageError as e:
        assert "\n" not in str(e)
        return
    assert type(got) is type(msg)
    json.dumps(encode(got)[1], allow_nan=False)   # what it read can be sent on: no NaN, no infinity


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(KINDS)), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=20))
def test_any_json_as_any_kind_is_refused_or_read(kind, body):
    try:
        got = decode(kind, body)
    except MessageError:
        return
    assert type(got) is KINDS[kind]


@pytest.mark.parametrize("kind, body", [
    ("launch", _with("launch", job_id=-7)), ("signal", _with("signal", job=-1)), ("ack", {"done": [[-1, 0]]}),
    ("step_kill", {"job": 1, "attempt": -1, "step": 0}), ("started", _with("started", pid=-1)),
    ("samples", _with("samples", t=float("nan"))), ("lease", _with("lease", period=float("inf"))),
    ("launch", _with("launch", cpus=True)), ("heartbeat", {"seq": float("nan")}),
    ("step_output", _with("step_output", first=-1)), ("request", _with("request", pid=True)),
])
def test_negative_ids_nan_and_bools_for_numbers_are_refused(kind, body):
    with pytest.raises(MessageError):
        decode(kind, body)


# -- the bus's side -----------------------------------------------------------------------------------

def test_the_bus_takes_a_message_or_a_raw_kind_and_body():
    assert wire(m.Hello(), None) == ("hello", {"v": VERSION})
    assert wire("x", {"raw": 1}) == ("x", {"raw": 1})
    with pytest.raises(TypeError):
        wire("x", None)
    with pytest.raises(TypeError):
        wire(m.Hello(), {"raw": 1})
    with pytest.raises(TypeError):
        encode({"not": "a message"})   # type: ignore[arg-type]
    assert Will.of("node/n1/status", m.NodeStatus("offline")) == Will("node/n1/status", "node_status",
                                                                      {"v": VERSION, "state": "offline"})


def test_no_kind_reads_a_nan_it_could_not_send_on():
    for msg in EXAMPLES:
        for value in encode(msg)[1].values():
            assert not (isinstance(value, float) and not math.isfinite(value))
