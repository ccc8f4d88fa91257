"""``gpud simulate``: replay a job trace on a virtual cluster under a scheduling config.

The command only gathers inputs (cluster, config, trace or synthetic jobs, policies) and
prints; ``engine.Simulation`` runs each policy, ``report``/``compare`` format, and ``plot``
draws.  Every bad argument is one line and exit status 2.
"""

from __future__ import annotations

import json
import sys
import tomllib
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Iterator

import click

from ..sched.config import PLACEMENTS, SchedConfig
from ..units import UnitError, parse_duration
from .background import (DEFAULT_BACKGROUND_QOS, merge_streams, valid_qos_name, with_qos,
                         with_stream_qos)
from .cluster import ClusterSpecError, apply_gpu_modes, parse_cluster, unmatched_partitions
from .compare import format_compare
from .fill import fill, fill_config, format_fill
from .openb import GPU_MEMORY_MB, OpenbError, is_pod_list, read_nodes, read_pods
from .engine import Simulation
from .estimates import MODES, Estimates
from .policies import DEFAULT_POLICY, POLICIES, policy_config
from .report import format_text
from .synthetic import KINDS, generate, write_trace
from .trace import TraceError, TraceJob, TraceStats, iter_trace, open_trace

__all__ = ["simulate", "load_sched_config", "SimConfigError"]


class SimConfigError(ValueError):
    """A config file the simulator cannot use; the message is one line."""


class _OneLineError(click.ClickException):
    """Shown as ``gpud simulate: error: ...`` on one line, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"gpud simulate: error: {self.format_message()}", err=True)


class _Command(click.Command):
    # click's usage errors print the usage block too; ours are one line like the rest.
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _OneLineError(f"{e.format_message()} (see gpud simulate --help)") from None


def load_sched_config(path: str | None) -> SchedConfig:
    """The scheduling policy in gpud.toml ``path``; the defaults when ``path`` is None."""
    if path is None:
        return SchedConfig()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SimConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise SimConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise SimConfigError(f"{path}: {e.strerror}") from None
    from ..sched import config as sched_config

    from_dict = getattr(sched_config, "sched_config_from_dict", None)
    try:
        if from_dict is not None:
            return from_dict(data, path)
        from .. import config as gpud_config  # a core without its own reader: the daemons'
        return gpud_config.from_dict(data, path).sched
    except ValueError as e:  # SchedConfigError and ConfigError are ValueErrors
        message = (str(e).splitlines() or ["invalid config"])[0]
        raise SimConfigError(message if message.startswith(path) else f"{path}: {message}") \
            from None


def _parse_duration_option(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text, default_unit="s")
    except UnitError:
        raise _OneLineError(f"invalid {option} {text!r}: use seconds or a suffix like "
                            f"90s, 12h, 7d") from None


PLOT_POINTS = 400      # samples per series when plotting


@click.command("simulate", cls=_Command)
@click.option("--config", "config_path", metavar="TOML",
              help="gpud.toml whose [sched] policy to simulate (default: built-in defaults).")
@click.option("--cluster", "cluster_spec", metavar="SPEC",
              help="Virtual cluster, NODESxGPUSxMODEL[,...], e.g. 16x8xH100-80GB.")
@click.option("--nodes", "nodes_path", metavar="CSV",
              help="Or the cluster as an openb node list: sn,cpu_milli,memory_mib,gpu,model "
                   "(CPUs counted in thousandths).")
@click.option("--fill-to", "fill_to", type=click.FloatRange(min=0.01, max=10.0), metavar="F",
              help="The fill experiment: the --trace pod list shuffled with --seed, drawn with "
                   "replacement until it asks for F times the GPU capacity, placed in order, "
                   "what does not fit dropped, nothing departing; reports allocation and "
                   "fragmentation by arrived percent.")
@click.option("--placement", type=click.Choice(PLACEMENTS),
              help="Node placement, instead of the config's [scheduler] placement.")
@click.option("--gpu-modes", "gpu_modes", metavar="SPEC",
              help="How GPUs are shared, as a worker's gpu_modes: MODE for every GPU, or "
                   "[NODES:]GPUS=MODE;... e.g. 'n0001:*=mps' or '0-3=mig:dynamic' (default: whole).")
@click.option("--trace", "trace_path", metavar="CSV",
              help="Job trace: job_id,submit_s,gpus,duration_s,user,group,gpu_type,status, "
                   "or an openb pod list (cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...).")
@click.option("--synthetic", type=click.Choice(KINDS), metavar="KIND",
              help=f"Generate the jobs instead of reading a trace: {', '.join(KINDS)}.")
@click.option("--jobs", "n_jobs", type=click.IntRange(1, 10_000_000), default=10_000,
              show_default=True, help="With --synthetic: how many jobs.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="With --synthetic or --fill-to: the random seed (same seed, same jobs).")
@click.option("--load", type=click.FloatRange(min=0.01, max=100), metavar="F",
              help="With --synthetic: offered GPU-time over the cluster's "
                   "(default 0.9 mixed, 2.0 saturating).")
@click.option("--accounts", "n_accounts", type=click.IntRange(1, 1000), default=2,
              show_default=True, help="With --synthetic saturating: how many accounts.")
@click.option("--background", "background_path", metavar="CSV",
              help="Also replay this trace beside the jobs, as a load of higher priority "
                   "(e.g. serving instances) in its own QOS; see --background-qos.")
@click.option("--background-qos", metavar="NAME",
              help=f"With --background: the QOS of its jobs (default {DEFAULT_BACKGROUND_QOS}). "
                   "When the config lacks it, it is added above every other QOS, preempting "
                   "them (requeue).")
@click.option("--qos", "main_qos", metavar="NAME",
              help="Run every job of --trace or --synthetic in this QOS (default: the trace's "
                   "qos column, else the config's default QOS); added when the config lacks it.")
@click.option("--save-trace", metavar="CSV",
              help="With --synthetic: also write the jobs as a trace file.")
@click.option("--policy", type=click.Choice(POLICIES), default=DEFAULT_POLICY, show_default=True,
              help="fifo (submit order, no backfill), priority (multifactor, no backfill) or "
                   "full (the config as the head runs it).")
@click.option("--compare", is_flag=True, help="Run all three policies and print them side by side.")
@click.option("--until", metavar="DURATION",
              help="Stop the virtual clock at this trace time (seconds, or 7d, 12h, ...).")
@click.option("--since", metavar="DURATION",
              help="Skip trace jobs submitted before this trace time (the clock starts there).")
@click.option("--skip-status", "skip_status", multiple=True, metavar="STATUS",
              help="Skip trace rows whose status is STATUS (repeatable), e.g. Pending for "
                   "jobs that never ran.")
@click.option("--drain", is_flag=True,
              help="With --until: take no arrivals after it, but run until every job admitted "
                   "before it has ended (comparable waits across policies).")
@click.option("--ignore-gpu-type", is_flag=True,
              help="Let every job run on any GPU model (for traces whose gpu_type is not a model).")
@click.option("--limits", type=click.Choice(MODES), default="user", show_default=True,
              help="Time limits of jobs the trace gives none: user (over-estimated and rounded "
                   "up, as people set them), exact (their run time) or max (the partition's "
                   "max_time, else none).")
@click.option("--overestimate", type=click.FloatRange(min=1.0, max=1000.0), default=2.0,
              show_default=True, metavar="F",
              help="With --limits user: the mean factor between a limit and the run time.")
@click.option("--exact-limits", is_flag=True, help="Same as --limits exact.")
@click.option("--pass-interval", metavar="DURATION", default="0",
              help="At most one scheduler pass per this much simulated time (e.g. 5m): "
                   "faster, at the cost of later starts (default 0: after every event).")
@click.option("--period", metavar="DURATION", default="7d", show_default=True,
              help="Length of the periods the per-account shares are reported for.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", "plot_path", metavar="PNG",
              help="Draw utilization, queue length and account shares over time (needs matplotlib).")
def simulate(config_path: str | None, cluster_spec: str | None, nodes_path: str | None,
             fill_to: float | None, placement: str | None, gpu_modes: str | None, trace_path: str | None,
             synthetic: str | None, n_jobs: int, seed: int, load: float | None, n_accounts: int,
             background_path: str | None, background_qos: str | None, main_qos: str | None,
             save_trace: str | None, policy: str, compare: bool, until: str | None,
             since: str | None, skip_status: tuple[str, ...], drain: bool, ignore_gpu_type: bool, limits: str, overestimate: float, exact_limits: bool,
             pass_interval: str, period: str, as_json: bool, plot_path: str | None) -> None:
    """Replay a job trace (or synthetic jobs) on a virtual cluster with the real scheduler;
    report waits, GPU allocation, fairness, preemptions and fragmentation, for one policy or
    (--compare) fifo, priority and full side by side."""
    if (cluster_spec is None) == (nodes_path is None):
        raise _OneLineError("give the cluster with --cluster SPEC or --nodes CSV (one of them)")
    if fill_to is not None:
        _fill(cluster_spec, nodes_path, gpu_modes, trace_path, config_path, placement, fill_to, seed,
              as_json, conflicts=[o for o, v in (("--synthetic", synthetic), ("--compare", compare or None),
                                                 ("--background", background_path), ("--until", until),
                                                 ("--plot", plot_path)) if v is not None])
        return
    if (trace_path is None) == (synthetic is None):
        raise _OneLineError("give a job trace with --trace CSV or generate one with "
                            "--synthetic KIND")
    if save_trace is not None and synthetic is None:
        raise _OneLineError("--save-trace writes generated jobs: use it with --synthetic")
    if background_qos is not None and background_path is None:
        raise _OneLineError("--background-qos names the QOS of --background's jobs: use it "
                            "with --background CSV")
    bg_qos = (background_qos or DEFAULT_BACKGROUND_QOS) if background_path is not None else None
    for option, name in (("--background-qos", bg_qos), ("--qos", main_qos)):
        if name is not None and not valid_qos_name(name):
            raise _OneLineError(f"invalid {option} {name!r}: use letters, digits, '_', '-' "
                                f"and '.'")
    if bg_qos is not None and bg_qos == main_qos:
        raise _OneLineError(f"--qos and --background-qos are both {main_qos!r}: the background "
                            f"load needs a QOS of its own")
    until_s = _parse_duration_option("--until", until)
    since_s = _parse_duration_option("--since", since)
    if drain and until_s is None:
        raise _OneLineError("--drain needs --until (when arrivals stop)")
    interval = _parse_duration_option("--pass-interval", pass_interval)
    if interval is None:
        raise _OneLineError("--pass-interval must be finite")
    period_s = _parse_duration_option("--period", period)
    if period_s is None or period_s <= 0:
        raise _OneLineError("--period must be a positive duration such as 7d")
    if plot_path is not None:
        from .plot import PlotError, check_available
        try:
            check_available()
        except PlotError as e:
            raise _OneLineError(str(e)) from None
    try:
        nodes = apply_gpu_modes(_nodes(cluster_spec, nodes_path), gpu_modes)
        config = with_stream_qos(load_sched_config(config_path), bg_qos, main_qos)
        unmatched = unmatched_partitions(config.partitions, nodes)
        if unmatched:
            raise ClusterSpecError(unmatched)
    except (ClusterSpecError, SimConfigError, OpenbError) as e:
        raise _OneLineError(str(e)) from None
    if placement is not None:
        config = replace(config, placement=placement)
    estimates = Estimates("exact" if exact_limits else limits, overestimate)

    jobs: list[TraceJob] | None = None
    if synthetic is not None:
        try:
            jobs = generate(synthetic, n_jobs, seed, gpus=sum(len(n.gpus) for n in nodes),
                            max_gpus=max(len(n.gpus) for n in nodes), load=load,
                            accounts=n_accounts)
        except ValueError as e:
            raise _OneLineError(str(e)) from None
        if save_trace is not None:
            try:
                with open(save_trace, "w") as out:
                    write_trace(jobs, out)
            except OSError as e:
                raise _OneLineError(f"{save_trace}: {e.strerror or e}") from None
    for path in (trace_path if jobs is None else None, background_path):
        if path is None:
            continue
        try:
            open_trace(path).close()   # a missing file is an error before any run
        except TraceError as e:
            raise _OneLineError(str(e)) from None

    series_step = None
    if plot_path is not None:
        span = until_s if until_s is not None else (jobs[-1].submit_s if jobs else None)
        series_step = max(60.0, (span or 86400.0 * 30) / PLOT_POINTS)

    reports: dict[str, dict[str, Any]] = {}
    kw = dict(until=until_s, drain=drain, ignore_gpu_type=ignore_gpu_type, pass_interval=interval,
              estimates=estimates, period=period_s, series_step=series_step)
    source = _Source(trace_path, jobs, background_path, bg_qos, main_qos, since_s,
                     frozenset(skip_status))
    for name in (POLICIES if compare else (policy,)):
        report = source.run(nodes, policy_config(config, name), kw)
        reports[name] = {"policy": name, **report}

    if plot_path is not None:
        from .plot import PlotError, plot
        try:
            plot(reports, plot_path)
        except PlotError as e:
            click.echo(f"gpud simulate: error: {e}", err=True)
            sys.exit(1)
        for r in reports.values():
            r.pop("series", None)   # drawn; too long to print
    if as_json:
        out = {"policies": reports} if compare else reports[policy]
        click.echo(json.dumps(out, indent=2))
    elif compare:
        click.echo(format_compare(reports))
    else:
        click.echo(format_text(reports[policy]))


def _nodes(cluster_spec: str | None, nodes_path: str | None):
    return read_nodes(nodes_path) if nodes_path is not None else parse_cluster(cluster_spec or "")


def _fill(cluster_spec: str | None, nodes_path: str | None, gpu_modes: str | None, trace_path: str | None,
          config_path: str | None, placement: str | None, fill_to: float, seed: int, as_json: bool,
          conflicts: list[str]) -> None:
    """``--fill-to``: the fill experiment (gpud/sim/fill.py) instead of a replay in time."""
    if conflicts:
        raise _OneLineError(f"--fill-to places a pod list once, in order: it does not take {conflicts[0]}")
    if trace_path is None:
        raise _OneLineError("--fill-to needs the pods: give an openb pod list with --trace CSV")
    try:
        nodes = _nodes(cluster_spec, nodes_path)
        if nodes_path is None:     # the pods' unit: thousandths of a CPU, 32 MiB of GPU a milli-GPU
            nodes = tuple(replace(n, cpus=n.cpus * 1000, gpus=tuple(replace(g, memory_mb=GPU_MEMORY_MB)
                                                                      for g in n.gpus)) for n in nodes)
        nodes = apply_gpu_modes(nodes, gpu_modes)
        config = fill_config(load_sched_config(config_path), placement)
        if not is_pod_list(trace_path):
            read_pods(trace_path)  # a missing file or a missing column says which
            raise OpenbError(f"{trace_path}: --fill-to needs an openb pod list "
                             "(cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
        pods = read_pods(trace_path)
        report = {"cluster": {"nodes": len(nodes), "gpus": sum(len(n.gpus) for n in nodes)},
                  "pods": {"rows": pods.rows, "read": len(pods.pods), "skipped": dict(pods.skipped)},
                  "fill": fill(nodes, pods.pods, config, fill_to, seed)}
    except (ClusterSpecError, SimConfigError, OpenbError, ValueError) as e:
        raise _OneLineError(str(e).splitlines()[0] if str(e) else "invalid input") from None
    click.echo(json.dumps(report, indent=2) if as_json else format_fill(report))


class _Source:
    """Where one run's jobs come from: a trace file or generated jobs, and a background
    trace beside them; every file is opened afresh per run and closed after it."""

    def __init__(self, trace_path: str | None, jobs: list[TraceJob] | None,
                 background_path: str | None, background_qos: str | None,
                 main_qos: str | None, since: float | None,
                 skip_status: frozenset[str]) -> None:
        self.trace_path, self.jobs = trace_path, jobs
        self.background_path, self.background_qos = background_path, background_qos
        self.main_qos, self.since, self.skip_status = main_qos, since, skip_status

    def _open(self, stack: ExitStack, path: str, stats: TraceStats) -> Iterator[TraceJob]:
        try:
            f = stack.enter_context(open_trace(path))
        except TraceError as e:
            raise _OneLineError(str(e)) from None
        return _selected(iter_trace(f, stats, name=path), stats, self.since, self.skip_status)

    def run(self, nodes, config: SchedConfig, kw: dict[str, Any]) -> dict[str, Any]:
        with ExitStack() as stack:
            if self.jobs is not None:
                stats = TraceStats(rows=len(self.jobs), accepted=len(self.jobs))
                rows: Iterator[TraceJob] = iter(self.jobs)
            else:
                stats = TraceStats()
                rows = self._open(stack, self.trace_path, stats)
            rows = with_qos(rows, self.main_qos)
            bg_stats = None
            if self.background_path is not None:
                bg_stats = TraceStats()
                rows = merge_streams(rows, self._open(stack, self.background_path, bg_stats),
                                     self.background_qos)
            sim = Simulation(nodes, rows, config, trace_stats=stats, **kw)
            try:
                report = sim.run()
            except TraceError as e:
                raise _OneLineError(str(e)) from None
            except OSError as e:
                click.echo(f"gpud simulate: error: {e.filename or self.trace_path}: "
                           f"{e.strerror or e}", err=True)
                sys.exit(1)
        if bg_stats is not None:
            report["background"] = {"qos": self.background_qos, "rows": bg_stats.rows,
                                    "accepted": bg_stats.accepted,
                                    "skipped": dict(sorted(bg_stats.skipped.items()))}
        return report


def _selected(rows: Iterator[TraceJob], stats: TraceStats, since: float | None,
              skip_status: frozenset[str]) -> Iterator[TraceJob]:
    """The rows ``--since`` and ``--skip-status`` keep; the others counted as skipped."""
    for row in rows:
        if since is not None and row.submit_s < since:
            stats.skip("before_since")
        elif row.status is not None and row.status in skip_status:
            stats.skip(f"status_{row.status}")
        else:
            yield row
