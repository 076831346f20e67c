"""v2 ``Message`` <-> CommitLog record properties, as RocketMQ 5's proxy maps them (``GrpcConverter``).

tag -> ``TAGS``, keys -> ``KEYS`` (space-separated), message id -> ``UNIQ_KEY``, message group -> ``__SHARDINGKEY``,
delivery timestamp -> ``TIMER_DELIVER_MS``, transactional -> ``TRAN_MSG=true`` with the topic as producer group
(``PGROUP``: a 5.x producer has no group).  User properties are kept as they are; a user property named like a
system one is refused.  A consumer is shown the message type the properties imply.
"""

from __future__ import annotations

import time
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.proxy.status import Code, ProxyError
from broker.proxy.v2 import definition_pb2 as pb
from broker.server import topics as tp
from store.format import msgid, records
from store.format import properties as P

PROPERTY_SHARDING_KEY = P.PROPERTY_SHARDING_KEY  # the FIFO message group
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
# The names a user property may not take (MessageConst's system property names that steer the broker).
RESERVED_KEYS = frozenset({
    P.PROPERTY_TAGS, P.PROPERTY_KEYS, P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, P.PROPERTY_WAIT_STORE_MSG_OK,
    P.PROPERTY_DELAY_TIME_LEVEL, P.PROPERTY_CLUSTER, P.PROPERTY_REAL_TOPIC, P.PROPERTY_REAL_QUEUE_ID,
    P.PROPERTY_TRANSACTION_PREPARED, P.PROPERTY_ORIGIN_MESSAGE_ID, P.PROPERTY_TIMER_DELIVER_MS,
    P.PROPERTY_TIMER_DELAY_SEC, P.PROPERTY_TIMER_DELAY_MS, P.PROPERTY_TIMER_OUT_MS, P.PROPERTY_TIMER_DEL_UNIQKEY,
    P.PROPERTY_TIMER_ENQUEUE_MS, P.PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_SHARDING_KEY, PROPERTY_PRODUCER_GROUP,
    PROPERTY_RETRY_TOPIC, "MIN_OFFSET", "MAX_OFFSET", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "TRACE_ON",
    "MSG_REGION", "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRANSACTION_CHECK_TIMES", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "CONSUME_START_TIME",
})  # fmt: skip
_TIMER_KEYS = (P.PROPERTY_TIMER_DELIVER_MS, P.PROPERTY_TIMER_DELAY_SEC, P.PROPERTY_TIMER_DELAY_MS)


def _millis(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def send_properties(msg: pb.Message, max_body: int) -> tuple[dict[str, str], int]:
    """The record properties and sysFlag of a message a 5.x producer sends; ProxyError names what is wrong."""
    sp = msg.system_properties
    if not msg.body:
        raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(msg.body) > max_body:
        raise ProxyError(Code.MESSAGE_BODY_TOO_LARGE,
                         f"body of {len(msg.body)} bytes exceeds maxMessageSize {max_body}")  # fmt: skip
    if not sp.message_id:
        raise ProxyError(Code.ILLEGAL_MESSAGE_ID, "message id is empty")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in RESERVED_KEYS:
            raise ProxyError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {key!r} is a system property")
        if not key or any(c in key + value for c in (P.NAME_VALUE_SEPARATOR, P.PROPERTY_SEPARATOR)):
            raise ProxyError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {key!r} holds a separator character")
        props[key] = value
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is empty or holds '|'")
        props[P.PROPERTY_TAGS] = sp.tag
    if sp.keys:
        if any(not k.strip() or " " in k for k in sp.keys):
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, f"keys {list(sp.keys)!r}: a key is empty or holds a space")
        props[P.PROPERTY_KEYS] = P.KEY_SEPARATOR.join(sp.keys)
    props[P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    sys_flag = 0
    kind = sp.message_type
    if sp.HasField("message_group"):
        if kind != pb.FIFO:
            raise ProxyError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a message group is for FIFO messages only")
        if not sp.message_group.strip():
            raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "message group is empty")
        props[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        if kind != pb.DELAY:
            raise ProxyError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a delivery time is for DELAY messages only")
        props[P.PROPERTY_TIMER_DELIVER_MS] = str(_millis(sp.delivery_timestamp))
    if kind == pb.TRANSACTION:
        props[P.PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = msg.topic.name
        sys_flag = records.TRANSACTION_PREPARED_TYPE
    elif kind == pb.FIFO and not sp.HasField("message_group"):
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
    elif kind == pb.DELAY and not sp.HasField("delivery_timestamp"):
        raise ProxyError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
    elif kind not in (pb.NORMAL, pb.FIFO, pb.DELAY):
        raise ProxyError(Code.UNSUPPORTED, f"message type {pb.MessageType.Name(kind)} is not served")
    return props, sys_flag


def message_type(props: dict[str, str]) -> int:
    if props.get(P.PROPERTY_TRANSACTION_PREPARED) == "true":
        return pb.TRANSACTION
    if any(k in props for k in _TIMER_KEYS) or props.get(P.PROPERTY_DELAY_TIME_LEVEL, "0") not in ("0", "-1"):
        return pb.DELAY
    if PROPERTY_SHARDING_KEY in props:
        return pb.FIFO
    return pb.NORMAL


def to_message(rec: records.MessageRecord, receipt: str, invisible_ms: int) -> pb.Message:
    """A popped record as a 5.x consumer receives it; a retry shows its original topic."""
    props = rec.property_map
    topic = rec.topic
    if topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
        topic = props.get(PROPERTY_RETRY_TOPIC, topic)
    sp = pb.SystemProperties(
        message_id=rec.uniq_key or rec.offset_msg_id,
        body_digest=pb.Digest(type=pb.CRC32, checksum=format(zlib.crc32(rec.body) & 0xFFFFFFFF, "08X")),
        body_encoding=pb.IDENTITY,
        message_type=message_type(props),  # type: ignore[arg-type]
        born_timestamp=_timestamp(rec.born_timestamp),
        born_host=msgid.host_string(rec.born_host),
        store_timestamp=_timestamp(rec.store_timestamp),
        store_host=msgid.host_string(rec.store_host),
        receipt_handle=receipt,
        queue_id=rec.queue_id,
        queue_offset=rec.queue_offset,
        invisible_duration=duration(invisible_ms),
        delivery_attempt=rec.reconsume_times + 1,
    )
    if rec.tags is not None:
        sp.tag = rec.tags
    if rec.keys:
        sp.keys.extend(k for k in rec.keys.split(P.KEY_SEPARATOR) if k)
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if P.PROPERTY_TIMER_DELIVER_MS in props and props[P.PROPERTY_TIMER_DELIVER_MS].isdigit():
        sp.delivery_timestamp.CopyFrom(_timestamp(int(props[P.PROPERTY_TIMER_DELIVER_MS])))
    user = {k: v for k, v in props.items() if k not in RESERVED_KEYS}
    return pb.Message(topic=pb.Resource(name=topic), user_properties=user, system_properties=sp, body=rec.body)


def now_ms() -> int:
    return int(time.time() * 1000)
