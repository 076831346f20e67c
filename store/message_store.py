"""The facade the broker uses: put, get, query, offsets, start and shutdown (``DefaultMessageStore``)."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from store import config_files as cf
from store import names
from store.checkpoint import StoreCheckpoint, StoreLock, abort_file
from store.commitlog import (
    AppendResult,
    AppendStatus,
    CommitLog,
    Encoder,
    FastPut,
    FlushRealTimeService,
    GroupCommitService,
)
from store.config import BrokerRole, ExpiredSegmentPolicy, FlushDiskType, MessageStoreConfig
from store.consume_queue import ConsumeQueue, ConsumeQueueTable
from store.dispatch import ArrivalListener, ReputService
from store.dispatchers import BuildConsumeQueue, BuildIndex, CommitLogDispatcher, count_records
from store.format import delay, msgid, records, runs, units
from store.index import IndexService
from store.recovery import RecoveryReport, recover, store_time_at
from store.retention import SegmentManifest, SegmentState, disk_free_bytes, disk_used_ratio, is_deletion_hour
from store.schedule import ParkRefused, ScheduleMessageService, TimerMessageService, may_park, park
from store.segment_deletion import delete_leading_segments

log = logging.getLogger(__name__)
MAX_FILTER_UNITS = 16000 // units.CQ_UNIT_SIZE  # maxFilterMessageCount: CQ units scanned per pull at most
MAX_TRANSFER_BYTES = 256 * 1024
MAX_TRANSFER_COUNT = 32
_PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE


class PutMessageStatus(Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    WHEEL_TIMER_MSG_ILLEGAL = "WHEEL_TIMER_MSG_ILLEGAL"
    WHEEL_TIMER_NOT_ENABLE = "WHEEL_TIMER_NOT_ENABLE"


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append: AppendResult | None = None
    msg_ids: list[str] = field(default_factory=list)  # offset message ids
    error: str = ""

    @property
    def ok(self) -> bool:
        """Stored here (``PutMessageResult.isOk``), whether or not it is on disk or on the slave yet."""
        return self.status in _STORED


@dataclass(slots=True)
class Run:
    """Records of one topic-queue already encoded into one run (``store.format.runs``: the broker's send paths,
    transactions' op and final messages), for :meth:`MessageStore.put_nowait`."""

    data: bytes
    count: int
    topic: str
    queue_id: int
    sys_flag: int


class GetMessageStatus(Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    # raw CommitLog records, byte-identical (views of a cached buffer when the broker read them from the tier)
    messages: list[bytes | memoryview] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    # The reader is further behind the CommitLog's end than accessMessageInMemoryMaxRatio of RAM: its reads come from
    # disk, and a master may send it to a slave (suggestWhichBrokerId)
    suggest_pulling_from_slave: bool = False

    @property
    def buffer_total_size(self) -> int:
        return sum(len(m) for m in self.messages)


@dataclass(slots=True)
class QueryMessageResult:
    messages: list[bytes]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


class MessageStore:
    def __init__(self, config: MessageStoreConfig) -> None:
        self.config = config
        self.root = config.store_path_root_dir
        self.delay_millis = delay.parse_delay_levels(config.message_delay_level)
        self.store_host = config.store_host_tuple
        self._lock: StoreLock | None = None
        self.commitlog = CommitLog(config.commitlog_dir, config.mapped_file_size_commit_log)
        self.consume_queues = ConsumeQueueTable(config.consume_queue_dir, config.mapped_file_size_consume_queue)
        self.checkpoint: StoreCheckpoint | None = None
        self.index = IndexService(
            config.index_dir,
            config.max_hash_slot_num,
            config.max_index_num,
            on_file_flushed=self._on_index_file_flushed,
        )
        self.manifest = SegmentManifest(self.root)
        self._build_cq = BuildConsumeQueue(self.consume_queues)
        dispatchers: list[CommitLogDispatcher] = [self._build_cq]
        if config.message_index_enable:
            dispatchers.append(BuildIndex(self.index))
        self.reput = ReputService(
            self.commitlog, dispatchers, delay_millis=self.delay_millis, replica=config.broker_role == BrokerRole.SLAVE
        )
        self.schedule = ScheduleMessageService(
            self.consume_queues, self.commitlog.read, self._put_delivered, self.delay_millis, config.config_dir,
            config.flush_delay_offset_interval,
        )  # fmt: skip
        self.timers = TimerMessageService(
            self.consume_queues, self.commitlog.read, self._put_delivered, config.config_dir,
            config.timer_precision_ms, config.flush_delay_offset_interval,
        )  # fmt: skip
        self.reput.add_arrival_listener(self.timers.on_arrival)  # a short timer is indexed when it arrives
        self._flush_service: FlushRealTimeService | GroupCommitService | None = None
        self._group_commit: GroupCommitService | None = None
        self._housekeeping: _Housekeeping | None = None
        self._running = False
        self.last_exit_ok = True
        self.recovery_report: RecoveryReport | None = None
        self._deleted_topics: dict[str, int] = {}  # deletedTopics.json: topic -> CommitLog end at its deletion
        self._manual_delete = threading.Event()
        self._clean_lock = threading.Lock()
        self.disk_ratio = 0.0  # of the fuller of the CommitLog's and the store root's disks, last measured
        self._disk_ratios = (0.0, 0.0, 0.0)  # CommitLog, ConsumeQueue, IndexFile disks, last measured
        self._disk_full = False
        # An append found no room for a new segment: the disk counts as full, whatever its ratio, until a segment fits
        self._no_room = False
        self._disk_lock = threading.Lock()
        self._append_listeners: list[Callable[[int], None]] = []  # told the new end of the log after each put
        self._fast = FastPut(
            self.commitlog, config, self.store_host, self.reput.notify_appended, PutMessageResult,
            PutMessageStatus.PUT_OK,
        )  # fmt: skip
        # A SEND_MESSAGE_V2's put from its header's fields in one call, never waiting (FastPut.put_send): (its
        # offset message id, offset, size, queue offset), or None, nothing stored, for the broker's general path
        self.put_send: Callable[..., tuple[str, int, int, int] | None] = self._fast.put_send
        # Whether this store takes puts now (running, a master, room on disk): put_send's gate, _refusal's answer
        self._takes_puts = False
        # Only a master delivers delayed and timer messages (Java starts ScheduleMessageService unless SLAVE): a
        # slave's log is its master's copy, and its delay offsets are the master's (copied by the broker)
        self._delivers = config.broker_role != BrokerRole.SLAVE

    # =================================================================================================
    # lifecycle
    # =================================================================================================
    def start(self) -> MessageStore:
        """Lock the store dir, load, recover, catch dispatch up, then start the background services."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = StoreLock(self.root)
        try:
            self._load_and_recover()
        except BaseException:
            self._close_files()
            self._lock.release()
            raise
        abort_file(self.root).touch()
        self.check_disk_space()  # a store started on a full disk refuses puts from the first one
        self._running = True
        self.reput.start()
        if self._delivers:
            self.schedule.start()
            self.timers.start()
        if self.config.flush_disk_type == FlushDiskType.SYNC_FLUSH:
            self._flush_service = self._group_commit = GroupCommitService(self.commitlog, self._on_commitlog_flushed)
        else:
            self._flush_service = FlushRealTimeService(
                self.commitlog,
                self.config.flush_interval_commit_log,
                self.config.flush_commit_log_least_pages,
                self.config.flush_commit_log_thorough_interval,
                self._on_commitlog_flushed,
            )
        self._flush_service.start()
        self._refresh_takes_puts()
        self._housekeeping = _Housekeeping(self)
        self._housekeeping.start()
        return self

    def _load_and_recover(self) -> None:
        self.last_exit_ok = not abort_file(self.root).exists()
        self.commitlog.queue.load()
        self.consume_queues.load()
        self.checkpoint = StoreCheckpoint(self.root / "checkpoint")
        self.index.load(self.last_exit_ok, self.checkpoint.index_msg_timestamp)
        self.recovery_report = recover(
            self.commitlog, self.consume_queues.all(), self.index, self.checkpoint, self.config,
            last_exit_ok=self.last_exit_ok,
        )  # fmt: skip
        # Deleted topics' older records are never dispatched again, even by the re-dispatch after a crash; an entry
        # is dropped once the CommitLog no longer holds records below it.
        cl_min = self.commitlog.min_offset
        deleted = cf.load_deleted_topics(self.config.config_dir)
        self._deleted_topics = {t: end for t, end in deleted.items() if end > cl_min}
        for topic, end in self._deleted_topics.items():
            self._build_cq.forget_topic(topic, end)
        rebuilds = self._queues_to_rebuild(set(deleted))
        dispatch_from = min([self.recovery_report.dispatch_from, *(start for _, _, start in rebuilds)])
        self.reput.set_reput_from(dispatch_from)
        # Dispatch everything already in the log before queue offsets are handed out again.
        while self.reput.do_reput() > 0:
            pass
        for cq, was, _ in rebuilds:
            log.info("ConsumeQueue %s-%d rebuilt from the CommitLog: queue offsets %d to %d", cq.topic, cq.queue_id,
                     was, cq.max_offset_in_queue)  # fmt: skip
        self._recover_topic_queue_table()
        self._save_queue_ends()
        self._sync_manifest()
        self.schedule.load()
        self.timers.load()

    def _queues_to_rebuild(self, deleted_topics: set[str]) -> list[tuple[ConsumeQueue, int, int]]:
        """The ConsumeQueues to rebuild from the CommitLog, logged, each as (queue, its end now, the CommitLog offset
        its missing units lie at or after): those ``load`` found damaged, and those ending below where the store
        last recorded them (a file or a queue's directory deleted while the broker was stopped). RocketMQ
        re-dispatches only from the highest offset any queue reached, and never notices either."""
        if not self.commitlog.queue.files:
            return []
        try:
            recorded = cf.load_queue_ends(self.config.config_dir)
        except cf.ConfigFileError as e:
            log.warning("%s; ConsumeQueues are checked without it", e)
            recorded = {}
        why = {(cq.topic, cq.queue_id): cq.damage for cq in self.consume_queues.all() if cq.damage is not None}
        # compared as loaded, before recovery cut the queues to a truncated CommitLog: those units are gone for good
        loaded = self.recovery_report.queue_ends if self.recovery_report is not None else {}
        for key, end in recorded.items():
            if key not in why and key[0] not in deleted_topics and loaded.get(key, 0) < end:
                why[key] = f"ends at queue offset {loaded.get(key, 0)}, it last ended at {end}"
        cl_min = self.commitlog.min_offset
        out = []
        for (topic, queue_id), reason in sorted(why.items()):
            cq = self.consume_queues.find(topic, queue_id)
            start = max(cq.max_physic_offset, cl_min)  # the end of its last unit's record, -1 when it has none
            log.warning("ConsumeQueue %s-%d: %s; rebuilding it from queue offset %d, CommitLog offset %d",
                        topic, queue_id, reason, cq.max_offset_in_queue, start)  # fmt: skip
            out.append((cq, cq.max_offset_in_queue, start))
        return out

    def _save_queue_ends(self) -> None:
        """Record where each ConsumeQueue ends, for the next start to notice one that lost files meanwhile."""
        ends = {(cq.topic, cq.queue_id): cq.max_offset_in_queue for cq in self.consume_queues.all()
                if cq.max_offset_in_queue > 0}  # fmt: skip
        try:
            cf.save_queue_ends(self.config.config_dir, ends)
        except OSError as e:  # a hint for the next start, not worth failing this start or stop for
            log.warning("cannot record the ConsumeQueue ends: %s", e)

    def _recover_topic_queue_table(self) -> None:
        table = {}
        cl_min = self.commitlog.min_offset
        for cq in self.consume_queues.all():
            table[f"{cq.topic}-{cq.queue_id}"] = cq.max_offset_in_queue
            cq.correct_min_offset(cl_min)
        self.commitlog.topic_queue_table = table

    def shutdown(self) -> None:
        """Stop services, wait for dispatch, flush everything, remove the abort marker."""
        if not self._running:
            return
        if self._delivers:
            self.schedule.shutdown()  # before puts stop: a delivery under way completes and its offset is saved
            self.timers.shutdown()
        self._running = False
        self._refresh_takes_puts()
        with self.commitlog.put_lock:
            self.commitlog.writable = False  # appends already past the running check stop here
        if self._housekeeping is not None:
            self._housekeeping.shutdown()
        self.reput.shutdown()
        try:
            while self.reput.do_reput() > 0:
                pass
        except OSError as e:  # a full disk: no room for a new ConsumeQueue or IndexFile
            log.warning("dispatch stopped at CommitLog offset %d: %s; the abort marker stays, so the next start "
                        "dispatches the rest", self.reput.reput_from, e)  # fmt: skip
        if self._flush_service is not None:
            self._flush_service.shutdown()
        self._on_commitlog_flushed(self.commitlog.flush()[1])
        self._flush_consume_queues(thorough=True)
        self.index.flush()
        fully_dispatched = self.reput.behind_bytes <= 0
        if fully_dispatched:
            self._save_queue_ends()
        self._sync_manifest()
        self._close_files()
        if fully_dispatched:
            abort_file(self.root).unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()

    def prepare_segment(self) -> None:
        """Create the active CommitLog segment now if there is none (blocking; call it off the event loop).

        Otherwise the first put pre-fills a whole segment (1 GiB by default) inside the put lock.  On a full disk
        the store starts all the same, refusing puts until a segment fits.
        """
        if self.commitlog.queue.last() is None:
            try:
                self.commitlog.queue.last_or_new(self.commitlog.max_offset)
            except OSError as e:
                self._append_failed(e)

    def _close_files(self) -> None:
        self.reput.close()  # the compiled dispatch loop's hold on the ConsumeQueue and IndexFile maps
        self.commitlog.close()
        for cq in self.consume_queues.all():
            cq.close()
        self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()

    def __enter__(self) -> MessageStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # =================================================================================================
    # put
    # =================================================================================================
    @property
    def disk_full(self) -> bool:
        """Over diskSpaceWarningLevelRatio: puts are refused until the disk has room."""
        return self._disk_full

    @disk_full.setter
    def disk_full(self, full: bool) -> None:
        self._disk_full = full
        self._refresh_takes_puts()

    def _refresh_takes_puts(self) -> None:
        self._takes_puts = self._running and not self._disk_full and self.config.broker_role != BrokerRole.SLAVE
        self._fast.enabled = self._takes_puts

    def _check(self, msg: records.MessageRecord) -> PutMessageResult | None:
        if not self._takes_puts:
            return self._refusal()
        if not msg.topic or (len(msg.topic) > 127 and len(msg.topic.encode("utf-8")) > 0x7FFF):
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, error="topic is empty or too long")
        if len(msg.body) > self.config.max_message_size:
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                error=f"body of {len(msg.body)} bytes exceeds maxMessageSize {self.config.max_message_size}",
            )
        if len(msg.properties) > records.MAX_PROPERTIES_LENGTH:
            return PutMessageResult(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                error=f"properties of {len(msg.properties)} bytes exceed {records.MAX_PROPERTIES_LENGTH}",
            )
        return None

    def _refusal(self) -> PutMessageResult:
        """Why this store takes no put now (not running, a slave, a full disk)."""
        if not self._running:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error="store is not running")
        if self.config.broker_role == BrokerRole.SLAVE:
            return PutMessageResult(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                error="message store is in slave mode, so putMessage is forbidden",
            )
        if self.disk_full:
            cl, cq, index = self._disk_ratios
            return PutMessageResult(  # RocketMQ's answer, word for word: clients and operators look for it
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                error="service not available now. It may be caused by one of the following reasons: the broker's "
                f"disk is full [CL: {cl:5.2f} CQ: {cq:5.2f} INDEX: {index:5.2f}], messages are put to the slave, "
                "message store has been shut down, etc.",
            )
        return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error="store takes no puts")

    def put_nowait(
        self, msgs: Sequence[records.MessageRecord] | Run, wait: bool = True
    ) -> tuple[PutMessageResult, Future | None]:
        """The one put (``asyncPutMessage`` / ``asyncPutMessages``): one message, a batch of one topic-queue's
        messages as consecutive records, or a :class:`Run` already encoded; in SYNC_FLUSH also the future of its
        group commit (none when ``wait`` is false or, for messages, the first says WAIT=false).

        A single message with a delay level or a timer is parked for later delivery (``store.schedule``), as
        Java's put does, and is encoded straight into the segment (``records.put_record``); a batch is encoded,
        then copied in one piece (``runs.put_run``).  A run's caller has held each message to the checks messages
        get here (topic, body and properties sizes) and parks nothing; its result carries no message ids
        (``runs.offset_msg_ids`` gives them from the run)."""
        if isinstance(msgs, Run):
            if not self._takes_puts:
                return self._refusal(), None
            advances = records.is_consumable(msgs.sys_flag)
            item = (msgs.data, msgs.count, advances)
            return self._append(runs.put_run, item, msgs.topic, msgs.queue_id, advances, msgs.count, wait)
        first = msgs[0]
        if len(msgs) == 1:
            if not wait or self._group_commit is None:
                result = self._fast.put_record(first)  # a plain message's whole put in one call
                if result is not None:
                    return result, None
            return self._put_one(first, wait)
        encoded = []
        for m in msgs:
            bad = self._check(m)
            if bad is not None:
                return bad, None
            m.store_host = self.store_host
            encoded.append(records.encode_record(m))
        run = b"".join(encoded)
        advances = records.is_consumable(first.sys_flag)
        result, fut = self._append(runs.put_run, (run, len(msgs), advances), first.topic, first.queue_id, advances,
                                   len(msgs), wait and wants_wait(first))  # fmt: skip
        if result.status is PutMessageStatus.PUT_OK and result.append is not None:
            offset = result.append.wrote_offset
            result.msg_ids = runs.offset_msg_ids(self.store_host, offset, run, len(msgs)).split(",")
        return result, fut

    def put_message(self, msgs: records.MessageRecord | Sequence[records.MessageRecord]) -> PutMessageResult:
        """:meth:`put_nowait` of one message or a batch; in SYNC_FLUSH wait for its group commit
        (FLUSH_DISK_TIMEOUT after syncFlushTimeout)."""
        if self._group_commit is None:
            fast = self._fast.put_record(msgs)  # a plain message's whole put in one call (None for a batch)
            if fast is not None:
                return fast
        if type(msgs) is records.MessageRecord:
            result, fut = self._put_one(msgs, True)
        else:
            result, fut = self.put_nowait(msgs)  # type: ignore[arg-type]
        if fut is not None:
            try:
                flushed = fut.result(timeout=self.config.sync_flush_timeout / 1000)
            except FutureTimeout:
                flushed = False
            if not flushed:
                result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
        return result

    def _put_one(self, msg: records.MessageRecord, wait: bool) -> tuple[PutMessageResult, Future | None]:
        """:meth:`put_nowait` of one message that ``FastPut.put_record`` declined or must not take (it would wait
        for a group commit): parked first when it has a delay level or a timer, refused with its answer, or put;
        a success is answered here in one frame, failures by :meth:`_append` and :meth:`_appended`."""
        if may_park(msg.properties):
            refused = self._park(msg)
            if refused is not None:
                return refused, None
        bad = self._check(msg)
        if bad is not None:
            return bad, None
        store_host = msg.store_host = self.store_host
        advances = records.is_consumable(msg.sys_flag)
        try:
            res = self.commitlog.put(records.put_record, msg, f"{msg.topic}-{msg.queue_id}", advances)
        except OSError as e:
            return self._append_failed(e), None
        if res.status is not AppendStatus.PUT_OK:
            return self._appended(res, False)
        offset = res.wrote_offset
        self.reput.notify_appended()
        end = offset + res.wrote_bytes
        for listener in self._append_listeners:
            listener(end)
        result = PutMessageResult(PutMessageStatus.PUT_OK, res, [msgid.create_offset_msg_id(store_host, offset)])
        commit = self._group_commit
        if commit is not None and wait and wants_wait(msg):
            return result, commit.submit(end)
        return result, None

    def _park(self, msg: records.MessageRecord) -> PutMessageResult | None:
        """Park a delayed or timer message (``store.schedule.park``); None when it is, else why it cannot be."""
        cfg = self.config
        try:
            park(msg, len(self.delay_millis), timer_enable=cfg.timer_wheel_enable,
                 timer_max_delay_sec=cfg.timer_max_delay_sec, timer_precision_ms=cfg.timer_precision_ms)  # fmt: skip
        except ParkRefused as e:
            status = PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL
            if e.not_enabled:
                status = PutMessageStatus.WHEEL_TIMER_NOT_ENABLE
            return PutMessageResult(status, error=str(e))
        return None

    def _append(
        self, encode: Encoder, item: object, topic: str, queue_id: int, advances: bool, count: int, wait: bool
    ) -> tuple[PutMessageResult, Future | None]:
        """``CommitLog.put`` of ``item`` by ``encode``, answered as a put (:meth:`_appended`)."""
        try:
            res = self.commitlog.put(encode, item, f"{topic}-{queue_id}", advances, count)
        except OSError as e:
            return self._append_failed(e), None
        return self._appended(res, wait)

    def _append_failed(self, e: OSError) -> PutMessageResult:
        """A new segment could not be created: on a full disk the store is marked full at once (the disk check
        runs now, not at the next clean pass) and the put refused as every put is until space is freed."""
        log.error("append failed: %s", e)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            self._no_room = True
            self.check_disk_space()
            if not self._takes_puts:
                return self._refusal()
        return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, error=str(e))

    def _appended(self, res: AppendResult, wait: bool) -> tuple[PutMessageResult, Future | None]:
        """The put's result (without message ids) once the CommitLog answered: dispatch and the append listeners
        told, the group commit's future in SYNC_FLUSH."""
        if res.status is not AppendStatus.PUT_OK:
            if res.status is AppendStatus.NOT_WRITABLE:
                return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error="store is shutting down"), None
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, res, error=res.status.value), None
        off = self._told(res)
        result = PutMessageResult(PutMessageStatus.PUT_OK, res, [])
        commit = self._group_commit
        if commit is not None and wait:
            return result, commit.submit(off)
        return result, None

    def _told(self, res: AppendResult) -> int:
        """Dispatch and the append listeners told of an append; the new end of the log."""
        self.reput.notify_appended()
        end = res.wrote_offset + res.wrote_bytes
        for listener in self._append_listeners:
            listener(end)
        return end

    def _put_delivered(self, topic: str, queue_id: int, encoded: list[bytes]) -> bool:
        """Append copies of parked messages, already encoded (``records.retarget_record``), as one run; like
        Java's re-put with WAIT=false it never waits for a flush."""
        if not self._running or self.disk_full:
            return False
        run = Run(b"".join(encoded), len(encoded), topic, queue_id, records.TRANSACTION_NOT_TYPE)
        return self.put_nowait(run, wait=False)[0].ok

    @property
    def group_commit(self) -> GroupCommitService | None:
        """SYNC_FLUSH's commit thread once the store has started (None in ASYNC_FLUSH): an asynchronous caller
        puts with ``wait=False``, asks it for a commit and hears of it as a group listener (the broker's
        ``flush_acks``)."""
        return self._group_commit

    def add_append_listener(self, listener: Callable[[int], None]) -> None:
        """Called on the appending thread after each put with the new end of the CommitLog (HA wake-ups)."""
        self._append_listeners = self._fast.listeners = [*self._append_listeners, listener]

    # =================================================================================================
    # replication
    # =================================================================================================
    def append_replica(self, offset: int, data: bytes | memoryview) -> int:
        """A slave stores bytes of its master's CommitLog at ``offset``; returns the new end of its log.

        Raises ``ReplicaAppendError`` when they do not continue the log exactly."""
        end = self.commitlog.append_raw(offset, data)
        self.reput.notify_appended()
        return end

    def change_role(self, role: BrokerRole) -> None:
        """Controller mode: the broker was made master or slave while running (``changeToMaster`` /
        ``changeToSlave``); its HA client, if any, has stopped.  A new master first dispatches everything it copied,
        cuts a record its old master had not finished sending (``truncateInvalidMsg``) and takes each queue's next
        offset from its ConsumeQueues; only a master takes puts and delivers delayed and timer messages."""
        if role == self.config.broker_role:
            return
        if role == BrokerRole.SLAVE:
            if self._delivers:
                self.schedule.shutdown()
                self.timers.shutdown()
                self._delivers = False
            self.config.broker_role = role
            self.reput.replica = True
            self._refresh_takes_puts()
            return
        while self.reput.do_reput() > 0:
            pass
        end = self.reput.reput_from
        if end < self.commitlog.max_offset:  # the reput service stopped at a record whose rest never came
            log.warning("CommitLog %s: a half-received record at offset %d (%d bytes) is cut before serving as master",
                        self.commitlog.queue.directory, end, self.commitlog.max_offset - end)  # fmt: skip
            self.truncate_to(end)
        self.reput.replica = False
        self._recover_topic_queue_table()
        self.config.broker_role = role
        if not self._delivers:
            self._delivers = True
            self.schedule.start()
            self.timers.start()
        self._refresh_takes_puts()

    def truncate_to(self, offset: int) -> None:
        """Cut the CommitLog at ``offset`` (a record boundary) with the ConsumeQueue units and index entries of the
        records past it; dispatch resumes there.  For a replica whose log must end where its master's agrees."""
        with self.reput.paused(), self.commitlog.put_lock:
            self.index.truncate(offset, lambda phy: store_time_at(self.commitlog, phy))  # reads records before the cut
            self.commitlog.queue.truncate_dirty_files(offset)
            for cq in self.consume_queues.all():
                cq.truncate_dirty_logic_files(offset)
            self.reput.set_reput_from(min(self.reput.reput_from, offset))
            self._recover_topic_queue_table()

    def replica_opens_segment(self, offset: int) -> bool:
        """Whether replicated bytes at ``offset`` start a new segment file (a blocking create: off the event loop)."""
        mf = self.commitlog.queue.last()
        return mf is None or (mf.is_full() and offset >= mf.end_offset) or (mf.wrote == 0 and offset != mf.wrote_offset)

    def tiered_segments(self) -> list[int]:
        """Base offsets of the segments the manifest says are tiered (and not deleted yet)."""
        return [e.base_offset for e in self.manifest.entries() if e.state == SegmentState.TIERED]

    def adopt_tiered(self, bases: list[int]) -> list[int]:
        """A slave: the segments its master tiered, that this store holds whole (sealed: not its last segment),
        become tiered here too, and the clean pass deletes them as the master's does.  Nothing else ever is."""
        files = self.commitlog.queue.files
        sealed = {mf.file_from_offset for mf in files[:-1]}
        return self.manifest.adopt_tiered([b for b in bases if b in sealed])

    def commitlog_data(self, offset: int, max_bytes: int) -> bytes | None:
        """``getCommitLogData``: up to ``max_bytes`` of the CommitLog from ``offset``, never past the end of its
        segment; None when nothing is written there yet."""
        mf = self.commitlog.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        n = min(mf.wrote - pos, max_bytes)
        return mf.mm[pos : pos + n] if n > 0 else None

    # =================================================================================================
    # dispatch
    # =================================================================================================
    def find_consume_queue(self, topic: str, queue_id: int, create: bool = True) -> ConsumeQueue | None:
        return self.consume_queues.find(topic, queue_id, create)

    def all_consume_queues(self) -> list[ConsumeQueue]:
        return self.consume_queues.all()

    def delete_topic(self, topic: str) -> int:
        """``DefaultMessageStore.deleteTopics`` for one topic (blocking: call it off the event loop): destroy its
        ConsumeQueues and their files and forget its queue offsets, so a topic re-created under the name starts
        at offset 0; the CommitLog keeps the records (and the IndexFile their keys). Returns the queues removed.

        Done with dispatch paused, so no record of the topic is half-dispatched meanwhile. The records appended
        before are never dispatched again (those not dispatched yet, and those a crash recovery re-dispatches:
        ``deletedTopics.json`` remembers where the log ended), so they never re-create the old queues."""
        # The clean pass walks every queue's files: it must not meet one half destroyed.
        with self._clean_lock, self.reput.paused():
            end = self.commitlog.remove_topic(topic)
            self._build_cq.forget_topic(topic, end)
            cl_min = self.commitlog.min_offset
            self._deleted_topics = {t: e for t, e in self._deleted_topics.items() if e > cl_min} | {topic: end}
            cf.save_deleted_topics(self.config.config_dir, self._deleted_topics)  # before any file goes
            queues = self.consume_queues.remove_topic(topic)
            for cq in queues:
                cq.destroy()  # unlinks; a pull reading one of its files right now finishes from the mapping
            try:
                topic_dirs = [names.path_under(self.consume_queues.root, topic)]
            except names.IllegalName as e:  # no directory of the store has such a name: nothing to remove
                log.warning("topic %r deleted; no directory looked for: %s", topic, e)
                topic_dirs = []
            for qdir in [cq.queue.directory for cq in queues] + topic_dirs:
                try:
                    qdir.rmdir()  # only if empty, as RocketMQ: a file the store does not know of stays
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("topic %s deleted, but %s stays: %s", topic, qdir, e)
        log.info("topic %s: %d consume queues destroyed; records before CommitLog offset %d are not dispatched",
                 topic, len(queues), end)  # fmt: skip
        return len(queues)

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        """Called from the dispatch thread each time a message becomes readable."""
        self.reput.add_arrival_listener(listener)

    def remove_arrival_listener(self, listener: ArrivalListener) -> None:
        self.reput.remove_arrival_listener(listener)

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.reput.behind_bytes

    # =================================================================================================
    # reads
    # =================================================================================================
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        return cq.max_offset_in_queue if cq else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        return cq.min_offset_in_queue if cq else 0

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        tag_codes: set[int] | None = None,
        max_total_bytes: int = MAX_TRANSFER_BYTES,
        record_filter: Callable[[bytes], bool] | None = None,
    ) -> GetMessageResult:
        """``DefaultMessageStore.getMessage``: raw records from ``offset``; ``tag_codes`` None means ``*``.
        ``record_filter`` (``MessageFilter.isMatchedByCommitLog``) sees each record that passed the tags and
        drops those it answers False for, as a property (SQL92) filter does."""
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        if hi == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        result = GetMessageResult(GetMessageStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
        cl_min = self.commitlog.min_offset
        max_nums = min(max_msg_nums, MAX_TRANSFER_COUNT) if max_msg_nums > 0 else MAX_TRANSFER_COUNT
        next_offset = offset
        total = 0
        removing = False
        max_phy_pulling = 0
        for index, phy, size, tags in cq.iter_units(offset, MAX_FILTER_UNITS):
            if len(result.messages) >= max_nums or (result.messages and total + size > max_total_bytes):
                break
            next_offset = index + 1
            if size == units.CQ_FILL_SIZE:
                continue
            if phy < cl_min:
                removing = True
                continue
            if tag_codes is not None and _java_int(tags) not in tag_codes:
                continue
            data = self.commitlog.read(phy, size)
            if data is None:
                removing = True
                continue
            if record_filter is not None and not record_filter(data):
                continue
            result.messages.append(data)
            result.queue_offsets.append(index)
            total += size
            max_phy_pulling = phy
        result.next_begin_offset = next_offset
        if result.messages:
            result.status = GetMessageStatus.FOUND
            memory = _PHYSICAL_MEMORY * self.config.access_message_in_memory_max_ratio // 100
            result.suggest_pulling_from_slave = self.commitlog.max_offset - max_phy_pulling > memory
        elif removing:
            result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
        elif next_offset == offset:
            result.status = GetMessageStatus.OFFSET_FOUND_NULL
        return result

    def look_message_by_offset(self, commitlog_offset: int) -> bytes | None:
        """The raw record at a CommitLog offset, or None."""
        return self.commitlog.read_record_at(commitlog_offset)

    def view_message_by_id(self, offset_msg_id: str) -> bytes | None:
        _host, off = msgid.decode_offset_msg_id(offset_msg_id)
        return self.look_message_by_offset(off)

    def query_message(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryMessageResult:
        """Messages indexed under ``topic#key`` stored in [begin, end]; newest index files first, ≤ 64."""
        offsets, last_ts, last_phy = self.index.query_offsets(topic, key, max_num, begin, end)
        msgs = []
        for off in offsets:
            data = self.look_message_by_offset(off)
            if data is not None:
                msgs.append(data)
        return QueryMessageResult(msgs, last_ts, last_phy)

    def _unit_store_time(self, cq: ConsumeQueue, index: int) -> int:
        unit = cq.get_unit(index)
        if unit is None:
            return -1
        return self.commitlog.pickup_store_timestamp(unit[0], unit[1])

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int, upper: bool = False) -> int:
        """First offset stored at or after ``timestamp`` (5.x LOWER); with ``upper`` the last one at or before."""
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return 0
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue - 1
        if hi < lo:
            return lo
        while lo <= hi and self._unit_store_time(cq, lo) < 0:
            lo += 1  # units pointing at deleted data
        first, last = lo, hi
        if first > last:
            return cq.max_offset_in_queue
        if upper:
            ans = first
            while lo <= hi:
                mid = (lo + hi) // 2
                if self._unit_store_time(cq, mid) <= timestamp:
                    ans, lo = mid, mid + 1
                else:
                    hi = mid - 1
            return ans
        ans = last + 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._unit_store_time(cq, mid) >= timestamp:
                ans, hi = mid, mid - 1
            else:
                lo = mid + 1
        return min(ans, last)

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return -1
        return self._unit_store_time(cq, cq.min_offset_in_queue)

    def earliest_message_time(self) -> int:
        """``getEarliestMessageTime``: the store time of the CommitLog's first record, -1 when it holds none."""
        if self.commitlog.min_offset >= self.commitlog.max_offset:
            return -1
        first = self.commitlog.read_record_at(self.commitlog.min_offset)
        return records.read_store_timestamp(first, 0) if first else -1

    def get_message_store_timestamp(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        return -1 if cq is None else self._unit_store_time(cq, offset)

    @property
    def min_phy_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_phy_offset(self) -> int:
        return self.commitlog.max_offset

    def runtime_info(self) -> dict[str, str]:
        info = {
            "commitLogMinOffset": str(self.commitlog.min_offset),
            "commitLogMaxOffset": str(self.commitlog.max_offset),
            "dispatchBehindBytes": str(self.dispatch_behind_bytes),
            "flushedOffset": str(self.commitlog.queue.flushed_offset),
            "consumeQueueCount": str(len(self.consume_queues)),
            "indexFileCount": str(len(self.index.files)),
            "commitLogDiskRatio": str(self.disk_ratio),
            "consumeQueueDiskRatio": str(self._disk_ratios[1]),
            "earliestMessageTimeStamp": str(self.earliest_message_time()),
        }
        for level, offset in sorted(self.schedule.offset_table().items()):  # ScheduleMessageService.buildRunningStats
            end = self.get_max_offset_in_queue(delay.SCHEDULE_TOPIC, level - 1)
            info[f"scheduleMessageOffset_{level}"] = f"{offset},{end}"
        info["timerOffsetBehind"] = str(self.timers.offset_behind)
        return info

    # =================================================================================================
    # flush bookkeeping and retention
    # =================================================================================================
    def _on_commitlog_flushed(self, store_timestamp: int) -> None:
        if self.checkpoint is not None and store_timestamp:
            self.checkpoint.physic_msg_timestamp = store_timestamp

    def _on_index_file_flushed(self, end_timestamp: int) -> None:
        if self.checkpoint is not None:
            self.checkpoint.index_msg_timestamp = end_timestamp
            self.checkpoint.flush()

    def _flush_consume_queues(self, thorough: bool) -> None:
        logics_ts = self._build_cq.last_store_timestamp
        least = 0 if thorough else self.config.flush_consume_queue_least_pages * 4096
        for cq in self.all_consume_queues():
            if cq.queue.dirty_bytes() >= max(least, 1):
                cq.flush()
        if thorough and self.checkpoint is not None:
            if logics_ts:
                self.checkpoint.logics_msg_timestamp = logics_ts
            self.checkpoint.flush()

    def _sync_manifest(self) -> None:
        """Bring segments.json up to the files; on a full disk it stays as it was (the next sync catches up)."""
        stats = {}
        for base, s in list(self.reput.sealed_stats.items()):
            stats[base] = (s.count, s.first_store_time, s.last_store_time)
        mfs = list(self.commitlog.queue.files)
        files = [(mf.file_from_offset, mf.file_size) for mf in mfs]
        counted = {e.base_offset for e in self.manifest.entries() if e.message_count is not None}
        for mf in mfs[:-1]:
            if mf.file_from_offset not in counted and mf.file_from_offset not in stats:
                # Sealed before a crash, and before where recovery re-dispatched from: count it here.
                c = count_records(mf.mm, mf.file_size)
                if c.complete:
                    stats[mf.file_from_offset] = (c.count, c.first_store_time, c.last_store_time)
        try:
            self.manifest.sync_files(files, stats)
        except OSError as e:
            log.warning("segment manifest not updated: %s", e)
            return
        for base in stats:
            self.reput.sealed_stats.pop(base, None)

    def delete_expired_files_manually(self) -> None:
        """Run a clean pass now regardless of the deletion hour (mqadmin deleteExpiredCommitLog)."""
        self._manual_delete.set()
        self.clean_expired_files()

    def clean_expired_files(self) -> list[int]:
        """One ``CleanCommitLogService`` pass; returns the base offsets of deleted segments."""
        with self._clean_lock:  # the background pass and a manual one must not delete side by side
            return self._clean_expired_files()

    def check_disk_space(self) -> float:
        """``CleanCommitLogService.isSpaceToDelete``'s measurement: mark the disk full (puts refused) above
        diskSpaceWarningLevelRatio and writable again below it; returns the used ratio (-1: unknown).

        Unlike RocketMQ, a disk on which an append found no room for a new segment (filled between two checks,
        or too small for the ratio to tell) stays full until a whole segment fits again."""
        cfg = self.config
        with self._disk_lock:
            ratios = [disk_used_ratio(p) for p in (cfg.commitlog_dir, self.root)]
            ratio = -1.0 if min(ratios) < 0 else max(ratios)
            full = ratio * 100 > cfg.disk_space_warning_level_ratio
            if self._no_room:
                free = disk_free_bytes(cfg.commitlog_dir)
                self._no_room = 0 <= free < cfg.mapped_file_size_commit_log
                full = full or self._no_room
            if full and not self.disk_full:
                log.error("disk maybe full soon (%.2f used), so mark disk full: puts are refused", ratio)
            elif self.disk_full and not full:
                log.info("disk space OK (%.2f used), so mark disk ok: puts are accepted again", ratio)
            self._disk_ratios = (ratio, _used_ratio(cfg.consume_queue_dir), _used_ratio(cfg.index_dir))
            self.disk_ratio, self.disk_full = ratio, full
            return ratio

    def _clean_expired_files(self) -> list[int]:
        cfg = self.config
        ratio = self.check_disk_space()  # first: a full disk is seen before anything below needs room on it
        self._sync_manifest()
        # RocketMQ: a pass runs outside the deletion hour when the disk is over diskMaxUsedSpaceRatio (or cannot
        # be measured); above the clean-forcibly level files go regardless of their age
        space_to_delete = ratio < 0 or ratio * 100 > cfg.disk_max_used_space_ratio
        clean_at_once = cfg.clean_file_forcibly_enable and (
            self.disk_full or ratio * 100 > cfg.disk_space_clean_forcibly_ratio
        )
        now_s = time.time()
        entries = self.manifest.entries()
        reserved_ms = cfg.file_reserved_time * 3600 * 1000
        # Only a master tiers: a slave's segments wait, sealed, for its master's manifest to say tiered (adopt_tiered)
        follows_master = cfg.broker_role == BrokerRole.SLAVE and cfg.expired_segment_policy == ExpiredSegmentPolicy.TIER
        to_expire = [
            e.base_offset
            for e in entries
            if e.state == SegmentState.SEALED
            and not follows_master
            and (clean_at_once or (e.last_store_time or _mtime_ms(self, e.base_offset)) + reserved_ms <= now_s * 1000)
        ]
        if to_expire:
            self.manifest.expire(to_expire)
        manual = self._manual_delete.is_set()
        self._manual_delete.clear()
        if not (is_deletion_hour(cfg.delete_when) or space_to_delete or manual):
            return []
        deletable = {SegmentState.TIERED}
        if cfg.expired_segment_policy == ExpiredSegmentPolicy.DELETE:
            deletable |= {SegmentState.EXPIRED}
        return delete_leading_segments(
            self.commitlog, self.manifest, self.all_consume_queues(), self.index, deletable,
            dispatched_to=self.reput.reput_from, limit=10,
        )  # fmt: skip


def _used_ratio(path: Path) -> float:
    """``disk_used_ratio`` of the disk ``path`` is or will be on (a directory not made yet is on its parent's)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return disk_used_ratio(path)


def _mtime_ms(store: MessageStore, base: int) -> int:
    try:
        return int((store.config.commitlog_dir / units.offset_to_file_name(base)).stat().st_mtime * 1000)
    except FileNotFoundError:
        return 0


def wants_wait(msg: records.MessageRecord) -> bool:
    """``isWaitStoreMsgOK``: unless the producer said WAIT=false, a send waits for the flush (and the slave)."""
    return msg.properties.find(b"WAIT\x01false\x02") < 0  # (find: ``in`` raises and clears a TypeError first)


def _java_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v & 0x80000000 else v


class _Housekeeping(threading.Thread):
    """ConsumeQueue flushing, checkpoint persistence and the retention pass."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__(name="store-housekeeping", daemon=True)
        self.store = store
        self._stopped = threading.Event()

    def run(self) -> None:
        cfg = self.store.config
        interval = cfg.flush_interval_consume_queue / 1000
        last_thorough = last_clean = time.monotonic()
        while not self._stopped.wait(interval):
            now = time.monotonic()
            try:
                if now - last_clean >= cfg.clean_resource_interval / 1000:
                    last_clean = now
                    self.store.clean_expired_files()  # the disk check first of all
                thorough = now - last_thorough >= cfg.flush_consume_queue_thorough_interval / 1000
                if thorough:
                    last_thorough = now
                self.store._flush_consume_queues(thorough)
            except OSError as e:  # a full disk: already reported by the disk check
                log.error("store housekeeping: %s", e)
            except Exception:
                log.exception("store housekeeping failed")

    def shutdown(self) -> None:
        self._stopped.set()
        self.join()
