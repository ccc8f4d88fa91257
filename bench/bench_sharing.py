"""Jobs served per hour on shared A100s: dynamic MIG vs a static 7x1g.10gb layout vs whole GPUs.

``python bench/bench_sharing.py [--jobs N] [--gpus G]``

The trace is synthesised deterministically from the fractional requests of
``shared/traces/alibaba_openb_2023/jobs.csv`` (its rows with ``0 < gpus < 1``, in file order):
each fraction becomes the smallest A100-80GB MIG profile with at least that share of the
compute (0.11 -> 1g.10gb, 0.23 -> 2g.20gb, 0.32 -> 3g.40gb, 0.47 -> 4g.40gb, 0.81 ->
7g.80gb), its run time is the trace's, clipped to [1 min, 2 h], and jobs arrive every
``--gap`` seconds, a burst that keeps a queue all along.  A second trace, ``small``, halves
every fraction first: the mix a static layout of small slices is made for.

Each trace runs through the real simulator (``gpud.sim.engine``, the core's own passes) on
``--gpus`` A100-80GBs (8 per node) three ways:

* ``dynamic``  every GPU ``mig:dynamic``: the core cuts slices as the queue asks;
* ``static``   every GPU ``mig:all-1g.10gb``: only jobs that fit a 1g.10gb run, the
               others are refused at submit (as the head refuses them);
* ``whole``    every job takes one whole GPU.

``--pass`` instead times one scheduler pass on a big shared cluster: 1,000 A100-80GBs (125
nodes of 8; half ``mig:dynamic`` cut into seven 1g.10gb with four of them busy, a quarter MPS
with two clients, a quarter whole) and 5,000 pending jobs of the openb mix (a tenth of them
``--gpu-mem``).

Reported per run: jobs served (completed), makespan (first arrival to last end), jobs served
per hour over it, mean and p90 wait, compute used (the compute the jobs asked for, their
profiles' fractions times run time, over the GPU time of the makespan: what a whole GPU
per job wastes shows here), re-layouts that destroyed slices, and the CPU time of the run.  Results go in docs/benchmarks.md, "GPU sharing".
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from collections import Counter

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from gpud.gpu import mig  # noqa: E402
from gpud.sched.config import sched_config_from_dict  # noqa: E402
from gpud.sched.snapshot import GpuView, NodeView, SliceView  # noqa: E402
from gpud.sim import sharing as sim_sharing  # noqa: E402
from gpud.sim.engine import Simulation  # noqa: E402
from gpud.sim.report import percentile  # noqa: E402
from gpud.sim.trace import TraceJob  # noqa: E402

# ../shared/traces beside the checkout (a worktree deeper down finds it further up)
OPENB = next((os.path.join(d, "shared", "traces", "alibaba_openb_2023", "jobs.csv")
              for d in (os.path.abspath(os.path.join(ROOT, *[".."] * k)) for k in range(1, 4))
              if os.path.isdir(os.path.join(d, "shared", "traces"))),
             os.path.join(ROOT, "..", "shared", "traces", "alibaba_openb_2023", "jobs.csv"))
MODEL = "A100-80GB"
CFG = sched_config_from_dict({"scheduler": {"mig_min_interval": "10m"}}, "<bench>")
PROFILES = [p for p in mig.catalog(MODEL).values() if not p.media_extensions and p.name != "1g.20gb"]


def profile_for(fraction: float) -> mig.MigProfile:
    """The smallest profile with at least ``fraction`` of the GPU's compute."""
    return min((p for p in PROFILES if p.fraction >= fraction - 1e-9), key=lambda p: (p.compute_slices, p.memory_mb))


def read_fractions(limit: int) -> list[tuple[float, float]]:
    """(fraction, run seconds) of the trace's first ``limit`` fractional rows."""
    out = []
    with open(OPENB, newline="") as f:
        for row in csv.DictReader(f):
            g = float(row["gpus"] or 0)
            if 0 < g < 1:
                out.append((g, min(7200.0, max(60.0, float(row["duration_s"] or 0)))))
                if len(out) == limit:
                    break
    return out


def trace(rows: list[tuple[float, float]], mode: str, gap: float, scale: float) -> list[TraceJob]:
    jobs = []
    for i, (g, run) in enumerate(rows):
        p = profile_for(g * scale)
        whole = mode == "whole"
        jobs.append(TraceJob(seq=i + 1, trace_id=f"openb-{i}", submit_s=i * gap, gpus=1,
                             share=1.0 if whole else p.fraction, duration_s=run, user=f"u{i % 7}",
                             account=None, gpu_type=None, status=None, time_limit_s=run,
                             mig_profile=None if whole else p.name))
    return jobs


def cluster(mode: str, gpus: int) -> tuple[NodeView, ...]:
    nodes = []
    for n in range((gpus + 7) // 8):
        name = f"a{n + 1:02d}"
        views = []
        for i in range(min(8, gpus - 8 * n)):
            if mode == "whole":
                views.append(GpuView(i, f"GPU-{name}-{i}", MODEL, 81920))
                continue
            layout = mig.named_layout(MODEL, "all-1g.10gb") if mode == "static" else []
            cat = mig.catalog(MODEL)
            slices = tuple(SliceView(s.profile, s.start, f"MIG-{name}-{i}-{s.start}", cat[s.profile].memory_mb)
                           for s in layout)
            views.append(GpuView(i, f"GPU-{name}-{i}", MODEL, 81920, mode="mig", dynamic=mode == "dynamic",
                                 slices=slices))
        nodes.append(NodeView(name, 64, 512 * 1024, tuple(views)))
    return tuple(nodes)


def run(rows: list[tuple[float, float]], mode: str, gpus: int, gap: float, scale: float) -> dict:
    jobs = trace(rows, mode, gap, scale)
    refused = 0
    if mode == "static":               # the head refuses what no 1g.10gb slice can hold
        kept = [j for j in jobs if j.mig_profile == "1g.10gb"]
        refused = len(jobs) - len(kept)
        jobs = kept
    sim = Simulation(cluster(mode, gpus), jobs, CFG, pass_interval=10.0, record_starts=True)
    destroying = 0
    apply = sim_sharing.apply_relayout

    def counted(nodes, r, running, t):   # count the re-layouts that destroy slices
        nonlocal destroying
        out = apply(nodes, r, running, t)
        destroying += bool(out is not None and r.destroy)
        return out

    sim_sharing.apply_relayout = counted
    try:
        cpu = time.process_time()
        report = sim.run()
        cpu = time.process_time() - cpu
    finally:
        sim_sharing.apply_relayout = apply
    by_trace = {j.trace_id: j for j in jobs}
    need = {f"openb-{i}": profile_for(g * scale).fraction for i, (g, _) in enumerate(rows)}
    waits = {}
    span = 0.0
    held = 0.0
    for t, trace_id, _node, _gpus in sim.start_log or ():
        j = by_trace[trace_id]
        waits.setdefault(trace_id, t - j.submit_s)
        span = max(span, t + j.duration_s)
        held += need[trace_id] * j.duration_s
    served = report["jobs"]["completed"]
    w = sorted(waits.values())
    return {"mode": mode, "served": served, "refused": refused, "makespan_h": span / 3600,
            "per_hour": served / (span / 3600) if span else 0.0,
            "wait_mean_min": sum(w) / len(w) / 60 if w else 0.0,
            "wait_p90_min": percentile(w, 90) / 60 if w else 0.0,
            "compute_used": held / (gpus * span) if span else 0.0,
            "relayouts": destroying, "cpu_s": cpu}


def time_pass(jobs: int) -> None:
    """One pass of the core on a big cluster of shared GPUs (see the module docstring)."""
    from gpud.sched.core import schedule
    from gpud.sched.snapshot import Device, PendingJob, RunningJob, Snapshot

    cat = mig.catalog(MODEL)
    nodes, running = [], []
    rid = 10**6
    for n in range(125):
        name = f"a{n + 1:03d}"
        views = []
        for i in range(8):
            uuid = f"GPU-{name}-{i}"
            if i < 4:
                layout = mig.named_layout(MODEL, "all-1g.10gb")
                views.append(GpuView(i, uuid, MODEL, 81920, mode="mig", dynamic=True, slices=tuple(
                    SliceView(s.profile, s.start, f"MIG-{name}-{i}-{s.start}", cat[s.profile].memory_mb)
                    for s in layout)))
                for s in layout[:4]:
                    rid += 1
                    running.append(RunningJob(rid, f"u{rid % 7}", "default", "gpu", "normal", name, (), 1, 1024,
                                              0.0, 3600.0, devices=(Device(i, "mig", f"MIG-{name}-{i}-{s.start}",
                                                                           s.start, 9728, s.profile),)))
            elif i < 6:
                views.append(GpuView(i, uuid, MODEL, 81920, mode="mps"))
                for _ in range(2):
                    rid += 1
                    running.append(RunningJob(rid, f"u{n % 7}", "default", "gpu", "normal", name, (), 1, 1024,
                                              0.0, 3600.0, devices=(Device(i, "mps", uuid, None, 10240),)))
            else:
                views.append(GpuView(i, uuid, MODEL, 81920))
        nodes.append(NodeView(name, 256, 2048 * 1024, tuple(views)))
    rows = read_fractions(jobs)
    pending = []
    for k, (g, run_s) in enumerate(rows):
        mem = (k % 10 == 0)
        pending.append(PendingJob(k + 1, f"u{k % 7}", "default", "gpu", "normal", 1, 1, 1024, run_s, float(k),
                                  mig_profile=None if mem else profile_for(g).name,
                                  gpu_mem_mb=int(g * 81920) if mem else None))
    snap = Snapshot(tuple(nodes), tuple(pending), tuple(running), CFG)
    times = []
    for _ in range(3):
        cpu = time.process_time()
        plan = schedule(snap, 100.0)
        times.append(time.process_time() - cpu)
    print(f"one pass: {len(nodes) * 8} GPUs, {len(pending)} pending, {len(running)} running: "
          f"{sorted(times)[1] * 1000:.0f} ms CPU (median of 3); {len(plan.starts)} starts, "
          f"{len(plan.relayouts)} re-layouts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--gap", type=float, default=20.0, help="seconds between arrivals")
    ap.add_argument("--pass", dest="one_pass", action="store_true", help="time one pass on 1,000 GPUs")
    args = ap.parse_args()
    if not os.path.exists(OPENB):
        sys.exit(f"bench_sharing: {OPENB} not found")
    if args.one_pass:
        time_pass(5000)
        return
    rows = read_fractions(args.jobs)
    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}")
    for name, scale in (("openb", 1.0), ("small", 0.5)):
        mix = Counter(profile_for(g * scale).name for g, _ in rows)
        print(f"\ntrace {name}: {len(rows)} jobs every {args.gap:.0f}s on {args.gpus} {MODEL}; "
              + ", ".join(f"{p} {mix[p]}" for p in sorted(mix, key=lambda p: int(p.split('g')[0]))))
        print("| mode | served | refused | makespan h | served/h | wait mean min | wait p90 min "
              "| compute used | destroying re-layouts | CPU s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mode in ("dynamic", "static", "whole"):
            r = run(rows, mode, args.gpus, args.gap, scale)
            print(f"| {mode} | {r['served']} | {r['refused']} | {r['makespan_h']:.1f} | {r['per_hour']:.0f} "
                  f"| {r['wait_mean_min']:.0f} | {r['wait_p90_min']:.0f} | {r['compute_used']:.0%} "
                  f"| {r['relayouts']} | {r['cpu_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
