"""A stand-in for the gpud head's Unix socket, for testing clients of gpud.protocol.

A real socket served from a thread, so real ``gpuctl`` processes can talk to it.  It
records every request and answers from a tiny in-memory model that behaves like a head
for the simple cases (submit makes a PENDING job, cancel cancels the caller's jobs,
jobs filters like the head); tests override any operation with ``reply`` (a canned
result), ``refuse`` (an error), ``raw`` (bytes, to test a broken head) or ``handle``
(a function).  The caller's uid comes from SO_PEERCRED, as on the real head.

    with FakeHead() as head:
        head.nodes = [node("gpu01", gpus=8)]
        subprocess.run(["gpuctl", "--socket", head.path, "sinfo"])
        assert head.ops() == ["nodes"]
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import socketserver
import struct
import tempfile
import threading
import time
from typing import Any, Callable

from gpud import protocol

Handler = Callable[[dict[str, Any], int], Any]

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "OUT_OF_MEMORY"})


def job(job_id: int, **fields: Any) -> dict[str, Any]:
    """A complete JOB record with plausible defaults; ``fields`` override them."""
    record: dict[str, Any] = {
        "job_id": job_id, "name": "job", "user": "alice", "uid": 1000, "gid": 1000,
        "account": "default", "partition": "gpu", "qos": "normal", "state": "PENDING",
        "reason": "Priority", "node": None, "gpus": 1, "gpu_ids": [], "gpu_indices": [],
        "cpus": 1, "mem_mb": 1024, "time_limit": 3600.0, "submit_time": 1_700_000_000.0,
        "start_time": None, "end_time": None, "exit_code": None, "signal": None,
        "work_dir": "/tmp", "stdout": None, "stderr": None, "attempt": 0, "requeue_count": 0,
        "preempt_count": 0, "priority": 0,
    }
    record.update(fields)
    return record


def node(name: str, *, gpus: int = 8, model: str = "H100-80GB", gpus_alloc: int = 0,
         state: str = "IDLE", cpus: int = 64, cpus_alloc: int = 0, mem_mb: int = 512 * 1024) -> dict[str, Any]:
    """A complete NODE record."""
    return {
        "name": name, "state": state, "reason": None, "cpus": cpus, "cpus_alloc": cpus_alloc,
        "mem_mb": mem_mb, "mem_alloc_mb": 0, "gpus_total": gpus, "gpus_alloc": gpus_alloc,
        "labels": {}, "last_seen": 1_700_000_000.0,
        "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_mb": 81559,
                  "job_ids": []} for i in range(gpus)],
    }


class _Refusal(Exception):
    pass


class FakeHead:
    """Serve the protocol at ``path`` (default: a fresh short path under /tmp)."""

    def __init__(self, path: str | None = None, *, cluster: str = "test") -> None:
        self._dir = None if path else tempfile.mkdtemp(prefix="gpud-fake-", dir="/tmp")
        self.path = path or os.path.join(self._dir, "head.sock")
        self.cluster = cluster
        self.requests: list[tuple[str, dict[str, Any], int]] = []   # (op, args, uid)
        self.submit_keys: list[str] = []                            # of the submissions, in order
        self.jobs: dict[int, dict[str, Any]] = {}
        self.nodes: list[dict[str, Any]] = []
        self.admins: set[int] = {0}
        self.next_job_id = 1
        self.connections = 0
        self._overrides: dict[str, Handler] = {}
        self._cond = threading.Condition()
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> "FakeHead":
        head = self

        class Conn(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                head._serve(self.request, self.rfile, self.wfile)

        self._server = socketserver.ThreadingUnixStreamServer(self.path, Conn)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-head",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if os.path.exists(self.path):
            os.unlink(self.path)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "FakeHead":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting the answers ---------------------------------------------------------

    def reply(self, op: str, result: dict[str, Any]) -> None:
        self._overrides[op] = lambda args, uid: result

    def refuse(self, op: str, message: str) -> None:
        def handler(args: dict[str, Any], uid: int) -> Any:
            raise _Refusal(message)
        self._overrides[op] = handler

    def raw(self, op: str, data: bytes) -> None:
        """Answer ``op`` with these bytes (b"" hangs up without answering)."""
        self._overrides[op] = lambda args, uid: data

    def handle(self, op: str, fn: Handler) -> None:
        """``fn(args, uid)`` returns a result dict (or raw bytes)."""
        self._overrides[op] = fn

    def add_job(self, **fields: Any) -> dict[str, Any]:
        with self._cond:
            job_id = fields.pop("job_id", None) or self.next_job_id
            self.next_job_id = max(self.next_job_id, job_id + 1)
            self.jobs[job_id] = job(job_id, **fields)
            return self.jobs[job_id]

    # -- inspecting what came in ---------------------------------------------------------

    def ops(self) -> list[str]:
        with self._cond:
            return [op for op, _, _ in self.requests]

    def last(self, op: str) -> dict[str, Any]:
        """The args of the latest request for ``op``."""
        with self._cond:
            for o, args, _ in reversed(self.requests):
                if o == op:
                    return args
        raise AssertionError(f"no {op!r} request among {self.ops()}")

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("condition not met within the timeout")
                self._cond.wait(left)

    # -- serving ----------------------------------------------------------------------

    def _serve(self, sock: socket.socket, rfile: Any, wfile: Any) -> None:
        uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        with self._cond:
            self.connections += 1
        while True:
            line = rfile.readline(protocol.MAX_LINE + 1)
            if not line:
                return
            try:
                op, args = protocol.decode_request(line)
            except protocol.ProtocolError as e:
                wfile.write(protocol.error(str(e)))
                wfile.flush()
                continue
            with self._cond:
                # The submission key is random: kept apart, so tests compare requests as before.
                key = args.pop("key", None) if op == "submit" else None
                if op == "submit":
                    args.pop("rlimits", None)   # the submitter's own limits: this machine's
                if key is not None:
                    self.submit_keys.append(key)
                self.requests.append((op, args, uid))
                self._cond.notify_all()
                try:
                    handler = self._overrides.get(op) or getattr(self, f"_op_{op}")
                    result = handler(args, uid)
                    out = result if isinstance(result, bytes) else protocol.ok(result)
                except _Refusal as e:
                    out = protocol.error(str(e))
                except Exception as e:  # a bug in a test's handler: tell the client, keep serving
                    out = protocol.error(f"fake head: {type(e).__name__}: {e}")
            if out == b"":
                return
            wfile.write(out)
            wfile.flush()

    def _op_ping(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        return {"cluster": self.cluster, "version": "test", "uid": uid, "user": _user(uid),
                "admin": uid in self.admins}

    def _op_submit(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        spec = args.get("spec")
        if not isinstance(spec, dict) or not str(spec.get("script", "")).strip():
            raise _Refusal("empty batch script")
        job_id = self.next_job_id
        self.next_job_id += 1
        self.jobs[job_id] = job(job_id, name=spec.get("name", "job"), user=_user(uid), uid=uid,
                                gpus=spec.get("gpus", 0), cpus=spec.get("cpus", 1),
                                work_dir=spec.get("work_dir", "/"), submit_time=time.time(),
                                reason="None", spec=spec)
        return {"job_id": job_id}

    def _op_jobs(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        out = []
        for j in sorted(self.jobs.values(), key=lambda j: j["job_id"]):
            if not args.get("all") and j["state"] in TERMINAL:
                continue
            if args.get("job_ids") is not None and j["job_id"] not in args["job_ids"]:
                continue
            if args.get("users") is not None and j["user"] not in args["users"]:
                continue
            if args.get("states") is not None and j["state"] not in args["states"]:
                continue
            out.append({k: v for k, v in j.items() if k != "spec"})
        return {"jobs": out}

    def _op_cancel(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        cancelled, errors = [], []
        targets = list(args.get("job_ids") or [])
        if not targets and args.get("users"):
            targets = [j for j, r in self.jobs.items() if r["user"] in args["users"]]
        for job_id in targets:
            j = self.jobs.get(job_id)
            if j is None:
                errors.append(f"Kill job error on job id {job_id}: Invalid job id specified")
            elif j["uid"] != uid and uid not in self.admins:
                errors.append(f"Kill job error on job id {job_id}: Access/permission denied")
            elif j["state"] in TERMINAL:
                errors.append(f"Kill job error on job id {job_id}: Job/step already completing or completed")
            elif not args.get("signal"):
                j["state"], j["end_time"] = "CANCELLED", time.time()
                cancelled.append(job_id)
            else:
                cancelled.append(job_id)
        return {"cancelled": cancelled, "errors": errors}

    def _op_nodes(self, args: dict[str, Any], uid: int) -> dict[str, Any]:
        return {"nodes": list(self.nodes)}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
