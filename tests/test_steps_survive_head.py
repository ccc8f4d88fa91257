"""A step outlives its head: kill -9 of the head under an open `srun --pty bash` (a head and
two workers over Mosquitto); after the restart the same shell answers, and what it printed
meanwhile arrives once.  The same for a restart of the broker."""

from __future__ import annotations

import re
import signal

import pytest

from tests.interactive_rig import MqttRig, Terminal, child_env, gpuctl_argv
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
PROMPT = r"PS1> $"


def test_kill_9_of_the_head_under_srun_pty_bash(tmp_path, mosquitto):  # noqa: F811
    rig = MqttRig(tmp_path / "c", mosquitto.url).up()
    try:
        t = Terminal(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "--pty", "env", "PS1=PS1> ", "bash", "--norc",
                                 "--noprofile", "-i"), child_env(rig.socket), str(rig.root))
        try:
            t.read_until(PROMPT, 60)
            t.type("echo pid=$$\r")
            pid = t.read_until(r"pid=(\d+)\r").group(1)
            # Output that is printed while the head is away.
            t.type("sleep 2; seq 1 300 | sed 's/^/L-/'; echo D''ONE\r")
            t.read_until(r"echo D''ONE\r\n", 30)
            rig.stop(rig.head, signal.SIGKILL)
            rig.start_head()
            t.read_until(r"\nDONE\r\n", 60)
            t.read_until(PROMPT, 30)
            numbers = [int(n) for n in re.findall(rb"L-(\d+)\r\n", t.out)]
            assert numbers == list(range(1, 301))      # each line once, in order
            t.type("echo pid=$$ again\r")               # the same shell answers, typing works
            assert t.read_until(r"pid=(\d+) again\r").group(1) == pid
            t.type("exit 5\r")
            assert t.wait(60) == 5
            assert b"lost the head" in t.out and b"reconnected" in t.out
        finally:
            t.close()
    finally:
        rig.close()


def test_a_broker_restart_under_srun_pty_bash(tmp_path, mosquitto):  # noqa: F811
    rig = MqttRig(tmp_path / "c", mosquitto.url).up()
    try:
        t = Terminal(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "--pty", "env", "PS1=PS1> ", "bash", "--norc",
                                 "--noprofile", "-i"), child_env(rig.socket), str(rig.root))
        try:
            t.read_until(PROMPT, 60)
            t.type("sleep 1; seq 1 300 | sed 's/^/L-/'; echo D''ONE\r")
            t.read_until(r"echo D''ONE\r\n", 30)
            mosquitto.restart()
            t.read_until(r"\nDONE\r\n", 90)
            t.read_until(PROMPT, 30)
            assert [int(n) for n in re.findall(rb"L-(\d+)\r\n", t.out)] == list(range(1, 301))
            t.type("echo typed-after\r")
            t.read_until(r"[\r\n]typed-after\r\n", 60)
            t.type(b"\x04")
            assert t.wait(60) == 0
        finally:
            t.close()
    finally:
        rig.close()
