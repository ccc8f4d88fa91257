#!/usr/bin/env python3
"""Fault-injection soak: a head, three sim workers and Mosquitto; jobs of
0.2-30 s while the head is killed with SIGKILL, a worker is killed, a worker's broker link
is cut (once shorter, once longer than the lease) and the broker restarts.  Then: jobs lost,
copies of one job that overlapped in time, GPUs that ran two jobs at once, jobs not final.

Every job appends "<job> <attempt> <gpus> <start> <end>" (its own clock) to one log, so the
checks are made from the jobs' side.  Writes the ``soak`` section of docs/benchmarks.md.

    bench/bench_soak.py                       # 1,500 jobs, 5 head kills, ... (the full soak)
    bench/bench_soak.py --jobs 300 --max-s 8 --head-kills 2 --worker-kills 1 --cuts 2 --broker-restarts 1
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, stamp, table, write_section

sys.path.insert(0, str(ROOT))
from tests.cluster import Cluster, wait_for  # noqa: E402
from tests.faultproxy import TcpProxy  # noqa: E402
from tests.mqtt_broker import MosquittoProc  # noqa: E402

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
RECORD = ('s=$(date +%s.%N); sleep {sleep}; e=$(date +%s.%N); '
          'echo "$GPUD_JOB_ID $GPUD_JOB_ATTEMPT $GPUD_NODENAME:$CUDA_VISIBLE_DEVICES $s $e" >> {log}')


def records(path: Path) -> list[tuple[int, int, list[str], float, float]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                job, attempt, gpus, s, e = line.split()
            except ValueError:
                continue
            node, _, devs = gpus.partition(":")
            out.append((int(job), int(attempt), [f"{node}:{d}" for d in devs.split(",")], float(s), float(e)))
    return out


def overlaps(spans: list[tuple[float, float]]) -> int:
    spans.sort()
    return sum(1 for (s1, e1), (s2, e2) in zip(spans, spans[1:]) if s2 < e1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--min-s", type=float, default=0.2)
    ap.add_argument("--max-s", type=float, default=30.0)
    ap.add_argument("--head-kills", type=int, default=5)
    ap.add_argument("--worker-kills", type=int, default=2)
    ap.add_argument("--cuts", type=int, default=2, help="broker cuts of one worker: the last outlasts the lease")
    ap.add_argument("--broker-restarts", type=int, default=2)
    ap.add_argument("--lease", type=float, default=8.0)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    rng = random.Random(18)
    tmp = Path(tempfile.mkdtemp(prefix="gpud-soak-"))
    broker = MosquittoProc(tmp / "mqtt").start()
    proxy = TcpProxy(broker.port)
    c = Cluster(tmp / "c", broker.url, node_timeout=3.0, heartbeat=0.3, lease=args.lease)
    log = tmp / "runs.log"
    ids: list[int] = []
    faults: list[str] = []
    t0 = time.monotonic()
    try:
        c.start_head()
        c.start_worker("w1", "4xH100-80GB")
        c.start_worker("w2", "4xH100-80GB")
        c.start_worker("w3", "4xH100-80GB", args=("--broker", proxy.url))
        done_submitting = threading.Event()

        def submit() -> None:
            client = c.client()
            from gpuctl.script import api_settings, build_spec, wrap_script

            for _ in range(args.jobs):
                sleep = round(rng.uniform(args.min_s, args.max_s), 2)
                spec = build_spec(wrap_script(RECORD.format(sleep=sleep, log=log)),
                                  api_settings({"gpus": 1, "stdout": "/dev/null"}), default_name="soak")
                while True:
                    try:
                        ids.append(client.submit_spec(spec))
                        break
                    except ConnectionError:   # the head is down: submit again once it is back
                        time.sleep(0.2)
            done_submitting.set()

        submitter = threading.Thread(target=submit, daemon=True)
        submitter.start()
        plan = (["head"] * args.head_kills + ["worker"] * args.worker_kills + ["broker"] * args.broker_restarts
                + ["cut-short"] * max(0, args.cuts - 1) + ["cut-long"] * min(1, args.cuts))
        rng.shuffle(plan)
        for fault in plan:
            time.sleep(rng.uniform(4, 10))
            if fault == "head":
                c.head.send_signal(signal.SIGKILL)
                c.head.wait(10)
                c.start_head()
            elif fault == "worker":
                name = rng.choice(["w1", "w2"])
                c.stop(c.workers[name], signal.SIGKILL)
                time.sleep(1)
                c.start_worker(name, "4xH100-80GB")
            elif fault == "broker":
                broker.stop()
                time.sleep(1)
                broker.start()
            else:
                proxy.cut()
                time.sleep(1.0 if fault == "cut-short" else args.lease + 5)
                proxy.restore()
            faults.append(fault)
        submitter.join(600)
        jobs = wait_for(lambda: (js := c.jobs()) and len(ids) == args.jobs
                        and all(i in js and js[i]["state"] in TERMINAL for i in ids) and js,
                        args.max_s * args.jobs / 8 + 600, "every job to end", interval=2)
        wall = time.monotonic() - t0
    finally:
        c.close()
        proxy.close()
        broker.stop()
    recs = records(log)
    by_job = collections.defaultdict(list)
    by_gpu = collections.defaultdict(list)
    for job, attempt, gpus, s, e in recs:
        by_job[job].append((s, e))
        for g in gpus:
            by_gpu[g].append((s, e))
    lost = [i for i in ids if jobs[i]["state"] != "COMPLETED"]
    twice = sum(overlaps(v) for v in by_job.values())
    booked = sum(overlaps(v) for v in by_gpu.values())
    ran_twice = sum(1 for v in by_job.values() if len(v) > 1)
    requeued = sum(1 for i in ids if jobs[i].get("requeue_count"))
    rows = [[f"{args.jobs:,}", f"{args.min_s:g}-{args.max_s:g} s", ", ".join(
        f"{n} {k}" for k, n in sorted(collections.Counter(faults).items())), f"{args.lease:g} s",
        str(len(lost)), str(twice), str(booked), str(requeued), str(ran_twice), f"{wall:.0f} s"]]
    text = ("Fault-injection soak (`bench/bench_soak.py`): head + 3 sim workers (4 GPUs each) + "
            "Mosquitto; one worker reaches the broker through a proxy the bench cuts.  *Lost*: jobs not "
            "COMPLETED; *overlapping copies*: two attempts of one job running at the same moment; "
            "*double-booked*: one GPU running two jobs at once (all from the jobs' own timestamps).  "
            "*Ran twice*: jobs whose first copy was stopped (or ended) and that ran again after a requeue.\n\n"
            + table(["jobs", "length", "faults", "lease", "lost", "overlapping copies", "double-booked GPUs",
                     "requeued", "ran twice", "wall"], rows)
            + ("" if (args.jobs, args.head_kills) == (1500, 5) else
               "\n\nA reduced run (fewer and shorter jobs, fewer faults than the full soak's 1,500 / 0.2-30 s / "
               "5 head kills / 2 worker kills / 2 cuts / 2 broker restarts).")
            + f"\n\n{stamp()}\n")
    print(text)
    if not args.no_doc:
        write_section("soak", text)
    return 0 if not lost and not twice and not booked else 1


if __name__ == "__main__":
    sys.exit(main())
