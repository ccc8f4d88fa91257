"""A TCP proxy a test can cut: the network between a daemon and its broker, or a Unix
socket proxy between gpuctl and the head that drops answers.

``TcpProxy(upstream_port)`` listens on a free loopback port and pipes each connection to
the upstream port.  ``cut()`` closes every connection at once and refuses new ones (closed
as soon as accepted) until ``restore()``: to the daemon behind it, a network cut.

``AnswerDropper(upstream_path, path)`` is a Unix-socket proxy for the head's gpuctl socket:
it forwards each request line and, while ``drop`` says so for that line, closes the
client's connection as soon as the head has answered it, so the answer is lost after the
commit.  Threads, no asyncio: the tests drive real processes synchronously.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable

from tests.mqtt_broker import free_port


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.port = free_port()
        self._listener = socket.create_server((host, self.port))
        self._cut = False
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                try:
                    server = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()


class AnswerDropper:
    """Unix-socket proxy: ``drop(line)`` True closes the client's connection right after the
    head answered that line (the answer is read and thrown away)."""

    def __init__(self, upstream: str, path: str, drop: Callable[[bytes], bool]) -> None:
        self.upstream, self.path, self.drop = upstream, path, drop
        self.dropped = 0
        if os.path.exists(path):
            os.unlink(path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o666)
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="dropper").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            head.connect(self.upstream)
            cf, hf = client.makefile("rb"), head.makefile("rb")
            for line in cf:
                head.sendall(line)
                answer = hf.readline()
                if not answer:
                    break
                if self.drop(line):
                    self.dropped += 1
                    break          # the head committed and answered; the client never hears it
                client.sendall(answer)
        except OSError:
            pass
        finally:
            for s in (client, head):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()
