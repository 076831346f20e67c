"""The CommitLog's dispatchers (RocketMQ's ``CommitLogDispatcher`` implementations): what the reput service
(``store.dispatch``) tells of every record it reads, and the per-segment statistics it gathers on the way."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Protocol

from store.consume_queue import ConsumeQueueTable
from store.format import records
from store.index import IndexService


class CommitLogDispatcher(Protocol):
    """``CommitLogDispatcher``: told of every record the reput service reads, in CommitLog order."""

    def dispatch(self, request: records.DispatchRequest) -> None: ...


class BuildConsumeQueue:
    """``CommitLogDispatcherBuildConsumeQueue``: a unit for each normal or committed record."""

    def __init__(self, queues: ConsumeQueueTable) -> None:
        self.queues = queues
        self._find = queues.find
        self.last_store_timestamp = 0  # of the newest unit: the checkpoint's logicsMsgTimestamp
        # Deleted topics -> CommitLog offset their records reached at deletion: older records of theirs are not
        # dispatched, else they would re-create the queue at an old offset (pre-blank filled) and a re-created
        # topic's own records, numbered from 0 again, would count as already built and be dropped.
        self._deleted: dict[str, int] = {}
        self.generation = 0  # counts forget_topic calls: the compiled loop drops the queues it registered

    @property
    def deleted_topics(self) -> dict[str, int]:
        return self._deleted

    def forget_topic(self, topic: str, end: int) -> None:
        """Skip the records of ``topic`` below CommitLog offset ``end`` (call it while dispatch is paused)."""
        self._deleted[topic] = end
        self.generation += 1

    def _of_deleted_topic(self, request: records.DispatchRequest) -> bool:
        end = self._deleted.get(request.topic)
        if end is None:
            return False
        if request.commitlog_offset < end:
            return True
        del self._deleted[request.topic]  # dispatch runs in CommitLog order: every later record is the new topic's
        return False

    def dispatch(self, request: records.DispatchRequest) -> None:
        if request.consumable:
            if self._deleted and self._of_deleted_topic(request):
                return
            cq = self._find(request.topic, request.queue_id)
            cq.put(request.commitlog_offset, request.msg_size, request.tags_code, request.queue_offset)
            self.last_store_timestamp = request.store_timestamp


class BuildIndex:
    """``CommitLogDispatcherBuildIndex``: the record's UNIQ_KEY and KEYS into the IndexFile."""

    def __init__(self, index: IndexService) -> None:
        self.index = index
        self._build = index.build_index

    def dispatch(self, request: records.DispatchRequest) -> None:
        self._build(request)


@dataclass(slots=True)
class SegmentStats:
    """What dispatch learns about one CommitLog segment; complete only if it saw the whole file."""

    count: int = 0
    first_store_time: int | None = None
    last_store_time: int | None = None
    complete: bool = False


def count_records(buf: bytes | bytearray | memoryview | mmap.mmap, end: int) -> SegmentStats:
    """Walk record headers from the start of a segment up to ``end`` (or its BLANK)."""
    stats = SegmentStats()
    walk = records.RecordWalk(buf, 0, end)
    for pos, _size in walk:
        ts = records.read_store_timestamp(buf, pos)
        if stats.first_store_time is None:
            stats.first_store_time = ts
        stats.last_store_time = ts
        stats.count += 1
    # Anything but a BLANK or the end leaves the figures incomplete: ``end`` was not a record boundary.
    stats.complete = walk.ended is records.WalkEnd.BLANK or walk.end == end
    return stats
