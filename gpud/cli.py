"""`gpud`: the daemons and admin tools.

    gpud head | worker | relay | standalone | check-config | keygen | broker-credentials | simulate

Every daemon reads the same gpud.toml; an invalid one stops it before it starts, with the
``FILE:LINE: message`` lines that ``gpud check-config`` prints.  Command-line flags override
the file, at start and again at each reload of the head (SIGHUP, ``scontrol reconfigure``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import replace
from typing import Callable

import click

from . import config as config_mod
from .config import LOG_LEVELS, Config, ConfigError


def _common(f):
    opts = [
        click.option("--config", "config_path", metavar="PATH",
                     help="Config file (default $GPUD_CONFIG, else /etc/gpud/gpud.toml when it exists)."),
        click.option("--broker", metavar="mqtt://HOST:PORT", help="MQTT broker URL."),
        click.option("--key-file", metavar="PATH", help="Cluster key file (mode 0600)."),
        click.option("--state-dir", metavar="DIR", help="Where the daemon keeps its state."),
        click.option("--cluster", metavar="NAME", help="Cluster name (MQTT topic prefix)."),
        click.option("--log-level", type=click.Choice(LOG_LEVELS), help="Log level (default info)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_config(config_path, broker, key_file, state_dir, cluster, log_level) -> Config:
    """The file's config with the command-line flags applied; ConfigError when invalid."""
    cfg = config_mod.load(config_path)
    if broker:
        try:
            config_mod.broker_url(broker)
        except ValueError as e:
            raise ConfigError(f"--broker: {e}") from None
        cfg = replace(cfg, broker=replace(cfg.broker, url=broker))
    if state_dir:
        cfg = replace(cfg, state_dir=os.path.abspath(state_dir))
    if key_file:
        cfg = replace(cfg, key_file=os.path.abspath(key_file))
    if cluster:
        try:
            config_mod.ident(cluster)
        except ValueError as e:
            raise ConfigError(f"--cluster: {e}") from None
        cfg = replace(cfg, cluster=cluster)
    if log_level:
        cfg = replace(cfg, log_level=log_level)
    return cfg


def start_config(command: str, configure: Callable[[], Config]) -> Config:
    """``configure()`` for a daemon about to start: refuse an invalid config, set up logging."""
    try:
        cfg = configure()
    except ConfigError as e:
        for line in e.lines:
            click.echo(line, err=True)
        click.echo(f"gpud {command}: error: invalid configuration; not starting "
                   "(gpud check-config lists the same problems)", err=True)
        sys.exit(1)
    setup_logging(cfg.log_level)
    for line in cfg.warnings:
        logging.getLogger("gpud.config").warning("%s", line)
    return cfg


class OneLineFormatter(logging.Formatter):
    """One line per event, tracebacks included: journald and grep see whole events."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", " | ")


def setup_logging(level: str) -> None:
    """One line per event on stderr; journald adds the time and unit."""
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(fmt))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler], force=True)


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
    def configure() -> Config:
        cfg = build_config(**kw)
        if socket_path:
            cfg = replace(cfg, head=replace(cfg.head, socket=os.path.abspath(socket_path)))
        return cfg

    cfg = start_config("head", configure)
    from .head.service import run_head

    _run(run_head(cfg, loader=configure))


@main.command()
@_common
@click.option("--name", metavar="NAME", help="Node name (default: the host name).")
@click.option("--sim", metavar="SPEC", help="Simulate GPUs, e.g. 8xH100-80GB or 4xA100-80GB,2xA30-24GB.")
@click.option("--sim-devices", metavar="DIR", help="Make the simulated GPUs' device nodes in DIR (for confinement).")
def worker(name, sim, sim_devices, **kw) -> None:
    """Run the worker daemon: registers this node and runs the jobs the head assigns."""
    def configure() -> Config:
        cfg = build_config(**kw)
        return replace(cfg, worker=replace(cfg.worker, name=name or cfg.worker.name, sim=sim or cfg.worker.sim,
                                           sim_devices=sim_devices or cfg.worker.sim_devices))

    cfg = start_config("worker", configure)
    from .worker.daemon import run_worker

    _run(run_worker(cfg))


@main.command()
@_common
@click.option("--socket", "socket_path", metavar="PATH", help="Unix socket (default STATE_DIR/gpud.sock).")
@click.option("--name", metavar="NAME", help="Node name (default: the host name).")
@click.option("--sim", metavar="SPEC", help="Simulate GPUs (default: the real GPUs).")
@click.option("--sim-devices", metavar="DIR", help="Make the simulated GPUs' device nodes in DIR (for confinement).")
@click.option("--port", type=int, default=0, show_default=True, help="Embedded broker port (0: any free port).")
def standalone(socket_path, name, sim, sim_devices, port, **kw) -> None:
    """Head, one worker and an embedded MQTT broker in one process: a single GPU box."""
    def configure() -> Config:
        cfg = build_config(**kw)
        return replace(
            cfg,
            key_file=cfg.key_file if kw.get("key_file") else os.path.join(cfg.state_dir, "cluster.key"),
            head=replace(cfg.head, socket=os.path.abspath(socket_path) if socket_path
                         else os.path.join(cfg.state_dir, "gpud.sock")),
            worker=replace(cfg.worker, name=name or cfg.worker.name, sim=sim or cfg.worker.sim,
                           sim_devices=sim_devices or cfg.worker.sim_devices),
        )

    cfg = start_config("standalone", configure)
    from .standalone import run_standalone

    _run(run_standalone(cfg, port=port, loader=configure))


@main.command()
@_common
@click.option("--socket", "socket_path", metavar="PATH",
              help="Unix socket to serve for gpuctl (default: [head] socket, /run/gpud/gpud.sock).")
@click.option("--name", metavar="NAME", help="This relay's name (default: the host name).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=20.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the head's answer.")
def relay(socket_path, name, timeout, **kw) -> None:
    """Serve gpuctl on a login node: requests go to the head over MQTT, sealed, with the caller's uid."""
    cfg = start_config("relay", lambda: build_config(**kw))
    from .relay import run_relay

    _run(run_relay(cfg, socket_path=os.path.abspath(socket_path) if socket_path else None, name=name,
                   timeout=timeout))


@main.command("check-config")
@click.argument("path", required=False, metavar="[PATH]")
def check_config(path: str | None) -> None:
    """Check a config file: print each problem as FILE:LINE: message and exit 1.

    PATH defaults to $GPUD_CONFIG, else /etc/gpud/gpud.toml.  Exit 0: valid (warnings, if
    any, are printed too); 1: invalid or unreadable; 2: wrong usage.
    """
    path = path or config_mod.default_path()
    try:
        cfg = config_mod.load(path)
    except ConfigError as e:
        for line in e.lines:
            click.echo(line, err=True)
        n = len(e.lines)
        click.echo(f"gpud check-config: {path}: {n} problem{'s' if n != 1 else ''}", err=True)
        sys.exit(1)
    for line in cfg.warnings:
        click.echo(line, err=True)
    click.echo(f"{path}: OK")


@main.command()
@click.option("--rotate", type=click.Choice(["add", "promote", "retire"]),
              help="One step of a key rotation (docs/security.md): add a second key, make it the "
                   "sealing one, drop the old one.")
@click.argument("path")
def keygen(path: str, rotate: str | None) -> None:
    """Write a new cluster key to PATH (mode 0600); copy it to every host."""
    from .keys import KeyFileError, generate_key, rotate_key

    try:
        if rotate is None:
            generate_key(path)
        else:
            keys = rotate_key(path, rotate)
    except KeyFileError as e:
        raise click.ClickException(str(e)) from None
    if rotate is None:
        click.echo(f"wrote cluster key {path}; copy it (mode 0600) to every gpud host")
    else:
        click.echo(f"{path}: {rotate}: {len(keys)} key(s), the first seals; copy it to every gpud host "
                   "and restart its daemons (running jobs are kept)")


@main.command("broker-credentials")
@click.option("--config", "config_path", metavar="PATH",
              help="Config file, for the cluster name (default $GPUD_CONFIG, else /etc/gpud/gpud.toml).")
@click.option("--cluster", metavar="NAME", help="Cluster name (default: the config's).")
@click.option("--node", "nodes", multiple=True, metavar="NAME",
              help="A worker's name (repeat, or comma-separated): users node-NAME and node-NAME-relay.")
@click.option("--relay", "relays", multiple=True, metavar="NAME",
              help="A `gpud relay --name NAME` (repeat, or comma-separated): user relay-NAME.")
@click.option("--dir", "directory", default="/etc/gpud/broker", show_default=True, metavar="DIR",
              help="One password file per user; [broker] credentials_dir on each host.")
@click.option("--passwd", "passwd_file", default="/etc/mosquitto/gpud.passwd", show_default=True,
              metavar="FILE", help="Mosquitto's password_file.")
@click.option("--acl", "acl_file", default="/etc/mosquitto/gpud.acl", show_default=True, metavar="FILE",
              help="Mosquitto's acl_file.")
def broker_credentials(config_path, cluster, nodes, relays, directory, passwd_file, acl_file) -> None:
    """Write the broker's password and ACL files and one password file per daemon user.

    Users: head (every topic), node-NAME and node-NAME-relay per worker, relay-NAME per login
    relay.  Existing users keep their passwords, so run it again with every node to add
    one; then reload Mosquitto (SIGHUP) and copy each host its own files from DIR.
    """
    from .bus.credentials import accounts, write_broker_files
    from .keys import KeyFileError

    if cluster is None:
        try:
            cluster = config_mod.load(config_path).cluster
        except ConfigError as e:
            for line in e.lines:
                click.echo(line, err=True)
            raise click.ClickException("invalid configuration; give --cluster or fix it") from None
    try:
        names = {opt: [n for v in vals for n in v.split(",") if n] for opt, vals in
                 (("--node", nodes), ("--relay", relays))}
        for opt, vals in names.items():
            for n in vals:
                try:
                    config_mod.ident(n)
                except ValueError as e:
                    raise click.ClickException(f"{opt} {n!r}: {e}") from None
        accts = accounts(config_mod.ident(cluster), names["--node"], names["--relay"])
        created = write_broker_files(accts, directory=directory, passwd_file=passwd_file, acl_file=acl_file)
    except (KeyFileError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {passwd_file} and {acl_file} for {len(accts)} user(s) of cluster {cluster!r}"
               f" ({len(created)} new); per-user passwords in {directory}/")
    click.echo("next: reload mosquitto (systemctl reload mosquitto); give each host its own users' files "
               f"(mode 0600, owned by the daemon's user) and set [broker] credentials_dir = \"{directory}\"")


def _register_optional() -> None:
    try:
        from .sim.command import simulate
    except ImportError:
        return
    main.add_command(simulate)


_register_optional()


if __name__ == "__main__":
    main()
