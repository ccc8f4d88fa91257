"""scripts/install and scripts/uninstall, staged under DESTDIR as a packager would run them.

One staged install serves the module (pip is the slow part).  The test host's Python
packages stand in for PyPI: the environment sees the system's site-packages and pip
installs gpud itself without its dependencies.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.cluster import REPO

pytestmark = pytest.mark.slow

PREFIX = "/opt/gpud"
UNITS = ("gpud-head.service", "gpud-worker.service", "gpud-relay.service")
PAGES = sorted(p.name for p in (REPO / "man").iterdir() if p.suffix[1:].isdigit())


def install(destdir: Path, *, script: str = "install", **env: str) -> subprocess.CompletedProcess:
    # The test host's python3 (its packages stand in for PyPI), wherever it lives: a staged
    # install only warns about an interpreter other users cannot run.
    full = {**os.environ, "DESTDIR": str(destdir), "GPUD_VENV_ARGS": "--system-site-packages",
            "GPUD_PIP_ARGS": "--no-deps", "PYTHON": os.environ.get("PYTHON") or "python3", **env}
    full.pop("GPUD_CONFIG", None)
    return subprocess.run([str(REPO / "scripts" / script)], env=full, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stage")
    r = install(root, GPUD_KEY="yes")
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def test_everything_lands_where_it_belongs(staged):
    venv = staged / PREFIX.lstrip("/")
    for cmd in ("gpud", "gpuctl"):
        exe = venv / "bin" / cmd
        assert os.access(exe, os.X_OK)
        # Scripts name the interpreter where it will be, not where it was staged.
        assert exe.read_text().splitlines()[0] == f"#!{PREFIX}/bin/python"
        link = staged / "usr/local/bin" / cmd
        assert os.readlink(link) == f"{PREFIX}/bin/{cmd}"
    assert str(staged) not in (venv / "pyvenv.cfg").read_text()
    for name in ("gpud.toml", "standalone.toml"):
        conf = staged / "etc/gpud" / name
        assert conf.read_bytes() == (REPO / "etc/gpud" / name).read_bytes()
        assert stat.S_IMODE(conf.stat().st_mode) == 0o644   # users' gpuctl reads it; no secrets in it
    assert (venv / "share/gpud/etc/mosquitto/gpud.conf").exists()
    key = staged / "etc/gpud/cluster.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for unit in UNITS:
        text = (staged / "etc/systemd/system" / unit).read_text()
        assert f"ExecStart={PREFIX}/bin/gpud " in text
    for page in PAGES:
        section = page.rsplit(".", 1)[1]
        assert (staged / f"usr/local/share/man/man{section}" / page).read_bytes() == (REPO / "man" / page).read_bytes()


def test_the_staged_environment_runs_its_own_copy(staged):
    python = staged / PREFIX.lstrip("/") / "bin/python"
    r = subprocess.run([str(python), "-c", "import gpud, gpuctl; print(gpud.__file__)"], capture_output=True,
                       text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(staged / PREFIX.lstrip("/") / "lib"))
    for argv in (["-m", "gpud.cli", "--version"], ["-m", "gpud.cli", "relay", "--help"],
                 ["-m", "gpuctl.main", "--help"]):
        r = subprocess.run([str(python), *argv], capture_output=True, text=True, cwd="/")
        assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed")
@pytest.mark.parametrize("page", PAGES)
def test_man_renders_every_installed_page(staged, page):
    section = page.rsplit(".", 1)[1]
    r = subprocess.run(["man", "-l", str(staged / f"usr/local/share/man/man{section}" / page)],
                       capture_output=True, text=True, env={**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": ""})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert page.rsplit(".", 1)[0].upper() in r.stdout.splitlines()[0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_installed_units_verify(staged, tmp_path):
    # Point the units at the staged binary and man pages, which is where they will be.
    for unit in UNITS:
        text = (staged / "etc/systemd/system" / unit).read_text()
        (tmp_path / unit).write_text(text.replace(f"{PREFIX}/bin/gpud", str(staged / PREFIX.lstrip("/") / "bin/gpud")))
    r = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u) for u in UNITS)], capture_output=True,
                       text=True, env={**os.environ, "MANPATH": str(staged / "usr/local/share/man")})
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_units_say_what_the_brief_requires():
    for unit in UNITS:
        text = (REPO / "systemd" / unit).read_text()
        assert "Type=notify" in text and "Restart=on-failure" in text and "WatchdogSec=" in text
    worker = (REPO / "systemd" / "gpud-worker.service").read_text()
    assert "KillMode=process" in worker and "OOMPolicy=continue" in worker
    # Jobs inherit the worker's sandbox: nothing that would take homes, /tmp, GPUs or setuid away.
    settings = {line.split("=", 1)[0] for line in worker.splitlines() if "=" in line and not line.startswith("#")}
    assert not settings & {"ProtectHome", "ProtectSystem", "PrivateTmp", "PrivateDevices", "NoNewPrivileges",
                           "MemoryDenyWriteExecute", "SystemCallFilter", "CapabilityBoundingSet"}


def test_reinstall_keeps_the_sites_config_and_key_then_uninstall_keeps_them_too(staged, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(staged, root, symlinks=True)
    conf, key = root / "etc/gpud/gpud.toml", root / "etc/gpud/cluster.key"
    conf.write_text('cluster = "site"\n')
    old_key = key.read_bytes()
    r = install(root, GPUD_KEY="yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert conf.read_text() == 'cluster = "site"\n' and key.read_bytes() == old_key
    assert "kept /etc/gpud/gpud.toml" in r.stdout

    r = install(root, script="uninstall")
    assert r.returncode == 0, r.stderr
    assert not (root / PREFIX.lstrip("/")).exists()
    for gone in ["usr/local/bin/gpud", "usr/local/bin/gpuctl", *(f"etc/systemd/system/{u}" for u in UNITS),
                 "usr/local/share/man/man8/gpud.8", "usr/local/share/man/man1/gpuctl.1"]:
        assert not os.path.lexists(root / gone), gone
    assert conf.read_text() == 'cluster = "site"\n' and key.read_bytes() == old_key
    r = install(root, script="uninstall")
    assert r.returncode == 1 and "no gpud installation" in r.stderr


def test_uninstall_leaves_a_link_that_is_no_longer_ours(staged, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(staged, root, symlinks=True)
    theirs = root / "usr/local/bin/gpuctl"
    theirs.unlink()
    theirs.symlink_to("/usr/bin/true")
    assert install(root, script="uninstall").returncode == 0
    assert os.readlink(theirs) == "/usr/bin/true"


@pytest.mark.parametrize("env, message", [
    ({"PREFIX": "opt/gpud"}, "PREFIX must be an absolute path"),
    ({"DESTDIR": "stage"}, "DESTDIR must be an absolute path"),
    ({"PYTHON": "/nonexistent/python3"}, "not Python 3.11 or newer"),
])
def test_install_refuses_bad_settings_in_one_line(tmp_path, env, message):
    r = install(tmp_path, **env)
    assert r.returncode == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_reinstall_opens_an_old_0640_config_to_users_unless_it_holds_a_password(staged, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(staged, root, symlinks=True)
    conf, standalone = root / "etc/gpud/gpud.toml", root / "etc/gpud/standalone.toml"
    conf.write_text('cluster = "site"\n')
    standalone.write_text('[broker]\npassword = "s3cret"\n')
    for f in (conf, standalone):
        f.chmod(0o640)
    r = install(root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644 and "made it readable by users" in r.stdout
    assert stat.S_IMODE(standalone.stat().st_mode) == 0o640 and "it holds a broker password" in r.stdout
