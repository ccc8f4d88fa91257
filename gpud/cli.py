"""`gpud`: the daemons and admin tools.

    gpud head | worker | standalone | keygen | simulate
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import replace

import click

from . import config as config_mod
from .config import Config, ConfigError

LOG_LEVELS = ("debug", "info", "warning", "error")


def _common(f):
    opts = [
        click.option("--config", "config_path", metavar="PATH",
                     help="Config file (default /etc/gpud/gpud.toml when it exists)."),
        click.option("--broker", metavar="mqtt://HOST:PORT", help="MQTT broker URL."),
        click.option("--key-file", metavar="PATH", help="Cluster key file (mode 0600)."),
        click.option("--state-dir", metavar="DIR", help="Where the daemon keeps its state."),
        click.option("--cluster", metavar="NAME", help="Cluster name (MQTT topic prefix)."),
        click.option("--log-level", type=click.Choice(LOG_LEVELS), help="Log level (default info)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load_config(config_path, broker, key_file, state_dir, cluster, log_level) -> Config:
    try:
        cfg = config_mod.load(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    if broker:
        cfg = replace(cfg, broker=replace(cfg.broker, url=broker))
    if state_dir:
        cfg = replace(cfg, state_dir=os.path.abspath(state_dir))
    if key_file:
        cfg = replace(cfg, key_file=os.path.abspath(key_file))
    if cluster:
        cfg = replace(cfg, cluster=cluster)
    if log_level:
        cfg = replace(cfg, log_level=log_level)
    setup_logging(cfg.log_level)
    return cfg


def setup_logging(level: str) -> None:
    """One line per event on stderr; journald adds the time and unit."""
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=fmt, stream=sys.stderr,
                        force=True)


def _run(coro) -> None:
    try:
        code = asyncio.run(coro)
    except KeyboardInterrupt:
        code = 130
    except (ConfigError, OSError, RuntimeError, ValueError) as e:
        click.echo(f"gpud: error: {e}", err=True)
        code = 1
    sys.exit(code or 0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpud")
def main() -> None:
    """gpud: a GPU batch scheduler for bare-metal clusters."""


@main.command()
@_common
@click.option("--socket", "socket_path", metavar="PATH", help="Unix socket for gpuctl (default /run/gpud/gpud.sock).")
def head(socket_path, **kw) -> None:
    """Run the head daemon: job database, scheduler, gpuctl socket."""
    cfg = load_config(**kw)
    if socket_path:
        cfg = replace(cfg, head=replace(cfg.head, socket=os.path.abspath(socket_path)))
    from .head.service import run_head

    _run(run_head(cfg))


@main.command()
@_common
@click.option("--name", metavar="NAME", help="Node name (default: the host name).")
@click.option("--sim", metavar="SPEC", help="Simulate GPUs, e.g. 8xH100-80GB or 4xA100-80GB,2xA30-24GB.")
def worker(name, sim, **kw) -> None:
    """Run the worker daemon: registers this node and runs the jobs the head assigns."""
    cfg = load_config(**kw)
    cfg = replace(cfg, worker=replace(cfg.worker, name=name or cfg.worker.name, sim=sim or cfg.worker.sim))
    from .worker.daemon import run_worker

    _run(run_worker(cfg))


@main.command()
@_common
@click.option("--socket", "socket_path", metavar="PATH", help="Unix socket (default STATE_DIR/gpud.sock).")
@click.option("--name", metavar="NAME", help="Node name (default: the host name).")
@click.option("--sim", metavar="SPEC", help="Simulate GPUs (default: the real GPUs).")
@click.option("--port", type=int, default=0, show_default=True, help="Embedded broker port (0: any free port).")
def standalone(socket_path, name, sim, port, **kw) -> None:
    """Head, one worker and an embedded MQTT broker in one process: a single GPU box."""
    cfg = load_config(**kw)
    cfg = replace(
        cfg,
        key_file=cfg.key_file if kw.get("key_file") else os.path.join(cfg.state_dir, "cluster.key"),
        head=replace(cfg.head, socket=os.path.abspath(socket_path) if socket_path else os.path.join(cfg.state_dir, "gpud.sock")),
        worker=replace(cfg.worker, name=name or cfg.worker.name, sim=sim or cfg.worker.sim),
    )
    from .standalone import run_standalone

    _run(run_standalone(cfg, port=port))


@main.command()
@click.argument("path")
def keygen(path: str) -> None:
    """Write a new cluster key to PATH (mode 0600); copy it to every host."""
    from .keys import KeyFileError, generate_key

    try:
        generate_key(path)
    except KeyFileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote cluster key {path}; copy it (mode 0600) to every gpud host")


def _register_optional() -> None:
    try:
        from .sim.command import simulate
    except ImportError:
        return
    main.add_command(simulate)


_register_optional()


if __name__ == "__main__":
    main()
