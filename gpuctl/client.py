"""A blocking client for the gpud head's Unix socket; also gpuctl's public Python API.

Theory of operation
-------------------
One ``Client`` holds one stream connection, opened on first use and reused for every
request after it: each request is one JSON line out and one JSON line back, in order
(see ``gpud.protocol``).  The head learns who we are from the socket itself
(SO_PEERCRED), so nothing here carries an identity.

Failures come in two kinds and stay apart all the way up to the exit code:

* ``RemoteError``: the head answered and said no (not your job, bad spec, ...).
* ``HeadUnavailable`` (a ``ConnectionError``): we never got an answer (no socket, refused,
  timed out, the head hung up).  After such a failure the connection is dropped; the next
  request opens a fresh one.  A read-only request that fails on a *reused* connection
  before any answer arrived is retried once on a new one, because a head restart between
  two calls of a long-lived client is normal.  Cancellations are never retried: a lost
  answer does not mean a lost request.

Submissions carry a key made here, one per submission (``gpud.head.submitkeys``): the head
answers a repeat with the job it already made.  So a submission whose answer was lost (the
head died after its commit, the connection was cut) is sent again with the same key, on a
new connection, until the head answers or ``submit_retry`` seconds have passed: the caller
gets the job id, or an error that says whether anything may have been created.  One that
could not even connect created nothing, and the error says so.

Stdlib only (plus ``gpud.protocol``): gpuctl starts on every call.  The connection is
``_socket``'s plain socket, read through a buffer of our own: the ``socket`` module's enum
wrappers, selectors and file objects cost milliseconds at every start and give nothing
here.

``submit_many`` pipelines: it keeps up to ``window`` submissions in flight and sends the
next ones in one write as answers come back, so the head's group commits take many
at once and neither side pays a system call per request.

Not thread-safe: use one Client per thread.
"""

from __future__ import annotations

import _socket
import os
import time

from gpud.protocol import (MAX_RESPONSE, RLIMIT_NAMES, ProtocolError, RemoteError, decode_response, find_socket,
                           request)

TYPE_CHECKING = False   # typing costs gpuctl's start-up; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any, Iterable

__all__ = ["Client", "HeadUnavailable", "RemoteError", "ProtocolError", "TERMINAL_STATES"]

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
})
_CHUNK = 1 << 20        # bytes asked of the socket at a time
_MAX_WINDOW = 1024      # the head reads no further ahead on one connection (gpud.ctlsocket)
_READ_ONLY_OPS = frozenset({"ping", "jobs", "nodes", "show", "scrontab_get", "report", "seff", "sstat", "telemetry"})


class HeadUnavailable(ConnectionError):
    """No answer from the head; the message is one line naming the socket.  ``sent``: the
    request may have reached the head (False: it surely did not)."""

    sent = True


SUBMIT_RETRY = 60.0     # seconds a submission whose answer was lost is sent again (same key)


# /proc/self/limits' names for RLIMIT_NAMES: read there, ``import resource`` (half a
# millisecond, a tenth of sbatch's own time) stays off gpuctl's start-up path on Linux.
_PROC_LIMITS = {"Max address space": "AS", "Max core file size": "CORE", "Max cpu time": "CPU",
                "Max data size": "DATA", "Max file size": "FSIZE", "Max locked memory": "MEMLOCK",
                "Max open files": "NOFILE", "Max processes": "NPROC", "Max resident set": "RSS",
                "Max stack size": "STACK"}


def own_rlimits() -> dict[str, list[int]]:
    """This process's resource limits, which a job inherits (Slurm's PropagateResourceLimits):
    {"NOFILE": [soft, hard], ...}, -1 for unlimited."""
    out: dict[str, list[int]] = {}
    try:
        # bytes, decoded by the built-in codec: a text-mode open looks its codec up, an import
        # that fails for a user who cannot read the interpreter's own encodings package
        with open("/proc/self/limits", "rb") as f:
            for line in f.read().decode().splitlines():
                name = _PROC_LIMITS.get(line[:26].rstrip())
                fields = line[26:].split()
                if name is not None and len(fields) >= 2:
                    out[name] = [-1 if v == "unlimited" else int(v) for v in fields[:2]]
    except (OSError, ValueError):
        out = {}
    if len(out) == len(RLIMIT_NAMES):
        return out
    import resource   # not Linux, or /proc unreadable

    for name in RLIMIT_NAMES:
        res = getattr(resource, "RLIMIT_" + name, None)
        if res is not None:
            out[name] = [-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(res)]
    return out


def submission_key() -> str:
    """A fresh key for one submission: 128 random bits."""
    return os.urandom(16).hex()


class _NoAnswer(Exception):
    """Internal: the head closed the connection before answering."""


class Client:
    """Talks to the head.  ``socket_path`` None: ``gpud.protocol.find_socket()``."""

    def __init__(self, socket_path: str | None = None, timeout: float = 30, *,
                 config_path: str | None = None, submit_retry: float | None = None) -> None:
        self.socket_path = find_socket(socket_path, config_path)
        self.timeout = timeout
        self.submit_retry = SUBMIT_RETRY if submit_retry is None else submit_retry
        self._sock: _socket.socket | None = None
        self._buf = bytearray()   # what the head sent that is not yet read as answers
        self._scanned = 0         # bytes of _buf known to hold no newline
        self._used = False        # whether the open connection has already answered a request

    # -- connection ---------------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._buf.clear()
        self._scanned = 0
        self._used = False

    def _connect(self) -> None:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except OSError as e:
            s.close()
            err = HeadUnavailable(
                f"cannot connect to gpud head at {self.socket_path}: {_reason(e)} "
                "(is gpud running? set GPUD_SOCKET or --socket)")
            err.sent = False
            raise err from None
        self._sock, self._used = s, False

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request; its result dict, or RemoteError / HeadUnavailable / ProtocolError.
        A ``submit`` with a ``key`` is sent again while its answer is lost (see above)."""
        line = request(op, **args)
        if op == "submit" and args.get("key"):
            return self._submit_line(line)
        return self._call(line, op)

    def _submit_line(self, line: bytes, *, sent: bool = False) -> dict[str, Any]:
        """``sent``: the line may have reached the head already (an answer lost before)."""
        try:
            return self._call(line, "submit")
        except HeadUnavailable as e:
            if not (e.sent or sent):
                raise HeadUnavailable(f"{e}; nothing was submitted") from None
            first = e
        end = time.monotonic() + self.submit_retry
        pause = 0.05
        while time.monotonic() < end:
            time.sleep(min(pause, max(0.0, end - time.monotonic())))
            pause = min(2 * pause, 1.0)
            try:
                return self._call(line, "submit")
            except HeadUnavailable:
                continue
        raise HeadUnavailable(
            f"{first}; sent again for {self.submit_retry:g}s without an answer, so the job may or may "
            "not have been submitted: check with squeue --me before submitting it again") from None

    def _call(self, line: bytes, op: str) -> dict[str, Any]:
        for attempt in (1, 2):
            if self._sock is None:
                self._connect()
            reused = self._used
            try:
                answer = self._exchange(line)
            except _NoAnswer:
                self.close()
                if reused and attempt == 1 and op in _READ_ONLY_OPS:
                    continue
                raise HeadUnavailable(
                    f"gpud head at {self.socket_path} closed the connection without answering"
                ) from None
            except TimeoutError:
                self.close()
                raise HeadUnavailable(
                    f"gpud head at {self.socket_path} did not answer within {self.timeout:g}s"
                ) from None
            except OSError as e:
                self.close()
                raise HeadUnavailable(f"lost connection to gpud head at {self.socket_path}: {_reason(e)}") from None
            self._used = True
            try:
                return decode_response(answer)
            except ProtocolError:
                self.close()  # the stream may be out of step now
                raise
        raise AssertionError("unreachable")

    def _exchange(self, line: bytes) -> bytes:
        assert self._sock is not None
        try:
            self._sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            raise _NoAnswer from None
        try:
            answer = self._read_line()
        except ConnectionResetError:
            raise _NoAnswer from None
        if not answer:
            raise _NoAnswer
        return answer

    def _read_line(self) -> bytes:
        """The next answer line; b"" when the head hung up before sending any of it.
        ProtocolError (connection closed) for a line cut off or over MAX_RESPONSE."""
        assert self._sock is not None
        buf = self._buf
        while True:
            end = buf.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(buf[:end + 1])
                del buf[:end + 1]
                self._scanned = 0
                return line
            self._scanned = len(buf)
            chunk = b"" if len(buf) > MAX_RESPONSE else self._sock.recv(_CHUNK)
            if not chunk:
                if not buf:
                    return b""
                self.close()
                raise ProtocolError("malformed response from gpud head (truncated or too long)")
            buf += chunk

    def _answer_waiting(self) -> bool:
        """Whether a whole answer line has already arrived."""
        return self._buf.find(b"\n", self._scanned) >= 0

    # -- operations ---------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        """{"cluster", "version", "uid", "user", "admin"} as the head sees us."""
        return self.call("ping")

    def submit_spec(self, spec: dict[str, Any]) -> int:
        """Submit a ready JobSpec dict (gpud.model.JobSpec field names); the new job id.

        For an array, the array's id; with ``skip_if_active``, the active job's id when the
        head submitted nothing."""
        return int(self.call("submit", spec=spec, key=submission_key(), rlimits=own_rlimits())["job_id"])

    def submit_many(self, specs: Iterable[dict[str, Any]], *, window: int = 256) -> list[int]:
        """Submit many ready specs over this one connection, pipelined: up to ``window``
        requests are in flight, so the head commits them in shared transactions.  Every id
        returned was acknowledged after its commit.  The first refusal raises RemoteError:
        the jobs before it are submitted, and those already in flight after it may be."""
        window = max(1, min(window, _MAX_WINDOW))
        if self._sock is None:
            self._connect()
        limits = own_rlimits()
        lines = [request("submit", spec=spec, key=submission_key(), rlimits=limits) for spec in specs]
        ids: list[int] = []
        try:
            sent = 0
            while len(ids) < len(lines):
                room = min(window - (sent - len(ids)), len(lines) - sent)
                if room > 0:   # refill the window in one write
                    self._sock.sendall(b"".join(lines[sent:sent + room]))
                    sent += room
                answer = self._read_line()
                if not answer:
                    raise HeadUnavailable(f"gpud head at {self.socket_path} closed the connection without answering")
                ids.append(int(decode_response(answer)["job_id"]))
                while len(ids) < sent and self._answer_waiting():
                    ids.append(int(decode_response(self._read_line())["job_id"]))
        except (OSError, ProtocolError):
            # The answers in flight are lost, not the submissions: each of the rest goes again
            # under its key, which returns the job of one the head had already committed.
            self.close()
            for line in lines[len(ids):]:
                ids.append(int(self._submit_line(line, sent=True)["job_id"]))
            return ids
        except RemoteError:
            self.close()  # answers still in flight would be out of step
            raise
        self._used = True
        return ids

    def submit_request(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit and return the head's whole answer: {"job_id", "warnings", "skipped"?,
        "tasks"?}, or for ``test_only`` {"start_time", "node", "partition", "reason", ...}."""
        return self.call("submit", spec=spec, key=submission_key(), rlimits=own_rlimits())

    def submit(self, script: str | None = None, *, wrap: str | None = None,
               args: Iterable[str] = (), **options: Any) -> int:
        """Submit a batch script (its text) or a ``wrap`` command; the new job id.

        ``options`` use JobSpec field names (``gpus=2, gpu_type="H100-80GB", cpus=8,
        mem_mb="64G", time_limit="2:00:00", name=..., work_dir=..., env=...``).  Numbers
        for ``time_limit`` are seconds; strings use sbatch's ``--time`` syntax.  Strings
        for ``mem_mb`` may carry a K/M/G/T suffix.  Directives in the script apply;
        ``options`` override them, as command-line options do for sbatch.  ``env``
        defaults to this process's environment, ``work_dir`` to its current directory.
        """
        from . import script as scripts
        from .converters import ScriptError

        if (script is None) == (wrap is None):
            raise ValueError("give exactly one of script or wrap")
        if wrap is not None:
            text, default_name = scripts.wrap_script(wrap), "wrap"
        else:
            text, default_name = script, "job"
        try:
            settings = scripts.api_settings(options)
            spec = scripts.build_spec(text, settings, default_name=default_name, args=list(args),
                                      directives=wrap is None)
        except ScriptError as e:
            raise ValueError(str(e)) from None
        return self.submit_spec(spec)

    def jobs(self, job_ids: Iterable[int] | None = None, users: Iterable[str] | None = None,
             states: Iterable[str] | None = None, all: bool = False,
             since: float | None = None, attempts: bool = False) -> list[dict[str, Any]]:
        """JOB records; pending and active only unless ``all`` (then finished ones too);
        with ``attempts``, each requeued job's ``earlier_attempts`` as well."""
        args: dict[str, Any] = {}
        if attempts:
            args["attempts"] = True
        if job_ids is not None:
            args["job_ids"] = [int(j) for j in job_ids]
        if users is not None:
            args["users"] = list(users)
        if states is not None:
            args["states"] = [s.upper() for s in states]
        if all:
            args["all"] = True
        if since is not None:
            args["since"] = float(since)
        return list(self.call("jobs", **args).get("jobs", []))

    def job(self, job_id: int) -> dict[str, Any]:
        """One JOB record, finished or not; RemoteError when there is no such job."""
        for j in self.jobs(job_ids=[job_id], all=True):
            if j.get("job_id") == job_id:
                return j
        raise RemoteError(f"invalid job id specified: {job_id}")

    def cancel(self, job_ids: Iterable[int | str] | None = None, users: Iterable[str] | None = None,
               signal: str | None = None) -> dict[str, Any]:
        """{"cancelled": [int], "errors": [str]}: per-job refusals come back in ``errors``.

        Ids may name array tasks (``"123_4"``); an array's id names all of its tasks."""
        args: dict[str, Any] = {}
        if job_ids is not None:
            args.update(job_refs(job_ids))
        if users is not None:
            args["users"] = list(users)
        if signal is not None:
            args["signal"] = signal
        result = self.call("cancel", **args)
        return {"cancelled": list(result.get("cancelled", [])), "errors": list(result.get("errors", []))}

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.call("nodes").get("nodes", []))

    # -- telemetry -------------------------------------------------------------------

    def report(self, since: float | None = None, until: float | None = None,
               by: str = "account") -> dict[str, Any]:
        """GPU-hours, billed units, cost, utilization and idle GPU-hours over [since, until)
        (epoch seconds; default the last 30 days) by account, user, partition or gpu-type:
        {"rows": [...], "total": {...}, ...} as gpud.protocol describes."""
        args: dict[str, Any] = {"by": by}
        if since is not None:
            args["since"] = float(since)
        if until is not None:
            args["until"] = float(until)
        return self.call("report", **args)

    def sstat(self, job_id: int) -> dict[str, Any]:
        """A running job's usage per step (what ``gpuctl sstat`` prints)."""
        return self.call("sstat", job_id=int(job_id))

    def seff(self, job_id: int) -> dict[str, Any]:
        """One job's efficiency numbers (what ``gpuctl seff`` prints)."""
        return self.call("seff", job_id=int(job_id))

    def telemetry(self) -> dict[str, Any]:
        """Nodes and GPUs with their latest samples, the queue and running jobs (``gpuctl top``)."""
        return self.call("telemetry")

    # -- scontrol and scrontab -------------------------------------------------------

    def hold(self, job_ids: Iterable[int | str], user: bool = False) -> dict[str, Any]:
        """Hold pending jobs: {"done": [str], "errors": [str]}.  ``user``: a user hold even for admins."""
        return self.call("hold", user=user, **job_refs(job_ids))

    def release(self, job_ids: Iterable[int | str]) -> dict[str, Any]:
        return self.call("release", **job_refs(job_ids))

    def requeue(self, job_ids: Iterable[int | str]) -> dict[str, Any]:
        return self.call("requeue", **job_refs(job_ids))

    def update_job(self, job_ids: Iterable[int | str], **changes: str) -> dict[str, Any]:
        """Slurm's ``scontrol update job``: ``update_job([12], TimeLimit="1:00:00", Nice="10")``."""
        return self.call("update_job", changes={k: str(v) for k, v in changes.items()}, **job_refs(job_ids))

    def update_node(self, nodes: str, state: str, reason: str | None = None) -> dict[str, Any]:
        """Drain (``state="DRAIN"``, with a reason) or resume nodes; ``nodes`` may be ``gpu[01-04]``."""
        return self.call("update_node", nodes=nodes, state=state, reason=reason)

    def show(self, kind: str, ids: Iterable[int | str] | None = None,
             names: Iterable[str] | None = None) -> dict[str, Any]:
        """``kind`` job (by ``ids``), node or partition (by ``names``); all when none are given."""
        args: dict[str, Any] = {"kind": kind}
        if ids:
            args.update(job_refs(ids))
        if names:
            args["names"] = list(names)
        return self.call("show", **args)

    def scrontab_get(self, user: str | None = None) -> dict[str, Any]:
        return self.call("scrontab_get", **({"user": user} if user else {}))

    def scrontab_set(self, text: str, entries: list[dict[str, Any]], user: str | None = None) -> dict[str, Any]:
        return self.call("scrontab_set", text=text, entries=entries, **({"user": user} if user else {}))

    def wait(self, job_id: int, timeout: float | None = None, poll: float = 0.2) -> dict[str, Any]:
        """Poll until the job is in a terminal state; its final record.  TimeoutError past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("state") in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.get('state')} after {timeout:g}s")
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))


def job_refs(ids: Iterable[int | str]) -> dict[str, list]:
    """``[12, "13_4"]`` -> {"job_ids": [12], "array_tasks": [[13, 4]]} (gpud.protocol's naming)."""
    from gpud.syntax import SyntaxProblem, parse_job_ref

    job_ids: list[int] = []
    tasks: list[list[int]] = []
    for i in ids:
        if isinstance(i, int) and not isinstance(i, bool):
            job_ids.append(i)
            continue
        try:
            job_id, task = parse_job_ref(str(i))
        except SyntaxProblem as e:
            raise ValueError(str(e)) from None
        if task is None:
            job_ids.append(job_id)
        else:
            tasks.append([job_id, task])
    out: dict[str, list] = {"job_ids": job_ids}
    if tasks:
        out["array_tasks"] = tasks
    return out


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__

