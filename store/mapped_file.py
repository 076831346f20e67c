"""Fixed-size, memory-mapped segment files named by their 20-digit start offset (``MappedFileQueue``)."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from pathlib import Path

from store.errors import MQLakeError
from store.format import units

log = logging.getLogger(__name__)
_FILL_CHUNK = bytes(1 << 20)
PAGE_SIZE = 4096


class StoreFileError(MQLakeError):
    """A store file that cannot be used as it is; the message names the file."""


def preallocate(path: Path, size: int) -> None:
    """Create ``path`` filled with zeros, atomically.

    Written (``sendfile`` from /dev/zero, else ``write()``) rather than left sparse: first touch of a
    pre-written file is an order of magnitude faster than of a sparse or fallocated one, and the append path
    must not wait on block allocation.  The temp-then-rename means a crash never leaves a short segment behind.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            left = size - _zeros_from_dev_zero(f.fileno(), size)
            while left > 0:
                n = min(left, len(_FILL_CHUNK))
                f.write(_FILL_CHUNK[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # a full disk must not keep the part written: it is the room others need
        if isinstance(e, OSError):
            raise OSError(e.errno, f"{path}: cannot create a file of {size} bytes: {e.strerror}") from None
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def allocate(fd: int, path: Path, size: int) -> None:
    """Give the first ``size`` bytes of an open file disk blocks (``posix_fallocate``), growing it if shorter.

    Every store file is allocated before it is mapped: a store of pages with no blocks behind them (a sparse
    file, as Java's ``RandomAccessFile.setLength`` makes) faults with SIGBUS when a write through the mapping
    needs a block the full filesystem cannot give.  Here the full filesystem is an ``OSError`` (ENOSPC) naming
    the file instead.  Blocks already allocated cost nothing, and the contents are never changed.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot allocate {size} bytes before mapping it: {e.strerror}") from None


def _zeros_from_dev_zero(fd: int, size: int) -> int:
    """Write up to ``size`` zeros to ``fd`` with ``sendfile`` from /dev/zero; how many it wrote (0 where that is
    not supported: the caller writes the rest).

    The kernel then fills the page cache in pipe-sized pieces, so the segment's pages are small folios.  Written
    with 1 MiB ``write()`` calls they were 1 MiB folios, and every later write into one costs the whole folio:
    the write fault of an append into a page that an fdatasync has cleaned (``block_page_mkwrite`` walks the
    folio's buffers), once per page appended in SYNC_FLUSH, took about three times the kernel time.
    One system call also keeps the thread off the GIL for the whole file, where 1,024 writes each waited for it
    behind a busy event loop."""
    done = 0
    try:
        with open("/dev/zero", "rb") as zero:
            while done < size:
                n = os.sendfile(fd, zero.fileno(), None, size - done)
                if n <= 0:
                    break
                done += n
    except OSError:  # no /dev/zero, or sendfile cannot read from it here
        os.lseek(fd, done, os.SEEK_SET)
    return done


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MappedFile:
    """One segment: the whole file mapped; ``wrote``/``flushed`` are positions inside it."""

    def __init__(self, path: Path, file_size: int, *, create: bool = False) -> None:
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(path.name)
        if create and not path.exists():
            preallocate(path, file_size)
        actual = path.stat().st_size
        if actual != file_size:
            raise StoreFileError(f"{path}: size {actual} is not the configured segment size {file_size}")
        self._fd = os.open(path, os.O_RDWR)
        try:
            if not create:  # a file of ours is written whole; one of Java's, or an older one, may be sparse
                allocate(self._fd, path, file_size)
            self.mm = mmap.mmap(self._fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self._close_fd()
            raise
        self.view = memoryview(self.mm)
        self.wrote = 0
        self.flushed = 0
        self.last_store_timestamp = 0

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def wrote_offset(self) -> int:
        return self.file_from_offset + self.wrote

    def is_full(self) -> bool:
        return self.wrote >= self.file_size

    def flush(self) -> int:
        """Make everything written so far durable; returns the flushed position.

        ``fdatasync`` on the file descriptor is what ``msync`` does on Linux and, unlike
        ``mmap.flush``, it releases the GIL while the disk works.
        """
        target = self.wrote
        if target > self.flushed and self._fd >= 0:
            try:
                os.fdatasync(self._fd)
            except OSError as e:  # the flush service logs it and tries again: the log must say which file
                raise OSError(e.errno, f"{self.path}: cannot flush: {e.strerror}") from None
            self.flushed = target
        return self.flushed

    def close(self) -> None:
        if self.mm.closed:
            return
        self.view.release()
        # A reader may still hold a slice of the map; the kernel keeps it until that is dropped.
        with contextlib.suppress(BufferError):
            self.mm.close()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        """Delete the file. The mapping is not closed here: a reader that looked this segment up just
        before (a pull, the reput thread) finishes its copy from it, and it is unmapped when the last
        reference goes, which is what RocketMQ's reference-counted ``MappedFile.destroy`` gives."""
        self._close_fd()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote}, flushed={self.flushed})"


class MappedFileQueue:
    """The ordered segments of one log (the CommitLog, or one ConsumeQueue)."""

    def __init__(self, directory: Path, file_size: int, *, preallocate_next: bool = False) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self._preallocate_next = preallocate_next
        self._prealloc_thread: threading.Thread | None = None
        self.lock = threading.RLock()  # guards the list, not the bytes

    # --- loading ---------------------------------------------------------------------------------------
    def load(self, *, derived: bool = False) -> str | None:
        """``doLoad``: every segment must be exactly the configured size, contiguous; names must be offsets.

        A log that is ``derived`` from another (a ConsumeQueue, rebuilt from the CommitLog) is not refused for a
        segment of the wrong size or one after a gap: that segment and every later one are deleted, and the
        reason is returned for the caller to rebuild from.  Otherwise such a segment raises StoreFileError.
        """
        if not self.directory.exists():
            return None
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()  # an interrupted preallocation
        names = sorted(p for p in self.directory.iterdir() if p.is_file())
        for i, p in enumerate(names):
            if not units.is_offset_file_name(p.name):
                raise StoreFileError(f"{p}: not a segment (name must be a 20-digit start offset)")
            size = p.stat().st_size
            if size == 0 and p == names[-1]:
                p.unlink()  # 5.x: a zero-length last file is an interrupted creation
                continue
            expected = self.files[-1].end_offset if self.files else int(p.name)
            problem = None
            if size != self.file_size:
                problem = f"{p}: size {size} is not the configured segment size {self.file_size}"
            elif int(p.name) != expected:
                problem = f"{p}: starts at {int(p.name)}, expected {expected}"
            if problem is not None:
                if not derived:
                    raise StoreFileError(problem)
                for q in names[i:]:
                    q.unlink()
                return f"{problem}; deleted it and the {len(names) - i - 1} file(s) after it"
            mf = MappedFile(p, self.file_size)
            mf.wrote = mf.flushed = self.file_size  # recovery sets the real positions
            self.files.append(mf)
        return None

    # --- positions ---------------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        with self.lock:
            return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """End of the written data (``getMaxOffset``)."""
        with self.lock:
            return self.files[-1].wrote_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        with self.lock:
            for mf in reversed(self.files):
                if mf.flushed > 0:
                    return mf.file_from_offset + mf.flushed
            return self.files[0].file_from_offset if self.files else 0

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset`` (segments are contiguous, so this is arithmetic)."""
        with self.lock:
            if not self.files:
                return None
            i = (offset - self.files[0].file_from_offset) // self.file_size
            if 0 <= i < len(self.files):
                return self.files[i]
            return None

    # --- growth ------------------------------------------------------------------------------------------
    def wait_preallocated(self) -> None:
        """Return once the next segment being written ahead (if any) is on disk."""
        if self._prealloc_thread is not None:
            self._prealloc_thread.join()

    def new_file(self, start_offset: int) -> MappedFile:
        """Map the segment starting at ``start_offset``, creating it if absent."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.wait_preallocated()
        mf = MappedFile(self.directory / units.offset_to_file_name(start_offset), self.file_size, create=True)
        with self.lock:
            self.files.append(mf)
        if self._preallocate_next:
            nxt = self.directory / units.offset_to_file_name(start_offset + self.file_size)

            def allocate_next() -> None:
                try:
                    if not nxt.exists():
                        preallocate(nxt, self.file_size)
                except OSError as e:  # a full disk: the put that needs the segment creates it, or is refused
                    log.warning("next CommitLog segment not preallocated: %s", e)

            # Like AllocateMappedFileService: the next segment is written while this one fills.
            self._prealloc_thread = threading.Thread(
                target=allocate_next,
                name="allocate-mapped-file",
                daemon=True,
            )
            self._prealloc_thread.start()
        return mf

    def last_or_new(self, start_offset: int = 0) -> MappedFile:
        last = self.last()
        if last is None:
            return self.new_file(start_offset - start_offset % self.file_size)
        if last.is_full():
            return self.new_file(last.end_offset)
        return last

    # --- flush -------------------------------------------------------------------------------------------
    def flush(self) -> int:
        """Flush every segment with unflushed bytes; returns the flushed offset."""
        with self.lock:
            files = [mf for mf in self.files if mf.wrote > mf.flushed]
        for mf in files:
            mf.flush()
        return self.flushed_offset

    def dirty_bytes(self) -> int:
        with self.lock:
            return sum(mf.wrote - mf.flushed for mf in self.files[-2:])

    # --- truncation and deletion ----------------------------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> None:
        """``truncateDirtyFiles``: the segment holding ``offset`` ends there, later ones are destroyed.

        Unlike RocketMQ we zero the stale bytes after the new end (up to the first all-zero page), so a
        second crash can never resurrect a record from before the first one.
        """
        with self.lock:
            keep: list[MappedFile] = []
            for mf in self.files:
                if mf.end_offset <= offset:
                    keep.append(mf)
                elif mf.file_from_offset <= offset:
                    pos = offset - mf.file_from_offset
                    zero_stale_tail(mf, pos)
                    mf.wrote = mf.flushed = pos
                    keep.append(mf)
                else:
                    mf.destroy()
            self.files = keep

    def delete_first(self) -> MappedFile | None:
        with self.lock:
            if not self.files:
                return None
            mf = self.files.pop(0)
        mf.destroy()
        return mf

    def destroy(self) -> None:
        with self.lock:
            for mf in self.files:
                mf.destroy()
            self.files = []

    def close(self) -> None:
        self.wait_preallocated()
        with self.lock:
            for mf in self.files:
                mf.close()


def zero_stale_tail(mf: MappedFile, pos: int) -> None:
    zero = bytes(PAGE_SIZE)
    p = pos
    while p < mf.file_size:
        end = min(mf.file_size, (p // PAGE_SIZE + 1) * PAGE_SIZE)
        if mf.mm[p:end] == zero[: end - p]:
            break
        mf.mm[p:end] = zero[: end - p]
        p = end
    if p > pos:
        os.fdatasync(mf._fd)
