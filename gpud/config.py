"""gpud.toml -> frozen dataclasses.  Command-line flags override the file.

With no config file at all, the defaults plus flags run a cluster.
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any

from .protocol import DEFAULT_CONFIG, DEFAULT_SOCKET
from .sched.config import SchedConfig
from .units import UnitError, parse_duration


class ConfigError(ValueError):
    """An invalid config; the message names the file and what to fix."""


@dataclass(frozen=True)
class BrokerConfig:
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None


@dataclass(frozen=True)
class HeadConfig:
    socket: str = DEFAULT_SOCKET
    database: str | None = None        # default: <state_dir>/head.db
    admins: tuple[str, ...] = ()       # users besides root who may act on any job
    node_timeout: float = 30.0         # seconds without a heartbeat before a node is DOWN
    schedule_interval: float = 5.0     # a pass at least this often
    schedule_debounce: float = 0.005   # gather events this long before a pass
    kill_grace: float = 30.0           # SIGTERM -> SIGKILL at cancel and time limit


@dataclass(frozen=True)
class WorkerConfig:
    name: str | None = None            # default: the host name
    sim: str | None = None             # e.g. "8xH100-80GB"; None: NVML
    heartbeat_interval: float = 5.0
    cpus: int | None = None            # default: what the host has
    mem_mb: int | None = None


@dataclass(frozen=True)
class Config:
    cluster: str = "gpud"
    state_dir: str = "/var/lib/gpud"
    key_file: str = "/etc/gpud/cluster.key"
    log_level: str = "info"
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    path: str | None = None            # the file this came from, if any

    @property
    def database(self) -> str:
        return self.head.database or os.path.join(self.state_dir, "head.db")

    def worker_name(self) -> str:
        return self.worker.name or socket.gethostname().split(".")[0]


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/gpud"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gpud")


def load(path: str | None) -> Config:
    """Read ``path`` (or the default file when it exists); defaults when there is none."""
    explicit = path is not None
    path = path or os.environ.get("GPUD_CONFIG") or DEFAULT_CONFIG
    if not os.path.exists(path):
        if explicit:
            raise ConfigError(f"{path}: no such config file")
        return Config(state_dir=default_state_dir())
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    return from_dict(data, path)


def from_dict(data: dict[str, Any], path: str = "<config>") -> Config:
    def section(name: str) -> dict[str, Any]:
        v = data.get(name, {})
        if not isinstance(v, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
        return v

    def dur(sec: dict, key: str, default: float) -> float:
        if key not in sec:
            return default
        try:
            v = parse_duration(sec[key], default_unit="s")
        except UnitError as e:
            raise ConfigError(f"{path}: {key}: {e}") from None
        if v is None:
            raise ConfigError(f"{path}: {key} must be finite")
        return v

    top = Config(state_dir=default_state_dir())
    b, h, w = section("broker"), section("head"), section("worker")
    cfg = replace(
        top,
        cluster=str(data.get("cluster", top.cluster)),
        state_dir=str(data.get("state_dir", top.state_dir)),
        key_file=str(data.get("key_file", top.key_file)),
        log_level=str(data.get("log_level", top.log_level)),
        broker=BrokerConfig(
            url=str(b.get("url", BrokerConfig.url)),
            username=b.get("username"), password=b.get("password"),
            tls=bool(b.get("tls", False)), ca_file=b.get("ca_file"),
        ),
        head=HeadConfig(
            socket=str(h.get("socket", DEFAULT_SOCKET)),
            database=h.get("database"),
            admins=tuple(str(a) for a in h.get("admins", ())),
            node_timeout=dur(h, "node_timeout", HeadConfig.node_timeout),
            schedule_interval=dur(h, "schedule_interval", HeadConfig.schedule_interval),
            schedule_debounce=dur(h, "schedule_debounce", HeadConfig.schedule_debounce),
            kill_grace=dur(h, "kill_grace", HeadConfig.kill_grace),
        ),
        worker=WorkerConfig(
            name=w.get("name"), sim=w.get("sim"),
            heartbeat_interval=dur(w, "heartbeat_interval", WorkerConfig.heartbeat_interval),
            cpus=w.get("cpus"), mem_mb=w.get("mem_mb"),
        ),
        path=path,
    )
    return cfg
