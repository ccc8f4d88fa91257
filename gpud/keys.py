"""The cluster key: a shared secret that seals (encrypts and authenticates) every message
on the bus.

Like munge's key, it lives in one small file readable only by its owner
(``/etc/gpud/cluster.key``, mode 0600) and is copied to every host of the cluster.
The file holds 32 random bytes, hex-encoded, on one line.  ``load_key`` refuses a
file that anyone else could read or write, one owned by anyone but the daemon's own
user or root, and a symbolic link, because whoever holds the key can launch jobs as any
user on every node, and whoever can swap the file can make a daemon trust their key.

During a rotation the file holds two lines: the first key seals, both open.
``rotate_key`` makes the three steps (``add``, ``promote``, ``retire``); docs/security.md
says how to roll them out without stopping anything.

Stdlib only.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat

KEY_BYTES = 32
MIN_KEY_BYTES = 32
_MAX_FILE_BYTES = 64 * 1024  # a key file is tiny; refuse to slurp something else


class KeyFileError(RuntimeError):
    """A missing or unsafe key file; the message says what to do."""


def generate_key(path: str) -> None:
    """Write a fresh key to ``path`` (mode 0600); never overwrite an existing file."""
    key_hex = secrets.token_hex(KEY_BYTES)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:
        raise KeyFileError(f"cannot create cluster key {path}: directory {directory} does not exist") from None
    except OSError as e:
        raise KeyFileError(f"cannot create cluster key {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # the umask may have narrowed it; never widened
            f.write(key_hex + "\n")
            f.flush()
            os.fsync(f.fileno())
        # link() fails if the target exists, so two racing keygens cannot both win
        # and an existing key is never replaced.
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise KeyFileError(
                f"cluster key {path} already exists; remove it first to generate a new one"
            ) from None
        except OSError as e:
            raise KeyFileError(f"cannot create cluster key {path}: {e.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    _fsync_dir(directory)


def load_key(path: str) -> bytes:
    """The sealing key in ``path``; KeyFileError unless the file is present and private."""
    return load_keys(path)[0]


def load_keys(path: str) -> list[bytes]:
    """Every key in ``path``, the sealing one first (two during a rotation)."""
    text = _read_private(path, "cluster key")
    if not text:
        raise KeyFileError(f"cluster key {path} is empty; create one with: gpud keygen {path}")
    keys = _decode_lines(text)
    for key in keys:
        if len(key) < MIN_KEY_BYTES:
            raise KeyFileError(
                f"cluster key {path} is too short ({len(key)} bytes, need {MIN_KEY_BYTES}); "
                f"create a new one with: gpud keygen {path}"
            )
    return keys


def _read_private(path: str, what: str) -> bytes:
    """A small secret file's stripped content: a regular file, not a symbolic link, owned by
    this process's user or root, and neither readable nor writable by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KeyFileError(f"{what} {path} not found; create one with: gpud keygen {path}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise KeyFileError(f"{what} {path} is a symbolic link; point the config at the file "
                               "itself") from None
        raise KeyFileError(f"cannot read {what} {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise KeyFileError(f"{what} {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        me = os.geteuid()
        if st.st_uid not in _trusted_owners(me):
            raise KeyFileError(
                f"{what} {path} is owned by {_user(st.st_uid)}, not by this daemon's user "
                f"({_user(me)}) or root; run: chown {_user(me)} {path}"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyFileError(
                f"{what} {path} is {_exposure(mode)} (mode {mode:04o}); run: chmod 600 {path}"
            )
        raw = f.read(_MAX_FILE_BYTES + 1)
    if len(raw) > _MAX_FILE_BYTES:
        raise KeyFileError(f"{what} {path} is too large to be a key file")
    return raw.strip()


def read_secret(path: str, what: str) -> str:
    """A password file's first line, under the same rules as the key file."""
    text = _read_private(path, what)
    if not text:
        raise KeyFileError(f"{what} {path} is empty")
    try:
        return text.splitlines()[0].decode()
    except UnicodeDecodeError:
        raise KeyFileError(f"{what} {path} is not text") from None


ROTATIONS = ("add", "promote", "retire")


def rotate_key(path: str, step: str) -> list[bytes]:
    """One step of a key rotation, rewriting ``path`` in place (owner and mode kept):

    * ``add``: append a new key; the current one still seals, both open;
    * ``promote``: the newest key seals; the old one still opens;
    * ``retire``: drop every key but the sealing one.
    """
    if step not in ROTATIONS:
        raise ValueError(f"unknown rotation step {step!r}: use one of {', '.join(ROTATIONS)}")
    keys = load_keys(path)
    if step == "add":
        if len(keys) > 1:
            raise KeyFileError(f"cluster key {path} already holds {len(keys)} keys: finish that rotation "
                               f"first (gpud keygen --rotate promote|retire {path})")
        keys = keys + [secrets.token_bytes(KEY_BYTES)]
    elif step == "promote":
        if len(keys) < 2:
            raise KeyFileError(f"cluster key {path} holds one key: add one first (gpud keygen --rotate add {path})")
        keys = [keys[-1]] + keys[:-1]
    else:
        keys = keys[:1]
    st = os.stat(path)
    # a gpud-owned key stays gpud's
    write_private(path, "".join(k.hex() + "\n" for k in keys), 0o600,
                  owner=(st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
    return keys


SERVICE_USER = "gpud"   # the head's system user (scripts/install creates it)


def _trusted_owners(me: int) -> set[int]:
    """Who may own a secret this process reads: itself and root; for root also the head's
    service user, whose daemon holds the same key anyway, so that a worker (root) and the
    head (gpud) on one host can share the head's key file."""
    owners = {me, 0}
    if me == 0:
        try:
            owners.add(pwd.getpwnam(SERVICE_USER).pw_uid)
        except KeyError:
            pass
    return owners


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _exposure(mode: int) -> str:
    for bit, words in ((0o004, "readable by others"), (0o040, "readable by its group"),
                       (0o002, "writable by others"), (0o020, "writable by its group")):
        if mode & bit:
            return words
    return "accessible by others"  # execute bits only


def _decode_lines(text: bytes) -> list[bytes]:
    """One key per line when every line is hex; otherwise the whole text is one raw key."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        try:
            return [bytes.fromhex(line.decode("ascii")) for line in lines]
        except (UnicodeDecodeError, ValueError):
            pass
    return [_decode(text)]


def _decode(text: bytes) -> bytes:
    """Hex as ``generate_key`` writes it; any other content is used as raw bytes."""
    try:
        return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return text


def write_private(path: str, text: str, mode: int, *, gid: int | None = None,
                  owner: tuple[int, int] | None = None) -> None:
    """Atomically replace ``path`` with ``text``: never readable by others, even for a moment
    (made 0600 and O_NOFOLLOW, then given ``mode``, ``gid`` or ``owner``), and durable."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise KeyFileError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            elif gid is not None:
                os.fchown(f.fileno(), -1, gid)
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
