"""gpuctl.options, gpuctl.converters, gpuctl.directives and gpuctl.script: the option table,
its converters, directives, and the JobSpec dict they build."""

from __future__ import annotations

import subprocess

import pytest

from gpuctl import converters, directives, options
from gpuctl import script as s
from gpud.model import JobSpec

SCRIPT = """#!/bin/bash
#SBATCH --gpus=2 -c 8
#SBATCH --mem 16G
#SBATCH -t 1:30:00 -J train
# SBATCH --gpus=7      (a space after '#': an ordinary comment)
#SBATCH --output=logs/%j.out --no-requeue -H
echo start
#SBATCH --gpus=5       (after the first command: ignored)
"""


def test_directives_are_read_until_the_first_command():
    d = directives.parse_directives(SCRIPT)
    assert d.settings == {"gpus": 2, "cpus": 8, "mem_mb": 16384, "time_limit": 5400.0, "name": "train",
                          "stdout": "logs/%j.out", "requeue": False, "hold": True}
    assert SCRIPT.split("\n")[d.body_line] == "echo start"


@pytest.mark.parametrize("line, expected", [
    ("--gpus=4", {"gpus": 4}),
    ("--gpus 4", {"gpus": 4}),
    ("--gpus a100:2", {"gpus": 2, "gpu_type": "a100"}),
    ("-c4", {"cpus": 4}),
    ("-c 4", {"cpus": 4}),
    ("-J 'my job'", {"name": "my job"}),
    ("--time=2-00:00:00", {"time_limit": 172800.0}),
    ("-t 90", {"time_limit": 5400.0}),
    ("-t UNLIMITED", {"time_limit": None}),
    ("--mem=512", {"mem_mb": 512}),
    ("--mem=2048K", {"mem_mb": 2}),
    ("--nice=-5", {"nice": -5}),
    ("--signal=USR1", {"signal": "SIGUSR1", "signal_time": 60, "signal_batch": False}),
    ("--signal 15", {"signal": "SIGTERM", "signal_time": 60, "signal_batch": False}),
    ("-A physics -p gpu -q high", {"account": "physics", "partition": "gpu", "qos": "high"}),
    ("--requeue", {"requeue": True}),
    ("--comment 'a b'  # trailing comment", {"comment": "a b"}),
    ("--parsable", {"parsable": True}),
    ("-D /data -e err.txt", {"work_dir": "/data", "stderr": "err.txt"}),
])
def test_directive_syntax(line, expected):
    assert directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\ntrue\n").settings == expected


@pytest.mark.parametrize("line, message", [
    ("--bogus=1", "line 2: #SBATCH unrecognized option '--bogus=1'"),
    ("gpus=1", "unrecognized option 'gpus=1'"),
    ("--gpus", "--gpus needs a value"),
    ("--gpus=x", "--gpus needs a whole number"),
    ("--gpus=-1", "--gpus must be between 0 and 4096"),
    ("-c 0", "--cpus-per-task must be between 1"),
    ("--mem=lots", "--mem: invalid size"),
    ("--time=soon", "--time: invalid duration"),
    ("--hold=yes", "--hold takes no value"),
    ("--wrap 'echo'", "--wrap is not allowed in a batch script"),
    ("--signal=NOPE", "--signal: unknown signal 'NOPE'"),
    ("-J 'a/b'", "invalid job name"),
    ("--comment 'open", "cannot split"),
])
def test_bad_directives_name_the_line(line, message):
    with pytest.raises(converters.ScriptError, match="^line 2: "):
        directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\n")
    with pytest.raises(converters.ScriptError) as e:
        directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\n")
    assert message in str(e.value)


def test_gpud_directives_win_over_sbatch_ones_wherever_they_stand():
    text = "#!/bin/sh\n#GPUD --gpus 3\n#SBATCH --gpus 1 --cpus-per-task 2\n#GPUD -J mine\nhostname\n"
    assert directives.parse_directives(text).settings == {"gpus": 3, "cpus": 2, "name": "mine"}


def test_directive_prefix_needs_whitespace_after_it():
    assert directives.parse_directives("#!/bin/sh\n#SBATCHX --gpus=1\n#GPUD\ntrue\n").settings == {}


def test_build_spec_fills_defaults_and_makes_paths_absolute():
    spec = s.build_spec(SCRIPT, {"gpus": 4}, default_name="job.sh", cwd="/home/a/proj", env={"A": "1"})
    assert spec == {
        "script": SCRIPT, "name": "train", "work_dir": "/home/a/proj", "env": {"A": "1"},
        "gpus": 4, "cpus": 8, "mem_mb": 16384, "time_limit": 5400.0,
        "stdout": "/home/a/proj/logs/%j.out", "requeue": False, "hold": True,
    }
    assert set(spec) <= JobSpec.field_names()
    JobSpec.from_request(spec)  # the head would accept it


def test_relative_chdir_is_resolved_against_the_submit_directory():
    spec = s.build_spec("#!/bin/sh\n#SBATCH -D ../data -o out\ntrue\n", {}, default_name="x", cwd="/home/a/proj",
                        env={})
    assert spec["work_dir"] == "/home/a/data"
    assert spec["stdout"] == "/home/a/data/out"


def test_unlimited_time_leaves_the_limit_to_the_partition():
    spec = s.build_spec("#!/bin/sh\n#SBATCH -t 10\ntrue\n", {"time_limit": None}, default_name="x", cwd="/", env={})
    assert "time_limit" not in spec


def test_default_name_is_made_safe():
    spec = s.build_spec("#!/bin/sh\ntrue\n", {}, default_name="a\tb", cwd="/", env={})
    assert spec["name"] == "a_b"


def test_environment_that_json_cannot_carry_is_left_out():
    assert s.exportable_env({"OK": "1", "BAD": "\udcff"}) == {"OK": "1"}


def test_script_arguments_become_positional_parameters(tmp_path):
    text = "#!/bin/bash\n#SBATCH --gpus=1\n\nprintf '%s|' \"$#\" \"$@\"\n"
    args = ["plain", "two words", "it's", "$HOME", "`id`", "-x", ""]
    spec = s.build_spec(text, {}, default_name="x", args=args, cwd="/", env={})
    lines = spec["script"].split("\n")
    assert lines[:4] == ["#!/bin/bash", "#SBATCH --gpus=1", "", lines[3]]
    assert lines[3].startswith("set -- ")
    assert directives.parse_directives(spec["script"]).settings == {"gpus": 1}
    path = tmp_path / "job.sh"
    path.write_text(spec["script"])
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, check=True).stdout
    assert out == "7|plain|two words|it's|$HOME|`id`|-x||"


def test_script_arguments_after_directives_only_script():
    spec = s.build_spec("#!/bin/sh\n#SBATCH -c 2", {}, default_name="x", args=["a"], cwd="/", env={})
    assert spec["script"] == "#!/bin/sh\n#SBATCH -c 2\nset -- a"


@pytest.mark.parametrize("first_line, ok", [
    ("#!/bin/bash", True), ("#!/usr/bin/env bash", True), ("#!/bin/sh -e", True),
    ("#!/usr/bin/python3", False), ("#!/usr/bin/env python3", False),
])
def test_script_arguments_need_a_shell(first_line, ok):
    text = f"{first_line}\ntrue\n"
    if ok:
        assert "set -- a" in s.add_arguments(text, ["a"], 1)
    else:
        with pytest.raises(converters.ScriptError, match="need a shell script"):
            s.add_arguments(text, ["a"], 1)


@pytest.mark.parametrize("text, message", [
    ("", "is empty"), ("  \n", "is empty"), ("echo hi\n", "first line must start with #!"),
    ("#!/bin/sh\n\x00", "NUL bytes"),
])
def test_check_script_refuses_what_cannot_run(text, message):
    with pytest.raises(converters.ScriptError, match=message):
        s.check_script(text, "job.sh")


def test_wrap_script():
    assert s.wrap_script("python train.py --lr 3e-4") == "#!/bin/bash\npython train.py --lr 3e-4\n"


def test_every_option_has_a_unique_spelling_and_a_known_destination():
    names = [n for o in options.OPTIONS for n in (o.long, o.short, o.negation) if n]
    assert len(names) == len(set(names))
    for o in options.OPTIONS:
        settings = options.convert(o, True) if o.is_flag else None
        if settings is not None:
            assert set(settings) <= JobSpec.field_names() | s.CLIENT_SETTINGS


def test_api_settings():
    assert s.api_settings({"mem_mb": "2G", "time_limit": "10", "signal": "usr2", "gpus": 1, "qos": None}) == {
        "mem_mb": 2048, "time_limit": 600.0, "signal": "SIGUSR2", "signal_time": 60, "signal_batch": False,
        "gpus": 1}
    with pytest.raises(TypeError, match="unknown job option"):
        s.api_settings({"gpu": 1})
    with pytest.raises(TypeError, match="env must map"):
        s.api_settings({"env": {"A": 1}})


# -- big jobs: the JobSpec fields the options set ------------------------------------------------

BIG = {"script": "#!/bin/sh\ntrue\n", "gpus": 16, "nodes": 2, "ntasks_per_node": 8, "nodelist": ["w1", "w2"],
       "exclude": ["w9"], "constraint": "a100&ib", "exclusive": True, "switches": 1, "switches_wait": 600}


def test_jobspec_carries_the_big_job_fields_through_json():
    import json

    spec = JobSpec.from_request(BIG)
    assert (spec.nodes, spec.ntasks_per_node, spec.nodelist, spec.exclude) == (2, 8, ("w1", "w2"), ("w9",))
    assert (spec.constraint, spec.exclusive, spec.switches, spec.switches_wait) == ("a100&ib", True, 1, 600.0)
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["nodelist"] == ["w1", "w2"] and JobSpec.from_request(d) == spec
    assert JobSpec(**d) == spec          # as the head's store reads a spec back


def test_jobspec_defaults_are_one_node_anywhere():
    spec = JobSpec.from_request({"script": "#!/bin/sh\n", "gpus": 3})
    assert (spec.nodes, spec.ntasks_per_node, spec.nodelist, spec.exclude, spec.constraint, spec.exclusive,
            spec.switches, spec.switches_wait) == (1, 1, (), (), None, False, None, None)


def test_jobspec_drops_repeated_node_names():
    assert JobSpec.from_request({**BIG, "nodelist": ["w2", "w1", "w2"]}).nodelist == ("w2", "w1")


@pytest.mark.parametrize("change, message", [
    ({"nodes": 0}, "nodes must be between 1 and 4096"),
    ({"nodes": 4097}, "nodes must be between 1 and 4096"),
    ({"nodes": "2"}, "nodes must be an integer"),
    ({"gpus": 6, "nodes": 4, "nodelist": []}, "6 GPUs do not divide among 4 nodes"),
    ({"ntasks_per_node": 0}, "ntasks_per_node must be between 1 and 1024"),
    ({"ntasks_per_node": 1025}, "ntasks_per_node must be between 1 and 1024"),
    ({"nodelist": "w[1-2]"}, "nodelist must be a list"),
    ({"nodelist": ["w1", "bad name"]}, "--nodelist: 'bad name' is not a node name"),
    ({"exclude": ["-w"]}, "--exclude: '-w' is not a node name"),
    ({"nodelist": ["w1", "w2", "w3"]}, "--nodelist names 3 nodes but the job asks for 2"),
    ({"exclude": ["w2"]}, "node w2 is both in --nodelist and in --exclude"),
    ({"constraint": "a100&ib|v100"}, "invalid constraint 'a100&ib|v100'"),
    ({"constraint": "a100,ib"}, "invalid constraint"),
    ({"constraint": "a100&"}, "invalid constraint"),
    ({"constraint": ""}, "invalid constraint"),
    ({"constraint": 3}, "invalid constraint"),
    ({"exclusive": "yes"}, "exclusive must be true or false"),
    ({"switches": 0}, "switches must be between 1 and 64"),
    ({"switches": 65}, "switches must be between 1 and 64"),
    ({"switches_wait": -1}, "switches_wait must be seconds"),
    ({"switches": None}, "switches_wait needs switches"),
    ({"gpus": 2, "mig_profile": "1g.10gb"}, "a job on several nodes takes whole GPUs"),
])
def test_jobspec_refuses_bad_big_job_fields_in_one_line(change, message):
    from gpud.model import SpecError

    with pytest.raises(SpecError) as e:
        JobSpec.from_request({**BIG, **change})
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("constraint, features, ok", [
    (None, "", True), ("a100", "a100,ib", True), ("a100&ib", "ib,a100", True), ("a100&ib", "a100", False),
    ("a100|h100", "h100", True), ("a100|h100", ["v100"], False), ("ib", None, False),
])
def test_constraint_matches(constraint, features, ok):
    from gpud.model import constraint_matches

    assert constraint_matches(constraint, features) is ok


# -- big jobs: options and directives ------------------------------------------------------------

def _spec(line: str, cli: dict | None = None) -> dict:
    text = f"#!/bin/sh\n#SBATCH {line}\ntrue\n" if line else "#!/bin/sh\ntrue\n"
    spec = s.build_spec(text, cli or {}, default_name="x", cwd="/home/a", env={})
    JobSpec.from_request(spec)          # the head would accept it
    return {k: v for k, v in spec.items() if k not in ("script", "name", "work_dir", "env")}


@pytest.mark.parametrize("line, expected", [
    ("-N 1 --ntasks=1 --ntasks-per-node=1 --gpus 2", {"gpus": 2}),     # single-node requests unchanged
    ("-N 2 --gpus 8", {"nodes": 2, "gpus": 8}),                         # --gpus is the job's total
    ("--nodes=3-3 --gpus-per-node=8", {"nodes": 3, "gpus": 24}),
    ("-N2 --gres=gpu:a100:4", {"nodes": 2, "gpus": 8, "gpu_type": "a100"}),   # --gres counts per node
    ("-N 2 --gpus 16 --gpus-per-node 8", {"nodes": 2, "gpus": 16}),     # both given: they agree
    ("-N 2 --ntasks-per-node 4 --gpus-per-task 2", {"nodes": 2, "ntasks_per_node": 4, "gpus": 16, "cpus": 4}),
    ("-N 2 -n 16 --gpus-per-node 8", {"nodes": 2, "ntasks_per_node": 8, "gpus": 16, "cpus": 8}),
    ("-n 4", {"ntasks_per_node": 4, "cpus": 4}),                        # -n alone: all on one node
    ("-N 2 -n 8 --ntasks-per-node 4 -c 6", {"nodes": 2, "ntasks_per_node": 4, "cpus": 24}),
    ("-N 2 --gpus-per-node 4 --cpus-per-gpu 8 --mem-per-gpu 10G",
     {"nodes": 2, "gpus": 8, "cpus": 32, "mem_mb": 40960}),             # per node: 4 GPUs there
    ("--gpus 2 --cpus-per-gpu 3 --mem-per-cpu 1G", {"gpus": 2, "cpus": 6, "mem_mb": 6144}),
    ("-N 2 --mem 100G", {"nodes": 2, "mem_mb": 102400}),                # --mem is per node
    ("-w gpu[01-03] --gpus 3", {"nodes": 3, "nodelist": ["gpu01", "gpu02", "gpu03"], "gpus": 3}),
    ("-N 4 -w gpu01,gpu01 --gpus 4", {"nodes": 4, "nodelist": ["gpu01"], "gpus": 4}),
    ("--nodelist=gpu1", {"nodelist": ["gpu1"]}),
    ("-x gpu[05-06],login1", {"exclude": ["gpu05", "gpu06", "login1"]}),
    ("-C a100", {"constraint": "a100"}),
    ("--constraint='a100&ib'", {"constraint": "a100&ib"}),
    ("-C 'h100|a100'", {"constraint": "h100|a100"}),
    ("--exclusive", {"exclusive": True}),
    ("--switches=2", {"switches": 2}),
    ("--switches=1@30", {"switches": 1, "switches_wait": 1800.0}),
    ("--switches 1@1-00:00:00", {"switches": 1, "switches_wait": 86400.0}),
    ("--switches=1@90s", {"switches": 1, "switches_wait": 90.0}),
])
def test_big_job_options(line, expected):
    assert _spec(line) == expected


@pytest.mark.parametrize("line, message", [
    ("-N 2-4", "--nodes=2-4: gpud does not take a range of node counts; give one number, e.g. -N 4"),
    ("-N 2,4", "--nodes needs a number of nodes, not '2,4'"),
    ("-N 0", "--nodes must be between 1 and 4096"),
    ("--ntasks-per-node=0", "--ntasks-per-node must be between 1 and 1024"),
    ("-n 0", "--ntasks must be between 1"),
    ("-w 'gpu[1-'", "--nodelist: hostlist 'gpu[1-': '[' without ']'"),
    ("-x gpu[3-1]", "--exclude: hostlist 'gpu[3-1]': range 3-1 runs backwards"),
    ("-w '-bad'", "--nodelist: '-bad' is not a node name"),
    ("-C 'a&b|c'", "--constraint: invalid constraint 'a&b|c'"),
    ("-C a,b", "--constraint: invalid constraint 'a,b'"),
    ("--exclusive=user", "--exclusive=user is not supported: gpud's --exclusive keeps every other job off"),
    ("--exclusive=mcs", "--exclusive=mcs is not supported"),
    ("--switches=0", "--switches must be between 1 and 64"),
    ("--switches=x@5", "--switches needs a whole number"),
    ("--switches=1@soon", "--switches: invalid duration 'soon'"),
    ("--switches=1@UNLIMITED", "--switches: give the longest wait as a time"),
])
def test_bad_big_job_directives_name_the_line(line, message):
    with pytest.raises(converters.ScriptError) as e:
        directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\n")
    assert str(e.value).startswith("line 2: #SBATCH ") and message in str(e.value)


@pytest.mark.parametrize("line, message", [
    ("-N 2 --gpus 3", "--gpus=3 does not divide among 2 nodes: ask for a multiple of 2, or give --gpus-per-node"),
    ("-N 2 --gpus 8 --gpus-per-node 8", "--gpus=8 and 8 GPUs per node on 2 nodes ask for 8 and 16 GPUs"),
    ("-N 2 --gpus 8 --gpus-per-task 1", "--gpus=8 and 1 GPU per task for 2 tasks ask for 8 and 2 GPUs"),
    ("-N 2 -n 5", "--ntasks=5 does not divide evenly among 2 nodes: give a multiple of 2, or --ntasks-per-node"),
    ("-N 2 -n 8 --ntasks-per-node 2", "--ntasks=8 disagrees with --ntasks-per-node=2 on 2 nodes (4 tasks)"),
    ("-n 2048", "--ntasks=2048 is 2048 tasks on each node: at most 1024; add nodes with -N"),
    ("-N 2 -w n[1-3]", "--nodelist names 3 nodes but --nodes=2: every listed node is part of the job; give -N 3"),
    ("-N 1024 --gpus-per-node 8", "8 GPUs per node on 1024 nodes is 8192 GPUs: at most 4096 per job"),
    ("-N 2 --gpus-per-node 1g.10gb:2", "a job on several nodes takes whole GPUs"),
    ("-N 2 --cpus-per-gpu 4", "--cpus-per-gpu needs GPUs"),
])
def test_big_job_options_that_cannot_go_together(line, message):
    with pytest.raises(converters.ScriptError) as e:
        _spec(line)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_nodelist_from_a_file_as_in_slurm(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("gpu[01-02]\ngpu07  gpu08\n\n")
    assert _spec(f"-w {path} --gpus-per-node 1") == {
        "nodes": 4, "nodelist": ["gpu01", "gpu02", "gpu07", "gpu08"], "gpus": 4}
    assert _spec(f"--exclude={path}") == {"exclude": ["gpu01", "gpu02", "gpu07", "gpu08"]}
    with pytest.raises(converters.ScriptError, match=r"--nodelist: cannot read the node file '.*/nope': No such file"):
        _spec(f"-w {tmp_path}/nope")


def test_a_higher_layer_replaces_gpu_and_task_counts_of_a_lower_one():
    text = "#!/bin/sh\n#SBATCH -N 2 --gpus-per-node 8 -n 16 --switches=1@10\ntrue\n"

    def build(cli: dict) -> dict:
        spec = s.build_spec(text, cli, default_name="x", cwd="/", env={})
        return {k: v for k, v in spec.items() if k not in ("script", "name", "work_dir", "env")}

    assert build({}) == {"nodes": 2, "gpus": 16, "ntasks_per_node": 8, "cpus": 8, "switches": 1,
                         "switches_wait": 600.0}
    assert build({"gpus": 4}) == {"nodes": 2, "gpus": 4, "ntasks_per_node": 8, "cpus": 8, "switches": 1,
                                  "switches_wait": 600.0}
    assert build({"nodes": 4, "ntasks_per_node": 1, "switches": 2}) == {"nodes": 4, "gpus": 32, "switches": 2}
    assert build({"nodes": 1, "ntasks": 1, "gpus_per_node": 2}) == {"gpus": 2, "switches": 1, "switches_wait": 600.0}


def test_gpud_lines_override_sbatch_lines_for_big_jobs():
    text = "#!/bin/sh\n#SBATCH -N 2 --gpus 16 --exclusive\n#GPUD --gpus-per-node 4\ntrue\n"
    assert s.build_spec(text, {}, default_name="x", cwd="/", env={})["gpus"] == 8


def test_python_api_takes_the_big_job_fields():
    assert s.api_settings({"nodes": 2, "nodelist": "gpu[1-2]", "exclude": ["gpu9"], "constraint": "ib",
                           "exclusive": True, "switches": "1@5", "ntasks_per_node": 4}) == {
        "nodes": 2, "nodelist": ["gpu1", "gpu2"], "exclude": ["gpu9"], "constraint": "ib", "exclusive": True,
        "switches": 1, "switches_wait": 300.0, "ntasks_per_node": 4}
    with pytest.raises(converters.ScriptError, match="invalid constraint"):
        s.api_settings({"constraint": "a,b"})


def test_gang_options_on_the_command_line(tmp_path):
    from click.testing import CliRunner

    from gpuctl.main import cli
    from tests.fake_head import FakeHead

    with FakeHead() as head:
        run = lambda *args: CliRunner().invoke(cli, ["--socket", head.path, "sbatch", *args],  # noqa: E731
                                               catch_exceptions=False)
        r = run("-N", "4", "--gpus-per-node", "8", "--ntasks-per-node=8", "-w", "gpu[01-02]", "-x", "gpu09",
                "-C", "ib&h100", "--exclusive", "--switches", "1@10:00", "--wrap", "srun python train.py")
        assert (r.exit_code, r.stderr) == (0, "")
        spec = head.last("submit")["spec"]
        assert {k: spec[k] for k in ("nodes", "gpus", "ntasks_per_node", "cpus", "nodelist", "exclude", "constraint",
                                     "exclusive", "switches", "switches_wait")} == {
            "nodes": 4, "gpus": 32, "ntasks_per_node": 8, "cpus": 8, "nodelist": ["gpu01", "gpu02"],
            "exclude": ["gpu09"], "constraint": "ib&h100", "exclusive": True, "switches": 1, "switches_wait": 600.0}
        for args, message in ((["--exclusive=user"], "sbatch: error: --exclusive=user is not supported: "),
                              (["-N", "2-4"], "sbatch: error: --nodes=2-4: gpud does not take a range"),
                              (["-N", "2", "--gpus", "3"], "sbatch: error: --gpus=3 does not divide among 2 nodes")):
            r = run(*args, "--wrap", "true")
            assert r.exit_code == 2 and r.stdout == ""
            first, hint = r.stderr.rstrip("\n").split("\n")
            assert first.startswith(message) and hint == "Try 'gpuctl sbatch --help' for more information."
        assert head.ops().count("submit") == 1


def test_big_job_options_are_no_longer_unsupported():
    from gpuctl import unsupported

    for name in ("-N", "--nodes", "-w", "--nodelist", "-x", "--exclude", "-C", "--constraint", "--exclusive",
                 "--switches", "--ntasks-per-node", "-n"):
        assert unsupported.lookup(name) is None and name in options.BY_NAME


def test_exclusive_with_a_value_is_left_to_click_outside_it():
    from gpuctl import unsupported

    # No click context (the fast path): the word stays, for click to refuse with the message above.
    assert unsupported.split_command_line(["--exclusive=user", "--hint=x", "job.sh"], set()) == (
        ["--exclusive=user", "job.sh"], ["--hint is not supported by gpud and was ignored"])
