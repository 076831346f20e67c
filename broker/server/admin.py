"""Admin calls mqadmin makes: UPDATE_AND_CREATE_TOPIC (17), GET_ALL_TOPIC_CONFIG (21), GET_BROKER_RUNTIME_INFO (28),
GET_ALL_CONSUMER_OFFSET (43), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_TOPIC_STATS_INFO (202),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204), GET_CONSUME_STATS (208)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import (
    CreateTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from broker.server import topics as tp
from broker.server.client_manage import json_bytes
from broker.server.clients import ClientChannel
from broker.server.queue_locks import mq_to_json

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


def mq_keyed_json(table: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """A ``Map<MessageQueue, V>`` as fastjson writes it: JSON objects as keys (not standard JSON, but what Java
    clients decode ``TopicStatsTable``/``ConsumeStats`` from)."""
    items = (json.dumps(mq_to_json(mq), separators=(",", ":")) + ":" + json.dumps(v, separators=(",", ":"))
             for mq, v in table.items())  # fmt: skip
    return "{" + ",".join(items) + "}"


def _connection(ch: ClientChannel) -> dict[str, Any]:
    return {
        "clientAddr": getattr(ch.conn, "remote_addr", ""),
        "clientId": ch.client_id,
        "language": ch.language,
        "version": ch.version,
    }


class AdminProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    async def update_and_create_topic(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(CreateTopicRequestHeader)
        bad = tp.topic_name_error(h.topic)
        if bad is None and h.topic == b.config.broker_cluster_name:
            bad = f"topic {h.topic} is the cluster's name"
        if bad is None and not (1 <= h.read_queue_nums <= 1024 and 1 <= h.write_queue_nums <= 1024):
            bad = f"queue numbers must be 1..1024, got read {h.read_queue_nums} write {h.write_queue_nums}"
        if bad is None and h.topic_filter_type not in _FILTER_TYPES:
            bad = f"topicFilterType must be one of {', '.join(_FILTER_TYPES)}, got {h.topic_filter_type!r}"
        if bad is not None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, bad)
        tc = tp.TopicConfig(
            topic_name=h.topic, read_queue_nums=h.read_queue_nums, write_queue_nums=h.write_queue_nums, perm=h.perm,
            topic_filter_type=h.topic_filter_type, topic_sys_flag=h.topic_sys_flag or 0, order=h.order,
        )  # fmt: skip
        b.topics.update(tc)
        await b.topics_persisted()  # durable (and announced) before the admin hears "done"
        return cmd.response(ResponseCode.SUCCESS)

    async def get_all_topic_config(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=self.broker.topics.wrapper().encode())

    async def get_broker_runtime_info(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"table": self.broker.runtime_info()}))

    async def get_topic_stats_info(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(GetTopicStatsInfoRequestHeader)
        tc = b.topics.get(h.topic)
        if tc is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic {h.topic} does not exist")
        table = {}
        for q in range(tc.write_queue_nums):
            max_off = b.store.get_max_offset_in_queue(h.topic, q)
            last = b.store.get_message_store_timestamp(h.topic, q, max_off - 1) if max_off > 0 else 0
            table[(h.topic, b.config.broker_name, q)] = {
                "lastUpdateTimestamp": max(last, 0),
                "maxOffset": max_off,
                "minOffset": b.store.get_min_offset_in_queue(h.topic, q),
            }
        body = '{"offsetTable":' + mq_keyed_json(table) + "}"
        return cmd.response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def get_consume_stats(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(GetConsumeStatsRequestHeader)
        topics = [h.topic] if h.topic else sorted(b.offsets.topics_of_group(h.consumer_group))
        table = {}
        for topic in topics:
            tc = b.topics.get(topic)
            if tc is None:
                continue
            for q in range(tc.read_queue_nums):
                broker_offset = b.store.get_max_offset_in_queue(topic, q)
                consumer_offset = max(b.offsets.query(h.consumer_group, topic, q), 0)
                last = 0
                if consumer_offset > 0:
                    last = max(b.store.get_message_store_timestamp(topic, q, consumer_offset - 1), 0)
                table[(topic, b.config.broker_name, q)] = {
                    "brokerOffset": broker_offset,
                    "consumerOffset": consumer_offset,
                    "lastTimestamp": last,
                }
        body = '{"consumeTps":0.0,"offsetTable":' + mq_keyed_json(table) + "}"
        return cmd.response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def get_all_consumer_offset(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        offsets = self.broker.offsets.table
        table = {key: {str(q): o for q, o in sorted(queues.items())} for key, queues in offsets.items()}
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"offsetTable": table}))

    async def get_all_subscription_group_config(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=self.broker.groups.wrapper().encode())

    async def get_consumer_connection_list(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        h = cmd.read_header(GetConsumerConnectionListRequestHeader)
        info = self.broker.consumers.groups.get(h.consumer_group)
        if info is None or not info.channels:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"consumer group {h.consumer_group} is not online")
        body = {
            "connectionSet": [_connection(ch) for ch in info.channels.values()],
            "consumeFromWhere": info.consume_from_where,
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
        }
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))

    async def get_producer_connection_list(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        h = cmd.read_header(GetProducerConnectionListRequestHeader)
        channels = self.broker.producers.groups.get(h.producer_group)
        if not channels:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"producer group {h.producer_group} has no connection")
        body = {"connectionSet": [_connection(ch) for ch in channels.values()]}
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))
