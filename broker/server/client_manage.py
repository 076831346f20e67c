"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), LOCK/UNLOCK_BATCH_MQ (41/42)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import GetConsumerListByGroupRequestHeader, UnregisterClientRequestHeader
from broker.server import clients as cl
from broker.server.queue_locks import mq_from_json, mq_to_json
from store.config_files import ConfigFileError, load_lenient_json

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)


def _json_body(cmd: RemotingCommand, what: str) -> dict:
    if not cmd.body:
        raise ValueError(f"{what} has no body")
    try:
        data = load_lenient_json(cmd.body.decode("utf-8"), what)
    except (UnicodeDecodeError, ConfigFileError) as e:
        raise ValueError(f"{what} body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} body is not a JSON object")
    return data


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class ClientManageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    async def heart_beat(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        b = self.broker
        try:
            data = _json_body(cmd, "HeartbeatData")
            client_id = str(data.get("clientID") or "")
            if not client_id:
                raise ValueError("HeartbeatData has no clientID")
            consumers = data.get("consumerDataSet") or []
            producers = data.get("producerDataSet") or []
            parsed = []
            for c in consumers:
                group = str(c["groupName"])
                subs = [cl.SubscriptionData.from_json(s) for s in c.get("subscriptionDataSet") or []]
                parsed.append((group, c, subs))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {e}")
        for group, c, subs in parsed:
            cfg = b.groups.find(group)
            if cfg is not None:
                b.create_retry_topic(group, cfg.retry_queue_nums)
            channel = cl.ClientChannel(conn, client_id, cmd.language, cmd.version)
            b.consumers.register(
                group,
                channel,
                cl.enum_name(c.get("consumeType"), cl.CONSUME_TYPES, "CONSUME_PASSIVELY"),
                cl.enum_name(c.get("messageModel"), cl.MESSAGE_MODELS, "CLUSTERING"),
                cl.enum_name(c.get("consumeFromWhere"), cl.CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
                subs,
            )
        for p in producers:
            group = str(p.get("groupName") or "")
            if group:
                b.producers.register(group, cl.ClientChannel(conn, client_id, cmd.language, cmd.version))
        return cmd.response(ResponseCode.SUCCESS)

    async def unregister_client(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        h = cmd.read_header(UnregisterClientRequestHeader)
        if h.producer_group:
            self.broker.producers.unregister(h.producer_group, conn)
        if h.consumer_group:
            self.broker.consumers.unregister(h.consumer_group, conn)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        h = cmd.read_header(GetConsumerListByGroupRequestHeader)
        ids = self.broker.consumers.client_ids(h.consumer_group)
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {h.consumer_group}")
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"consumerIdList": ids}))

    def _lock_request(self, cmd: RemotingCommand) -> tuple[str, str, list]:
        data = _json_body(cmd, "LockBatchRequestBody")
        return str(data["consumerGroup"]), str(data["clientId"]), [mq_from_json(m) for m in data.get("mqSet") or []]

    async def lock_batch_mq(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        try:
            group, client_id, mqs = self._lock_request(cmd)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad lock request: {e}")
        locked = self.broker.locks.try_lock_batch(group, mqs, client_id)
        return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"lockOKMQSet": [mq_to_json(m) for m in locked]}))

    async def unlock_batch_mq(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        try:
            group, client_id, mqs = self._lock_request(cmd)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad unlock request: {e}")
        self.broker.locks.unlock_batch(group, mqs, client_id)
        return cmd.response(ResponseCode.SUCCESS)
