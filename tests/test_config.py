"""gpud.toml loading: every broken config names FILE:LINE and the fix; valid ones load whole."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from gpud import config
from gpud.config import Config, ConfigError

REPO = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "configs"

# fixture file -> the exact lines ConfigError reports (FILE is the path given to load()).
BROKEN = {
    "syntax_error.toml": [
        "4: invalid TOML: Expected '=' after a key in a key/value pair"],
    "unknown_key_typo.toml": [
        "5: head.node_timout: unknown setting; did you mean node_timeout?"],
    "unknown_section.toml": [
        "4: hed: unknown section; did you mean [head]?"],
    "key_in_wrong_section.toml": [
        "4: head.heartbeat_interval: unknown setting here; it belongs in [worker]"],
    "unknown_sched_key.toml": [
        "4: qos.high.preemt: unknown setting; did you mean preempt?"],
    "wrong_type_bool.toml": [
        "3: broker.tls: must be true or false, not 'yes'"],
    "wrong_type_list.toml": [
        "3: head.admins: must be a list of names such as [\"alice\", \"bob\"], not 'alice'"],
    "wrong_type_section.toml": [
        "2: head: must be a table: write [head] and its settings under it"],
    "bad_duration.toml": [
        "2: head.node_timeout: invalid duration '30 seconds': use seconds, a suffix as in \"90s\", "
        "\"10m\", \"2h\", \"7d\", or [D-]HH:MM:SS"],
    "unlimited_duration.toml": [
        "2: head.kill_grace: must be a finite duration such as \"30s\" or \"5m\", not unlimited"],
    "zero_duration.toml": [
        "2: head.schedule_interval: must be longer than zero, not 0"],
    "bad_size.toml": [
        "3: worker.mem_mb: invalid size 'lots': use a number with an optional K, M, G or T suffix"],
    "bad_partition_size.toml": [
        "3: partition.gpu.default_mem_per_gpu: invalid size '64 gigs': use a number with an optional "
        "K, M, G or T suffix"],
    "bad_count.toml": [
        "2: worker.cpus: must be a whole number >= 1, not 0"],
    "bad_log_level.toml": [
        "2: log_level: must be one of 'debug', 'info', 'warning', 'error', not 'verbose'"],
    "bad_broker_url.toml": [
        "2: broker.url: must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT], not 'tcp://mqtt.example.org:1883'"],
    "bad_cluster_name.toml": [
        "2: cluster: must be a name of letters, digits, '.', '_' and '-', not 'prod/east'"],
    "bad_sim_spec.toml": [
        "2: worker.sim: invalid GPU spec '8xH100': invalid GPU model 'H100': use NAME-<N>GB, e.g. H100-80GB"],
    "missing_parent_account.toml": [
        "2: accounts.vision.parent: no account 'reserch'; define [accounts.reserch]"],
    "account_cycle.toml": [
        "2: accounts.a.parent: accounts form a cycle through 'a'; parents must form a tree"],
    "quota_above_limit.toml": [
        "2: accounts.research.gpu_quota: 32 exceeds gpu_limit 16; lower the quota or raise the limit"],
    "child_quotas_exceed_parent.toml": [
        "2: accounts.research.gpu_quota: the quotas of accounts below it add up to 20, more than its "
        "own 16; a child's quota counts inside its parent's"],
    "missing_default_qos.toml": [
        "2: scheduler.default_qos: no QOS 'gold'; define [qos.gold] or pick one of normal"],
    "missing_preempt_qos.toml": [
        "5: qos.high.preempt: no QOS 'low'; define [qos.low] or remove it"],
    "missing_default_account.toml": [
        "2: scheduler.default_account: no account 'everyone'; define [accounts.everyone]"],
    "two_default_partitions.toml": [
        "7: partition.debug.default: only one partition may be the default (also 'gpu')"],
    "duplicate_partition.toml": [
        "5: partition[1].name: partition 'gpu' is defined twice; names must be unique"],
    "partition_without_name.toml": [
        "4: partition[1].name: missing; every [[partition]] needs a name"],
    "default_time_above_max.toml": [
        "7: partition.debug.default_time: must not exceed max_time; lower default_time or raise max_time"],
    "node_timeout_vs_heartbeat.toml": [
        "2: head.node_timeout: 8s is less than two heartbeats (worker.heartbeat_interval = 5s), so "
        "healthy nodes would go DOWN; make it at least three heartbeats"],
    "tls_contradiction.toml": [
        "3: broker.tls: false contradicts the mqtts:// url; remove it or use mqtt://"],
    "many_problems.toml": [
        "3: log_level: must be one of 'debug', 'info', 'warning', 'error', not 'loud'",
        "6: head.kill_grace: invalid duration 'soon': use seconds, a suffix as in \"90s\", \"10m\", "
        "\"2h\", \"7d\", or [D-]HH:MM:SS",
        "7: head.admin: unknown setting; did you mean admins?",
        "10: worker.cpus: must be a whole number >= 1, not -1",
        "13: qos.high.preempt: no QOS 'low'; define [qos.low] or remove it"],
}


def problems(text: str, path: str = "gpud.toml") -> list[str]:
    with pytest.raises(ConfigError) as e:
        config.from_text(text, path)
    return e.value.lines


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_config_reports_file_and_line(name):
    path = str(CONFIGS / name)
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert e.value.lines == [f"{path}:{line}" for line in BROKEN[name]]
    assert str(e.value) == "\n".join(e.value.lines)


def test_every_fixture_is_in_the_table():
    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == sorted(BROKEN)
    assert len(BROKEN) >= 15


# -- the pieces, one at a time -----------------------------------------------------------------

def test_did_you_mean_covers_every_section():
    assert problems("[broker]\nusername = 'a'\npasword = 'b'\n") == \
        ["gpud.toml:3: broker.pasword: unknown setting; did you mean password?"]
    assert problems("[worker]\nheartbeat = '5s'\n") == \
        ["gpud.toml:2: worker.heartbeat: unknown setting; did you mean heartbeat_interval?"]
    assert problems("[scheduler]\nbackfil = true\n") == \
        ["gpud.toml:2: scheduler.backfil: unknown setting; did you mean backfill?"]
    assert problems("[preemption]\nmax_per_minut = 3\n") == \
        ["gpud.toml:2: preemption.max_per_minut: unknown setting; did you mean max_per_minute?"]
    assert problems("[[partition]]\nname = 'gpu'\nmaxtime = '1h'\n") == \
        ["gpud.toml:3: partition.gpu.maxtime: unknown setting; did you mean max_time?"]
    assert problems("[accounts.a]\nusers = ['*']\nshare = 2\n") == \
        ["gpud.toml:3: accounts.a.share: unknown setting; did you mean shares?"]
    assert problems("[scheduler.weights]\nfair_share = 1\n") == \
        ["gpud.toml:2: scheduler.weights.fair_share: unknown setting; did you mean fairshare?"]
    assert problems("[sheduler]\nbackfill = true\n") == \
        ["gpud.toml:1: sheduler: unknown section; did you mean [scheduler]?"]


def test_unknown_key_without_a_near_spelling_lists_the_valid_ones():
    (line,) = problems("[preemption]\nzzz = 1\n")
    assert line == "gpud.toml:2: preemption.zzz: unknown setting; [preemption] takes exempt_time, " \
                   "max_per_job, max_per_minute"


def test_unknown_keys_do_not_hide_the_errors_after_them():
    lines = problems("[qos.high]\npriorty = 3\npreempt = ['nope']\n")
    assert lines == ["gpud.toml:2: qos.high.priorty: unknown setting; did you mean priority?",
                     "gpud.toml:3: qos.high.preempt: no QOS 'nope'; define [qos.nope] or remove it"]


def test_keys_in_inline_tables_and_dotted_keys_get_their_line():
    text = "[scheduler]\nbackfill = true\nweights = { age = 1, fairshare = 'x' }\n"
    assert problems(text) == ["gpud.toml:3: scheduler.weights.fairshare: must be a number >= 0, not 'x'"]
    text = "[head]\nadmins = [\n  'a',  # ops\n  '''b\n[not.a.table]''',\n]\nkill_grace = 'x'\n"
    assert problems(text)[0].startswith("gpud.toml:7: head.kill_grace: ")
    assert problems("head.kill_grace = 'soon'\n")[0].startswith("gpud.toml:1: head.kill_grace: invalid duration")


@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("2.5", 2.5), ("'90s'", 90.0), ("'10m'", 600.0), ("'1h30m'", 5400.0),
    ("'1-00:00:00'", 86400.0), ("'01:02:03'", 3723.0), ("'7d'", 7 * 86400.0), ("'0'", 0.0),
])
def test_durations(text, seconds):
    assert config.from_text(f"[head]\nkill_grace = {text}\n").head.kill_grace == seconds


@pytest.mark.parametrize("text", ["'soon'", "-5", "true", "[30]", "'1 hour'", "'unlimited'"])
def test_bad_durations(text):
    (line,) = problems(f"[head]\nkill_grace = {text}\n")
    assert line.startswith("gpud.toml:2: head.kill_grace: ")


@pytest.mark.parametrize("text, mb", [("4096", 4096), ("'512M'", 512), ("'64G'", 65536), ("'1T'", 1 << 20),
                                      ("'1.5G'", 1536), ("'64GiB'", 65536)])
def test_sizes(text, mb):
    assert config.from_text(f"[worker]\nmem_mb = {text}\n").worker.mem_mb == mb


@pytest.mark.parametrize("text", ["'big'", "0", "-1", "false", "'64 GB of RAM'"])
def test_bad_sizes(text):
    (line,) = problems(f"[worker]\nmem_mb = {text}\n")
    assert line.startswith("gpud.toml:2: worker.mem_mb: ")


def test_a_missing_key_points_at_its_table():
    lines = problems("[[partition]]\nname = 'a'\n\n[[partition]]\n# no name\nnodes = ['x']\n")
    assert lines == ["gpud.toml:4: partition[1].name: missing; every [[partition]] needs a name"]


def test_quoted_names_with_dots_resolve_to_their_line():
    text = "[qos.normal]\n[qos.\"gold.plus\"]\npriority = 1\npreempt = ['nope']\n"
    assert problems(text) == ["gpud.toml:4: qos.gold.plus.preempt: no QOS 'nope'; define [qos.nope] or remove it"]


def test_from_dict_has_no_lines_but_the_same_messages():
    with pytest.raises(ConfigError) as e:
        config.from_dict({"head": {"kill_grace": "soon"}}, "x.toml")
    assert e.value.lines[0].startswith("x.toml: head.kill_grace: invalid duration 'soon'")


def test_warnings_do_not_fail_the_load():
    cfg = config.from_text("[broker]\nurl = 'mqtt://b'\nusername = 'u'\npassword = 'p'\n", "g.toml")
    assert cfg.warnings == ("g.toml:4: warning: broker.password is sent in clear text without TLS; "
                            "use an mqtts:// url or tls = true",)
    assert not config.from_text("[broker]\nurl = 'mqtts://b'\npassword = 'p'\n").warnings


def test_not_utf8_and_unreadable(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes(b"cluster = \"caf\xe9\"\n")
    with pytest.raises(ConfigError, match=r"latin1.toml: not UTF-8 text"):
        config.load(str(p))
    with pytest.raises(ConfigError, match=r"nope.toml: no such config file"):
        config.load(str(tmp_path / "nope.toml"))


def test_no_file_at_all_means_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("GPUD_CONFIG", raising=False)
    cfg = config.load(None)
    assert cfg.cluster == "gpud" and cfg.path is None and cfg.state_dir == config.default_state_dir()
    monkeypatch.setenv("GPUD_CONFIG", str(tmp_path / "named.toml"))
    with pytest.raises(ConfigError, match="named.toml: no such config file"):
        config.load(None)   # a file someone named must exist


# -- valid configs --------------------------------------------------------------------------------

def test_the_examples_load():
    for name in ("gpud.toml", "standalone.toml"):
        cfg = config.load(str(REPO / "etc" / "gpud" / name))
        assert cfg.warnings == ()
    cfg = config.load(str(REPO / "etc" / "gpud" / "gpud.toml"))
    assert cfg.cluster == "gpu-prod" and cfg.broker.tls and cfg.head.admins == ("ops",)
    assert cfg.head.node_timeout == 30.0 and cfg.worker.heartbeat_interval == 5.0
    assert list(cfg.sched.partitions) == ["gpu", "debug"] and cfg.sched.default_partition == "gpu"
    assert cfg.sched.accounts["vision"].parent == "research"
    assert cfg.sched.billing["H100-80GB"] == 2.0
    assert cfg.sched.preemption.exempt_time == 600.0


def test_to_dict_round_trips():
    cfg = config.load(str(REPO / "etc" / "gpud" / "gpud.toml"))
    cfg = replace(cfg, broker=replace(cfg.broker, password="secret"), worker=replace(cfg.worker, mem_mb=1024))
    again = config.from_dict(config.to_dict(cfg, redact=False), cfg.path or "")
    assert again == cfg
    assert config.to_dict(cfg)["broker"]["password"] == config.REDACTED
    assert config.from_dict(config.to_dict(Config()), "x") == replace(Config(), path="x")


def test_state_dir_defaults_per_user(monkeypatch):
    assert config.from_text("").state_dir == config.default_state_dir()
    assert config.from_text("state_dir = '/srv/gpud'\n").state_dir == "/srv/gpud"


# -- reload rules -------------------------------------------------------------------------------

def test_apply_live_takes_policy_and_timeouts_and_reports_the_rest():
    old = config.from_text("cluster = 'a'\n[head]\nsocket = '/run/a.sock'\nkill_grace = 10\n"
                           "[broker]\npassword = 'x'\nurl = 'mqtts://b'\n")
    new = config.from_text("cluster = 'b'\nlog_level = 'debug'\n[head]\nsocket = '/run/b.sock'\nkill_grace = 20\n"
                           "admins = ['ops']\n[broker]\npassword = 'y'\nurl = 'mqtts://b'\n"
                           "[qos.normal]\n[qos.gold]\npriority = 9\n")
    merged, notes = config.apply_live(old, new)
    assert merged.cluster == "a" and merged.head.socket == "/run/a.sock" and merged.broker.password == "x"
    assert merged.head.kill_grace == 20 and merged.head.admins == ("ops",) and merged.log_level == "debug"
    assert merged.sched.qos["gold"].priority == 9
    assert notes == [
        "cluster changed from 'a' to 'b': needs a restart; the running value is kept",
        "broker.password changed from ******** to ********: needs a restart; the running value is kept",
        "head.socket changed from '/run/a.sock' to '/run/b.sock': needs a restart; the running value is kept",
    ]
    same, none = config.apply_live(old, old)
    assert same == old and none == []


def test_every_setting_says_whether_it_is_live():
    live = {f"{sec}.{f.name}" if sec else f.name
            for sec, cls in config.SECTIONS.items() for f in config._settings(cls) if f.metadata["live"]}
    assert {"log_level", "head.admins", "head.node_timeout", "head.schedule_interval",
            "head.schedule_debounce", "head.kill_grace"} <= live
    # What the head opened or bound at start cannot change under it.
    assert not live & {"cluster", "state_dir", "key_file", "head.socket", "head.database", "broker.url",
                       "broker.username", "broker.password", "broker.tls", "broker.ca_file"}


def test_resolve_key():
    data = {"partition": [{"name": "gpu"}, {"name": "debug", "max_time": 1}], "qos": {"a.b": {"preempt": []}}}
    assert config.resolve_key(data, "partition.debug.max_time") == ("partition", 1, "max_time")
    assert config.resolve_key(data, "partition[0].name") == ("partition", 0, "name")
    assert config.resolve_key(data, "qos.a.b.preempt") == ("qos", "a.b", "preempt")
    assert config.resolve_key(data, "accounts.x.parent") == ("accounts",)
    assert config.resolve_key(data, "partition.nope.default") == ("partition",)


def test_environment_names_the_file(tmp_path, monkeypatch):
    p = tmp_path / "g.toml"
    p.write_text("cluster = 'envy'\n")
    monkeypatch.setenv("GPUD_CONFIG", str(p))
    assert config.load(None).cluster == "envy"
    assert config.default_path() == str(p)
    assert os.environ["GPUD_CONFIG"] == str(p)


def test_every_scheduler_field_has_a_key_in_to_dict():
    """A new SchedConfig field must follow the naming rule or be listed in config._SCHED_TABLES."""
    from dataclasses import fields

    from gpud.sched.config import AccountConfig, PartitionConfig, PreemptionConfig, QosConfig, SchedConfig

    keys = config.known_keys()
    unmapped = [f.name for f in fields(SchedConfig)
                if f.name not in config._SCHED_TABLES and f.name not in config._SCHED_DERIVED
                and f.name not in ("partitions", "qos", "accounts") and not config.toml_key(f.name, keys["scheduler"])]
    for cls, sec in ((PartitionConfig, "partition[]"), (QosConfig, "qos.*"), (AccountConfig, "accounts.*")):
        unmapped += [f"{sec}.{f.name}" for f in fields(cls)
                     if f.name != "name" and not config.toml_key(f.name, keys[sec])]
    unmapped += [f"preemption.{f.name}" for f in fields(PreemptionConfig) if f.name not in keys["preemption"]]
    assert unmapped == []


# -- nothing but ConfigError, whatever the file holds ----------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KNOWN = config.known_keys()
_NAMES = sorted({k for keys in _KNOWN.values() for k in keys} | {"gpu", "normal", "x", "*", "name"})
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 10 ** 6), st.floats(allow_nan=True),
                     st.sampled_from(["", "1h", "unlimited", "64G", "gpu", "normal", "*", "x/y", "-3", "binpack"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_NAMES), inner, max_size=4)), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(_NAMES), _VALUES, max_size=6))
def test_any_structure_gives_a_config_or_config_error(data):
    try:
        config.from_dict(data, "fuzz.toml")
    except ConfigError as e:
        assert e.lines and all(line.startswith("fuzz.toml") and "\n" not in line for line in e.lines)


# -- node features --------------------------------------------------------------------------------

def test_worker_features_are_reported_in_the_features_label(tmp_path):
    from gpud.gpu.sim import SimBackend
    from gpud.model import NodeInfo, constraint_matches
    from gpud.worker.nodeinfo import build_node_info

    cfg = config.from_text(f'state_dir = "{tmp_path}"\n[worker]\nname = "gpu01"\naddress = "10.0.0.1"\n'
                           'features = ["a100", "ib", "a100"]\n')
    assert cfg.worker.features == ("a100", "ib")
    info = build_node_info(cfg, SimBackend("2xA100-80GB", "gpu01"))
    assert info.labels["features"] == "a100,ib"
    assert NodeInfo.from_dict(info.to_dict()) == info
    assert constraint_matches("ib&a100", info.labels["features"])
    bare = build_node_info(config.from_text(f'state_dir = "{tmp_path}"\n[worker]\nname = "gpu02"\n'),
                           SimBackend("1xA100-80GB", "gpu02"))
    assert "features" not in bare.labels


@pytest.mark.parametrize("text, message", [
    ('features = "a100"', "worker.features: must be a list of feature names such as [\"a100\", \"ib\"], not 'a100'"),
    ('features = ["a100,ib"]', "worker.features: 'a100,ib' is not a feature name: up to 64 letters, digits"),
    ('features = ["a&b"]', "worker.features: 'a&b' is not a feature name"),
    ('features = [""]', "worker.features: '' is not a feature name"),
    ('features = [1]', "worker.features: 1 is not a feature name"),
    ('featurs = ["ib"]', "worker.featurs: unknown setting; did you mean features?"),
])
def test_bad_features_are_one_line_each(text, message):
    assert problems(f"[worker]\n{text}\n")[0].startswith(f"gpud.toml:2: {message}")


def test_every_scheduling_problem_is_reported_in_one_run():
    """gpud check-config lists every problem at once: six in partitions and QOS, and the three
    account errors behind them, each with its line."""
    text = ("[[partition]]\nname = 'a'\nmax_time = '1h'\ndefault_time = '2h'\ndefault_mem = 'lots'\n"
            "[qos.high]\npreempt = ['low']\n"
            "[qos.low]\npreempt_mode = 'suspend'\n"
            "[scheduler]\ndefault_qos = 'gold'\n"
            "[accounts.x]\nparent = 'nope'\n"
            "[accounts.y]\nshares = 'many'\n"
            "[accounts.z]\ngpu_quota = 9\ngpu_limit = 8\n")
    lines = problems(text)
    keys = [line.split(": ")[1] for line in lines]
    assert sorted(keys) == sorted(["partition.a.default_time", "partition.a.default_mem", "qos.low.preempt_mode",
                                   "scheduler.default_qos", "accounts.x.parent", "accounts.y.shares",
                                   "accounts.z.gpu_quota"]), lines
    assert all(line.startswith("gpud.toml:") and line.split(":")[1].isdigit() for line in lines), lines
