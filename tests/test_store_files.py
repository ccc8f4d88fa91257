"""The job database's files are the head's alone, whatever the umask: they hold every job's
environment."""

import os
import stat

from gpud.head.store import Store
from tests.test_store import new_job


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_database_files_are_0600_and_a_new_directory_unlistable_under_umask_000(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "state" / "head.db"
        async with Store(str(path)) as store:
            await store.insert_jobs([new_job()], now=1.0)   # the WAL and shared memory exist now
            files = [path, path.with_name("head.db-wal"), path.with_name("head.db-shm")]
            assert all(f.exists() for f in files)
            assert [mode(f) for f in files] == [0o600] * 3
        assert mode(path.parent) == 0o711   # a worker sharing it needs others to pass through
    finally:
        os.umask(old)


async def test_a_database_left_readable_is_narrowed_to_0600_at_open(tmp_path):
    path = tmp_path / "head.db"
    async with Store(str(path)):
        pass
    for name in ("head.db", "head.db-wal", "head.db-shm"):
        f = tmp_path / name
        f.touch()
        os.chmod(f, 0o644)
    async with Store(str(path)):
        assert [mode(tmp_path / n) for n in ("head.db", "head.db-wal", "head.db-shm")] == [0o600] * 3


async def test_a_symlink_in_place_of_the_database_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "head.db").symlink_to(target)
    try:
        async with Store(str(tmp_path / "head.db")):
            raise AssertionError("opened a database through a symlink")
    except RuntimeError as e:
        assert "head.db" in str(e)
