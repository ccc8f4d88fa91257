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

Every series the cluster can produce is bounded by its nodes, GPUs, partitions, accounts,
users and the fixed sets of states and reasons: no job ids as labels.  A job without a
reason (a running one) has an empty ``reason``, which Prometheus reads as no label.

The per-GPU series carry, besides ``node``, ``gpu`` and ``model``, the labels
dcgm-exporter puts on its own (``Hostname``, ``UUID``, ``modelName``), so a site's DCGM
dashboards join with them; ratios are 0-1 (``gpud_gpu_utilization_ratio``), as Prometheus's
naming asks.  The body is the text format 0.0.4, and the Content-Type says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..model import JobState, StopReason
from ..sched.fragmentation import Fragmentation, fragmentation
from .reports import held_gpus
from .scheduling import node_view, running_view
from .store import Store, Txn
from .telemetry import IDLE_REASON, IDLE_UTIL

if TYPE_CHECKING:
    from ..config import Config
    from ..sched.config import SchedConfig
    from .telemetry import Telemetry

log = logging.getLogger("gpud.metrics")

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STALE_INTERVALS = 3          # a GPU sample older than this many intervals is not shown
FRAGMENT_SIZE = 8            # the request size the fragmentation metric and sinfo -s count
MAX_REQUEST = 8192           # bytes of request line and headers we read
REQUEST_TIMEOUT = 5.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"   # what render_text writes


def cluster_fragmentation(store: Store, sched_cfg, size: int = FRAGMENT_SIZE) -> Fragmentation:
    """Free whole GPUs against ``size``-GPU requests, per partition, as the scheduler sees
    them now (gpud.sched.fragmentation): ``/metrics`` and ``sinfo -s`` both read this."""
    nodes = [v for v in (node_view(store, name) for name in sorted(store.nodes)) if v is not None]
    running = [running_view(j) for j in store.active.values() if j.state.active and j.node is not None]
    return fragmentation(nodes, running, size, partitions={n: p.nodes for n, p in sched_cfg.partitions.items()})


def fragmentation_fields(f: Fragmentation) -> dict[str, float]:
    """A PARTITION record's fragmentation fields (gpud.protocol)."""
    return {"gpus_free": f.free_gpus, "gpus_servable": f.servable, "servable_size": f.size,
            "fragmentation": round(f.index, 4)}


class HeadMetrics:
    """The registry of one head: collectors over its state, counters fed by its commits.
    Given the store, the live config, the wall clock and the head's ``Telemetry`` (getters:
    a reload swaps the config, a test the telemetry)."""

    def __init__(self, store: Store, *, config: Callable[[], "Config"], clock: Callable[[], float],
                 telemetry: Callable[[], "Telemetry"]) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.telemetry = telemetry
        # ``registry`` holds everything as prometheus-client objects; a scrape renders the
        # histogram through its own small registry and the collector's families directly
        # (prometheus-client's writer costs about 60 us a sample: a second at 1,000 nodes).
        self.registry = CollectorRegistry(auto_describe=False)
        self._histograms = CollectorRegistry(auto_describe=False)
        self.pass_seconds = Histogram("gpud_scheduler_pass_seconds", "Duration of one scheduler pass.",
                                      buckets=PASS_BUCKETS, registry=self._histograms)
        self.registry.register(self.pass_seconds)
        self.outcomes: Counter[tuple[str, str]] = Counter()      # (state, partition)
        self.requeues: Counter[str] = Counter()                  # partition
        self.preemptions: Counter[str] = Counter()               # partition
        self.idle_actions: Counter[tuple[str, str]] = Counter()  # (partition, action)
        self.gpu_seconds: Counter[str] = Counter()               # account: ended allocations
        self.collector = _Collector(self)
        self.registry.register(self.collector)
        store.on_commit.append(self.on_commit)
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
                if before.start_time is not None:   # by fraction, over all nodes, as report bills it
                    self.gpu_seconds[before.account] += max(0.0, now - before.start_time) * held_gpus(
                        self.store, before)
            if event == "preempted":
                self.preemptions[part] += 1
            elif event == "gpu_idle":
                stop = StopReason.of(after.stop_reason)
                self.idle_actions[(part, stop.then if stop is not None and stop.kind == "idle" else "none")] += 1

    def render(self) -> bytes:
        return generate_latest(self._histograms) + render_text(self.collector.families()).encode()

    # -- the HTTP endpoint ------------------------------------------------------------------

    async def start(self, listen: str) -> None:
        host, port = split_listen(listen)
        try:
            self._server = await asyncio.start_server(self._serve, host, port)
        except OSError as e:
            raise RuntimeError(f"cannot serve /metrics on {listen}: {e.strerror or e}; set [head] "
                               "metrics_listen to a free local address, or \"\" for none") from None
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
                status, ctype, body = "200 OK", CONTENT_TYPE, self.render()
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


@dataclass
class Family:
    """One metric family as the collector builds it: cheaper than prometheus-client's objects
    at tens of thousands of samples, and rendered by ``render_text``."""

    name: str
    kind: str                                  # "gauge" or "counter"
    doc: str
    labels: tuple[str, ...] = ()
    # (label values, the same as text '{a="x",b="y"}', value)
    samples: list[tuple[tuple[str, ...], str, float]] = field(default_factory=list)

    def add(self, values: tuple[str, ...], value: float, text: str | None = None) -> None:
        """One sample; ``text`` is the label block when the caller has it formatted already."""
        if text is None:
            text = label_text(self.labels, values)
        self.samples.append((values, text, value))

    def to_metric(self) -> Metric:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        fam = cls(self.name, self.doc, labels=self.labels)
        for values, _, value in self.samples:
            fam.add_metric(values, value)
        return fam


def label_text(labels: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in zip(labels, values)) + "}"


def render_text(families: list[Family]) -> str:
    """The Prometheus text format (0.0.4) of ``families``, as prometheus-client writes it."""
    out: list[str] = []
    for f in families:
        name = f.name + "_total" if f.kind == "counter" else f.name
        doc = f.doc.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {f.kind}\n")
        out += [f"{name}{text} {_number(value)}\n" for _, text, value in f.samples]
    return "".join(out)


def _escape(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def _number(v: float) -> str:
    v = float(v)
    if v - v == 0:   # finite
        return repr(v)
    if v != v:
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


class _Collector:
    """Reads the head's state at scrape time (event-loop thread: no locks needed)."""

    def __init__(self, metrics: HeadMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []   # no collect() at registration time: the head is not running yet

    def collect(self) -> Iterator[Metric]:
        """The same families as prometheus-client objects (the registry's view)."""
        return (f.to_metric() for f in self.families())

    def families(self) -> list[Family]:
        m = self.m
        store, sched, telemetry, now = m.store, m.config().sched, m.telemetry(), m.clock()
        out = (self._jobs(store, sched) + self._gpus(store, telemetry, now) + self._fragmentation(store, sched)
               + self._accounts(store, now))
        for name, doc, counts, labels in (
            ("gpud_job_outcomes", "Jobs that ended, by final state.", m.outcomes, ("state", "partition")),
            ("gpud_job_requeues", "Allocations that ended with the job back in the queue.", m.requeues,
             ("partition",)),
            ("gpud_preemptions", "Jobs preempted by the scheduler.", m.preemptions, ("partition",)),
            ("gpud_idle_gpu_flags", "Jobs flagged for idle GPUs, by the action taken.", m.idle_actions,
             ("partition", "action")),
        ):
            fam = Family(name, "counter", doc, labels)
            for key, value in sorted(counts.items()):
                fam.add(key if isinstance(key, tuple) else (key,), value)
            out.append(fam)
        dropped = Family("gpud_telemetry_samples_dropped", "counter", "Malformed samples dropped.")
        dropped.add((), telemetry.dropped)
        out.append(dropped)
        return out

    @staticmethod
    def _jobs(store: Store, sched: "SchedConfig") -> list[Family]:
        jobs = Family("gpud_jobs", "gauge", "Pending and running jobs.", ("state", "reason", "partition"))
        idle = Family("gpud_jobs_gpu_idle", "gauge", "Running jobs flagged for idle GPUs.", ("partition",))
        owners = Family("gpud_account_jobs", "gauge", "Pending and running jobs by account and user.",
                        ("account", "user", "state"))
        counts: Counter[tuple[str, str, str]] = Counter()
        idle_counts: Counter[str] = Counter()
        by_owner: Counter[tuple[str, str, str]] = Counter()
        for j in store.active.values():
            counts[(j.state.value, j.reason or "", j.partition)] += 1
            by_owner[(j.account, j.user, j.state.value)] += 1
            if j.state.active and j.reason == IDLE_REASON:
                idle_counts[j.partition] += 1
        for key, n in sorted(counts.items()):
            jobs.add(key, n)
        for key, n in sorted(by_owner.items()):
            owners.add(key, n)
        for part in sorted(set(sched.partitions) | set(idle_counts)):
            idle.add((part,), idle_counts.get(part, 0))
        return [jobs, idle, owners]

    @staticmethod
    def _gpus(store: Store, telemetry: "Telemetry", now: float) -> list[Family]:
        labels = ("node", "model", "mode")
        total = Family("gpud_gpus", "gauge", "GPUs by node, model and mode.", labels)
        alloc = Family("gpud_gpus_allocated", "gauge", "GPUs allocated to jobs.", labels)
        busy = Family("gpud_gpus_busy", "gauge", f"GPUs at {IDLE_UTIL:g}% utilization or more in the latest sample.",
                      labels)
        nodes = Family("gpud_nodes", "gauge", "Nodes by state.", ("state",))
        node_state = Family("gpud_node_state", "gauge", "1 for each node's state (alert on state=\"DOWN\").",
                            ("node", "state"))
        per = GPU_LABELS
        util = Family("gpud_gpu_utilization_ratio", "gauge", "GPU utilization (0-1), latest sample.", per)
        mem = Family("gpud_gpu_memory_used_bytes", "gauge", "GPU memory used, latest sample.", per)
        mem_total = Family("gpud_gpu_memory_total_bytes", "gauge", "GPU memory, as the GPU registered.", per)
        mem_free = Family("gpud_gpu_memory_free_bytes", "gauge", "GPU memory free, latest sample.", per)
        power = Family("gpud_gpu_power_watts", "gauge", "GPU power draw, latest sample.", per)
        temp = Family("gpud_gpu_temperature_celsius", "gauge", "GPU temperature, latest sample.", per)
        energy = Family("gpud_gpu_energy_joules", "counter", "GPU energy used, from the samples since the head started.",
                        per)
        held: dict[str, set[int]] = {}
        for j in store.active.values():
            if j.state.active and j.node:
                held.setdefault(j.node, set()).update(j.gpu_indices)
                for p in j.parts:   # the other nodes of a multi-node job
                    held.setdefault(str(p.get("node")), set()).update(p.get("gpu_indices", ()))
        states: Counter[str] = Counter()
        for name in sorted(store.nodes):
            rec = store.nodes[name]
            states[rec.state] += 1
            node_state.add((name, rec.state), 1)
            sample = telemetry.latest.get(name)
            if sample is not None and now - sample.time > STALE_INTERVALS * sample.interval:
                sample = None
            mine = held.get(name, ())
            texts = _gpu_labels(name, rec.info.get("gpus", []))
            groups: dict[tuple[str, str], list[int]] = {}    # (model, mode) -> [total, allocated, busy]
            for g, text in zip(rec.info.get("gpus", []), texts):
                key = (str(g.get("model", "?")), str(g.get("mode", "whole")))
                index = g.get("index")
                counts = groups.setdefault(key, [0, 0, 0])
                counts[0] += 1
                counts[1] += index in mine
                ids = _gpu_values(name, g)
                size = int(g.get("memory_mb") or 0) * 1048576
                if size:
                    mem_total.add(ids, size, text)
                joules = telemetry.energy_j.get((name, index))
                if joules is not None:
                    energy.add(ids, joules, text)
                reading = sample.gpus.get(index) if sample is not None else None
                if reading is None:
                    continue
                if reading.util is not None:
                    counts[2] += reading.util >= IDLE_UTIL
                    util.add(ids, reading.util / 100.0, text)
                if reading.mem_used_mb is not None:
                    mem.add(ids, reading.mem_used_mb * 1048576, text)
                    if size:
                        mem_free.add(ids, max(0, size - reading.mem_used_mb * 1048576), text)
                if reading.power_w is not None:
                    power.add(ids, reading.power_w, text)
                if reading.temp_c is not None:
                    temp.add(ids, reading.temp_c, text)
            for key in sorted(groups):
                n_total, n_alloc, n_busy = groups[key]
                total.add((name, *key), n_total)
                alloc.add((name, *key), n_alloc)
                busy.add((name, *key), n_busy)
        for state, n in sorted(states.items()):
            nodes.add((state,), n)
        return [nodes, node_state, total, alloc, busy, util, mem, mem_total, mem_free, power, temp, energy]

    @staticmethod
    def _fragmentation(store: Store, sched: "SchedConfig") -> list[Family]:
        frag = cluster_fragmentation(store, sched)
        size = str(frag.size)
        free = Family("gpud_gpus_free", "gauge",
                      "Whole GPUs no job holds on schedulable nodes, by partition.", ("partition",))
        servable = Family("gpud_gpu_requests_servable", "gauge",
                          "Single-node requests of `size` GPUs the free GPUs could serve now, by partition.",
                          ("partition", "size"))
        index = Family("gpud_gpu_fragmentation", "gauge",
                       "Share of free GPUs no `size`-GPU request could use (0: none stranded, 1: all).",
                       ("partition", "size"))
        for part, f in sorted(frag.by_partition.items()):
            free.add((part,), f.free_gpus)
            servable.add((part, size), f.servable)
            index.add((part, size), f.index)
        return [free, servable, index]

    def _accounts(self, store: Store, now: float) -> list[Family]:
        seconds = Counter(self.m.gpu_seconds)
        gpus: Counter[str] = Counter()
        for j in store.active.values():
            if j.state.active and j.start_time is not None:
                held = held_gpus(store, j)
                seconds[j.account] += max(0.0, now - j.start_time) * held
                gpus[j.account] += held
        used = Family("gpud_account_gpu_seconds", "counter", "GPU-seconds allocated, by account.", ("account",))
        held = Family("gpud_account_gpus_allocated", "gauge", "GPUs allocated now, by account.", ("account",))
        for account in sorted(set(seconds) | set(gpus)):
            used.add((account,), seconds[account])
            held.add((account,), gpus[account])
        return [used, held]


_GPU_LABELS: dict[tuple[str, str], list[str]] = {}   # (node, its GPUs as JSON) -> label blocks
# ours, then dcgm-exporter's names for the same things (its gpu label is ours too)
GPU_LABELS = ("node", "gpu", "model", "Hostname", "UUID", "modelName")


def _gpu_values(node: str, g: dict) -> tuple[str, ...]:
    model = str(g.get("model", "?"))
    return (node, str(g.get("index")), model, node, str(g.get("uuid", "")), model)


def _gpu_labels(node: str, gpus: list[dict]) -> list[str]:
    """The label block of each GPU of a node, formatted once per registration."""
    key = (node, repr(gpus))
    texts = _GPU_LABELS.get(key)
    if texts is None:
        if len(_GPU_LABELS) > 100_000:   # nodes re-registered many times: start over
            _GPU_LABELS.clear()
        texts = _GPU_LABELS[key] = [label_text(GPU_LABELS, _gpu_values(node, g)) for g in gpus]
    return texts
