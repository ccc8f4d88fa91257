"""The cluster key: a shared secret that signs every message on the bus.

Like munge's key, it lives in one small file readable only by its owner
(``/etc/gpud/cluster.key``, mode 0600) and is copied to every host of the cluster.
The file holds 32 random bytes, hex-encoded, on one line.  ``load_key`` refuses a
file that anyone else could read or write, because whoever holds the key can
launch jobs as any user on every node.

Stdlib only.
"""

from __future__ import annotations

import os
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
    """The key material in ``path``; KeyFileError unless the file is present and private."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"cluster key {path} not found; create one with: gpud keygen {path}") from None
    except OSError as e:
        raise KeyFileError(f"cannot read cluster key {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise KeyFileError(f"cluster key {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyFileError(
                f"cluster key {path} is {_exposure(mode)} (mode {mode:04o}); run: chmod 600 {path}"
            )
        raw = f.read(_MAX_FILE_BYTES + 1)
    if len(raw) > _MAX_FILE_BYTES:
        raise KeyFileError(f"cluster key {path} is too large to be a key file")
    text = raw.strip()
    if not text:
        raise KeyFileError(f"cluster key {path} is empty; create one with: gpud keygen {path}")
    key = _decode(text)
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(
            f"cluster key {path} is too short ({len(key)} bytes, need {MIN_KEY_BYTES}); "
            f"create a new one with: gpud keygen {path}"
        )
    return key


def _exposure(mode: int) -> str:
    for bit, words in ((0o004, "readable by others"), (0o040, "readable by its group"),
                       (0o002, "writable by others"), (0o020, "writable by its group")):
        if mode & bit:
            return words
    return "accessible by others"  # execute bits only


def _decode(text: bytes) -> bytes:
    """Hex as ``generate_key`` writes it; any other content is used as raw bytes."""
    try:
        return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return text


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
