"""gpud.tomlpos: the line of every table, key and array element of a TOML document."""

from __future__ import annotations

import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.tomlpos import key_lines, line_for

DOC = '''# comment = not a key
cluster = "x"  # trailing [comment]
"quoted key" = 1
a.b.c = true

[head]
admins = [
  "a",   # one
  'b',
]
text = """
[not.a.table]
key = "not a key"
"""
literal = \'\'\'also [not] a = table\'\'\'

[scheduler]
weights = { age = 1, fairshare = { deep = 2 } }

[[partition]]
name = "gpu"

[[partition]]
name = "debug"
"max.time" = "1h"

[[partition.extra]]
x = 1

[qos."gold.plus"]
priority = 1
'''


def test_positions_of_everything():
    tomllib.loads(DOC)  # the scanner only ever sees valid TOML
    lines = key_lines(DOC)
    assert lines[("cluster",)] == 2
    assert lines[("quoted key",)] == 3
    assert lines[("a",)] == lines[("a", "b")] == lines[("a", "b", "c")] == 4
    assert lines[("head",)] == 6
    assert lines[("head", "admins")] == 7 and lines[("head", "admins", 0)] == 8 and lines[("head", "admins", 1)] == 9
    assert lines[("head", "text")] == 11
    assert lines[("head", "literal")] == 15
    assert ("not",) not in lines and ("head", "key") not in lines
    assert lines[("scheduler", "weights", "fairshare", "deep")] == 18
    assert lines[("partition", 0)] == 20 and lines[("partition", 0, "name")] == 21
    assert lines[("partition", 1, "max.time")] == 25
    assert lines[("partition", 1, "extra", 0, "x")] == 28
    assert lines[("qos", "gold.plus", "priority")] == 31


def test_line_for_falls_back_to_the_nearest_ancestor():
    lines = key_lines(DOC)
    assert line_for(lines, ("head", "missing")) == 6
    assert line_for(lines, ("partition", 1, "nodes")) == 23
    assert line_for(lines, ("nowhere", "at", "all")) is None


def test_windows_line_endings_and_escapes():
    doc = 'a = "x\\"y"\r\n[t]\r\nb = "\\u00e9"\r\n'
    tomllib.loads(doc)
    assert key_lines(doc) == {("a",): 1, ("t",): 2, ("t", "b"): 3}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='ab=[]{}"\'#.,\n \\x1', max_size=80))
def test_never_raises_on_any_text(text):
    key_lines(text)
