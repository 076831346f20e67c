"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), LOCK/UNLOCK_BATCH_MQ (41/42),
CHECK_CLIENT_CONFIG (46).

A body that does not decode (BodyError) is answered SYSTEM_ERROR with its message by the remoting layer.
"""

from __future__ import annotations

import logging

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import GetConsumerListByGroupRequestHeader, UnregisterClientRequestHeader
from broker.remoting.protocol.body import (
    CheckClientRequestBody,
    GetConsumerListByGroupResponseBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
)
from broker.remoting.protocol.heartbeat import HeartbeatData, is_tag_type
from broker.server.clients import ClientChannel
from broker.server.context import BrokerContext
from broker.server.filters import property_selector

log = logging.getLogger(__name__)


class ClientManageProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }

    async def heart_beat(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        b = self.broker
        data = HeartbeatData.decode(cmd.body)
        for c in data.consumer_data_set:
            cfg = b.groups.find(c.group_name)
            if cfg is not None:
                b.create_retry_topic(c.group_name, cfg.retry_queue_nums)
            channel = ClientChannel(conn, data.client_id, cmd.language, cmd.version)
            b.consumers.register(c.group_name, channel, c.consume_type, c.message_model, c.consume_from_where,
                                 c.subscription_data_set)  # fmt: skip
        for p in data.producer_data_set:
            if p.group_name:
                b.producers.register(p.group_name, ClientChannel(conn, data.client_id, cmd.language, cmd.version))
        return cmd.response(ResponseCode.SUCCESS)

    async def unregister_client(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(UnregisterClientRequestHeader)
        if h.producer_group:
            self.broker.producers.unregister(h.producer_group, conn)
        if h.consumer_group:
            self.broker.consumers.unregister(h.consumer_group, conn)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetConsumerListByGroupRequestHeader)
        ids = self.broker.consumers.client_ids(h.consumer_group)
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {h.consumer_group}")
        body = GetConsumerListByGroupResponseBody(consumer_id_list=ids)
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    async def lock_batch_mq(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        req = LockBatchRequestBody.decode(cmd.body)
        locked = self.broker.locks.try_lock_batch(req.consumer_group, [mq.key for mq in req.mq_set], req.client_id)
        body = LockBatchResponseBody(lock_ok_mq_set=[MessageQueue.of(key) for key in locked])
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    async def unlock_batch_mq(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        req = LockBatchRequestBody.decode(cmd.body, "UnlockBatchRequestBody")
        self.broker.locks.unlock_batch(req.consumer_group, [mq.key for mq in req.mq_set], req.client_id)
        return cmd.response(ResponseCode.SUCCESS)

    async def check_client_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        """Compile a consumer's non-TAG expression before it subscribes, answering as Java's broker does."""
        req = CheckClientRequestBody.decode(cmd.body)
        sub = req.subscription_data
        if sub is None or is_tag_type(sub.expression_type):
            return cmd.response(ResponseCode.SUCCESS)
        try:
            property_selector(self.broker.config, sub.expression_type, sub.sub_string)
        except RequestRefused as e:
            log.warning("client %s@%s: subscription %r refused: %s", req.client_id, req.group, sub.sub_string, e.remark)
            return cmd.response(e.code, e.remark)
        return cmd.response(ResponseCode.SUCCESS)
