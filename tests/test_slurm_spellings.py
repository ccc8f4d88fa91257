"""sbatch options spelled as Slurm's sbatch accepts them: aliases, abbreviations, empty values, --mem=0.

The oracle is Slurm's documentation (sbatch(1), and getopt_long(3), whose rules sbatch's
option parser follows); each test quotes the sentence it checks.  Both parsers are checked:
the directive parser (``gpuctl.directives``) and the command line, click's and the fast path's.
"""

from __future__ import annotations

import pytest

from gpuctl import converters, directives, fastpath, options
from gpuctl import script as s
from gpud.model import JobSpec
from gpud.sched.admission import resolve_job
from gpud.sched.config import sched_config_from_dict

from .sched_builders import node


def _settings(line: str) -> dict:
    return directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\ntrue\n").settings


# getopt_long(3): "Long option names may be abbreviated if the abbreviation is unique or is an
# exact match for some defined option."
@pytest.mark.parametrize("line, expected", [
    ("--part=gpu", {"partition": "gpu"}),
    ("--out out.txt", {"stdout": "out.txt"}),
    ("--tasks=4", {"ntasks_per_node": 4}),          # --tasks-per-node's abbreviation
    ("--time-=5", None),                             # an abbreviation of --time-min (unsupported)
    ("--mem=4G", {"mem_mb": 4096}),                  # exact, though --mem-per-gpu begins with it
    ("--nodes=2", {"nodes": 2}),                     # exact, though --nodelist, --nodefile are longer
    ("--no-req", {"requeue": False}),
    ("--gpus-per-t=1", {"gpus_per_task": 1}),
])
def test_unique_abbreviations_are_the_option(line, expected):
    if expected is None:
        d = directives.parse_directives(f"#!/bin/sh\n#SBATCH {line}\ntrue\n")
        assert d.settings == {} and d.warnings == ["line 2: --time-min is not supported by gpud and was ignored"]
    else:
        assert _settings(line) == expected


# Slurm's sbatch option table holds "tasks-per-node" beside "ntasks-per-node" and "cluster"
# beside "clusters" (sbatch(1) documents only the second names; scripts use both).
def test_aliases_are_the_option():
    assert _settings("--tasks-per-node=2") == {"ntasks_per_node": 2}
    d = directives.parse_directives("#!/bin/sh\n#SBATCH --cluster=east\ntrue\n")
    assert d.warnings and "--clusters is not supported" in d.warnings[0]
    assert options.long_option("--tasks-per") == "--ntasks-per-node"   # an alias's abbreviation is the option
    with pytest.raises(converters.ScriptError, match="'--cluster-constraint' '--clusters' '--cluster'"):
        options.long_option("--clus")


# getopt_long(3): an ambiguous abbreviation is an error; glibc says
# "option '--mem-per' is ambiguous; possibilities: '--mem-per-gpu' '--mem-per-cpu'".
@pytest.mark.parametrize("name, candidates", [
    ("--mem-per", ["--mem-per-gpu", "--mem-per-cpu"]),
    ("--acc", ["--account", "--acctg-freq"]),
    ("--nod", ["--nodes", "--nodelist", "--nodefile"]),
])
def test_ambiguous_abbreviations_list_the_candidates(name, candidates):
    with pytest.raises(converters.ScriptError) as e:
        _settings(f"{name}=1")
    assert str(e.value) == (f"line 2: #SBATCH option '{name}' is ambiguous; possibilities: "
                            + " ".join(f"'{c}'" for c in candidates))


def test_unknown_names_stay_errors():
    with pytest.raises(converters.ScriptError, match="unrecognized option '--bogus=1'"):
        _settings("--bogus=1")


# Empty values, as job generators (submitit) write an option they have nothing for: Slurm
# stores the empty string, which is the same as not giving the option (no excluded nodes,
# the default name, the default partition).
def test_empty_values_leave_the_default():
    text = "#!/bin/sh\n#SBATCH --exclude='' --job-name='' --partition= -w '' -C ''\ntrue\n"
    spec = s.build_spec(text, {}, default_name="run.sh", cwd="/tmp", env={})
    assert spec["name"] == "run.sh"
    assert not {"exclude", "nodelist", "partition", "constraint"} & spec.keys()
    # an empty value on the command line unsets what the script said
    text = "#!/bin/sh\n#SBATCH -x gpu01 -J named\ntrue\n"
    spec = s.build_spec(text, fastpath.typed_settings({"exclude": "", "job_name": ""}), default_name="run.sh",
                        cwd="/tmp", env={})
    assert spec["name"] == "run.sh" and "exclude" not in spec


# sbatch(1), --mem: "A memory size specification of zero is treated as a special case and
# grants the job access to all of the memory on each node. If the job is allocated multiple
# nodes in a heterogeneous cluster, the memory limit on each node will be that of the node in
# the allocation with the smallest memory size": here, the partition's smallest node.
def test_mem_zero_is_all_the_memory_of_each_node():
    assert _settings("--mem=0") == {"mem_mb": 0}
    assert JobSpec.from_request({"script": "#!/bin/sh\n", "mem_mb": 0}).mem_mb == 0
    cfg = sched_config_from_dict({"partition": [{"name": "gpu", "nodes": ["n*"]}]})
    nodes = (node("n001", gpus=8, cpus=64, mem_mb=512 * 1024), node("n002", gpus=8, cpus=64, mem_mb=256 * 1024))
    assert resolve_job({"mem_mb": 0}, "alice", cfg, nodes).mem_mb == 256 * 1024
    with pytest.raises(converters.ScriptError):
        _settings("--mem=-1")


def test_the_command_line_reads_the_same_spellings(capsys):
    from gpuctl.main import cli

    line = fastpath.parse_command_line(["sbatch", "--part=gpu", "--tasks", "2", "--mem=0", "--exclude=", "x.sh"])
    assert line.values == {"partition": "gpu", "ntasks_per_node": "2", "mem": "0", "exclude": ""}
    assert fastpath.parse_command_line(["sbatch", "--mem-per=1G", "x.sh"]) is None    # click says why
    with pytest.raises(SystemExit) as e:
        cli.main(args=["--socket", "/nonexistent", "sbatch", "--mem-per=1G", "--wrap", "true"], prog_name="gpuctl")
    assert e.value.code == 2
    assert ("option '--mem-per' is ambiguous; possibilities: '--mem-per-gpu' '--mem-per-cpu'"
            in capsys.readouterr().err)
