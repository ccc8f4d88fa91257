"""Telemetry at cluster scale, on the head: sample ingest, flush, /metrics render and a report.

    python bench/bench_telemetry.py [--nodes 1000] [--gpus 8]

A head in-process (real SQLite store in a temporary directory, in-memory bus, fake clock)
with NODES nodes of GPUS GPUs each, one job on every pair of GPUs, fed the samples a worker
would send.  Prints one line per measurement; docs/benchmarks.md records the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpud.bus.base import HEAD_EVENTS  # noqa: E402
from gpud.bus.memory import MemoryBroker, MemoryBus  # noqa: E402
from gpud.ctlsocket import Caller  # noqa: E402
from gpud.head.daemon import Head  # noqa: E402
from gpud.head.ops_telemetry import op_report  # noqa: E402
from gpud.head.store import JobRecord, NodeRecord, Store, Txn  # noqa: E402
from gpud.model import GpuInfo, JobSpec, JobState, NodeInfo  # noqa: E402
from tests.telemetry_rig import KEY, T0, Clock, config  # noqa: E402


def sample_body(node: str, gpus: int, jobs: list[JobRecord], t: float) -> dict:
    return {"t": t, "iv": 5.0,
            "gpus": [[i, 60.0 + i, 20_000, 400.0, 60.0, 2000.0] for i in range(gpus)],
            "jobs": [[j.job_id, j.attempt, list(j.gpu_indices)] for j in jobs], "slices": [], "procs": []}


async def setup(root: str, nodes: int, gpus: int, clock: Clock) -> Head:
    store = await Store(os.path.join(root, "head.db")).open()
    bus = MemoryBus(MemoryBroker(), "bench", "head", KEY, subscriptions=[HEAD_EVENTS])
    head = Head(replace(config(idle_period=None), state_dir=root), bus, store, clock=clock,
                socket_path=os.path.join(root, "s.sock"))
    for n in range(nodes):
        name = f"gpu{n:04d}"
        info = NodeInfo(name, 128, 1 << 21, tuple(GpuInfo(i, f"GPU-{name}-{i}", "H100-80GB", 81920)
                                                  for i in range(gpus)))
        await store.upsert_node(NodeRecord(name, info.to_dict(), "UP", None, T0, T0))
    spec = JobSpec(script="true", gpus=2)
    pending = [JobRecord(0, "bench", f"user{k % 40}", 1000, 1000, f"acct{k % 8}", "gpu", "normal",
                         JobState.PENDING, spec, 2, 1, 1024, None, T0)
               for k in range(nodes * gpus // 2)]
    saved = await store.insert_jobs(pending, T0)
    txn = Txn(store)
    for k, job in enumerate(saved):
        node, pair = divmod(k, gpus // 2)
        idx = (2 * pair, 2 * pair + 1)
        txn.transition(job, JobState.RUNNING, now=T0, event="allocated", attempt=1, node=f"gpu{node:04d}",
                       gpu_indices=idx, gpu_uuids=tuple(f"GPU-gpu{node:04d}-{i}" for i in idx), start_time=T0)
        txn.execute("INSERT INTO allocations(job_id, attempt, node, gpu_indices, gpu_uuids, cpus, mem_mb, "
                    "start_time) VALUES (?,?,?,?,?,?,?,?)",
                    (job.job_id, 1, f"gpu{node:04d}", json.dumps(list(idx)), "[]", 1, 1024, T0))
    await store.commit(txn)
    return head


async def main(nodes: int, gpus: int) -> None:
    clock = Clock()
    with tempfile.TemporaryDirectory() as root:
        head = await setup(root, nodes, gpus, clock)
        by_node: dict[str, list[JobRecord]] = {}
        for j in head.store.active.values():
            by_node.setdefault(j.node, []).append(j)
        names = sorted(by_node)
        rounds = []
        for r in range(4):   # four rounds of one sample per node, as every 5 s
            clock.t += 5
            bodies = [(n, sample_body(n, gpus, by_node[n], clock.t)) for n in names]
            t0 = time.process_time()
            for n, body in bodies:
                await head.telemetry.ingest(n, body)
            rounds.append(time.process_time() - t0)
        steady = statistics.median(rounds[1:])   # the first round also loads each job's row
        print(f"ingest: {nodes} samples of {gpus} GPUs, {len(head.store.active)} jobs: first round "
              f"{rounds[0] * 1000:.0f} ms CPU, then {steady * 1000:.0f} ms per round = "
              f"{nodes / steady:,.0f} samples/s of CPU")
        times = []
        for _ in range(5):
            t0 = time.process_time()   # CPU time: the machine is shared, wall time is noisy
            text = head.metrics.render()
            times.append(time.process_time() - t0)
        lines = text.count(b"\n")
        print(f"/metrics: {len(text) / 1e6:.1f} MB, {lines:,} lines, "
              f"median {statistics.median(times) * 1000:.0f} ms CPU per scrape")
        clock.t += 120
        t0 = time.perf_counter()
        await head.telemetry.flush()
        print(f"flush: {len(head.store.active)} job aggregates and {nodes} series rows in "
              f"{(time.perf_counter() - t0) * 1000:.0f} ms")
        clock.t += 3600
        t0 = time.perf_counter()
        rep = await op_report(head, Caller(0, 0, 1, "root"), {"since": T0, "by": "account"})
        print(f"report: {len(head.store.active)} allocations by account ({len(rep['rows'])} rows) in "
              f"{(time.perf_counter() - t0) * 1000:.0f} ms")
        await head.store.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    a = ap.parse_args()
    asyncio.run(main(a.nodes, a.gpus))
