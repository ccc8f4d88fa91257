"""gpuctl.shellwords is shlex's POSIX split and quote without its import of re."""

import shlex

import pytest
from hypothesis import given, settings, strategies as st

from gpuctl import shellwords

text = st.lists(st.sampled_from(list(" \t\n'\"\\#ab=-:é") + ["--gpus=2", "-J x", "# c\n"]),
                max_size=14).map("".join)


def _outcome(f, *args):
    try:
        return f(*args)
    except ValueError as e:
        return ("ValueError", str(e))


@settings(max_examples=2000)
@given(text, st.booleans())
def test_split_is_shlex_split(s, comments):
    assert _outcome(shellwords.split, s, comments) == _outcome(shlex.split, s, comments)


@settings(max_examples=1000)
@given(st.text(max_size=10))
def test_quote_is_shlex_quote_and_splits_back(word):
    assert shellwords.quote(word) == shlex.quote(word)
    assert shellwords.split(shellwords.quote(word)) == [word]


@pytest.mark.parametrize("line,words", [
    ('--gpus=2 -J "my job" # the rest', ["--gpus=2", "-J", "my job"]),
    ("-o 'out %j.log'", ["-o", "out %j.log"]),
    (r'--comment "a \"q\" \z"', ["--comment", 'a "q" \\z']),
    ("a#b", ["a"]),
    ("''", [""]),
])
def test_directive_lines(line, words):
    assert shellwords.split(line, comments=True) == words
