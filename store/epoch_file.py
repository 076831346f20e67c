"""``<storePathRootDir>/epochFileCheckpoint``: which master epoch wrote which part of the CommitLog (RocketMQ 5's
``EpochFileCache`` through ``CheckpointFile``), for controller mode.

Text, UTF-8: the number of entries, a line; the CRC32 of the entry lines (each with its line separator) masked to
31 bits (``UtilAll.crc32``), a line (0: not checked); then ``epoch-startOffset`` per entry, oldest first.  An entry
ends where the next starts, the last at the log's end.  The previous content is kept as ``<file>.bak``.
"""

from __future__ import annotations

import os
from pathlib import Path

from store.config_files import replace_file
from store.errors import MQLakeError
from store.format.hashing import body_crc32

EPOCH_FILE = "epochFileCheckpoint"

Entry = tuple[int, int]  # (epoch, start offset)


class EpochFileError(MQLakeError):
    """An epoch file that cannot be read; the message names it."""


def _entry_lines(entries: list[Entry]) -> str:
    return "".join(f"{epoch}-{start}{os.linesep}" for epoch, start in entries)


class EpochFile:
    def __init__(self, store_root: Path) -> None:
        self.path = Path(store_root) / EPOCH_FILE
        self.entries: list[Entry] = self._read()

    def _read(self) -> list[Entry]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            count, crc = int(lines[0]), int(lines[1])
            entries = [(int(e), int(s)) for e, _, s in (line.partition("-") for line in lines[2:] if line)]
        except (IndexError, ValueError) as e:
            raise EpochFileError(f"{self.path}: not an epoch file ({e})") from None
        if len(entries) != count:
            raise EpochFileError(f"{self.path}: says {count} entries, holds {len(entries)}")
        if crc and body_crc32(_entry_lines(entries).encode()) != crc:
            raise EpochFileError(f"{self.path}: CRC of the entries does not match {crc}")
        return entries

    def _write(self) -> None:
        body = _entry_lines(self.entries)
        text = f"{len(self.entries)}{os.linesep}{body_crc32(body.encode())}{os.linesep}{body}"
        replace_file(self.path, text.encode(), backup=True)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def append(self, epoch: int, start: int) -> None:
        """A new epoch from ``start`` (entries of this epoch or later are replaced: the controller's word wins)."""
        self.entries = [e for e in self.entries if e[0] < epoch] + [(epoch, start)]
        self._write()

    def truncate_from(self, offset: int) -> None:
        """Drop the entries that start at or past ``offset`` (the log was cut there)."""
        kept = [e for e in self.entries if e[1] < offset]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def entry_for(self, offset: int) -> tuple[int, int, int]:
        """(epoch, start, end) of the entry holding ``offset``; end -1 for the last entry (it grows with the log)."""
        for i in range(len(self.entries) - 1, -1, -1):
            epoch, start = self.entries[i]
            if start <= offset:
                end = self.entries[i + 1][1] if i + 1 < len(self.entries) else -1
                return epoch, start, end
        raise EpochFileError(f"{self.path}: no epoch holds offset {offset} (first starts at {self.entries[0][1]})"
                             if self.entries else f"{self.path}: no epoch yet")  # fmt: skip


def consistent_point(mine: list[Entry], my_end: int, theirs: list[Entry], their_end: int) -> int:
    """``findConsistentPoint``: the newest epoch both histories hold with the same start; the log is common up to the
    earlier of its two ends.  -1 when none is shared (the logs have nothing in common)."""
    def ends(entries: list[Entry], last_end: int) -> dict[int, tuple[int, int]]:
        return {e: (s, entries[i + 1][1] if i + 1 < len(entries) else last_end) for i, (e, s) in enumerate(entries)}

    their = ends(theirs, their_end)
    for epoch, (start, end) in sorted(ends(mine, my_end).items(), reverse=True):
        other = their.get(epoch)
        if other is not None and other[0] == start:
            return min(end, other[1])
    return -1
