"""The click-free ``gpuctl sbatch`` (gpuctl.fastpath) against the click command, line by line.

Every command line of ``LINES`` (and ``sbatch SCRIPT`` for every script of
tests/sbatch_corpus) runs through both paths against the same fake head, one after the
other; the request the head received, stdout, stderr and the exit status must be the same.
Lines the fast path must leave to click (``CLICK_ONLY``) must reach the head and the
terminal not at all before they do.  A few real processes check that the console script
imports no click on this path.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuctl import converters, fastpath, options
from gpuctl.main import cli
from tests.fake_head import FakeHead

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "sbatch_corpus"
NOW = 1_800_000_000.0
TTY = object()   # stdin is a terminal

# (sbatch's arguments, stdin, how the fake head answers): each runs through both paths.
LINES: list[tuple[list[str], object, str]] = [
    (["--wrap", "true"], None, ""),
    (["--parsable", "--wrap", "true"], None, ""),
    (["-G", "2", "--wrap=nvidia-smi -L"], None, ""),
    (["-G2", "-c4", "--mem=8G", "-t", "1:00:00", "-J", "train", "--wrap", "python x.py"], None, ""),
    (["--gpus=a100:2", "-p", "long", "-q", "high", "-A", "phys", "--nice=-5", "--wrap", "true"], None, ""),
    (["-o", "out-%j.txt", "-e", "/var/log/err", "-D", "sub", "--comment", "first try", "--wrap", "true"], None, ""),
    (["--requeue", "--no-requeue", "--wrap", "true"], None, ""),
    (["--no-requeue", "--requeue", "-H", "--wrap", "true"], None, ""),
    (["--mem", "1G", "--mem-per-gpu", "2G", "-G", "1", "--wrap", "true"], None, ""),
    (["--mem-per-gpu", "2G", "--mem", "1G", "-G", "1", "--wrap", "true"], None, ""),
    (["-G", "1", "-G", "3", "--wrap", "true"], None, ""),
    (["--mem-per-cpu", "2G", "--wrap", "true"], None, ""),
    (["-a", "0-9%2", "-d", "afterok:5:6_1", "--kill-on-invalid-dep=yes", "--wrap", "true"], None, ""),
    (["--begin", "now+1hour", "--deadline=now+1day", "--wrap", "true"], None, ""),
    (["--export=NONE", "--wrap", "true"], None, ""),
    (["--export", "HOME,NEW=x", "--open-mode=append", "--wrap", "true"], None, ""),
    (["--signal=B:USR1@60", "--mail-type=END,FAIL", "--mail-user", "a@b", "--wrap", "true"], None, ""),
    (["-J", "模型-🚀", "--wrap", "echo 'ü'"], None, ""),
    (["--comment", "--parsable", "--wrap", "true"], None, ""),
    (["--comment=", "--wrap", "true"], None, ""),
    (["--part=gpu", "--tasks-per-node", "2", "--out=o-%j", "--cluster=x", "--wrap", "true"], None, ""),
    (["--exclude=", "-J", "", "--mem=0", "--wrap", "true"], None, ""),
    (["-Q", "--acctg-freq=30", "-v", "--wrap", "true"], None, ""),
    (["--acctg-freq", "30", "--profile=all", "--wrap", "true"], None, ""),
    (["--strict", "--acctg-freq=30", "--wrap", "true"], None, ""),
    (["-M", "other", "--wrap", "true"], None, ""),
    (["--gpus", "abc", "--wrap", "true"], None, ""),
    (["-G=2", "--wrap", "true"], None, ""),
    (["--mem", "4X", "--time", "soon", "--wrap", "x"], None, ""),
    (["-t", "soon", "--mem", "4X", "--wrap", "x"], None, ""),
    (["--nice", "99999", "--wrap", "x"], None, ""),
    (["--wrap", "x", "script.sh"], None, ""),
    (["--wrap", ""], None, ""),
    (["/no/such/script.sh"], None, ""),
    (["-"], None, ""),
    (["job.sh"], None, ""),
    (["job.sh", "a", "b c", "--gpus", "3", "--"], None, ""),
    (["--", "job.sh", "x"], None, ""),
    (["-G", "1", "--", "job.sh"], None, ""),
    (["--parsable", "python.py"], None, ""),
    (["python.py", "arg"], None, ""),
    (["latin1.sh"], None, ""),
    (["binary.sh"], None, ""),
    (["empty.sh"], None, ""),
    ([], b"#!/bin/bash\n#SBATCH -J piped --gpus 1\nhostname\n", ""),
    (["--parsable", "-J", "cli-wins"], b"#!/bin/bash\n#SBATCH -J piped\n#GPUD -c 2\nhostname\n", ""),
    ([], b"", ""),
    ([], b"echo no shebang\n", ""),
    ([], b"\xff\xfe\n", ""),
    ([], b"#!/bin/bash\n#SBATCH --bogus\ntrue\n", ""),
    ([], TTY, ""),
    (["--test-only", "-G", "2", "--wrap", "true"], None, "estimate"),
    (["--test-only", "--wrap", "true"], None, "no-estimate"),
    (["--skip-if-active", "-J", "nightly", "--wrap", "true"], None, "skipped"),
    (["--parsable", "--skip-if-active", "-J", "nightly", "--wrap", "true"], None, "skipped"),
    (["--wrap", "true"], None, "warnings"),
    (["-Q", "--wrap", "true"], None, "warnings"),
    (["--wrap", "true"], None, "ansi"),
    (["--wrap", "true"], None, "refuse"),
    (["--wrap", "true"], None, "hang-up"),
    (["--wrap", "true"], None, "garbage"),
    (["--parsable", "-W", "--wrap", "true"], None, "done-3"),
    (["--wait", "--wrap", "true"], None, "done-0"),
    (["--wait", "--wrap", "true"], None, "vanished"),
]
# Global options before the verb: the fast path takes --socket and --config.
GLOBAL_LINES: list[list[str]] = [
    ["--socket={sock}", "sbatch", "--wrap", "true"],
    ["--config", "/nonexistent/gpud.toml", "--socket", "{sock}", "sbatch", "--wrap", "true"],
    ["--socket", "/nonexistent/gpud.sock", "--socket", "{sock}", "sbatch", "--parsable", "--wrap", "true"],
    ["--socket", "{sock}/absent", "sbatch", "--wrap", "true"],
]
# Command lines the fast path must leave to click, untouched.
CLICK_ONLY: list[list[str]] = [
    ["sbatch", "--help"],
    ["sbatch", "--bogus", "--wrap", "x"],
    ["sbatch", "--gpu", "2", "--wrap", "x"],
    ["sbatch", "--mem-per=1G", "--wrap", "x"],
    ["sbatch", "-QH", "--wrap", "x"],
    ["sbatch", "--parsable=yes", "--wrap", "x"],
    ["sbatch", "--no-requeue=1", "--wrap", "x"],
    ["sbatch", "--wrap"],
    ["sbatch", "-G"],
    ["sbatch", "-h"],
    ["-M", "a", "sbatch", "--wrap", "x"],
    ["--clusters=a", "sbatch", "--wrap", "x"],
    ["--socket"],
    ["--help"],
    ["squeue"],
    ["sbatc", "--wrap", "x"],
    [],
]


@pytest.fixture(autouse=True)
def fixed_clock_and_files(monkeypatch, tmp_path):
    monkeypatch.setattr(converters, "clock", lambda: NOW)
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("_GPUCTL_COMPLETE", raising=False)
    time.tzset()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --gpus=1 -c 4 --mem=8G\n#GPUD -t 30\necho \"$@\"\n")
    (tmp_path / "python.py").write_text("#!/usr/bin/env python3\n#SBATCH -J py\nprint(1)\n")
    (tmp_path / "latin1.sh").write_bytes(b"#!/bin/bash\necho caf\xe9\n")
    (tmp_path / "binary.sh").write_bytes(b"#!/bin/bash\n\x00\x01")
    (tmp_path / "empty.sh").write_text("")
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def head():
    with FakeHead() as h:
        yield h


def answer(head: FakeHead, how: str) -> None:
    """Script the fake head's side of one case."""
    if how == "estimate":
        head.reply("submit", {"test_only": True, "start_time": NOW + 3600, "node": "gpu01", "partition": "gpu",
                              "cpus": 4, "gpus": 2, "reason": None, "warnings": []})
    elif how == "no-estimate":
        head.reply("submit", {"test_only": True, "start_time": None, "node": None, "partition": "gpu",
                              "cpus": 1, "gpus": 0, "reason": "Resources", "warnings": []})
    elif how == "skipped":
        head.reply("submit", {"job_id": 41, "skipped": True, "warnings": []})
    elif how == "warnings":
        head.reply("submit", {"job_id": 7, "warnings": ["--mail-type: this cluster sends no mail", "second"]})
    elif how == "ansi":
        head.reply("submit", {"job_id": 8, "warnings": ["\x1b[31mred\x1b[0m and plain"]})
    elif how == "refuse":
        head.refuse("submit", "Batch job submission failed: Requested   GPU configuration\nis not available")
    elif how == "hang-up":
        head.raw("submit", b"")
    elif how == "garbage":
        head.raw("submit", b"not json\n")
    elif how.startswith("done-"):
        code = int(how[5:])
        head.handle("jobs", lambda args, uid: {"jobs": [dict(head.jobs[1], state="COMPLETED" if not code else "FAILED",
                                                             exit_code=code)]})
    elif how == "vanished":
        head.reply("jobs", {"jobs": []})


def reset(head: FakeHead) -> None:
    with head._cond:
        head.requests.clear()
        head.jobs.clear()
        head.next_job_id = 1


def feed_stdin(monkeypatch, stdin: object) -> None:
    if stdin is TTY:
        class Terminal(io.BytesIO):
            def isatty(self) -> bool:
                return True
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(Terminal()))
    else:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b"")))


def through_click(argv: list[str]) -> int:
    try:
        cli.main(args=argv, prog_name="gpuctl")
    except SystemExit as e:
        return e.code
    raise AssertionError("the click group returned instead of exiting")


def both_ways(head, capsys, monkeypatch, argv: list[str], stdin: object = None) -> tuple:
    """(fast, click): each (exit status, stdout, stderr, requests) for one command line."""
    out = []
    for run in (fastpath.run_sbatch, through_click):
        reset(head)
        feed_stdin(monkeypatch, stdin)
        code = run(list(argv))
        std = capsys.readouterr()
        out.append((code, std.out, std.err, [(op, args) for op, args, _ in head.requests]))
    return out[0], out[1]


@pytest.mark.parametrize("args, stdin, how", LINES, ids=[" ".join(a) or repr(s)[:20] for a, s, _ in LINES])
def test_fast_path_does_what_click_does(head, capsys, monkeypatch, args, stdin, how):
    monkeypatch.setattr("gpuctl.client.SUBMIT_RETRY", 0.3)   # "hang-up": sent again this long
    answer(head, how)
    fast, slow = both_ways(head, capsys, monkeypatch, ["--socket", head.path, "sbatch", *args], stdin)
    assert fast[0] is not None, "the fast path left this line to click"
    assert fast == slow


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.sh")))
def test_every_corpus_script_submits_alike(head, capsys, monkeypatch, name):
    answer(head, "done-0")   # for the scripts that say #SBATCH --wait
    fast, slow = both_ways(head, capsys, monkeypatch, ["--socket", head.path, "sbatch", str(CORPUS / name)])
    assert fast[0] is not None
    assert fast == slow


@pytest.mark.parametrize("argv", GLOBAL_LINES, ids=lambda a: " ".join(a))
def test_global_options_before_the_verb(head, capsys, monkeypatch, argv):
    argv = [a.replace("{sock}", head.path) for a in argv]
    fast, slow = both_ways(head, capsys, monkeypatch, argv)
    assert fast[0] is not None
    assert fast == slow


@pytest.mark.parametrize("argv", CLICK_ONLY, ids=lambda a: " ".join(a) or "nothing")
def test_what_the_fast_path_leaves_to_click_it_leaves_untouched(head, capsys, monkeypatch, argv):
    feed_stdin(monkeypatch, b"#!/bin/bash\ntrue\n")
    assert fastpath.run_sbatch(["--socket", head.path, *argv] if argv[:1] != ["--socket"] else argv) is None
    assert capsys.readouterr() == ("", "")
    assert head.requests == []
    assert sys.stdin.read() == "#!/bin/bash\ntrue\n"


def test_shell_completion_and_ascii_streams_go_to_click(head, monkeypatch):
    argv = ["--socket", head.path, "sbatch", "--wrap", "true"]
    monkeypatch.setenv("_GPUCTL_COMPLETE", "bash_complete")
    assert fastpath.run_sbatch(argv) is None
    monkeypatch.delenv("_GPUCTL_COMPLETE")
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert fastpath.run_sbatch(argv) is None
    assert head.requests == []


def test_the_parser_reads_options_as_click_does():
    line = fastpath.parse_command_line(["--socket=/s", "--config", "/c", "sbatch", "-G2", "--mem=1G", "-J", "-x",
                                        "--no-requeue", "--wrap=true", "--acctg-freq", "30", "--", "a.sh", "-G", "3"])
    assert (line.socket, line.config) == ("/s", "/c")
    assert line.values == {"gpus": "2", "mem": "1G", "job_name": "-x", "requeue": False, "wrap": "true"}
    assert (line.script_path, line.script_args) == ("a.sh", ["-G", "3"])
    assert line.warnings == ["--acctg-freq is not supported by gpud and was ignored"]


def test_options_added_to_the_table_need_no_change_here(monkeypatch):
    """The fast path reads gpuctl.options.OPTIONS as it is: a new option parses like the others."""
    from gpuctl import unsupported

    short = next(f"-{c}" for c in "YZjkly" if f"-{c}" not in unsupported.SHORT
                 and all(o.short != f"-{c}" for o in options.OPTIONS))
    extra = (options.Option("--frobnicate", short, "N", lambda t: {"comment": f"frob {t}"}, "A test option."),
             options.Option("--twiddle", None, None, lambda t: {"hold": True}, "A test flag.",
                            negation="--no-twiddle", negated={"hold": False}))
    monkeypatch.setattr(options, "OPTIONS", options.OPTIONS + extra)
    line = fastpath.parse_command_line(["sbatch", f"{short}7", "--no-twiddle", "--wrap", "true"])
    assert line.values == {"frobnicate": "7", "twiddle": False, "wrap": "true"}
    assert fastpath.typed_settings(line.values) == {"comment": "frob 7", "hold": False, "wrap": "true"}


# -- real processes ------------------------------------------------------------------------------

def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python without site-packages: click cannot even be found there."""
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=60)


def test_console_script_submits_without_click(head):
    r = _python(f"""
import sys
from gpuctl.fastpath import main
try:
    main(["--socket", {head.path!r}, "sbatch", "--parsable", "-G", "1", "--wrap", "true"])
except SystemExit as e:
    print(e.code, " ".join(sorted(sys.modules)))
""")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "1"
    code, *modules = lines[1].split()
    assert code == "0"
    for heavy in ("click", "gpuctl.main", "gpuctl.commands", "gpuctl.format", "asyncio", "sqlite3",
                  "pathlib", "importlib.resources", "tomllib", "gpud.model", "gpud.config",
                  "json", "re", "enum", "shlex", "gpud.units",
                  "gpuctl.directives", "gpuctl.shellwords"):   # --wrap has no directives to parse
        assert heavy not in modules, heavy
    assert head.last("submit")["spec"]["gpus"] == 1


def test_installed_script_is_the_console_script_and_imports_neither_re_nor_json(head, tmp_path):
    """gpuctl/bin/gpuctl (what pip installs as ``gpuctl``) runs fastpath.main, and neither it
    nor an sbatch or squeue through it loads re or json (pip's own wrapper imports re)."""
    script = str(ROOT / "gpuctl" / "bin" / "gpuctl")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    head.reply("jobs", {"jobs": [], "folded": True})      # a head that folds
    directives = tmp_path / "job.sh"
    directives.write_text('#!/bin/bash\n#SBATCH -J "a b" --gpus=1 -t 10 # why\n#SBATCH --mem=4G\ntrue\n')
    for argv, out in ((["sbatch", "--parsable", "--wrap", "true"], "1\n"),
                      (["sbatch", "--parsable", "-t", "1:00:00", "--mem", "4G", "--wrap", "true"], "2\n"),
                      (["sbatch", "--parsable", str(directives)], "3\n"),
                      (["squeue", "-h", "-u", "nobody"], "")):
        r = subprocess.run([sys.executable, "-S", "-X", "importtime", script, "--socket", head.path, *argv],
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert (r.returncode, r.stdout) == (0, out), r.stderr
        loaded = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
        assert "gpuctl.fastpath" in loaded and not loaded & {"re", "json", "enum"}, sorted(loaded)
    r = subprocess.run([sys.executable, script, "--socket", head.path, "sbatch", "--bogus"],   # click's
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("sbatch: error: No such option '--bogus'"), r.stderr


def test_python_dash_m_gpuctl_is_the_console_script(head):
    r = subprocess.run([sys.executable, "-m", "gpuctl", "--socket", head.path, "sbatch", "--wrap", "true"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "Submitted batch job 1\n", "")
    r = subprocess.run([sys.executable, "-m", "gpuctl", "--socket", head.path, "sbatch", "--bogus"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("sbatch: error: No such option '--bogus'")
