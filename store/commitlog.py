"""The CommitLog: one append-only log of every message, in fixed-size segments.

Appends go through one locked section (:meth:`CommitLog.put`, ``putMessageLock``) that hands the segment's end
to a pure encoder from ``store.format``; a slave's copy of its master's bytes (:meth:`CommitLog.append_raw`) is
the only other writer.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from store.errors import MQLakeError
from store.format import appender, msgid, native, records, units
from store.format.buffers import WriteBuffer
from store.format.delay import may_park
from store.format.msgid import Host
from store.mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger(__name__)

# encode(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp) -> bytes written, or minus the
# bytes needed when they would end past limit (see CommitLog.put)
Encoder = Callable[[WriteBuffer, int, int, Any, int, int, int], int]


class ReplicaAppendError(MQLakeError, ValueError):
    """Replicated bytes that cannot go where they say they belong; the message names the file and offsets."""


class AppendStatus(Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    NOT_WRITABLE = "NOT_WRITABLE"


@dataclass(slots=True)
class AppendResult:
    status: AppendStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    store_timestamp: int = 0
    queue_offset: int = 0
    msg_num: int = 1


class CommitLog:
    def __init__(self, directory: Path, file_size: int) -> None:
        self.queue = MappedFileQueue(directory, file_size, preallocate_next=True)
        self.file_size = file_size
        self.put_lock = threading.Lock()
        self.topic_queue_table: dict[str, int] = {}  # "topic-queueId" -> next queue offset
        self.begin_time_in_lock = 0  # when the holder of the put lock took it (RocketMQ's beginTimeInLock), else 0
        self.last_store_timestamp = 0
        self.writable = True  # cleared under put_lock at shutdown, so no append races the unmapping

    # --- append --------------------------------------------------------------------------------------
    def put(self, encode: Encoder, item: Any, key: str, advances: bool, count: int = 1) -> AppendResult:
        """The one append (``CommitLog.asyncPutMessage`` with its ``AppendMessageCallback``): :func:`put`."""
        return put(self, encode, item, key, advances, count)

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        """A slave's append (``appendData``): ``data`` is the master's CommitLog from ``offset``, copied as it is.

        The bytes must continue this log exactly where it ends (an empty log starts at a segment boundary, as
        a master streams a new slave's first bytes from one) and stay inside one segment, as a master's transfer
        never straddles two.  They may end inside a record: dispatch waits for the rest.  Returns the new end.
        """
        n = len(data)
        with self.put_lock:
            if not self.writable:
                raise ReplicaAppendError(f"{self.queue.directory}: CommitLog is closed; {n} bytes at {offset} refused")
            mf = self.queue.last()
            if mf is not None and mf.wrote == 0 and len(self.queue.files) == 1 and offset != mf.file_from_offset:
                # A log with no data yet whose first segment was made ahead (prepare_segment) while the master's
                # bytes start elsewhere (its newest segment): that zero-filled file becomes the segment they need
                mf = self._move_empty_segment(mf, offset)
            if mf is None:
                if offset % self.file_size:
                    raise ReplicaAppendError(
                        f"{self.queue.directory}: an empty CommitLog starts at a segment boundary (a multiple of "
                        f"{self.file_size}), not at {offset}"
                    )
                mf = self.queue.last_or_new(offset)
            elif mf.is_full() and offset == mf.end_offset:
                mf = self.queue.last_or_new()
            if offset != mf.wrote_offset:
                raise ReplicaAppendError(
                    f"{mf.path}: replicated bytes start at offset {offset} but this CommitLog ends at {mf.wrote_offset}"
                )
            if mf.wrote + n > mf.file_size:
                raise ReplicaAppendError(
                    f"{mf.path}: {n} replicated bytes at offset {offset} run past the segment's end {mf.end_offset}"
                )
            mf.view[mf.wrote : mf.wrote + n] = data
            mf.wrote += n
            return mf.wrote_offset

    def _move_empty_segment(self, mf: MappedFile, offset: int) -> MappedFile | None:
        """Rename the lone, empty segment ``mf`` to start at ``offset`` (a segment boundary), keeping its zeros:
        writing a new segment's zeros takes seconds for a 1 GiB one.  None when ``offset`` is not a boundary."""
        if offset % self.file_size:
            return None  # the caller refuses it, naming the offset
        target = self.queue.directory / units.offset_to_file_name(offset)
        with self.queue.lock:
            self.queue.files = []
        mf.close()
        if target.exists():  # the next segment, allocated ahead in the background
            mf.path.unlink(missing_ok=True)
        else:
            os.replace(mf.path, target)
        return self.queue.last_or_new(offset)

    def remove_topic(self, topic: str) -> int:
        """Forget the next queue offsets of ``topic`` (its next message takes offset 0); returns the CommitLog
        offset every earlier record of the topic lies below."""
        prefix = topic + "-"
        with self.put_lock:
            for key in [k for k in self.topic_queue_table if k.startswith(prefix) and k[len(prefix) :].isdigit()]:
                del self.topic_queue_table[key]
            return self.queue.max_offset

    def write_blank(self, mf: MappedFile) -> None:
        """End ``mf`` with a BLANK record over the rest of it (under the put lock): the next put rolls."""
        remaining = mf.file_size - mf.wrote
        mf.view[mf.wrote : mf.wrote + 8] = records.encode_blank(remaining)
        mf.wrote = mf.file_size

    # --- positions -------------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset

    # --- reads -----------------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes | None:
        """``getMessage(offset, size)``: the raw bytes of one record, or None if not here."""
        mf = self.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote:
            return None
        return mf.mm[pos : pos + size]

    def read_record_at(self, offset: int) -> bytes | None:
        """The record starting at ``offset`` (its size read from its own header)."""
        mf = self.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        end = records.step(mf.view[: mf.wrote], pos).end
        return mf.mm[pos:end] if end > pos else None

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        data = self.read(offset, size)
        return records.read_store_timestamp(data, 0) if data else -1

    def flush(self) -> tuple[int, int]:
        """Flush everything appended so far: (flushed offset, store time of the newest flushed record).

        The time is read before the flush, so the checkpoint never claims a record that was not durable.
        """
        ts = self.last_store_timestamp
        return self.queue.flush(), ts

    def close(self) -> None:
        with self.put_lock:
            self.writable = False
        self.queue.close()


def put(cl: CommitLog, encode: Encoder, item: Any, key: str, advances: bool, count: int = 1) -> AppendResult:
    """The one locked section of ``cl``: under its put lock, find the newest segment (rolling to a new one, after
    a BLANK, when the records do not fit), take the queue offset of ``key`` ("topic-queueId") from the queue
    table, have ``encode`` write ``item``'s ``count`` records at the segment's end, and record where they went.
    ``store/_commitlog.pyx`` is its compiled twin.

    ``encode(dest, pos, limit, item, queue_offset, physical_offset, store_timestamp)`` is a pure codec
    (``records.put_record``, ``runs.put_run``, ``appender.put_prepared``): it writes the records into ``dest[pos:]``
    with what only the lock knows back-filled and their first TOTALSIZE and MAGIC last (until then the segment
    holds zeros there, which recovery reads as the end of the log: a process killed mid-append leaves no
    complete-looking record behind), and returns the bytes written; or, writing nothing, minus the bytes it needs
    when they would end past ``limit``.  Half and rollback records (``advances`` false) take queue offset 0 and do
    not advance the queue (``doAppend``).  An encoder's exception leaves the log as it was."""
    with cl.put_lock:
        if not cl.writable:
            return AppendResult(AppendStatus.NOT_WRITABLE)
        store_ts = time.time_ns() // 1_000_000
        cl.begin_time_in_lock = store_ts
        try:
            files = cl.queue.files
            mf = files[-1] if files else None
            if mf is None or mf.wrote >= mf.file_size:
                mf = cl.queue.last_or_new()
            table = cl.topic_queue_table
            queue_offset = table.get(key, 0) if advances else 0
            limit = cl.file_size - records.END_FILE_MIN_BLANK_LENGTH
            for fresh in (False, True):  # at most one roll: a new segment holds whatever fits one
                start = mf.wrote
                base = mf.file_from_offset
                n = encode(mf.view, start, limit, item, queue_offset, base + start, store_ts)
                if n >= 0:
                    break
                if fresh or -n > limit:
                    return AppendResult(AppendStatus.MESSAGE_SIZE_EXCEEDED)
                cl.write_blank(mf)
                mf = cl.queue.last_or_new()
            mf.wrote = start + n
            mf.last_store_timestamp = cl.last_store_timestamp = store_ts
            if advances:
                table[key] = queue_offset + count
        finally:
            cl.begin_time_in_lock = 0
    return AppendResult(AppendStatus.PUT_OK, base + start, n, store_ts, queue_offset, count)


class FastPut:
    """The store's two most common puts, each in one call and never waiting, both through :func:`put`: a single
    plain message (:meth:`put_record`) and a SEND_MESSAGE_V2 from its header's fields (:meth:`put_send`, the
    broker's fast path; in SYNC_FLUSH the broker holds the reply until the group commit covers the record).

    Each tells dispatch (``notify``) and the listeners of the record, or answers None, nothing stored, when the
    store takes no put (``enabled`` false), the message is not one it takes (each method says which) or the
    section refuses it: ``MessageStore``'s general path then answers it.  The compiled twin
    (``_commitlog.pyx``) is the same steps in one C call each, the result and message id included."""

    def __init__(
        self, cl: CommitLog, config: Any, store_host: Host, notify: Callable[[], None], put_result: Callable[..., Any],
        put_ok: Any,
    ) -> None:  # fmt: skip
        self._cl, self._config, self._store_host, self._notify = cl, config, store_host, notify
        self._put_result, self._put_ok = put_result, put_ok  # MessageStore's PutMessageResult and its PUT_OK
        # the codecs' twins as they are when the store is made (the tests choose one before that)
        self._prepare, self._encode_send, self._encode = (
            appender.prepare_send,
            appender.put_prepared,
            records.put_record,
        )
        self.enabled = False  # whether the store takes puts now (running, a master, room on disk)
        self.listeners: list[Callable[[int], None]] = []  # told the new end of the log after each put

    def put_record(self, rec: object) -> Any:
        """``MessageStore.put_nowait`` of one message that needs nothing but the append: its PutMessageResult, or
        None for one the general path must park (delay level, timer), refuse (``MessageStore._check``: an empty
        topic, a body or properties over their limits), or put without a queue offset (half, rollback); also for
        a topic over 127 characters (the general path decides whether it fits) and fields of other types."""
        if not self.enabled or type(rec) is not records.MessageRecord:
            return None
        props, body, topic, sys_flag = rec.properties, rec.body, rec.topic, rec.sys_flag
        if (
            type(props) is not bytes or type(body) is not bytes or type(topic) is not str or type(sys_flag) is not int
            or not 0 < len(topic) <= records.MAX_TOPIC_LENGTH_V1
            or len(body) > self._config.max_message_size or len(props) > records.MAX_PROPERTIES_LENGTH
            or may_park(props) or not records.is_consumable(sys_flag)
        ):  # fmt: skip
            return None
        rec.store_host = self._store_host
        res = self._put(self._encode, rec, f"{rec.topic}-{rec.queue_id}")
        if res is None:
            return None
        return self._put_result(self._put_ok, res, [msgid.create_offset_msg_id(self._store_host, res.wrote_offset)])

    def put_send(
        self, topic: str, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_timestamp: int,
        born_host: Host, reconsume_times: int, cluster: str,
    ) -> tuple[str, int, int, int] | None:  # fmt: skip
        """The record ``runs.encode_message`` makes of the fields (``cluster`` added as the CLUSTER property unless
        there is one): (its offset message id, offset, size, queue offset), or None."""
        if not self.enabled:
            return None
        item = self._prepare(
            topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host, reconsume_times, cluster,
            self._store_host, self._config.max_message_size,
        )  # fmt: skip
        if item is None:
            return None
        res = self._put(self._encode_send, item, f"{topic}-{queue_id}")
        if res is None:
            return None
        offset = res.wrote_offset
        return msgid.create_offset_msg_id(self._store_host, offset), offset, res.wrote_bytes, res.queue_offset

    def _put(self, encode: Encoder, item: Any, key: str) -> AppendResult | None:
        try:
            res = put(self._cl, encode, item, key, True)
        except (OSError, ValueError, struct.error):  # no room for a new segment, a field out of its range
            return None
        if res.status is not AppendStatus.PUT_OK:
            return None
        self._notify()
        end = res.wrote_offset + res.wrote_bytes
        for listener in self.listeners:
            listener(end)
        return res


# The compiled twins (store/_commitlog.pyx) replace them when built; see store.format.native.
native.install(globals(), "store._commitlog", ("put", "FastPut"))


class GroupCommitService(threading.Thread):
    """SYNC_FLUSH: concurrent appenders share one ``fdatasync`` (RocketMQ's GroupCommitService)."""

    def __init__(self, commitlog: CommitLog, on_flushed: Callable[[int], None]) -> None:
        super().__init__(name="group-commit", daemon=True)
        self.commitlog = commitlog
        self.on_flushed = on_flushed
        self._requests: list[tuple[int, Future]] = []
        self._wanted = False  # request(): a commit is owed to a group listener
        self._listeners: list[Callable[[bool, int], None]] = []
        self._lock = threading.Lock()
        self._work = threading.Event()
        self._stopped = threading.Event()

    def submit(self, next_offset: int) -> Future:
        """A future that becomes True once everything before ``next_offset`` is on disk."""
        fut: Future = Future()
        with self._lock:
            self._requests.append((next_offset, fut))
        self._wake()
        return fut

    def request(self) -> None:
        """Ask for a group commit of everything appended so far without a future per put: the group listeners
        hear of it, once per commit (the broker's event loop answers a whole group in one callback)."""
        if self._wanted:
            # A request not yet taken serves this append too: the commit that takes it (the swap under the lock)
            # reads the log's end afterwards.  One lock and wake-up per group instead of per put.
            return
        with self._lock:
            self._wanted = True
        self._wake()

    def add_group_listener(self, listener: Callable[[bool, int], None]) -> None:
        """``listener(ok, offset)``, called on the commit thread after each group commit: when ok, everything
        before ``offset`` is on disk; when not, the fdatasync failed and nothing appended before ``offset`` (the
        end when the flush began) may be acknowledged."""
        self._listeners = [*self._listeners, listener]

    def _wake(self) -> None:
        # set() takes the event's condition lock: skip it while a wake-up is pending (the committer clears the
        # event before it takes the queue, so a request seen as pending here is in that commit or the next)
        if not self._work.is_set():
            self._work.set()
        if self._stopped.is_set():
            self._commit()  # the thread may have made its last commit already

    def run(self) -> None:
        while not self._stopped.is_set():
            # submit() and shutdown() set the event, so an idle SYNC_FLUSH broker need not poll every 10 ms; the
            # timeout is only a safety net. A submit racing clear() is still served: its request is queued
            # before the event is set, and _commit takes the queue after clear().
            self._work.wait(1.0)
            self._work.clear()
            self._commit()
        self._commit()

    def _commit(self) -> None:
        with self._lock:
            reqs, self._requests = self._requests, []
            wanted, self._wanted = self._wanted, False
        if not reqs and not wanted:
            return
        end = self.commitlog.max_offset
        try:
            flushed, ts = self.commitlog.flush()
            self.on_flushed(ts)
        except OSError as e:  # a failed fsync acknowledges nothing
            log.error("group commit flush failed: %s", e)
            for _, fut in reqs:
                fut.set_result(False)
            self._tell(False, end)
            return
        for off, fut in reqs:
            fut.set_result(flushed >= off)
        self._tell(True, flushed)

    def _tell(self, ok: bool, offset: int) -> None:
        for listener in self._listeners:
            try:
                listener(ok, offset)
            except Exception:  # a listener's bug must not stop the commits the other waiters need
                log.exception("group commit listener failed")

    def shutdown(self) -> None:
        self._stopped.set()
        self._work.set()
        self.join()


class FlushRealTimeService(threading.Thread):
    """ASYNC_FLUSH: every interval, flush when enough pages are dirty or a thorough flush is due."""

    def __init__(
        self, commitlog: CommitLog, interval_ms: int, least_pages: int, thorough_ms: int,
        on_flushed: Callable[[int], None],
    ) -> None:  # fmt: skip
        super().__init__(name="flush-commitlog", daemon=True)
        self.commitlog = commitlog
        self.interval = interval_ms / 1000
        self.least_bytes = least_pages * 4096
        self.thorough = thorough_ms / 1000
        self.on_flushed = on_flushed
        self._stopped = threading.Event()
        self._last_thorough = time.monotonic()

    def run(self) -> None:
        while not self._stopped.wait(self.interval):
            now = time.monotonic()
            thorough = now - self._last_thorough >= self.thorough
            if thorough:
                self._last_thorough = now
            if thorough or self.commitlog.queue.dirty_bytes() >= self.least_bytes:
                self._flush()
        self._flush()  # at shutdown, everything

    def _flush(self) -> None:
        try:
            self.on_flushed(self.commitlog.flush()[1])
        except OSError as e:
            log.error("commitlog flush failed: %s", e)

    def shutdown(self) -> None:
        self._stopped.set()
        self.join()
