"""The single put's common case as one call: checks, the put lock, the segment, the queue offset, the record
encoded in place, the result (the Python reference; ``store/format/_appender.pyx`` is its compiled twin).
:meth:`Appender.put_send` does the same for a SEND_MESSAGE_V2 from the fields of its header (the broker's fast
path), answering only what the reply needs.

``MessageStore.put_message`` costs a few microseconds of Python around one native encode when it is spread over
the facade, the CommitLog and their result objects; an :class:`Appender` does all of it in one call and so lets a
compiled twin do it in one native call.  It takes only the plain case and declines (returns None, having written
nothing and changed nothing) any other, which the store's general path then puts as before: the appender is off
(the store is not running, a slave, its disk full, or, for ``put`` whose caller waits for the flush, in
SYNC_FLUSH: see ``MessageStore``), a message that may be
parked (delay level, timer), a half or rollback message, a topic that is empty or needs the V2 record, a body or
properties over their limits, an explicit magic or body CRC, a field out of its range, no segment yet, or a record
the segment has no room for (the general path writes the BLANK and rolls; the next put finds the new segment).

State: nothing of the log is copied in.  Each put reads the newest segment (``queue.files[-1]``) and its write
position under the put lock, so the general path, replication and recovery may change them at any time; the
compiled twin holds the GIL from the lock to the last back-filled field, so no other Python code runs while it
appends (and so it leaves ``CommitLog.begin_time_in_lock`` alone: no reader could see it set).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

from store.format import native, properties, records, runs
from store.format.delay import may_park
from store.format.msgid import Host, create_offset_msg_id


def plain(rec: records.MessageRecord, max_body: int) -> bool:
    """Whether the appender takes ``rec`` (before looking at the log): see the module's docstring."""
    props, body, topic, sys_flag = rec.properties, rec.body, rec.topic, rec.sys_flag
    if (
        type(props) is not bytes or type(body) is not bytes or type(topic) is not str or not topic
        or len(body) > max_body or len(props) > records.MAX_PROPERTIES_LENGTH
        or may_park(props)
        or rec.magic is not None or rec.body_crc is not None
        or type(sys_flag) is not int or not -(1 << 31) <= sys_flag < 1 << 31 or not records.is_consumable(sys_flag)
    ):  # fmt: skip
        return False
    if len(topic) > records.MAX_TOPIC_LENGTH_V1 // 4 and len(topic.encode("utf-8")) > records.MAX_TOPIC_LENGTH_V1:
        return False  # (a character is at most 4 bytes of UTF-8)
    # integers, as the compiled twin's reader takes them (out of their ranges, put_record raises struct.error)
    return (
        int is type(rec.queue_id) is type(rec.flag) is type(rec.reconsume_times) is type(rec.born_host[1])
        is type(rec.born_timestamp) is type(rec.prepared_transaction_offset) is type(rec.queue_offset)
        is type(rec.physical_offset) is type(rec.store_timestamp)
    )  # fmt: skip


class Appender:
    """Puts a store's plain single messages (the module's docstring says which); ``put`` returns the store's
    result, or None to decline.

    ``commitlog`` is the store's CommitLog (its ``queue.files``, ``put_lock``, ``topic_queue_table``, ``writable``
    and ``last_store_timestamp`` are used as the CommitLog's own append does); ``config`` gives
    ``max_message_size``, read on every put; ``notify`` wakes dispatch after a put; ``put_result`` and
    ``append_result`` are the store's result classes, built as ``put_result(put_ok, append_result(append_ok,
    offset, size, store time, queue offset, 1), [offset message id], "")``.  ``enabled`` is the store's switch
    for ``put``, ``sends_enabled`` for ``put_send`` (which never waits, so SYNC_FLUSH leaves it on: the broker
    holds the reply until the group commit covers the record); ``listeners`` are called with the new end of the
    log after each put, as the store's append listeners are.
    """

    def __init__(
        self, commitlog: Any, config: Any, store_host: Host, notify: Callable[[], None],
        put_result: Callable[..., Any], append_result: Callable[..., Any], put_ok: object, append_ok: object,
    ) -> None:  # fmt: skip
        self._commitlog = commitlog
        self._config = config
        self._store_host = store_host
        self._notify = notify
        self._results = (put_result, append_result, put_ok, append_ok)
        self.enabled = False
        self.sends_enabled = False
        self.listeners: list[Callable[[int], None]] = []

    def put(self, rec: records.MessageRecord) -> Any:
        if not self.enabled or type(rec) is not records.MessageRecord:  # the compiled twin reads its slots
            return None
        rec.store_host = self._store_host  # as the general path does, whether or not this one takes it
        if not plain(rec, self._config.max_message_size):
            return None
        wrote = self._write(rec)
        if wrote is None:
            return None
        offset, n, store_ts, queue_offset = wrote
        put_result, append_result, put_ok, append_ok = self._results
        append = append_result(append_ok, offset, n, store_ts, queue_offset, 1)
        return put_result(put_ok, append, [create_offset_msg_id(self._store_host, offset)], "")

    def put_send(
        self, topic: str, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_timestamp: int,
        born_host: Host, reconsume_times: int, cluster: str,
    ) -> tuple[str, int, int, int] | None:  # fmt: skip
        """A sent message's put from its header's fields (``send_codec.read_send_v2``): the record
        ``runs.encode_message`` makes of them (``cluster`` added as the CLUSTER property unless there is one),
        written as ``put`` writes one; (its offset message id, offset, size, queue offset), or None to decline
        where ``put`` declines (and for arguments of other types), nothing written: the caller's general path
        (``MessageStore.put_run_nowait``) then rolls, refuses or answers with the error."""
        if not self.sends_enabled or not (
            type(topic) is str and type(queue_id) is int and type(body) is bytes and type(props) is bytes
            and type(flag) is int and type(sys_flag) is int and type(born_timestamp) is int
            and type(born_host) is tuple and len(born_host) == 2 and type(born_host[0]) is str
            and type(born_host[1]) is int and type(reconsume_times) is int and type(cluster) is str
        ):  # fmt: skip
            return None
        try:
            props = runs.with_property(props, properties.PROPERTY_CLUSTER, cluster)
        except ValueError:  # a cluster name that is not UTF-8: encode_message raises it too
            return None
        rec = records.MessageRecord(
            topic=topic, queue_id=queue_id, body=body, properties=props, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_timestamp, born_host=born_host, store_host=self._store_host,
            reconsume_times=reconsume_times,
        )  # fmt: skip
        if not plain(rec, self._config.max_message_size):
            return None
        try:
            wrote = self._write(rec)
        except ValueError:  # an address pack_ip refuses (raised before anything is written)
            return None
        if wrote is None:
            return None
        offset, n, _, queue_offset = wrote
        return create_offset_msg_id(self._store_host, offset), offset, n, queue_offset

    def _write(self, rec: records.MessageRecord) -> tuple[int, int, int, int] | None:
        """``rec`` (a plain one) written at the end of the newest segment: (offset, size, store time, queue offset),
        dispatch and the listeners told; None, nothing written, when the log takes no put or has no room."""
        cl = self._commitlog
        key = f"{rec.topic}-{rec.queue_id}"
        with cl.put_lock:
            files = cl.queue.files
            if not cl.writable or not files:
                return None
            mf = files[-1]
            start = mf.wrote
            base = mf.file_from_offset
            store_ts = time.time_ns() // 1_000_000
            queue_offset = cl.topic_queue_table.get(key, 0)
            limit = mf.file_size - records.END_FILE_MIN_BLANK_LENGTH
            if limit > len(mf.view) or start < 0:
                return None
            try:
                n = records.put_record(mf.view, start, limit, rec, queue_offset, base + start, store_ts)
            except struct.error:
                return None  # a field out of its range, found before anything was written: the compiled reader's
            if n < 0:
                return None
            mf.wrote = start + n
            mf.last_store_timestamp = cl.last_store_timestamp = store_ts
            cl.topic_queue_table[key] = queue_offset + 1
        self._notify()
        end = base + start + n
        for listener in self.listeners:
            listener(end)
        return base + start, n, store_ts, queue_offset


# The compiled twin (store/format/_appender.pyx) replaces it when it is built; see store.format.native.
native.install(globals(), "store.format._appender", ("Appender",))
