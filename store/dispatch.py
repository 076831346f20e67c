"""Reput: read the CommitLog behind the appender and hand every record to the dispatchers.

As RocketMQ wires it (``ReputMessageService``, ``CommitLogDispatcher``): the reput service knows only the
CommitLog and a list of dispatchers, each told of every record in CommitLog order — building the ConsumeQueue
and the IndexFile (``store.dispatchers``); schedule, transaction and HA hooks register the same way.  The
long-polling wake-ups (arrival listeners) stay with the reput service, called once a record is dispatched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from store import names
from store.commitlog import CommitLog
from store.dispatch_loop import CompiledDispatch, available, built
from store.dispatchers import BuildConsumeQueue, BuildIndex, CommitLogDispatcher, SegmentStats, count_records
from store.format import delay, records
from store.mapped_file import MappedFile

log = logging.getLogger(__name__)

# topic, queueId, the offset after the newest arrived record, the tags codes of the arrived records in queue order
# (they hold the offsets just before it), the newest one's store time: one call per queue for a run of records
ArrivalListener = Callable[[str, int, int, tuple[int, ...], int], None]


class ReputService(threading.Thread):
    """``ReputMessageService``: follows the CommitLog from ``reput_from`` and dispatches each record."""

    def __init__(
        self, commitlog: CommitLog, dispatchers: Sequence[CommitLogDispatcher], *,
        delay_millis: list[int] = delay.DEFAULT_DELAY_MILLIS, replica: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(name="reput", daemon=True)
        self.commitlog = commitlog
        self.dispatchers = list(dispatchers)
        self.delay_millis = delay_millis
        # A slave's log (a replica) may end inside a record whose rest is on its way; a master's never does, and
        # there such a record is damage, passed over as before
        self.replica = replica
        self.reput_from = 0
        self._listeners: list[ArrivalListener] = []  # replaced, never changed in place: dispatch reads it unlocked
        self._listeners_lock = threading.Lock()
        self._stopped = threading.Event()
        self._appended = threading.Event()
        self._reput_lock = threading.Lock()
        self._pause_wanted = threading.Event()  # a pass stops at the next segment boundary and lets it in
        self.quarantined = 0  # records left undispatched because of their name (_quarantine)
        self.sealed_stats: dict[int, SegmentStats] = {}  # base offset -> stats of finished segments
        self._current: tuple[int, SegmentStats] | None = None
        # Runs of records by the compiled loop (store/_dispatch.pyx), the rest by the per-record reference
        # below; False (or MQLAKE_NO_EXTENSIONS=1, or no build) keeps every record on the reference.
        self.use_compiled = available()
        self._compiled: CompiledDispatch | None = None
        self._compiled_key: tuple[int, ...] | None = None

    def set_reput_from(self, offset: int) -> None:
        """Where dispatch starts (recovery decides), before the service runs."""
        self.reput_from = offset
        self._current = None
        self._compiled_key = None  # files may have been truncated or rebuilt: register them afresh
        mf = self.commitlog.queue.find(offset)
        if mf is not None and offset > mf.file_from_offset:
            self._stats_for(mf.file_from_offset, offset - mf.file_from_offset)  # at start-up, not on a put

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        """Called from the dispatch thread each time messages become readable (long-polling wake-ups): once per
        queue for the records of one pass of the compiled loop, once per record on the reference path."""
        with self._listeners_lock:
            self._listeners = [*self._listeners, listener]

    def remove_arrival_listener(self, listener: ArrivalListener) -> None:
        """Stop calling ``listener`` (added twice, it is removed once); a record being dispatched at this moment
        may still reach it, no later one does."""
        with self._listeners_lock:
            listeners = list(self._listeners)
            if listener in listeners:
                listeners.remove(listener)
            self._listeners = listeners

    @property
    def behind_bytes(self) -> int:
        return self.commitlog.max_offset - self.reput_from

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._appended.clear()  # before the pass, so an append during it wakes the next wait at once
                if self.do_reput() == 0:
                    # Woken by each append rather than napping 1 ms as RocketMQ does: an idle broker then costs no
                    # CPU and, under load, the thread takes the GIL only when there is work.  The timeout is a net.
                    self._appended.wait(0.2)
            except Exception:  # keep dispatching; a bug here must not silently stop consumers forever
                log.exception("reput failed at offset %d", self.reput_from)
                self._stopped.wait(1.0)

    def notify_appended(self) -> None:
        if not self._appended.is_set():
            self._appended.set()

    def do_reput(self, limit: int | None = None) -> int:
        """Dispatch what is available now; returns the number of records dispatched."""
        with self._reput_lock:  # start-up, shutdown and the thread itself may all call this
            return self._do_reput(limit)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold dispatch for the block: no record is dispatched while it runs (a pass under way stops at the end of
        the segment it reads; records appended meanwhile are dispatched afterwards, in order)."""
        self._pause_wanted.set()
        try:
            with self._reput_lock:
                self._pause_wanted.clear()
                yield
        finally:
            self.notify_appended()  # the thread may have gone to sleep on its early return

    def _compiled_loop(self) -> CompiledDispatch | None:
        """The compiled loop for the dispatchers as they are now: only the store's own two (ConsumeQueue, then
        IndexFile) have a compiled form; any other dispatcher keeps every record on the reference path."""
        key = tuple(map(id, self.dispatchers)) if self.use_compiled else ()
        if key != self._compiled_key:
            if self._compiled is not None:
                self._compiled.close()
            self._compiled_key, self._compiled = key, None
            kinds = [type(d) for d in self.dispatchers]
            if self.use_compiled and built() and kinds in ([BuildConsumeQueue], [BuildConsumeQueue, BuildIndex]):
                index = self.dispatchers[1].index if len(kinds) == 2 else None  # type: ignore[attr-defined]
                self._compiled = CompiledDispatch(self.dispatchers[0], index)  # type: ignore[arg-type]
        return self._compiled

    def close(self) -> None:
        """Release the files the compiled loop holds mapped (after the last pass, before the store closes them)."""
        with self._reput_lock:
            if self._compiled is not None:
                self._compiled.close()
            self._compiled_key, self._compiled = None, None

    def _do_reput(self, limit: int | None) -> int:
        cl = self.commitlog
        compiled = self._compiled_loop()
        done = 0
        while self.reput_from < cl.max_offset and (limit is None or done < limit) and not self._pause_wanted.is_set():
            if self.reput_from < cl.min_offset:
                self.reput_from = cl.min_offset
            mf = cl.queue.find(self.reput_from)
            if mf is None:
                break
            base = mf.file_from_offset
            stats = self._stats_for(base, self.reput_from - base)
            end = mf.wrote
            pos, n, arriving = self._dispatch_segment(mf, self.reput_from - base, end, limit, done, stats, compiled)
            done += n
            self.reput_from = base + pos
            if pos >= mf.file_size:
                self._seal(base, stats)
            elif pos >= end or arriving:
                break
        return done

    def _dispatch_segment(
        self, mf: MappedFile, pos: int, end: int, limit: int | None, done: int, stats: SegmentStats,
        compiled: CompiledDispatch | None,
    ) -> tuple[int, int, bool]:  # fmt: skip
        """Dispatch segment ``mf`` from ``pos`` up to ``end``: runs of records by the compiled loop, when there is
        one, and each record it stops at by the reference, per record.  Returns (where dispatch stopped, records
        dispatched, whether a replica's record is still arriving there)."""
        check = records.check_record
        delay_millis = self.delay_millis
        dispatchers = [d.dispatch for d in self.dispatchers]
        buf = mf.view[:end]  # a slave's log may end inside a record: the walk must not read past ``wrote``
        start_done = done
        while True:
            if compiled is not None:
                pos, n = compiled.run(mf, pos, end, None if limit is None else limit - done, stats, self._listeners)
                done += n
                if pos >= end or done == limit:
                    return pos, done - start_done, False
            # The reference: every record without the compiled loop, else the one it stopped at.
            walk = records.RecordWalk(buf, pos, end, 1 if compiled is not None else None if limit is None else
                                      limit - done)  # fmt: skip
            for pos, size in walk:
                res = check(buf, pos, check_crc=False, delay_millis=delay_millis, size=size)
                req = res.request
                if req is None:  # a record that fails its checks (given the walk's size, never a BLANK)
                    # RocketMQ stops here too; recovery deals with it at the next start
                    log.error("%s: unreadable record at position %d during dispatch: %s", mf.path, pos, res.reason)
                    return end, done - start_done, False
                try:
                    for dispatch in dispatchers:
                        dispatch(req)
                except names.IllegalName as e:
                    self._quarantine(req, e)
                else:
                    if req.consumable:
                        for listener in self._listeners:  # read per record: additions and removals count at once
                            listener(req.topic, req.queue_id, req.queue_offset + 1, (req.tags_code,),
                                     req.store_timestamp)  # fmt: skip
                stats.count += 1
                if stats.first_store_time is None:
                    stats.first_store_time = req.store_timestamp
                stats.last_store_time = req.store_timestamp
                done += 1
                if compiled is not None:
                    compiled.after_reference(req)
            pos = walk.end
            if walk.ended is records.WalkEnd.BLANK:
                return mf.file_size, done - start_done, False
            if walk.ended is records.WalkEnd.LIMIT or pos >= end:
                if compiled is not None and pos < end and done != limit:
                    continue  # back to the compiled loop after the record it stopped at
                return pos, done - start_done, False
            # zeros or bad bytes before the end
            if self.replica and records.record_incomplete_at(buf, pos):
                return pos, done - start_done, True  # the rest of a replicated record is still on its way
            log.error("%s: unreadable record at position %d during dispatch: %s", mf.path, pos, walk.reason)
            return end, done - start_done, False

    def _quarantine(self, req: records.DispatchRequest, error: names.IllegalName) -> None:
        """A record whose topic cannot name a queue directory: left out of every queue and index, logged, counted;
        dispatch goes on with the next record, so one bad record never holds back the ones after it."""
        self.quarantined += 1
        log.error("record at CommitLog offset %d (topic %r, queue %d) quarantined, not dispatched: %s",
                  req.commitlog_offset, req.topic, req.queue_id, error)  # fmt: skip

    def _stats_for(self, base: int, pos: int) -> SegmentStats:
        if self._current is None or self._current[0] != base:
            stats = SegmentStats(complete=pos == 0)
            mf = self.commitlog.queue.find(base)
            if pos > 0 and mf is not None:
                # Dispatch starts mid-segment (after a restart): count what lies before from the headers,
                # so the segment still gets its figures when it is sealed.
                stats = count_records(mf.mm, pos)
            self._current = (base, stats)
        return self._current[1]

    def _seal(self, base: int, stats: SegmentStats) -> None:
        if stats.complete:
            self.sealed_stats[base] = stats
        self._current = None

    def shutdown(self) -> None:
        self._stopped.set()
        self._appended.set()
        if self.is_alive():
            self.join()
