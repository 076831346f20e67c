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
from broker.server.send_check import EncodedSend, PlainSend, SendCheck, SendRequest
from store import names
from store.config import BrokerRole, FlushDiskType
from store.constants import TIMER_TOPIC
from store.format import properties, records, runs
from store.message_store import PutMessageResult, PutMessageStatus

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


class _Held(enum.Enum):
    """A fast put's answer that its group commit will write (``FlushAcks.reply``), distinct from None, which
    hands the request to the general path."""

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
        """Codes 10, 310 and 320, as a plain function so the remoting layer answers without a task per request.
        The send is read and checked once (``SendCheck.checked_send``); a common one is put without waiting and
        answered with its reply frame already encoded (:meth:`_put_fast`), anything else by the general path
        (:meth:`_put`): a coroutine where the answer waits (a topic just created, SYNC_FLUSH, SYNC_MASTER), else
        the response at once.  As in a Java broker, the header's ``batch`` flag picks the batch path: the C++
        client sends its batches as SEND_MESSAGE with ``batch=1``."""
        try:
            send = self.check.checked_send(cmd, conn, self._fast_store())
            if not isinstance(send, SendRequest):
                frame = self._put_fast(cmd, conn, send)
                if frame is not None:
                    return None if frame is _Held.HELD else frame
                send = self.check.checked_send(cmd, conn, False)  # the store refused it: the general path answers why
                assert isinstance(send, SendRequest)  # (what checked_send gives when not fast)
        except RequestRefused as e:
            return cmd.response(e.code, e.remark)
        except HeaderError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        unsaved = self.broker.topics.unsaved
        if unsaved and (send.header.topic in unsaved or send.msgs[0].topic in unsaved):
            return self._put_when_topic_saved(cmd, send)  # created by this send or one just before
        return self._put(cmd, send)

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

    # --- the fast path: the record written straight into the segment or a run appended in one copy ------------
    def _fast_store(self) -> bool:
        """No synchronous slave: a put's answer is ready at once (ASYNC_FLUSH), or when its group commit is done
        (SYNC_FLUSH: ``FlushAcks``)."""
        return self.broker.store_config.broker_role != BrokerRole.SYNC_MASTER

    def _put_fast(
        self, cmd: RemotingCommand, conn: Channel, send: PlainSend | EncodedSend
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A common send put without waiting, and its answer: a plain send's fields encoded straight into the
        segment (``MessageStore.put_send``: header read, put and reply frame are native calls), or a half message's
        or a batch's run appended in one copy (a half message then remembered for its END_TRANSACTION).  None when
        the store refused it, nothing stored: the general path answers with the store's status.

        The answer is the reply frame (``send_codec.send_reply``), held in SYNC_FLUSH, unless the producer said
        WAIT=false, until the group commit covering the record (``FlushAcks``: one loop callback per group, no
        task, no future per put in the commit thread), which sends it, or the same answer coded
        FLUSH_DISK_TIMEOUT when it is not on disk within syncFlushTimeout (Java's answer: the message is stored;
        only its flush is not confirmed)."""
        b = self.broker
        acks = b.flush_acks
        if isinstance(send, EncodedSend):
            run = send.run
            result, _ = b.store.put_nowait(run, wait=False)
            a = result.append
            if not result.ok or a is None:
                return None
            end = a.wrote_offset + a.wrote_bytes
            b.stats.put(send.stat_topic, run.count, a.wrote_bytes)
            msg_id = runs.offset_msg_ids(b.store.store_host, a.wrote_offset, run.data, run.count)
            queue_id, queue_offset, uniq, props = send.queue_id, a.queue_offset, send.uniq, send.properties
            if send.half is not None:
                b.recent_halves.add(half_messages.StoredHalf(run.data, a.wrote_offset, queue_offset, a.store_timestamp,
                                                             *send.half))  # fmt: skip
        else:
            topic, queue_id, sys_flag, flag, born_ts, props, reconsume, uniq = send
            if acks is not None:
                acks.expect()  # before the put wakes dispatch: see FlushAcks.expect
            put = b.store.put_send(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts, conn.remote_host,
                                   reconsume, b.config.broker_cluster_name)  # fmt: skip
            if put is None:
                return None
            msg_id, offset, size, queue_offset = put
            end = offset + size
            b.stats.put(topic, 1, size)
        c = b.config
        frame = send_codec.send_reply(cmd.opaque, cmd.serialize_type, msg_id, queue_id, queue_offset, uniq,
                                      c.region_id, c.trace_on)  # fmt: skip
        if acks is None or _NO_WAIT in props:
            return frame
        if isinstance(conn, Connection) and not cmd.is_oneway:
            # a remoting channel: the group commit writes the reply itself (FlushAcks.reply), no future per send
            acks.reply(end, conn, frame)
            return _Held.HELD
        return acks.future(end, frame)

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
