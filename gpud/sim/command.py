"""``gpud simulate``: replay a job trace on a virtual cluster under a scheduling config."""

from __future__ import annotations

import json
import sys
import tomllib
from typing import Any

import click

from ..sched.config import SchedConfig
from ..units import UnitError, parse_duration
from .cluster import ClusterSpecError, parse_cluster
from .engine import Simulation
from .report import format_text
from .trace import TraceError, TraceStats, iter_trace, open_trace

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


@click.command("simulate", cls=_Command)
@click.option("--config", "config_path", metavar="TOML",
              help="gpud.toml whose [sched] policy to simulate (default: built-in defaults).")
@click.option("--cluster", "cluster_spec", required=True, metavar="SPEC",
              help="Virtual cluster, NODESxGPUSxMODEL[,...], e.g. 16x8xH100-80GB.")
@click.option("--trace", "trace_path", required=True, metavar="CSV",
              help="Job trace: job_id,submit_s,gpus,duration_s,user,group,gpu_type,status.")
@click.option("--until", metavar="DURATION",
              help="Stop the virtual clock at this trace time (seconds, or 7d, 12h, ...).")
@click.option("--ignore-gpu-type", is_flag=True,
              help="Let every job run on any GPU model (for traces whose gpu_type is not a model).")
@click.option("--exact-limits", is_flag=True,
              help="Give jobs without a time_limit_s their own duration as the limit "
                   "(perfect estimates; default: the partition's max_time, or none).")
@click.option("--pass-interval", metavar="DURATION", default="0",
              help="At most one scheduler pass per this much simulated time (e.g. 5m): "
                   "faster, at the cost of later starts (default 0: after every event).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def simulate(config_path: str | None, cluster_spec: str, trace_path: str, until: str | None,
             ignore_gpu_type: bool, exact_limits: bool, pass_interval: str,
             as_json: bool) -> None:
    """Replay a job trace on a virtual cluster with the real scheduler; report waits,
    GPU allocation, per-account GPU time and preemptions."""
    until_s = _parse_duration_option("--until", until)
    interval = _parse_duration_option("--pass-interval", pass_interval)
    if interval is None:
        raise _OneLineError("--pass-interval must be finite")
    try:
        nodes = parse_cluster(cluster_spec)
        config = load_sched_config(config_path)
    except (ClusterSpecError, SimConfigError) as e:
        raise _OneLineError(str(e)) from None
    try:
        f = open_trace(trace_path)
    except TraceError as e:
        raise _OneLineError(str(e)) from None
    stats = TraceStats()
    with f:
        sim = Simulation(nodes, iter_trace(f, stats, name=trace_path), config, until=until_s,
                         trace_stats=stats, ignore_gpu_type=ignore_gpu_type,
                         exact_limits=exact_limits, pass_interval=interval)
        try:
            report = sim.run()
        except TraceError as e:
            raise _OneLineError(str(e)) from None
        except OSError as e:
            click.echo(f"gpud simulate: error: {trace_path}: {e.strerror or e}", err=True)
            sys.exit(1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_text(report))
