"""Bodies of the operator calls: broker stats, group lists, offset resets, a consumer's running info."""

from __future__ import annotations

from typing import Any, ClassVar

from broker.remoting.protocol import fastjson
from broker.remoting.protocol.body import MessageQueue
from broker.remoting.protocol.wire import WireModel


class BrokerStatsItem(WireModel):
    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0


class BrokerStatsData(WireModel):
    """VIEW_BROKER_STATS_DATA's answer: one stats item over its minute, hour and day windows."""

    stats_minute: BrokerStatsItem = BrokerStatsItem()
    stats_hour: BrokerStatsItem = BrokerStatsItem()
    stats_day: BrokerStatsItem = BrokerStatsItem()


class GroupList(WireModel):
    """QUERY_TOPIC_CONSUME_BY_WHO's answer."""

    group_list: list[str] = []


class ResetOffsetBody(WireModel):
    """``Map<MessageQueue, Long>``: INVOKE_BROKER_TO_RESET_OFFSET's answer and RESET_CONSUMER_CLIENT_OFFSET's
    body for Java (and other non-C++) clients; fastjson writes the queues as object keys."""

    object_keys: ClassVar[bool] = True
    offset_table: dict[MessageQueue, int] = {}

    def encode(self) -> bytes:
        table = fastjson.dumps_mq_keyed((mq.to_json(), off) for mq, off in self.offset_table.items())
        return ('{"offsetTable":' + table + "}").encode()


class MessageQueueForC(WireModel):
    topic: str
    broker_name: str
    queue_id: int
    offset: int


class ResetOffsetBodyForC(WireModel):
    """RESET_CONSUMER_CLIENT_OFFSET's body for C++ clients: the same table as a list."""

    offset_table: list[MessageQueueForC] = []


class ConsumerRunningInfo(WireModel):
    """GET_CONSUMER_RUNNING_INFO's answer, as far as mqlake reads it (clients of every language fill it
    differently; the rest is kept as it came)."""

    model_config = {"extra": "allow"}
    object_keys: ClassVar[bool] = True  # mqTable is keyed by MessageQueue objects

    properties: dict[str, Any] = {}
    subscription_set: list[dict[str, Any]] = []
    mq_table: dict[str, Any] = {}
    status_table: dict[str, Any] = {}
    jstack: str | None = None
