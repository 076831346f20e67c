"""The client's message model: what a producer sends, what a consumer receives, and the result types.

Received messages are decoded from raw CommitLog records with store/format/records.py (pull, query and view bodies
are the records exactly as stored), so the client can never disagree with the store about a layout.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.client.errors import MessageError
from store.format import properties, records

# Properties the client manages itself; a user-supplied value for them would be overwritten or confusing.
_RESERVED = frozenset(
    {properties.PROPERTY_TAGS, properties.PROPERTY_KEYS, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}
)


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (``MessageQueue``); sorts as RocketMQ does (topic, broker, id)."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, object]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


@dataclass(slots=True)
class Message:
    """A message to send. ``keys`` may be one string (space-separated keys) or a list of keys."""

    topic: str
    body: bytes | str
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    wait_store_msg_ok: bool = True
    born_timestamp: int | None = None  # ms; None = at send time (a replay may keep the original's)
    delay_time_level: int = 0  # setDelayTimeLevel: > 0 waits that level's delay at the broker (DELAY)

    def body_bytes(self) -> bytes:
        return self.body.encode("utf-8") if isinstance(self.body, str) else bytes(self.body)

    def wire_properties(self, uniq_key: str | None) -> dict[str, str]:
        """The properties as sent: user properties, then TAGS / KEYS / WAIT / UNIQ_KEY as the Java client sets them."""
        bad = [k for k in self.properties if k in _RESERVED]
        if bad:
            raise MessageError(f"property {bad[0]!r} is set by the client; use Message(tags=/keys=) instead")
        for k, v in self.properties.items():
            if not k or properties.NAME_VALUE_SEPARATOR in k + v or properties.PROPERTY_SEPARATOR in k + v:
                raise MessageError(f"property {k!r} must be non-empty and free of the 0x01/0x02 separators")
        props = dict(self.properties)
        if self.tags:
            props[properties.PROPERTY_TAGS] = self.tags
        if self.keys:
            keys = self.keys if isinstance(self.keys, str) else properties.KEY_SEPARATOR.join(self.keys)
            props[properties.PROPERTY_KEYS] = keys
        if self.delay_time_level > 0:
            props[properties.PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_time_level)
        props[properties.PROPERTY_WAIT_STORE_MSG_OK] = "true" if self.wait_store_msg_ok else "false"
        if uniq_key is not None:
            props[properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq_key
        return props


@dataclass(slots=True)
class MessageExt:
    """A received message (``MessageExt``): the decoded record plus the ids a user looks it up by."""

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str  # UNIQ_KEY when the producer set one, else the offset id (MessageClientExt.getMsgId)
    offset_msg_id: str
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int = 0
    sys_flag: int = 0
    flag: int = 0
    body_crc: int = 0
    broker_name: str = ""
    prepared_transaction_offset: int = 0  # a committed transactional message: its half message's CommitLog offset

    @property
    def tags(self) -> str | None:
        return self.properties.get(properties.PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(properties.PROPERTY_KEYS)

    @property
    def key_list(self) -> list[str]:
        return properties.split_keys(self.keys)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties without the ones the client and broker manage (TAGS, KEYS, UNIQ_KEY, WAIT, CLUSTER...)."""
        return {k: v for k, v in self.properties.items() if k not in _SYSTEM_PROPERTIES}

    @classmethod
    def from_record(cls, rec: records.MessageRecord, broker_name: str = "") -> MessageExt:
        props = rec.property_map
        offset_id = rec.offset_msg_id
        return cls(
            topic=rec.topic, body=rec.body, properties=props, queue_id=rec.queue_id, queue_offset=rec.queue_offset,
            commit_log_offset=rec.physical_offset,
            msg_id=props.get(properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or offset_id, offset_msg_id=offset_id,
            born_timestamp=rec.born_timestamp, store_timestamp=rec.store_timestamp,
            born_host=f"{rec.born_host[0]}:{rec.born_host[1]}", store_host=f"{rec.store_host[0]}:{rec.store_host[1]}",
            reconsume_times=rec.reconsume_times, sys_flag=rec.sys_flag, flag=rec.flag, body_crc=rec.body_crc or 0,
            broker_name=broker_name, prepared_transaction_offset=rec.prepared_transaction_offset,
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        """A JSON-friendly view (the admin CLI's ``--json``); the body as UTF-8 text where it decodes."""
        try:
            body: str = self.body.decode("utf-8")
            encoding = "utf-8"
        except UnicodeDecodeError:
            body, encoding = self.body.hex(), "hex"
        return {
            "topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id,
            "queueOffset": self.queue_offset, "commitLogOffset": self.commit_log_offset, "msgId": self.msg_id,
            "offsetMsgId": self.offset_msg_id, "tags": self.tags, "keys": self.keys, "properties": self.properties,
            "bornTimestamp": self.born_timestamp, "storeTimestamp": self.store_timestamp, "bornHost": self.born_host,
            "storeHost": self.store_host, "reconsumeTimes": self.reconsume_times, "sysFlag": self.sys_flag,
            "bodyCRC": self.body_crc, "bodyEncoding": encoding, "body": body,
        }  # fmt: skip


_SYSTEM_PROPERTIES = frozenset(
    {
        properties.PROPERTY_TAGS, properties.PROPERTY_KEYS, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        properties.PROPERTY_WAIT_STORE_MSG_OK, properties.PROPERTY_CLUSTER, properties.PROPERTY_MSG_REGION,
        properties.PROPERTY_TRACE_SWITCH, properties.PROPERTY_MIN_OFFSET, properties.PROPERTY_MAX_OFFSET,
    }
)  # fmt: skip


def decode_messages(body: bytes, broker_name: str = "", source: str = "") -> list[MessageExt]:
    """Every record of a pull / query body (raw CommitLog records back to back).

    A malformed record raises ``store.format.records.RecordError`` naming ``source`` and the offset in the body.
    """
    view = memoryview(body)
    walk = records.RecordWalk(view)
    out = [
        MessageExt.from_record(records.decode_record(view, pos, source=source, size=size), broker_name)
        for pos, size in walk
    ]
    if walk.ended is not records.WalkEnd.EOF:
        raise records.RecordError(walk.end, walk.reason, source)
    return out


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)
class SendResult:
    """``SendResult``: for a batch, ``msg_id`` / ``offset_msg_id`` are comma-joined per message, as Java does."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


class ConsumeResult(enum.Enum):
    """What a push consumer's handler returns (``ConsumeConcurrentlyStatus``)."""

    SUCCESS = "CONSUME_SUCCESS"
    RETRY = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"
