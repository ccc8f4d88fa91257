"""gpud.units parses by hand (no ``re`` on gpuctl's start-up path); the grammar it accepts is
written here as regular expressions and the two are compared."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from gpud.units import UnitError, parse_duration, parse_size_mb

SUFFIXED = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?")

texts = st.lists(st.sampled_from(list("0123456789.:-smhdwkgtib MKGTIB\t٣²x")), max_size=8).map("".join)


@pytest.mark.parametrize("text,seconds", [
    ("90s", 90), ("1h30m", 5400), ("1.5d", 129600), ("10", 600), ("1:30", 90),
    ("2:00:00", 7200), ("1-12", 129600), ("1-0:0:1", 86401), ("2.5", 150), ("unlimited", None),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1h30", "1.h", "1..5m", "x", "1:2:3:4", "a-1", "²", "1-²"])
def test_bad_durations_say_what_is_accepted(text):
    with pytest.raises(UnitError):
        parse_duration(text)


@pytest.mark.parametrize("text,mb", [("4096", 4096), ("16G", 16384), ("512 MiB", 512), ("1t", 1048576),
                                     ("2048k", 2), ("1.5k", 1), ("2gb", 2048), ("3ib", 3)])
def test_sizes(text, mb):
    assert parse_size_mb(text) == mb


@settings(max_examples=3000)
@given(texts)
def test_suffixed_durations_follow_the_grammar(text):
    s = text.strip().lower()
    if s and s not in ("inf",) and SUFFIXED.fullmatch(s):
        want = sum(float(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[u]
                   for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhdw])", s))
        assert parse_duration(text) == want
    elif s and ":" not in s and "-" not in s and not NUMBER.fullmatch(s):
        with pytest.raises(UnitError):
            parse_duration(text)


@settings(max_examples=3000)
@given(texts)
def test_sizes_follow_the_grammar(text):
    m = SIZE.fullmatch(text.strip().lower())
    if m:
        assert parse_size_mb(text) == int(-(-float(m.group(1)) * {"k": 1 / 1024, "": 1, "m": 1, "g": 1024,
                                                                     "t": 1048576}[m.group(2)] // 1))
    else:
        with pytest.raises(UnitError):
            parse_size_mb(text)
