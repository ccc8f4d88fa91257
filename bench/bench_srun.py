"""Multi-node jobs and ``gpuctl srun``: ``python bench/bench_srun.py [--nodes N] [--lines N]``.

A head, Mosquitto and N sim workers (8 GPUs each) as processes on this machine, through
tests/cluster.py.  One N-node job with all the GPUs runs a script that measures, with one
clock:

* gang start: from the moment before the submission to the batch script's first line
  (every part allocated in one transaction, N launches);
* srun round trip: ``gpuctl srun true`` with 8 tasks per node (N x 8 processes started as
  the job's user, their exits gathered), best and median of 5;
* srun output: ``seq`` on every node, one task each, counted by ``wc`` at srun, then
  1,000-byte lines: lines/s and MB/s through the workers, the broker, the head's buffer
  and srun's long poll.

Needs ``mosquitto`` (apt-get install mosquitto).  Writes the ``srun`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import stamp, table, write_section

from tests.cluster import Cluster, wait_for  # noqa: E402
from tests.mqtt_broker import start_mosquitto  # noqa: E402


def run(nodes: int, lines: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = start_mosquitto(root / "broker")
        try:
            with Cluster(root / "c", broker.url, node_timeout=30.0, heartbeat=1.0) as c:
                c.start_head()
                for i in range(1, nodes + 1):
                    c.start_worker(f"w{i}", "8xH100-80GB", wait=False)
                wait_for(lambda: len(c.nodes()) == nodes and all(n["state"] == "IDLE" for n in c.nodes().values()),
                         120, "idle workers")
                srun = f"{sys.executable} -m gpuctl.main --socket {c.socket} srun"
                out = root / "times"
                script = (
                    "#!/bin/bash\n"
                    f"date +%s.%N > {out}.start\n"
                    "for i in 1 2 3 4 5; do\n"
                    f"  s=$(date +%s.%N); {srun} --ntasks-per-node 8 true; e=$(date +%s.%N)\n"
                    f"  echo $s $e >> {out}.rtt\n"
                    "done\n"
                    f"s=$(date +%s.%N); {srun} --ntasks-per-node 1 seq 1 {lines} | wc -lc > {out}.count; e=$(date +%s.%N)\n"
                    f"echo $s $e > {out}.seq\n"
                    f"s=$(date +%s.%N); {srun} --ntasks-per-node 1 sh -c "
                    f"'yes $(head -c 999 /dev/zero | tr \"\\\\0\" x) | head -n {lines // 20}' | wc -lc > {out}.count2\n"
                    f"e=$(date +%s.%N); echo $s $e > {out}.long\n"
                )
                with c.client() as client:
                    t0 = time.time()
                    job = client.submit(script, nodes=nodes, gpus=8 * nodes, stdout=str(root / "job.out"),
                                        work_dir=str(root))
                c.wait_job_state(job, {"COMPLETED", "FAILED"}, 600)
                start = float(Path(f"{out}.start").read_text())
                rtts = [float(b) - float(a) for a, b in (ln.split() for ln in Path(f"{out}.rtt").read_text().splitlines())]
                a, b = map(float, Path(f"{out}.seq").read_text().split())
                counted, size = map(int, Path(f"{out}.count").read_text().split())
                assert counted == lines * nodes, (counted, (root / "job.out").read_text())
                a2, b2 = map(float, Path(f"{out}.long").read_text().split())
                long_lines, long_size = map(int, Path(f"{out}.count2").read_text().split())
                assert long_lines == lines // 20 * nodes, (long_lines, (root / "job.out").read_text())
                return {"start": start - t0, "rtt_best": min(rtts), "rtt_median": statistics.median(rtts),
                        "lines_s": counted / (b - a), "mb_s": size / (b - a) / 1e6, "lines": counted,
                        "long_lines": long_lines, "long_mb_s": long_size / (b2 - a2) / 1e6,
                        "long_lines_s": long_lines / (b2 - a2)}
        finally:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--lines", type=int, default=100_000, help="lines of seq output per node")
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    r = run(args.nodes, args.lines)
    rows = [["gang start (submit to the script's first line)", f"{r['start'] * 1000:.0f} ms"],
            [f"srun true, {args.nodes} x 8 tasks: best / median of 5",
             f"{r['rtt_best'] * 1000:.0f} / {r['rtt_median'] * 1000:.0f} ms"],
            [f"srun output, {args.nodes} tasks of seq ({r['lines']:,} lines)",
             f"{r['lines_s']:,.0f} lines/s, {r['mb_s']:.2f} MB/s"],
            [f"srun output, {args.nodes} tasks of 1,000-byte lines ({r['long_lines']:,} lines)",
             f"{r['long_lines_s']:,.0f} lines/s, {r['long_mb_s']:.1f} MB/s"]]
    text = (f"### Multi-node jobs and srun ({args.nodes} sim workers x 8 GPUs, Mosquitto)\n\n"
            f"{stamp()}\n\n" + table(["measure", "result"], rows))
    print(text)
    if not args.no_doc:
        write_section("srun", text)


if __name__ == "__main__":
    main()
