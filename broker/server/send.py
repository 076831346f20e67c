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

from broker.remoting import batch_body, send_codec, tx_codec
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Connection, Handler
from broker.remoting.errors import HeaderError, RequestRefused
from broker.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
)
from broker.server import attributes, half_messages
from broker.server import topics as tp
from broker.server.context import BrokerContext
from broker.server.recall import send_recall_handle
from broker.server.send_check import SendCheck, record_sys_flag
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
_NO_WAIT_STR = _NO_WAIT.decode()

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


def read_send_header(cmd: RemotingCommand) -> SendMessageRequestHeader:
    """V2 (one-letter keys) or V1 header, whichever the client sent; SEND_BATCH_MESSAGE may carry either."""
    if "b" in cmd.ext_fields and "topic" not in cmd.ext_fields:
        return SendMessageRequestHeaderV2.read_v1(cmd.ext_fields)
    return cmd.read_header(SendMessageRequestHeader)


def _is_batch(cmd: RemotingCommand, h: SendMessageRequestHeader) -> bool:
    # The C++ client writes booleans as "1"/"0", which Boolean.parseBoolean (and the header parser) read as false;
    # a batch taken for one message would store the encoded batch as a single body, so "1" counts here.
    raw = cmd.ext_fields.get("batch", cmd.ext_fields.get("m", ""))
    return h.batch or raw == "1" or cmd.code == RequestCode.SEND_BATCH_MESSAGE


def _property(props: bytes, name: str) -> str | None:
    """One property's value without decoding them all (this runs on every send)."""
    return properties.property_value(props, name)


_with_property = runs.with_property
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

    def _record(self, h: SendMessageRequestHeader, tc: tp.TopicConfig, conn: Channel, body: bytes, props: bytes,
                flag: int) -> records.MessageRecord:  # fmt: skip
        props = _with_property(props, properties.PROPERTY_CLUSTER, self.broker.config.broker_cluster_name)
        return records.MessageRecord(
            topic=h.topic,
            queue_id=h.queue_id,
            body=body,
            properties=props,
            flag=flag,
            sys_flag=record_sys_flag(tc, h.sys_flag),
            born_timestamp=h.born_timestamp,
            born_host=conn.remote_host,
            reconsume_times=h.reconsume_times or 0,
        )

    def _route_retry(self, h: SendMessageRequestHeader, tc: tp.TopicConfig) -> tp.TopicConfig:
        """A ``%RETRY%`` send past its group's retry limit goes to the group's DLQ (``handleRetryAndDLQ``)."""
        if not h.topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
            return tc
        group = h.topic[len(tp.RETRY_GROUP_TOPIC_PREFIX) :]
        cfg = self.broker.groups.find(group)
        if cfg is None:
            raise RequestRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {group} does not exist"
            )
        max_times = cfg.retry_max_times
        if h.max_reconsume_times is not None and h.max_reconsume_times >= 0:
            max_times = h.max_reconsume_times
        # An orderly group (one holding queue locks) would block its queue on a retry: dead-letter it at once.
        orderly = self.broker.locks.is_locked(group)
        # '>' as RocketMQ 5.x (4.9 had '>='): the client's fallback send already counts this attempt in
        # reconsumeTimes, so '>' dead-letters after as many retries as CONSUMER_SEND_MSG_BACK's '>=' does.
        if (h.reconsume_times or 0) > max_times or orderly:
            dlq = self.broker.create_dlq_topic(group)
            h.topic, h.queue_id = dlq.topic_name, random.randrange(dlq.write_queue_nums)
            return dlq
        return tc

    # --- handlers ------------------------------------------------------------------------------------------
    def send_inline(
        self, cmd: RemotingCommand, conn: Channel
    ) -> RemotingCommand | bytes | Awaitable[RemotingCommand | bytes] | None:
        """Codes 10, 310 and 320, as a plain function so the remoting layer answers without a task per request:
        in ASYNC_FLUSH nothing here waits and the response comes back at once; SYNC_FLUSH on the fast paths holds
        the request on its remoting ``Connection`` and returns None, the group commit then writing the ready frame
        (``_when_durable``, ``FlushAcks.reply``), or returns a future of that frame to any other channel (the
        proxy's); the general path returns a coroutine that waits for the flush, SYNC_MASTER a coroutine that
        waits for the slave.  As in a Java broker,
        the header's ``batch`` flag picks the batch path: the C++ client sends its batches as SEND_MESSAGE with
        ``batch=1``.  The fast paths answer with the reply frame already encoded (``bytes``)."""
        frame: bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None
        if self.broker.config.enable_topic_message_type_check:
            refused = self._type_refused(cmd)
            if refused is not None:
                return refused
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
            h = read_send_header(cmd)
        except HeaderError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        try:
            if _is_batch(cmd, h):
                tc = self._batch_target(h)
                frame = self._batch_fast(cmd, conn, h, tc) if self._fast_store() else None
                if frame is not None:
                    return None if frame is _Held.HELD else frame
                msgs, rec = self._batch_records(cmd, conn, h, tc), None
            else:
                rec = self._one_record(cmd, conn, h)
                msgs = [rec]
        except RequestRefused as e:
            return cmd.response(e.code, e.remark)
        unsaved = self.broker.topics.unsaved
        if unsaved and (h.topic in unsaved or msgs[0].topic in unsaved):
            return self._put_when_topic_saved(cmd, msgs, h, rec)  # created by this send or one just before
        return self._put(cmd, msgs, h, rec)

    def _type_refused(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """enableTopicMessageTypeCheck: MESSAGE_ILLEGAL for a message whose type (by its properties; a batch's by
        its header's) is not its topic's ``message.type``, as RocketMQ 5's proxy answers it; None when it passes
        (a header that does not read is the general path's to answer)."""
        try:
            h = read_send_header(cmd)
        except HeaderError:
            return None
        props = properties.decode_properties(h.properties or "")
        why = attributes.send_refusal(h.topic, self.broker.topics.get(h.topic), props)
        return None if why is None else cmd.response(ResponseCode.MESSAGE_ILLEGAL, why)

    def _put(
        self, cmd: RemotingCommand, msgs: list[records.MessageRecord], h: SendMessageRequestHeader,
        rec: records.MessageRecord | None,
    ) -> RemotingCommand | Awaitable[RemotingCommand]:  # fmt: skip
        sc = self.broker.store_config
        if sc.flush_disk_type == FlushDiskType.SYNC_FLUSH or sc.broker_role == BrokerRole.SYNC_MASTER:
            return self._put_and_wait(cmd, msgs, h.queue_id, rec)
        result, _ = self.broker.store.put_nowait(msgs)  # ASYNC_FLUSH: never a future to wait for
        if result.ok:
            self.broker.stats.put(h.topic, len(msgs), result.append.wrote_bytes if result.append else 0)
            self._remember_half(rec, result)
        return self._reply(cmd, result, h.queue_id, rec)

    def _remember_half(self, rec: records.MessageRecord | None, result: PutMessageResult) -> None:
        """A half message just stored is kept for its END_TRANSACTION (``half_messages.RecentHalves``)."""
        if rec is not None and rec.topic == half_messages.HALF_TOPIC and result.append is not None:
            a = result.append
            rec.physical_offset, rec.queue_offset, rec.store_timestamp = (a.wrote_offset, a.queue_offset,
                                                                          a.store_timestamp)  # fmt: skip
            self.broker.recent_halves.add(half_messages.StoredHalf.of(rec, records.encode_record(rec)))

    async def _put_when_topic_saved(
        self, cmd: RemotingCommand, msgs: list[records.MessageRecord], h: SendMessageRequestHeader,
        rec: records.MessageRecord | None,
    ) -> RemotingCommand:  # fmt: skip
        """The topic's config on disk first (``createTopicInSendMessageMethod`` persists): an acknowledged message
        is never in a queue the restarted broker does not know of. The write runs in a worker thread."""
        await self.broker.topics_saved()
        put = self._put(cmd, msgs, h, rec)
        return put if isinstance(put, RemotingCommand) else await put

    async def _put_and_wait(
        self, cmd: RemotingCommand, msgs: list[records.MessageRecord], queue_id: int, rec: records.MessageRecord | None
    ) -> RemotingCommand:
        result = await self.broker.put(msgs)
        if result.ok:
            self._remember_half(rec, result)
        return self._reply(cmd, result, queue_id, rec)

    def _one_record(self, cmd: RemotingCommand, conn: Channel, h: SendMessageRequestHeader) -> records.MessageRecord:
        tc = self.check.target(h.topic, h.queue_id, len(cmd.body), create=h)
        assert tc is not None  # (created when missing, or refused)
        if h.queue_id < 0:
            h.queue_id = random.randrange(tc.write_queue_nums)
        props = (h.properties or "").encode("utf-8")
        routed = self._route_retry(h, tc)
        if routed is not tc and h.topic.startswith(tp.DLQ_GROUP_TOPIC_PREFIX):
            # the client's retry carries DELAY 3+n; dead-lettered it must not wait (Java sets DELAY=-1)
            props = properties.encode_properties(
                {**properties.decode_properties(props), properties.PROPERTY_DELAY_TIME_LEVEL: "-1"}
            )
        rec = self._record(h, routed, conn, cmd.body, props, h.flag)
        if _property(props, properties.PROPERTY_TRANSACTION_PREPARED) == "true":
            return self._half(rec)
        return rec

    def _half(self, rec: records.MessageRecord) -> records.MessageRecord:
        """A transaction's prepared message, parked in the half topic until END_TRANSACTION or a check-back."""
        if self.broker.config.reject_transaction_message:
            raise RequestRefused(ResponseCode.NO_PERMISSION, "the broker sending transaction message is forbidden")
        self.broker.topics.create_system_topic(half_messages.HALF_TOPIC, 1, tp.PERM_READ | tp.PERM_WRITE)
        return half_messages.to_half(rec)

    # --- the fast paths: records encoded into one run, appended in one copy, the reply frame built at once ------
    def _fast_store(self) -> bool:
        """No synchronous slave: a put's answer is ready at once (ASYNC_FLUSH), or when its group commit is done
        (SYNC_FLUSH: ``_when_durable``)."""
        return self.broker.store_config.broker_role != BrokerRole.SYNC_MASTER

    def _when_durable(
        self, cmd: RemotingCommand, frame: bytes, end: int, props: str | bytes, conn: Channel
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held:
        """The answer of a fast-path put appended with ``wait=False`` (its records end at ``end``, the log offset
        a group commit must cover before the answer goes out): in SYNC_FLUSH, unless the producer said
        WAIT=false, a loop future that the group commit covering the record completes with the ready frame
        (``FlushAcks``: one loop callback per group, no task, no future per put in the commit thread), or with
        the same answer coded FLUSH_DISK_TIMEOUT when it is not on disk within syncFlushTimeout (Java's answer:
        the message is stored; only its flush is not confirmed)."""
        acks = self.broker.flush_acks
        if acks is None or (_NO_WAIT in props if isinstance(props, bytes) else _NO_WAIT_STR in props):
            return frame
        if isinstance(conn, Connection) and not cmd.is_oneway:
            # a remoting channel: the group commit writes the reply itself (FlushAcks.reply), no future per send
            acks.reply(end, conn, frame)
            return _Held.HELD
        fut: asyncio.Future[RemotingCommand | bytes] = asyncio.get_running_loop().create_future()

        def settle(flushed: bool) -> None:
            if fut.done():  # cancelled by a server that stopped waiting
                return
            if flushed:
                fut.set_result(frame)
            else:
                late = RemotingCommand.decode(frame[4:])
                late.code = ResponseCode.FLUSH_DISK_TIMEOUT
                fut.set_result(late)

        acks.wait(end, settle)
        return fut

    def _put_run(
        self, cmd: RemotingCommand, run: Run, stat_topic: str, reply_queue_id: int, uniq: str | None
    ) -> tuple[bytes, AppendResult] | None:
        """A fast path's run put without waiting, counted, and its reply frame; None when the store refused it
        (nothing stored: the general path answers with the store's status)."""
        b = self.broker
        result, _ = b.store.put_nowait(run, wait=False)
        append = result.append
        if not result.ok or append is None:
            return None
        b.stats.put(stat_topic, run.count, append.wrote_bytes)
        msg_ids = runs.offset_msg_ids(b.store.store_host, append.wrote_offset, run.data, run.count)
        c = b.config
        frame = send_codec.send_reply(cmd.opaque, cmd.serialize_type, msg_ids, reply_queue_id, append.queue_offset,
                                      uniq, c.region_id, c.trace_on)  # fmt: skip
        return frame, append

    def _send_fast(
        self, cmd: RemotingCommand, conn: Channel
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A plain SEND_MESSAGE_V2 (``send_codec.read_send_v2``) to an existing, writable topic: the header read,
        the put (the record written straight into the segment: ``MessageStore.put_send``) and the reply frame are
        native calls and the Python between them is the send check.  A put the store declines (a field it does
        not take, a refusal) goes the run's way (``runs``, :meth:`_put_run`).  None hands the request to the
        general path, which gives anything unusual (a new topic, a retry, a transaction, a delay, a refused put)
        the answer it always had; nothing is stored before None."""
        f = send_codec.read_send_v2(cmd.ext_fields)
        if f is None:
            return None
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume, uniq = f
        checked = self.check.plain(topic, queue_id, len(cmd.body), sys_flag)
        if checked is None:
            return None
        sys_flag = checked
        b = self.broker
        store = b.store
        c = b.config
        put = store.put_send(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts, conn.remote_host, reconsume,
                             c.broker_cluster_name)  # fmt: skip
        if put is not None:
            msg_id, offset, size, queue_offset = put
            b.stats.put(topic, 1, size)
            frame = send_codec.send_reply(cmd.opaque, cmd.serialize_type, msg_id, queue_id, queue_offset, uniq,
                                          c.region_id, c.trace_on)  # fmt: skip
            end = offset + size
        else:
            try:
                run = runs.encode_message(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts, conn.remote_host,
                                          store.store_host, reconsume, c.broker_cluster_name)  # fmt: skip
            except (ValueError, OverflowError):  # a field out of its range: the general path says which
                return None
            done = self._put_run(cmd, Run(run, 1, topic, queue_id, sys_flag), topic, queue_id, uniq)
            if done is None:
                return None
            frame, append = done
            end = append.wrote_offset + append.wrote_bytes
        return frame if b.flush_acks is None else self._when_durable(cmd, frame, end, props, conn)

    def _half_fast(self, cmd: RemotingCommand, conn: Channel) -> bytes | None:
        """A transaction's half message (``TRAN_MSG=true``) by the fast path's steps: the header read in one call
        (``tx_codec.read_half_v2``), the record the general path would store (``_record`` then
        ``half_messages.to_half``: the same bytes) encoded in one call (``store.format.transaction.encode_half``),
        appended as a run of one, remembered for its END_TRANSACTION and answered with a ready frame, so that a
        transaction's first request costs what a plain send does. None hands anything unusual to the general
        path, nothing stored."""
        b = self.broker
        f = tx_codec.read_half_v2(cmd.ext_fields)
        if f is None or b.config.reject_transaction_message:
            return None
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume = f
        checked = self.check.plain(topic, queue_id, len(cmd.body), sys_flag)
        half = half_messages.HALF_TOPIC
        if checked is None or b.topics.get(half) is None or half in b.topics.unsaved:
            return None
        sys_flag = checked
        try:
            run, uniq, half_props = tx_format.encode_half(topic, queue_id, cmd.body, props, flag, sys_flag, born_ts,
                                                          conn.remote_host, b.store.store_host, reconsume,
                                                          b.config.broker_cluster_name)  # fmt: skip
        except (ValueError, OverflowError):  # properties too long, a field out of range: the general path answers
            return None
        put = Run(run, 1, tx_format.HALF_TOPIC, tx_format.HALF_QUEUE_ID, tx_format.half_sys_flag(sys_flag))
        done = self._put_run(cmd, put, topic, queue_id, uniq)
        if done is None:
            return None
        frame, append = done
        b.recent_halves.add(half_messages.StoredHalf(run, append.wrote_offset, append.queue_offset,
                                                     append.store_timestamp, born_ts, half_props))  # fmt: skip
        return frame

    def _batch_fast(
        self, cmd: RemotingCommand, conn: Channel, h: SendMessageRequestHeader, tc: tp.TopicConfig
    ) -> bytes | asyncio.Future[RemotingCommand | bytes] | _Held | None:
        """A batch decoded and encoded into one run in one native call (``runs.encode_batch``) and appended in one
        copy; None for a body the general path must answer (malformed, empty, an item too large) or a refused
        put (nothing stored then), or a topic whose creation is not on disk yet."""
        b = self.broker
        if h.topic in b.topics.unsaved:
            return None
        sys_flag = record_sys_flag(tc, h.sys_flag)
        try:
            run, count = runs.encode_batch(
                cmd.body, h.topic, h.queue_id, sys_flag, h.born_timestamp, conn.remote_host, b.store.store_host,
                h.reconsume_times or 0, b.config.broker_cluster_name, b.store_config.max_message_size,
            )  # fmt: skip
        except (ValueError, OverflowError):  # BatchBodyError, RunError, RecordEncodeError, a field out of range
            return None
        if count == 1 and may_park(run):
            return None  # one message: the general path's put treats it as a single send, which may be parked
        done = self._put_run(cmd, Run(run, count, h.topic, h.queue_id, sys_flag), h.topic, h.queue_id, None)
        if done is None:
            return None
        frame, append = done
        # a batch waits as its header's properties say (Java's MessageExtBatch takes them from the header)
        end = append.wrote_offset + append.wrote_bytes
        return frame if b.flush_acks is None else self._when_durable(cmd, frame, end, h.properties or "", conn)

    def _batch_target(self, h: SendMessageRequestHeader) -> tp.TopicConfig:
        """A batch's topic checks, and its queue when the client left the choice to the broker."""
        tc = self.check.target(h.topic, h.queue_id, None, create=h)
        assert tc is not None  # (created when missing, or refused)
        if h.topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group topic")
        level = _property((h.properties or "").encode("utf-8"), properties.PROPERTY_DELAY_TIME_LEVEL)
        if level is not None and (not level.lstrip("-").isdigit() or int(level) > 0):
            # CommitLog.asyncPutMessages: a batch cannot be delayed (its messages' own DELAY is not looked at)
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch cannot be delayed (DELAY {level})")
        if h.queue_id < 0:
            h.queue_id = random.randrange(tc.write_queue_nums)
        return tc

    def _batch_records(
        self, cmd: RemotingCommand, conn: Channel, h: SendMessageRequestHeader, tc: tp.TopicConfig
    ) -> list[records.MessageRecord]:
        try:
            items = batch_body.decode_batch_body(cmd.body)
        except batch_body.BatchBodyError as e:
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {e}") from None
        if not items:
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        msgs = []
        for it in items:
            self.check.body(len(it.body))
            msgs.append(self._record(h, tc, conn, it.body, it.properties, it.flag))
        return msgs

    def _reply(
        self, cmd: RemotingCommand, result: PutMessageResult, queue_id: int, rec: records.MessageRecord | None
    ) -> RemotingCommand:
        code = _STATUS_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
        if not result.ok:
            return cmd.response(code, result.error or result.status.value)
        append = result.append
        assert append is not None  # a put that succeeded (or only missed its flush) always says where it went
        # SendMessageResponseHeader's extFields written directly (its to_ext would give the same keys in the
        # same order): this runs on every send.
        ext = {
            "msgId": result.msg_ids[0] if len(result.msg_ids) == 1 else ",".join(result.msg_ids),
            "queueId": str(queue_id),
            "queueOffset": str(append.queue_offset),
        }
        if rec is not None:
            txid = _property(rec.properties, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            if txid is not None:
                ext["transactionId"] = txid
        c = self.broker.config
        if rec is not None and rec.topic == TIMER_TOPIC:  # parked by the put: recallable until it is due
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
