"""``PullConsumer`` (``DefaultMQPullConsumer``): the application chooses queues and offsets; plus the PULL_MESSAGE
call and subscription parsing that the push consumer reuses.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

from broker.client.errors import MQBrokerError, MQClientError
from broker.client.instance import ClientInstance
from broker.client.message import MessageQueue, PullResult, PullStatus, decode_messages
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.protocol.body import CheckClientRequestBody
from broker.remoting.protocol.heartbeat import (
    EXPRESSION_TYPE_TAG,
    SUB_ALL,
    SubscriptionData,
    is_tag_type,
    parse_expression,
    tag_codes,
)
from broker.remoting.signing import Credentials

# PullSysFlag bits (reference §7.7)
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


# Keyed by the frame's int code: ResponseCode is an IntEnum, whose members hash and compare as their values.
_PULL_STATUS: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class Subscription:
    """A parsed subscription (``FilterAPI.build``): a tag expression, ``*`` or ``TagA || TagB``, or an
    expression of another type (SQL92) that the broker evaluates over properties."""

    topic: str
    expression: str
    tags: frozenset[str] | None  # None = every message (the broker filters a non-TAG expression itself)
    version: int
    expression_type: str = EXPRESSION_TYPE_TAG

    @classmethod
    def parse(cls, topic: str, expression: str | None, expression_type: str = EXPRESSION_TYPE_TAG) -> Subscription:
        if not is_tag_type(expression_type):
            if not (expression or "").strip():
                raise MQClientError(f"an empty {expression_type} expression")
            return cls(topic, expression or "", None, int(time.time() * 1000), expression_type)
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return cls(topic, SUB_ALL, None, int(time.time() * 1000))
        tags, _ = parse_expression(expr)
        if not tags:
            raise MQClientError(f"subscription expression {expression!r} names no tag")
        return cls(topic, expr, frozenset(tags), int(time.time() * 1000))

    def matches(self, tags: str | None) -> bool:
        return self.tags is None or (tags is not None and tags in self.tags)

    def to_wire(self) -> SubscriptionData:
        """As the HEART_BEAT body carries it."""
        tags = sorted(self.tags) if self.tags is not None else []
        return SubscriptionData(topic=self.topic, sub_string=self.expression, tags_set=tags, code_set=tag_codes(tags),
                                sub_version=self.version, expression_type=self.expression_type)  # fmt: skip

    def to_json(self) -> dict[str, object]:
        return self.to_wire().to_json()


async def pull_message(
    client: ClientInstance,
    group: str,
    mq: MessageQueue,
    offset: int,
    max_nums: int,
    sub: Subscription,
    *,
    sys_flag: int = FLAG_SUBSCRIPTION,
    commit_offset: int = 0,
    suspend_millis: int = 0,
    timeout: float | None = None,
) -> PullResult:
    """One PULL_MESSAGE; messages whose tag does not match are dropped client side (the broker filters by tag
    hash only, so colliding tags get through, as in ``PullAPIWrapper.processPullResult``)."""
    header = h.PullMessageRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset, max_msg_nums=max_nums,
        sys_flag=sys_flag, commit_offset=commit_offset, suspend_timeout_millis=suspend_millis,
        subscription=sub.expression, sub_version=sub.version, expression_type=sub.expression_type,
    )  # fmt: skip
    addr, resp = await client.invoke_broker(mq, RemotingCommand.request(RequestCode.PULL_MESSAGE, header), timeout)
    status = _PULL_STATUS.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.code, resp.remark, addr, f"pull {mq.topic}:{mq.queue_id}@{offset}")
    rh = resp.read_header(h.PullMessageResponseHeader)
    msgs = []
    if status is PullStatus.FOUND and resp.body:
        source = f"pull body from {addr} ({mq.topic}:{mq.queue_id}@{offset})"
        msgs = [m for m in decode_messages(resp.body, mq.broker_name, source) if sub.matches(m.tags)]
    return PullResult(status, rh.next_begin_offset, rh.min_offset, rh.max_offset, msgs)


async def check_client_config(client: ClientInstance, group: str, client_id: str, sub: Subscription) -> None:
    """CHECK_CLIENT_CONFIG (46) to every broker: a non-TAG subscription the broker cannot compile (or does not
    allow) fails here, before any heartbeat carries it (``MQClientInstance.checkClientInBroker``)."""
    if is_tag_type(sub.expression_type):
        return
    body = CheckClientRequestBody(client_id=client_id, group=group, subscription_data=sub.to_wire()).encode()
    for addr in sorted(set(client.broker_addrs.values())):
        resp = await client.remoting.invoke(addr, RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, None, body))
        if resp.code != ResponseCode.SUCCESS:
            what = f"check {sub.expression_type} subscription to {sub.topic}"
            raise MQBrokerError(resp.code, resp.remark, addr, what)


class PullConsumer:
    """Pull messages from queues the caller picks; offsets are the caller's, optionally stored on the broker."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        timeout: float = 3.0,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.group = group
        self.timeout = timeout
        self._client = ClientInstance(
            namesrv_addr, instance_name=instance_name, timeout=timeout, credentials=credentials, ssl_context=ssl_context
        )

    async def start(self) -> PullConsumer:
        await self._client.start()
        return self

    async def shutdown(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> PullConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (``fetchSubscribeMessageQueues``)."""
        route = await self._client.update_route(topic)
        if route is None:
            raise MQClientError(f"topic {topic!r} has no route on the NameServer")
        return route.subscribe_queues(topic)

    async def pull(
        self, mq: MessageQueue, offset: int, max_nums: int = 32, expression: str = SUB_ALL,
        expression_type: str = EXPRESSION_TYPE_TAG,
    ) -> PullResult:  # fmt: skip
        """Read up to ``max_nums`` messages from ``offset``; never blocks waiting for new ones.
        ``expression_type="SQL92"`` has the broker evaluate ``expression`` over the messages' properties."""
        return await pull_message(
            self._client, self.group, mq, offset, max_nums, Subscription.parse(mq.topic, expression, expression_type),
            timeout=self.timeout,
        )  # fmt: skip

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        """Store the group's next offset for ``mq`` on the broker (acknowledged, not oneway)."""
        await self._client.update_consumer_offset(self.group, mq, offset, oneway=False)

    async def fetch_offset(self, mq: MessageQueue) -> int | None:
        """The group's stored offset for ``mq``; None if the broker has none."""
        return await self._client.query_consumer_offset(self.group, mq)

    async def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        return await self._client.search_offset(mq, timestamp)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._client.max_offset(mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._client.min_offset(mq)
