"""Real Unix users for tests that run as root: created per test, removed afterwards, and a way
to run gpuctl as one of them (the head learns who called from the kernel, so the client
process itself must run with that uid)."""

from __future__ import annotations

import io
import os
import pwd
import secrets
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating users and running jobs as them needs root")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@contextmanager
def temp_users(n: int, extra_group: bool = True):
    """``n`` fresh users, each also in a fresh supplementary group; removed on exit."""
    tag = secrets.token_hex(3)
    names = [f"gpdu{tag}{i}" for i in range(n)]
    group = f"gpdg{tag}"
    try:
        if extra_group:
            subprocess.run(["groupadd", group], check=True, capture_output=True)
        for name in names:
            cmd = ["useradd", "--no-create-home", "--shell", "/bin/bash", "--user-group"]
            if extra_group:
                cmd += ["--groups", group]
            subprocess.run(cmd + [name], check=True, capture_output=True)
        users = []
        for name in names:
            pw = pwd.getpwnam(name)
            users.append(User(name, pw.pw_uid, pw.pw_gid, tuple(sorted(os.getgrouplist(name, pw.pw_gid)))))
        yield users
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True)
        if extra_group:
            subprocess.run(["groupdel", group], capture_output=True)


def gpuctl_as(user: User, args: list[str], socket_path: str, cwd: str = "/") -> tuple[int, str, str]:
    """Run gpuctl's CLI in a forked child that has dropped to ``user``.

    Forking (rather than exec'ing an interpreter) works even where the Python installation is
    not readable by other users; every module gpuctl needs is imported before the fork.
    """
    import gpuctl.main as gm

    for mod in ("sbatch", "squeue", "scancel", "sinfo", "sacct"):
        try:
            __import__(f"gpuctl.commands.{mod}")
        except ImportError:
            pass
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 70
        try:
            os.close(r_out)
            os.close(r_err)
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.chdir(cwd)
            sys.stdout = io.TextIOWrapper(os.fdopen(w_out, "wb"), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(w_err, "wb"), write_through=True)
            os.environ["USER"] = os.environ["LOGNAME"] = user.name
            try:
                gm.main(args=["--socket", socket_path, *args], prog_name="gpuctl")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w_out)
    os.close(w_err)
    with os.fdopen(r_out) as fo, os.fdopen(r_err) as fe:
        out, err = fo.read(), fe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out, err
