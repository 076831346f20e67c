"""What the verification reads of the live store besides the CommitLog: who holds it, how far dispatch got,
and its ConsumeQueue and IndexFile files (read-only; nothing here writes or locks)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from store import dump
from store.checkpoint import LOCK_FILE, flock_held
from store.dump import Problem
from store.format import records, units


def broker_running(store_dir: Path) -> bool:
    """True when a process holds the store lock (``StoreLock`` takes an exclusive ``flock``)."""
    return flock_held(Path(store_dir) / LOCK_FILE)


def queue_dirs(store_dir: Path, odd: list[Problem] | None = None) -> dict[tuple[str, int], Path]:
    """(topic, queueId) -> its ConsumeQueue directory; other entries of ``consumequeue/`` are appended to ``odd``."""
    return {(t.name, int(q.name)): q for t, q in dump.queue_dirs(Path(store_dir) / "consumequeue", odd)}


def cq_files(qdir: Path) -> list[Path]:
    if not qdir.is_dir():
        return []
    names = (p for p in qdir.iterdir() if p.is_file() and units.is_offset_file_name(p.name))
    return sorted(names, key=lambda p: int(p.name))


def read_units(path: Path) -> np.ndarray:
    """Every whole unit of a ConsumeQueue file (a truncated file yields fewer)."""
    raw = np.fromfile(path, np.uint8)
    return raw[: len(raw) - len(raw) % units.CQ_UNIT_SIZE].view(units.CQ_UNIT_DTYPE)


def dispatched_bound(store_dir: Path) -> int:
    """The highest CommitLog offset any ConsumeQueue unit reaches (the end of that record).

    Dispatch goes through the CommitLog in order, so every record ending at or below it has been
    dispatched to its queue and to the IndexFile; records after it may be mid-dispatch.
    """
    bound = 0
    for qdir in queue_dirs(store_dir).values():
        files = cq_files(qdir)
        for path in reversed(files):  # the last non-empty file holds the queue's newest unit
            in_file = read_units(path)
            used = in_file[(in_file["size"] > 0) & (in_file["size"] != units.CQ_FILL_SIZE)]
            if len(used):
                bound = max(bound, int((used["phy"].astype(np.int64) + used["size"]).max()))
                break
    return bound


def indexed_bound(store_dir: Path) -> int | None:
    """Where the last record the IndexFile has finished ends (None: no index file yet).

    Dispatch builds a record's ConsumeQueue unit *before* its index entries, and writes the index header
    once all of a record's keys are in: the header's ``endPhyOffset`` names the last complete record.
    """
    from pipelines.segment_reader import segment_files

    files = index_files(store_dir)
    if not files:
        return None
    with open(files[-1], "rb") as fh:
        head = fh.read(units.INDEX_HEADER_SIZE)
    if len(head) < units.INDEX_HEADER_SIZE:
        return None
    end = units.decode_index_header(head).end_phy_offset
    seg = next((f for f in reversed(segment_files(store_dir)) if int(f.name) <= end), None)
    if seg is None:
        return None
    with open(seg, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return None
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        pos = end - int(seg.name)
        found = records.step(mm, pos).end
        return end + found - pos if found > pos else None
    finally:
        mm.close()


def index_files(store_dir: Path) -> list[Path]:
    root = Path(store_dir) / "index"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_file() and units.is_index_file_name(p.name))


class LiveIndexFile:
    """A live IndexFile mapped read-only, header decoded, slots and entries as numpy views."""

    def __init__(self, path: Path, hash_slot_num: int, index_num: int) -> None:
        self.path = path
        self.name = path.name
        self.size = path.stat().st_size
        self.expected_size = units.index_file_size(hash_slot_num, index_num)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.raw = np.memmap(path, np.uint8, mode="r") if self.size else np.zeros(0, np.uint8)
        head = bytes(self.raw[: units.INDEX_HEADER_SIZE])
        self.header = units.decode_index_header(head.ljust(units.INDEX_HEADER_SIZE, b"\0"))
        slots_end = units.index_slot_position(hash_slot_num)
        self.slots = self.raw[units.INDEX_HEADER_SIZE : min(slots_end, self.size)]
        whole = len(self.slots) // units.INDEX_SLOT_SIZE * units.INDEX_SLOT_SIZE
        self.slots = self.slots[:whole].view(units.INDEX_SLOT_DTYPE)
        body = self.raw[slots_end:] if self.size > slots_end else np.zeros(0, np.uint8)
        whole = len(body) // units.INDEX_ENTRY_SIZE * units.INDEX_ENTRY_SIZE
        self.entries = body[:whole].view(units.INDEX_ENTRY_DTYPE)

    @property
    def count(self) -> int:
        """Entries in use, per the header, clamped to what the file can hold (entry 0 is never used)."""
        return max(1, min(self.header.index_count, len(self.entries)))

    def slot(self, s: int) -> int:
        return int(self.slots[s]) if s < len(self.slots) else 0

    def entry(self, e: int) -> tuple[int, int, int, int] | None:
        if not 0 < e < len(self.entries):
            return None
        r = self.entries[e]
        return int(r["hash"]), int(r["phy"]), int(r["tdiff"]), int(r["prev"])

    def chain(self, s: int) -> list[int]:
        """Entry numbers reached from slot ``s`` under ``IndexFile.select_phy_offsets``'s rules, newest first."""
        count = self.header.index_count
        nxt = self.slot(s)
        out: list[int] = []
        if nxt <= 0 or nxt > count or count <= 1:
            return out
        seen = set()
        while nxt not in seen:
            e = self.entry(nxt)
            if e is None or e[2] < 0:
                break
            seen.add(nxt)
            out.append(nxt)
            prev = e[3]
            if prev <= 0 or prev > count or prev == nxt:
                break
            nxt = prev
        return out
