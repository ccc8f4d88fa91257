import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.bus import envelope
from gpud.bus.envelope import (MAX_PAYLOAD, EnvelopeError, Keyring, Sealer, Verifier, reseal, seal)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOW = 1_700_000_000.0
TOPIC = "head/events"


def sealed(**kw):
    args = dict(key=KEY, sender="node1", kind="heartbeat", body={"running": [[1, 0]]}, now=NOW, topic=TOPIC,
                epoch=1)
    args.update(kw)
    key = args.pop("key")
    return seal(key, args.pop("sender"), args.pop("kind"), args.pop("body"), **args)


def reason(payload, verifier=None, **kw):
    kw.setdefault("now", NOW)
    kw.setdefault("topic", TOPIC)
    with pytest.raises(EnvelopeError) as e:
        (verifier or Verifier(KEY)).open(payload, **kw)
    return e.value.reason


def test_round_trip():
    env = Verifier(KEY).open(sealed(msg_id="abc", seq=7), now=NOW + 1, topic=TOPIC)
    assert (env.kind, env.sender, env.msg_id, env.ts, env.topic) == ("heartbeat", "node1", "abc", NOW, TOPIC)
    assert (env.epoch, env.seq, env.will) == (1, 7, False)
    assert env.body == {"running": [[1, 0]]}
    msg = env.message(retained=True)
    assert msg.retained and msg.topic == TOPIC and msg.msg_id == "abc"


def test_body_is_normalised_as_json_would():
    env = Verifier(KEY).open(sealed(body={"t": (1, 2), 3: "x", "u": "é\u2028"}), now=NOW, topic=TOPIC)
    assert env.body == {"t": [1, 2], "3": "x", "u": "é\u2028"}


def test_nothing_but_the_size_is_in_the_clear():
    secret = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI"
    payload = sealed(kind="launch", sender="head", msg_id="id-1234", body={"script": secret, "env": {"X": secret}})
    for clear in (b"AWS_SECRET", b"wJalr", b"launch", b"id-1234", b"script", b"{\"", TOPIC.encode()):
        assert clear not in payload
    assert payload[0] == envelope.VERSION
    # Equal messages do not even look alike: every one has its own nonce.
    assert sealed(msg_id="same", seq=1) != sealed(msg_id="same", seq=1)


def test_ids_are_unique_by_default():
    a = Verifier(KEY).open(sealed(), now=NOW, topic=TOPIC)
    b = Verifier(KEY).open(sealed(), now=NOW, topic=TOPIC)
    assert a.msg_id != b.msg_id and a.seq != b.seq


def test_wrong_key():
    assert reason(sealed(key=OTHER_KEY)).startswith("sealed with an unknown key")


def test_every_altered_byte_is_refused():
    payload = sealed()
    for i in range(len(payload)):
        altered = bytearray(payload)
        altered[i] ^= 0x01
        r = reason(bytes(altered))
        assert r.startswith(("bad seal", "sealed with an unknown key", "not a gpud envelope")), (i, r)
    assert reason(payload[:-1]).startswith("bad seal")


def test_bound_to_its_topic():
    assert reason(sealed(topic="node/a/cmd"), topic="node/b/cmd").startswith("bad seal")
    assert reason(sealed(topic=""), topic="node/b/cmd").startswith("bad seal")


def test_hkdf_gives_separate_keys_for_encryption_and_authentication():
    k = Keyring([KEY])
    k2 = Keyring([OTHER_KEY])
    assert k.primary.auth != KEY and len(k.primary.auth) == 32
    assert k.primary.kid != k2.primary.kid
    assert k.client_tag("c/head") != k2.client_tag("c/head") and k.client_tag("c/head") != k.client_tag("c/x")


# -- replays: epochs and sequence numbers ---------------------------------------------------------

def test_replay_refused_whatever_the_clocks_say():
    v = Verifier(KEY, max_skew=60)
    p = sealed(seq=5)
    v.open(p, now=NOW, topic=TOPIC)
    for now in (NOW, NOW + 61, NOW + 86400, NOW - 86400):
        assert reason(p, v, now=now).startswith("replayed")


def test_out_of_order_within_the_window_is_accepted_once():
    v = Verifier(KEY, window=100)
    payloads = {s: sealed(seq=s) for s in (10, 8, 9, 150, 60, 49)}
    for s in (10, 8, 9, 150, 60):
        assert v.open(payloads[s], now=NOW, topic=TOPIC).seq == s
    for s in (10, 8, 9, 150, 60):
        assert reason(payloads[s], v).startswith("replayed")
    assert "too far behind" in reason(payloads[49], v)   # 101 behind 150: cannot be told apart


def test_a_new_epoch_is_a_restart_an_older_one_a_replay():
    v = Verifier(KEY)
    run1 = [sealed(epoch=100, seq=s) for s in (1, 2)]
    v.open(run1[0], now=NOW, topic=TOPIC)
    v.open(sealed(epoch=200, seq=1), now=NOW, topic=TOPIC)        # restarted: numbering starts again
    assert reason(run1[1], v).startswith("from an earlier run of node1")
    v.open(sealed(epoch=200, seq=2), now=NOW, topic=TOPIC)


def test_first_contact_is_judged_by_the_clock_and_nothing_after():
    assert reason(sealed(now=NOW - 121, seq=1)).startswith("stale")
    assert reason(sealed(now=NOW + 121, seq=1)).startswith("from the future")
    Verifier(KEY).open(sealed(now=NOW - 119), now=NOW, topic=TOPIC)
    v = Verifier(KEY)
    v.open(sealed(now=NOW, seq=1), now=NOW, topic=TOPIC)
    v.open(sealed(now=NOW - 86400, seq=2), now=NOW, topic=TOPIC)   # known sender: its clock is its own


class StepClock:
    def __init__(self, t=NOW):
        self.t = t

    def __call__(self):
        return self.t


@pytest.mark.parametrize("step", [30.0, -30.0, 3600.0, -3600.0])
@pytest.mark.parametrize("who", ["sender", "receiver"])
def test_a_clock_step_drops_no_genuine_message_and_lets_no_replay_in(step, who):
    """One host's clock stepped by +-30 s or +-1 h while both run (injected clocks)."""
    sender_clock, receiver_clock = StepClock(), StepClock()
    sealer = Sealer(KEY, "worker:n1", epoch=1_700_000_000_000_000_000)
    v = Verifier(KEY, max_skew=120)

    def send(kind):
        return sealer.seal(kind, {"n": kind}, now=sender_clock(), topic=TOPIC)

    before = [send(f"before{i}") for i in range(3)]
    for p in before:
        v.open(p, now=receiver_clock(), topic=TOPIC)
    (sender_clock if who == "sender" else receiver_clock).t += step
    for i in range(3):
        sender_clock.t += 1
        receiver_clock.t += 1
        assert v.open(send(f"after{i}"), now=receiver_clock(), topic=TOPIC).kind == f"after{i}"
    for p in before:   # replays captured before the step
        assert reason(p, v, now=receiver_clock()).startswith("replayed")
    older_run = Sealer(KEY, "worker:n1", epoch=sealer.epoch - 1).seal("kill", {}, now=sender_clock(), topic=TOPIC)
    assert reason(older_run, v, now=receiver_clock()).startswith("from an earlier run")
    forged = Sealer(OTHER_KEY, "worker:n1", epoch=sealer.epoch).seal("kill", {}, now=sender_clock(), topic=TOPIC)
    assert reason(forged, v, now=receiver_clock()).startswith("sealed with an unknown key")


def test_replay_state_is_bounded():
    v = Verifier(KEY, max_senders=50)
    for i in range(500):
        v.open(sealed(sender=f"s{i}", seq=1), now=NOW, topic=TOPIC)
        assert len(v) <= 50
    # A forgotten sender meets the clock again: an old replay of it is stale.
    assert reason(sealed(sender="s0", now=NOW - 1000, seq=1), v).startswith("stale")


def test_reseal_keeps_id_epoch_and_number():
    p = sealed(msg_id="m1", seq=9, now=NOW - 1000)
    fresh = reseal(KEY, p, now=NOW, topic=TOPIC)
    v = Verifier(KEY)
    env = v.open(fresh, now=NOW, topic=TOPIC)
    assert (env.msg_id, env.seq, env.epoch, env.ts) == ("m1", 9, 1, NOW)
    assert reason(p, v, now=NOW).startswith("replayed")   # the original is now a repeat


# -- status messages: the newest wins ------------------------------------------------------------

STATUS = "head/status"


def status_open(v, p):
    return v.open(p, now=NOW + 99_999, topic=STATUS, allow_stale=True)


def test_status_old_or_new_the_newest_wins():
    head = Sealer(KEY, "head", epoch=10)
    v = Verifier(KEY)
    will1 = head.seal_will("head_status", {"state": "offline"}, now=NOW, topic=STATUS)
    online1 = head.seal("head_status", {"state": "online"}, now=NOW, topic=STATUS)
    assert status_open(v, online1).body["state"] == "online"      # any age: retained
    assert status_open(v, will1).will                              # fired: outranks its connection
    assert reason(online1, v, topic=STATUS, allow_stale=True) == "older than the status already seen"
    will2 = head.seal_will("head_status", {"state": "offline"}, now=NOW, topic=STATUS)
    online2 = head.seal("head_status", {"state": "online"}, now=NOW, topic=STATUS)
    assert status_open(v, online2).body["state"] == "online"       # the next connection's
    for old in (will1, online1):
        assert reason(old, v, topic=STATUS, allow_stale=True).startswith(("older", "replayed"))
    assert reason(online2, v, topic=STATUS, allow_stale=True) == "replayed"
    # The head restarts: its goodbye "offline" from the last run never wins again.
    bye = head.seal("head_status", {"state": "offline"}, now=NOW, topic=STATUS)
    status_open(v, bye)
    head2 = Sealer(KEY, "head", epoch=11)
    head2.seal_will("head_status", {"state": "offline"}, now=NOW, topic=STATUS)
    status_open(v, head2.seal("head_status", {"state": "online"}, now=NOW, topic=STATUS))
    for old in (bye, will2, online2):
        assert reason(old, v, topic=STATUS, allow_stale=True).startswith(("from an earlier run", "older"))
    assert will2 != online2


# -- key rotation --------------------------------------------------------------------------------

def test_rotation_opens_with_either_key_and_seals_with_the_first():
    old, new = KEY, OTHER_KEY
    during = Keyring([new, old])
    v = Verifier(during)
    v.open(sealed(key=old, seq=1), now=NOW, topic=TOPIC)
    v.open(sealed(key=new, seq=2), now=NOW, topic=TOPIC)
    p = seal(during, "head", "k", {}, now=NOW, topic=TOPIC, epoch=1)
    Verifier(new).open(p, now=NOW, topic=TOPIC)
    assert reason(p, Verifier(old)).startswith("sealed with an unknown key")


# -- malformed input -----------------------------------------------------------------------------

def test_too_large():
    assert reason(b" " * (MAX_PAYLOAD + 1)) == "too large"
    with pytest.raises(EnvelopeError):
        sealed(body={"x": "a" * MAX_PAYLOAD})


@pytest.mark.parametrize("payload", [b"\xff\xfe", b"{", b"[1, 2]", b"\x02" + b"\0" * 20, b'{"v": 1, "sig": "x"}'])
def test_malformed(payload):
    assert reason(payload).startswith(("not a gpud envelope", "sealed with an unknown key"))
    assert reason(b"") == "empty payload"


def holder_sealed(obj):
    """Arbitrary content sealed with the real key: a key holder's bug."""
    k = Keyring([KEY]).primary
    header = bytes((envelope.VERSION,)) + k.kid + b"\0" * 12
    plain = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return header + k.aead.encrypt(header[5:], plain, envelope._AD_PREFIX + header + TOPIC.encode())


GOOD_FIELDS = {"kind": "k", "sender": "s", "id": "i", "ts": NOW, "epoch": 1, "seq": 1, "conn": 0, "will": False,
               "body": {}}


@pytest.mark.parametrize("field, value", [
    ("kind", ""), ("kind", 5), ("sender", None), ("id", ["x"]), ("id", "x" * 300),
    ("ts", "now"), ("ts", True), ("ts", None), ("ts", float("inf")),
    ("epoch", -1), ("seq", 1.5), ("conn", True), ("will", 0), ("body", []), ("body", None),
])
def test_ill_typed_fields_from_a_key_holder(field, value):
    assert reason(holder_sealed({**GOOD_FIELDS, field: value})).startswith("bad field")


def test_key_holder_nonsense():
    assert reason(holder_sealed(b"\xff")) == "sealed content is not JSON"
    assert reason(holder_sealed(b"[" * 100_000)) == "sealed content is not JSON"
    assert reason(holder_sealed({"kind": "k"})) == "sealed content lacks the envelope's fields"
    assert Verifier(KEY).open(holder_sealed({**GOOD_FIELDS, "ts": int(NOW)}), now=NOW, topic=TOPIC).ts == NOW


def test_seal_refuses_nonsense():
    with pytest.raises(ValueError):
        seal(b"", "a", "k", {}, now=NOW)
    with pytest.raises(ValueError):
        seal(KEY, "", "k", {}, now=NOW)
    with pytest.raises(TypeError):
        seal(KEY, "a", "k", [], now=NOW)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.booleans())
def test_fuzz_random_bytes(payload, allow_stale):
    try:
        Verifier(KEY).open(payload, now=NOW, topic=TOPIC, allow_stale=allow_stale)
    except EnvelopeError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
envelope_like = st.fixed_dictionaries({}, optional={f: json_values for f in GOOD_FIELDS})


@settings(max_examples=150, deadline=None)
@given(st.one_of(json_values, envelope_like), st.booleans())
def test_fuzz_key_holder_json(obj, allow_stale):
    """Even well-sealed nonsense from a key holder only ever raises EnvelopeError."""
    try:
        Verifier(KEY).open(holder_sealed(obj), now=NOW, topic=TOPIC, allow_stale=allow_stale)
    except EnvelopeError:
        pass


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5), st.text(min_size=1, max_size=30))
def test_fuzz_round_trip(body, kind):
    env = Verifier(KEY).open(seal(KEY, "s", kind, body, now=NOW, topic=TOPIC), now=NOW, topic=TOPIC)
    assert env.kind == kind
    assert json.dumps(env.body, sort_keys=True) == json.dumps(json.loads(json.dumps(body)), sort_keys=True)


def test_an_old_status_does_not_vouch_for_its_run():
    """A replayed retained status of a dead run may be taken (statuses are old by nature), but
    that run's other messages still meet the first-contact clock check."""
    v = Verifier(KEY)
    dead = Sealer(KEY, "head", epoch=5)
    status_open(v, dead.seal("head_status", {"state": "offline"}, now=NOW - 86400, topic=STATUS))
    old_launch = dead.seal("launch", {}, now=NOW - 86400, topic=TOPIC)
    assert reason(old_launch, v).startswith("stale")
    live = Sealer(KEY, "head", epoch=6)
    v.open(live.seal("launch", {}, now=NOW, topic=TOPIC), now=NOW, topic=TOPIC)
    v.open(live.seal("launch", {}, now=NOW - 86400, topic=TOPIC), now=NOW, topic=TOPIC)   # now known


def test_retained_is_only_a_status_privilege():
    assert envelope.may_be_stale("node/n1/status", False) and envelope.may_be_stale("head/status", True)
    assert not envelope.may_be_stale("node/n1/cmd", True)


def test_a_huge_jump_in_numbers_costs_nothing():
    v = Verifier(KEY)
    v.open(sealed(seq=1), now=NOW, topic=TOPIC)
    v.open(sealed(seq=10**18), now=NOW, topic=TOPIC)      # a key holder's bug: no 10**18-bit int
    assert v._peers["node1"].seen == 1
    assert reason(sealed(seq=1), v).startswith("replayed (too far behind")
