"""v2 ``Message`` <-> CommitLog record properties, as RocketMQ 5's proxy maps them (``GrpcConverter``).

tag -> ``TAGS``, keys -> ``KEYS`` (space-separated), message id -> ``UNIQ_KEY``, message group -> ``__SHARDINGKEY``,
delivery timestamp -> ``TIMER_DELIVER_MS``, transactional -> ``TRAN_MSG=true`` with the topic as producer group
(``PGROUP``: a 5.x producer has no group).  User properties are kept as they are; a user property named like a
system one is refused.  A consumer is shown the message type the properties imply, and as user properties every
property that is not a system one (the message group and ``__transactionId__`` too, as RocketMQ's proxy shows them).

Body digests: a consumer is sent MD5 as upper-case hex, as RocketMQ's proxy sends it (``BinaryUtil.generateMd5``),
the one form every official client verifies alike.  A producer's digest, when it sends one, is checked before the
message is stored and a mismatch refused with ``MESSAGE_CORRUPTED`` (RocketMQ's proxy does not check it).
"""

from __future__ import annotations

import hashlib
import time
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.proxy.status import Code, ProxyError
from broker.proxy.v2 import definition_pb2 as pb
from broker.server import topics as tp
from store.format import hashing, msgid, records
from store.format import properties as P

PROPERTY_SHARDING_KEY = P.PROPERTY_SHARDING_KEY  # the FIFO message group
# RocketMQ's system property names (5.4.0's ``MessageConst.STRING_HASH_SET``): its proxy refuses them as user
# properties on a send and shows a consumer every property but these.
SYSTEM_KEYS = frozenset({
    P.PROPERTY_TRACE_SWITCH, P.PROPERTY_MSG_REGION, P.PROPERTY_KEYS, P.PROPERTY_TAGS, P.PROPERTY_WAIT_STORE_MSG_OK,
    P.PROPERTY_DELAY_TIME_LEVEL, P.PROPERTY_RETRY_TOPIC, "ORIGIN_GROUP", P.PROPERTY_REAL_TOPIC,
    P.PROPERTY_REAL_QUEUE_ID, P.PROPERTY_TRANSACTION_PREPARED, P.PROPERTY_PRODUCER_GROUP, P.PROPERTY_MIN_OFFSET,
    P.PROPERTY_MAX_OFFSET, "BUYER_ID", P.PROPERTY_ORIGIN_MESSAGE_ID, P.PROPERTY_TRANSFER_FLAG, "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "MAX_RECONSUME_TIMES",
    P.PROPERTY_CONSUME_START_TIME, "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    P.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", P.PROPERTY_CLUSTER, "MSG_TYPE",
    "INNER_MULTI_QUEUE_OFFSET", P.PROPERTY_TIMER_DELAY_MS, P.PROPERTY_TIMER_DELAY_SEC, P.PROPERTY_TIMER_DELIVER_MS,
    P.PROPERTY_TIMER_ENQUEUE_MS, P.PROPERTY_TIMER_DEQUEUE_MS, "TIMER_ROLL_TIMES", P.PROPERTY_TIMER_OUT_MS,
    P.PROPERTY_TIMER_DEL_UNIQKEY, "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#", "_SYS_MSG_PRIORITY_",
})  # fmt: skip
# The names a user property may not take: the system ones, and the message group, which makes a message FIFO here
# (RocketMQ's proxy would store a user-set one as it came).
RESERVED_KEYS = SYSTEM_KEYS | {PROPERTY_SHARDING_KEY}
_TIMER_KEYS = (P.PROPERTY_TIMER_DELIVER_MS, P.PROPERTY_TIMER_DELAY_SEC, P.PROPERTY_TIMER_DELAY_MS)


def message_group_queue(group: str, queues: int) -> int:
    """The queue (of ``queues`` writable ones) a FIFO message group goes to, as RocketMQ's proxy picks it: Guava's
    ``Hashing.consistentHash(group.hashCode(), queues)``, a jump through a 64-bit linear congruential sequence."""
    state = hashing.java_string_hash(group) & 0xFFFFFFFFFFFFFFFF  # the int widened to a long
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        nxt = int((candidate + 1) / (((state >> 33) + 1) / 2**31))
        if not 0 <= nxt < queues:
            return candidate
        candidate = nxt


def _millis(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def body_digest(body: bytes) -> pb.Digest:
    """The digest a consumer is sent with ``body``: MD5, upper-case hex."""
    return pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def check_digest(msg: pb.Message) -> None:
    """ProxyError(MESSAGE_CORRUPTED) unless the body matches the digest the producer sent (if it sent one).

    Official clients write CRC32 in different forms (zero-padded hex, hex without leading zeros, decimal), so a
    CRC32 checksum matches in any of them; MD5 and SHA1 are hex in either case."""
    if not msg.system_properties.HasField("body_digest"):
        return
    digest = msg.system_properties.body_digest
    sent = digest.checksum.strip()
    if digest.type == pb.CRC32:
        crc = zlib.crc32(msg.body) & 0xFFFFFFFF
        ok = _hex_value(sent) == crc or (sent.isdigit() and int(sent) == crc)
    elif digest.type in (pb.MD5, pb.SHA1):
        algo = hashlib.md5 if digest.type == pb.MD5 else hashlib.sha1
        ok = sent.upper() == algo(msg.body).hexdigest().upper()
    else:
        return  # no algorithm named: nothing to check against
    if not ok:
        raise ProxyError(Code.MESSAGE_CORRUPTED, f"body digest {pb.DigestType.Name(digest.type)} {sent!r} does not "
                                                 f"match the {len(msg.body)}-byte body")  # fmt: skip


def _hex_value(text: str) -> int | None:
    """``text`` as plain hex digits (``int`` alone would also take a ``0x`` prefix, ``_`` and spaces)."""
    return int(text, 16) if text and all(c in "0123456789abcdefABCDEF" for c in text) else None


def send_properties(msg: pb.Message, max_body: int) -> tuple[dict[str, str], int]:
    """The record properties and sysFlag of a message a 5.x producer sends; ProxyError names what is wrong."""
    sp = msg.system_properties
    if not msg.body:
        raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(msg.body) > max_body:
        raise ProxyError(Code.MESSAGE_BODY_TOO_LARGE,
                         f"body of {len(msg.body)} bytes exceeds maxMessageSize {max_body}")  # fmt: skip
    check_digest(msg)
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
        props[P.PROPERTY_PRODUCER_GROUP] = msg.topic.name
        sys_flag = records.TRANSACTION_PREPARED_TYPE
    elif kind == pb.FIFO and not sp.HasField("message_group"):
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
    elif kind == pb.DELAY and not sp.HasField("delivery_timestamp"):
        raise ProxyError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
    elif kind not in (pb.NORMAL, pb.FIFO, pb.DELAY):
        raise ProxyError(Code.UNSUPPORTED, f"message type {pb.MessageType.Name(kind)} is not served")
    return props, sys_flag


def message_type(props: dict[str, str]) -> int:
    if props.get(P.PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":  # Boolean.parseBoolean
        return pb.TRANSACTION
    if any(k in props for k in _TIMER_KEYS) or props.get(P.PROPERTY_DELAY_TIME_LEVEL, "0") not in ("0", "-1"):
        return pb.DELAY
    if PROPERTY_SHARDING_KEY in props:
        return pb.FIFO
    return pb.NORMAL


def to_message(rec: records.MessageRecord, receipt: str, invisible_ms: int) -> pb.Message:
    """A popped record as a 5.x consumer receives it; a retry shows its original topic.  The nested fields are
    filled in place (built apart and copied in, they cost a receive more than the rest of the conversion)."""
    props = rec.property_map
    m = pb.Message(body=rec.body, user_properties={k: v for k, v in props.items() if k not in SYSTEM_KEYS})
    topic = rec.topic
    m.topic.name = props.get(P.PROPERTY_RETRY_TOPIC, topic) if topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX) else topic
    sp = m.system_properties
    sp.message_id = rec.uniq_key or rec.offset_msg_id
    sp.body_digest.CopyFrom(body_digest(rec.body))
    sp.body_encoding = pb.IDENTITY
    sp.message_type = message_type(props)  # type: ignore[assignment]
    _set_millis(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = msgid.host_string(rec.born_host)
    _set_millis(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = msgid.host_string(rec.store_host)
    sp.receipt_handle = receipt
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    _set_millis(sp.invisible_duration, invisible_ms)
    sp.delivery_attempt = rec.reconsume_times + 1
    if rec.tags is not None:
        sp.tag = rec.tags
    if rec.keys:
        sp.keys.extend(k for k in rec.keys.split(P.KEY_SEPARATOR) if k)
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    deliver = props.get(P.PROPERTY_TIMER_DELIVER_MS)
    if deliver is not None and deliver.isdigit():
        _set_millis(sp.delivery_timestamp, int(deliver))
    return m


def _set_millis(field: Timestamp | Duration, ms: int) -> None:
    field.seconds, field.nanos = ms // 1000, ms % 1000 * 1_000_000


def now_ms() -> int:
    return int(time.time() * 1000)
