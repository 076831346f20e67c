"""The checkpoint file (4096 bytes, mapped), the abort marker and the store lock."""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

from store.errors import MQLakeError
from store.format import units
from store.mapped_file import allocate


class StoreCheckpoint:
    """``StoreCheckpoint``: physic / logics / index message timestamps, big-endian longs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            allocate(fd, path, units.CHECKPOINT_SIZE)  # grows a new or short file, never sparse under the map
            self.mm = mmap.mmap(fd, units.CHECKPOINT_SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        stamps = units.decode_checkpoint(self.mm)
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = stamps

    @property
    def min_timestamp(self) -> int:
        """``getMinTimestamp``: 3 s of slack below the older of the two flushed timestamps."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def flush(self) -> None:
        data = units.encode_checkpoint(self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp)
        self.mm[: len(data)] = data
        os.fdatasync(self._fd)

    def close(self) -> None:
        if not self.mm.closed:
            self.flush()
            self.mm.close()
            os.close(self._fd)


class StoreLockedError(MQLakeError, RuntimeError):
    """Another process holds the store's lock file (a broker runs on it)."""


LOCK_FILE = "lock"


class StoreLock:
    """Exclusive lock on ``<root>/lock``: a second process on the same store fails at once."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_FILE
        root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock excludes a second open in this process too; the POSIX lock on byte 0 is what a
            # Java broker's FileChannel.tryLock takes, so the two cannot share a store either.
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            os.close(self._fd)
            raise StoreLockedError(f"store {root} is locked by another process (lock file {self.path})") from e
        os.pwrite(self._fd, b"lock", 0)
        os.fsync(self._fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def flock_held(path: Path) -> bool:
    """Whether some open file holds an exclusive ``flock`` on ``path`` (no such file: none does).

    The probe takes a shared ``flock`` and drops it at once: it conflicts with a holder's exclusive lock only, so
    probes never see each other.  A file system that refuses the probe counts as held: a caller never takes a
    live holder for a dead one.  Never a POSIX ``lockf`` probe: closing its descriptor would drop every POSIX
    lock this process holds on the file (a broker's own store lock).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False


def abort_file(root: Path) -> Path:
    return root / "abort"
