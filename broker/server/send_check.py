"""The one check of a send (``AbstractSendMessageProcessor.msgCheck``), shared by every path that stores a sent
message: SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (their fast paths too, and the gRPC proxy's send,
which goes through them), a transaction's half message, and CONSUMER_SEND_MSG_BACK's target; and the one place
a sent record's sys flag gets its topic's MULTI_TAG bit.

In RocketMQ's order: the broker writable (NO_PERMISSION), the topic's name (``store.names``: SYSTEM_ERROR as
``TopicValidator`` answers it; a topic no send may name, NO_PERMISSION), the topic (created as a send creates it,
else TOPIC_NOT_EXIST), writable (NO_PERMISSION), the queue id within the topic's queues (SYSTEM_ERROR), then the
body within maxMessageSize (MESSAGE_ILLEGAL, which Java's store answers).

Each send is read here once, checked, and made into what its put takes (:meth:`SendCheck.checked_send`, RocketMQ's
``preSend`` and ``buildMsgContext``): a common SEND_MESSAGE_V2's fields, read in one native call
(``send_codec.read_send_v2``), which the store encodes straight into its segment; a common half message or batch
already encoded into one run (:class:`EncodedSend`); anything else a :class:`SendRequest`, its records built
(:meth:`pre_send`: the header read, the message type checked (``enableTopicMessageTypeCheck``) and the send as
above, then what RocketMQ's ``SendMessageProcessor`` settles before its put: a batch's limits, the queue the broker
picks, a retry past its limit routed to the DLQ, a prepared message's half topic).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from broker.remoting import send_codec
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import SendMessageRequestHeader, SendMessageRequestHeaderV2
from broker.remoting.protocol.topic import FLAG_UNIT
from broker.server import attributes, half_messages
from broker.server import topics as tp
from broker.server.context import BrokerContext
from store import names
from store.format import batch_body, properties, records, runs
from store.format import transaction as tx_format
from store.format.msgid import Host
from store.message_store import Run
from store.schedule import may_park

_NAMES_CACHED = 4096  # topic names whose verdict is remembered (the check runs on every send)
_UNSEEN = object()  # a topic name with no verdict remembered


def record_sys_flag(tc: tp.TopicConfig, sys_flag: int) -> int:
    """A sent record's sys flag: the client's, with MULTI_TAGS_FLAG when its topic's filter type is MULTI_TAG."""
    return sys_flag | records.MULTI_TAGS_FLAG if tc.topic_filter_type == "MULTI_TAG" else sys_flag


@dataclass(slots=True)
class SendRequest:
    """A send on the general path as :meth:`SendCheck.checked_send` read and checked it: what its put needs."""

    header: SendMessageRequestHeader  # topic and queue id as stored (the broker's pick of queue; a DLQ)
    batch: bool
    sys_flag: int  # the records' (:func:`record_sys_flag`)
    properties: bytes  # the header's: a message's own (DELAY -1 once dead-lettered), or a batch's
    born_host: Host
    half: bool  # a transaction's prepared message: stored in the half topic
    uniq: str | None  # a message's UNIQ_KEY, the reply's transactionId (None for a batch)
    msgs: list[records.MessageRecord]  # a message's record; a batch's, once :meth:`SendCheck.batch_records` read them


# a common plain send's fields as put_send takes them: send_codec.SendFields with the record's sys flag, no half
PlainSend = tuple[str, int, int, int, int, bytes, int, str | None]


@dataclass(slots=True)
class EncodedSend:
    """A half message or a batch checked and encoded into one run (:meth:`SendCheck.checked_send`): what its put and
    its reply need."""

    run: Run
    stat_topic: str  # the topic its messages count for: the sent one (a half message's is stored elsewhere)
    queue_id: int  # the reply's: the queue sent to
    uniq: str | None  # the reply's transactionId: a half message's UNIQ_KEY
    properties: bytes  # the header's, which say whether the reply waits for the flush (WAIT)
    half: tuple[int, bytes] | None  # a half message's born timestamp and stored properties, for its StoredHalf


def _is_prepared(props: bytes, reconsume_times: int) -> bool:
    """Whether a sent message is a transaction's prepared message, as ``SendMessageProcessor`` decides it:
    ``TRAN_MSG`` true as ``Boolean.parseBoolean`` reads it (any case), unless the message is a redelivery with a
    delay level (a client before 4.6.1 resends a failed transactional message with its TRAN_MSG)."""
    value = properties.property_value(props, properties.PROPERTY_TRANSACTION_PREPARED)
    if value is None or value.lower() != "true":
        return False
    level = properties.property_value(props, properties.PROPERTY_DELAY_TIME_LEVEL) or ""
    return not (reconsume_times > 0 and level.lstrip("-").isdigit() and int(level) > 0)


class SendCheck:
    """``msgCheck`` against one broker's settings and topics (see the module's docstring)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        # topic name -> None when a send may name it, else (the answer's code, its remark)
        self._names: dict[str, tuple[int, str] | None] = {}

    def broker_writable(self) -> None:
        """NO_PERMISSION while the broker's permission takes no writes."""
        b = self.broker
        if not tp.is_writeable(b.config.broker_permission):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"broker {b.config.broker_name} is not writable")

    def topic_writable(self, tc: tp.TopicConfig) -> None:
        if not tp.is_writeable(tc.perm):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"topic {tc.topic_name} is not writable")

    def checked_send(self, cmd: RemotingCommand, conn: Channel, fast: bool) -> PlainSend | EncodedSend | SendRequest:
        """A SEND_MESSAGE, SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE read, checked and made into what its put takes;
        raises ``HeaderError`` for a header that does not read and ``RequestRefused`` with RocketMQ's answer for a
        send that may not be stored. Where ``fast`` (the put's answer is ready when it returns or at its group
        commit), a common plain send gives its fields (``send_codec.read_send_v2``, the record's sys flag), a common
        half message or batch its encoded run; a send of any other shape (a new topic, a retry, a delay, a V1
        header, a field the encoders do not take) gives its :class:`SendRequest`, which answers it as it always was."""
        if fast and cmd.code == RequestCode.SEND_MESSAGE_V2:
            f = send_codec.read_send_v2(cmd.ext_fields)
            if f is not None:
                send: PlainSend | EncodedSend | None
                if not f[8]:
                    send = self._plain(f, len(cmd.body))
                elif self.broker.flush_acks is None:
                    send = self._half(f, cmd.body, conn.remote_host)
                else:  # in SYNC_FLUSH the general path puts it, remembering it for END_TRANSACTION once durable
                    send = None
                if send is not None:
                    return send
        req = self.pre_send(cmd, conn.remote_host)
        if req.batch:
            if fast:
                batch = self._batch(cmd.body, req)
                if batch is not None:
                    return batch
            self.batch_records(cmd.body, req)
        return req

    def _plain(self, f: send_codec.SendFields, body_len: int) -> PlainSend | None:
        """A common plain send's fields, its sys flag the record's, when it passes :meth:`_common`."""
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume, uniq, _ = f
        checked = self._common(topic, queue_id, body_len, sys_flag, props)
        if checked is None:
            return None
        return topic, queue_id, checked, flag, born_ts, props, reconsume, uniq

    def _half(self, f: send_codec.SendFields, body: bytes, born_host: Host) -> EncodedSend | None:
        """A common half message that passes :meth:`_common`, while the broker takes them and the half topic exists
        on disk, as the record the general path would store (``half_messages.to_half``: the same bytes), encoded
        in one call (``tx_format.encode_half``)."""
        b = self.broker
        half = half_messages.HALF_TOPIC
        if b.config.reject_transaction_message or b.topics.get(half) is None or half in b.topics.unsaved:
            return None
        topic, queue_id, sys_flag, flag, born_ts, props, reconsume, _, _ = f
        checked = self._common(topic, queue_id, len(body), sys_flag, props)
        if checked is None:
            return None
        sys_flag = checked
        try:
            run, uniq, half_props = tx_format.encode_half(topic, queue_id, body, props, flag, sys_flag, born_ts,
                                                          born_host, b.store.store_host, reconsume,
                                                          b.config.broker_cluster_name)  # fmt: skip
        except (ValueError, OverflowError):  # properties too long, a field out of range: the general path answers
            return None
        stored = Run(run, 1, tx_format.HALF_TOPIC, tx_format.HALF_QUEUE_ID, tx_format.half_sys_flag(sys_flag))
        return EncodedSend(stored, topic, queue_id, uniq, props, (born_ts, half_props))

    def _batch(self, body: bytes, req: SendRequest) -> EncodedSend | None:
        """A batch's messages decoded and encoded into one run in one native call (``runs.encode_batch``); None
        for a body :meth:`batch_records` must answer (malformed, empty, an item too large), a batch of one that
        may be parked, or a topic whose creation is not on disk yet."""
        b = self.broker
        h = req.header
        if h.topic in b.topics.unsaved:
            return None
        try:
            run, count = runs.encode_batch(
                body, h.topic, h.queue_id, req.sys_flag, h.born_timestamp, req.born_host, b.store.store_host,
                h.reconsume_times or 0, b.config.broker_cluster_name, b.store_config.max_message_size,
            )  # fmt: skip
        except (ValueError, OverflowError):  # BatchBodyError, RunError, RecordEncodeError, a field out of range
            return None
        if count == 1 and may_park(run):
            return None  # one message: the store's put treats it as a single send, which may be parked
        # a batch waits as its header's properties say (Java's MessageExtBatch takes them from the header)
        return EncodedSend(Run(run, count, h.topic, h.queue_id, req.sys_flag), h.topic, h.queue_id, None,
                           req.properties, None)  # fmt: skip

    def pre_send(self, cmd: RemotingCommand, born_host: Host) -> SendRequest:
        """A SEND_MESSAGE, SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE from ``born_host`` read and checked, with the
        record it stores (a batch's records: :meth:`batch_records`); raises ``HeaderError`` for a header that does
        not read and ``RequestRefused`` with RocketMQ's answer for a send that may not be stored.  A missing topic
        is created as the header asks (``createTopicInSendMessageMethod``)."""
        ext = cmd.ext_fields
        if "b" in ext and "topic" not in ext:  # V2 (one-letter keys) or V1, whichever the client sent
            h = SendMessageRequestHeaderV2.read_v1(ext)
        else:
            h = cmd.read_header(SendMessageRequestHeader)
        props = (h.properties or "").encode("utf-8")
        b = self.broker
        if b.config.enable_topic_message_type_check:  # as RocketMQ 5's proxy answers it, before msgCheck
            why = attributes.send_refusal(h.topic, b.topics.get(h.topic), properties.decode_properties(props))
            if why is not None:
                raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, why)
        # The header's batch flag picks the batch path, as in Java (the C++ client sends its batches as
        # SEND_MESSAGE with batch=1). It writes booleans as "1"/"0", which Boolean.parseBoolean (and the header
        # parser) read as false; a batch taken for one message would store the encoded batch as one body.
        batch = h.batch or ext.get("batch", ext.get("m", "")) == "1" or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        tc = self.target(h.topic, h.queue_id, None if batch else len(cmd.body), create=h)
        assert tc is not None  # (created when missing, or refused)
        if h.queue_id < 0:
            h.queue_id = random.randrange(tc.write_queue_nums)
        if batch:
            if h.topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
                raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group topic")
            level = properties.property_value(props, properties.PROPERTY_DELAY_TIME_LEVEL)
            if level is not None and (not level.lstrip("-").isdigit() or int(level) > 0):
                # CommitLog.asyncPutMessages: a batch cannot be delayed (its messages' own DELAY is not looked at)
                raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch cannot be delayed (DELAY {level})")
            return SendRequest(h, True, record_sys_flag(tc, h.sys_flag), props, born_host, False, None, [])
        if h.topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
            dlq = self._dead_letter(h)
            if dlq is not None:
                tc = dlq
                # the client's retry carries DELAY 3+n; dead-lettered it must not wait (Java sets DELAY=-1)
                props = properties.encode_properties(
                    {**properties.decode_properties(props), properties.PROPERTY_DELAY_TIME_LEVEL: "-1"}
                )
        half = _is_prepared(props, h.reconsume_times or 0)
        if half:  # a transaction's prepared message, parked in the half topic until END_TRANSACTION or a check
            if b.config.reject_transaction_message:
                raise RequestRefused(ResponseCode.NO_PERMISSION, "the broker sending transaction message is forbidden")
            b.topics.create_system_topic(half_messages.HALF_TOPIC, 1, tp.PERM_READ | tp.PERM_WRITE)
        uniq = properties.property_value(props, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        req = SendRequest(h, False, record_sys_flag(tc, h.sys_flag), props, born_host, half, uniq, [])
        rec = self._record(req, cmd.body, props, h.flag)
        req.msgs.append(half_messages.to_half(rec) if half else rec)
        return req

    def batch_records(self, body: bytes, req: SendRequest) -> None:
        """A batch's records into ``req.msgs``, each body within maxMessageSize (MESSAGE_ILLEGAL, as Java's encoder
        answers an item too large, a body that does not decode, an empty batch)."""
        try:
            items = batch_body.decode_batch_body(body)
        except batch_body.BatchBodyError as e:
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {e}") from None
        if not items:
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        for it in items:
            self.body(len(it.body))
            req.msgs.append(self._record(req, it.body, it.properties, it.flag))

    def _record(self, req: SendRequest, body: bytes, props: bytes, flag: int) -> records.MessageRecord:
        h = req.header
        return records.MessageRecord(
            topic=h.topic,
            queue_id=h.queue_id,
            body=body,
            properties=runs.with_property(props, properties.PROPERTY_CLUSTER, self.broker.config.broker_cluster_name),
            flag=flag,
            sys_flag=req.sys_flag,
            born_timestamp=h.born_timestamp,
            born_host=req.born_host,
            reconsume_times=h.reconsume_times or 0,
        )

    def _dead_letter(self, h: SendMessageRequestHeader) -> tp.TopicConfig | None:
        """The DLQ a ``%RETRY%`` send past its group's retry limit goes to (``handleRetryAndDLQ``), its header
        pointed there; None when it stays a retry."""
        group = h.topic[len(tp.RETRY_GROUP_TOPIC_PREFIX) :]
        b = self.broker
        cfg = b.groups.find(group)
        if cfg is None:
            raise RequestRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {group} does not exist"
            )
        max_times = cfg.retry_max_times
        if h.max_reconsume_times is not None and h.max_reconsume_times >= 0:
            max_times = h.max_reconsume_times
        # An orderly group (one holding queue locks) would block its queue on a retry: dead-letter it at once.
        # '>' as RocketMQ 5.x (4.9 had '>='): the client's fallback send already counts this attempt in
        # reconsumeTimes, so '>' dead-letters after as many retries as CONSUMER_SEND_MSG_BACK's '>=' does.
        if (h.reconsume_times or 0) > max_times or b.locks.is_locked(group):
            dlq = b.create_dlq_topic(group)
            h.topic, h.queue_id = dlq.topic_name, random.randrange(dlq.write_queue_nums)
            return dlq
        return None

    def target(
        self, topic: str, queue_id: int, body_len: int | None, create: SendMessageRequestHeader | None = None
    ) -> tp.TopicConfig | None:
        """The topic a send of ``body_len`` bytes (None: a batch, whose messages' bodies are checked one by one
        with :meth:`body`) to ``topic``'s queue ``queue_id`` stores into, raising ``RequestRefused`` with
        RocketMQ's answer when it may not.  A topic that does not exist is created as the header ``create`` asks
        (a ``%RETRY%`` topic as its group's); without one (the fast paths, which create nothing) the answer is
        None."""
        # Each refusal is raised by the method that says it; the checks are also made here first, so a send that
        # passes (nearly every one, on every send path) calls none of them.
        b = self.broker
        if not tp.is_writeable(b.config.broker_permission):
            self.broker_writable()
        verdict = self._names.get(topic, _UNSEEN)
        if verdict is _UNSEEN:
            verdict = self._name_verdict(topic)
        if verdict is not None:
            raise RequestRefused(*verdict)  # type: ignore[misc]
        tc = b.topics.get(topic)
        if tc is None:
            if create is None:
                return None
            if topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
                tc = b.create_retry_topic(topic[len(tp.RETRY_GROUP_TOPIC_PREFIX) :])
            else:
                unit = FLAG_UNIT if create.unit_mode else 0
                tc = b.topics.create_in_send(topic, create.default_topic, create.default_topic_queue_nums, unit)
            if tc is None:
                raise RequestRefused(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist; auto-create refused")
        if not tp.is_writeable(tc.perm):
            self.topic_writable(tc)
        if queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            raise RequestRefused(
                ResponseCode.SYSTEM_ERROR,
                f"queue {queue_id} is out of range: {tc.topic_name} has {tc.write_queue_nums} write queues",
            )
        if body_len is not None and body_len > b.store_config.max_message_size:
            self.body(body_len)
        return tc

    def _common(self, topic: str, queue_id: int, body_len: int, sys_flag: int, props: bytes) -> int | None:
        """The check of a common plain or half message: the record's sys flag (:func:`record_sys_flag`) when the
        send passes :meth:`target` as it is, to an existing topic that is not a retry topic and is on disk, and its
        message type is the topic's; None otherwise."""
        try:
            tc = self.target(topic, queue_id, body_len)
        except RequestRefused:
            return None
        b = self.broker
        if tc is None or topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX) or topic in b.topics.unsaved:
            return None
        if b.config.enable_topic_message_type_check and attributes.send_refusal(
            topic, tc, properties.decode_properties(props)
        ):
            return None
        return record_sys_flag(tc, sys_flag)

    def body(self, body_len: int) -> None:
        limit = self.broker.store_config.max_message_size
        if body_len > limit:
            why = f"body of {body_len} bytes exceeds maxMessageSize {limit}"
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, why)

    def _name_verdict(self, topic: str) -> tuple[int, str] | None:
        bad = names.topic_error(topic)
        if bad is not None:
            verdict: tuple[int, str] | None = (ResponseCode.SYSTEM_ERROR, bad)  # as msgCheck answers it
        elif names.send_forbidden(topic):
            verdict = (ResponseCode.NO_PERMISSION, names.forbidden_send_remark(topic))
        else:
            verdict = None
        if len(self._names) >= _NAMES_CACHED:
            self._names.clear()
        self._names[topic] = verdict
        return verdict
