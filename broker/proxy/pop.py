"""Pop consumption (receive / ack / change invisible duration) with its state in the CommitLog, as RocketMQ 5's.

A receive reads a group's messages from the subscribed topic and the group's retry topic (``%RETRY%<group>``)
from the group's consumer offsets (the table the remoting consumers use), moves the offsets past them and writes
one *checkpoint* per message to the revive log (system topic ``rmq_sys_REVIVE_LOG_<cluster>``, queue 0) before
the messages are handed out.  An ack or a change of invisible time writes an *ack* record for the checkpoint (and
a change a new checkpoint).  A checkpoint whose invisible time passes without an ack is *revived*: the message is
put to the group's retry topic with reconsumeTimes + 1, or to its DLQ (``%DLQ%<group>``) once the group's
retryMaxTimes are used up, and the checkpoint is acked.

On start the open checkpoints are rebuilt by reading the revive log from the revive offset (the consumer offset
of group ``CID_RMQ_SYS_REVIVE_GROUP`` on the revive topic, moved on as checkpoints close): un-acked messages of a
broker that crashed are redelivered after their invisible time, as before the crash.

FIFO groups (``consumeMessageOrderly``) pop a queue only when none of its messages is in flight; an expired one is
redelivered from the same queue, in order, with its delivery attempt counted, and dead-lettered past the limit.

Record bodies are JSON (mqlake's own; RocketMQ's ``PopCheckPoint`` batches a bitmap of offsets per checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.proxy import receipt as rh
from broker.proxy.convert import now_ms
from broker.proxy.status import Code, ProxyError
from broker.remoting.protocol.topic import PERM_READ, PERM_WRITE
from broker.server import topics as tp
from store.constants import REVIVE_GROUP, REVIVE_TOPIC_PREFIX
from store.format import msgid, records
from store.format import properties as P
from store.message_store import GetMessageStatus

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)

REVIVE_INTERVAL = 0.2  # s between revive scans; invisible times are whole seconds or more
_CK, _ACK = "ck", "ack"
# a revive record's properties by its tag (one record per message popped or acked: encoded once)
_REVIVE_PROPERTIES = {tag: P.encode_properties({P.PROPERTY_TAGS: tag, P.PROPERTY_WAIT_STORE_MSG_OK: "true"})
                      for tag in (_CK, _ACK)}  # fmt: skip
_READ_BATCH = 32

MessageFilter = Callable[[records.MessageRecord], bool]


@dataclass(slots=True)
class InFlight:
    """One popped message awaiting its ack, by its checkpoint in the revive log."""

    group: str
    topic: str  # the topic it was popped from: the subscribed one or the group's retry topic
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    pop_time: int
    invisible_ms: int
    ck_offset: int
    fifo: bool = False

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_ms

    def ck_body(self) -> dict[str, object]:
        return {"g": self.group, "t": self.topic, "q": self.queue_id, "o": self.queue_offset,
                "c": self.commitlog_offset, "pt": self.pop_time, "it": self.invisible_ms, "f": self.fifo}  # fmt: skip

    @classmethod
    def from_ck(cls, body: dict, ck_offset: int) -> InFlight:
        return cls(body["g"], body["t"], int(body["q"]), int(body["o"]), int(body["c"]), int(body["pt"]),
                   int(body["it"]), ck_offset, bool(body.get("f", False)))  # fmt: skip


@dataclass(slots=True)
class Popped:
    record: records.MessageRecord
    handle: rh.ReceiptHandle
    attempt: int  # the delivery attempt (1 = first)


class PopService:
    """Started on a master only: in controller mode it starts when the broker is elected and stops when it steps
    down (``GrpcProxy`` follows the role), and a new master rebuilds the open checkpoints from the revive log it
    replicated, so what its old master handed out and nobody acked is redelivered here after its invisible time."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.revive_topic = REVIVE_TOPIC_PREFIX + broker.config.broker_cluster_name
        self._lock = asyncio.Lock()  # one pop/ack/revive at a time: the offsets and the table change together
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._rr = 0
        self._stopping = False
        self._reset()

    def _reset(self) -> None:
        """No message in flight: the state a start rebuilds from the revive log."""
        self.inflight: dict[int, InFlight] = {}  # by checkpoint offset
        # kept beside it so that a revive scan and a FIFO pop cost what they find, not what is in flight:
        self._deadlines: list[tuple[int, int]] = []  # (deadline, ck offset) heap; stale entries skipped
        self._open_cks: list[int] = []  # ck offset heap: the revive offset is its least open one
        self._busy: Counter[tuple[str, str, int]] = Counter()  # messages in flight per (group, topic, queue)
        self._fifo_attempts: dict[tuple[str, str, int, int], int] = {}  # redeliveries of a FIFO message

    @property
    def running(self) -> bool:
        """Started and not stopped: receives and acks are served."""
        return self._task is not None and not self._stopping

    @property
    def broker_name(self) -> str:
        return self.broker.config.broker_name

    # --- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve (again, after a stop): the open checkpoints are read back from the revive log."""
        if self.running:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._reset()
        self.broker.topics.create_system_topic(self.revive_topic, 1, PERM_READ | PERM_WRITE)
        await self.broker.topics_saved()
        await asyncio.to_thread(self._recover)
        self.broker.store.add_arrival_listener(self._on_arrival)
        self._task = asyncio.create_task(self._revive_loop())

    async def stop(self) -> None:
        self._stopping = True  # parked receives answer now (with what they have: nothing)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            self.broker.store.remove_arrival_listener(self._on_arrival)
        for futs in self._waiters.values():
            for f in futs:
                if not f.done():
                    f.set_result(None)

    def _recover(self) -> None:
        """The open checkpoints: those in the revive log from the revive offset on without an ack."""
        store = self.broker.store
        offset = max(self.broker.offsets.query(REVIVE_GROUP, self.revive_topic, 0),
                     store.get_min_offset_in_queue(self.revive_topic, 0))  # fmt: skip
        open_cks: dict[int, InFlight] = {}
        end = store.get_max_offset_in_queue(self.revive_topic, 0)
        while offset < end:
            res = store.get_message(self.revive_topic, 0, offset, _READ_BATCH)
            for raw, qoff in zip(res.messages, res.queue_offsets, strict=True):
                try:
                    rec = records.decode_record(raw)
                    body = json.loads(rec.body)
                    if rec.tags == _CK:
                        open_cks[qoff] = InFlight.from_ck(body, qoff)
                    elif rec.tags == _ACK:
                        open_cks.pop(int(body["ck"]), None)
                except (records.RecordError, ValueError, KeyError, TypeError) as bad:  # not ours, or damaged
                    log.error("pop: %s queue 0 offset %d: unreadable revive record skipped: %s", self.revive_topic,
                              qoff, bad)  # fmt: skip
            offset = max(res.next_begin_offset, offset + 1)  # past a unit it could not read, too
        for e in open_cks.values():
            self._add(e)
        if open_cks:
            log.info("pop: %d messages in flight recovered from %s", len(open_cks), self.revive_topic)

    # --- the revive log ---------------------------------------------------------------------------------------
    def _record(self, tag: str, body: dict[str, object]) -> records.MessageRecord:
        return records.MessageRecord(topic=self.revive_topic, queue_id=0, body=json.dumps(body).encode(),
                                     properties=_REVIVE_PROPERTIES[tag], born_timestamp=now_ms(),
                                     born_host=msgid.parse_host_string(self.broker.config.broker_addr))  # fmt: skip

    async def _append(self, recs: list[records.MessageRecord]) -> int:
        """Put ``recs`` (one topic); the queue offset of the first."""
        result = await self.broker.put(recs)
        if not result.ok or result.append is None:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"revive log not written: {result.error or result.status}")
        return result.append.queue_offset

    # --- receive ----------------------------------------------------------------------------------------------
    def fifo(self, group: str) -> bool:
        cfg = self.broker.groups.find(group, create=False)
        # RocketMQ 5's consumeMessageOrderly; a 4.9 SubscriptionGroupConfig has no such field, so it is kept as the
        # extra key that updateSubGroup / subscriptionGroup.json gave it
        extra = (cfg.model_extra or {}) if cfg is not None else {}
        return str(extra.get("consumeMessageOrderly", "false")).lower() == "true"

    def max_attempts(self, group: str) -> int:
        cfg = self.broker.groups.find(group, create=False)
        return (cfg.retry_max_times if cfg is not None else 16) + 1

    async def receive(self, group: str, topic: str, accept: MessageFilter, batch: int, invisible_ms: int,
                      wait_ms: int) -> list[Popped]:  # fmt: skip
        """Up to ``batch`` messages, waiting up to ``wait_ms`` for the first (long polling)."""
        deadline = now_ms() + wait_ms
        watched = (topic, tp.retry_topic(group))
        while True:
            fut = self._watch(watched)
            try:
                found = await self._pop(group, topic, accept, batch, invisible_ms)
                left = deadline - now_ms()
                if found or left <= 0 or self._stopping:
                    return found
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, 1000) / 1000):  # re-check now and then (revives, FIFO)
                        await fut
            finally:
                self._unwatch(watched, fut)

    def _watch(self, topics: tuple[str, ...]) -> asyncio.Future:
        assert self._loop is not None
        fut = self._loop.create_future()
        for t in topics:
            self._waiters.setdefault(t, set()).add(fut)
        return fut

    def _unwatch(self, topics: tuple[str, ...], fut: asyncio.Future) -> None:
        for t in topics:
            waiting = self._waiters.get(t)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._waiters[t]

    def waiting(self, topic: str) -> int:
        """How many receives are parked on ``topic``."""
        return len(self._waiters.get(topic, ()))

    def _on_arrival(self, topic: str, *_: object) -> None:
        # the store's dispatch thread
        if topic in self._waiters and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake, topic)

    def _wake(self, topic: str) -> None:
        for f in self._waiters.get(topic, ()):
            if not f.done():
                f.set_result(None)

    def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        offset = self.broker.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return offset
        store = self.broker.store
        # A new group reads a queue from its start while the queue still holds its first message (RocketMQ's
        # initPopOffsetByCheckMsgInMem), else from its end; a retry topic always from its start.
        low = store.get_min_offset_in_queue(topic, queue_id)
        if low == 0 or topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
            return low
        return store.get_max_offset_in_queue(topic, queue_id)

    def _add(self, e: InFlight) -> None:
        self.inflight[e.ck_offset] = e
        heapq.heappush(self._deadlines, (e.deadline, e.ck_offset))
        heapq.heappush(self._open_cks, e.ck_offset)
        self._busy[(e.group, e.topic, e.queue_id)] += 1

    def _remove(self, e: InFlight) -> None:
        if self.inflight.pop(e.ck_offset, None) is None:
            return
        key = (e.group, e.topic, e.queue_id)
        self._busy[key] -= 1
        if self._busy[key] <= 0:
            del self._busy[key]

    async def _pop(self, group: str, topic: str, accept: MessageFilter, batch: int, invisible_ms: int) -> list[Popped]:
        async with self._lock:
            fifo = self.fifo(group)
            store = self.broker.store
            picked: list[tuple[str, int, records.MessageRecord]] = []
            moved: dict[tuple[str, int], int] = {}
            self._rr += 1
            for popped_topic in (tp.retry_topic(group), topic):
                tc = self.broker.topics.get(popped_topic)
                if tc is None:
                    continue
                n = tc.read_queue_nums
                for i in range(n):
                    qid = (self._rr + i) % n
                    if len(picked) >= batch:
                        break
                    if fifo and (group, popped_topic, qid) in self._busy:
                        continue  # FIFO: its earlier message is in flight
                    offset = self._start_offset(group, popped_topic, qid)
                    res = store.get_message(popped_topic, qid, offset, batch - len(picked))
                    if res.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                        offset = res.next_begin_offset
                        res = store.get_message(popped_topic, qid, offset, batch - len(picked))
                    new_offset = res.next_begin_offset
                    for raw, qoff in zip(res.messages, res.queue_offsets, strict=True):
                        rec = records.decode_record(raw)
                        if not accept(rec):
                            continue  # filtered out: passed over for good, as a pull passes over it
                        picked.append((popped_topic, qid, rec))
                        if fifo:  # one message of a queue in flight at a time
                            new_offset = qoff + 1
                            break
                    if new_offset != self.broker.offsets.query(group, popped_topic, qid):
                        moved[(popped_topic, qid)] = new_offset
            if not picked:
                for (t, q), off in moved.items():
                    self.broker.offsets.commit(group, t, q, off)
                return []
            pop_time = now_ms()
            entries = [InFlight(group, t, q, r.queue_offset, r.physical_offset, pop_time, invisible_ms, -1, fifo)
                       for t, q, r in picked]  # fmt: skip
            first = await self._append([self._record(_CK, e.ck_body()) for e in entries])
            out = []
            for i, (e, (_, _, rec)) in enumerate(zip(entries, picked, strict=True)):
                e.ck_offset = first + i
                self._add(e)
                attempt = rec.reconsume_times + 1 + self._fifo_attempts.get(self._fifo_key(e), 0)
                out.append(Popped(rec, self._handle(e), attempt))
            for (t, q), off in moved.items():
                self.broker.offsets.commit(group, t, q, off)
            return out

    def _handle(self, e: InFlight) -> rh.ReceiptHandle:
        kind = rh.RETRY_TOPIC if e.topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX) else rh.NORMAL_TOPIC
        return rh.ReceiptHandle(e.ck_offset, e.pop_time, e.invisible_ms, 0, kind, self.broker_name, e.queue_id,
                                e.queue_offset, e.commitlog_offset)  # fmt: skip

    @staticmethod
    def _fifo_key(e: InFlight) -> tuple[str, str, int, int]:
        return (e.group, e.topic, e.queue_id, e.queue_offset)

    # --- ack, change invisible, dead-letter --------------------------------------------------------------------
    def _find(self, group: str, handle: rh.ReceiptHandle) -> InFlight:
        e = self.inflight.get(handle.ck_offset)
        if (e is None or e.group != group or e.queue_offset != handle.queue_offset or e.pop_time != handle.pop_time
                or e.queue_id != handle.queue_id):  # fmt: skip
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is already acked, "
                             "expired (the message was redelivered) or renewed")  # fmt: skip
        return e

    async def ack(self, group: str, handles: list[rh.ReceiptHandle | ProxyError]) -> list[ProxyError | None]:
        """Ack each handle (an AckMessage's entries: their ack records written as one batch); per handle, the
        refusal or None.  A ProxyError in ``handles`` (an entry that did not decode) is passed through."""
        async with self._lock:
            results: list[ProxyError | None] = []
            closing: dict[int, InFlight] = {}  # by checkpoint offset: a handle twice in one ack is found at once
            for handle in handles:
                try:
                    if isinstance(handle, ProxyError):
                        raise handle
                    e = self._find(group, handle)
                    if e.ck_offset in closing:
                        raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is twice in one ack")
                    closing[e.ck_offset] = e
                    results.append(None)
                except ProxyError as refused:
                    results.append(refused)
            if closing:
                await self._append([self._record(_ACK, {"ck": ck}) for ck in closing])
                for e in closing.values():
                    self._close(e)
            return results

    async def change_invisible(self, group: str, handle: rh.ReceiptHandle, invisible_ms: int) -> rh.ReceiptHandle:
        async with self._lock:
            e = self._find(group, handle)
            renewed = InFlight(e.group, e.topic, e.queue_id, e.queue_offset, e.commitlog_offset, now_ms(),
                               invisible_ms, -1, e.fifo)  # fmt: skip
            renewed.ck_offset = await self._append([self._record(_CK, renewed.ck_body()),
                                                    self._record(_ACK, {"ck": e.ck_offset})])  # fmt: skip
            self._remove(e)
            self._add(renewed)
            return self._handle(renewed)

    async def dead_letter(self, group: str, handle: rh.ReceiptHandle) -> None:
        """ForwardMessageToDeadLetterQueue: to ``%DLQ%<group>`` now, and acked."""
        async with self._lock:
            e = self._find(group, handle)
            rec = self._read(e)
            if rec is not None:
                await self._put_again(rec, self.broker.create_dlq_topic(group))
            await self._append([self._record(_ACK, {"ck": e.ck_offset})])
            self._close(e)

    def _close(self, e: InFlight) -> None:
        self._remove(e)
        self._fifo_attempts.pop(self._fifo_key(e), None)

    def _read(self, e: InFlight) -> records.MessageRecord | None:
        raw = self.broker.store.look_message_by_offset(e.commitlog_offset)
        if raw is None:
            log.warning("pop: message at CommitLog offset %d is gone: not redelivered", e.commitlog_offset)
            return None
        return records.decode_record(raw)

    async def _put_again(self, rec: records.MessageRecord, target: tp.TopicConfig) -> None:
        props = dict(rec.property_map)
        props.setdefault(P.PROPERTY_RETRY_TOPIC, rec.topic)
        props.setdefault(P.PROPERTY_ORIGIN_MESSAGE_ID, rec.offset_msg_id)
        for key in (P.PROPERTY_DELAY_TIME_LEVEL, P.PROPERTY_TIMER_DELIVER_MS, P.PROPERTY_TIMER_OUT_MS):
            props.pop(key, None)  # delivered once: the retry is not delayed again
        again = records.MessageRecord(
            topic=target.topic_name, queue_id=random.randrange(target.write_queue_nums), body=rec.body,
            properties=P.encode_properties(props), flag=rec.flag, sys_flag=rec.sys_flag,
            born_timestamp=rec.born_timestamp, born_host=rec.born_host, reconsume_times=rec.reconsume_times + 1,
        )  # fmt: skip
        if target.topic_name in self.broker.topics.unsaved:
            await self.broker.topics_saved()
        result = await self.broker.put([again])
        if not result.ok:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"{target.topic_name}: {result.error or result.status}")

    # --- revive -----------------------------------------------------------------------------------------------
    async def _revive_loop(self) -> None:
        while True:
            await asyncio.sleep(REVIVE_INTERVAL)
            try:
                await self.revive()
            except Exception:
                log.exception("pop: revive failed")

    async def revive(self) -> int:
        """Redeliver every message whose invisible time has passed; how many."""
        now = now_ms()
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, ck = heapq.heappop(self._deadlines)
            e = self.inflight.get(ck)
            if e is not None and e.deadline == deadline:
                expired.append(e)
        done = 0
        for e in expired:
            async with self._lock:
                if self.inflight.get(e.ck_offset) is not e:
                    continue  # acked or renewed meanwhile
                try:
                    await self._revive_one(e)
                except BaseException:
                    heapq.heappush(self._deadlines, (e.deadline, e.ck_offset))  # tried again at the next scan
                    raise
                done += 1
        self._commit_revive_offset()
        return done

    async def _revive_one(self, e: InFlight) -> None:
        max_attempts = self.max_attempts(e.group)
        rec = self._read(e)
        if e.fifo:
            key = self._fifo_key(e)
            tried = self._fifo_attempts.get(key, 0) + 1 + (rec.reconsume_times if rec else 0)
            if rec is not None and tried >= max_attempts:
                await self._put_again(rec, self.broker.create_dlq_topic(e.group))
                self._fifo_attempts.pop(key, None)
            else:  # redelivered from the same queue, in order: the group's offset goes back to it
                self._fifo_attempts[key] = self._fifo_attempts.get(key, 0) + 1
                self.broker.offsets.commit(e.group, e.topic, e.queue_id, e.queue_offset)
        elif rec is not None:
            cfg = self.broker.groups.find(e.group, create=False)
            if rec.reconsume_times + 1 >= max_attempts:
                target = self.broker.create_dlq_topic(e.group)
            else:
                target = self.broker.create_retry_topic(e.group, cfg.retry_queue_nums if cfg else 1)
            await self._put_again(rec, target)
        await self._append([self._record(_ACK, {"ck": e.ck_offset})])
        self._remove(e)
        if e.fifo:
            self._wake(e.topic)

    def _commit_revive_offset(self) -> None:
        while self._open_cks and self._open_cks[0] not in self.inflight:
            heapq.heappop(self._open_cks)
        low = self._open_cks[0] if self._open_cks else None
        if low is None:
            low = self.broker.store.get_max_offset_in_queue(self.revive_topic, 0)
        self.broker.offsets.commit(REVIVE_GROUP, self.revive_topic, 0, low)
