"""The Python side of the compiled dispatch loop (``store/_dispatch.pyx``): what it needs per run.

The loop takes runs of records with the GIL released; this module does what only Python can: registering each
queue's current ConsumeQueue file and the current IndexFile with it (after the reference path created or rolled
them), holding the IndexService's lock over a run, and feeding the segment statistics.  The reput service
(``store.dispatch``) hands every record the loop stops at to the reference, its per-record Python path, then
calls :meth:`CompiledDispatch.after_reference` so the loop sees the files the reference used.

``MQLAKE_NO_EXTENSIONS=1`` (or a build without the extension) leaves every record to the reference path;
``MQLAKE_DISPATCH=reference`` does so for dispatch alone (an A/B of the loop with the compiled codec kept).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from store.format import native, records

if TYPE_CHECKING:
    from store.dispatchers import BuildConsumeQueue, SegmentStats
    from store.index import IndexService
    from store.mapped_file import MappedFile

EXTENSION = "store._dispatch"
ENV_DISPATCH = "MQLAKE_DISPATCH"
ENV_HOLD_GIL = "MQLAKE_DISPATCH_HOLD_GIL"  # 0: every run releases the GIL (an A/B of HOLD_GIL_BYTES)
_chosen = None if os.environ.get(ENV_DISPATCH, "") == "reference" else native.compiled_module(EXTENSION)
# Loaded even when switched off, as native.install keeps the codec twins: the differential tests run both.
_built = native.load_extension(EXTENSION)[0]
RUN_RECORDS = 1024  # records per run at most: the IndexService's lock is held that long
# A run over at most this many bytes (and records) keeps the GIL: after a run with the GIL released the reput
# thread must take it back from the event loop, which holds it until it polls or a switch interval (5 ms) ends.
# Traced at 20 k msgs/s, that wait was the run's p90 3.6 ms and p99 9.6 ms, while a run of 1 KiB records costs
# about 0.5 us a record; so short runs (a read of single sends' worth) keep it, and a backlog still runs GIL-free.
# 16 KiB, not more: a batch of 32 x 1 KiB (36 KiB) held the GIL with a 256 KiB bound and took the loop's turn,
# 229-287 k batched msgs/s against 334-346 k with 16 KiB (quiet, alternated; docs/benchmarks.md).
HOLD_GIL_BYTES = 16 * 1024
HOLD_GIL_RECORDS = 256


def available() -> bool:
    """Whether the store dispatches with the compiled loop: built and not switched off."""
    return _chosen is not None


def built() -> bool:
    """Whether the compiled loop is built (tests may run it while MQLAKE_NO_EXTENSIONS is set)."""
    return _built is not None


class CompiledDispatch:
    """The compiled loop over one store's ConsumeQueues and IndexService."""

    def __init__(self, build_cq: BuildConsumeQueue, index: IndexService | None) -> None:
        if _built is None:
            raise RuntimeError(f"{EXTENSION} is not built ({native.missing_cause}); run `make install`")
        self._build_cq = build_cq
        self._index = index
        self._loop: Any = _built.DispatchLoop(index is not None)
        self._generation = -1  # of build_cq's deleted topics, when the queues were registered
        self._index_file: object = None
        self.dispatched = 0  # records this loop took (the rest went to the reference)
        self.dispatched_holding_gil = 0  # of which in short runs that kept the GIL
        self.hold_gil = os.environ.get(ENV_HOLD_GIL, "1") != "0"  # short runs keep the GIL (HOLD_GIL_BYTES)

    def run(
        self, mf: MappedFile, pos: int, end: int, max_records: int | None, stats: SegmentStats,
        listeners: Sequence[Callable[..., None]],
    ) -> tuple[int, int]:  # fmt: skip
        """Dispatch from ``pos`` of segment ``mf`` up to ``end`` or the first record the reference must take;
        returns (where it stopped, records dispatched)."""
        if self._generation != self._build_cq.generation:
            self._loop.clear_targets()  # a deleted topic's queues are gone
            self._generation = self._build_cq.generation
        loop = self._loop
        lock = self._index.lock if self._index is not None else contextlib.nullcontext()
        done = 0
        while pos < end and (max_records is None or done < max_records):
            want = RUN_RECORDS if max_records is None else min(RUN_RECORDS, max_records - done)
            hold = self.hold_gil and end - pos <= HOLD_GIL_BYTES
            if hold:
                want = min(want, HOLD_GIL_RECORDS)
            with lock:
                self._refresh_index()
                new = loop.run(mf.mm, pos, end, want, not hold)
            loop.notify(listeners)  # outside the lock: a listener may be slow
            n = loop.count
            if n == 0:
                break
            done += n
            self.dispatched += n
            if hold:
                self.dispatched_holding_gil += n
            pos = new
            if stats.first_store_time is None:
                stats.first_store_time = loop.first_ts
            stats.last_store_time = loop.last_ts
            stats.count += n
            if loop.cq_written:
                self._build_cq.last_store_timestamp = loop.last_cq_ts
            if new < end and n < want:
                break  # a record for the reference
        return pos, done

    def after_reference(self, request: records.DispatchRequest) -> None:
        """The reference dispatched ``request``: register the queue file it wrote to (a queue's first record, a
        rolled file), or keep the queue with the reference while the loop cannot take it."""
        if self._index is not None:
            with self._index.lock:  # the reference may have written to the IndexFile, or rolled it
                self._index_file = None
                self._refresh_index()  # and a rolled one is let go at once: retention may close it
        if not request.consumable:
            return
        topic, queue_id = request.topic, request.queue_id
        cq = self._build_cq.queues.find(topic, queue_id, create=False)
        mf = cq.queue.last() if cq is not None else None
        if (
            cq is None or mf is None or topic in self._build_cq.deleted_topics
            or not topic.isascii()  # the loop matches topics by their bytes; the reference decodes them
            or (mf.wrote == 0 and len(cq.queue.files) == 1)  # a queue's first unit may need fillers first
        ):  # fmt: skip
            self._loop.set_target(topic, queue_id)
            return
        if cq.min_logic_offset == 0 and len(cq.queue.files) == 1 and mf.file_from_offset > 0:
            cq.min_logic_offset = mf.file_from_offset  # as ConsumeQueue.put after each unit
        self._loop.set_target(topic, queue_id, cq, mf)

    def _refresh_index(self) -> None:
        """The IndexService's last file, when it changed (the reference created or rolled one)."""
        if self._index is None:
            return
        last = self._index.files[-1] if self._index.files else None
        if last is not self._index_file:
            self._loop.set_index(last)
            self._index_file = last

    def close(self) -> None:
        """Release the mapped files the loop holds, before the store closes them."""
        self._loop.close()
        self._index_file = None
