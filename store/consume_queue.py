"""ConsumeQueue: per (topic, queueId), fixed 20-byte units pointing into the CommitLog."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

from store import names
from store.errors import MQLakeError
from store.format import units
from store.mapped_file import MappedFile, MappedFileQueue, zero_stale_tail

log = logging.getLogger(__name__)
UNIT = units.CQ_UNIT_SIZE


class ConsumeQueueSizeError(MQLakeError, ValueError):
    """mappedFileSizeConsumeQueue does not hold whole units."""


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, file_size: int) -> None:
        if file_size % UNIT:
            raise ConsumeQueueSizeError(f"mappedFileSizeConsumeQueue {file_size} is not a multiple of {UNIT}")
        self.topic = topic
        self.queue_id = queue_id
        # IllegalName for a topic that is no plain directory name: nothing is created then
        self.queue = MappedFileQueue(names.path_under(root, topic, str(queue_id)), file_size)
        self.file_size = file_size
        self.max_physic_offset = -1  # end (offset+size) of the last dispatched record
        self.min_logic_offset = 0  # bytes; raised when the CommitLog below is deleted
        self.damage: str | None = None  # why load() deleted files of this queue, which must be rebuilt

    def load(self) -> None:
        """Map the queue's files; a damaged one (wrong size, after a gap) is deleted with those after it and
        ``damage`` says why, for recovery to rebuild the queue from the CommitLog."""
        self.damage = self.queue.load(derived=True)
        if self.damage is None and not self.queue.files and self.queue.directory.is_dir():
            self.damage = f"{self.queue.directory} holds no file"
        if self.damage is not None:
            log.warning("ConsumeQueue %s-%d: %s", self.topic, self.queue_id, self.damage)

    # --- recovery --------------------------------------------------------------------------------------
    def recover(self) -> None:
        """``ConsumeQueue.recover``: scan units from the 3rd-last file until an empty or bad one."""
        files = self.queue.files
        if not files:
            return
        idx = max(0, len(files) - 3)
        process = files[idx].file_from_offset
        self.max_physic_offset = -1
        while idx < len(files):
            mf = files[idx]
            pos = 0
            while pos < mf.file_size:
                off, size, _tags = units.decode_cq_unit(mf.mm, pos)
                if off >= 0 and size > 0:
                    pos += UNIT
                    if size != units.CQ_FILL_SIZE:  # fillPreBlank units point nowhere
                        self.max_physic_offset = off + size
                else:
                    break
            process = mf.file_from_offset + pos
            if pos == mf.file_size and idx + 1 < len(files):
                idx += 1
                continue
            break
        self.queue.truncate_dirty_files(process)
        self.correct_min_offset_from_files()

    def correct_min_offset_from_files(self) -> None:
        if self.queue.files and self.min_logic_offset < self.queue.files[0].file_from_offset:
            self.min_logic_offset = self.queue.files[0].file_from_offset

    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """``truncateDirtyLogicFiles``: drop every unit pointing at or beyond ``phy_offset``."""
        while True:
            mf = self.queue.last()
            if mf is None:
                break
            pos = 0
            kept_first = False
            while pos < mf.wrote:
                off, size, _ = units.decode_cq_unit(mf.mm, pos)
                if size <= 0 or off < 0:
                    break
                if size != units.CQ_FILL_SIZE and off + size > phy_offset:
                    break
                if size != units.CQ_FILL_SIZE:
                    self.max_physic_offset = off + size
                kept_first = True
                pos += UNIT
            if pos == 0 and not kept_first and len(self.queue.files) > 0 and mf.wrote > 0:
                # The file's very first unit is already past the end: remove it and look at the previous one.
                with self.queue.lock:
                    self.queue.files.pop()
                mf.destroy()
                continue
            zero_stale_tail(mf, pos)
            mf.wrote = mf.flushed = pos
            break
        if not self.queue.files:
            self.max_physic_offset = -1

    # --- write -----------------------------------------------------------------------------------------
    def put(self, commitlog_offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """``putMessagePositionInfo``: idempotent; returns False only on a real write failure."""
        if commitlog_offset + size <= self.max_physic_offset:
            return True  # already built (re-dispatch after recovery)
        expect = cq_offset * UNIT
        mf = self.queue.last_or_new(expect)
        if mf.wrote == 0 and len(self.queue.files) == 1 and expect > mf.file_from_offset:
            # A queue that starts mid-way (a slave's copy beginning at its master's newest segment): as RocketMQ's
            # putMessagePositionInfo, the units before are fillers and the queue's minimum is its first real unit.
            self._fill_pre_blank(mf, expect)
            self.min_logic_offset = max(self.min_logic_offset, expect)
        current = mf.file_from_offset + mf.wrote
        if expect < current:
            return True  # built repeatedly
        if expect != current:
            log.warning(
                "consume queue %s-%d order maybe wrong: expected logic offset %d, at %d",
                self.topic, self.queue_id, expect, current,
            )  # fmt: skip
        if mf.wrote + UNIT > mf.file_size:
            mf = self.queue.new_file(mf.end_offset)
        units.pack_cq_unit_into(mf.view, mf.wrote, commitlog_offset, size, tags_code)
        mf.wrote += UNIT
        self.max_physic_offset = commitlog_offset + size
        if self.min_logic_offset == 0 and len(self.queue.files) == 1 and mf.file_from_offset > 0:
            self.min_logic_offset = mf.file_from_offset
        return True

    def _fill_pre_blank(self, mf: MappedFile, until: int) -> None:
        pos = 0
        while mf.file_from_offset + pos < until:
            units.pack_cq_unit_into(mf.view, pos, *units.CQ_FILL_UNIT)
            pos += UNIT
        mf.wrote = pos

    # --- reads -----------------------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // UNIT

    @property
    def max_offset_in_queue(self) -> int:
        """The next offset to be written."""
        return self.queue.max_offset // UNIT

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        off = index * UNIT
        if off < self.min_logic_offset:
            return None
        mf = self.queue.find(off)
        if mf is None or off - mf.file_from_offset + UNIT > mf.wrote:
            return None
        return units.decode_cq_unit(mf.mm, off - mf.file_from_offset)

    def iter_units(self, start_index: int, max_units: int) -> Iterator[tuple[int, int, int, int]]:
        """Yield (index, commitlog_offset, size, tags_code) from ``start_index``, within one file at most."""
        off = start_index * UNIT
        mf = self.queue.find(off)
        if mf is None:
            return
        pos = off - mf.file_from_offset
        end = min(mf.wrote, pos + max_units * UNIT)
        data = mf.mm[pos:end]
        for i, (phy, size, tags) in enumerate(units.iter_cq_units(data[: len(data) - len(data) % UNIT])):
            yield start_index + i, phy, size, tags

    def last_unit(self) -> tuple[int, int, int] | None:
        n = self.max_offset_in_queue
        return self.get_unit(n - 1) if n > self.min_offset_in_queue else None

    # --- deletion --------------------------------------------------------------------------------------
    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete whole files whose units all point below the CommitLog minimum; returns files deleted."""
        deleted = 0
        while len(self.queue.files) > 1:
            first = self.queue.files[0]
            last_unit = units.decode_cq_unit(first.mm, first.file_size - UNIT)
            if last_unit[0] + last_unit[1] <= commitlog_min_offset:
                self.queue.delete_first()
                deleted += 1
            else:
                break
        self.correct_min_offset(commitlog_min_offset)
        return deleted

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """``correctMinOffset``: the first unit that still points into the CommitLog."""
        self.correct_min_offset_from_files()
        for mf in list(self.queue.files):
            # The dispatch thread appends while this runs (the clean pass holds no lock against it).  A unit
            # appended after this read points at or above the minimum (deletion never passes undispatched
            # data), so the scan stops at what it read: reading ``wrote`` again would skip those units.
            wrote = mf.wrote
            for pos in range(0, wrote, UNIT):
                phy, size, _ = units.decode_cq_unit(mf.mm, pos)
                if size != units.CQ_FILL_SIZE and phy >= commitlog_min_offset:
                    self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + pos)
                    return
            self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + wrote)
            if wrote < mf.file_size:
                return  # everything after it, in this file or the next, came later

    def flush(self) -> None:
        self.queue.flush()

    def close(self) -> None:
        self.queue.close()

    def destroy(self) -> None:
        self.queue.destroy()
        self.max_physic_offset = -1
        self.min_logic_offset = 0


class ConsumeQueueTable:
    """Every ConsumeQueue of the store by (topic, queueId), created on first use (``findConsumeQueue``)."""

    def __init__(self, root: Path, file_size: int) -> None:
        self.root = root
        self.file_size = file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    @overload
    def find(self, topic: str, queue_id: int, create: Literal[True] = True) -> ConsumeQueue: ...
    @overload
    def find(self, topic: str, queue_id: int, create: bool) -> ConsumeQueue | None: ...

    def find(self, topic: str, queue_id: int, create: bool = True) -> ConsumeQueue | None:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None and create:
            with self._lock:
                cq = self._queues.get(key)
                if cq is None:
                    cq = self._queues[key] = ConsumeQueue(self.root, topic, queue_id, self.file_size)
        return cq

    def remove_topic(self, topic: str) -> list[ConsumeQueue]:
        """Take every queue of ``topic`` out of the table (they are no longer found); returns them."""
        with self._lock:
            keys = [k for k in self._queues if k[0] == topic]
            return [self._queues.pop(k) for k in keys]

    def all(self) -> list[ConsumeQueue]:
        return list(self._queues.values())

    def __len__(self) -> int:
        return len(self._queues)

    def load(self) -> None:
        """Open the queues found on disk (``consumequeue/{topic}/{queueId}/``)."""
        if not self.root.exists():
            return
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if qdir.is_dir() and qdir.name.isascii() and qdir.name.isdigit():
                    try:
                        self.find(topic_dir.name, int(qdir.name)).load()
                    except names.IllegalName as e:  # a link leading out of the store: never opened, never written
                        log.error("%s left out: %s", qdir, e)
