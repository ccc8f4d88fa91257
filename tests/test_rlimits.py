"""The resource limits a job or step inherits (gpud.worker.rlimits): clamped to the node's
own hard limits, so user data can lower a limit and never raise one; set in a real child."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from gpud.worker import jobwrap, rlimits

INF = resource.RLIM_INFINITY
NOFILE = resource.RLIMIT_NOFILE


@pytest.fixture
def node(monkeypatch):
    """This process's limits, as the plan reads them: {resource: (soft, hard)}."""
    limits = {NOFILE: (1024, 4096), resource.RLIMIT_CORE: (0, INF)}
    monkeypatch.setattr(rlimits.resource, "getrlimit", lambda res: limits[res])
    return limits


def test_a_lower_limit_is_taken_as_given(node):
    assert rlimits.plan({"NOFILE": (321, 2048)}) == ([("NOFILE", NOFILE, 321, 2048)], [])


def test_nothing_goes_above_the_nodes_hard_limit(node):
    assert rlimits.plan({"NOFILE": (-1, -1)}) == ([("NOFILE", NOFILE, 4096, 4096)], [])
    assert rlimits.plan({"NOFILE": (10**9, 10**9)}) == ([("NOFILE", NOFILE, 4096, 4096)], [])
    assert rlimits.plan({"NOFILE": (2000, 10**9)}) == ([("NOFILE", NOFILE, 2000, 4096)], [])


def test_a_soft_limit_above_the_hard_one_comes_down_to_it(node):
    assert rlimits.plan({"NOFILE": (3000, 500)}) == ([("NOFILE", NOFILE, 500, 500)], [])
    assert rlimits.plan({"NOFILE": (-1, 500)}) == ([("NOFILE", NOFILE, 500, 500)], [])


def test_unlimited_stays_unlimited_where_the_node_allows_it(node):
    core = resource.RLIMIT_CORE
    assert rlimits.plan({"CORE": (-1, -1)}) == ([("CORE", core, INF, INF)], [])
    assert rlimits.plan({"CORE": (0, 10**12)}) == ([("CORE", core, 0, 10**12)], [])


def test_limits_already_in_force_need_no_call(node):
    assert rlimits.plan({"NOFILE": (1024, 4096), "CORE": (0, -1)}) == ([], [])
    assert rlimits.plan({}) == ([], [])


def test_a_name_this_platform_lacks_is_left_out_and_named(node, monkeypatch):
    monkeypatch.delattr(rlimits.resource, "RLIMIT_NOFILE")
    assert rlimits.plan({"NOFILE": (1, 1), "CORE": (0, 0)}) == ([("CORE", resource.RLIMIT_CORE, 0, 0)], ["NOFILE"])


def test_apply_sets_the_limits_and_warns_of_a_refusal_in_a_real_child():
    """In a child process of its own (as the job wrapper sets its limits): what the kernel
    takes is set, what it refuses (a soft limit above the hard one) is kept as it was, with
    one line."""
    soft, hard = resource.getrlimit(NOFILE)
    low = min(hard, 1000)
    code = ("import resource, sys; from gpud.worker import rlimits; warned = []; "
            f"rlimits.apply([('NOFILE', {NOFILE}, 300, {low}), ('CORE', {resource.RLIMIT_CORE}, 10, 5)], "
            "warned.append); "
            f"print(resource.getrlimit({NOFILE}), resource.getrlimit({resource.RLIMIT_CORE}) == "
            f"{resource.getrlimit(resource.RLIMIT_CORE)}); print(*warned, sep='\\n')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    limits, warning = r.stdout.splitlines()
    assert limits == f"(300, {low}) True"
    assert warning.startswith("cannot set CORE limit to 10/5: ") and warning.endswith("; keeping the node's")


def test_apply_to_sets_a_waiting_process_s_limits_for_what_it_execs():
    """As for an srun task: the shell waits at its gate, the worker sets its limits, and the
    command it becomes runs under them; a refused one is kept, with one line."""
    soft, hard = resource.getrlimit(NOFILE)
    low = min(hard, 1000)
    p = subprocess.Popen(["/bin/sh", "-c", "read -r _; exec cat /proc/self/limits"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    warned: list[str] = []
    rlimits.apply_to(p.pid, [("NOFILE", NOFILE, 300, low), ("CORE", resource.RLIMIT_CORE, 10, 5)], warned.append)
    out, _ = p.communicate("go\n", timeout=30)
    line = next(ln for ln in out.splitlines() if ln.startswith("Max open files"))
    assert line.split()[3:5] == ["300", str(low)]
    assert len(warned) == 1 and warned[0].startswith("cannot set CORE limit to 10/5: ")


def test_apply_to_a_process_gone_already_is_quiet():
    with open("/proc/sys/kernel/pid_max") as f:
        gone = int(f.read()) + 1      # no process has it (a reaped pid could be reused)
    warned: list[str] = []
    rlimits.apply_to(gone, [("NOFILE", NOFILE, 300, 300)], warned.append)
    assert warned == []


def test_the_job_wrapper_uses_the_same_module():
    """jobwrap.py (run with -I -S, no gpud imports) loads rlimits.py by its path."""
    assert jobwrap.rlimits.plan.__code__.co_filename == rlimits.plan.__code__.co_filename
