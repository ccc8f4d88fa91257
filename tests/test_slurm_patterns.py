"""sbatch's file name patterns, with sbatch(1)'s "filename pattern" section as the oracle.

sbatch(1): "sbatch allows for a filename pattern to contain one or more replacement symbols,
which are a percent sign "%" followed by a letter (e.g. %j)."  The batch script is step
"batch", task 0 on the job's first node (node 0).
"""

from __future__ import annotations

import pytest

from gpud.syntax import expand_output

WD = "/home/alice/run"


def path(pattern, **kw):
    args = {"work_dir": WD, "job_id": 128, "name": "bert", "user": "alice", "node": "gpu07"}
    args.update(kw)
    return expand_output(pattern, **args)


@pytest.mark.parametrize("pattern, expected, says", [
    ("%%", "%", '"%% The character "%"."'),
    ("a-%A_%a", "a-11_3", "\"%A Job array's master job allocation number.\" \"%a Job array ID (index) number.\""),
    ("%J", "128", '"%J jobid.stepid of the running job.": the batch script\'s, whose id is the job\'s'),
    ("%j", "128", '"%j jobid of the running job."'),
    ("%N", "gpu07", '"%N short hostname."'),
    ("%n", "0", '"%n Node identifier relative to current job (e.g. "0" is the first node of the running job)"'),
    ("%s", "batch", '"%s stepid of the running job.": the batch step'),
    ("%t", "0", '"%t task identifier (rank) relative to current job."'),
    ("%u", "alice", '"%u User name."'),
    ("%x", "bert", '"%x Job name."'),
    ("job%4j.out", "job0128.out", '"job%4j.out" -> "job0128.out" (sbatch(1)\'s example)'),
    ("%3a-%3A", "003-011", '"A number placed between the percent character and format specifier may be used to '
                           'zero-pad the result in the IO filename."'),
    ("%5x-%3N", "bert-gpu07", '"This number is ignored if the format specifier corresponds to non-numeric data"'),
    ("%12j", "0000000128", "Slurm pads to at most 10 digits"),
    ("out\\%j", "out%j", '"\\\\ Do not process any of the replacement symbols."'),
    ("%q-%", "%q-%", "not a replacement symbol: kept as written"),
])
def test_every_replacement_symbol(pattern, expected, says):
    kw = {"job_id": 14, "array_job_id": 11, "array_task_id": 3} if pattern[-1] in "aA" else {}
    assert path(pattern, **kw) == f"{WD}/{expected}", says


def test_defaults_are_what_is_written():
    assert path(None) == f"{WD}/gpud-128.out"
    assert path(None, job_id=14, array_job_id=11, array_task_id=3) == f"{WD}/gpud-11_3.out"
    assert path("/abs/%x.log") == "/abs/bert.log"
    assert path("%N.out", node=None) == f"{WD}/%N.out"      # no node yet: as written


async def test_scontrol_shows_the_file_an_array_task_writes(tmp_path):
    from gpuctl.commands.scontrol import job_record
    from tests.slurm_head import HeadKit, spec

    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=8)
        arr = (await kit.call("submit", spec=spec("true", array="0-3", work_dir="/w")))["job_id"]
        await kit.schedule()
        [task] = (await kit.call("show", kind="job", array_tasks=[[arr, 2]]))["jobs"]
        assert f"StdOut=/w/gpud-{arr}_2.out" in " ".join(job_record(task))
        one = (await kit.call("submit", spec=spec("true", work_dir="/w", stdout="o-%x-%J.txt", name="nm")))["job_id"]
        [shown] = (await kit.call("show", kind="job", job_ids=[one]))["jobs"]
        assert f"StdErr=/w/o-nm-{one}.txt StdOut=/w/o-nm-{one}.txt" in " ".join(job_record(shown))
