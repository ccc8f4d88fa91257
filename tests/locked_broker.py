"""A real Mosquitto started as Debian 12 starts it: the stock mosquitto.conf, with the shipped
etc/mosquitto/gpud.conf in its conf.d/, and the files ``gpud broker-credentials`` writes.

Only what must differ for a test is changed: paths under the test's directory, a free
loopback port, and ``user`` (the stock file has none, and Mosquitto started as root would
switch to the ``mosquitto`` user, who cannot read pytest's directories).
"""

from __future__ import annotations

import getpass
from pathlib import Path

from gpud.bus.credentials import accounts, password_hash, write_broker_files
from tests.mqtt_broker import MosquittoProc

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "etc" / "mosquitto" / "gpud.conf"

# Debian 12's /etc/mosquitto/mosquitto.conf (mosquitto 2.0.11-1.2), paths templated.
STOCK = """\
# Place your local configuration in /etc/mosquitto/conf.d/
#
# A full description of the configuration file is at
# /usr/share/doc/mosquitto/examples/mosquitto.conf.example

pid_file {dir}/mosquitto.pid

persistence true
persistence_location {dir}/

log_dest file {dir}/mosquitto.log

include_dir {dir}/conf.d
"""


class LockedMosquitto(MosquittoProc):
    """The shipped config; ``passwords`` maps each user to its password."""

    def __init__(self, directory, *, cluster: str, nodes=(), relays=(), observer: bool = False) -> None:
        super().__init__(directory)
        d = self.dir
        self.creds_dir = d / "broker"
        passwd, acl = d / "gpud.passwd", d / "gpud.acl"
        write_broker_files(accounts(cluster, nodes, relays), directory=str(self.creds_dir),
                           passwd_file=str(passwd), acl_file=str(acl))
        self.passwords = {p.name: p.read_text().strip() for p in self.creds_dir.iterdir()}
        if observer:
            # Someone who can read everything on the broker (its admin, or a stolen head
            # password): encryption is what is left between them and the jobs' secrets.
            self.passwords["observer"] = "observer-password"
            with open(passwd, "a") as f:
                f.write(f"observer:{password_hash('observer-password')}\n")
            with open(acl, "a") as f:
                f.write(f"user observer\ntopic read gpud/{cluster}/#\n")
        conf_d = d / "conf.d"
        conf_d.mkdir(exist_ok=True)
        shipped = SHIPPED.read_text()
        for old, new in (("listener 1883 0.0.0.0", f"listener {self.port} 127.0.0.1"),
                         ("/etc/mosquitto/gpud.passwd", str(passwd)), ("/etc/mosquitto/gpud.acl", str(acl))):
            assert old in shipped, old
            shipped = shipped.replace(old, new)
        (conf_d / "gpud.conf").write_text(shipped)
        self.config.write_text(STOCK.format(dir=d) + f"user {getpass.getuser()}\n")
