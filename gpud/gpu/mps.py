"""CUDA MPS control daemons: one per MPS GPU, for one user at a time.

Theory of operation
-------------------
An MPS GPU runs many small jobs at once through one MPS server, which gives each client a
share of the SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and a cap on device memory
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``).  Clients find their server through a pipe
directory; the control daemon ``nvidia-cuda-mps-control -d`` listens there and starts the
server on the first client.

``MpsDaemons`` keeps one ``Server`` record per GPU (keyed by GPU index; the device UUID it
is started with may be a MIG instance's).  ``attach`` admits a job (its client key) and
returns the environment the job needs; the first job of a user on an idle GPU starts the
control daemon, *as that user*, with ``CUDA_VISIBLE_DEVICES`` set to the GPU and its pipe
and log directories under ``<state>/mps/<index>/`` (owned by the user, mode 0700, so no
other user can reach the server).  ``sync`` is told which jobs still run; a GPU without
clients has its daemon stopped (``echo quit | nvidia-cuda-mps-control`` with the same
pipe directory).  ``adopt`` rebuilds the records of jobs that outlived a worker restart
without starting anything; ``sync`` at start also stops daemons left on GPUs that no
longer have jobs.

The rules MPS itself imposes are checked before anything starts, each a one-line
``MpsError``: one user per server at a time (another user's client would wait forever
behind it), at most ``mps_max_clients`` clients (48 is the hardware's limit), and pinned
memory that adds up to no more than the GPU has.  A fatal fault in any client (an illegal
address, say) takes down the server and every client on that GPU; that is MPS's design,
documented for users, not something the worker can prevent.

Two runners do the starting and stopping: ``ControlDaemonRunner`` runs the real command,
``StubRunner`` (simulated GPUs) only records the lifecycle so tests can check it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Protocol

from ..model import MPS_MAX_CLIENTS, GpuInfo
from .backend import GpuError

log = logging.getLogger("gpud.gpu.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT = 30.0      # seconds for the control command to start or stop a daemon
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Client = Hashable           # who holds a share: the worker uses (job id, attempt)


class MpsError(GpuError):
    """An MPS client or daemon that cannot be; the message is one line."""


@dataclass
class Server:
    """One GPU's control daemon, running (or about to) for one user."""

    index: int
    device_uuid: str        # CUDA_VISIBLE_DEVICES for the daemon: the GPU or a MIG instance
    user: str
    uid: int
    gid: int
    pipe_dir: str
    log_dir: str
    clients: dict[Client, int | None] = field(default_factory=dict)   # client -> pinned MB

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.device_uuid, "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
                "CUDA_MPS_LOG_DIRECTORY": self.log_dir}


class MpsRunner(Protocol):
    def start(self, server: Server) -> None:
        """Start the control daemon for ``server``; MpsError when it does not start."""

    def stop(self, server: Server) -> None:
        """Stop it; never raises (a daemon that is already gone is fine)."""

    def clear(self, server: Server) -> None:
        """Stop a daemon an earlier run may have left at ``server``'s pipe; never raises."""


class ControlDaemonRunner:
    """The real ``nvidia-cuda-mps-control``, run as the server's user."""

    def __init__(self, command: str = MPS_CONTROL, timeout: float = COMMAND_TIMEOUT) -> None:
        self.command, self.timeout = command, timeout

    def start(self, server: Server) -> None:
        _own_dirs(server)
        # Output goes to a file, not a pipe: the daemon forks and must not hold our pipe open.
        with tempfile.TemporaryFile("w+") as said:
            try:
                done = subprocess.run([self.command, "-d"], env=self._env(server),
                                      stdin=subprocess.DEVNULL, stdout=said, stderr=said,
                                      timeout=self.timeout, **self._as(server))
            except FileNotFoundError:
                raise MpsError(f"{self.command} not found; install the CUDA toolkit's MPS "
                               "tools or set this GPU's mode to whole") from None
            except (OSError, subprocess.SubprocessError) as e:
                raise MpsError(f"GPU {server.index}: cannot start the MPS control daemon: {e}") from None
            if done.returncode != 0:
                said.seek(0)
                text = " ".join(said.read(4096).split())[:200]
                raise MpsError(f"GPU {server.index}: the MPS control daemon did not start "
                               f"(exit {done.returncode}{': ' + text if text else ''})")

    def stop(self, server: Server) -> None:
        try:
            done = subprocess.run([self.command], input="quit\n", env=self._env(server),
                                  capture_output=True, text=True, timeout=self.timeout,
                                  **self._as(server))
            if done.returncode != 0:
                log.debug("GPU %d: MPS quit exited %d (no daemon?)", server.index, done.returncode)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("GPU %d: cannot stop the MPS control daemon: %s", server.index, e)

    def clear(self, server: Server) -> None:
        if os.path.isdir(server.pipe_dir):
            self.stop(server)   # as root: the pipe may belong to anyone

    @staticmethod
    def _env(server: Server) -> dict[str, str]:
        return {"PATH": _PATH, "LC_ALL": "C", **server.env}

    @staticmethod
    def _as(server: Server) -> dict:
        if os.geteuid() != 0 or server.uid == 0:
            return {}
        return {"user": server.uid, "group": server.gid, "extra_groups": []}


class StubRunner:
    """Simulated GPUs: records ``("start"|"stop", index, user)`` and what runs now."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        self.running: dict[int, str] = {}     # GPU index -> user

    def start(self, server: Server) -> None:
        if server.index in self.running:
            raise MpsError(f"GPU {server.index}: an MPS daemon for {self.running[server.index]} "
                           "runs already")
        _own_dirs(server)
        self.events.append(("start", server.index, server.user))
        self.running[server.index] = server.user

    def stop(self, server: Server) -> None:
        self.events.append(("stop", server.index, server.user))
        self.running.pop(server.index, None)

    def clear(self, server: Server) -> None:
        """Nothing outlives a simulated worker."""


class MpsDaemons:
    """The MPS servers of one worker; see the module docstring.  Thread-safe."""

    def __init__(self, base_dir: str, runner: MpsRunner) -> None:
        self.base_dir = base_dir
        self.runner = runner
        self._servers: dict[int, Server] = {}
        self._lock = threading.Lock()

    def attach(self, client: Client, gpu: GpuInfo, *, position: int, user: str, uid: int,
               gid: int, mem_mb: int | None, device_uuid: str | None = None) -> dict[str, str]:
        """Admit ``client`` to ``gpu``'s server (starting it when it is the first) and return
        the job's MPS environment.  ``position`` is the GPU's place in the job's
        CUDA_VISIBLE_DEVICES, which is how the memory limit names it.  A repeat is harmless."""
        with self._lock:
            server = self._servers.get(gpu.index)
            if server is not None and client in server.clients:
                return self._client_env(server, gpu, position, server.clients[client])
            self._check(server, gpu, user, mem_mb)
            if server is None:
                server = self._new(gpu, user, uid, gid, device_uuid)
                self.runner.start(server)
                self._servers[gpu.index] = server
                log.info("GPU %d: MPS control daemon started for %s", gpu.index, user)
            server.clients[client] = mem_mb
            return self._client_env(server, gpu, position, mem_mb)

    def adopt(self, client: Client, gpu: GpuInfo, *, user: str, uid: int, gid: int,
              mem_mb: int | None, device_uuid: str | None = None) -> None:
        """Record a client that outlived a worker restart; its daemon runs already."""
        with self._lock:
            server = self._servers.get(gpu.index)
            if server is None:
                server = self._servers[gpu.index] = self._new(gpu, user, uid, gid, device_uuid)
            elif server.user != user:
                log.error("GPU %d: MPS job of %s found beside jobs of %s; one MPS user at a time",
                          gpu.index, user, server.user)
            server.clients[client] = mem_mb

    def sync(self, active: Iterable[Client], mps_gpus: Iterable[GpuInfo] = ()) -> None:
        """Forget clients not in ``active`` and stop the daemons left without clients.  GPUs
        in ``mps_gpus`` without a record get a stop too (a daemon left by an earlier run)."""
        keep = set(active)
        with self._lock:
            for index, server in list(self._servers.items()):
                for client in [c for c in server.clients if c not in keep]:
                    del server.clients[client]
                if not server.clients:
                    del self._servers[index]
                    self.runner.stop(server)
                    log.info("GPU %d: MPS control daemon of %s stopped; the GPU is free",
                             index, server.user)
            for gpu in mps_gpus:
                if gpu.index not in self._servers:
                    self.runner.clear(self._new(gpu, "root", 0, 0, None))

    def user_of(self, index: int) -> str | None:
        """Whose jobs the GPU's MPS server serves now; None when it is free."""
        server = self._servers.get(index)
        return None if server is None else server.user

    def clients(self, index: int) -> int:
        server = self._servers.get(index)
        return 0 if server is None else len(server.clients)

    def stop_all(self) -> None:
        """Stop every daemon (tests, and a worker told its jobs are all gone)."""
        self.sync(())

    # -- helpers ---------------------------------------------------------------------------

    def _check(self, server: Server | None, gpu: GpuInfo, user: str, mem_mb: int | None) -> None:
        if server is not None and server.user != user:
            raise MpsError(f"GPU {gpu.index} serves MPS jobs of {server.user}; one user at a time, "
                           f"so {user}'s job must wait until they end")
        clients = server.clients if server is not None else {}
        most = min(gpu.mps_max_clients, MPS_MAX_CLIENTS)
        if len(clients) >= most:
            raise MpsError(f"GPU {gpu.index} has {len(clients)} MPS clients, its limit")
        if mem_mb is not None:
            if mem_mb <= 0:
                raise MpsError(f"GPU {gpu.index}: an MPS memory limit must be positive, not {mem_mb}")
            pinned = sum(m for m in clients.values() if m) + mem_mb
            if pinned > gpu.memory_mb:
                raise MpsError(f"GPU {gpu.index}: MPS memory limits would add up to {pinned} MB; "
                               f"it has {gpu.memory_mb} MB")

    def _new(self, gpu: GpuInfo, user: str, uid: int, gid: int, device_uuid: str | None) -> Server:
        root = os.path.join(self.base_dir, str(gpu.index))
        return Server(index=gpu.index, device_uuid=device_uuid or gpu.uuid, user=user, uid=uid,
                      gid=gid, pipe_dir=os.path.join(root, "pipe"), log_dir=os.path.join(root, "log"))

    @staticmethod
    def _client_env(server: Server, gpu: GpuInfo, position: int, mem_mb: int | None) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": server.pipe_dir}
        if gpu.mps_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(gpu.mps_thread_percentage)
        if mem_mb:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{position}={mem_mb}M"
        return env


def _own_dirs(server: Server) -> None:
    """The pipe and log directories, the user's own (0700): only they reach the server.
    Their parents stay searchable so the user's jobs can get there."""
    try:
        parent = os.path.dirname(server.pipe_dir)
        os.makedirs(parent, 0o711, exist_ok=True)
        os.chmod(os.path.dirname(parent), 0o711)
        os.chmod(parent, 0o711)
        for d in (server.pipe_dir, server.log_dir):
            os.makedirs(d, 0o700, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(d, server.uid, server.gid)
            os.chmod(d, 0o700)
    except OSError as e:
        raise MpsError(f"GPU {server.index}: cannot prepare the MPS directories: {e.strerror}") from None
