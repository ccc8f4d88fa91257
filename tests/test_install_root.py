"""scripts/install for real, as root, into a temporary prefix: the head's system user, a venv
on an interpreter every user can run, gpud.toml readable by users and the key by root
alone; then gpuctl runs as an ordinary user.

Skipped unless root, /usr/bin/python3 can make virtual environments and pip can reach a
package index (the install fetches gpud's dependencies: about 35 s here).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.cluster import REPO
from tests.fake_head import FakeHead, job

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="a real install needs root"),
              pytest.mark.skipif(subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, venv"],
                                                capture_output=True).returncode != 0,
                                 reason="/usr/bin/python3 cannot make virtual environments")]


def others_can_run(path: str) -> bool:
    p = Path(os.path.realpath(path))
    return bool(p.stat().st_mode & stat.S_IXOTH) and all(d.stat().st_mode & stat.S_IXOTH for d in p.parents)


@pytest.fixture(scope="module")
def installed():
    top = Path(tempfile.mkdtemp(prefix="gpud-install-", dir="/tmp"))
    top.chmod(0o755)
    user = f"gpdh{secrets.token_hex(3)}"
    env = {**os.environ, "PREFIX": str(top / "opt/gpud"), "BINDIR": str(top / "bin"),
           "SYSCONFDIR": str(top / "etc/gpud"), "UNITDIR": str(top / "units"), "MANDIR": str(top / "man"),
           "MOSQUITTODIR": str(top / "etc/mosquitto"), "STATEDIR": str(top / "state"), "GPUD_USER": user,
           "PYTHON": ""}
    (top / "etc/mosquitto").mkdir(parents=True)
    env.pop("GPUD_CONFIG", None)
    try:
        r = subprocess.run([str(REPO / "scripts/install")], env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0 and "pip" in r.stderr and ("No matching distribution" in r.stderr
                                                         or "Could not find a version" in r.stderr):
            pytest.skip(f"pip cannot reach a package index: {r.stderr.strip().splitlines()[-1]}")
        assert r.returncode == 0, r.stdout + r.stderr
        yield top, user, r.stdout
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def test_install_makes_the_heads_system_user_and_the_unit_runs_the_head_as_it(installed):
    top, user, out = installed
    pw = pwd.getpwnam(user)
    assert pw.pw_uid < 1000 and pw.pw_shell.endswith("nologin")
    assert f"system user: {user}" in out
    unit = (top / "units/gpud-head.service").read_text()
    assert f"\nUser={user}\n" in unit and f"\nGroup={user}\n" in unit
    assert (f"ExecStartPre=+/usr/bin/install -m 0600 -o {user} -g {user} {top}/etc/gpud/cluster.key "
            "/run/gpud/head.key\n") in unit
    assert "--key-file=/run/gpud/head.key" in unit and "StateDirectoryMode=0700" in unit
    for name in ("gpud-head.service", "gpud-relay.service"):
        assert "LimitNOFILE=65536" in (top / "units" / name).read_text()


def test_the_venv_runs_on_an_interpreter_every_user_can_run(installed):
    top, _, _ = installed
    python = top / "opt/gpud/bin/python"
    assert os.path.realpath(python).startswith("/usr/")
    assert others_can_run(str(python))
    assert (top / "opt/gpud/bin/gpuctl").read_text().splitlines()[0] == f"#!{top}/opt/gpud/bin/python"


def test_config_is_readable_by_users_and_every_secret_is_in_a_private_file(installed):
    top, user, _ = installed
    conf = top / "etc/gpud/gpud.toml"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    assert "\npassword =" not in conf.read_text()                 # the example's is disabled
    key = top / "etc/gpud/cluster.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == 0
    broker = top / "etc/gpud/broker"
    if broker.exists():   # a gpud with `gpud broker-credentials`
        for f in broker.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600
            assert f.stat().st_uid == (pwd.getpwnam(user).pw_uid if f.name == "head" else 0)
        assert (top / "etc/mosquitto/gpud.passwd").exists()


def test_gpuctl_runs_for_an_ordinary_user_after_the_install(installed):
    top, _, _ = installed
    nobody = pwd.getpwnam("nobody")
    sock_dir = Path(tempfile.mkdtemp(prefix="gpud-sock-", dir="/tmp"))
    sock_dir.chmod(0o711)
    try:
        with FakeHead(str(sock_dir / "head.sock")) as head:
            os.chmod(head.path, 0o666)   # as the head's own socket is
            head.jobs[7] = job(7, user="nobody", uid=nobody.pw_uid, name="mine")
            r = subprocess.run([str(top / "bin/gpuctl"), "--socket", head.path, "squeue"], capture_output=True,
                               text=True, timeout=60, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
                               env={"PATH": "/usr/bin:/bin", "HOME": "/"}, cwd="/")
        assert r.returncode == 0, r.stderr
        assert "mine" in r.stdout and "bad interpreter" not in r.stderr
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
