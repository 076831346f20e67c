"""The operator's broker calls (mqadmin's): DELETE_TOPIC_IN_BROKER (215),
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), DELETE_SUBSCRIPTIONGROUP (207), INVOKE_BROKER_TO_RESET_OFFSET (222,
which tells online clients with RESET_CONSUMER_CLIENT_OFFSET 220), GET_CONSUMER_RUNNING_INFO (307, relayed to the
client), GET_BROKER_CONFIG (26) / UPDATE_BROKER_CONFIG (25), CLONE_GROUP_OFFSET (314),
DELETE_EXPIRED_COMMITLOG (329), VIEW_BROKER_STATS_DATA (315) and QUERY_TOPIC_CONSUME_BY_WHO (300).

Where RocketMQ versions differ, mqlake answers as a 5.x broker with its defaults: a system topic is refused
(``validateSystemTopicWhenUpdateTopic``); a topic with live consumers is deleted all the same (Java checks
nothing: the consumers' next pulls get TOPIC_NOT_EXIST), and its ConsumeQueues are destroyed with their files (the
CommitLog keeps the records; the POP retry topics 5.x also removes do not exist in mqlake); a reset is done in the
broker's own offset table (``useServerSideResetOffset``), so it works for an offline group, and online clients are
also sent the new offsets (as 4.x brokers do), so they drop the positions they hold in memory.
"""

from __future__ import annotations

import asyncio
import logging

from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import RemotingError
from broker.remoting.headers import (
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    GetBrokerConfigResponseHeader,
    GetConsumerRunningInfoRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
)
from broker.remoting.ops_headers import (
    CloneGroupOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from broker.remoting.protocol.body import MessageQueue, SubscriptionGroupConfig
from broker.remoting.protocol.fastjson import dumps_standard
from broker.remoting.protocol.ops_body import (
    BrokerStatsData,
    BrokerStatsItem,
    GroupList,
    MessageQueueForC,
    ResetOffsetBody,
    ResetOffsetBodyForC,
)
from broker.remoting.protocol.wire import BodyError
from broker.server import runtime_config as rc
from broker.server.context import BrokerContext
from broker.server.stats import StatsSnapshot
from store import config_files as cf
from store import names

log = logging.getLogger(__name__)

CALL_CLIENT_TIMEOUT = 5.0  # Broker2Client.callClient's


def _item(s: StatsSnapshot) -> BrokerStatsItem:
    return BrokerStatsItem(sum=s.sum, tps=s.tps, avgpt=s.avgpt)


class OperationsProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._config_version = cf.next_data_version({"counter": 0, "timestamp": 0})

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_subscription_group,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_subscription_group,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.get_consumer_running_info,
            RequestCode.GET_BROKER_CONFIG: self.get_broker_config,
            RequestCode.UPDATE_BROKER_CONFIG: self.update_broker_config,
            RequestCode.CLONE_GROUP_OFFSET: self.clone_group_offset,
            RequestCode.DELETE_EXPIRED_COMMITLOG: self.delete_expired_commitlog,
            RequestCode.VIEW_BROKER_STATS_DATA: self.view_broker_stats_data,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.query_topic_consume_by_who,
        }

    # --- topics and groups ---------------------------------------------------------------------------------
    async def delete_topic(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        topic = cmd.read_header(DeleteTopicRequestHeader).topic
        log.info("delete topic %s, requested by %s", topic, conn.remote_addr)
        bad = names.stored_topic_error(topic)  # a retry or DLQ topic may be longer than a client's topic
        if bad is not None:
            return cmd.response(ResponseCode.INVALID_PARAMETER, bad)
        if b.topics.is_system_topic(topic):
            return cmd.response(ResponseCode.INVALID_PARAMETER, f"The topic[{topic}] is conflict with system topic.")
        b.topics.delete(topic)
        b.offsets.remove_topic(topic)
        b.stats.forget_topic(topic)
        # Its ConsumeQueues go too (messageStore.deleteTopics), so a topic re-created under the name starts at 0.
        await asyncio.to_thread(b.store.delete_topic, topic)
        await b.topics_persisted()  # on disk and announced to the NameServers before the admin hears "done"
        return cmd.response(ResponseCode.SUCCESS)

    async def update_subscription_group(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        cfg = SubscriptionGroupConfig.decode(cmd.body, "subscription group config")  # BodyError: SYSTEM_ERROR
        bad = names.group_error(cfg.group_name)
        if bad is not None:
            return cmd.response(ResponseCode.INVALID_PARAMETER, bad)
        log.info("update subscription group %s, requested by %s", cfg.group_name, conn.remote_addr)
        self.broker.groups.update(cfg)
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_subscription_group(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        h = cmd.read_header(DeleteSubscriptionGroupRequestHeader)
        bad = names.group_error(h.group_name)
        if bad is not None and h.group_name not in b.groups.table:  # a group kept from before may still go
            return cmd.response(ResponseCode.INVALID_PARAMETER, bad)
        log.info("delete subscription group %s (clean offsets: %s), requested by %s", h.group_name, h.clean_offset,
                 conn.remote_addr)  # fmt: skip
        b.groups.delete(h.group_name)
        if h.clean_offset:
            b.offsets.remove_group(h.group_name)
        b.stats.forget_group(h.group_name)
        return cmd.response(ResponseCode.SUCCESS)

    async def clone_group_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        h = cmd.read_header(CloneGroupOffsetRequestHeader)
        topics = [h.topic] if h.topic else sorted(b.offsets.topics_of_group(h.src_group))
        online = b.consumers.groups.get(h.src_group)
        for topic in topics:
            if b.topics.get(topic) is None:
                continue
            # An online source group clones only what it subscribes to (cloneGroupOffset's check).
            if not h.offline and online is not None and online.subscriptions and topic not in online.subscriptions:
                continue
            b.offsets.clone(h.src_group, h.dest_group, topic)
        return cmd.response(ResponseCode.SUCCESS)

    # --- offsets -------------------------------------------------------------------------------------------
    async def reset_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        """Offsets of ``group`` on ``topic`` at ``timestamp`` (-1: the end); with ``isForce`` also forward in time,
        else only where that moves the group back (``Broker2Client.resetOffset``'s rule)."""
        b = self.broker
        h = cmd.read_header(ResetOffsetRequestHeader)
        tc = b.topics.get(h.topic)
        if tc is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"[reset-offset] reset offset failed, no topic in this broker. topic={h.topic}",
            )
        if b.groups.find(h.group, create=False) is None and not b.offsets.query_all(h.group, h.topic):
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"Group {h.group} does not exist")
        table: dict[int, int] = {}
        for q in range(tc.write_queue_nums):
            if h.timestamp < 0:
                target = b.store.get_max_offset_in_queue(h.topic, q)
            else:  # before the first message: the queue's first offset, as RocketMQ
                target = max(await asyncio.to_thread(b.store.get_offset_in_queue_by_time, h.topic, q, h.timestamp), 0)
            current = b.offsets.query(h.group, h.topic, q)
            table[q] = target if h.is_force or current < 0 or target < current else current
        for q, offset in table.items():
            b.offsets.commit(h.group, h.topic, q, offset)
        log.info("reset offsets of %s on %s to %s (timestamp %d), requested by %s", h.group, h.topic, table,
                 h.timestamp, conn.remote_addr)  # fmt: skip
        name = b.config.broker_name
        await self._tell_clients(h, {MessageQueue(topic=h.topic, broker_name=name, queue_id=q): o
                                     for q, o in table.items()})  # fmt: skip
        body = ResetOffsetBody(offset_table={MessageQueue(topic=h.topic, broker_name=name, queue_id=q): o
                                             for q, o in table.items()})  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    async def _tell_clients(self, h: ResetOffsetRequestHeader, table: dict[MessageQueue, int]) -> None:
        info = self.broker.consumers.groups.get(h.group)
        if info is None:
            return
        # isForce travels too (false, as Java's primitive field always does): the C++ client requires every field.
        header = ResetOffsetRequestHeader(topic=h.topic, group=h.group, timestamp=h.timestamp, is_force=False)
        for conn, ch in list(info.channels.items()):
            if ch.language == LanguageCode.CPP.name:
                body = dumps_standard(ResetOffsetBodyForC(offset_table=[
                    MessageQueueForC(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id, offset=o)
                    for mq, o in table.items()]).to_json())  # fmt: skip
            else:
                body = ResetOffsetBody(offset_table=table).encode()
            req = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header, body, oneway=True)
            try:
                await conn.send_oneway(req)
            except RemotingError as e:
                log.warning("[reset-offset] telling %s (%s) failed: %s", ch.client_id, conn.remote_addr, e)

    # --- clients -------------------------------------------------------------------------------------------
    async def get_consumer_running_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        """Relayed to the client's own connection (``callConsumer``); its answer goes back as it came."""
        h = cmd.read_header(GetConsumerRunningInfoRequestHeader)
        info = self.broker.consumers.groups.get(h.consumer_group)
        target = None
        if info is not None:
            target = next((c for c, ch in info.channels.items() if ch.client_id == h.client_id), None)
        invoke = getattr(target, "invoke", None)
        if target is None or invoke is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"The Consumer <{h.consumer_group}> <{h.client_id}> not online")  # fmt: skip
        req = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, None, cmd.body, ext=dict(cmd.ext_fields))
        try:
            resp: RemotingCommand = await invoke(req, CALL_CLIENT_TIMEOUT)
        except TimeoutError as e:
            return cmd.response(ResponseCode.CONSUME_MSG_TIMEOUT,
                                f"consumer <{h.consumer_group}> <{h.client_id}> Timeout: {e}")  # fmt: skip
        except RemotingError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"invoke consumer <{h.consumer_group}> <{h.client_id}> Exception: {e}")  # fmt: skip
        return cmd.response(resp.code, resp.remark, body=resp.body)

    async def query_topic_consume_by_who(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        topic = cmd.read_header(QueryTopicConsumeByWhoRequestHeader).topic
        groups = {g for g, info in b.consumers.groups.items() if topic in info.subscriptions}
        groups |= b.offsets.groups_of_topic(topic)
        return cmd.response(ResponseCode.SUCCESS, body=GroupList(group_list=sorted(groups)).encode())

    # --- broker ----------------------------------------------------------------------------------------------
    async def get_broker_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        body = rc.format_configs(rc.all_configs(b.config, b.store_config))
        header = GetBrokerConfigResponseHeader(version=dumps_standard(self._config_version).decode())
        return cmd.response(ResponseCode.SUCCESS, header=header, body=body)

    async def update_broker_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        b = self.broker
        try:
            text = cmd.body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BodyError(f"updateBrokerConfig body is not UTF-8: {e}") from None
        try:
            changed = rc.update_configs(text, b.config, b.store_config, b.config_changed)
        except rc.ConfigUpdateRefused as e:
            log.warning("update broker config from %s refused: %s", conn.remote_addr, e.remark)
            return cmd.response(e.code, e.remark)
        self._config_version = cf.next_data_version(self._config_version)
        log.info("broker config updated by %s: %s", conn.remote_addr, changed)
        await b.topics_persisted()  # a permission change re-registers: done before the admin hears "done"
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_expired_commitlog(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        log.warning("deleteExpiredCommitLog requested by %s", conn.remote_addr)
        await asyncio.to_thread(self.broker.store.delete_expired_files_manually)
        return cmd.response(ResponseCode.SUCCESS)

    async def view_broker_stats_data(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        h = cmd.read_header(ViewBrokerStatsDataRequestHeader)
        item = self.broker.stats.item(h.stats_name, h.stats_key)
        if item is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The stats <{h.stats_name}> <{h.stats_key}> not exist")
        body = BrokerStatsData(stats_minute=_item(item.minute), stats_hour=_item(item.hour), stats_day=_item(item.day))
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())
