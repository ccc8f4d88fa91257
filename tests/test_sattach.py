"""gpuctl sattach from another terminal: a running step's output, and input for task 0."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster import wait_for
from tests.interactive_rig import Terminal, child_env, gpuctl_argv, rig  # noqa: F401 (fixture)
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def _running_job(rig) -> int:
    r = rig.gpuctl("squeue", "-h", "-o", "%i", check=False)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else 0


def test_sattach_shows_a_running_steps_output_and_types_into_task_0(rig):
    # The step reads a line from its input (srun's is a pipe we never write to), in
    # 0.2 s tries: what a timed-out try read is kept (bash saves it), as the line may come
    # in pieces.
    script = ('echo started; line=; until read -r -t 0.2 part; do line="$line$part"; done; '
              'echo "got $line$part"; echo bye')
    srun = subprocess.Popen(gpuctl_argv(rig.socket, "srun", "--gpus", "1", "bash", "-c", script),
                            env=child_env(rig.socket), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        job = wait_for(lambda: _running_job(rig), 60, "the step's allocation")
        assert srun.stdout.readline() == "started\n"
        t = Terminal(gpuctl_argv(rig.socket, "sattach", f"{job}.0"), child_env(rig.socket), str(rig.root))
        try:
            t.read_until(r"started", 30)            # what was printed before it attached
            t.type("from-the-other-terminal\n")      # task 0's input, as a second writer
            t.read_until(r"got from-the-other-terminal\r?\n", 30)
            t.read_until(r"bye", 30)
            assert t.wait(30) == 0
        finally:
            t.close()
        out, _ = srun.communicate(timeout=30)
        assert out == "got from-the-other-terminal\nbye\n"
        assert srun.returncode == 0
    finally:
        if srun.poll() is None:
            srun.kill()
