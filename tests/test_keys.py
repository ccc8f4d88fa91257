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


def test_a_symbolic_link_is_refused(tmp_path):
    real = tmp_path / "real.key"
    generate_key(str(real))
    link = tmp_path / "cluster.key"
    link.symlink_to(real)
    with pytest.raises(KeyFileError, match="symbolic link"):
        load_key(str(link))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_a_key_owned_by_another_user_is_refused(tmp_path):
    import shutil
    import tempfile
    from pathlib import Path

    here = Path(tempfile.mkdtemp(prefix="gpud-key-"))   # pytest's tmp_path is root's alone
    here.chmod(0o711)
    try:
        _owner_checks(here / "cluster.key")
    finally:
        shutil.rmtree(here)


def _owner_checks(path):
    generate_key(str(path))
    os.chown(path, 65534, 65534)   # nobody's, mode 0600: private, but not ours
    with pytest.raises(KeyFileError, match=r"owned by .*not by this daemon's user .*chown"):
        load_key(str(path))
    # The daemon running as that user accepts it; root-owned stays accepted for everyone.
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            load_key(str(path))
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    os.chown(path, 0, 0)
    load_key(str(path))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_root_also_trusts_the_heads_service_user(tmp_path, monkeypatch):
    """A worker (root) and the head (its service user) on one host share the key file."""
    import gpud.keys

    path = tmp_path / "cluster.key"
    generate_key(str(path))
    os.chown(path, 65534, 65534)
    monkeypatch.setattr(gpud.keys, "SERVICE_USER", "nobody")
    load_key(str(path))
    monkeypatch.setattr(gpud.keys, "SERVICE_USER", "no-such-user-here")
    with pytest.raises(KeyFileError, match="owned by"):
        load_key(str(path))


def test_rotation_steps(tmp_path):
    from gpud.keys import load_keys, rotate_key

    path = tmp_path / "cluster.key"
    generate_key(str(path))
    old = load_key(str(path))
    keys = rotate_key(str(path), "add")
    assert load_keys(str(path)) == keys and keys[0] == old and len(keys) == 2
    with pytest.raises(KeyFileError, match="finish that rotation"):
        rotate_key(str(path), "add")
    new = keys[1]
    assert rotate_key(str(path), "promote") == [new, old] and load_key(str(path)) == new
    assert rotate_key(str(path), "retire") == [new] and load_keys(str(path)) == [new]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.key"]
    with pytest.raises(KeyFileError, match="add one first"):
        rotate_key(str(path), "promote")
