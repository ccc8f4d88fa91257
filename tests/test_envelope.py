import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.bus.envelope import MAX_PAYLOAD, EnvelopeError, Verifier, _canonical, seal

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOW = 1_700_000_000.0


def sealed(**kw):
    args = dict(key=KEY, sender="node1", kind="heartbeat", body={"running": [[1, 0]]}, now=NOW,
                topic="head/events")
    args.update(kw)
    key = args.pop("key")
    return seal(key, args.pop("sender"), args.pop("kind"), args.pop("body"), **args)


def reason(payload, verifier=None, **kw):
    kw.setdefault("now", NOW)
    with pytest.raises(EnvelopeError) as e:
        (verifier or Verifier(KEY)).open(payload, **kw)
    return e.value.reason


def resign(obj, key=KEY):
    """Re-sign a tampered object, as a key holder could."""
    import hashlib
    import hmac

    obj = {k: v for k, v in obj.items() if k != "sig"}
    obj["sig"] = hmac.new(key, _canonical(obj), hashlib.sha256).hexdigest()
    return _canonical(obj)


def test_round_trip():
    env = Verifier(KEY).open(sealed(msg_id="abc"), now=NOW + 1, topic="head/events")
    assert (env.kind, env.sender, env.msg_id, env.ts, env.topic) == ("heartbeat", "node1", "abc", NOW, "head/events")
    assert env.body == {"running": [[1, 0]]}
    msg = env.message(retained=True)
    assert msg.retained and msg.topic == "head/events" and msg.msg_id == "abc"


def test_body_is_normalised_as_json_would():
    env = Verifier(KEY).open(sealed(body={"t": (1, 2), 3: "x", "u": "é\u2028"}), now=NOW)
    assert env.body == {"t": [1, 2], "3": "x", "u": "é\u2028"}


def test_payload_is_ascii_json_with_the_documented_fields():
    obj = json.loads(sealed())
    assert set(obj) == {"v", "kind", "sender", "id", "ts", "topic", "body", "sig"}
    assert obj["v"] == 1 and len(obj["sig"]) == 64
    sealed().decode("ascii")


def test_ids_are_unique_by_default():
    assert json.loads(sealed())["id"] != json.loads(sealed())["id"]


def test_wrong_key():
    assert reason(sealed(key=OTHER_KEY)) == "bad signature"


@pytest.mark.parametrize("field, value", [
    ("body", {"running": [[2, 0]]}), ("kind", "finished"), ("sender", "node2"),
    ("ts", NOW + 1), ("id", "other"), ("topic", "node/n2/cmd"),
])
def test_tampering_breaks_the_signature(field, value):
    obj = json.loads(sealed())
    obj[field] = value
    assert reason(json.dumps(obj).encode()) == "bad signature"


def test_reformatted_payload_still_verifies():
    obj = json.loads(sealed())
    Verifier(KEY).open(json.dumps(obj, indent=2, sort_keys=False).encode(), now=NOW)


def test_topic_mismatch():
    assert reason(sealed(topic="node/a/cmd"), topic="node/b/cmd").startswith("signed for topic")


def test_unbound_topic_is_accepted_on_any_topic():
    env = Verifier(KEY).open(sealed(topic=""), now=NOW, topic="node/b/cmd")
    assert env.topic == "node/b/cmd"


def test_replay_rejected_then_forgotten_once_stale():
    v = Verifier(KEY, max_skew=60)
    p = sealed()
    v.open(p, now=NOW)
    assert reason(p, v) == "replayed"
    assert reason(p, v, now=NOW + 61).startswith("stale")
    assert len(v) <= 1


def test_stale_and_future():
    assert reason(sealed(now=NOW - 121)).startswith("stale")
    assert reason(sealed(now=NOW + 121)).startswith("from the future")
    Verifier(KEY).open(sealed(now=NOW - 119), now=NOW)
    Verifier(KEY).open(sealed(now=NOW + 119), now=NOW)


def test_allow_stale_still_checks_signature_and_replay():
    v = Verifier(KEY)
    old = sealed(now=NOW - 86400)
    v.open(old, now=NOW, allow_stale=True)
    assert reason(old, v, allow_stale=True) == "replayed"
    assert reason(sealed(now=NOW - 86400, key=OTHER_KEY), allow_stale=True) == "bad signature"


def test_live_then_retained_copy_is_a_duplicate():
    v = Verifier(KEY)
    p = sealed()
    v.open(p, now=NOW)
    assert reason(p, v, now=NOW + 60, allow_stale=True) == "replayed"


def test_stale_ids_forgotten_after_replay_window():
    v = Verifier(KEY, replay_window=10)
    p = sealed(now=NOW - 86400)
    v.open(p, now=NOW, allow_stale=True)
    v.open(p, now=NOW + 11, allow_stale=True)


def test_replay_cache_is_bounded_and_never_forgets_unsafely():
    v = Verifier(KEY, max_ids=100)
    first = [sealed(now=NOW + i * 0.001) for i in range(100)]
    for p in first:
        v.open(p, now=NOW)
    for i in range(1000):  # a flood
        v.open(sealed(now=NOW + 1 + i * 0.001), now=NOW + 1)
        assert len(v) <= 100
    assert v.floor >= NOW
    for p in first:  # forgotten, yet refused: at or below the floor
        assert reason(p, v, now=NOW + 1) in ("replayed", "too old to check for replay (replay cache overflowed)")
    v.open(sealed(now=NOW + 5), now=NOW + 5)


def test_stale_cache_is_bounded():
    v = Verifier(KEY, max_ids=50)
    for i in range(500):
        v.open(sealed(now=NOW - 9999 - i), now=NOW, allow_stale=True)
    assert len(v) <= 50


def test_too_large():
    assert reason(b" " * (MAX_PAYLOAD + 1)) == "too large"
    with pytest.raises(EnvelopeError):
        sealed(body={"x": "a" * MAX_PAYLOAD})


@pytest.mark.parametrize("payload, expected", [
    (b"", "empty payload"),
    (b"\xff\xfe", "not JSON"),
    (b"{", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"null", "not a JSON object"),
    (b"[" * 100_000, "not JSON"),
    (b'{"ts": 1' + b"0" * 5000 + b"}", "not JSON"),
])
def test_malformed(payload, expected):
    assert reason(payload) == expected


def test_missing_and_unknown_fields():
    obj = json.loads(sealed())
    for field in list(obj):
        partial = {k: v for k, v in obj.items() if k != field}
        assert reason(json.dumps(partial).encode()) == f"missing field {field!r}"
    assert reason(json.dumps({**obj, "extra": 1}).encode()) == "unknown field 'extra'"


@pytest.mark.parametrize("field, value", [
    ("v", 2), ("v", True), ("v", "1"),
    ("kind", ""), ("kind", 5), ("sender", None), ("id", ["x"]), ("id", "x" * 300),
    ("topic", 1), ("sig", 0),
    ("ts", "now"), ("ts", True), ("ts", None), ("ts", float("nan")), ("ts", float("inf")), ("ts", 10**400),
    ("body", []), ("body", "x"), ("body", None),
])
def test_ill_typed_fields(field, value):
    obj = json.loads(sealed())
    obj[field] = value
    r = reason(json.dumps(obj).encode() if field == "sig" else resign(obj))
    assert r.startswith("bad field") or r.startswith("unsupported version")


def test_integer_ts_from_a_key_holder_is_accepted():
    obj = json.loads(sealed())
    obj["ts"] = int(NOW)
    assert Verifier(KEY).open(resign(obj), now=NOW).ts == NOW


def test_seal_refuses_nonsense():
    with pytest.raises(ValueError):
        seal(b"", "a", "k", {}, now=NOW)
    with pytest.raises(ValueError):
        seal(KEY, "", "k", {}, now=NOW)
    with pytest.raises(TypeError):
        seal(KEY, "a", "k", [], now=NOW)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes(payload):
    try:
        Verifier(KEY).open(payload, now=NOW)
    except EnvelopeError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
envelope_like = st.fixed_dictionaries(
    {}, optional={f: json_values for f in ("v", "kind", "sender", "id", "ts", "topic", "body", "sig")},
)


@settings(max_examples=120, deadline=None)
@given(st.one_of(json_values, envelope_like), st.booleans())
def test_fuzz_random_json(obj, allow_stale):
    try:
        Verifier(KEY).open(json.dumps(obj).encode(), now=NOW, allow_stale=allow_stale)
    except EnvelopeError:
        pass


@settings(max_examples=100, deadline=None)
@given(envelope_like, st.booleans())
def test_fuzz_signed_json(obj, allow_stale):
    """Even well-signed nonsense from a key holder only ever raises EnvelopeError."""
    try:
        Verifier(KEY).open(resign(obj), now=NOW, allow_stale=allow_stale)
    except EnvelopeError:
        pass


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5), st.text(min_size=1, max_size=30))
def test_fuzz_round_trip(body, kind):
    env = Verifier(KEY).open(seal(KEY, "s", kind, body, now=NOW), now=NOW)
    assert env.kind == kind
    assert _canonical(env.body) == _canonical(json.loads(json.dumps(body)))
