"""Admin calls mqadmin makes: UPDATE_AND_CREATE_TOPIC (17), GET_ALL_TOPIC_CONFIG (21), GET_BROKER_RUNTIME_INFO (28),
GET_ALL_CONSUMER_OFFSET (43), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_TOPIC_STATS_INFO (202),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204), GET_CONSUME_STATS (208),
GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305)."""

from __future__ import annotations

from broker.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.headers import (
    CreateTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from broker.remoting.protocol.body import (
    ClientConnection,
    ConsumerConnection,
    ConsumerOffsetSerializeWrapper,
    ConsumeStats,
    KVTable,
    MessageQueue,
    OffsetWrapper,
    ProducerConnection,
    TopicList,
    TopicOffset,
    TopicStatsTable,
)
from broker.remoting.protocol.topic import TopicConfig
from broker.server import attributes as attr
from broker.server import topics as tp
from broker.server.clients import ClientChannel
from broker.server.context import BrokerContext
from store import names

_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
BROKER_VERSION_DESC = "V4_9_8"  # MQVersion's name of CURRENT_VERSION


def _connection(ch: ClientChannel) -> ClientConnection:
    return ClientConnection(client_addr=ch.conn.remote_addr, client_id=ch.client_id, language=ch.language,
                            version=ch.version)  # fmt: skip


class AdminProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._all_topics = tp.TableBody(broker.topics, lambda wrapper: wrapper)

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self.get_topic_stats_info,
            RequestCode.GET_CONSUME_STATS: self.get_consume_stats,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_subscription_group_config,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: self.get_system_topic_list,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.get_producer_connection_list,
        }

    async def update_and_create_topic(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(CreateTopicRequestHeader)
        bad = names.topic_error(h.topic)
        if bad is None and h.topic == b.config.broker_cluster_name:
            bad = f"topic {h.topic} is the cluster's name"
        if bad is None and names.is_system_topic(h.topic):  # validateSystemTopicWhenUpdateTopic, on by default
            bad = f"The topic[{h.topic}] is conflict with system topic."
        if bad is None and not (1 <= h.read_queue_nums <= 1024 and 1 <= h.write_queue_nums <= 1024):
            bad = f"queue numbers must be 1..1024, got read {h.read_queue_nums} write {h.write_queue_nums}"
        if bad is None and h.topic_filter_type not in _FILTER_TYPES:
            bad = f"topicFilterType must be one of {', '.join(_FILTER_TYPES)}, got {h.topic_filter_type!r}"
        if bad is not None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, bad)
        current = b.topics.get(h.topic)
        try:
            change = attr.parse(h.attributes)
            if change.get("+" + attr.MESSAGE_TYPE) == attr.MIXED:  # RocketMQ 5's enableMixedMessageType is off
                return cmd.response(ResponseCode.INVALID_PARAMETER, "MIXED message type is not supported.")
            attributes = attr.alter(current is None, current.attributes or {} if current else {}, change)
        except attr.AttributeError_ as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"topic {h.topic}: {e}")
        tc = TopicConfig(
            topic_name=h.topic, read_queue_nums=h.read_queue_nums, write_queue_nums=h.write_queue_nums, perm=h.perm,
            topic_filter_type=h.topic_filter_type, topic_sys_flag=h.topic_sys_flag or 0, order=h.order,
            attributes=attributes,
        )  # fmt: skip
        b.topics.update(tc)
        await b.topics_persisted()  # durable (and announced) before the admin hears "done"
        return cmd.response(ResponseCode.SUCCESS)

    async def get_all_topic_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=await self._all_topics.encode())

    async def get_system_topic_list(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        """The broker's own topics (what mqadmin 5's exportMetadata leaves out of a user's topics)."""
        topics = self.broker.topics
        names = sorted(t for t in topics.table if topics.is_system_topic(t))
        return cmd.response(ResponseCode.SUCCESS, body=TopicList(topic_list=names).encode())

    def runtime_info(self) -> dict[str, str]:
        b = self.broker
        info = dict(b.store.runtime_info())
        info.update(b.stats.runtime_info())
        info.update(b.ha_runtime_info())
        info.update(
            {
                "brokerVersion": str(CURRENT_VERSION),
                "brokerVersionDesc": BROKER_VERSION_DESC,
                "parkedPullRequests": str(b.hold.parked_count),
                "consumerGroups": str(len(b.consumers.groups)),
                "producerGroups": str(len(b.producers.groups)),
                "topicCount": str(len(b.topics.table)),
                # mqadmin clusterList prints these beside the TPS: mqlake serves requests on its event loop, with
                # no thread pool queue and no page-cache lock to wait for, so nothing is ever queued or held
                "sendThreadPoolQueueSize": "0",
                "sendThreadPoolQueueHeadWaitTimeMills": "0",
                "pullThreadPoolQueueSize": "0",
                "pullThreadPoolQueueHeadWaitTimeMills": "0",
                "pageCacheLockTimeMills": "0",
            }
        )
        return info

    async def get_broker_runtime_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=KVTable(table=self.runtime_info()).encode())

    async def get_topic_stats_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(GetTopicStatsInfoRequestHeader)
        tc = b.topics.get(h.topic)
        if tc is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic {h.topic} does not exist")
        stats = TopicStatsTable()
        for q in range(tc.write_queue_nums):
            max_off = b.store.get_max_offset_in_queue(h.topic, q)
            last = b.store.get_message_store_timestamp(h.topic, q, max_off - 1) if max_off > 0 else 0
            mq = MessageQueue(topic=h.topic, broker_name=b.config.broker_name, queue_id=q)
            stats.offset_table[mq] = TopicOffset(
                min_offset=b.store.get_min_offset_in_queue(h.topic, q), max_offset=max_off,
                last_update_timestamp=max(last, 0),
            )  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, body=stats.encode())

    async def get_consume_stats(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        b = self.broker
        h = cmd.read_header(GetConsumeStatsRequestHeader)
        if h.topic:
            topics = [h.topic]
        else:  # what it committed to, and what it subscribes to while online (before its first commit)
            online = b.consumers.groups.get(h.consumer_group)
            subscribed = set(online.subscriptions) if online is not None else set()
            topics = sorted(b.offsets.topics_of_group(h.consumer_group) | subscribed)
        stats = ConsumeStats()
        for topic in topics:
            tc = b.topics.get(topic)
            if tc is None:
                continue
            stats.consume_tps += b.stats.tps_group_get_nums(h.consumer_group, topic)
            for q in range(tc.read_queue_nums):
                consumer_offset = max(b.offsets.query(h.consumer_group, topic, q), 0)
                last = 0
                if consumer_offset > 0:
                    last = max(b.store.get_message_store_timestamp(topic, q, consumer_offset - 1), 0)
                mq = MessageQueue(topic=topic, broker_name=b.config.broker_name, queue_id=q)
                stats.offset_table[mq] = OffsetWrapper(
                    broker_offset=b.store.get_max_offset_in_queue(topic, q), consumer_offset=consumer_offset,
                    last_timestamp=last,
                )  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, body=stats.encode())

    async def get_all_consumer_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        table = {key: dict(sorted(queues.items())) for key, queues in self.broker.offsets.table.items()}
        return cmd.response(ResponseCode.SUCCESS, body=ConsumerOffsetSerializeWrapper(offset_table=table).encode())

    async def get_all_subscription_group_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        return cmd.response(ResponseCode.SUCCESS, body=self.broker.groups.wrapper().encode())

    async def get_consumer_connection_list(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetConsumerConnectionListRequestHeader)
        info = self.broker.consumers.groups.get(h.consumer_group)
        if info is None or not info.channels:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"consumer group {h.consumer_group} is not online")
        body = ConsumerConnection(
            connection_set=[_connection(ch) for ch in info.channels.values()],
            consume_from_where=info.consume_from_where,
            consume_type=info.consume_type,
            message_model=info.message_model,
            subscription_table=dict(info.subscriptions),
        )
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    async def get_producer_connection_list(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetProducerConnectionListRequestHeader)
        channels = self.broker.producers.groups.get(h.producer_group)
        if not channels:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"producer group {h.producer_group} has no connection")
        body = ProducerConnection(connection_set=[_connection(ch) for ch in channels.values()])
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())
