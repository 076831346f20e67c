"""Where a consumer walking a tiered queue reads next: after a pull, the reader notes that the queue's next offset
is at a known position of a cached row group, so the next pull from that offset slices its records without
searching the snapshot's row groups again.

A cursor belongs to one snapshot (it is kept in the snapshot's own table, so a new snapshot starts with none)
and covers only offsets it was proved exact for: a run of consecutive queue offsets in one row group that no
other row group of the snapshot also holds.  Past its limit, or for any pull it does not match, the reader
takes its full path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

MAX_CURSORS = 4096  # positions remembered per snapshot; past this the table starts again (memory stays bounded)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Queue offset ``offset`` is at sorted position ``position`` of row group ``group`` (the reader's (file,
    index) of it: the cursor does not hold the decoded rows, which stay under the cache's bound); every offset
    from ``offset`` below ``limit`` follows at the next position, and no other row group holds one."""

    group: tuple[Any, int]
    offset: int
    position: int
    limit: int

    def advanced(self, count: int) -> Cursor | None:
        """The cursor ``count`` offsets on (None: that is past what this one covers)."""
        offset = self.offset + count
        return Cursor(self.group, offset, self.position + count, self.limit) if offset < self.limit else None


class Cursors:
    """A snapshot's cursors by (topic, queue id, offset); any number of consumers, each at its own offset, and
    two at the same offset share one.  Thread-safe."""

    def __init__(self) -> None:
        self._by_offset: dict[tuple[str, int, int], Cursor] = {}
        self._lock = threading.Lock()

    def find(self, topic: str, queue_id: int, offset: int) -> Cursor | None:
        return self._by_offset.get((topic, queue_id, offset))

    def keep(self, topic: str, queue_id: int, cursor: Cursor | None) -> None:
        if cursor is None:
            return
        with self._lock:
            if len(self._by_offset) >= MAX_CURSORS:
                self._by_offset.clear()  # positions of consumers long gone; the live ones come back on their next pull
            self._by_offset[(topic, queue_id, cursor.offset)] = cursor

    def __len__(self) -> int:
        return len(self._by_offset)
