"""Scheduler policy parsing and submit-time admission."""

from __future__ import annotations

import tomllib

import pytest

from gpud.sched.admission import refusal, resolve_job
from gpud.sched.config import SchedConfig, SchedConfigError, sched_config_from_dict

from .sched_builders import node

EXAMPLE = """
[scheduler]
fairshare_half_life = "7d"
max_age = "7d"
weights = { age = 1000, fairshare = 10000, job_size = 500, qos = 2000, partition = 1000 }
placement = "binpack"
backfill = true
[preemption]
exempt_time = "10m"
max_per_job = 3
max_per_minute = 30
[billing]
weights = { "H100-80GB" = 2.0, "A100-80GB" = 1.0 }
[[partition]]
name = "gpu"
nodes = ["n*"]
default = true
default_time = "1h"
max_time = "7d"
placement = "spread"
default_mem_per_gpu = "32G"
[[partition]]
name = "debug"
nodes = ["d*"]
max_time = "30m"
default_time = "10m"
priority = 10
[qos.normal]
priority = 0
[qos.high]
priority = 1000
preempt = ["low"]
[qos.low]
preempt_mode = "requeue"
grace_time = "60s"
max_gpus_per_user = 16
[accounts.research]
shares = 2
gpu_quota = 8
gpu_limit = 16
users = ["alice", "bob"]
[accounts.vision]
parent = "research"
shares = 1
users = ["carol", "alice"]
[accounts.everyone]
users = ["*"]
"""


def parse(text: str) -> SchedConfig:
    return sched_config_from_dict(tomllib.loads(text), "gpud.toml")


def test_defaults_run_a_cluster():
    for cfg in (SchedConfig(), sched_config_from_dict({}, "x")):
        assert list(cfg.partitions) == ["gpu"] and cfg.partitions["gpu"].default
        assert cfg.partitions["gpu"].nodes == ("*",)
        assert list(cfg.qos) == ["normal"] and cfg.default_qos == "normal"
        assert cfg.accounts["default"].users == ("*",)
        assert cfg.default_account_for("anyone") == "default"
        assert cfg.backfill and cfg.placement == "binpack"


def test_full_example():
    cfg = parse(EXAMPLE)
    assert cfg.fairshare_half_life == 7 * 86400
    assert cfg.preemption.exempt_time == 600 and cfg.preemption.max_per_minute == 30
    assert cfg.billing_weight("H100-80GB") == 2.0 and cfg.billing_weight("T4") == 1.0
    assert cfg.default_partition == "gpu"
    assert cfg.placement_for("gpu") == "spread" and cfg.placement_for("debug") == "binpack"
    assert cfg.qos["high"].preempt == ("low",)
    assert cfg.qos["low"].max_gpus_per_user == 16 and cfg.qos["low"].grace_time == 60
    assert cfg.account_chain("vision") == ("vision", "research")
    assert cfg.default_account_for("alice") == "research"      # the first account listing her
    assert cfg.default_account_for("carol") == "vision"
    assert cfg.default_account_for("zed") == "everyone"
    assert cfg.default_account == "everyone"


@pytest.mark.parametrize("text, key, fix", [
    ('[scheduler]\nplacement = "tight"', "scheduler.placement", "binpack"),
    ('[scheduler]\nfairshare_halflife = "7d"', "scheduler.fairshare_halflife", "valid settings"),
    ('[scheduler]\nmax_age = "soon"', "scheduler.max_age", "invalid duration"),
    ('[scheduler]\nweights = { age = -1 }', "scheduler.weights.age", ">= 0"),
    ('[scheduler]\nbackfill = "yes"', "scheduler.backfill", "true or false"),
    ('[preemption]\nmax_per_job = 1.5', "preemption.max_per_job", "whole number"),
    ('[[partition]]\nnodes = ["n*"]', "partition[0].name", "needs a name"),
    ('[[partition]]\nname = "a"\n[[partition]]\nname = "a"', "partition[1].name", "twice"),
    ('[[partition]]\nname = "a"\ndefault = true\n[[partition]]\nname = "b"\ndefault = true',
     "partition.b.default", "only one"),
    ('[[partition]]\nname = "a"\nmax_time = "1h"\ndefault_time = "2h"', "partition.a.default_time", "max_time"),
    ('[[partition]]\nname = "a"\ndefault_mem = "lots"', "partition.a.default_mem", "invalid size"),
    ('[qos.high]\npreempt = ["low"]', "qos.high.preempt", "define [qos.low]"),
    ('[qos.high]\npreempt = ["high"]', "qos.high.preempt", "itself"),
    ('[qos.low]\npreempt_mode = "suspend"', "qos.low.preempt_mode", "'requeue'"),
    ('[accounts.a]\nparent = "b"', "accounts.a.parent", "define [accounts.b]"),
    ('[accounts.a]\nparent = "b"\n[accounts.b]\nparent = "a"', "accounts.a.parent", "cycle"),
    ('[accounts.a]\ngpu_quota = 9\ngpu_limit = 8', "accounts.a.gpu_quota", "gpu_limit"),
    ('[accounts.a]\ngpu_quota = 4\n[accounts.b]\nparent = "a"\ngpu_quota = 3\n[accounts.c]\nparent = "a"\n'
     'gpu_quota = 2', "accounts.a.gpu_quota", "counts inside"),
    ('[accounts.a]\nshares = "many"', "accounts.a.shares", "number"),
    ('[scheduler]\ndefault_qos = "gold"', "scheduler.default_qos", "qos.gold"),
])
def test_bad_values_name_the_key_and_the_fix(text, key, fix):
    with pytest.raises(SchedConfigError) as e:
        parse(text)
    assert e.value.key == key
    assert str(e.value).startswith(key + ":")
    assert fix in str(e.value)
    assert "\n" not in str(e.value)


def test_first_partition_is_default_when_none_says_so():
    cfg = parse('[[partition]]\nname = "a"\n[[partition]]\nname = "b"')
    assert cfg.default_partition == "a"


# -- admission ---------------------------------------------------------------------------------

NODES = [node("n001", gpus=8, cpus=64, mem_mb=512 * 1024),
         node("n002", gpus=4, model="A100-80GB", cpus=128, mem_mb=1024 * 1024),
         node("d001", gpus=1, cpus=8, mem_mb=64 * 1024)]


def test_resolve_fills_defaults():
    cfg = parse(EXAMPLE)
    r = resolve_job({"gpus": 2}, "alice", cfg, NODES)
    assert (r.account, r.partition, r.qos, r.time_limit) == ("research", "gpu", "normal", 3600)
    assert r.mem_mb == 2 * 32 * 1024                       # default_mem_per_gpu x GPUs
    r = resolve_job({"partition": "debug", "account": "vision", "mem_mb": 100}, "alice", cfg, NODES)
    assert (r.account, r.partition, r.time_limit, r.mem_mb) == ("vision", "debug", 600, 100)
    assert resolve_job({}, "x", SchedConfig()).mem_mb == 1024


def test_resolve_accepts_attribute_objects():
    class Spec:
        gpus, cpus, partition, account, qos, time_limit, mem_mb, gpu_type = 1, 1, None, None, "high", 60.0, None, None
    r = resolve_job(Spec(), "bob", parse(EXAMPLE), NODES)
    assert (r.qos, r.time_limit, r.account) == ("high", 60.0, "research")


@pytest.mark.parametrize("req, user, needle", [
    ({"partition": "cpu"}, "alice", "invalid partition 'cpu'"),
    ({"qos": "gold"}, "alice", "invalid QOS 'gold'"),
    ({"account": "physics"}, "alice", "invalid account 'physics'"),
    ({"account": "research"}, "carol", "not in account 'research': use --account vision or everyone"),
    ({"time_limit": 8 * 86400.0}, "alice", "exceeds partition gpu's max_time of 7-00:00:00"),
    ({"partition": "debug", "time_limit": 3600.0}, "alice", "max_time of 00:30:00"),
    ({"gpus": 9}, "alice", "9 GPUs on one node, but the largest node in partition gpu has 8"),
    ({"gpus": 1, "gpu_type": "T4"}, "alice", "type 'T4'"),
    ({"gpus": 5, "gpu_type": "A100-80GB"}, "alice", "has 4"),
    ({"cpus": 200}, "alice", "200 CPUs"),
    ({"mem_mb": 2048 * 1024}, "alice", "2048G of memory"),
    ({"gpus": 8, "cpus": 100}, "alice", "together"),
])
def test_refusals(req, user, needle):
    cfg = parse(EXAMPLE)
    msg = refusal(req, resolve_job(req, user, cfg, NODES), user, cfg, NODES)
    assert msg is not None and needle in msg and "\n" not in msg
    kept = tuple(NODES)         # a tuple's partition bounds are kept: the same answers, twice
    assert refusal(req, resolve_job(req, user, cfg, kept), user, cfg, kept) == msg
    assert refusal(req, resolve_job(req, user, cfg, kept), user, cfg, kept) == msg


def test_a_new_tuple_of_nodes_is_read_afresh():
    cfg = parse(EXAMPLE)
    req = {"gpus": 6}
    small = (node("n101", gpus=4, cpus=64, mem_mb=512 * 1024),)
    big = (node("n102", gpus=8, cpus=64, mem_mb=512 * 1024),)
    for nodes, refused in ((small, True), (big, False), (small, True), (tuple(small), True)):
        msg = refusal(req, resolve_job(req, "alice", cfg, nodes), "alice", cfg, nodes)
        assert (msg is not None) is refused, nodes


def test_user_in_no_account_is_told_so():
    cfg = parse('[accounts.research]\nusers = ["alice"]')
    msg = refusal({}, resolve_job({}, "mallory", cfg), "mallory", cfg)
    assert msg is not None and "belongs to no account" in msg


def test_feasible_requests_pass_and_no_nodes_means_wait():
    cfg = parse(EXAMPLE)
    for req in ({"gpus": 8}, {"gpus": 4, "gpu_type": "A100-80GB", "cpus": 100}, {"partition": "debug"}):
        assert refusal(req, resolve_job(req, "alice", cfg, NODES), "alice", cfg, NODES) is None
    big = {"gpus": 64}
    assert refusal(big, resolve_job(big, "alice", cfg), "alice", cfg, []) is None
