"""Prometheus metrics of the head, served on ``[head] metrics_listen`` (``/metrics``).

Theory of operation
-------------------
Gauges are not kept up to date as things happen: a collector reads the head's own state
when Prometheus scrapes (jobs in memory, nodes, the latest GPU samples of
``head.telemetry``), so a metric can never disagree with ``squeue`` or ``sinfo``.  The
HTTP server runs in the head's event loop (a small asyncio server, not prometheus-client's
thread), so collectors read that state without locks and never see it half-changed.

Counters count what happened since the head started, as Prometheus expects of a process:
job outcomes, requeues, preemptions, idle-GPU actions and allocated GPU-seconds by account
come from ``Store.on_commit``, which sees every committed job transition; the scheduler
pass histogram is fed by ``Head.schedule_pass``.  The GPU-seconds counter adds the running
allocations' time so far at scrape time, so it grows smoothly and never goes back.

Every series the cluster can produce is bounded by its nodes, GPUs, partitions, accounts
and the fixed sets of states and reasons: no job ids or users as labels.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..model import JobState
from .store import Txn
from .telemetry import IDLE_REASON, IDLE_UTIL

if TYPE_CHECKING:
    from .daemon import Head

log = logging.getLogger("gpud.metrics")

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STALE_INTERVALS = 3          # a GPU sample older than this many intervals is not shown
MAX_REQUEST = 8192           # bytes of request line and headers we read
REQUEST_TIMEOUT = 5.0


class HeadMetrics:
    """The registry of one head: collectors over its state, counters fed by its commits."""

    def __init__(self, head: "Head") -> None:
        self.head = head
        self.registry = CollectorRegistry(auto_describe=False)
        self.pass_seconds = Histogram("gpud_scheduler_pass_seconds", "Duration of one scheduler pass.",
                                      buckets=PASS_BUCKETS, registry=self.registry)
        self.outcomes: Counter[tuple[str, str]] = Counter()      # (state, partition)
        self.requeues: Counter[str] = Counter()                  # partition
        self.preemptions: Counter[str] = Counter()               # partition
        self.idle_actions: Counter[tuple[str, str]] = Counter()  # (partition, action)
        self.gpu_seconds: Counter[str] = Counter()               # account: ended allocations
        self.registry.register(_Collector(self))
        head.store.on_commit.append(self.on_commit)
        self._server: asyncio.AbstractServer | None = None

    # -- fed by the head ------------------------------------------------------------------

    def observe_pass(self, seconds: float) -> None:
        self.pass_seconds.observe(seconds)

    def on_commit(self, txn: Txn) -> None:
        for before, after, event, now in txn.moves:
            part = after.partition
            if after.state.terminal and not before.state.terminal:
                self.outcomes[(after.state.value, part)] += 1
            if before.state.active and not after.state.active:
                if after.state is JobState.PENDING:
                    self.requeues[part] += 1
                if before.start_time is not None:
                    self.gpu_seconds[before.account] += max(0.0, now - before.start_time) * len(before.gpu_indices)
            if event == "preempted":
                self.preemptions[part] += 1
            elif event == "gpu_idle":
                stop = after.stop_reason or ""
                self.idle_actions[(part, stop[5:] if stop.startswith("idle:") else "none")] += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the HTTP endpoint ------------------------------------------------------------------

    async def start(self, listen: str) -> None:
        host, port = split_listen(listen)
        self._server = await asyncio.start_server(self._serve, host, port)
        bound = self._server.sockets[0].getsockname() if self._server.sockets else (host, port)
        log.info("metrics on http://%s:%d/metrics", bound[0], bound[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self.render()
            elif path == "/":
                status, ctype, body = "200 OK", "text/plain", b"gpud head: metrics at /metrics\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found; try /metrics\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                ConnectionError, UnicodeError, ValueError):
            pass  # a scanner or a broken client: nothing to answer
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()


def split_listen(listen: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class _Collector:
    """Reads the head's state at scrape time (event-loop thread: no locks needed)."""

    def __init__(self, metrics: HeadMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []   # no collect() at registration time: the head is not running yet

    def collect(self) -> Iterator[Metric]:
        m, head = self.m, self.m.head
        now = head.clock()
        yield from self._jobs(head)
        yield from self._gpus(head, now)
        yield from self._accounts(head, now)
        for name, doc, counts, labels in (
            ("gpud_job_outcomes", "Jobs that ended, by final state.", m.outcomes, ("state", "partition")),
            ("gpud_job_requeues", "Allocations that ended with the job back in the queue.", m.requeues,
             ("partition",)),
            ("gpud_preemptions", "Jobs preempted by the scheduler.", m.preemptions, ("partition",)),
            ("gpud_idle_gpu_flags", "Jobs flagged for idle GPUs, by the action taken.", m.idle_actions,
             ("partition", "action")),
        ):
            fam = CounterMetricFamily(name, doc, labels=labels)
            for key, value in sorted(counts.items()):
                fam.add_metric(key if isinstance(key, tuple) else (key,), value)
            yield fam
        dropped = CounterMetricFamily("gpud_telemetry_samples_dropped", "Malformed samples dropped.")
        dropped.add_metric([], head.telemetry.dropped)
        yield dropped

    @staticmethod
    def _jobs(head: "Head") -> Iterator[Metric]:
        jobs = GaugeMetricFamily("gpud_jobs", "Pending and running jobs.", labels=("state", "reason", "partition"))
        idle = GaugeMetricFamily("gpud_jobs_gpu_idle", "Running jobs flagged for idle GPUs.", labels=("partition",))
        counts: Counter[tuple[str, str, str]] = Counter()
        idle_counts: Counter[str] = Counter()
        for j in head.store.active.values():
            counts[(j.state.value, j.reason or "None", j.partition)] += 1
            if j.state.active and j.reason == IDLE_REASON:
                idle_counts[j.partition] += 1
        for key, n in sorted(counts.items()):
            jobs.add_metric(key, n)
        for part in sorted(set(head.cfg.sched.partitions) | set(idle_counts)):
            idle.add_metric((part,), idle_counts.get(part, 0))
        yield jobs
        yield idle

    @staticmethod
    def _gpus(head: "Head", now: float) -> Iterator[Metric]:
        labels = ("node", "model", "mode")
        total = GaugeMetricFamily("gpud_gpus", "GPUs by node, model and mode.", labels=labels)
        alloc = GaugeMetricFamily("gpud_gpus_allocated", "GPUs allocated to jobs.", labels=labels)
        busy = GaugeMetricFamily("gpud_gpus_busy", f"GPUs at {IDLE_UTIL:g}% utilization or more in the "
                                 "latest sample.", labels=labels)
        nodes = GaugeMetricFamily("gpud_nodes", "Nodes by state.", labels=("state",))
        per = ("node", "gpu", "model")
        util = GaugeMetricFamily("gpud_gpu_utilization_percent", "GPU utilization, latest sample.", labels=per)
        mem = GaugeMetricFamily("gpud_gpu_memory_used_bytes", "GPU memory used, latest sample.", labels=per)
        power = GaugeMetricFamily("gpud_gpu_power_watts", "GPU power draw, latest sample.", labels=per)
        temp = GaugeMetricFamily("gpud_gpu_temperature_celsius", "GPU temperature, latest sample.", labels=per)
        held: dict[str, set[int]] = {}
        for j in head.store.active.values():
            if j.state.active and j.node:
                held.setdefault(j.node, set()).update(j.gpu_indices)
        states: Counter[str] = Counter()
        for name in sorted(head.store.nodes):
            rec = head.store.nodes[name]
            states[rec.state] += 1
            sample = head.telemetry.latest.get(name)
            if sample is not None and now - sample.time > STALE_INTERVALS * sample.interval:
                sample = None
            groups: Counter[tuple[str, str]] = Counter()
            groups_alloc: Counter[tuple[str, str]] = Counter()
            groups_busy: Counter[tuple[str, str]] = Counter()
            for g in rec.info.get("gpus", []):
                key = (str(g.get("model", "?")), str(g.get("mode", "whole")))
                index = g.get("index")
                groups[key] += 1
                groups_alloc[key] += index in held.get(name, ())
                reading = sample.gpus.get(index) if sample is not None else None
                if reading is None:
                    continue
                ids = (name, str(index), key[0])
                if reading.util is not None:
                    groups_busy[key] += reading.util >= IDLE_UTIL
                    util.add_metric(ids, reading.util)
                if reading.mem_used_mb is not None:
                    mem.add_metric(ids, reading.mem_used_mb * 1024 * 1024)
                if reading.power_w is not None:
                    power.add_metric(ids, reading.power_w)
                if reading.temp_c is not None:
                    temp.add_metric(ids, reading.temp_c)
            for key in sorted(groups):
                total.add_metric((name, *key), groups[key])
                alloc.add_metric((name, *key), groups_alloc[key])
                busy.add_metric((name, *key), groups_busy[key])
        for state, n in sorted(states.items()):
            nodes.add_metric((state,), n)
        yield from (nodes, total, alloc, busy, util, mem, power, temp)

    def _accounts(self, head: "Head", now: float) -> Iterator[Metric]:
        seconds = Counter(self.m.gpu_seconds)
        gpus: Counter[str] = Counter()
        for j in head.store.active.values():
            if j.state.active and j.start_time is not None:
                seconds[j.account] += max(0.0, now - j.start_time) * len(j.gpu_indices)
                gpus[j.account] += len(j.gpu_indices)
        used = CounterMetricFamily("gpud_account_gpu_seconds", "GPU-seconds allocated, by account.",
                                   labels=("account",))
        held = GaugeMetricFamily("gpud_account_gpus_allocated", "GPUs allocated now, by account.",
                                 labels=("account",))
        for account in sorted(set(seconds) | set(gpus)):
            used.add_metric((account,), seconds[account])
            held.add_metric((account,), gpus[account])
        yield used
        yield held
