"""gpud.hostlist: Slurm's hostlist notation, both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud.hostlist import MAX_NAMES, compress, expand


@pytest.mark.parametrize("text, names", [
    ("gpu01", ["gpu01"]),
    ("w[1-3,07],gpu-a", ["w1", "w2", "w3", "w07", "gpu-a"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("rack[1-2]-n[1-3]", ["rack1-n1", "rack1-n2", "rack1-n3", "rack2-n1", "rack2-n2", "rack2-n3"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("a b\tc\n", ["a", "b", "c"]),
    ("a,,b, ", ["a", "b"]),
    ("n[ 1 - 2 ]".replace(" - ", "-"), ["n1", "n2"]),
    ("n[2,1,2]", ["n2", "n1", "n2"]),
    ("", []),
])
def test_expand(text, names):
    assert expand(text) == names


@pytest.mark.parametrize("text, message", [
    ("n[1-", "'[' without ']'"),
    ("n1]", "']' without '['"),
    ("n[[1]]", "brackets cannot nest"),
    ("n[3-1]", "range 3-1 runs backwards"),
    ("n[a-b]", "'a-b' is not a number or a LO-HI range"),
    ("n[]", "empty range in brackets"),
    ("n[1-100000000]", f"names more than {MAX_NAMES} nodes"),
    ("a[1-300]b[1-300]", f"names more than {MAX_NAMES} nodes"),
])
def test_bad_hostlists_say_what_is_wrong_in_one_line(text, message):
    with pytest.raises(ValueError) as e:
        expand(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_bound_covers_the_whole_list_and_can_be_lowered():
    with pytest.raises(ValueError, match="more than 4 nodes"):
        expand("a[1-3],b[1-2]", limit=4)
    assert len(expand("a[1-3],b", limit=4)) == 4


@pytest.mark.parametrize("names, text", [
    (["gpu01", "gpu02", "gpu03", "gpu07"], "gpu[01-03,07]"),
    (["gpu3", "gpu1", "gpu2", "gpu2"], "gpu[1-3]"),
    (["n9", "n10", "n8"], "n[8-10]"),
    (["n08", "n09", "n10", "n100"], "n[08-10],n100"),
    (["w07", "w1", "w2"], "w[1-2],w07"),
    (["login", "gpu5"], "gpu5,login"),
    (["rack1-n1", "rack1-n2", "rack2-n1"], "rack1-n[1-2],rack2-n1"),
    ([], ""),
])
def test_compress(names, text):
    assert compress(names) == text


def test_compress_refuses_names_a_hostlist_cannot_carry():
    for bad in ("a[1]", "a,b", "a b", ""):
        with pytest.raises(ValueError, match="cannot be written in a hostlist"):
            compress([bad])


_names = st.builds(
    lambda prefix, digits, suffix: prefix + digits + suffix,
    st.sampled_from(["gpu", "n", "rack1-n", "a.b_", ""]),
    st.one_of(st.just(""), st.integers(0, 120).map(str), st.integers(0, 120).map(lambda n: f"{n:03d}")),
    st.sampled_from(["", "", "", "-ib"]),
).filter(bool)


@given(st.lists(_names, max_size=40))
def test_compress_then_expand_names_each_name_once(names):
    text = compress(names)
    back = expand(text)
    assert sorted(back) == sorted(set(names))
    assert compress(back) == text


@given(st.lists(st.integers(0, 99), min_size=2, max_size=30, unique=True))
def test_zero_padded_names_of_one_width_make_one_bracket_group(numbers):
    text = compress(f"n{n:03d}" for n in numbers)
    assert text.startswith("n[") and text.count("[") == 1
    assert expand(text) == [f"n{n:03d}" for n in sorted(numbers)]
