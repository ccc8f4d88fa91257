"""Clusters for the interactive tests: a standalone daemon, or a head and two workers over
Mosquitto, each with a short ``interactive_timeout``, and gpuctl run on a real terminal."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster import Cluster, env_for_children, wait_for

TIMEOUT = 3.0   # [head] interactive_timeout in these clusters (seconds)
HEAD_EXTRA = f'interactive_timeout = "{TIMEOUT:g}s"\n'


def gpuctl_argv(socket: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuctl.main", "--socket", socket, *args]


def child_env(socket: str) -> dict[str, str]:
    """gpuctl (as `gpuctl`) on PATH, pointed at ``socket``."""
    env = env_for_children()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["GPUD_SOCKET"] = socket
    for k in ("GPUD_JOB_ID", "SLURM_JOB_ID"):
        env.pop(k, None)
    return env


class MqttRig(Cluster):
    """A head and two 2-GPU workers (w1, w2) over a real Mosquitto."""

    def __init__(self, root: Path, broker_url: str, **kw) -> None:
        super().__init__(root, broker_url, **kw)
        self.config.write_text(self.config.read_text().replace("[head]\n", "[head]\n" + HEAD_EXTRA, 1))

    def up(self) -> "MqttRig":
        self.start_head()
        self.start_worker("w1", "2xH100-80GB")
        self.start_worker("w2", "2xH100-80GB")
        return self


class StandaloneRig:
    """``gpud standalone --sim 2xH100-80GB``: head, worker and broker in one process."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = self.root / "gpud.toml"
        self.config.write_text(f'state_dir = "{self.root / "state"}"\nlog_level = "info"\n'
                               f'[head]\n{HEAD_EXTRA}schedule_interval = "1s"\nkill_grace = "2s"\n')
        self.env = env_for_children()
        self.proc: subprocess.Popen | None = None
        self.socket = ""

    def up(self) -> "StandaloneRig":
        self._log = open(self.root / "standalone.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpud.cli", "standalone", "--sim", "2xH100-80GB",
                                      "--config", str(self.config)], env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.root)
        m = wait_for(lambda: re.search(r"GPUD_SOCKET=(\S+)", self.log()), 60, "gpud standalone to start")
        self.socket = m.group(1)
        wait_for(lambda: self.gpuctl("sinfo", "-h", check=False).stdout.strip(), 60, "its worker to register")
        return self

    def log(self, name: str = "standalone") -> str:
        try:
            return (self.root / "standalone.log").read_text(errors="replace")
        except OSError:
            return ""

    def gpuctl(self, *args: str, check: bool = True, input: str | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run(gpuctl_argv(self.socket, *args), env=self.env, capture_output=True, text=True,
                           input=input, cwd=str(self.root), timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"gpuctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture(params=["mosquitto", "standalone"])
def rig(request, tmp_path):
    """Each test once on a head with two workers over Mosquitto, once on gpud standalone."""
    if request.param == "mosquitto":
        broker = request.getfixturevalue("mosquitto")
        r = MqttRig(tmp_path / "c", broker.url).up()
    else:
        r = StandaloneRig(tmp_path / "s").up()
    try:
        yield r
    finally:
        r.close()


def gpus_allocated(rig) -> int:
    import json

    r = rig.gpuctl("sinfo", "--json", check=False)
    return sum(n["gpus_alloc"] for n in json.loads(r.stdout)["nodes"]) if r.returncode == 0 else -1


class Terminal:
    """A command on a real pseudo-terminal (Python's pty module), read and typed into."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, rows: int = 24, cols: int = 80) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                     start_new_session=True, preexec_fn=_controlling(slave))
        os.close(slave)
        self.out = b""

    def type(self, text: str | bytes) -> None:
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def resize(self, rows: int, cols: int) -> None:
        import fcntl
        import struct
        import termios

        # The kernel sends SIGWINCH to the terminal's foreground process group, as a terminal
        # emulator's resize does.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def read_until(self, pattern: str | bytes, timeout: float = 30.0) -> re.Match:
        pat = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = pat.search(self.out)
            if m:
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}; got {self.out[-2000:]!r}")
            r, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:   # EIO: the other side closed
                    chunk = b""
                if not chunk and self.proc.poll() is not None:
                    raise AssertionError(f"ended while waiting for {pattern!r}; got {self.out[-2000:]!r}")
                self.out += chunk

    def drain(self) -> None:
        while select.select([self.master], [], [], 0)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.out += chunk

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running; got {self.out[-2000:]!r}")
            self.drain()
            time.sleep(0.02)
        self.drain()
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        os.close(self.master)


def _controlling(fd: int):
    def make() -> None:
        import fcntl
        import termios

        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
    return make
