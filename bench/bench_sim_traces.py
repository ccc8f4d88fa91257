"""The three policies on the shared real traces, for docs/simulation.md:
``python bench/bench_sim_traces.py [--no-doc]``.

Runs ``gpud simulate --compare --json`` on each trace under ``../shared/traces`` (read in
place, never copied) with the settings below, and writes one table per trace into the
``sim-traces`` section of docs/simulation.md.  Traces that are not there are skipped.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

from common import ROOT, stamp, write_section

from gpud.sim.compare import format_compare  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
RUNS = [
    ("msft_itp_2021", "Microsoft ITP 2021: the ten clusters as accounts of one merged cluster "
     "(the trace names no users); arrivals of the first 3 days, run until all have ended, on "
     "40 nodes of 8 GPUs (320 GPUs); its 39 jobs of 16 to 64 GPUs run on 2 to 8 whole nodes "
     "at once (multi-node jobs)",
     ["--cluster", "40x8xH100-80GB", "--until", "3d", "--drain", "--pass-interval", "1m"]),
    ("alibaba_openb_2023", "Alibaba openb 2023: the busiest ten days (days 139-149), pods that "
     "never ran (status Pending) skipped, on 2 nodes of 8 whole GPUs and a node of 2 MPS GPUs; "
     "a fractional pod (`gpu_milli` / 1000) asks for that fraction of a GPU's memory and shares "
     "an MPS GPU (docs/simulation.md, Fractions of a GPU); one account (the trace names none)",
     ["--cluster", "2x8xV100-32GB,1x2xV100-32GB", "--gpu-modes", "n0003:*=mps",
      "--since", "139d", "--until", "149d", "--drain", "--skip-status", "Pending"]),
    ("alibaba_dlrm_2025", "Alibaba DLRM 2025: the month of serving instances (CPU-only ones "
     "skipped; instances alive at the start all arrive at 0) on 400 nodes of 8 GPUs, about "
     "the peak demand, `--ignore-gpu-type` (its gpu_type is a node class)",
     ["--cluster", "400x8xH100-80GB", "--ignore-gpu-type", "--until", "31d"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    parts = ["## The three policies on the shared traces", "",
             "`python bench/bench_sim_traces.py` runs `gpud simulate --compare` with the options "
             "shown (default config: fair-share with a 7-day half-life, backfill depth 100, "
             "binpack; `--limits user`).", "", stamp()]
    for name, what, args in RUNS:
        path = TRACES / name / "jobs.csv"
        if not path.exists():
            print(f"{name}: skipped, {path} not present")
            continue
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "gpud.cli", "simulate", "--trace", str(path), *args,
               "--compare", "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"{name}: {r.stderr.strip()}")
        reports = json.loads(r.stdout)["policies"]
        shown = " ".join(shlex.quote(a) for a in args)
        text = format_compare(reports)
        print(f"== {name} ({time.perf_counter() - t:.0f} s)\n{text}", flush=True)
        parts += ["", f"### {name}", "", what + ".", "",
                  f"`gpud simulate --trace …/{name}/jobs.csv {shown} --compare` "
                  f"({time.perf_counter() - t:.0f} s for the three runs):", "", "```", text, "```"]
    md = "\n".join(parts)
    if not a.no_doc:
        write_section("sim-traces", md, doc=ROOT / "docs" / "simulation.md")


if __name__ == "__main__":
    main()
