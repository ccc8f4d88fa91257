"""`gpud check-config` and the daemons' refusal to start on an invalid config, as processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import REPO, Cluster, env_for_children

CONFIGS = Path(__file__).resolve().parent / "configs"
EXAMPLES = REPO / "etc" / "gpud"


def gpud(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli", *args], capture_output=True, text=True,
                          env=env or env_for_children(), cwd=cwd or str(REPO), timeout=60)


def test_check_config_valid_exits_0():
    for name in ("gpud.toml", "standalone.toml"):
        r = gpud("check-config", str(EXAMPLES / name))
        assert (r.returncode, r.stdout, r.stderr) == (0, f"{EXAMPLES / name}: OK\n", "")


def test_check_config_invalid_exits_1_with_file_line_messages():
    path = "tests/configs/many_problems.toml"
    r = gpud("check-config", path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"{path}:3: log_level: must be one of 'debug', 'info', 'warning', 'error', not 'loud'",
        f"{path}:6: head.kill_grace: invalid duration 'soon': use seconds, a suffix as in \"90s\", \"10m\", "
        "\"2h\", \"7d\", or [D-]HH:MM:SS",
        f"{path}:7: head.admin: unknown setting; did you mean admins?",
        f"{path}:10: worker.cpus: must be a whole number >= 1, not -1",
        f"{path}:13: qos.high.preempt: no QOS 'low'; define [qos.low] or remove it",
        f"gpud check-config: {path}: 5 problems",
    ]


def test_check_config_missing_file_exits_1(tmp_path):
    r = gpud("check-config", str(tmp_path / "none.toml"))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == f"{tmp_path / 'none.toml'}: no such config file"


def test_check_config_defaults_to_gpud_config(tmp_path):
    env = env_for_children()
    env["GPUD_CONFIG"] = str(CONFIGS / "bad_count.toml")
    r = gpud("check-config", env=env)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == f"{CONFIGS / 'bad_count.toml'}:2: worker.cpus: must be a whole number >= 1, not 0"


@pytest.mark.parametrize("args", [["check-config", "a.toml", "b.toml"], ["check-config", "--bogus"]])
def test_check_config_usage_errors_exit_2(args):
    r = gpud(*args)
    assert r.returncode == 2 and "Usage: " in r.stderr


def test_check_config_prints_warnings_and_still_passes(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text("[broker]\nurl = \"mqtt://b\"\npassword = \"p\"\n")
    r = gpud("check-config", str(p))
    assert r.returncode == 0 and r.stdout == f"{p}: OK\n"
    assert r.stderr == f"{p}:3: warning: broker.password is sent in clear text without TLS; use an mqtts:// " \
                       "url or tls = true\n"


@pytest.mark.parametrize("command", ["head", "worker", "standalone"])
def test_daemons_refuse_an_invalid_config_with_the_same_messages(command, tmp_path):
    path = str(CONFIGS / "account_cycle.toml")
    r = gpud(command, "--config", path, "--state-dir", str(tmp_path))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"{path}:2: accounts.a.parent: accounts form a cycle through 'a'; parents must form a tree",
        f"gpud {command}: error: invalid configuration; not starting (gpud check-config lists the same problems)",
    ]
    assert gpud("check-config", path).stderr.splitlines()[0] == r.stderr.splitlines()[0]


def test_daemons_check_their_flags_too(tmp_path):
    r = gpud("head", "--broker", "tcp://x:1", "--state-dir", str(tmp_path), "--config", str(EXAMPLES / "gpud.toml"))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == "--broker: must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT], not 'tcp://x:1'"


def test_a_real_head_refuses_to_start_on_a_bad_config(tmp_path):
    # The test cluster's own gpud.toml with one bad reference appended: the head process
    # exits 1 before binding its socket, naming the line.
    cluster = Cluster(tmp_path, "mqtt://127.0.0.1:9", extra_toml='[qos.normal]\n[qos.high]\npreempt = ["low"]\n')
    line = len(cluster.config.read_text().splitlines())
    try:
        p = cluster.start_head(wait=False)
        assert p.wait(60) == 1
        log = cluster.log("head")
        assert f"{cluster.config}:{line}: qos.high.preempt: no QOS 'low'; define [qos.low] or remove it" in log
        assert "not starting" in log
        assert not Path(cluster.socket).exists()
    finally:
        cluster.close()


def test_log_lines_are_one_per_event():
    import io
    import logging

    from gpud.cli import OneLineFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("gpud.test.oneline")
    log.addHandler(handler)
    log.propagate = False
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("job 7 (user alice) on n1: handler failed")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert text.count("\n") == 1
    assert text.startswith("ERROR gpud.test.oneline: job 7 (user alice) on n1: handler failed | Traceback")
    assert "ValueError: bad | thing" in text
