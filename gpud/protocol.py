"""The request/response protocol between gpuctl and the head's Unix socket.

Stdlib only: gpuctl imports this on its start-up path, so the lines are written and read
with ``gpud.jsoncodec`` (json's C accelerator without the ``json`` package's imports).

Framing: one JSON object per line (UTF-8, ``\\n``-terminated), at most ``MAX_LINE`` bytes for a request
and ``MAX_RESPONSE`` for an answer; a head or relay takes 1 MiB for a request line but one that
carries a script (submit, scrontab_set, step_launch), and lists and objects nested at most
``MAX_DEPTH`` deep (gpud.ctlsocket has the per-user limits).
A connection may carry many requests; each gets exactly one response line, in order.

Request:  ``{"v": 1, "op": "<op>", "args": {...}}``
Response: ``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "<one line>"}``

The caller's identity is never part of a request: the head reads uid/gid from the
socket (SO_PEERCRED).  The same socket, served on a login node or a worker by a relay
(``gpud.relay``), forwards each line unchanged, with the uid/gid its kernel reported in a
signed message; gpuctl cannot tell the difference.

Operations (args -> result):

``ping``     {} -> {"cluster": str, "version": str, "uid": int, "user": str, "admin": bool}
``submit``   {"spec": JobSpec fields, "key": str?} -> {"job_id": int, "warnings": [str], "tasks": int?,
             "skipped": bool?, "repeat": bool?}   For an array, job_id is the array's id (its
             first task's).  ``key`` (8-128 of [A-Za-z0-9._:-], one per submission): a repeat
             with the same key from the same uid within 24 h returns the job already made,
             with "repeat": true (gpud.head.submitkeys).  ``rlimits`` {NAME: [soft, hard]}?
             (names of RLIMIT_NAMES, -1 unlimited): the submitter's resource limits, which
             the job runs with, each at most the node's own.
             With spec.skip_if_active and a pending or running job of the caller with the
             same name: that job's id and "skipped": true, nothing inserted.  With
             spec.test_only: {"test_only": true, "start_time": float|null, "node", "partition",
             "cpus", "gpus", "reason", "warnings"}, nothing inserted.
``jobs``     {"job_ids": [int]?, "users": [str]?, "states": [str]?, "all": bool?,
             "since": float?, "partitions": [str]?, "accounts": [str]?, "fields": [str]?,
             "fold": bool?, "rows": bool?} -> {"jobs": [JOB], "folded": bool?}
             Without ``all`` only pending and active jobs are listed (squeue); with it,
             finished ones too (sacct).  An array's id in job_ids selects all its tasks.
             ``fields``: each JOB record carries only these keys (unknown ones are left
             out).  ``fold``: records come in squeue's order (running by id, then pending
             by priority, highest first) with each array's pending tasks folded into one
             record whose display_id is ``123_[4-99%10]``, and "folded": true; a head
             older than these arguments ignores them (then no "folded").  ``rows`` with
             ``fold`` and ``fields`` (squeue's table fields): {"fields": [str], "rows":
             [[value, ...]], "folded": true} instead of "jobs", each row the values of
             ``fields`` in their order; a head older than ``rows`` answers with "jobs".
``cancel``   {"job_ids": [int]?, "array_tasks": [[int, int]]?, "users": [str]?, "signal": str?}
             -> {"cancelled": [int], "errors": [str]}
             Naming jobs (here and in the ops below): a job id, or an array's id for all
             its tasks, in job_ids; one task ``123_4`` as [123, 4] in array_tasks.
``hold``, ``release``, ``requeue``  {"job_ids"?, "array_tasks"?, "user": bool? (hold only:
             a user hold even by an admin)} -> {"done": [str], "errors": [str]}
``update_job`` {"job_ids"?, "array_tasks"?, "changes": {Key: str}} -> {"done", "errors"}
             Keys as scontrol spells them (case-insensitive): TimeLimit, Nice, Partition,
             QOS, Account, Dependency, Comment, JobName, StartTime, Deadline,
             ArrayTaskThrottle.  Owners may only lower limits; root and admins anything.
``update_node`` {"nodes": "gpu[01-02]", "state": "DRAIN"|"RESUME", "reason": str?}
             -> {"done", "errors"}   (root and admins only)
``show``     {"kind": "job", "job_ids"?, "array_tasks"?} -> {"jobs": [JOB + request details]}
             {"kind": "node", "names": [str]?} -> {"nodes": [NODE + "partitions"]}
             {"kind": "partition", "names": [str]?} -> {"partitions": [PARTITION]}
``scrontab_get`` {"user": str?} -> {"text": str, "entries": [{"entry_id", "line", "schedule",
             "next_run", "last_job_id", "active"}]}
``scrontab_set`` {"text": str, "entries": [{"line", "schedule", "spec"}], "user": str?}
             -> {"entries": int}   The entries are the text's, parsed by gpuctl into job
             specs; the head parses the text again and checks both agree.
``nodes``    {} -> {"nodes": [NODE]}
``sprio``    {"job_ids": [int]?, "users": [str]?} -> {"jobs": [{"job_id", "user", "account",
             "partition", "qos", "priority", "factors": {"age", "fairshare", "job_size", "qos",
             "partition", "nice"} (weighted: they sum to the priority), "reason"}],
             "weights": {factor: weight}}   (from the last scheduler pass)
``sshare``   {"users": [str]?} -> {"rows": [{"account", "user" (null for an account row),
             "depth", "shares", "norm_shares", "raw_usage", "effective_usage", "level_fs",
             "fairshare" (null for accounts)}], "half_life": float|null}
``reconfigure`` {} -> {"path": str|null, "restart_needed": [str]}   (root and admins only)
             Re-reads the head's config file, as SIGHUP does; an invalid file is refused
             with its first ``FILE:LINE: message`` and the running config is kept.
``show_config`` {} -> {"path": str|null, "config": {...}}: the running config in gpud.toml's
             shape (durations in seconds, sizes in MB, the broker password hidden).
``report``   {"since": float?, "until": float?, "by": "account"|"user"|"partition"|"gpu-type"?}
             -> {"by", "since", "until", "prices": {model: price}, "total": ROW, "rows": [ROW]}
             ROW: {"key", "gpu_hours", "billed", "cost", "util_mean" (%|null),
             "idle_gpu_hours", "jobs"}; default window: the last 30 days (gpud/head/reports.py).
``seff``     {"job_id": int} -> {"job": JOB, "now", "cluster", "gpu_model", "gpu_memory_mb",
             "alloc_gpu_s", "sampled_s", "gpu_s", "util_gpu_s", "idle_gpu_s"}
``sstat``    {"job_id": int} -> {"job": JOB, "now", "steps": [{"step": "total"|"batch"|"step_N",
             "sampled_at", "max_rss" (bytes|null), "cpu_usec"|null}]}: a running job's
             usage from its cgroup, as last sampled; an error when it is not running.
``telemetry`` {} -> {"now", "cluster", "nodes": [NODE + "sampled_at", each GPU + "util",
             "mem_used_mb", "power_w", "temp_c", "users", "slices"], "queue": {partition:
             {"pending", "running", "completing", "pending_gpus"}}, "jobs": [running job]}

``step_launch`` {"job_id": int, "argv": [str], "ntasks_per_node": int?, "env": {str: str}?,
             "rlimits": {NAME: [soft, hard]}?} -> {"job_id", "step", "ntasks", "nodes", "nodelist"}
             (gpuctl srun: start argv on every node of a running job; its owner or root only, never
             an admin: the tasks run as the job's user, with srun's resource limits as ``submit``'s
             ``rlimits``, each at most the node's own)
``step_poll`` {"job_id", "step", "offset": int} -> {"lines": [[rank, stream (1 stdout, 2
             stderr), text]], "offset" (the next one to ask for), "dropped" (lines lost to
             the buffer cap), "done": bool, "exit_code": int|null, "message": str|null,
             "bad_rank": int|null}   Waits up to 10 s for news.
``step_cancel`` {"job_id", "step"} -> {"cancelled": bool}   (kill the step's tasks)

JOB: {"job_id", "name", "user", "uid", "gid", "account", "partition", "qos", "state",
      "reason", "node", "gpus" (count requested), "gpu_ids" ([uuid]), "gpu_indices" ([int]),
      "cpus", "mem_mb", "time_limit" (s|null), "submit_time", "start_time", "end_time"
      (epoch seconds|null), "exit_code" (int|null), "signal" (int|null), "work_dir",
      "stdout", "stderr", "attempt", "requeue_count", "preempt_count", "priority",
      "gpu_util_mean" (% over its sampled GPU-time|null), "gpu_util_max" (%|null),
      "gpu_mem_max_mb" (most memory used on one of its GPUs|null), "energy_j" (null until
      sampled), "max_rss" (peak memory of its cgroup, bytes|null), "total_cpu" (CPU
      seconds of its cgroup|null: sampled while it runs, final at its end), "nodes" (count), "nodelist" (compressed hostlist of its nodes, rank 0
      first in ``node``; null while pending), "ntasks_per_node" (srun tasks per node)}
      A running job whose GPUs sit idle has reason "GpuIdle".
      Slurm features: "display_id" ("123" or "<array id>_<task>"), "array_job_id",
      "array_task_id", "array_throttle", "dependency", "begin_time", "deadline",
      "hold" ("user"|"admin"|null), "nice", "cron_entry" (null unless scrontab submitted it)
      GPU sharing: "devices" ([{"index", "uuid", "kind": "gpu"|"mig"|"mps"|"timeslice",
      "slice_start", "mem_mb", "profile"}]: what the allocation holds; for a slice the
      uuid is its MIG-... UUID), "mig_profile" (slices asked for; "gpus" counts them) and
      "gpu_mem_mb" (--gpu-mem), both null for whole GPUs
      Accounting (whole records only, not with ``fields``): "gpus_held" (GPUs held over all
      its nodes, a slice or share by its fraction; 0 before it starts) and "billing" (the
      same by each GPU's billing weight: what fair share charges a second)
NODE: {"name", "state", "reason", "cpus", "cpus_alloc", "mem_mb", "mem_alloc_mb",
       "gpus_total", "gpus_alloc", "labels", "last_seen",
       "gpus": [{"index", "uuid", "model", "memory_mb", "job_ids": [int],
                 "mode": "whole"|"mig"|"mps"|"timeslice", "dynamic", "mps_max_clients",
                 "mps_thread_percentage", "replicas", "relaid_at",
                 "slices": [{"profile", "start", "uuid", "memory_mb", "job_id", "user"}],
                 "holders": [{"job_id", "user", "kind", "slice_start", "mem_mb"}]}]}
PARTITION: {"name", "default", "state", "nodes" (patterns), "node_names", "default_time",
       "max_time", "priority", "gpus_total", "cpus_total", "jobs_pending", "jobs_running",
       "gpus_free", "gpus_servable", "servable_size", "fragmentation"}: free whole GPUs on
       schedulable nodes, how many single-node requests of servable_size (8) GPUs they could
       serve now, and the share of free GPUs no such request can use (gpud.sched.fragmentation)
"""

from __future__ import annotations

import os

from . import jsoncodec

TYPE_CHECKING = False   # typing costs gpuctl's start-up; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
# The resource limits a submission carries (``submit``'s ``rlimits``): the submitter's own,
# which the job inherits, as Slurm's PropagateResourceLimits=ALL.
RLIMIT_NAMES = ("AS", "CORE", "CPU", "DATA", "FSIZE", "MEMLOCK", "NOFILE", "NPROC", "RSS", "STACK")
MAX_LINE = 16 * 1024 * 1024            # a request (a script and its environment fit easily)
MAX_RESPONSE = 1024 * 1024 * 1024      # an answer: squeue over 100,000 jobs is ~60 MB
MAX_DEPTH = 32                         # lists and objects in a request (a submission nests 4)
DEFAULT_SOCKET = "/run/gpud/gpud.sock"
DEFAULT_CONFIG = "/etc/gpud/gpud.toml"
OPS = frozenset({"ping", "submit", "jobs", "cancel", "nodes", "reconfigure", "show_config",
                 "report", "seff", "sstat", "telemetry", "sprio", "sshare",
                 "hold", "release", "requeue", "update_job", "update_node", "show",
                 "scrontab_get", "scrontab_set",
                 "step_launch", "step_poll", "step_cancel", "step_input", "step_resize",
                 "alloc_status", "alloc_release"})


class ProtocolError(ValueError):
    """A malformed request or response line."""


def is_int(v: Any) -> bool:
    """An integer in a decoded message: JSON's true and false arrive as Python bools, which
    are ints too, and a count or id must not accept them."""
    return isinstance(v, int) and not isinstance(v, bool)


def encode(obj: dict[str, Any]) -> bytes:
    return jsoncodec.dumps(obj).encode() + b"\n"


def request(op: str, **args: Any) -> bytes:
    return encode({"v": VERSION, "op": op, "args": args})


class Encoded(bytes):
    """A result already encoded as one JSON object: a head keeps a long answer so, to send
    it again without encoding it again."""


def ok(result: dict[str, Any] | Encoded) -> bytes:
    if isinstance(result, Encoded):
        return b'{"ok":true,"result":' + result + b"}\n"
    return encode({"ok": True, "result": result})


def error(message: str) -> bytes:
    return encode({"ok": False, "error": message})


def too_deep(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests lists and objects more than ``limit`` levels deep (no recursion)."""
    level: list[Any] = [obj]
    for _ in range(limit):
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if isinstance(v, (dict, list))]
        if not level:
            return False
    return True


def decode_request(line: bytes) -> tuple[str, dict[str, Any]]:
    """(op, args) from one request line; ProtocolError with a one-line reason otherwise."""
    if len(line) > MAX_LINE:
        raise ProtocolError("request too large")
    try:
        obj = jsoncodec.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        if "nested too deeply" in str(e):
            raise ProtocolError(f"request is nested more than {MAX_DEPTH} levels deep") from None
        raise ProtocolError("request is not valid JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError("request must be a JSON object")
    if too_deep(obj, MAX_DEPTH):
        raise ProtocolError(f"request is nested more than {MAX_DEPTH} levels deep")
    if obj.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {obj.get('v')!r} (this head speaks {VERSION})")
    op, args = obj.get("op"), obj.get("args", {})
    if op not in OPS:
        raise ProtocolError(f"unknown operation {op!r}")
    if not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object")
    return op, args


def decode_response(line: bytes) -> dict[str, Any]:
    """The result of a successful response; raises RemoteError with the head's reason."""
    try:
        obj = jsoncodec.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("malformed response from gpud head") from None
    if not isinstance(obj, dict) or "ok" not in obj:
        raise ProtocolError("malformed response from gpud head")
    if not obj["ok"]:
        raise RemoteError(str(obj.get("error", "request refused")))
    result = obj.get("result")
    if not isinstance(result, dict):
        raise ProtocolError("malformed response from gpud head")
    return result


class RemoteError(RuntimeError):
    """The head refused a request; the message is its one-line reason."""


def find_socket(cli_value: str | None = None, config_path: str | None = None) -> str:
    """The head's socket: --socket, then $GPUD_SOCKET, then the config file, then the default."""
    if cli_value:
        return cli_value
    env = os.environ.get("GPUD_SOCKET")
    if env:
        return env
    path = config_path or os.environ.get("GPUD_CONFIG") or DEFAULT_CONFIG
    try:
        with open(path, "rb") as f:
            text = f.read()
        if _sets_no_other_socket(text):
            return DEFAULT_SOCKET
        import tomllib  # only when the file may name another socket: keeps gpuctl's start fast

        data = tomllib.loads(text.decode())   # what tomllib.load does
    except (OSError, ValueError):
        return DEFAULT_SOCKET
    sock = data.get("head", {}).get("socket") if isinstance(data.get("head"), dict) else None
    return sock if isinstance(sock, str) and sock else DEFAULT_SOCKET


_DEFAULT_SOCKET_LINE = f'socket = "{DEFAULT_SOCKET}"'.encode()
_BARE_KEY = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _sets_no_other_socket(text: bytes) -> bool:
    """Whether no parse of this config file could name a socket but DEFAULT_SOCKET, so that
    find_socket need not import tomllib (re, typing and datetime: more than the rest of
    gpuctl's start).  True for the installed gpud.toml, which spells out the default.

    Without a backslash in the file no key is written with escapes, so a key named socket
    (bare, quoted or dotted, in any table) shows the word itself.  Every occurrence must then
    be on a comment line (or a string's line that looks like one), inside a longer word
    (``relay_socket``), or on a line that is exactly ``socket = "<DEFAULT_SOCKET>"``.  An
    invalid file means the default too.  Anything else (False) is left to tomllib."""
    if b"\\" in text:
        return False
    for line in text.split(b"\n"):
        at = line.find(b"socket")
        if at < 0:
            continue
        stripped = line.strip()
        if stripped.startswith(b"#") or stripped == _DEFAULT_SOCKET_LINE:
            continue
        while at >= 0:
            before, after = line[at - 1:at] if at else b"", line[at + 6:at + 7]
            if not (before and before[0] in _BARE_KEY or after and after[0] in _BARE_KEY):
                return False
            at = line.find(b"socket", at + 6)
    return True
