"""Hosts for multi-host tests: network namespaces joined by a bridge, or plain loopback.

As root, with ``ip netns`` working, ``Network(["head", "worker", "login"])`` makes one
network namespace per host.  The first host is the hub: it holds a bridge with the address
``10.213.7.1/24``; every other host gets a veth pair whose inner end (``eth0``, address
``10.213.7.N``) lives in its namespace and whose outer end is enslaved to the hub's bridge.
The subnet exists only inside these namespaces, so it cannot clash with the machine's own
networks, and no host can reach another's loopback: a daemon that works here talks over
the network for real.  Unix sockets are files, so the test (in the root namespace) still
reaches every host's gpuctl socket, and SO_PEERCRED still names the real caller.

Without root or ``ip netns`` (``netns_unavailable()`` says why) every host is the machine
itself, on 127.0.0.1: the same tests, without the isolation.

Everything is removed on ``close()``, also after a failure half-way through ``start()``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mqtt_broker import CONFIG as MOSQUITTO_CONFIG
from tests.mqtt_broker import MosquittoProc, mosquitto_binary, start_mosquitto

SUBNET = "10.213.7"
BROKER_PORT = 1883        # inside the hub's namespace nothing else listens


@dataclass(frozen=True)
class Host:
    name: str
    address: str              # how the other hosts reach this one
    netns: str | None = None  # None: the machine's own network

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be used here (a skip or fall-back reason), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    probe = f"gpudprobe{secrets.token_hex(3)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Network:
    """Hosts by name; ``mode`` is "netns" or "loopback"."""

    def __init__(self, names: list[str] | tuple[str, ...], *, force_loopback: bool = False) -> None:
        if not names:
            raise ValueError("a network needs at least one host")
        self.names = list(names)
        self.why_loopback = "asked for loopback" if force_loopback else netns_unavailable()
        self.mode = "loopback" if self.why_loopback else "netns"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    def start(self) -> "Network":
        if self.mode == "loopback":
            self.hosts = {n: Host(n, "127.0.0.1") for n in self.names}
            return self
        tag = secrets.token_hex(3)
        try:
            for i, name in enumerate(self.names):
                ns = f"gpud-{tag}-{name}"
                _ip("netns", "add", ns)
                self._namespaces.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                self.hosts[name] = Host(name, f"{SUBNET}.{i + 1}", ns)
            hub = self.hosts[self.names[0]].netns
            assert hub is not None
            _ip("-n", hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", hub, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
            _ip("-n", hub, "link", "set", "br0", "up")
            for i, name in enumerate(self.names[1:], start=2):
                ns = self.hosts[name].netns
                assert ns is not None
                _ip("-n", hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", hub, "link", "set", f"v{i}", "master", "br0")
                _ip("-n", hub, "link", "set", f"v{i}", "up")
                _ip("-n", ns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        # Deleting a namespace takes its veth ends and the bridge with it.
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._namespaces.clear()

    def __enter__(self) -> "Network":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_broker(self, directory: str | os.PathLike, host: str | None = None) -> MosquittoProc:
        """Mosquitto on ``host`` (default: the hub), reachable from every host."""
        where = self.hosts[host or self.names[0]]
        if where.netns is None:
            return start_mosquitto(directory)
        return NamespacedMosquitto(directory, where).start()


class NamespacedMosquitto(MosquittoProc):
    """Mosquitto inside a host's namespace, listening on the host's address."""

    def __init__(self, directory: str | os.PathLike, host: Host) -> None:
        super().__init__(directory, port=BROKER_PORT, binary=mosquitto_binary())
        self.host = host
        self.config.write_text(MOSQUITTO_CONFIG.format(port=self.port, dir=self.dir, user="root")
                               .replace("127.0.0.1", host.address))

    @property
    def url(self) -> str:
        return f"mqtt://{self.host.address}:{self.port}"

    def start(self, timeout: float = 10.0) -> "NamespacedMosquitto":
        if self.running:
            return self
        self.proc = subprocess.Popen(self.host.wrap([self.binary, "-c", str(self.config)]),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # The test cannot connect into the namespace; Mosquitto logs once it listens.
        deadline = time.monotonic() + timeout
        while f"listen socket on port {self.port}" not in self.log():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {err.strip()} {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mosquitto did not listen on {self.url} within {timeout}s")
            time.sleep(0.02)
        return self


def host_dir(root: Path, host: Host) -> Path:
    d = root / host.name
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    return d
