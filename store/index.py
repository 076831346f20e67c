"""IndexFile: hash slots and chained entries from ``topic#key`` to CommitLog offsets (``IndexService``)."""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from store.format import hashing, records, units
from store.mapped_file import StoreFileError, allocate

log = logging.getLogger(__name__)
MAX_MSGS_NUM_BATCH = 64


class IndexFile:
    def __init__(self, path: Path, hash_slot_num: int, index_num: int, *, create: bool = False) -> None:
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        size = units.index_file_size(hash_slot_num, index_num)
        if create:
            # Allocated, not written: slots are touched at random, and a file of 400 MiB of zeros would hold
            # dispatch up.  Sized under a temp name and renamed, so a crash never leaves a short file behind.
            if path.exists():
                raise FileExistsError(path)
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                allocate(fd, path, size)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
            os.close(fd)
            os.replace(tmp, path)
        actual = path.stat().st_size
        if actual != size:
            raise StoreFileError(f"{path}: size {actual} does not match maxHashSlotNum/maxIndexNum ({size})")
        self._fd = os.open(path, os.O_RDWR)
        try:
            allocate(self._fd, path, size)  # RocketMQ's own index files are sparse
            self.mm = mmap.mmap(self._fd, size)
        except BaseException:
            os.close(self._fd)
            raise
        self.header = units.decode_index_header(self.mm)

    @property
    def name(self) -> str:
        return self.path.name

    def is_full(self) -> bool:
        return self.header.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int, write_header: bool = True) -> bool:
        """``IndexFile.putKey``; False when the file is full. Several keys may share one header write."""
        h = self.header
        if h.index_count >= self.index_num:
            return False
        key_hash = hashing.index_key_hash(key)
        if h.begin_timestamp <= 0:
            time_diff = 0
        else:
            time_diff = min(max((store_timestamp - h.begin_timestamp) // 1000, 0), 0x7FFFFFFF)
        slot_value = units.put_index_entry(self.mm, self.hash_slot_num, h.index_count, key_hash, phy_offset, time_diff)
        if h.index_count <= 1:
            h.begin_phy_offset = phy_offset
            h.begin_timestamp = store_timestamp
        if slot_value == 0:
            h.hash_slot_count += 1
        h.index_count += 1
        h.end_phy_offset = phy_offset
        h.end_timestamp = store_timestamp
        if write_header:
            self.write_header()
        return True

    def write_header(self) -> None:
        self.mm[: units.INDEX_HEADER_SIZE] = units.encode_index_header(self.header)

    def is_time_matched(self, begin: int, end: int) -> bool:
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """``selectPhyOffset``: walk the chain of the key's slot, newest first."""
        h = self.header
        key_hash = hashing.index_key_hash(key)
        slot_value = units.read_index_slot(self.mm, key_hash % self.hash_slot_num)
        if slot_value <= 0 or slot_value > h.index_count or h.index_count <= 1:
            return
        nxt = slot_value
        while len(out) < max_num:
            entry_hash, phy, time_diff, prev = units.read_index_entry(self.mm, self.hash_slot_num, nxt)
            if time_diff < 0:
                break
            time_read = h.begin_timestamp + time_diff * 1000
            if entry_hash == key_hash and begin <= time_read <= end:
                out.append(phy)
            if prev <= 0 or prev > h.index_count or prev == nxt or time_read < begin:
                break
            nxt = prev

    def truncate(self, phy_offset: int, store_time: Callable[[int], int | None]) -> int:
        """Drop every entry pointing at or past CommitLog offset ``phy_offset``; returns how many were dropped.

        Entries are appended in CommitLog order, so the dropped ones are the newest.  Each is undone newest
        first: its slot gets back the entry it chained to (what the slot held before it was written), which
        leaves the slots and header exactly as they were before the first dropped entry was added.
        ``store_time`` gives the store timestamp of the record at an offset (None if unreadable), for the
        header's new end.
        """
        h = self.header
        keep = h.index_count
        while keep > 1 and units.read_index_entry(self.mm, self.hash_slot_num, keep - 1)[1] >= phy_offset:
            keep -= 1
        if keep == h.index_count:
            return 0
        empty_entry = bytes(units.INDEX_ENTRY_SIZE)
        for n in range(h.index_count - 1, keep - 1, -1):
            key_hash, _phy, _tdiff, prev = units.read_index_entry(self.mm, self.hash_slot_num, n)
            slot = key_hash % self.hash_slot_num
            if units.read_index_slot(self.mm, slot) == n:
                units.write_index_slot(self.mm, slot, max(prev, 0))  # a dropped one is undone next
            if prev <= 0:
                h.hash_slot_count = max(0, h.hash_slot_count - 1)
            pos = units.index_entry_position(self.hash_slot_num, n)
            self.mm[pos : pos + units.INDEX_ENTRY_SIZE] = empty_entry
        dropped = h.index_count - keep
        h.index_count = keep
        if keep > 1:
            _hash, phy, tdiff, _prev = units.read_index_entry(self.mm, self.hash_slot_num, keep - 1)
            h.end_phy_offset = phy
            ts = store_time(phy)
            # the entry keeps its time in whole seconds from the file's begin: the record's own time is exact
            h.end_timestamp = ts if ts is not None and ts > 0 else h.begin_timestamp + tdiff * 1000
        self.write_header()
        self.flush()
        return dropped

    def flush(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    def __init__(self, directory: Path, hash_slot_num: int, index_num: int,
        on_file_flushed: Callable[[int], None] | None = None,
    ) -> None:  # fmt: skip
        self.directory = directory
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        self.lock = threading.RLock()
        self._on_file_flushed = on_file_flushed  # called with a full file's endTimestamp once durable
        self._flushes: list[threading.Thread] = []  # of full files, joined before the files (and checkpoint) close

    def load(self, last_exit_ok: bool, index_msg_timestamp: int) -> None:
        """Load every index file; after a crash, files newer than the checkpoint are rebuilt from the log."""
        if not self.directory.exists():
            return
        paths = sorted(self.directory.iterdir())
        for p in paths:
            if p.name.endswith(".tmp") or (p == paths[-1] and p.stat().st_size == 0):
                p.unlink()  # an interrupted creation (RocketMQ's map() would just grow an empty file)
                continue
            f = IndexFile(p, self.hash_slot_num, self.index_num)
            if not last_exit_ok and f.header.end_timestamp > index_msg_timestamp:
                log.info("destroying index file %s: newer than the checkpoint", p)
                f.destroy()
                continue
            self.files.append(f)

    @property
    def end_phy_offset(self) -> int:
        return self.files[-1].header.end_phy_offset if self.files else 0

    def _writable_file(self) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full():
            return last
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time_ns() // 1_000_000  # named by wall clock, as RocketMQ does
        name = units.index_file_name(now)
        while (self.directory / name).exists() or (self.files and name <= self.files[-1].name):
            now += 1
            name = units.index_file_name(now)
        f = IndexFile(self.directory / name, self.hash_slot_num, self.index_num, create=True)
        if last is not None:
            # A new file starts where the last one ended (IndexService.getAndCreateLastIndexFile).
            h = f.header
            h.begin_phy_offset = h.end_phy_offset = last.header.end_phy_offset
            h.begin_timestamp = h.end_timestamp = last.header.end_timestamp
            f.mm[: units.INDEX_HEADER_SIZE] = units.encode_index_header(h)
            flush = threading.Thread(target=self._flush_full, args=(last,), name="index-flush", daemon=True)
            flush.start()
            self._flushes = [t for t in self._flushes if t.is_alive()] + [flush]
        self.files.append(f)
        return f

    def _flush_full(self, f: IndexFile) -> None:
        try:
            f.flush()
        except (OSError, ValueError):
            return
        if self._on_file_flushed is not None:
            self._on_file_flushed(f.header.end_timestamp)

    def build_index(self, req: records.DispatchRequest) -> None:
        """``IndexService.buildIndex``: UNIQ_KEY and each KEYS entry, rollbacks and repeats skipped."""
        keys = records.index_keys(req)  # RocketMQ 4.x's rule: no tag key, so both brokers read the files alike
        if not keys:
            return
        with self.lock:
            if self.files and req.commitlog_offset < self.files[-1].header.end_phy_offset:
                return  # already indexed
            f = self._writable_file()
            for k in keys:
                full = hashing.index_key(req.topic, k)
                if not f.put_key(full, req.commitlog_offset, req.store_timestamp, write_header=False):
                    f.write_header()
                    f = self._writable_file()
                    f.put_key(full, req.commitlog_offset, req.store_timestamp, write_header=False)
            f.write_header()

    def query_offsets(self, topic: str, key: str, max_num: int, begin: int, end: int) -> tuple[list[int], int, int]:
        """``queryOffset``: (phy offsets, indexLastUpdateTimestamp, indexLastUpdatePhyoffset)."""
        max_num = min(max_num, MAX_MSGS_NUM_BATCH)
        out: list[int] = []
        full = hashing.index_key(topic, key)
        with self.lock:
            if not self.files:
                return out, 0, 0
            last = self.files[-1].header
            for f in reversed(self.files):
                if f.is_time_matched(begin, end):
                    f.select_phy_offsets(full, max_num, begin, end, out)
                if f.header.begin_timestamp < begin or len(out) >= max_num:
                    break
            return out, last.end_timestamp, last.end_phy_offset

    def truncate(self, phy_offset: int, store_time: Callable[[int], int | None]) -> int:
        """Drop every entry pointing at or past ``phy_offset`` (the CommitLog was cut there); returns how many.

        A last file left without an entry whose header ends past the cut is deleted (a file created empty
        copies its predecessor's end into its header).  Afterwards the index ends before ``phy_offset``, so records
        written there from now on are indexed (``build_index`` skips what lies below the index's end).
        """
        dropped = 0
        with self.lock:
            while self.files:
                f = self.files[-1]
                n = f.truncate(phy_offset, store_time)
                dropped += n
                if f.header.index_count > 1 or f.header.end_phy_offset < phy_offset:
                    if n:
                        log.warning("index file %s: %d entries at or past CommitLog offset %d dropped; it now "
                                    "ends at offset %d", f.path, n, phy_offset, f.header.end_phy_offset)  # fmt: skip
                    break
                log.warning("index file %s: every entry lies at or past CommitLog offset %d; deleted", f.path,
                            phy_offset)  # fmt: skip
                self.files.pop().destroy()
        return dropped

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete index files whose every entry lies below the CommitLog minimum (never the last)."""
        deleted = 0
        with self.lock:
            while len(self.files) > 1 and self.files[0].header.end_phy_offset < commitlog_min_offset:
                self.files.pop(0).destroy()
                deleted += 1
        return deleted

    def flush(self) -> None:
        with self.lock:
            for f in self.files[-1:]:
                f.flush()

    def close(self) -> None:
        for flush in self._flushes:  # a full file's flush reports to the checkpoint, which closes after this
            flush.join()
        with self.lock:
            for f in self.files:
                f.close()

    def destroy(self) -> None:
        with self.lock:
            for f in self.files:
                f.destroy()
            self.files = []
