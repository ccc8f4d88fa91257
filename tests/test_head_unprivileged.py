"""The head needs no root: run by an ordinary user, with a key and a state
directory of its own and a real Mosquitto, it serves root's gpuctl, knows root by the
kernel's word, and keeps its database to itself."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuctl import Client
from gpud.config import Config
from gpud.keys import generate_key
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")]

NOBODY = pwd.getpwnam("nobody")


def test_a_head_run_by_an_ordinary_user_serves_root(mosquitto):  # noqa: F811
    top = Path(tempfile.mkdtemp(prefix="gpud-unpriv-", dir="/tmp"))
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir()
        key = top / "head.key"
        generate_key(str(key))
        for p in (state, key):
            os.chown(p, NOBODY.pw_uid, NOBODY.pw_gid)
        sock = str(top / "state/gpud.sock")
        cfg = Config(cluster="unpriv", state_dir=str(state), key_file=str(key))
        cfg = replace(cfg, broker=replace(cfg.broker, url=mosquitto.url), head=replace(cfg.head, socket=sock))
        log = open(top / "head.log", "wb")
        # Everything the head imports, loaded before the fork: this interpreter's own files may
        # be closed to other users (a pyenv under /root), which is not what is tested here.
        import asyncio  # noqa: F401
        import concurrent.futures.thread  # noqa: F401
        import gpud.bus.credentials  # noqa: F401
        import gpud.bus.mqtt  # noqa: F401
        import gpud.cli  # noqa: F401
        import gpud.head.service  # noqa: F401
        import gpud.head.ops_slurm  # noqa: F401
        pid = os.fork()
        if pid == 0:   # the head, as nobody
            code = 1
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                os.setgroups([])
                os.setgid(NOBODY.pw_gid)
                os.setuid(NOBODY.pw_uid)
                from gpud.cli import setup_logging
                from gpud.head.service import run_head

                setup_logging("info")
                code = asyncio.run(run_head(cfg))
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code or 0)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with Client(sock, timeout=5) as c:
                        me = c.call("ping")
                    break
                except Exception:
                    assert time.monotonic() < deadline, (top / "head.log").read_text()
                    assert os.waitpid(pid, os.WNOHANG) == (0, 0), (top / "head.log").read_text()
                    time.sleep(0.1)
            assert (me["uid"], me["user"], me["admin"]) == (0, "root", True)
            with Client(sock, timeout=5) as c:
                job = c.call("submit", spec={"script": "#!/bin/bash\ntrue\n", "name": "j", "work_dir": "/tmp",
                                             "hold": True})["job_id"]
                assert [j["job_id"] for j in c.call("jobs")["jobs"]] == [job]
            for name in ("head.db", "head.db-wal", "head.db-shm"):
                st = (state / name).stat()
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o600), name
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666
        finally:
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            log.close()
        assert os.waitstatus_to_exitcode(status) == 0, (top / "head.log").read_text()
    finally:
        shutil.rmtree(top, ignore_errors=True)
