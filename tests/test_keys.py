import os
import stat

import pytest

from gpud.keys import KeyFileError, generate_key, load_key


def test_generate_then_load(tmp_path):
    path = tmp_path / "cluster.key"
    generate_key(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert len(text) == 65 and text.endswith("\n")
    key = load_key(str(path))
    assert key == bytes.fromhex(text.strip()) and len(key) == 32
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.key"]  # no temp file left


def test_keys_differ(tmp_path):
    generate_key(str(tmp_path / "a"))
    generate_key(str(tmp_path / "b"))
    assert load_key(str(tmp_path / "a")) != load_key(str(tmp_path / "b"))


def test_generate_refuses_to_overwrite(tmp_path):
    path = tmp_path / "cluster.key"
    generate_key(str(path))
    before = path.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key(str(path))
    assert path.read_bytes() == before


def test_generate_into_missing_directory(tmp_path):
    with pytest.raises(KeyFileError, match="does not exist"):
        generate_key(str(tmp_path / "nope" / "cluster.key"))


def test_generate_ignores_a_wide_umask(tmp_path):
    old = os.umask(0)
    try:
        generate_key(str(tmp_path / "k"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


def write(path, content: bytes, mode=0o600):
    path.write_bytes(content)
    os.chmod(path, mode)
    return str(path)


def test_missing(tmp_path):
    with pytest.raises(KeyFileError, match="not found; create one with: gpud keygen"):
        load_key(str(tmp_path / "nope"))


def test_empty(tmp_path):
    with pytest.raises(KeyFileError, match="is empty"):
        load_key(write(tmp_path / "k", b"\n"))


def test_too_short(tmp_path):
    with pytest.raises(KeyFileError, match=r"too short \(16 bytes, need 32\)"):
        load_key(write(tmp_path / "k", b"ab" * 16 + b"\n"))


def test_readable_by_others_message(tmp_path):
    path = write(tmp_path / "k", b"ab" * 32, mode=0o644)
    with pytest.raises(KeyFileError) as e:
        load_key(path)
    assert str(e.value) == f"cluster key {path} is readable by others (mode 0644); run: chmod 600 {path}"


@pytest.mark.parametrize("mode, words", [
    (0o640, "readable by its group"), (0o602, "writable by others"), (0o620, "writable by its group"),
])
def test_group_or_world_access_refused(tmp_path, mode, words):
    with pytest.raises(KeyFileError, match=words):
        load_key(write(tmp_path / "k", b"ab" * 32, mode=mode))


def test_raw_key_material_is_accepted(tmp_path):
    raw = b"not hex at all, but long enough to be a key!!"
    assert load_key(write(tmp_path / "k", raw + b"\n")) == raw


def test_not_a_regular_file(tmp_path):
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(KeyFileError):
        load_key(str(d))
