"""gpuctl.Client, the Python API, against the fake head on a real Unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gpuctl
from gpuctl import Client, HeadUnavailable, ProtocolError, RemoteError
from gpud import protocol
from gpud.model import JobSpec
from gpud.protocol import request
from tests.fake_head import FakeHead, node

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def test_one_connection_carries_many_requests(head):
    with Client(head.path) as c:
        assert c.ping()["uid"] == os.getuid()
        c.jobs()
        c.nodes()
    assert head.ops() == ["ping", "jobs", "nodes"]
    assert head.connections == 1


def test_submit_wrap_builds_a_valid_spec(head, monkeypatch):
    monkeypatch.setenv("GPUCTL_TEST_VAR", "yes")
    with Client(head.path) as c:
        job_id = c.submit(wrap="nvidia-smi", gpus=2, mem_mb="8G", time_limit="1:00:00", name="smi")
    spec = head.last("submit")["spec"]
    assert job_id == 1
    assert spec["script"] == "#!/bin/bash\nnvidia-smi\n"
    assert (spec["gpus"], spec["mem_mb"], spec["time_limit"], spec["name"]) == (2, 8192, 3600.0, "smi")
    assert spec["work_dir"] == os.getcwd()
    assert spec["env"]["GPUCTL_TEST_VAR"] == "yes"
    JobSpec.from_request(spec)


def test_submit_script_text_honours_directives_under_options(head):
    with Client(head.path) as c:
        c.submit("#!/bin/sh\n#SBATCH --gpus 1 -c 4\nhostname\n", gpus=3, env={}, work_dir="/srv",
                 args=["x y"])
    spec = head.last("submit")["spec"]
    assert (spec["gpus"], spec["cpus"], spec["env"], spec["work_dir"]) == (3, 4, {}, "/srv")
    assert "set -- 'x y'\nhostname" in spec["script"]


def test_submit_refuses_nonsense_before_sending(head):
    with Client(head.path) as c:
        with pytest.raises(ValueError, match="exactly one"):
            c.submit()
        with pytest.raises(TypeError, match="unknown job option"):
            c.submit(wrap="true", gpu=1)
        with pytest.raises(ValueError, match="--mem"):
            c.submit(wrap="true", mem_mb="lots")
    assert head.ops() == []


def test_refusal_raises_remote_error_and_keeps_the_connection(head):
    head.refuse("submit", "invalid partition specified: nope")
    with Client(head.path) as c:
        with pytest.raises(RemoteError, match="^invalid partition specified: nope$"):
            c.submit_spec({"script": "#!/bin/sh\n", "partition": "nope"})
        c.ping()
    assert head.connections == 1
    assert gpuctl.RemoteError is RemoteError


def test_no_head_is_head_unavailable_naming_the_socket(tmp_path):
    path = str(tmp_path / "absent.sock")
    with pytest.raises(HeadUnavailable) as e:
        Client(path).ping()
    assert isinstance(e.value, ConnectionError)
    assert str(e.value) == (f"cannot connect to gpud head at {path}: No such file or directory "
                            "(is gpud running? set GPUD_SOCKET or --socket)")


def test_socket_from_environment_then_config(tmp_path, monkeypatch):
    cfg = tmp_path / "gpud.toml"
    cfg.write_text('[head]\nsocket = "/from/config.sock"\n')
    monkeypatch.delenv("GPUD_SOCKET", raising=False)
    monkeypatch.setenv("GPUD_CONFIG", str(cfg))
    assert Client().socket_path == "/from/config.sock"
    monkeypatch.setenv("GPUD_SOCKET", "/from/env.sock")
    assert Client().socket_path == "/from/env.sock"
    assert Client("/given.sock").socket_path == "/given.sock"


def test_a_submit_whose_answer_is_lost_is_sent_again_under_its_key(head):
    answers = iter([b"", b"", {"job_id": 7}])   # two hang-ups after the (pretend) commit
    head.handle("submit", lambda args, uid: next(answers))
    with Client(head.path) as c:
        c.ping()
        assert c.submit_spec({"script": "#!/bin/sh\n"}) == 7
    assert head.ops() == ["ping", "submit", "submit", "submit"]
    assert len(head.submit_keys) == 3 and len(set(head.submit_keys)) == 1   # one key, so one job


def test_a_submit_never_answered_says_it_may_exist(head):
    head.raw("submit", b"")
    with Client(head.path, submit_retry=0.3) as c:
        with pytest.raises(HeadUnavailable, match="may or may not have been submitted: check with squeue"):
            c.submit_spec({"script": "#!/bin/sh\n"})
    assert len(set(head.submit_keys)) == 1 and len(head.submit_keys) >= 2


def test_a_submit_that_cannot_connect_says_nothing_was_submitted(tmp_path):
    with Client(str(tmp_path / "none.sock")) as c:
        with pytest.raises(HeadUnavailable, match="nothing was submitted"):
            c.submit_spec({"script": "#!/bin/sh\n"})


def test_every_submission_has_its_own_key(head):
    with Client(head.path) as c:
        c.submit_spec({"script": "#!/bin/sh\n"})
        c.submit_many([{"script": "#!/bin/sh\n"}] * 3)
    assert len(set(head.submit_keys)) == 4


def test_read_only_request_is_retried_once_on_a_fresh_connection(head):
    answers = iter([b"", {"jobs": []}])
    head.handle("jobs", lambda args, uid: next(answers))
    with Client(head.path) as c:
        c.ping()
        assert c.jobs() == []
    assert head.ops() == ["ping", "jobs", "jobs"]
    assert head.connections == 2


def test_garbage_from_the_head_is_a_protocol_error(head):
    head.raw("nodes", b"this is not json\n")
    with Client(head.path) as c:
        with pytest.raises(ProtocolError, match="malformed response"):
            c.nodes()
        c.ping()  # a fresh connection after the bad one


def test_job_and_jobs_filters(head):
    head.add_job(job_id=7, state="RUNNING", user="bob")
    head.add_job(job_id=8, state="COMPLETED", user="bob")
    with Client(head.path) as c:
        assert [j["job_id"] for j in c.jobs()] == [7]
        assert [j["job_id"] for j in c.jobs(all=True, users=["bob"], states=["completed"])] == [8]
        assert c.job(8)["state"] == "COMPLETED"
        with pytest.raises(RemoteError, match="invalid job id specified: 9"):
            c.job(9)
    assert head.last("jobs") == {"job_ids": [9], "all": True}


def test_wait_returns_the_final_record(head):
    head.add_job(job_id=3, state="RUNNING")
    polls = []

    def jobs(args, uid):
        polls.append(1)
        if len(polls) == 3:
            head.jobs[3]["state"] = "COMPLETED"
            head.jobs[3]["exit_code"] = 0
        return {"jobs": [head.jobs[3]]}

    head.handle("jobs", jobs)
    with Client(head.path) as c:
        assert c.wait(3, poll=0)["state"] == "COMPLETED"
    assert len(polls) == 3


def test_wait_times_out(head):
    head.add_job(job_id=3, state="PENDING")
    with Client(head.path) as c:
        with pytest.raises(TimeoutError, match="job 3 still PENDING"):
            c.wait(3, timeout=0, poll=0)


def test_cancel_reports_refusals_per_job(head):
    head.add_job(job_id=1, uid=os.getuid())
    head.add_job(job_id=2, uid=os.getuid() + 1)
    head.admins = set()
    with Client(head.path) as c:
        result = c.cancel([1, 2, 99], signal="SIGUSR1")
    assert result["cancelled"] == [1]
    assert result["errors"] == ["Kill job error on job id 2: Access/permission denied",
                                "Kill job error on job id 99: Invalid job id specified"]
    assert head.last("cancel") == {"job_ids": [1, 2, 99], "signal": "SIGUSR1"}


def test_nodes(head):
    head.nodes = [node("gpu01", gpus=2)]
    with Client(head.path) as c:
        assert [g["index"] for g in c.nodes()[0]["gpus"]] == [0, 1]


def test_submit_many_pipelines_and_keeps_order():
    with FakeHead() as head, Client(head.path) as client:
        specs = [{"script": f"#!/bin/bash\necho {i}\n", "name": f"j{i}"} for i in range(50)]
        ids = client.submit_many(specs, window=8)
        assert len(ids) == 50 and len(set(ids)) == 50 and ids == sorted(ids)
        names = [args["spec"]["name"] for op, args, _ in head.requests if op == "submit"]
        assert names == [f"j{i}" for i in range(50)]


# -- pipelining against the head's own socket server --------------------------------------------

class _ServerThread:
    """gpud.ctlsocket.SocketServer on its own event loop in a thread, with the given handlers."""

    def __init__(self, path: str, handlers: dict) -> None:
        import asyncio
        import threading

        from gpud.ctlsocket import SocketServer

        self.loop = asyncio.new_event_loop()
        self.server = SocketServer(path, handlers)
        self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, fn) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_head_answers_pipelined_submissions_in_order_and_together(tmp_path, monkeypatch):
    import asyncio

    n, waiting, writes = 60, [], []
    original_write = asyncio.StreamWriter.write
    monkeypatch.setattr(asyncio.StreamWriter, "write", lambda self, data: (writes.append(data),
                                                                           original_write(self, data))[1])

    async def submit(caller, args):
        done = asyncio.get_running_loop().create_future()
        waiting.append(done)
        if len(waiting) == n:               # all in flight: finish them last first
            for f in reversed(waiting):
                f.set_result(None)
        await done
        return {"job_id": int(args["spec"]["name"])}

    server = _ServerThread(str(tmp_path / "head.sock"), {"submit": submit})
    try:
        with Client(server.server.path) as c:
            assert c.submit_many([{"name": str(i)} for i in range(n)], window=n) == list(range(n))
    finally:
        server.stop()
    assert len(writes) == 1                 # made together, written together


def test_a_ready_answer_never_waits_for_a_later_one(tmp_path):
    import asyncio
    import socket

    gate: list = []

    async def submit(caller, args):
        if args["spec"]["name"] == "last":
            gate.append(asyncio.get_running_loop().create_future())
            await gate[0]
        return {"job_id": 1}

    server = _ServerThread(str(tmp_path / "head.sock"), {"submit": submit})
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        s.connect(server.server.path)
        s.sendall(b"".join(request("submit", spec={"name": name}) for name in ["a", "b", "c", "last"]))
        f = s.makefile("rb")
        assert [f.readline() for _ in range(3)] == [b'{"ok":true,"result":{"job_id":1}}\n'] * 3
        server.call(lambda: gate[0].set_result(None))
        assert f.readline() == b'{"ok":true,"result":{"job_id":1}}\n'
        s.close()
    finally:
        server.stop()


def test_submit_many_stops_at_a_refusal_and_drops_the_connection(head):
    seen = []

    def submit(args, uid):
        seen.append(args["spec"]["name"])
        if args["spec"]["name"] == "j5":
            raise RuntimeError("no")   # the fake head answers an error line
        return {"job_id": len(seen)}
    head.handle("submit", submit)
    with Client(head.path) as c:
        with pytest.raises(RemoteError, match="no"):
            c.submit_many([{"name": f"j{i}"} for i in range(20)], window=1)   # nothing in flight past it
        assert seen == [f"j{i}" for i in range(6)]
        assert c.ping()["uid"] == os.getuid()   # on a fresh connection
    assert head.connections == 2


def test_answers_split_across_reads_and_many_in_one_read(head):
    big = {"nodes": [node(f"gpu{i:03d}", gpus=8) for i in range(400)]}   # well over one read
    head.reply("nodes", big)
    with Client(head.path) as c:
        assert len(c.nodes()) == 400
        assert c.submit_many([{"script": "#!/bin/sh\n", "name": f"j{i}"} for i in range(300)], window=100) \
            == list(range(1, 301))
        assert c.ping()["uid"] == os.getuid()


# -- the socket from the config file ------------------------------------------------------------

def socket_by_tomllib(path: str) -> str:
    """find_socket's answer for a config file, by always parsing it."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return protocol.DEFAULT_SOCKET
    sock = data.get("head", {}).get("socket") if isinstance(data.get("head"), dict) else None
    return sock if isinstance(sock, str) and sock else protocol.DEFAULT_SOCKET


CONFIG_LINES = [
    "[head]", "[broker]", "[head.socket]", "[[partition]]", 'name = "p"', "x = 1", "", "bad line", "[head",
    'socket = "/run/gpud/gpud.sock"', 'socket = "/run/gpud/gpud.sock"\r', '  socket = "/run/gpud/gpud.sock"  ',
    'socket = "/run/gpud/gpud.sock" # the default', 'socket="/run/gpud/gpud.sock"', "socket = '/run/gpud/gpud.sock'",
    'socket = "/tmp/other.sock"', 'socket = ""', "socket = 5", 'socket = """/tmp/multi"""', '"socket" = "/tmp/q"',
    "'socket' = '/tmp/lit'", '"soc\\u006bet" = "/tmp/escaped"', 'head.socket = "/tmp/dotted"',
    'head = {socket = "/tmp/inline"}', '#socket = "/tmp/comment"', '  # the socket', 'relay_socket = "/tmp/relay"',
    "sockets = 1", "socket-path = 1", 'x = "a socket"', 'x = """', '"""', "x = '''", "'''", 'x = "\\\\"',
]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(st.sampled_from(CONFIG_LINES), max_size=8))
@example(True, ['"soc\\u006bet" = "/tmp/escaped"'])
@example(True, ["sockets = 1", '"socket" = "/tmp/q"'])
@example(True, ['relay_socket = "/tmp/relay"', 'socket = "/tmp/other.sock"'])
@example(False, ["[head]", "relay_socket = 1", "socket-path = 1", "socket = 5"])
@example(False, ['head.socket = "/tmp/dotted"', "[head]", "[broker]", 'socket = "/tmp/other.sock"'])
def test_socket_from_the_config_is_what_parsing_it_gives(in_head, lines):
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write("\n".join(["[head]"] * in_head + lines))
        f.flush()
        with mock.patch.dict(os.environ):
            os.environ.pop("GPUD_SOCKET", None)
            assert protocol.find_socket(None, f.name) == socket_by_tomllib(f.name)


def test_the_installed_config_names_its_socket_without_tomllib():
    config = str(ROOT / "etc" / "gpud" / "gpud.toml")
    code = ("import sys; from gpud.protocol import find_socket\n"
            f"print(find_socket(None, {config!r}), 'tomllib' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "GPUD_SOCKET"}
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                       env={**env, "PYTHONPATH": str(ROOT)})
    assert r.stdout.split() == [socket_by_tomllib(config), "False"], r.stderr
