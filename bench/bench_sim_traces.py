"""The three policies on the shared real traces, for docs/simulation.md:
``python bench/bench_sim_traces.py [--no-doc] [--only NAME ...]``.

Runs ``gpud simulate --compare --json`` on each trace under ``../shared/traces`` (read in
place, never copied) with the settings below, and writes one table per run into the
``sim-traces`` section of docs/simulation.md.  Runs whose traces are not there are
skipped.  ``--only`` runs the named runs alone and rewrites only their tables.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time

from common import ROOT, machine, stamp, write_section

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
    ("alibaba_dlrm_2025_background", "Alibaba DLRM 2025 as what it is, a high-priority "
     "background load: its first week of serving instances (the 3,123 alive at the start "
     "are the initial state; 557 more are created in the week, and 3,074 to 3,154 are alive "
     "at any time) in QOS `serving`, added by `--background` with a priority above batch "
     "and `preempt` = batch (requeue), beside a batch stream of synthetic `mixed` jobs "
     "offering 13 % of the cluster's GPU-time (about 470 GPUs, about what serving leaves) "
     "in QOS `normal`, on 450 nodes of 8 GPUs (3,600); arrivals stop at 7 days and the run "
     "goes on until every batch job has ended (serving instances still running then are "
     "cut); one pass per 5 simulated minutes",
     ["--synthetic", "mixed", "--jobs", "11500", "--load", "0.13", "--seed", "1",
      "--background", "{alibaba_dlrm_2025}", "--cluster", "450x8xH100-80GB",
      "--ignore-gpu-type", "--until", "7d", "--drain", "--pass-interval", "5m"]),
]
_TRACE_ARG = re.compile(r"^\{(\w+)\}$")


def _command_args(name: str, args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(arguments to run, as shown, traces needed): a trace run reads its own jobs.csv; a
    ``{trace}`` argument names another one."""
    run, shown, needs = [], [], []
    if not any(a == "--synthetic" for a in args):
        run, shown, needs = ["--trace", str(TRACES / name / "jobs.csv")], \
            ["--trace", f"…/{name}/jobs.csv"], [name]
    for a in args:
        m = _TRACE_ARG.match(a)
        if m:
            needs.append(m.group(1))
            run.append(str(TRACES / m.group(1) / "jobs.csv"))
            shown.append(f"…/{m.group(1)}/jobs.csv")
        else:
            run.append(a)
            shown.append(a)
    return run, shown, needs


def _merge_tables(old: str, new: dict[str, str]) -> str:
    """The section ``old`` with the ``### name`` tables in ``new`` replaced (or added)."""
    head, *tables = re.split(r"\n(?=### )", old.strip())
    names = [t.split("\n", 1)[0][4:].strip() for t in tables]
    out = dict(zip(names, tables))
    out.update(new)
    return "\n\n".join([head.strip(), *(t.strip() for t in out.values())])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--only", action="append", metavar="NAME", choices=[r[0] for r in RUNS],
                    help="run only this one (repeatable); its table alone is rewritten")
    a = ap.parse_args()
    parts = ["## The three policies on the shared traces", "",
             "`python bench/bench_sim_traces.py` runs `gpud simulate --compare` with the options "
             "shown (default config: fair-share with a 7-day half-life, backfill depth 100, "
             "binpack; `--limits user`).", "", stamp()]
    tables: dict[str, str] = {}
    for name, what, args in RUNS:
        if a.only and name not in a.only:
            continue
        run_args, shown_args, needs = _command_args(name, args)
        missing = [n for n in needs if not (TRACES / n / "jobs.csv").exists()]
        if missing:
            print(f"{name}: skipped, {TRACES / missing[0] / 'jobs.csv'} not present")
            continue
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "gpud.cli", "simulate", *run_args, "--compare", "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"{name}: {r.stderr.strip()}")
        reports = json.loads(r.stdout)["policies"]
        shown = " ".join(x if x.startswith("…/") else shlex.quote(x) for x in shown_args)
        text = format_compare(reports)
        print(f"== {name} ({time.perf_counter() - t:.0f} s)\n{text}", flush=True)
        when = f", {machine().rsplit('; ', 1)[-1]}" if a.only else ""
        tables[name] = "\n".join([
            f"### {name}", "", what + ".", "",
            f"`gpud simulate {shown} --compare` "
            f"({time.perf_counter() - t:.0f} s for the three runs{when}):", "", "```", text, "```"])
    doc = ROOT / "docs" / "simulation.md"
    if a.only:
        old = re.search(r"<!-- bench:sim-traces -->\n(.*?)<!-- /bench:sim-traces -->",
                        doc.read_text(), re.S)
        md = _merge_tables(old.group(1) if old else "\n".join(parts), tables)
    else:
        md = "\n\n".join(["\n".join(parts), *tables.values()])
    if not a.no_doc:
        write_section("sim-traces", md, doc=doc)
    else:
        print(md if a.only else "", end="")


if __name__ == "__main__":
    main()
