"""--signal=[{R|B}:]SIG[@TIME] as sbatch(1) documents it, from the option to the job's processes.

sbatch(1), --signal: "When a job is within sig_time seconds of its end time, send it the
signal sig_num. [...] If a sig_num is specified without any sig_time, the default time will
be 60 seconds. Use the "B:" option to signal only the batch shell, none of the other
processes will be signaled."  Without B:, gpud signals all the job's processes (its group).
"""

from __future__ import annotations

import pytest

from gpuctl import converters, directives
from gpud.model import JobSpec
from tests.test_executor import FakeClock, Harness, read  # noqa: F401 (the harness's fixture below)


@pytest.fixture
async def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    await harness.cleanup()


@pytest.mark.parametrize("value, expected", [
    ("USR1@90", ("SIGUSR1", 90, False)),          # PyTorch Lightning's auto-requeue
    ("SIGUSR1", ("SIGUSR1", 60, False)),          # "the default time will be 60 seconds"
    ("B:USR2@300", ("SIGUSR2", 300, True)),       # "B:": the batch shell only
    ("R:10@5", ("SIGUSR1", 5, False)),            # "R:" is about reservations: nothing here
    ("RB:TERM@0", ("SIGTERM", 0, True)),
])
def test_the_option_keeps_signal_time_and_target(value, expected):
    got = directives.parse_directives(f"#!/bin/sh\n#SBATCH --signal={value}\ntrue\n").settings
    assert (got["signal"], got["signal_time"], got["signal_batch"]) == expected
    spec = JobSpec.from_request({"script": "#!/bin/sh\n", **got})
    assert (spec.signal, spec.signal_time, spec.signal_batch) == expected


@pytest.mark.parametrize("value", ["USR1@soon", "USR1@65536", "X:USR1", "NOPE@5"])
def test_bad_signal_values_are_refused(value):
    # "sig_time must have an integer value between 0 and 65535"
    with pytest.raises(converters.ScriptError, match="--signal"):
        directives.parse_directives(f"#!/bin/sh\n#SBATCH --signal={value}\ntrue\n")


CHILD = ("bash -c 'trap \"got=1\" USR1; echo child-ready; while [ ! -e ask ]; do sleep 0.05; done; "
         "echo child got=${got:-0}' &\n")
SHELL = "trap 'echo shell got USR1; touch ask' USR1\n" + CHILD + "echo ready\nwhile :; do sleep 0.05; done\n"


@pytest.mark.parametrize("batch, child_got", [(False, 1), (True, 0)])
async def test_the_signal_comes_time_seconds_before_the_limit(h, batch, child_got):
    clock = FakeClock()
    ex = h.executor(clock=clock)
    await ex.start()
    await ex.launch(h.launch(SHELL, time_limit=300, kill_grace=5, warn_signal="SIGUSR1", warn_time=90,
                             warn_batch=batch))
    await h.output("gpud-1.out", "child-ready")
    clock.advance(300 - 91)             # 91 s before the limit: nothing yet
    await ex.signal(1, 0, sig="CONT", reason="signal")   # a harmless poke: the executor looks again
    assert "got USR1" not in read(h.work_dir / "gpud-1.out")
    clock.advance(2)                    # 89 s before: the signal
    await h.output("gpud-1.out", "shell got USR1")
    await h.output("gpud-1.out", f"child got={child_got}")
    assert ex.running() == [(1, 0)]     # a warning, not a stop
    clock.advance(90)                   # the limit itself still stops the job
    outcome = await h.outcome(1)
    assert outcome.reason == "timeout"


async def test_the_head_sends_the_request_and_show_job_keeps_the_exit_signal_apart(tmp_path):
    """The launch carries the warning; scontrol show job's ExitCode is the job's own code:signal
    (sbatch(1)'s ExitCode is "exit code:signal that caused termination"), never the --signal."""
    from gpuctl.commands.scontrol import job_record
    from tests.slurm_head import HeadKit

    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1")
        kit.record_sent()
        a = await kit.submit(gpus=1, time_limit=600, signal="SIGUSR1", signal_time=90, signal_batch=True)
        await kit.schedule()
        [(_, body)] = kit.sent_to("launch")
        assert (body["warn_signal"], body["warn_time"], body["warn_batch"]) == ("SIGUSR1", 90, True)
        await kit.finish(a, exit_code=3)
        [shown] = (await kit.call("show", kind="job", job_ids=[a]))["jobs"]
        assert shown["signal_request"] == "B:USR1@90"
        assert "ExitCode=3:0" in " ".join(job_record(shown))
