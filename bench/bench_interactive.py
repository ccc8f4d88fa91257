"""Interactive steps: ``python bench/bench_interactive.py [--keys N] [--mib N]``.

A head, Mosquitto and one sim worker as processes on this machine (tests/cluster.py), and
gpuctl on a real pseudo-terminal (tests/interactive_rig.py).  Measures:

* keystroke to echo through ``gpuctl srun --gpus 1 --pty bash``: one key typed on the local
  terminal, until bash's echo of it is back there (gpuctl -> head -> broker -> worker ->
  the node's pty -> bash -> and back); p50 and p99 of N keys;
* bulk output: ``gpuctl srun --gpus 1 cat FILE`` of N MiB into a pipe, MB/s;
* the head's answer time for a ``jobs`` request (squeue's) on another connection, idle and
  while that bulk output runs: large output must not starve other requests.

Needs ``mosquitto``.  Writes the ``interactive`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import stamp, table, write_section

from tests.interactive_rig import MqttRig, Terminal, child_env, gpuctl_argv  # noqa: E402
from tests.mqtt_broker import start_mosquitto  # noqa: E402


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def keystrokes(rig: MqttRig, n: int) -> list[float]:
    t = Terminal(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "--pty", "env", "PS1=PS1> ", "bash", "--norc",
                             "--noprofile", "-i"), child_env(rig.socket), str(rig.root))
    try:
        t.read_until(r"PS1> $", 60)
        out = []
        for i in range(n):
            if i and i % 50 == 0:
                t.type(b"\x15")              # Ctrl-U: an empty line again
                t.read_until(rb"\x1b\[K", 30)   # the line erased
            t.out = b""
            start = time.perf_counter()
            t.type(b"x")
            t.read_until(rb"x", 30)
            out.append(time.perf_counter() - start)
        t.type(b"\x15exit\r")
        t.wait(30)
        return out
    finally:
        t.close()


def answer_times(rig: MqttRig, stop: threading.Event, into: list[float]) -> None:
    from gpuctl import Client

    with Client(rig.socket) as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.call("jobs")
            into.append(time.perf_counter() - start)
            time.sleep(0.02)


def bulk(rig: MqttRig, mib: int) -> tuple[float, list[float]]:
    path = rig.root / "bigfile"
    line = b"y" * 99 + b"\n"
    with open(path, "wb") as f:
        f.write(line * (mib * (1 << 20) // len(line)))
    size = path.stat().st_size
    stop, times = threading.Event(), []
    watcher = threading.Thread(target=answer_times, args=(rig, stop, times))
    proc = subprocess.Popen(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "cat", str(path)),
                            env=child_env(rig.socket), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    got = 0
    first = proc.stdout.read(1)       # the step has started: time the stream, not the allocation
    start = time.perf_counter()
    watcher.start()
    got = len(first)
    while chunk := proc.stdout.read(1 << 20):
        got += len(chunk)
    elapsed = time.perf_counter() - start
    stop.set()
    watcher.join()
    proc.wait(60)
    assert got == size, (got, size)
    return size / elapsed / 1e6, times


def run(keys: int, mib: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = start_mosquitto(root / "broker")
        try:
            rig = MqttRig(root / "c", broker.url, node_timeout=30.0, heartbeat=1.0)
            try:
                rig.start_head()
                rig.start_worker("w1", "2xH100-80GB")
                idle: list[float] = []
                stop = threading.Event()
                t = threading.Thread(target=answer_times, args=(rig, stop, idle))
                t.start()
                time.sleep(1.0)
                stop.set()
                t.join()
                lat = keystrokes(rig, keys)
                mb_s, busy = bulk(rig, mib)
            finally:
                rig.close()
        finally:
            broker.stop()
    return {"lat": lat, "mb_s": mb_s, "idle": idle, "busy": busy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    r = run(a.keys, a.mib)
    ms = lambda v: f"{v * 1000:.1f} ms"   # noqa: E731
    rows = [[f"keystroke to echo through srun --pty bash, p50 / p99 of {len(r['lat'])}",
             f"{ms(statistics.median(r['lat']))} / {ms(pct(r['lat'], 99))}"],
            [f"srun cat of a {a.mib} MiB file (100-byte lines) into a pipe", f"{r['mb_s']:.1f} MB/s"],
            [f"head's answer to squeue's jobs request, idle: p50 / p99 of {len(r['idle'])}",
             f"{ms(statistics.median(r['idle']))} / {ms(pct(r['idle'], 99))}"],
            [f"... while that srun cat runs: p50 / p99 of {len(r['busy'])}",
             f"{ms(statistics.median(r['busy']))} / {ms(pct(r['busy'], 99))}"]]
    text = ("### Interactive steps: srun --pty and bulk srun output (1 sim worker, Mosquitto)\n\n"
            f"{stamp()}\n\n" + table(["measure", "result"], rows) +
            "\n\nThe keystroke travels gpuctl -> head socket -> head -> broker -> worker -> the node's pty, "
            "and bash's echo comes back the same way (one MQTT round trip plus two socket requests). "
            "Bulk output is bounded by the worker's 1 MiB window of unacknowledged output and the head's "
            "256 KiB per poll answer; the other connection's requests are answered between those answers.")
    print(text)
    if not a.no_doc:
        write_section("interactive", text)


if __name__ == "__main__":
    main()
