"""gpud.jsoncodec against the json module: the same text, values and errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpud import jsoncodec

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats() | st.text() | st.text(st.characters(codec="utf-8", min_codepoint=0x80)))
keys = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=30)
documents = st.dictionaries(st.text(), values, max_size=6)


def outcome(f, arg):
    """What a call gives: ("ok", canonical text of the value) or ("error", type, message)."""
    try:
        value = f(arg)
    except Exception as e:
        return "error", type(e).__name__, str(e)
    return "ok", repr(value) if isinstance(value, str) else json.dumps(value)   # NaN-safe equality


@given(values)
def test_dumps_is_json_dumps_compact_and_unescaped(value):
    assert jsoncodec.dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@given(documents, st.sampled_from([{}, {"ensure_ascii": False}, {"indent": 1}, {"separators": (",", ":")}]),
       st.sampled_from(["", "\n", " \r\n\t", "\n\n"]))
def test_loads_reads_what_json_writes(doc, options, trailer):
    text = json.dumps(doc, **options) + trailer
    for data in (text, text.encode(), bytearray(text.encode())):
        assert outcome(jsoncodec.loads, data) == outcome(json.loads, data)


@settings(max_examples=300)
@given(documents, st.integers(min_value=0), st.binary(max_size=3))
def test_loads_fails_as_json_does_on_damaged_lines(doc, at, junk):
    line = json.dumps(doc, ensure_ascii=False).encode()
    at %= len(line) + 1
    for data in (line[:at], line[:at] + junk + line[at:], line[at:], junk + line):
        assert outcome(jsoncodec.loads, data) == outcome(json.loads, data)


@given(st.binary(max_size=12) | st.text(max_size=12))
def test_loads_on_anything(data):
    assert outcome(jsoncodec.loads, data) == outcome(json.loads, data)


@given(documents, st.sampled_from(["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                                   "utf-32-be"]))
def test_loads_detects_encodings_as_json_does(doc, encoding):
    data = json.dumps(doc).encode(encoding)
    assert outcome(jsoncodec.loads, data) == outcome(json.loads, data)


def test_loads_refuses_what_json_refuses():
    for data in ("\ufeff{}", " {}", "{} x", '{"a": 1', "[1,]", '{"a":"\\ud800"}', b'{"a":"\xed\xa0\x80"}',
                 b"\xff", 12, None, memoryview(b"{}"), "NaN", '{"a": -Infinity}'):
        assert outcome(jsoncodec.loads, data) == outcome(json.loads, data), data
    # The one difference: nesting past the recursion limit is a ValueError, not json's RecursionError.
    assert outcome(json.loads, "[" * 100_000)[:2] == ("error", "RecursionError")
    assert outcome(jsoncodec.loads, "[" * 100_000) == ("error", "ValueError", "JSON nested too deeply")


def test_dumps_refuses_what_json_refuses():
    loop: list = []
    loop.append(loop)
    for value in ({"a": object()}, {"a": {1, 2}}, {(1, 2): 3}, {"a": b"x"}, loop, [[[[]]]] * 3,
                  {"x": [1, {"y": object()}]}):
        assert outcome(jsoncodec.dumps, value) == outcome(
            lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False), value)
    shared = [1]
    assert jsoncodec.dumps({"a": shared, "b": shared}) == '{"a":[1],"b":[1]}'   # no stale markers


def test_importing_and_using_it_loads_no_json():
    code = ("import sys; from gpud import jsoncodec as c\n"
            "assert c.loads(c.dumps({'a': [1, 2.5, None, 'é']}).encode()) == {'a': [1, 2.5, None, 'é']}\n"
            "print('json' in sys.modules, 're' in sys.modules)")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.stdout.split() == ["False", "False"], r.stderr
