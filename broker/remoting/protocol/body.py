"""Request and response bodies of the broker's client and admin calls (Java's ``remoting.protocol.body``):
queue locks, consumer lists, connections, topic and consume stats, subscription groups, offsets, lists and
key-value tables."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, model_validator

from broker.remoting.protocol import fastjson
from broker.remoting.protocol.heartbeat import SubscriptionData
from broker.remoting.protocol.topic import DataVersion
from broker.remoting.protocol.wire import WireModel
from store import config_files as cf

MessageQueueKey = tuple[str, str, int]  # topic, brokerName, queueId


class MessageQueue(WireModel):
    """One queue of a topic on one broker; hashable, as it keys maps (written as JSON-object keys)."""

    model_config = ConfigDict(frozen=True)

    topic: str
    broker_name: str
    queue_id: int

    @model_validator(mode="before")
    @classmethod
    def _from_key_text(cls, data: Any) -> Any:
        # A map key fastjson wrote as an object arrives as that object's JSON text (see fastjson.loads).
        return cf.load_lenient_json(data, "MessageQueue key") if isinstance(data, str) else data

    @classmethod
    def of(cls, key: MessageQueueKey) -> MessageQueue:
        return cls(topic=key[0], broker_name=key[1], queue_id=key[2])

    @property
    def key(self) -> MessageQueueKey:
        return self.topic, self.broker_name, self.queue_id


# --- CHECK_CLIENT_CONFIG (46) -----------------------------------------------------------------------------------
class CheckClientRequestBody(WireModel):
    """What a consumer with a non-TAG subscription asks the broker to compile before it heartbeats."""

    client_id: str | None = None
    group: str | None = None
    subscription_data: SubscriptionData | None = None
    namespace: str | None = None


# --- queue locks (LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42) -------------------------------------------------------
class LockBatchRequestBody(WireModel):
    """LOCK_BATCH_MQ's body; UNLOCK_BATCH_MQ's (``UnlockBatchRequestBody``) has the same fields."""

    consumer_group: str
    client_id: str
    only_this_broker: bool = False
    mq_set: list[MessageQueue] = []


class LockBatchResponseBody(WireModel):
    lock_ok_mq_set: list[MessageQueue] = Field(default=[], alias="lockOKMQSet")


# --- clients ---------------------------------------------------------------------------------------------------
class GetConsumerListByGroupResponseBody(WireModel):
    consumer_id_list: list[str] = []


class ClientConnection(WireModel):
    """One client channel (Java's ``body.Connection``)."""

    client_id: str = ""
    client_addr: str = ""
    language: str = "JAVA"
    version: int = 0


class ConsumerConnection(WireModel):
    connection_set: list[ClientConnection] = []
    subscription_table: dict[str, SubscriptionData] = {}
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None


class ProducerConnection(WireModel):
    connection_set: list[ClientConnection] = []


# --- stats: Map<MessageQueue, V> bodies --------------------------------------------------------------------------
class TopicOffset(WireModel):
    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0


class OffsetWrapper(WireModel):
    broker_offset: int = 0
    consumer_offset: int = 0
    last_timestamp: int = 0


class _QueueTable(WireModel):
    """A body whose ``offsetTable`` is a ``Map<MessageQueue, V>``: fastjson writes it with object keys."""

    object_keys: ClassVar[bool] = True
    offset_table: dict[MessageQueue, Any]

    def to_json(self) -> dict[str, Any]:
        """Keys as their JSON text (as ``decode`` reads them): the one JSON-ready form of an object key."""
        out = self.model_dump(exclude_none=True, exclude={"offset_table"})
        out["offsetTable"] = {json.dumps(mq.to_json(), separators=(",", ":")): v.to_json()
                              for mq, v in self.offset_table.items()}  # fmt: skip
        return dict(sorted(out.items()))

    def encode(self) -> bytes:
        fields = {k: json.dumps(v, separators=(",", ":"))
                  for k, v in self.model_dump(exclude_none=True, exclude={"offset_table"}).items()}  # fmt: skip
        table = ((mq.to_json(), v.to_json()) for mq, v in self.offset_table.items())
        fields["offsetTable"] = fastjson.dumps_mq_keyed(table)
        return ("{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in sorted(fields)) + "}").encode("utf-8")


class TopicStatsTable(_QueueTable):
    """GET_TOPIC_STATS_INFO's body: each queue's min/max offset and last store time."""

    offset_table: dict[MessageQueue, TopicOffset] = {}


class ConsumeStats(_QueueTable):
    """GET_CONSUME_STATS's body: each queue's broker and consumer offsets."""

    offset_table: dict[MessageQueue, OffsetWrapper] = {}
    consume_tps: float = 0.0


# --- config tables ---------------------------------------------------------------------------------------------
class SubscriptionGroupConfig(WireModel):
    """A consumer group's settings (subscriptionGroup.json, GET_ALL_SUBSCRIPTIONGROUP_CONFIG), with RocketMQ
    4.9.8's ``SubscriptionGroupConfig`` defaults."""

    model_config = ConfigDict(extra="allow")  # fields of other versions this broker does not act on are kept

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0  # MixAll.MASTER_ID
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True


class SubscriptionGroupWrapper(WireModel):
    subscription_group_table: dict[str, SubscriptionGroupConfig] = {}
    data_version: DataVersion = Field(default_factory=DataVersion)


class ConsumerOffsetSerializeWrapper(WireModel):
    """GET_ALL_CONSUMER_OFFSET's body: ``{"topic@group": {queueId: offset}}``."""

    offset_table: dict[str, dict[int, int]] = {}


# --- lists and tables ------------------------------------------------------------------------------------------
class TopicList(WireModel):
    topic_list: list[str] = []
    broker_addr: str | None = None


class KVTable(WireModel):
    """A string map: GET_BROKER_RUNTIME_INFO, the NameServer's KV namespaces."""

    table: dict[str, str] = {}
