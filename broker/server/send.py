"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and CONSUMER_SEND_MSG_BACK (36).

Delay levels and timers are parked by the store's put (``store.schedule``), so a send with ``DELAY`` and a
CONSUMER_SEND_MSG_BACK (level 3 + reconsumeTimes unless the consumer names one) wait in SCHEDULE_TOPIC_XXXX.

Decisions where the store is not RocketMQ's yet:
- Transactional half messages (``TRAN_MSG=true``) go to ``RMQ_SYS_TRANS_HALF_TOPIC`` (``half_messages``); with
  ``rejectTransactionMessage=true`` they are refused with NO_PERMISSION, as in Java.
- Batch messages keep their own properties only (plus ``CLUSTER``): the batch wrapper's properties are not
  appended to each inner message (RocketMQ <= 5.3.3 did, which gave every message the batch's UNIQ_KEY).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable

from broker.remoting import send_codec
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Connection, Handler
from broker.remoting.errors import HeaderError, RequestRefused
from broker.remoting.headers import ConsumerSendMsgBackRequestHeader
from broker.server import half_messages
from broker.server.context import BrokerContext
from broker.server.recall import send_recall_handle
from broker.server.send_check import SendCheck, SendRequest
from store import names
from store.commitlog import AppendResult
from store.config import BrokerRole, FlushDiskType
from store.constants import TIMER_TOPIC
from store.format import properties, records, runs
from store.format import transaction as tx_format
from store.message_store import PutMessageResult, PutMessageStatus, Run
from store.schedule import may_park

log = logging.getLogger(__name__)

_NO_WAIT = b"WAIT\x01false\x02"  # isWaitStoreMsgOK false: answered at once, as in ASYNC_FLUSH

PROPERTY_RETRY_TOPIC = properties.PROPERTY_RETRY_TOPIC

_STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.WHEEL_TIMER_NOT_ENABLE: ResponseCode.SYSTEM_ERROR,  # as Java answers it
}


_TRAN_MSG = "TRAN_MSG\x01true"  # in a V2 header's properties ("i"): a half message, for _half_fast


class _Held(enum.Enum):
    """A fast path's answer that its group commit will write (``FlushAcks.reply``), distinct from the fast
    paths' None, which hands the request to the general path."""

    HELD = 0


class SendProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.check = SendCheck(broker)

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send_inline,
            RequestCode.SEND_MESSAGE_V2: self.send_inline,
            RequestCode.SEND_BATCH_MESSAGE: self.send_inline,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
        }

    # --- handlers ------------------------------------------------------------------------------------------
    def send_inline(
        self, cmd: RemotingCommand, conn: Channel
    ) -> RemotingCommand | bytes | Awaitable[RemotingCommand | bytes] | None:
        """Codes 10, 310 and 320, as a plain function so the remoting layer answers without a task per request:
        in ASYNC_FLUSH nothing here waits and the response comes back at once; SYNC_FLUSH on the fast paths holds
        the request on its remoting ``Connection`` and returns None, the group commit then writing the ready frame
        (``_answer``, ``FlushAcks.reply``), or returns a future of that frame to any other channel (the
        proxy's); the general path returns a coroutine that waits for the flush, SYNC_MASTER a coroutine that
        waits for the slave.  As in a Java broker,
        the header's ``batch`` flag picks the batch path: the C++ client sends its batches as SEND_MESSAGE with
        ``batch=1``.  The fast paths answer with the reply frame already encoded (``bytes``)."""
        frame: bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None
        if cmd.code == RequestCode.SEND_MESSAGE_V2 and self._fast_store():
            if _TRAN_MSG in cmd.ext_fields.get("i", ""):  # a half message: _send_fast would refuse it
                frame = self._half_fast(cmd, conn) if self.broker.flush_acks is None else None
            else:
                if self.broker.flush_acks is not None:
                    self.broker.flush_acks.expect()  # before the put wakes dispatch: see FlushAcks.expect
                frame = self._send_fast(cmd, conn)
            if frame is not None:
                return None if frame is _Held.HELD else frame
        try:
            req = self.check.pre_send(cmd, conn.remote_host)
            if req.batch:
                frame = self._batch_fast(cmd, conn, req) if self._fast_store() else None
                if frame is not None:
                    return None if frame is _Held.HELD else frame
                self.check.batch_records(cmd.body, req)
        except RequestRefused as e:
            return cmd.response(e.code, e.remark)
        except HeaderError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        unsaved = self.broker.topics.unsaved
        if unsaved and (req.header.topic in unsaved or req.msgs[0].topic in unsaved):
            return self._put_when_topic_saved(cmd, req)  # created by this send or one just before
        return self._put(cmd, req)

    def _put(self, cmd: RemotingCommand, req: SendRequest) -> RemotingCommand | Awaitable[RemotingCommand]:
        sc = self.broker.store_config
        if sc.flush_disk_type == FlushDiskType.SYNC_FLUSH or sc.broker_role == BrokerRole.SYNC_MASTER:
            return self._put_and_wait(cmd, req)
        result, _ = self.broker.store.put_nowait(req.msgs)  # ASYNC_FLUSH: never a future to wait for
        if result.ok:
            self.broker.stats.put(req.header.topic, len(req.msgs), result.append.wrote_bytes if result.append else 0)
        return self._reply(cmd, result, req)

    async def _put_when_topic_saved(self, cmd: RemotingCommand, req: SendRequest) -> RemotingCommand:
        """The topic's config on disk first (``createTopicInSendMessageMethod`` persists): an acknowledged message
        is never in a queue the restarted broker does not know of. The write runs in a worker thread."""
        await self.broker.topics_saved()
        put = self._put(cmd, req)
        return put if isinstance(put, RemotingCommand) else await put

    async def _put_and_wait(self, cmd: RemotingCommand, req: SendRequest) -> RemotingCommand:
        return self._reply(cmd, await self.broker.put(req.msgs), req)

    # --- the fast paths: records encoded into one run, appended in one copy, the reply frame built at once ------
    def _fast_store(self) -> bool:
        """No synchronous slave: a put's answer is ready at once (ASYNC_FLUSH), or when its group commit is done
        (SYNC_FLUSH: ``_answer``)."""
        return self.broker.store_config.broker_role != BrokerRole.SYNC_MASTER

    def _answer(
        self, cmd: RemotingCommand, conn: Channel, msg_id: str, queue_id: int, queue_offset: int, uniq: str | None,
        end: int, props: bytes,
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held:  # fmt: skip
        """A fast path's answer to a put appended with ``wait=False`` (its records end at ``end``, the log offset a
        group commit must cover before the answer goes out): the reply frame (``send_codec.send_reply``), held in
        SYNC_FLUSH, unless the producer said WAIT=false, until the group commit covering the record (``FlushAcks``:
        one loop callback per group, no task, no future per put in the commit thread), which sends it, or the same
        answer coded FLUSH_DISK_TIMEOUT when it is not on disk within syncFlushTimeout (Java's answer: the message
        is stored; only its flush is not confirmed)."""
        b = self.broker
        c = b.config
        frame = send_codec.send_reply(cmd.opaque, cmd.serialize_type, msg_id, queue_id, queue_offset, uniq,
                                      c.region_id, c.trace_on)  # fmt: skip
        acks = b.flush_acks
        if acks is None or _NO_WAIT in props:
            return frame
        if isinstance(conn, Connection) and not cmd.is_oneway:
            # a remoting channel: the group commit writes the reply itself (FlushAcks.reply), no future per send
            acks.reply(end, conn, frame)
            return _Held.HELD
        return acks.future(end, frame)

    def _put_run(self, run: Run, stat_topic: str) -> tuple[str, AppendResult] | None:
        """A fast path's run put without waiting and counted: its offset message ids and where it went; None when
        the store refused it (nothing stored: the general path answers with the store's status)."""
        b = self.broker
        result, _ = b.store.put_nowait(run, wait=False)
        append = result.append
        if not result.ok or append is None:
            return None
        b.stats.put(stat_topic, run.count, append.wrote_bytes)
        return runs.offset_msg_ids(b.store.store_host, append.wrote_offset, run.data, run.count), append

    def _send_fast(
        self, cmd: RemotingCommand, conn: Channel
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A plain SEND_MESSAGE_V2 (``SendCheck.plain``) to an existing, writable topic: the header read, the put
        (the record written straight into the segment: ``MessageStore.put_send``) and the reply frame are native
        calls and the Python between them is the send check.  None hands the request to the general path, which
        gives anything unusual (a new topic, a retry, a transaction, a delay, a field the store's encoder does not
        take, a refused put) the answer it always had; nothing is stored before None."""
        f = self.check.plain(cmd)
        if f is None:
            return None
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume, uniq = f
        b = self.broker
        put = b.store.put_send(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts, conn.remote_host,
                               reconsume, b.config.broker_cluster_name)  # fmt: skip
        if put is None:
            return None
        msg_id, offset, size, queue_offset = put
        b.stats.put(topic, 1, size)
        return self._answer(cmd, conn, msg_id, queue_id, queue_offset, uniq, offset + size, props)

    def _half_fast(
        self, cmd: RemotingCommand, conn: Channel
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A transaction's half message (``TRAN_MSG=true``, ``SendCheck.plain_half``) by the fast path's steps:
        the record the general path would store (``half_messages.to_half`` of its message: the same bytes)
        encoded in one call (``store.format.transaction.encode_half``), appended as a run of one, remembered for
        its END_TRANSACTION and answered with a ready frame, so that a transaction's first request costs what a
        plain send does. None hands anything unusual to the general path, nothing stored."""
        f = self.check.plain_half(cmd)
        if f is None:
            return None
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume = f
        b = self.broker
        try:
            run, uniq, half_props = tx_format.encode_half(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts,
                                                          conn.remote_host, b.store.store_host, reconsume,
                                                          b.config.broker_cluster_name)  # fmt: skip
        except (ValueError, OverflowError):  # properties too long, a field out of range: the general path answers
            return None
        done = self._put_run(Run(run, 1, tx_format.HALF_TOPIC, tx_format.HALF_QUEUE_ID,
                                 tx_format.half_sys_flag(sys_flag)), topic)  # fmt: skip
        if done is None:
            return None
        msg_id, a = done
        b.recent_halves.add(half_messages.StoredHalf(run, a.wrote_offset, a.queue_offset, a.store_timestamp,
                                                     born_ts, half_props))  # fmt: skip
        return self._answer(cmd, conn, msg_id, queue_id, a.queue_offset, uniq, a.wrote_offset + a.wrote_bytes, props)

    def _batch_fast(
        self, cmd: RemotingCommand, conn: Channel, req: SendRequest
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A batch decoded and encoded into one run in one native call (``runs.encode_batch``) and appended in one
        copy; None for a body the general path must answer (malformed, empty, an item too large) or a refused
        put (nothing stored then), or a topic whose creation is not on disk yet."""
        b = self.broker
        h = req.header
        if h.topic in b.topics.unsaved:
            return None
        try:
            run, count = runs.encode_batch(
                cmd.body, h.topic, h.queue_id, req.sys_flag, h.born_timestamp, conn.remote_host, b.store.store_host,
                h.reconsume_times or 0, b.config.broker_cluster_name, b.store_config.max_message_size,
            )  # fmt: skip
        except (ValueError, OverflowError):  # BatchBodyError, RunError, RecordEncodeError, a field out of range
            return None
        if count == 1 and may_park(run):
            return None  # one message: the general path's put treats it as a single send, which may be parked
        done = self._put_run(Run(run, count, h.topic, h.queue_id, req.sys_flag), h.topic)
        if done is None:
            return None
        msg_ids, a = done
        # a batch waits as its header's properties say (Java's MessageExtBatch takes them from the header)
        return self._answer(cmd, conn, msg_ids, h.queue_id, a.queue_offset, None, a.wrote_offset + a.wrote_bytes,
                            req.properties)  # fmt: skip

    def _reply(self, cmd: RemotingCommand, result: PutMessageResult, req: SendRequest) -> RemotingCommand:
        """The put's answer; a half message just stored is kept for its END_TRANSACTION
        (``half_messages.RecentHalves``)."""
        code = _STATUS_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
        if not result.ok:
            return cmd.response(code, result.error or result.status.value)
        append = result.append
        assert append is not None  # a put that succeeded (or only missed its flush) always says where it went
        b = self.broker
        rec = req.msgs[0]
        if req.half:
            rec.physical_offset, rec.queue_offset, rec.store_timestamp = (append.wrote_offset, append.queue_offset,
                                                                          append.store_timestamp)  # fmt: skip
            b.recent_halves.add(half_messages.StoredHalf.of(rec, records.encode_record(rec)))
        # SendMessageResponseHeader's extFields written directly (its to_ext would give the same keys in the
        # same order): this runs on every send.
        ext = {
            "msgId": result.msg_ids[0] if len(result.msg_ids) == 1 else ",".join(result.msg_ids),
            "queueId": str(req.header.queue_id),
            "queueOffset": str(append.queue_offset),
        }
        if req.uniq is not None:
            ext["transactionId"] = req.uniq
        c = b.config
        if rec.topic == TIMER_TOPIC and not req.batch:  # parked by the put: recallable until it is due
            handle = send_recall_handle(rec, c.broker_name)
            if handle is not None:
                ext["recallHandle"] = handle
        ext["MSG_REGION"] = c.region_id
        ext["TRACE_ON"] = "true" if c.trace_on else "false"
        return cmd.response(code, None, ext=ext)

    # --- CONSUMER_SEND_MSG_BACK --------------------------------------------------------------------------
    async def consumer_send_msg_back(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        """Re-deliver a message a consumer failed on through ``%RETRY%<group>`` after delay level 3 + reconsumeTimes
        (or the level the consumer asks for), or put it in ``%DLQ%<group>`` at the limit (``consumerSendMsgBack``)."""
        b = self.broker
        h = cmd.read_header(ConsumerSendMsgBackRequestHeader)
        cfg = b.groups.find(h.group)  # None for an illegal name: it would become the retry and DLQ topics' name
        if cfg is None:
            bad = names.group_error(h.group)
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, bad or f"no subscription group {h.group}")
        try:
            self.check.broker_writable()
            if cfg.retry_queue_nums <= 0:
                return cmd.response(ResponseCode.SUCCESS)  # the group takes no retries: Java drops the message
            target = b.create_retry_topic(h.group, cfg.retry_queue_nums)
            self.check.topic_writable(target)
        except RequestRefused as e:
            return cmd.response(e.code, e.remark)
        raw = await asyncio.to_thread(b.store.look_message_by_offset, h.offset)
        if raw is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {h.offset}")
        try:
            orig = records.decode_record(raw)
        except records.RecordError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        props = dict(orig.property_map)
        props.setdefault(PROPERTY_RETRY_TOPIC, orig.topic)
        props[properties.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        max_times = cfg.retry_max_times
        if h.max_reconsume_times is not None and h.max_reconsume_times >= 0:
            max_times = h.max_reconsume_times
        if orig.reconsume_times >= max_times or h.delay_level < 0:
            target = b.create_dlq_topic(h.group)  # as Java, the DLQ's permission is not checked
            props[properties.PROPERTY_DELAY_TIME_LEVEL] = "0"
        else:
            props[properties.PROPERTY_DELAY_TIME_LEVEL] = str(h.delay_level or 3 + orig.reconsume_times)
        props.setdefault(properties.PROPERTY_ORIGIN_MESSAGE_ID, orig.offset_msg_id)
        rec = records.MessageRecord(
            topic=target.topic_name,
            queue_id=random.randrange(target.write_queue_nums),
            body=orig.body,
            properties=properties.encode_properties(props),
            flag=orig.flag,
            sys_flag=orig.sys_flag,
            born_timestamp=orig.born_timestamp,
            born_host=orig.born_host,
            reconsume_times=orig.reconsume_times + 1,
        )
        if target.topic_name in b.topics.unsaved:
            await b.topics_saved()  # the retry or DLQ topic just created: on disk before the ack
        result = await b.put([rec])
        if result.ok:
            b.stats.sent_back(target.topic_name, h.group)
            return cmd.response(ResponseCode.SUCCESS)
        return cmd.response(ResponseCode.SYSTEM_ERROR, result.error or result.status.value)
