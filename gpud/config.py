"""gpud.toml -> frozen dataclasses; every problem is reported as ``FILE:LINE: message``.

Theory of operation
-------------------
One file configures every daemon of a cluster (the same file on every host).  ``load(path)``
reads it with ``tomllib``, finds the line of every key with ``gpud.tomlpos``, then checks
the whole document and collects *every* problem before giving up, so one run of
``gpud check-config`` lists all of them:

1. keys: every table is walked against ``known_keys()``; an unknown key is reported with a
   did-you-mean (a close spelling, or the section it belongs in) and left out of what
   follows, so one typo does not hide the real errors behind it;
2. the daemon sections (top level, ``[broker]``, ``[head]``, ``[worker]``): each setting is
   a dataclass field declared with ``setting(default, parser)``; the parser turns the TOML
   value into the field's value or raises ``ValueError`` with what to write instead;
3. the scheduling sections go to ``gpud.sched.config.sched_config_from_dict``, whose
   ``SchedConfigError.key`` names the dotted key; it is mapped back to a line here.

``ConfigError.lines`` holds the ``FILE:LINE: message`` lines, sorted by line.

Adding a daemon setting is one line: a field with ``setting(...)`` in its section's
dataclass.  ``known_keys()``, the parser, ``to_dict()``, the reload rules and the example
coverage test (tests/test_config_docs.py) all follow from it.

Reload: ``apply_live(old, new)`` takes from ``new`` the settings marked ``live=True`` and the
whole scheduling policy, keeps the rest of ``old``, and says which changed values need a
restart instead.  The head calls it on SIGHUP and on ``gpuctl scontrol reconfigure``.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable
from urllib.parse import urlsplit

from . import tomlpos
from .protocol import DEFAULT_CONFIG, DEFAULT_SOCKET
from .sched.config import KNOWN_KEYS as SCHED_KEYS
from .sched.config import SchedConfig, SchedConfigError, sched_config_from_dict
from .units import UnitError, parse_duration, parse_size_kb, parse_size_mb

LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")   # one MQTT topic level, a host name
REDACTED = "********"


class ConfigError(ValueError):
    """An invalid config.  ``lines``: one ``FILE:LINE: message`` per problem, in file order."""

    def __init__(self, lines: str | list[str]) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


# -- value parsers: TOML value -> field value, or ValueError saying what to write ----------------

Parser = Callable[[Any], Any]


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"must be a non-empty string, not {_show(v)}")
    return v


def host_address(v: Any) -> str:
    """``[worker] address``: an IP address or host name other nodes reach this one by."""
    if not isinstance(v, str) or not v or len(v) > 253 or any(c.isspace() or c in ",;/[]" for c in v):
        raise ValueError(f"must be an IP address or host name, not {_show(v)}")
    return v


def ident(v: Any) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError(f"must be a name of letters, digits, '.', '_' and '-', not {_show(v)}")
    return v


def flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, not {_show(v)}")
    return v


def name_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise ValueError(f"must be a list of names such as [\"alice\", \"bob\"], not {_show(v)}")
    return tuple(v)


def choice(*options: str) -> Parser:
    def parse(v: Any) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(repr(o) for o in options)}, not {_show(v)}")
        return v
    return parse


def count(lo: int = 0) -> Parser:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"must be a whole number >= {lo}, not {_show(v)}")
        return v
    return parse


def share(v: Any) -> float:
    """A fraction in (0, 1]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError(f"must be a number above 0 and at most 1, not {_show(v)}")
    return float(v)


def duration(*, positive: bool = False) -> Parser:
    """Seconds: a number of seconds or "90s", "10m", "1h30m", "1-00:00:00"."""
    def parse(v: Any) -> float:
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ValueError(f"must be a duration such as \"30s\" or \"5m\", not {_show(v)}")
        try:
            seconds = parse_duration(v, default_unit="s")
        except UnitError:
            raise ValueError(f"invalid duration {_show(v)}: use seconds, a suffix as in \"90s\", \"10m\", "
                             "\"2h\", \"7d\", or [D-]HH:MM:SS") from None
        if seconds is None:
            raise ValueError("must be a finite duration such as \"30s\" or \"5m\", not unlimited")
        if positive and seconds <= 0:
            raise ValueError(f"must be longer than zero, not {_show(v)}")
        return seconds
    return parse


def size_mb(v: Any) -> int:
    """Megabytes: a number of MB or "512M", "64G", "1T"."""
    return _size(v, parse_size_mb)


def size_kb(v: Any) -> int:
    """Kilobytes (KiB): a number of MB or "100K", "512M", "64G"."""
    return _size(v, parse_size_kb)


def _kb_text(kb: int) -> str:
    return f"{kb // 1024}M" if kb % 1024 == 0 else f"{kb}K"


def _size(v: Any, parse: Callable[[Any], int]) -> int:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ValueError(f"must be a size such as \"64G\" or 65536 (MB), not {_show(v)}")
    try:
        n = parse(v)
    except UnitError as e:
        raise ValueError(str(e)) from None
    if n <= 0:
        raise ValueError(f"must be a positive size such as \"64G\", not {_show(v)}")
    return n


def broker_url(v: Any) -> str:
    bad = f"must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT], not {_show(v)}"
    if not isinstance(v, str):
        raise ValueError(bad)
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValueError(bad) from None
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(bad)
    return v


def listen_address(v: Any) -> str | None:
    """``HOST:PORT`` to listen on (``[::1]:PORT`` for IPv6); "" turns the listener off."""
    if v == "":
        return None
    bad = f"must be HOST:PORT such as \"127.0.0.1:9464\", or \"\" for off, not {_show(v)}"
    if not isinstance(v, str) or ":" not in v:
        raise ValueError(bad)
    host, _, port = v.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(bad)
    return v


def gpu_spec(v: Any) -> str:
    from .gpu.sim import parse_spec  # stdlib-only module; the import is for the check alone

    try:
        parse_spec(v)
    except ValueError as e:
        raise ValueError(str(e).replace("--sim spec", "GPU spec")) from None
    return v


def gpu_modes(v: Any) -> Any:
    """``[worker] gpu_modes``: GPU selectors -> sharing modes (gpud.gpu.modes)."""
    from .gpu.modes import parse_gpu_modes

    return parse_gpu_modes(v)


def cluster_sockets(v: Any) -> dict[str, str]:
    """``[clusters]``: the clusters gpuctl -M reaches, NAME -> its head's (or relay's) socket."""
    if not isinstance(v, dict):
        raise ValueError('must be a table of NAME = "/path/to/gpud.sock" lines')
    for name, sock in v.items():
        if not _NAME.match(name) or not isinstance(sock, str) or not sock:
            raise ValueError(f'{name}: write NAME = "/path/to/gpud.sock", with a name of letters, digits, '
                             f"'.', '_' and '-', not {_show(sock)}")
    return dict(v)


NODE_LABELS = ("rack", "switch")   # where a node sits, for topology-aware placement


def node_labels(v: Any) -> dict[str, str]:
    """``[worker] labels``: this node's place in the data centre, e.g. ``{ rack = "r1" }``."""
    if not isinstance(v, dict):
        raise ValueError('must be a table such as { rack = "r1", switch = "s1" }')
    for key, value in v.items():
        if key not in NODE_LABELS:
            close = difflib.get_close_matches(key, NODE_LABELS, 1)
            hint = f"did you mean {close[0]}?" if close else f"labels are {' and '.join(NODE_LABELS)}"
            raise ValueError(f"unknown label {key!r}; {hint}")
        if not isinstance(value, str) or not _NAME.match(value):
            raise ValueError(f"{key}: must be a name of letters, digits, '.', '_' and '-', not {_show(value)}")
    return dict(v)


def node_features(v: Any) -> tuple[str, ...]:
    """``[worker] features``: what ``sbatch -C`` selects this node by, e.g. ``["a100", "ib"]``."""
    from .model import FEATURE

    if not isinstance(v, list):
        raise ValueError(f'must be a list of feature names such as ["a100", "ib"], not {_show(v)}')
    for name in v:
        if not isinstance(name, str) or not FEATURE.match(name):
            raise ValueError(f"{_show(name)} is not a feature name: up to 64 letters, digits, '.', '_' and '-' "
                             "(no ',', '&' or '|')")
    return tuple(dict.fromkeys(v))


def setting(default: Any, parse: Parser, *, live: bool = False) -> Any:
    """A config key.  ``live``: a running head applies a new value on reload."""
    return field(default=default, metadata={"parse": parse, "live": live})


# -- the daemon sections --------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokerConfig:
    url: str = setting("mqtt://127.0.0.1:1883", broker_url)
    username: str | None = setting(None, text)
    password: str | None = setting(None, text)
    password_file: str | None = setting(None, text)     # username's password, in a 0600 file
    credentials_dir: str | None = setting(None, text)   # gpud broker-credentials' files: one per user
    tls: bool = setting(False, flag)            # also implied by mqtts:// or ca_file
    ca_file: str | None = setting(None, text)


@dataclass(frozen=True)
class HeadConfig:
    socket: str = setting(DEFAULT_SOCKET, text)
    database: str | None = setting(None, text)               # default: <state_dir>/head.db
    admins: tuple[str, ...] = setting((), name_list, live=True)  # besides root: may act on any job
    node_timeout: float = setting(30.0, duration(positive=True), live=True)   # no heartbeat -> DOWN
    # how long a worker may run jobs without hearing the head; a DOWN node's jobs are
    # started elsewhere only after it (plus a margin)
    lease: float = setting(300.0, duration(positive=True))
    min_free_disk: int = setting(100 * 1024, size_kb, live=True)   # KiB free under the database, or no submissions
    schedule_interval: float = setting(5.0, duration(positive=True), live=True)  # a pass this often
    schedule_debounce: float = setting(0.005, duration(), live=True)  # gather events before a pass
    schedule_max_share: float = setting(0.5, share, live=True)  # of the head's time, passes back to back
    kill_grace: float = setting(30.0, duration(), live=True)  # SIGTERM -> SIGKILL
    metrics_listen: str | None = setting(None, listen_address)   # Prometheus /metrics; None: off
    telemetry_resolution: float = setting(60.0, duration(positive=True))  # series bucket (seconds)
    telemetry_retention: float = setting(2 * 86400.0, duration(positive=True))  # series kept (seconds)
    slurm_compat_env: bool = setting(False, flag, live=True)  # jobs also get SLURM_* variables
    mail_command: str | None = setting(None, text, live=True)  # sends --mail-type notices; None: no mail
    cron_tick: float = setting(60.0, duration(positive=True), live=True)  # s per scrontab minute (tests)
    # One user's share of a socket (the head's, or a relay's): gpud.ctlsocket.Limits.
    max_connections_per_user: int = setting(256, count(1))
    max_requests_per_user: int = setting(128, count(1))      # being answered at once
    client_timeout: float = setting(30.0, duration(positive=True))  # to finish a request line, read an answer
    max_jobs: int = setting(100_000, count(1), live=True)     # pending and running, all users (MaxJobCount)
    interactive_timeout: float = setting(30.0, duration(positive=True), live=True)  # salloc silent -> released


@dataclass(frozen=True)
class WorkerConfig:
    name: str | None = setting(None, ident)                   # default: the host name
    sim: str | None = setting(None, gpu_spec)                # e.g. "8xH100-80GB"; None: NVML
    heartbeat_interval: float = setting(5.0, duration(positive=True))
    sample_interval: float = setting(5.0, duration())          # GPU telemetry; 0: off
    cpus: int | None = setting(None, count(1))               # default: what the host has
    mem_mb: int | None = setting(None, size_mb)
    relay_socket: str | None = setting(None, text)           # also serve gpuctl here (gpud.relay)
    gpu_modes: dict[str, str] | None = setting(None, gpu_modes)  # MIG, MPS, time-slicing per GPU
    labels: dict[str, str] | None = setting(None, node_labels)   # rack and switch of this node
    features: tuple[str, ...] = setting((), node_features)     # what sbatch -C selects this node by
    address: str | None = setting(None, host_address)  # MASTER_ADDR of multi-node jobs; default: primary IPv4
    cpu_bind: str = setting("numa", choice("numa", "none"))   # jobs on their GPUs' NUMA node's CPUs (worker.cpubind)
    cgroups: str = setting("auto", choice("auto", "v2", "v1", "off"))   # job confinement (worker.cgroups)
    max_tasks_per_job: int = setting(16384, count(0))         # pids.max of a job's cgroup; 0: no limit
    sim_devices: str | None = setting(None, text)             # sim GPUs' device nodes are made here


@dataclass(frozen=True)
class Config:
    cluster: str = setting("gpud", ident)
    state_dir: str = setting("/var/lib/gpud", text)
    key_file: str = setting("/etc/gpud/cluster.key", text)
    log_level: str = setting("info", choice(*LOG_LEVELS), live=True)
    clusters: dict[str, str] | None = setting(None, cluster_sockets, live=True)  # gpuctl -M (gpuctl.clusters)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    path: str | None = None            # the file this came from, if any
    warnings: tuple[str, ...] = field(default=(), compare=False)   # FILE:LINE: warning: ...

    @property
    def database(self) -> str:
        return self.head.database or os.path.join(self.state_dir, "head.db")

    def worker_name(self) -> str:
        return self.worker.name or socket.gethostname().split(".")[0]


# Section name -> the dataclass holding its settings; "" is the top level.
SECTIONS: dict[str, type] = {"": Config, "broker": BrokerConfig, "head": HeadConfig, "worker": WorkerConfig}


def _settings(cls: type) -> list:
    return [f for f in fields(cls) if "parse" in f.metadata]


def known_keys() -> dict[str, frozenset[str]]:
    """Every accepted key per section: "" top level, "qos.*" any QOS, "partition[]" each one."""
    out = {sec: frozenset(f.name for f in _settings(cls)) for sec, cls in SECTIONS.items()}
    out[""] = out[""] | {s for s in SECTIONS if s}
    for sec, keys in SCHED_KEYS.items():
        out[sec] = out.get(sec, frozenset()) | keys
    return out


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/gpud"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gpud")


def default_path() -> str:
    return os.environ.get("GPUD_CONFIG") or DEFAULT_CONFIG


# -- loading --------------------------------------------------------------------------------------

def load(path: str | None) -> Config:
    """Read ``path`` (or $GPUD_CONFIG, or the default file when it exists); defaults without one."""
    explicit = path is not None or bool(os.environ.get("GPUD_CONFIG"))
    path = path or default_path()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{path}: no such config file") from None
        return Config(state_dir=default_state_dir())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; a TOML file must be UTF-8") from None
    return from_text(content, path)


def from_text(content: str, path: str = "<config>") -> Config:
    """Parse TOML text; every problem in ConfigError.lines as ``PATH:LINE: message``."""
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(_syntax_error(path, str(e), content)) from None
    return _build(data, path, tomlpos.key_lines(content))


def from_dict(data: dict[str, Any], path: str = "<config>") -> Config:
    """A config from already-parsed TOML; messages have no line numbers."""
    return _build(data, path, {})


def _syntax_error(path: str, message: str, content: str) -> str:
    m = re.search(r"\s*\(at line (\d+), column \d+\)$", message)
    if m:
        return f"{path}:{m.group(1)}: invalid TOML: {message[:m.start()]}"
    if message.endswith("(at end of document)"):
        return f"{path}:{content.count(chr(10)) + 1}: invalid TOML: {message[:-21].rstrip()}"
    return f"{path}: invalid TOML: {message}"


class _Problems:
    """Collects ``FILE:LINE: message`` lines for one document."""

    def __init__(self, path: str, lines: dict[tomlpos.Path, int]) -> None:
        self.path, self.lines = path, lines
        self.errors: list[tuple[int, str]] = []
        self.warnings: list[tuple[int, str]] = []

    def _where(self, key: tomlpos.Path) -> tuple[int, str]:
        line = tomlpos.line_for(self.lines, key)
        return (line or 0, f"{self.path}:{line}" if line else self.path)

    def error(self, key: tomlpos.Path, message: str) -> None:
        line, where = self._where(key)
        self.errors.append((line, f"{where}: {message}"))

    def warn(self, key: tomlpos.Path, message: str) -> None:
        line, where = self._where(key)
        self.warnings.append((line, f"{where}: warning: {message}"))


def _build(data: dict[str, Any], path: str, lines: dict[tomlpos.Path, int]) -> Config:
    problems = _Problems(path, lines)
    clean = _check_keys(data, problems)
    sections: dict[str, Any] = {}
    for sec, cls in SECTIONS.items():
        table = clean if not sec else clean.get(sec, {})
        if not isinstance(table, dict):
            problems.error((sec,), f"{sec}: must be a table: write [{sec}] and its settings under it")
            table = {}
        sections[sec] = _read_section(cls, table, sec, problems)
    sched = _sched_config(clean, path, problems)
    top = sections[""]
    cfg = replace(
        top, state_dir=top.state_dir if "state_dir" in clean else default_state_dir(),
        broker=sections["broker"], head=sections["head"], worker=sections["worker"], sched=sched, path=path,
    )
    _cross_checks(cfg, clean, problems)
    if problems.errors:
        raise ConfigError([m for _, m in sorted(problems.errors, key=lambda e: e[0])])
    return replace(cfg, warnings=tuple(m for _, m in sorted(problems.warnings, key=lambda e: e[0])))


def _sched_config(clean: dict[str, Any], path: str, problems: _Problems) -> SchedConfig:
    """The scheduling sections, every problem in them reported: sched_config_from_dict stops
    at the first, so the setting it names is left out and the rest read again, until they
    pass or a problem repeats (one that removing its setting does not cure)."""
    import copy

    data, seen = clean, set()
    for _ in range(100):
        try:
            return sched_config_from_dict(data, path)
        except SchedConfigError as e:
            where = resolve_key(data, e.key) if e.key else ()
            if e.key in seen:
                break
            seen.add(e.key)
            problems.error(where, str(e))
            if not where or isinstance(where[-1], int):
                break
            data = copy.deepcopy(data)
            table = data
            for step in where[:-1]:
                table = table[step]
            if not isinstance(table, dict) or where[-1] not in table:
                break
            del table[where[-1]]
    return SchedConfig()


def _read_section(cls: type, table: dict[str, Any], sec: str, problems: _Problems) -> Any:
    values = {}
    for f in _settings(cls):
        if f.name not in table:
            continue
        try:
            values[f.name] = f.metadata["parse"](table[f.name])
        except ValueError as e:
            key = f"{sec}.{f.name}" if sec else f.name
            problems.error((sec, f.name) if sec else (f.name,), f"{key}: {e}")
    return cls(**values)


def _cross_checks(cfg: Config, data: dict[str, Any], problems: _Problems) -> None:
    """Settings that are fine alone but not together."""
    if cfg.head.node_timeout < 2 * cfg.worker.heartbeat_interval:
        problems.error(("head", "node_timeout"),
                       f"head.node_timeout: {cfg.head.node_timeout:g}s is less than two heartbeats "
                       f"(worker.heartbeat_interval = {cfg.worker.heartbeat_interval:g}s), so healthy "
                       "nodes would go DOWN; make it at least three heartbeats")
    if cfg.head.lease < 3 * cfg.worker.heartbeat_interval:
        problems.error(("head", "lease"),
                       f"head.lease: {cfg.head.lease:g}s is less than three heartbeats "
                       f"(worker.heartbeat_interval = {cfg.worker.heartbeat_interval:g}s), so a late "
                       "answer or two would make workers kill their jobs; make it at least three heartbeats")
    broker = data.get("broker") if isinstance(data.get("broker"), dict) else {}
    if cfg.broker.url.startswith("mqtts:") and broker.get("tls") is False:
        problems.error(("broker", "tls"), "broker.tls: false contradicts the mqtts:// url; remove it "
                       "or use mqtt://")
    tls = cfg.broker.tls or cfg.broker.url.startswith("mqtts:") or cfg.broker.ca_file
    if cfg.broker.password is not None and not tls:
        problems.warn(("broker", "password"), "broker.password is sent in clear text without TLS; "
                      "use an mqtts:// url or tls = true")


# -- unknown keys ---------------------------------------------------------------------------------

def _check_keys(data: dict[str, Any], problems: _Problems) -> dict[str, Any]:
    """Report unknown keys; return a copy of ``data`` without them."""
    known = known_keys()

    def walk(table: dict[str, Any], pattern: str, where: tomlpos.Path, label: str) -> dict[str, Any]:
        allowed = known.get(pattern)
        out: dict[str, Any] = {}
        for key, value in table.items():
            sub, dotted = (f"{pattern}.{key}", f"{label}.{key}") if pattern else (key, key)
            if allowed is None:                     # named entries ([qos.NAME]) or free-form
                if f"{pattern}.*" in known and isinstance(value, dict):
                    value = walk(value, f"{pattern}.*", where + (key,), dotted)
                out[key] = value
                continue
            if key not in allowed:
                problems.error(where + (key,), _unknown(key, value, pattern, dotted, known))
                continue
            if isinstance(value, dict):
                value = walk(value, sub, where + (key,), dotted)
            elif isinstance(value, list) and f"{sub}[]" in known:
                value = [walk(v, f"{sub}[]", where + (key, i), _element(dotted, i, v)) if isinstance(v, dict)
                         else v for i, v in enumerate(value)]
            out[key] = value
        return out

    return walk(data, "", (), "")


def _element(label: str, i: int, table: dict[str, Any]) -> str:
    """How messages name a [[partition]]: by its name when it has one, as the scheduler does."""
    name = table.get("name")
    return f"{label}.{name}" if isinstance(name, str) and name else f"{label}[{i}]"


def _unknown(key: str, value: Any, pattern: str, dotted: str, known: dict[str, frozenset[str]]) -> str:
    if not pattern and isinstance(value, dict):
        sections = sorted(k for k in known[""] if k in SECTIONS or k in SCHED_KEYS[""])
        close = difflib.get_close_matches(key, sections, 1)
        hint = f"did you mean [{close[0]}]?" if close else f"sections are {', '.join(sections)}"
        return f"{dotted}: unknown section; {hint}"
    allowed = known[pattern]
    homes = sorted(p for p, keys in known.items() if key in keys and p != pattern)
    if homes:  # a real key in the wrong table beats a near spelling in this one
        return f"{dotted}: unknown setting here; it belongs in {_section_title(homes[0])}"
    close = difflib.get_close_matches(key, sorted(allowed), 1)
    if close:
        return f"{dotted}: unknown setting; did you mean {close[0]}?"
    return f"{dotted}: unknown setting; {_section_title(pattern)} takes {', '.join(sorted(allowed))}"


def _section_title(pattern: str) -> str:
    if not pattern:
        return "the top level"
    if pattern.endswith("[]"):
        return f"[[{pattern[:-2]}]]"
    return f"[{pattern.replace('*', 'NAME')}]"


def resolve_key(data: Any, dotted: str) -> tomlpos.Path:
    """The data path of a dotted key such as "partition.debug.max_time" or "partition[1].name".

    Names may contain dots ([qos."a.b"]); a name inside an array of tables is looked up by
    its ``name`` key.  Resolves as far as the data goes.
    """
    parts = [p for p in re.split(r"\.|(\[\d+\])", dotted) if p]
    out: list[str | int] = []
    node = data
    i = 0
    while i < len(parts):
        part = parts[i]
        if isinstance(node, list):
            if part.startswith("["):
                idx = int(part[1:-1])
            else:
                idx = next((n for n, t in enumerate(node) if isinstance(t, dict) and t.get("name") == part), -1)
            if not 0 <= idx < len(node):
                break
            out.append(idx)
            node, i = node[idx], i + 1
            continue
        if not isinstance(node, dict):
            break
        for j in range(len(parts), i, -1):   # the longest run of parts that is one key
            candidate = ".".join(parts[i:j])
            if candidate in node:
                out.append(candidate)
                node, i = node[candidate], j
                break
        else:
            out.append(part)   # a missing key: its table's line is the best we have
            break
    return tuple(out)


# -- reload and display ---------------------------------------------------------------------------

def apply_live(old: Config, new: Config) -> tuple[Config, list[str]]:
    """``old`` with ``new``'s live settings and scheduling policy; lines for what needs a restart."""
    notes: list[str] = []
    merged: dict[str, Any] = {}
    for sec, cls in SECTIONS.items():
        was, now = (old, new) if not sec else (getattr(old, sec), getattr(new, sec))
        changes = {}
        for f in _settings(cls):
            a, b = getattr(was, f.name), getattr(now, f.name)
            if a == b:
                continue
            if f.metadata["live"]:
                changes[f.name] = b
            else:
                key = f"{sec}.{f.name}" if sec else f.name
                shown = (REDACTED, REDACTED) if f.name == "password" else (_show(a), _show(b))
                notes.append(f"{key} changed from {shown[0]} to {shown[1]}: needs a restart; "
                             "the running value is kept")
        merged[sec] = replace(was, **changes)
    cfg = replace(merged[""], broker=merged["broker"], head=merged["head"], worker=merged["worker"],
                  sched=new.sched, path=new.path, warnings=new.warnings)
    return cfg, notes


def to_dict(cfg: Config, *, redact: bool = True) -> dict[str, Any]:
    """The config as gpud.toml would spell it (seconds for durations, MB for sizes, "NK" for
    those kept in KiB).

    ``from_dict(to_dict(cfg, redact=False))`` gives ``cfg`` back.  Unset optional keys are
    left out, as TOML has no null.
    """
    out: dict[str, Any] = {}
    for sec, cls in SECTIONS.items():
        obj = cfg if not sec else getattr(cfg, sec)
        table = {f.name: list(v) if isinstance(v, tuple) else _kb_text(v) if f.metadata["parse"] is size_kb else v
                 for f in _settings(cls) if (v := getattr(obj, f.name)) is not None}
        if redact and "password" in table:
            table["password"] = REDACTED
        if sec:
            out[sec] = table
        else:
            out.update(table)
    out.update(sched_to_dict(cfg.sched))
    return out


# SchedConfig fields that are tables of their own in gpud.toml, and one that is derived.
_SCHED_TABLES = {"weights": ("scheduler", "weights"), "preemption": ("preemption",),
                 "billing": ("billing", "weights"), "prices": ("billing", "prices")}
_SCHED_DERIVED = frozenset({"default_partition"})   # the [[partition]] with default = true


def toml_key(field_name: str, keys: frozenset[str]) -> str | None:
    """The gpud.toml key of a dataclass field: the same name, or without "_mb" for sizes."""
    if field_name in keys:
        return field_name
    if field_name.endswith("_mb") and field_name[:-3] in keys:
        return field_name[:-3]
    return None


def _plain(obj: Any, keys: frozenset[str], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        key = toml_key(f.name, keys)
        if key is None or key in skip:
            continue
        v = getattr(obj, f.name)
        if v is None:
            # None from a key whose default is not None can only have been written "unlimited".
            if f.default is not None and f.default is not MISSING:
                out[key] = "unlimited"
            continue
        out[key] = list(v) if isinstance(v, tuple) else v
    return out


def sched_to_dict(s: SchedConfig) -> dict[str, Any]:
    """The scheduling sections of gpud.toml for ``s``."""
    out: dict[str, Any] = {"scheduler": _plain(s, SCHED_KEYS["scheduler"] - {"weights"})}
    for name, (section, *sub) in _SCHED_TABLES.items():
        v = getattr(s, name)
        table = dict(v) if isinstance(v, dict) else _plain(v, frozenset(f.name for f in fields(v)))
        if sub:
            out.setdefault(section, {})[sub[0]] = table
        else:
            out[section] = table
    out["partition"] = [_plain(p, SCHED_KEYS["partition[]"]) for p in s.partitions.values()]
    out["qos"] = {q.name: _plain(q, SCHED_KEYS["qos.*"]) for q in s.qos.values()}
    out["accounts"] = {a.name: _plain(a, SCHED_KEYS["accounts.*"]) for a in s.accounts.values()}
    return out
