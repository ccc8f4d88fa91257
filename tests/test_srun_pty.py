"""gpuctl srun outside a job and srun --pty on a real terminal (Python's pty module), on
gpud standalone and on a head with two workers over Mosquitto."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.cluster import wait_for
from tests.interactive_rig import Terminal, child_env, gpuctl_argv, gpus_allocated, rig  # noqa: F401 (fixture)
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
PROMPT = r"PS1> $"
SHELL = ["env", "PS1=PS1> ", "bash", "--norc", "--noprofile", "-i"]


def shell(rig, *srun_args: str) -> Terminal:
    t = Terminal(gpuctl_argv(rig.socket, "srun", *srun_args, "--pty", *SHELL), child_env(rig.socket), str(rig.root))
    t.read_until(PROMPT, 60)
    return t


def test_a_pty_shell_has_its_gpu_a_terminal_and_returns_its_exit_status(rig):
    t = shell(rig, "--gpus", "1")
    try:
        t.type("echo gpus=$CUDA_VISIBLE_DEVICES; tty; exit 3\r")
        assert t.wait(60) == 3
        text = t.out.decode(errors="replace")
        gpus = re.search(r"gpus=(\S*)", text.split("exit 3", 1)[1]).group(1)
        assert len(gpus.split(",")) == 1 and gpus.startswith("GPU-")
        assert re.search(r"^/dev/pts/\d+\r?$", text, re.M)
    finally:
        t.close()
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "the GPU to be released")


def test_window_size_ctrl_c_and_ctrl_d_reach_the_remote_terminal(rig):
    t = shell(rig, "--gpus", "1")
    try:
        t.type("stty size\r")
        t.read_until(r"\b24 80\r", 30)
        t.resize(40, 132)
        wait_for(lambda: (t.type("stty size\r"), _seen(t, rb"\b40 132\r"))[1], 30, "the new size on the node")
        t.type("sleep 1001; echo slept\r")
        t.read_until(r"sleep 1001; echo slept\r\n", 30)
        # A key typed before the shell hands the terminal to sleep would signal the shell,
        # not sleep, as on any terminal: wait until sleep is the terminal's foreground.
        wait_for(lambda: _in_the_foreground("1001"), 30, "sleep 1001 in the terminal's foreground")
        t.type(b"\x03")                      # Ctrl-C: SIGINT for the remote foreground job
        t.read_until(PROMPT, 30)
        t.type("echo still-$((6*7))\r")
        t.read_until(r"still-42", 30)
        assert b"slept" not in t.out.split(b"sleep 1001; echo slept")[-1]
        t.type("sleep 1002\r")
        t.read_until(r"sleep 1002\r\n", 30)
        wait_for(lambda: _in_the_foreground("1002"), 30, "sleep 1002 in the terminal's foreground")
        t.type(b"\x1a")                      # Ctrl-Z: SIGTSTP; the shell takes the terminal back
        t.read_until(r"Stopped\s+sleep 1002", 30)
        t.type("kill -9 %1; echo killed-$((1+1))\r")
        t.read_until(r"killed-2", 30)
        t.type(b"\x04")                      # Ctrl-D: the shell's end of input
        assert t.wait(60) == 0
    finally:
        t.close()


def _in_the_foreground(seconds: str) -> bool:
    """A ``sleep SECONDS`` runs in its terminal's foreground process group."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] != [b"sleep", seconds.encode()]:
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == fields[5]:     # pgrp == tpgid
            return True
    return False


def _seen(t: Terminal, pattern: bytes) -> bool:
    try:
        t.read_until(pattern, 1.0)
        return True
    except AssertionError:
        return False


def test_srun_outside_a_job_sends_stdin_to_task_0_and_keeps_line_order(rig):
    r = subprocess.run(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "-l", "sh", "-c", "cat; seq 1 500"),
                       env=child_env(rig.socket), input="one\ntwo\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["0: one", "0: two"] + [f"0: {i}" for i in range(1, 501)]
    wait_for(lambda: gpus_allocated(rig) == 0, 30, "the GPU to be released")
