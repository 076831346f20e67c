"""Delayed delivery: RocketMQ's delay levels (``ScheduleMessageService``) and 5.x timer messages.

Parking happens on put (``park``, as 4.x ``CommitLog.asyncPutMessage`` / 5.x ``HookUtils.handleScheduleMessage``):
- ``DELAY`` > 0: the level is clamped to the highest one, ``REAL_TOPIC``/``REAL_QID`` are added and the message is
  stored in ``SCHEDULE_TOPIC_XXXX`` queue level-1, whose ConsumeQueue tagsCode is the delivery time.
- ``TIMER_DELIVER_MS`` / ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS`` (and no DELAY level): a time in the future is
  rounded to ``timerPrecisionMs`` as Java rounds it into ``TIMER_OUT_MS`` and the message is stored in
  ``rmq_sys_wheel_timer`` queue 0; a time already past leaves the message in its topic, deliverable at once.

Delivery re-puts a copy into the real topic and queue when due, with the parked record's properties (Java builds
the copy's properties string before it clears DELAY from its map, so the stored copy keeps DELAY, REAL_TOPIC and
REAL_QID; a timer copy also gets TIMER_ENQUEUE_MS and TIMER_DEQUEUE_MS).  Both services are at-least-once: the
progress they persist trails what they delivered, so a restart (or SIGKILL) may deliver a message twice but
never loses one.

- Delay levels (``ScheduleMessageService``): one cursor per level over its queue, in order; a level's messages all
  share one delay, so its queue is time-ordered and the cursor stops at the first message not yet due.  Cursors
  are persisted in ``config/delayOffset.json`` every ``flushDelayOffsetInterval`` and at shutdown.
- Timers (``TimerMessageService``): arbitrary times are not ordered in the queue, so the service keeps a heap of
  pending (due time, queue offset) in memory, fed from ``rmq_sys_wheel_timer``'s ConsumeQueue, and persists in
  ``config/timerProgress.json`` ``scanOffset`` S (units below it were indexed), ``deliveredUntil`` T (every
  indexed unit due at or before T was delivered) and ``minPendingOffset`` W (the lowest undelivered unit).
  A restart re-indexes from W and skips units below S due at or before T.  This replaces Java's timer wheel and
  timer log files (which this store does not write) with state rebuilt from the CommitLog.
- Recalls: a timer message carrying ``TIMER_DEL_UNIQKEY`` (a RECALL_MESSAGE's delete mark, or a client's own) is
  a delete mark for the message whose ``UNIQ_KEY`` it names: indexing it marks that id recalled, the message
  (due in the same slot, and earlier in the queue) is dropped instead of delivered, and the mark itself is never
  delivered.  The mark is later in the queue than its message, so a restart that re-indexes the message from W
  re-indexes the mark too.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from store import config_files as cf
from store import names
from store.constants import SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC
from store.consume_queue import ConsumeQueue, ConsumeQueueTable
from store.errors import MQLakeError
from store.format import properties as P
from store.format import records, units
from store.format.delay import may_park as may_park  # the broker and the store import it from here

log = logging.getLogger(__name__)

TIMER_PROGRESS = "timerProgress.json"
_NOT_DELIVERABLE = frozenset({TRANS_HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC})
POLL_INTERVAL = 0.1  # DELAY_FOR_A_WHILE: how often an idle service looks for new or due messages
CHUNK = 512  # units looked at per level per pass
_TIMER_KEYS = (P.PROPERTY_TIMER_DELIVER_MS, P.PROPERTY_TIMER_DELAY_SEC, P.PROPERTY_TIMER_DELAY_MS)

Put = Callable[[str, int, list[bytes]], bool]  # (topic, queue id, encoded records) -> appended
Read = Callable[[int, int], "bytes | None"]
Copy = tuple[str, int, bytes]  # a delivered copy: real topic, real queue id, the record re-addressed


class ParkRefused(MQLakeError, ValueError):
    """A delayed or timer message the broker will not store (``WHEEL_TIMER_MSG_ILLEGAL`` and friends).

    ``not_enabled``: refused because ``timerWheelEnable`` is false (Java answers SYSTEM_ERROR, not
    MESSAGE_ILLEGAL)."""

    def __init__(self, message: str, not_enabled: bool = False) -> None:
        super().__init__(message)
        self.not_enabled = not_enabled


def park(
    msg: records.MessageRecord, max_level: int, *, timer_enable: bool = True,
    timer_max_delay_sec: int = 3600 * 24 * 3, timer_precision_ms: int = 1000, now_ms: int | None = None,
) -> None:  # fmt: skip
    """Rewrite ``msg`` in place to wait in SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer; a no-op for a message
    that is not delayed.  Raises :class:`ParkRefused` for a DELAY or timer value Java would refuse."""
    if records.transaction_type(msg.sys_flag) not in (records.TRANSACTION_NOT_TYPE, records.TRANSACTION_COMMIT_TYPE):
        return
    if msg.topic in (TIMER_TOPIC, TRANS_HALF_TOPIC):
        # A rolled timer goes back where it was. A half message keeps its DELAY for its commit, which is parked
        # then: Java parks the half message itself, and its delivery later discards it (a transaction lost).
        return
    props = P.decode_properties(msg.properties)
    raw_level = props.get(P.PROPERTY_DELAY_TIME_LEVEL)
    level = 0
    if raw_level is not None:
        try:
            level = int(raw_level)  # Integer.parseInt: an optional sign, then decimal digits
        except ValueError:
            raise ParkRefused(f"DELAY {raw_level!r} is not a delay level (an integer)") from None
    if level > 0:
        for key in _TIMER_KEYS:  # a level wins over a timer (checkIfTimerMessage clears them)
            props.pop(key, None)
        props[P.PROPERTY_DELAY_TIME_LEVEL] = str(min(level, max_level))
        _move(msg, props, SCHEDULE_TOPIC, min(level, max_level) - 1)
        return
    if P.PROPERTY_TIMER_OUT_MS in props or not any(k in props for k in _TIMER_KEYS):
        return
    if not timer_enable:
        raise ParkRefused("accurate timer message is not enabled, timerWheelEnable is false", not_enabled=True)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        if P.PROPERTY_TIMER_DELAY_SEC in props:
            deliver_ms = now + int(props[P.PROPERTY_TIMER_DELAY_SEC]) * 1000
        elif P.PROPERTY_TIMER_DELAY_MS in props:
            deliver_ms = now + int(props[P.PROPERTY_TIMER_DELAY_MS])
        else:
            deliver_ms = int(props[P.PROPERTY_TIMER_DELIVER_MS])
    except ValueError:
        raise ParkRefused("timer message illegal: the timer property is not an integer") from None
    if deliver_ms <= now:
        if P.PROPERTY_TIMER_DEL_UNIQKEY in props:
            raise ParkRefused("timer message illegal: a timer delete must name a time in the future")
        return  # already due: stored in its own topic, deliverable at once
    if deliver_ms - now > timer_max_delay_sec * 1000:
        raise ParkRefused(
            "timer message illegal, the delay time should not be bigger than the max delay "
            f"{timer_max_delay_sec * 1000}ms"
        )
    # Java rounds down into the slot whose dequeue (one precision later) is not before the time asked for.
    if deliver_ms % timer_precision_ms == 0:
        deliver_ms -= timer_precision_ms
    else:
        deliver_ms = deliver_ms // timer_precision_ms * timer_precision_ms
    props[P.PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
    _move(msg, props, TIMER_TOPIC, 0)


def _move(msg: records.MessageRecord, props: dict[str, str], topic: str, queue_id: int) -> None:
    props[P.PROPERTY_REAL_TOPIC] = msg.topic
    props[P.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    msg.properties = P.encode_properties(props)
    msg._props = None
    msg.topic, msg.queue_id = topic, queue_id


def _delivered_copy(raw: bytes, extra: dict[str, str] | None = None) -> Copy:
    """The parked record re-addressed to its REAL_TOPIC/REAL_QID (``messageTimeup`` / ``convertMessage``); every
    other field, the properties included, as stored.  RecordError / RecordEncodeError when it cannot be."""
    sections = records.record_sections(raw)
    props = raw[sections[2] : sections[3]]
    topic = P.property_value(props, P.PROPERTY_REAL_TOPIC)
    qid = P.property_value(props, P.PROPERTY_REAL_QUEUE_ID) or ""
    if not topic or not qid.isascii() or not qid.isdigit():
        raise records.RecordError(0, "a parked message without REAL_TOPIC/REAL_QID")
    bad = names.stored_topic_error(topic)
    if bad is not None:  # a client's own REAL_TOPIC: delivering it would create a queue under that name
        raise records.RecordError(0, f"REAL_TOPIC: {bad}")
    extra_props = P.encode_properties(extra) if extra else b""
    return topic, int(qid), records.retarget_record(raw, topic, int(qid), extra_props, sections)


def _put_grouped(put: Put, copies: list[Copy]) -> bool:
    """Put copies as one batch per real topic-queue, each queue's messages in their order."""
    groups: dict[tuple[str, int], list[bytes]] = {}
    for topic, qid, rec in copies:
        groups.setdefault((topic, qid), []).append(rec)
    ok = True
    for (topic, qid), batch in groups.items():
        ok = put(topic, qid, batch) and ok
    return ok


class _Service:
    """A thread that runs ``_pass`` until shut down; ``_pass`` returns how long it may sleep."""

    name = "delivery"

    def __init__(self, persist_interval_ms: int) -> None:
        self._persist_interval = persist_interval_ms / 1000
        self._stop = threading.Event()
        self._wakeup = threading.Event()  # something to do before the pass's wait runs out
        self._thread: threading.Thread | None = None
        self._refusing = False  # the store refused the last due batch: logged once, not at every retry

    def _delivered(self, ok: bool, count: int) -> bool:
        """Log the start and the end of a run of refused deliveries (a full disk); returns ``ok``."""
        if not ok and not self._refusing:
            log.warning("%s: the store refused %d due message(s) (a full disk, or not writable); retrying until "
                        "it takes them", self.name, count)  # fmt: skip
        elif ok and self._refusing:
            log.warning("%s: the store takes due messages again", self.name)
        self._refusing = not ok
        return ok

    def start(self) -> None:
        self._stop.clear()  # a broker made master again (controller mode) starts the service a second time
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._save()

    def _save(self) -> None:
        try:
            self.persist()
        except OSError as e:  # progress not saved: a restart delivers again from the last saved (at-least-once)
            log.warning("%s could not save its progress (the previous file is kept): %s", self.name, e)

    def _run(self) -> None:
        last_persist = time.monotonic()
        while not self._stop.is_set():
            self._wakeup.clear()
            try:
                wait = self._pass(int(time.time() * 1000))
            except Exception:  # DELAY_FOR_A_PERIOD: a store error must not end delivery for good
                log.exception("%s pass failed; retrying in 10 s", self.name)
                wait = 10.0
            if time.monotonic() - last_persist >= self._persist_interval:
                self._save()
                last_persist = time.monotonic()
            if wait > 0:
                self._wakeup.wait(wait)

    def _pass(self, now_ms: int) -> float:
        raise NotImplementedError

    def persist(self) -> None:
        raise NotImplementedError


class ScheduleMessageService(_Service):
    """Delivers SCHEDULE_TOPIC_XXXX queue by queue (one per level), each in order, when due."""

    name = "ScheduleMessageService"

    def __init__(
        self, queues: ConsumeQueueTable, read: Read, put: Put, delay_millis: list[int], config_dir: Path,
        persist_interval_ms: int = 10_000,
    ) -> None:  # fmt: skip
        super().__init__(persist_interval_ms)
        self.queues, self._read, self._put = queues, read, put
        self.delay_millis = delay_millis
        self.config_dir = Path(config_dir)
        self._offsets: dict[int, int] = {}
        self._persisted: dict[int, int] | None = None

    @property
    def max_level(self) -> int:
        return len(self.delay_millis)

    def load(self) -> None:
        """Read delayOffset.json and correct each offset into its queue's range (``correctDelayOffset``)."""
        self._offsets = cf.load_delay_offsets(self.config_dir)
        self._persisted = dict(self._offsets)
        for level, off in list(self._offsets.items()):
            cq = self.queues.find(SCHEDULE_TOPIC, level - 1, create=False)
            if cq is None:
                continue
            fixed = min(max(off, cq.min_offset_in_queue), cq.max_offset_in_queue)
            if fixed != off:
                log.error("delay offset of level %d corrected from %d to %d", level, off, fixed)
                self._offsets[level] = fixed

    def offset_table(self) -> dict[int, int]:
        """Level -> next ConsumeQueue offset to deliver (what GET_ALL_DELAY_OFFSET reports); a copy taken without
        waiting for a delivery pass (persist runs on the service's own thread, or after it stopped)."""
        return dict(self._offsets)

    def persist(self) -> None:
        table = self.offset_table()
        if table != self._persisted:
            cf.save_delay_offsets(self.config_dir, table)
            self._persisted = table

    def _pass(self, now_ms: int) -> float:
        wait = POLL_INTERVAL
        for level in range(1, self.max_level + 1):
            wait = min(wait, self._deliver_level(level, now_ms))
        return wait

    def _deliver_level(self, level: int, now_ms: int) -> float:
        cq = self.queues.find(SCHEDULE_TOPIC, level - 1, create=False)
        if cq is None:
            return POLL_INTERVAL
        start = max(self._offsets.get(level, 0), cq.min_offset_in_queue)
        delay = self.delay_millis[level - 1]
        copies: list[Copy] = []
        next_offset = start
        wait = POLL_INTERVAL  # nothing (readable) after the cursor yet
        for index, phy, size, due in cq.iter_units(start, CHUNK):
            wait = 0.0  # more may follow this chunk
            if due > now_ms + delay:  # correctDeliverTimestamp: a time further off than the level's delay is bogus
                due = now_ms
            if due > now_ms:
                wait = (due - now_ms) / 1000
                break
            next_offset = index + 1
            copy = self._copy(level, index, phy, size)
            if copy is not None:
                copies.append(copy)
        if copies and not self._delivered(_put_grouped(self._put, copies), len(copies)):
            return POLL_INTERVAL  # retried from the same offset: what did go in may be delivered twice
        self._offsets[level] = next_offset
        return wait

    def _copy(self, level: int, index: int, phy: int, size: int) -> Copy | None:
        if size == units.CQ_FILL_SIZE:
            return None
        raw = self._read(phy, size)
        if raw is None:
            log.warning("delay level %d offset %d: CommitLog offset %d is gone; skipped", level, index, phy)
            return None
        try:
            copy = _delivered_copy(raw)
        except (records.RecordError, records.RecordEncodeError) as e:
            log.error("delay level %d offset %d (CommitLog offset %d): %s; skipped", level, index, phy, e)
            return None
        if copy[0] in _NOT_DELIVERABLE:  # Java discards a half message; a schedule or timer topic would loop
            log.error("delay level %d offset %d: real topic is %s; discarded", level, index, copy[0])
            return None
        return copy


class TimerMessageService(_Service):
    """Delivers rmq_sys_wheel_timer messages at their TIMER_OUT_MS slot (plus one precision, as Java's wheel)."""

    name = "TimerMessageService"

    def __init__(
        self, queues: ConsumeQueueTable, read: Read, put: Put, config_dir: Path, precision_ms: int = 1000,
        persist_interval_ms: int = 10_000,
    ) -> None:  # fmt: skip
        super().__init__(persist_interval_ms)
        self.queues, self._read, self._put = queues, read, put
        self.path = Path(config_dir) / TIMER_PROGRESS
        self.precision_ms = precision_ms
        self._heap: list[tuple[int, int, int, int]] = []  # (due ms, queue offset, CommitLog offset, size)
        self._recalled: dict[str, int] = {}  # UNIQ_KEY -> delete marks indexed and not yet due
        self._scan = 0  # next queue offset to index
        self._delivered_until = 0
        self._persisted: dict[str, int] | None = None

    def load(self) -> None:
        """Re-index from the lowest undelivered unit, skipping what the last progress says was delivered."""
        data = cf.read_config(self.path) or {}
        try:
            scan, until, low = (int(data.get(k, 0)) for k in ("scanOffset", "deliveredUntil", "minPendingOffset"))
        except (TypeError, ValueError) as e:
            raise cf.ConfigFileError(self.path, f"bad progress: {e}") from None
        self._persisted = {"scanOffset": scan, "deliveredUntil": until, "minPendingOffset": low}
        cq = self.queues.find(TIMER_TOPIC, 0, create=False)
        if cq is None:
            return
        self._scan = min(max(low, cq.min_offset_in_queue), cq.max_offset_in_queue)
        self._delivered_until = until
        self._index(cq, skip_below=scan)

    def on_arrival(self, topic: str, _queue_id: int, _next_offset: int, _tags_codes: tuple[int, ...], _ts: int) -> None:
        """The store's arrival listener: a new timer message may be due sooner than the service's next look."""
        if topic == TIMER_TOPIC:
            self._wakeup.set()

    @property
    def pending(self) -> int:
        """Timer messages (delete marks included) indexed and not yet delivered or dropped."""
        return len(self._heap)

    @property
    def offset_behind(self) -> int:
        """Timer messages stored but not yet indexed (Java's ``timerOffsetBehind``)."""
        cq = self.queues.find(TIMER_TOPIC, 0, create=False)
        return max(0, cq.max_offset_in_queue - self._scan) if cq is not None else 0

    def _progress(self) -> dict[str, int]:
        low = min((e[1] for e in self._heap), default=self._scan)
        return {"scanOffset": self._scan, "deliveredUntil": self._delivered_until, "minPendingOffset": low}

    def persist(self) -> None:
        progress = self._progress()
        if progress != self._persisted:
            cf.write_config(self.path, progress)
            self._persisted = progress

    def _index(self, cq: ConsumeQueue, skip_below: int = 0) -> None:
        end = cq.max_offset_in_queue
        while self._scan < end:
            before = self._scan
            for index, phy, size, _tags in cq.iter_units(self._scan, CHUNK):
                self._scan = index + 1
                parked = self._parked(index, phy, size)
                if parked is None:
                    continue
                out_ms, deletes = parked
                due = out_ms + self.precision_ms
                if index < skip_below and due <= self._delivered_until:
                    continue  # delivered before the restart
                if deletes is not None:
                    self._recalled[deletes] = self._recalled.get(deletes, 0) + 1
                heapq.heappush(self._heap, (due, index, phy, size))
            if self._scan == before:  # a unit not readable yet
                break

    def _parked(self, index: int, phy: int, size: int) -> tuple[int, str | None] | None:
        """(TIMER_OUT_MS, the UNIQ_KEY a delete mark recalls or None) of a unit; None for one to skip."""
        if size == units.CQ_FILL_SIZE:
            return None
        raw = self._read(phy, size)
        if raw is None:
            log.warning("timer offset %d: CommitLog offset %d is gone; skipped", index, phy)
            return None
        try:
            props = records.record_properties(raw)
            out_ms = int(P.property_value(props, P.PROPERTY_TIMER_OUT_MS) or "")
            return out_ms, P.property_value(props, P.PROPERTY_TIMER_DEL_UNIQKEY)
        except (records.RecordError, ValueError) as e:
            log.error("timer offset %d (CommitLog offset %d) has no usable TIMER_OUT_MS (%s); skipped", index, phy, e)
            return None

    def _pass(self, now_ms: int) -> float:
        cq = self.queues.find(TIMER_TOPIC, 0, create=False)
        if cq is None:
            return POLL_INTERVAL
        self._index(cq)
        due: list[tuple[int, int, int, int]] = []
        while self._heap and self._heap[0][0] <= now_ms and len(due) < CHUNK:
            due.append(heapq.heappop(self._heap))
        copies: list[Copy] = []
        marks: list[str] = []  # delete marks come due: released once this pass's copies are in
        for _due, index, phy, size in due:
            raw = self._read(phy, size)
            if raw is None:
                log.warning("timer offset %d: CommitLog offset %d is gone; skipped", index, phy)
                continue
            try:
                props = records.record_properties(raw)
                deletes = P.property_value(props, P.PROPERTY_TIMER_DEL_UNIQKEY)
                if deletes is not None:
                    marks.append(deletes)
                    continue
                uniq = P.property_value(props, P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                if uniq is not None and uniq in self._recalled:
                    log.info("timer offset %d: message %s was recalled; dropped", index, uniq)
                    continue
                enqueued = records.read_store_timestamp(raw, 0)
                copies.append(_delivered_copy(raw, {
                    P.PROPERTY_TIMER_ENQUEUE_MS: str(enqueued), P.PROPERTY_TIMER_DEQUEUE_MS: str(now_ms),
                }))  # fmt: skip
            except (records.RecordError, records.RecordEncodeError) as e:
                log.error("timer offset %d (CommitLog offset %d): %s; skipped", index, phy, e)
                continue
            if copies[-1][0] in _NOT_DELIVERABLE:
                log.error("timer offset %d: real topic is %s; discarded", index, copies.pop()[0])
        if copies and not self._delivered(_put_grouped(self._put, copies), len(copies)):
            for entry in due:  # retried later; what did go in may be delivered twice
                heapq.heappush(self._heap, entry)
            return POLL_INTERVAL
        for key in marks:
            left = self._recalled.get(key, 0) - 1
            if left > 0:
                self._recalled[key] = left
            else:
                self._recalled.pop(key, None)
        if not self._heap or self._heap[0][0] > now_ms:
            self._delivered_until = max(self._delivered_until, now_ms)
            return min(POLL_INTERVAL, (self._heap[0][0] - now_ms) / 1000) if self._heap else POLL_INTERVAL
        return 0.0
