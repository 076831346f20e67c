"""Transactional messages as RocketMQ stores them (``TransactionalMessageBridge``, ``TransactionalMessageUtil``):
half messages in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, op messages (tag ``d``, body = the half's queue offset) in
``RMQ_SYS_TRANS_OP_HALF_TOPIC``, and which half messages are resolved.

Everything here is a pure record transformation or in-memory state rebuilt from the op topic: the CommitLog holds
every half message and every resolution, so a restart (or SIGKILL) loses nothing.

A half message re-put for a check-back keeps the queue offset of the half message it descends from in
``TRAN_PREPARED_QUEUE_OFFSET`` (Java sets it only on an immunity re-put; here on every re-put). Resolving a copy
writes an op for the copy and one for its origin, so every copy of one transaction is resolved at once: neither a
late END_TRANSACTION for the original nor a check-back answer for another copy can deliver the message twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from store import names
from store.constants import TRANS_CHECK_MAX_TIME_TOPIC as CHECK_MAX_TIME_TOPIC
from store.constants import TRANS_OP_HALF_TOPIC as OP_TOPIC
from store.format import properties, records
from store.format import transaction as tx_format
from store.format.transaction import HALF_QUEUE_ID, HALF_TOPIC, PROPERTY_TRANSACTION_ID
from store.schedule import may_park

log = logging.getLogger(__name__)

__all__ = ["HALF_QUEUE_ID", "HALF_TOPIC", "PROPERTY_TRANSACTION_ID"]  # re-exported: the broker's names for them

REMOVE_TAG = "d"
OFFSET_SEPARATOR = ","



def _append(props: bytes, values: dict[str, str]) -> bytes:
    # Appended after the client's own: decoding keeps the last value of a name, as Java's map put would.
    return properties.append_properties(props, values)


def to_half(rec: records.MessageRecord) -> records.MessageRecord:
    """``parseHalfMessageInner``: park a prepared message in the half topic with its real topic and queue.
    ``rec`` is a message as a send builds it (no offsets, store time or CRC yet). The send fast path encodes the
    same record in one call (``store.format.transaction.encode_half``)."""
    # Built field by field rather than with dataclasses.replace, which costs four times as much (once per half).
    return records.MessageRecord(
        topic=HALF_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=rec.body,
        properties=tx_format.half_properties(rec.properties, rec.topic, rec.queue_id),
        flag=rec.flag,
        sys_flag=tx_format.half_sys_flag(rec.sys_flag),
        born_timestamp=rec.born_timestamp,
        born_host=rec.born_host,
        store_host=rec.store_host,
        reconsume_times=rec.reconsume_times,
        prepared_transaction_offset=rec.prepared_transaction_offset,
    )


@dataclass(slots=True)
class StoredHalf:
    """A stored half message as END_TRANSACTION reads it: its record's bytes (the committed message is rewritten
    from them, ``tx_format.commit_record``) and the fields it checks; the properties are decoded on first use."""

    raw: bytes  # the record as stored, or as the send encoded it (offsets and store time not yet filled in)
    physical_offset: int
    queue_offset: int
    store_timestamp: int
    born_timestamp: int
    _properties: bytes | None = field(default=None, repr=False)  # read from ``raw`` when None
    _props: dict[str, str] | None = field(default=None, repr=False)
    parks: bool = False  # could its properties delay it (``may_park``): the send fast path takes none that do

    @property
    def properties(self) -> bytes:
        if self._properties is None:
            self._properties = records.record_properties(self.raw)
        return self._properties

    @property
    def property_map(self) -> dict[str, str]:
        if self._props is None:
            self._props = properties.decode_properties(self.properties)
        return self._props

    @classmethod
    def of(cls, rec: records.MessageRecord, raw: bytes) -> StoredHalf:
        """``rec`` as stored (offsets and store time set), ``raw`` its record."""
        return cls(raw, rec.physical_offset, rec.queue_offset, rec.store_timestamp, rec.born_timestamp,
                   rec.properties, rec._props, may_park(rec.properties))  # fmt: skip


_Half = records.MessageRecord | StoredHalf


def prop(rec: _Half, name: str) -> str | None:
    """One property of a record (its properties are decoded once, on first use: END_TRANSACTION reads five)."""
    return rec.property_map.get(name)


def origin_offset(half: _Half) -> int:
    """The queue offset of the half message this one was re-put from (itself when it is the first)."""
    value = prop(half, properties.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
    try:
        return int(value) if value is not None else half.queue_offset
    except ValueError:
        return half.queue_offset


def check_times(half: records.MessageRecord) -> int:
    """How many check-backs the half message has had (TRANSACTION_CHECK_TIMES; a bad value counts as none)."""
    value = prop(half, properties.PROPERTY_TRANSACTION_CHECK_TIMES)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def real_target(half: _Half) -> tuple[str, int] | None:
    """(REAL_TOPIC, REAL_QID), or None when the half message lacks them or names a topic the store cannot keep."""
    topic, qid = prop(half, properties.PROPERTY_REAL_TOPIC), prop(half, properties.PROPERTY_REAL_QUEUE_ID)
    if not topic or qid is None or names.stored_topic_error(topic) is not None:
        return None
    try:
        return topic, int(qid)
    except ValueError:
        return None


def renewed(half: records.MessageRecord, check_times: int | None) -> records.MessageRecord:
    """``renewHalfMessageInner`` (+ ``renewImmunityHalfMessageInner``): the half message re-put at the queue's end,
    remembering its origin's queue offset and, for a check-back, how many checks it has had."""
    extra = {properties.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: str(origin_offset(half))}
    if check_times is not None:
        extra[properties.PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
    return records.MessageRecord(
        topic=half.topic,
        queue_id=half.queue_id,
        body=half.body,
        properties=_append(half.properties, extra),
        flag=half.flag,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
    )


def discarded(half: records.MessageRecord) -> records.MessageRecord:
    """``toMessageExtBrokerInner``: a half message checked ``transactionCheckMax`` times, for
    ``TRANS_CHECK_MAX_TIME_TOPIC`` queue 0."""
    return replace(renewed(half, None), topic=CHECK_MAX_TIME_TOPIC, queue_id=0, properties=half.properties)


def op_record(half_queue_offsets: list[int], uniq_key: str, host: records.Host, now_ms: int) -> records.MessageRecord:
    """An op message removing half messages: tag ``d``, body = their queue offsets."""
    props = {properties.PROPERTY_TAGS: REMOVE_TAG, properties.PROPERTY_WAIT_STORE_MSG_OK: "false",
             properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq_key}  # fmt: skip
    return records.MessageRecord(
        topic=OP_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=OFFSET_SEPARATOR.join(str(o) for o in half_queue_offsets).encode(),
        properties=properties.encode_properties(props),
        born_timestamp=now_ms,
        born_host=host,
    )


def op_offsets(op: records.MessageRecord) -> list[int]:
    """The half queue offsets an op message removes (4.x: one; 5.x: several separated by ``,``)."""
    if op.tags != REMOVE_TAG:
        log.error("op message at %d has tag %r, not %r: ignored", op.physical_offset, op.tags, REMOVE_TAG)
        return []
    out = []
    for part in op.body.decode("utf-8", "replace").split(OFFSET_SEPARATOR):
        try:
            out.append(int(part))
        except ValueError:
            log.error("op message at %d has a bad offset %r: ignored", op.physical_offset, part)
    return out


class ResolvedHalves:
    """Half queue offsets removed by an op message (committed or rolled back): rebuilt from the op topic at start,
    extended as ops are written."""

    def __init__(self) -> None:
        self._offsets: set[int] = set()
        self._floor = 0

    def __contains__(self, offset: int) -> bool:
        return offset in self._offsets

    def __len__(self) -> int:
        return len(self._offsets)

    def is_resolved(self, half: _Half) -> bool:
        return half.queue_offset in self._offsets or origin_offset(half) in self._offsets

    def add(self, offsets: list[int]) -> None:
        self._offsets.update(offsets)

    def discard(self, offsets: list[int]) -> None:
        self._offsets.difference_update(offsets)

    def prune_below(self, offset: int) -> None:
        """Forget half messages whose CommitLog segments are gone (below the half queue's minimum offset): the
        set stays as large as the retained half queue, not the broker's whole history."""
        if offset > self._floor:
            self._floor = offset
            self._offsets = {o for o in self._offsets if o >= offset}


class RecentHalves:
    """The half messages this process stored most recently, as the send path encoded them: a producer ends its
    transaction a moment after the half is stored, and its END_TRANSACTION then needs neither read nor decode the
    CommitLog. Bounded by count and record bytes (the oldest go first) and by age, so an entry never outlives what
    the CommitLog keeps; anything not here is read from the CommitLog as before."""

    def __init__(self, max_count: int = 8192, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._halves: dict[int, StoredHalf] = {}  # by CommitLog offset, oldest first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._halves)

    def add(self, half: StoredHalf) -> None:
        self._halves[half.physical_offset] = half
        self._bytes += len(half.raw)
        while len(self._halves) > self.max_count or self._bytes > self.max_bytes:
            self.discard(next(iter(self._halves)))

    def get(self, commit_log_offset: int, stored_after_ms: int) -> StoredHalf | None:
        """The half message stored at ``commit_log_offset`` if it is here and was stored after ``stored_after_ms``
        (an older one is dropped: its CommitLog segment may be gone)."""
        half = self._halves.get(commit_log_offset)
        if half is not None and half.store_timestamp <= stored_after_ms:
            self.discard(commit_log_offset)
            return None
        return half

    def discard(self, commit_log_offset: int) -> None:
        half = self._halves.pop(commit_log_offset, None)
        if half is not None:
            self._bytes -= len(half.raw)
