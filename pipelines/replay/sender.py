"""The sending side of a replay: one asyncio Producer per Spark task (or, for the local engine, one in the
command's process) sends its source queues, in order, rate limited, recording progress as the broker acknowledges.

Order.  The task's rows arrive sorted by queue offset (several source queues interleaved); each source queue
has its own coroutine that sends one chunk at a time and waits for the broker's answer before the next, so
a source queue's messages land in its target queue(s) in offset order.  Different source queues of the task
send concurrently on the same producer.

Resume without duplicates.  See pipelines/replay/progress.py for the progress row.  At start the task reads
each source queue's row, scans the target queues from the row's watermarks to their current end, and
collects the REPLAY_SOURCE_OFFSET of every message this replay already put there for that source queue:
those are skipped, whatever happened after the last progress commit (acknowledged and unrecorded, or sent
with no answer before a kill).  A watermark only moves forward once every such found message is behind the
recorded offset, so a second crash scans them again rather than missing them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from broker.client import Message, MessageQueue, Producer, PullConsumer
from broker.client.message import PullStatus
from lake import objectstore
from pipelines import job_progress
from pipelines.replay import progress as prog
from pipelines.replay.progress import QueueKey, QueueProgress, TargetKey
from store.errors import MQLakeError
from store.format import properties, records

log = logging.getLogger(__name__)

# Provenance carried by every replayed message.
ORIGIN_MESSAGE_ID = properties.PROPERTY_ORIGIN_MESSAGE_ID
REPLAY_SOURCE_BROKER = "REPLAY_SOURCE_BROKER"
REPLAY_SOURCE_TOPIC = "REPLAY_SOURCE_TOPIC"
REPLAY_SOURCE_QUEUE = "REPLAY_SOURCE_QUEUE"
REPLAY_SOURCE_OFFSET = "REPLAY_SOURCE_OFFSET"
REPLAY_ID = "REPLAY_ID"

# Properties of the source record that are NOT copied: the producer sets TAGS/KEYS (from the columns), WAIT
# and a fresh UNIQ_KEY (the replayed message is a new message; its origin is ORIGIN_MESSAGE_ID); the broker
# adds CLUSTER; DELAY and the schedule/retry/transaction internals would make the broker delay, redirect or
# refuse a message that was already delivered once; MIN/MAX_OFFSET, MSG_REGION and TRACE_ON are response or
# trace details, not message content.
DROPPED_PROPERTIES = frozenset(
    {
        properties.PROPERTY_TAGS, properties.PROPERTY_KEYS, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        properties.PROPERTY_WAIT_STORE_MSG_OK, properties.PROPERTY_CLUSTER, properties.PROPERTY_DELAY_TIME_LEVEL,
        properties.PROPERTY_REAL_TOPIC, properties.PROPERTY_REAL_QUEUE_ID,
        properties.PROPERTY_TRANSACTION_PREPARED, properties.PROPERTY_PRODUCER_GROUP, properties.PROPERTY_RETRY_TOPIC,
        properties.PROPERTY_MIN_OFFSET, properties.PROPERTY_MAX_OFFSET, properties.PROPERTY_MSG_REGION,
        properties.PROPERTY_TRACE_SWITCH, properties.PROPERTY_CONSUME_START_TIME,
        properties.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "__STARTDELIVERTIME",
        properties.PROPERTY_TIMER_DELIVER_MS, properties.PROPERTY_TIMER_DELAY_SEC, properties.PROPERTY_TIMER_DELAY_MS,
        properties.PROPERTY_TIMER_OUT_MS,
        ORIGIN_MESSAGE_ID, REPLAY_SOURCE_BROKER, REPLAY_SOURCE_TOPIC, REPLAY_SOURCE_QUEUE, REPLAY_SOURCE_OFFSET,
        REPLAY_ID,
    }
)  # fmt: skip

_ZLIB_TYPES = (0x0, 0x300)  # 4.x writes no compression type (zlib); 5.x marks zlib as 3 << 8
_BATCH_BYTES = 1024 * 1024  # well under the producer's 4 MiB request limit

REPORT_SCHEMA = pa.schema([pa.field("source_broker", pa.string(), nullable=False), *prog.QUEUE_REPORT,
                           pa.field("send_started", pa.float64()),
                                                     pa.field("send_finished", pa.float64())])  # fmt: skip


class ReplayError(MQLakeError, RuntimeError):
    """A replay cannot go on (the message says why and where); recorded progress stays valid."""


# --- plan and rows ---------------------------------------------------------------------------------------------


@dataclass
class TaskPlan:
    """Everything a task needs, built on the driver (picklable)."""

    namesrv: str
    lake: str
    replay_id: str
    run_id: str
    spec_hash: str
    target_topic: str
    target_queues: list[TargetKey]  # sorted (broker, queue id)
    queue_map: str
    preserve_timestamps: bool
    bounds: dict[QueueKey, int]  # source queue -> the largest queue offset the plan covers
    assignment: dict[int, list[QueueKey]]  # Spark partition -> its source queues
    rate_per_task: float | None
    batch_size: int
    commit_every: int
    commit_seconds: float
    lake_settings: dict[str, str] = field(default_factory=dict)  # objectstore.settings_env() of the driver
    connections: int = 1  # the producer's connections to each broker

    def target_of(self, queue: QueueKey) -> list[MessageQueue]:
        """The target queue(s) a source queue sends to (hash: any, chosen per message by key)."""
        if self.queue_map == "hash":
            return [MessageQueue(self.target_topic, b, q) for b, q in self.target_queues]
        return [MessageQueue(self.target_topic, *preserved_target(self.target_queues, queue))]

    def chunk_size(self) -> int:
        if self.rate_per_task is None:
            return self.batch_size
        # a chunk is the unit of the rate limit: at most about 1/20 s of the budget, so the rate is smooth
        return max(1, min(self.batch_size, int(self.rate_per_task / 20)))


def preserved_target(targets: list[TargetKey], queue: QueueKey) -> TargetKey:
    """``--queue-map preserve``: the target queue with the source queue's id (modulo), on the source's broker when
    the target topic has queues there, so a topic spread over several brokers replays spread the same way."""
    same = [t for t in targets if t[0] == queue[0]]
    pool = same or targets
    return pool[queue[2] % len(pool)]


def source_body(body: bytes, sys_flag: int, where: str) -> bytes:
    """The body a consumer of the source saw: compressed records (Java clients compress > 4 KiB) are inflated,
    because the replayed message is sent uncompressed (its sysFlag has no compression bit)."""
    if not sys_flag & records.COMPRESSED_FLAG:
        return body
    kind = sys_flag & records.COMPRESSION_TYPE_MASK
    if kind not in _ZLIB_TYPES:
        raise ReplayError(f"{where}: body compressed with type {kind >> 8}, only zlib is supported")
    try:
        return zlib.decompress(body)
    except zlib.error as e:
        raise ReplayError(f"{where}: compressed body does not inflate: {e}") from None


def replay_message(row: dict, target_topic: str, replay_id: str, *, preserve_timestamps: bool = False) -> Message:
    """The message to send for one source row (a dict of the columns in pipelines/replay/source.py); with
    ``preserve_timestamps`` it carries the source's bornTimestamp, else the producer stamps it at send time."""
    topic, queue, offset = row["topic"], row["queue_id"], row["queue_offset"]
    props = {k: v for k, v in (row["properties"] or ()) if k not in DROPPED_PROPERTIES}
    props[ORIGIN_MESSAGE_ID] = row["uniq_key"] or row["msg_id"]  # what the source's consumers saw as msgId
    props[REPLAY_SOURCE_BROKER] = row["broker_name"]
    props[REPLAY_SOURCE_TOPIC] = topic
    props[REPLAY_SOURCE_QUEUE] = str(queue)
    props[REPLAY_SOURCE_OFFSET] = str(offset)
    props[REPLAY_ID] = replay_id
    body = source_body(row["body"], row["sys_flag"], f"{topic}:{queue}@{offset}")
    born = row["born_timestamp"] if preserve_timestamps else None
    return Message(target_topic, body, tags=row["tags"] or None, keys=row["keys"] or None, properties=props,
                   flag=row["flag"], born_timestamp=born)  # fmt: skip


class TokenBucket:
    """``rate`` tokens a second, starting empty (no burst above the rate) and holding at most ``capacity``."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate, self.capacity = rate, max(capacity, 1.0)
        self.tokens = 0.0
        self.last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        async with self._lock:  # first come, first served: a big request is not starved by small ones
            while True:
                now = time.monotonic()
                self.tokens = min(max(self.capacity, n), self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                await asyncio.sleep((n - self.tokens) / self.rate)


# --- one source queue ---------------------------------------------------------------------------------------


@dataclass
class _Item:
    offset: int
    message: Message


@dataclass
class QueueState:
    key: QueueKey
    start: QueueProgress  # as read when the task started
    progress: QueueProgress  # advanced as chunks are acknowledged
    found: set[int] = field(default_factory=set)  # offsets above start.last_offset already in the target
    end_offsets: dict[TargetKey, int] = field(default_factory=dict)  # target queue ends when the task started
    last_seen: int = -1
    selected: int = 0
    already_done: int = 0
    found_in_target: int = 0
    sent: int = 0
    first_sent: int | None = None
    last_sent: int | None = None
    targets: set[str] = field(default_factory=set)
    dirty: bool = True
    chunks: asyncio.Queue | None = None


def _batches(items: list[_Item], batch_size: int) -> Iterator[list[_Item]]:
    """Split one target queue's items into SEND_BATCH requests: by count and bytes, and where the born
    timestamp changes (``--preserve-timestamps``): a batch request carries one bornTimestamp, its first
    message's."""
    cur: list[_Item] = []
    size = 0
    for it in items:
        n = len(it.message.body_bytes())
        born_changes = bool(cur) and it.message.born_timestamp != cur[0].message.born_timestamp
        if cur and (len(cur) >= batch_size or size + n > _BATCH_BYTES or born_changes):
            yield cur
            cur, size = [], 0
        cur.append(it)
        size += n
    if cur:
        yield cur


class PartitionSender:
    """Sends one Spark partition's rows (or, for the local engine, every row); :meth:`run` returns the per-queue
    report rows.  ``watch_parent``: stop when the process's parent goes (a Spark worker whose job was killed)."""

    def __init__(self, plan: TaskPlan, partition_id: int, *, watch_parent: bool = True) -> None:
        self.plan = plan
        self.partition_id = partition_id
        self.app_id = f"mqlake-replay:{plan.replay_id}:{plan.run_id}:p{partition_id}"
        self.states: dict[QueueKey, QueueState] = {}
        self.bucket = (
            TokenBucket(plan.rate_per_task, plan.chunk_size()) if plan.rate_per_task is not None else None
        )
        self.ppid = os.getppid() if watch_parent else None
        self._acked_since_commit = 0
        self._last_commit = time.monotonic()
        self._commit_task: asyncio.Task | None = None
        self.send_started: float | None = None
        self.send_finished: float | None = None

    # -- start: progress and what already landed ------------------------------------------------------------
    async def _prepare(self, producer: Producer, consumer: PullConsumer) -> None:
        plan = self.plan
        recorded = await asyncio.to_thread(prog.read_progress, plan.lake, plan.replay_id)
        await producer.publish_queues(plan.target_topic, refresh=True)  # the route, before the first send
        ends = {}
        for b, q in plan.target_queues:
            ends[(b, q)] = await consumer.max_offset(MessageQueue(plan.target_topic, b, q))
        mine = plan.assignment.get(self.partition_id, [])
        for key in mine:
            p = recorded.get(key)
            if p is None or p.spec_hash != plan.spec_hash:
                raise ReplayError(f"no progress row for {key} under replay id {plan.replay_id} (the driver writes one "
                                  f"before any task starts)")  # fmt: skip
            start = QueueProgress(p.last_offset, dict(p.watermarks), p.spec_hash, p.seq)
            self.states[key] = QueueState(key, start, QueueProgress(p.last_offset, dict(p.watermarks), p.spec_hash),
                                          end_offsets=ends, last_seen=-1)  # fmt: skip
        await self._find_landed(consumer, ends)

    async def _find_landed(self, consumer: PullConsumer, ends: dict[TargetKey, int]) -> None:
        """Scan each target queue from the lowest watermark of this task's source queues to its end."""
        plan = self.plan
        lows: dict[TargetKey, int] = {}
        for st in self.states.values():
            for t, w in st.start.watermarks.items():
                lows[t] = min(lows.get(t, w), w)
        by_name = {(k[0], k[1], str(k[2])): k for k in self.states}
        for t, low in sorted(lows.items()):
            mq = MessageQueue(plan.target_topic, t[0], t[1])
            offset, end = max(low, await consumer.min_offset(mq)), ends.get(t, 0)
            while offset < end:
                res = await consumer.pull(mq, offset, 32)
                if res.status is not PullStatus.FOUND:
                    break
                for m in res.messages:
                    p = m.properties
                    if p.get(REPLAY_ID) != plan.replay_id:
                        continue
                    source = (p.get(REPLAY_SOURCE_BROKER), p.get(REPLAY_SOURCE_TOPIC), p.get(REPLAY_SOURCE_QUEUE))
                    key = by_name.get(source)
                    if key is None:
                        continue
                    st = self.states[key]
                    src = int(p[REPLAY_SOURCE_OFFSET])
                    if src > st.start.last_offset and m.queue_offset >= st.start.watermarks.get(t, 0):
                        st.found.add(src)
                if res.next_begin_offset <= offset:
                    break
                offset = res.next_begin_offset

    # -- progress --------------------------------------------------------------------------------------------------
    def _advance(self, st: QueueState, last_offset: int, acked: dict[TargetKey, int]) -> None:
        """A chunk up to ``last_offset`` is in the target; ``acked``: target queue -> first offset of the last
        batch acknowledged there."""
        st.progress.last_offset = last_offset
        if st.found and last_offset >= max(st.found):
            st.found = set()
        if not st.found:
            # Everything this replay put in the target for this source queue is now at or below last_offset,
            # so later sends land above the ends seen at start and above the batches just acknowledged.
            marks = st.progress.watermarks
            for t, end in st.end_offsets.items():
                marks[t] = max(marks.get(t, 0), end)
            for t, off in acked.items():
                marks[t] = max(marks.get(t, 0), off)
        st.dirty = True

    def _snapshot(self) -> dict[QueueKey, tuple[QueueProgress, int]]:
        out = {}
        for key, st in self.states.items():
            if st.dirty:
                p = st.progress
                out[key] = (QueueProgress(p.last_offset, dict(p.watermarks), p.spec_hash), st.sent)
                st.dirty = False
        return out

    def _commit_now(self, rows) -> None:
        plan = self.plan
        prog.append_progress(plan.lake, plan.replay_id, plan.run_id, self.app_id, rows)

    async def _maybe_commit(self) -> None:
        """Start a progress commit in a thread when one is due, so the sends go on while delta-rs writes."""
        due = (
            self._acked_since_commit >= self.plan.commit_every
            or time.monotonic() - self._last_commit >= self.plan.commit_seconds
        )
        if not due:
            return
        if self._commit_task is not None:
            if not self._commit_task.done():
                return  # one commit at a time; the next one picks up everything acknowledged meanwhile
            await self._commit_task  # re-raises a failed commit
            self._commit_task = None
        rows = self._snapshot()
        self._acked_since_commit = 0
        self._last_commit = time.monotonic()
        if rows:
            self._commit_task = asyncio.create_task(asyncio.to_thread(self._commit_now, rows))

    def _check_alive(self) -> None:
        # A Python worker outlives a killed job for a moment; it must not keep sending past the restart's scan.
        if self.ppid is not None and os.getppid() != self.ppid:
            raise ReplayError("the Spark worker lost its parent process; stopping the sends")

    # -- sending ----------------------------------------------------------------------------------------------
    async def _send_group(self, producer: Producer, mq: MessageQueue, items: list[_Item]) -> int:
        first = -1
        for batch in _batches(items, self.plan.batch_size):
            self._check_alive()
            result = await producer.send_batch([it.message for it in batch], queue=mq)
            first = result.queue_offset
        return first

    async def _send_queue(self, producer: Producer, st: QueueState) -> None:
        plan = self.plan
        targets = plan.target_of(st.key)
        while True:
            chunk: list[_Item] | None = await st.chunks.get()
            if chunk is None:
                return
            todo = [it for it in chunk if it.offset not in st.found]
            st.found_in_target += len(chunk) - len(todo)
            acked: dict[TargetKey, int] = {}
            if todo:
                if self.bucket is not None:
                    await self.bucket.take(len(todo))
                if self.send_started is None:
                    self.send_started = time.time()
                groups: dict[MessageQueue, list[_Item]] = {}
                for it in todo:
                    mq = targets[0] if len(targets) == 1 else self._by_key(targets, it, st.key)
                    groups.setdefault(mq, []).append(it)
                results = await asyncio.gather(*(self._send_group(producer, mq, g) for mq, g in groups.items()))
                for mq, first in zip(groups, results, strict=True):
                    acked[(mq.broker_name, mq.queue_id)] = first
                    st.targets.add(str(mq.queue_id))
                st.sent += len(todo)
                st.first_sent = todo[0].offset if st.first_sent is None else st.first_sent
                st.last_sent = todo[-1].offset
                self.send_finished = time.time()
                self._acked_since_commit += len(todo)
                job_progress.advance(len(todo))
            self._advance(st, chunk[-1].offset, acked)
            await self._maybe_commit()

    @staticmethod
    def _by_key(targets: list[MessageQueue], it: _Item, key: QueueKey) -> MessageQueue:
        keys = properties.split_keys(it.message.keys if isinstance(it.message.keys, str) else None)
        if not keys:
            return targets[key[2] % len(targets)]
        return Producer.select_by_key(targets, keys[0])

    # -- reading the partition --------------------------------------------------------------------------------
    async def _read(self, batches: Iterator[pa.RecordBatch]) -> None:
        plan = self.plan
        chunk_size = plan.chunk_size()
        pending: dict[QueueKey, list[_Item]] = {k: [] for k in self.states}
        it = iter(batches)
        while True:
            batch = await asyncio.to_thread(next, it, None)
            if batch is None:
                break
            self._check_alive()
            names = batch.schema.names
            at = [names.index(n) for n in ("broker_name", "topic", "queue_id", "queue_offset")]
            for values in zip(*(batch.column(name).to_pylist() for name in names), strict=True):
                key = (values[at[0]], values[at[1]], values[at[2]])
                st = self.states.get(key)
                offset = values[at[3]]
                if st is None or offset > plan.bounds.get(key, -1):
                    continue  # appended after the plan was made: the next run with this replay id takes it
                if offset <= st.last_seen:
                    continue  # the same record from the lake and the live log
                st.last_seen = offset
                st.selected += 1
                if offset <= st.start.last_offset:
                    st.already_done += 1
                    continue
                msg = replay_message(dict(zip(names, values, strict=True)), plan.target_topic, plan.replay_id,
                                     preserve_timestamps=plan.preserve_timestamps)  # fmt: skip
                items = pending[key]
                items.append(_Item(offset, msg))
                if len(items) >= chunk_size:
                    await st.chunks.put(items)
                    pending[key] = []
        for key, items in pending.items():
            if items:
                await self.states[key].chunks.put(items)
        for st in self.states.values():
            await st.chunks.put(None)

    async def run(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
        plan = self.plan
        group = "mqlake_replay_" + plan.replay_id.replace("-", "_")
        producer = await Producer(group, plan.namesrv, connections_per_addr=plan.connections).start()
        consumer = await PullConsumer(group + "_scan", plan.namesrv).start()
        try:
            await self._prepare(producer, consumer)
            for st in self.states.values():
                st.chunks = asyncio.Queue(maxsize=4)
            senders = [asyncio.create_task(self._send_queue(producer, st)) for st in self.states.values()]
            reader = asyncio.create_task(self._read(batches))
            try:
                await asyncio.gather(reader, *senders)
            except BaseException:
                for t in (reader, *senders):
                    t.cancel()
                raise
            finally:
                # Whatever was acknowledged is recorded, also when a send failed: a rerun resumes after it.
                if self._commit_task is not None:
                    await asyncio.gather(self._commit_task, return_exceptions=True)
                    self._commit_task = None
                rows = self._snapshot()
                if rows:
                    await asyncio.to_thread(self._commit_now, rows)
        finally:
            await producer.shutdown()
            await consumer.shutdown()
        return self._report()

    def _report(self) -> pa.RecordBatch:
        rows = [
            {
                "source_broker": st.key[0], "source_topic": st.key[1], "source_queue": st.key[2],
                "target_queues": ",".join(sorted(st.targets)),
                "selected": st.selected, "already_done": st.already_done, "found_in_target": st.found_in_target,
                "sent": st.sent, "first_offset": st.first_sent, "last_offset": st.last_sent,
                "send_started": self.send_started, "send_finished": self.send_finished,
            }  # fmt: skip
            for st in self.states.values()
        ]
        return pa.RecordBatch.from_pylist(rows, schema=REPORT_SCHEMA)


def send_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: runs in a Spark Python worker."""
    from pyspark import TaskContext

    from broker.remoting.loop import run

    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else 0
    objectstore.configure(plan.lake_settings)  # a lake on S3: reached as the driver reaches it
    yield run(PartitionSender(plan, partition_id).run(batches))
