"""What a login-node relay costs: gpuctl requests straight to the head's socket and through
``gpud relay`` (MQTT round trip over a real Mosquitto), one at a time and from several
clients at once: ``python bench/bench_relay.py [--requests N] [--clients C]``.

Every process is real (head, relay, Mosquitto on loopback); requests go through
``gpuctl.Client`` with one connection per client, as a script looping over sbatch would.
Submissions are held jobs, so the scheduler has nothing to start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpuctl import Client  # noqa: E402
from tests.cluster import Cluster, wait_for  # noqa: E402
from tests.mqtt_broker import start_mosquitto  # noqa: E402

SPEC = {"script": "#!/bin/bash\ntrue\n", "name": "bench", "work_dir": "/tmp", "env": {}, "hold": True}


def timed(sock: str, op: str, n: int, **args) -> list[float]:
    out = []
    with Client(sock) as c:
        c.call("ping")   # connect first
        for _ in range(n):
            t = time.perf_counter()
            c.call(op, **args)
            out.append(time.perf_counter() - t)
    return out


def throughput(sock: str, clients: int, n: int) -> float:
    def one() -> None:
        with Client(sock) as c:
            for _ in range(n):
                c.call("submit", spec=SPEC)
    threads = [threading.Thread(target=one) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return clients * n / (time.perf_counter() - t)


def ms(xs: list[float], q: float) -> str:
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(q * len(xs)))] * 1000:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        broker = start_mosquitto(Path(d) / "mqtt")
        relay_sock = str(Path(d) / "relay.sock")
        try:
            with Cluster(Path(d) / "c", broker.url, extra_toml="") as c:
                c.start_head()
                relay = c._spawn(["relay", "--name", "bench", "--socket", relay_sock], "relay")
                c.workers["relay"] = relay
                wait_for(lambda: subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", relay_sock,
                                                 "squeue"], env=c.env, capture_output=True).returncode == 0,
                         30, "the relay")
                print(f"{'path':8} {'op':7} {'n':>5} {'median ms':>10} {'p99 ms':>8}")
                for name, sock in (("direct", c.socket), ("relay", relay_sock)):
                    for op, args in (("ping", {}), ("submit", {"spec": SPEC})):
                        xs = timed(sock, op, a.requests, **args)
                        print(f"{name:8} {op:7} {len(xs):>5} {statistics.median(xs) * 1000:>10.2f} {ms(xs, 0.99):>8}")
                for name, sock in (("direct", c.socket), ("relay", relay_sock)):
                    rate = throughput(sock, a.clients, a.requests // a.clients)
                    print(f"{name:8} submit, {a.clients} clients at once: {rate:,.0f} jobs/s")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
