"""A real Mosquitto for tests: a private config, a free loopback port, persistence on disk.

Use the ``mosquitto`` fixture (``from tests.mqtt_broker import mosquitto``) or call
``start_mosquitto(tmpdir)`` directly.  ``restart()`` brings the broker back on the same
port with its persistence file, so retained messages and persistent sessions survive, as
they do when a production broker restarts.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

MOSQUITTO_CANDIDATES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def mosquitto_binary() -> str | None:
    for path in MOSQUITTO_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("mosquitto")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


CONFIG = """\
# Written by tests/mqtt_broker.py for one test.
listener {port} 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
# The defaults (1000 queued, 20 in flight) drop QoS 1 messages under load.
max_queued_messages 100000
max_inflight_messages 1000
persistence true
persistence_location {dir}/
autosave_interval 0
user {user}
log_dest file {dir}/mosquitto.log
log_type error
log_type warning
log_type notice
log_type information
connection_messages true
"""


class MosquittoProc:
    """One Mosquitto process; ``url`` stays the same across ``restart()``."""

    def __init__(self, directory: str | os.PathLike, port: int | None = None, binary: str | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.binary = binary or mosquitto_binary()
        if self.binary is None:
            raise FileNotFoundError("mosquitto binary not found (apt-get install mosquitto)")
        self.port = port or free_port()
        self.config = self.dir / "mosquitto.conf"
        self.log_file = self.dir / "mosquitto.log"
        self.config.write_text(CONFIG.format(port=self.port, dir=self.dir, user=getpass.getuser()))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> "MosquittoProc":
        if self.running:
            return self
        self.proc = subprocess.Popen([self.binary, "-c", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not port_accepts(self.port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {err.strip()} {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mosquitto did not accept connections on port {self.port} within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM: the broker saves its persistence file)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL): nothing is saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.stop()

    def restart(self, timeout: float = 10.0) -> "MosquittoProc":
        self.stop()
        # The old listening socket is closed; retry briefly in case the port lingers.
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.start(timeout=max(0.5, deadline - time.monotonic()))
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def __enter__(self) -> "MosquittoProc":
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_mosquitto(tmpdir: str | os.PathLike, port: int | None = None) -> MosquittoProc:
    """Start a broker with its config and data in ``tmpdir``; retries on a port race."""
    last: Exception | None = None
    for _ in range(5 if port is None else 1):
        proc = MosquittoProc(tmpdir, port=port)
        try:
            return proc.start()
        except RuntimeError as e:  # someone took the free port between probe and bind
            last = e
    raise RuntimeError(f"could not start mosquitto: {last}")


def require_mosquitto() -> None:
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")


@pytest.fixture
def mosquitto(tmp_path):
    """A fresh Mosquitto for one test; stopped afterwards."""
    require_mosquitto()
    proc = start_mosquitto(tmp_path / "mosquitto")
    try:
        yield proc
    finally:
        proc.stop()
