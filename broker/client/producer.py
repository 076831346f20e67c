"""``Producer``: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE / oneway over the asyncio remoting client.

Sends are plain coroutines: many may be in flight at once and they are pipelined on the connection(s) to the
broker (``connections_per_addr`` spreads them over N sockets).  Failed sends are retried on another queue (on
another broker when there is one) for the codes and errors the Java client retries, after refreshing the route.
"""

from __future__ import annotations

import itertools
import logging
import ssl
import time
from collections.abc import Sequence

from broker.client.errors import MQBrokerError, MQClientError
from broker.client.instance import ClientInstance, RequestHandler
from broker.client.message import Message, MessageQueue, SendResult, SendStatus
from broker.client.route import DEFAULT_TOPIC_QUEUE_NUMS, TopicRouteData
from broker.remoting import batch_body
from broker.remoting import headers as h
from broker.remoting.client import RemotingError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.signing import Credentials
from store import names
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC
from store.format import hashing, msgid, properties

log = logging.getLogger(__name__)

MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # DefaultMQProducer.maxMessageSize

# Keyed by the frame's int code: ResponseCode is an IntEnum, whose members hash and compare as their values.
_STATUS: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# DefaultMQProducer.retryResponseCodes: worth another attempt on another queue.
RETRY_CODES = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY, ResponseCode.NO_PERMISSION, ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    }
)  # fmt: skip


def check_topic(topic: str) -> None:
    """``Validators.checkTopic``: fail before the wire for names the broker would refuse anyway."""
    bad = names.topic_error(topic)
    if bad is not None:
        raise MQClientError(f"invalid topic {topic!r}: {bad}")


class Producer:
    """A RocketMQ producer (``DefaultMQProducer``) for asyncio."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        send_timeout: float = 3.0,
        retry_times: int = 2,
        connections_per_addr: int = 1,
        default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        ssl_context: ssl.SSLContext | None = None,
        request_handler: RequestHandler | None = None,
    ) -> None:
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.default_topic_queue_nums = default_topic_queue_nums
        self._client = ClientInstance(
            namesrv_addr, instance_name=instance_name, connections_per_addr=connections_per_addr, timeout=send_timeout,
            credentials=credentials, ssl_context=ssl_context, request_handler=request_handler,
        )  # fmt: skip
        self._client.add_route_listener(self._on_route)
        self._publish: dict[str, list[MessageQueue]] = {}
        self._rr = itertools.count()
        self._uniq = msgid.UniqKeyGenerator()
        self._valid_topics: set[str] = set()
        self._started = False

    @property
    def client_id(self) -> str:
        return self._client.client_id

    async def start(self) -> Producer:
        await self._client.start()
        self._started = True
        return self

    async def shutdown(self) -> None:
        self._started = False
        await self._client.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- routing -----------------------------------------------------------------------------------------------
    def _on_route(self, topic: str, route: TopicRouteData) -> None:
        if topic == AUTO_CREATE_TOPIC_KEY_TOPIC:
            return
        queues = route.publish_queues(topic)
        if queues:
            self._publish[topic] = queues

    async def publish_queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        """The writable queues of ``topic``; TBW102's route (capped at defaultTopicQueueNums) if it is new."""
        cached = self._publish.get(topic)
        if cached and not refresh:
            return cached
        try:
            route = await self._client.update_route(topic)
        except (MQClientError, RemotingError):
            if cached:  # NameServers unreachable: keep sending with what we know, as the Java client does
                return cached
            raise
        if route is not None:
            if not route.publish_queues(topic):
                raise MQClientError(f"topic {topic!r} has no writable queue on any master broker")
            return self._publish[topic]
        default = await self._client.update_route(AUTO_CREATE_TOPIC_KEY_TOPIC)
        queues = default.publish_queues(topic, self.default_topic_queue_nums) if default is not None else []
        if not queues:
            raise MQClientError(
                f"no route for topic {topic!r} and no auto-create route ({AUTO_CREATE_TOPIC_KEY_TOPIC})"
            )
        self._publish[topic] = queues
        return queues

    def _pick(self, queues: list[MessageQueue], avoid_broker: str | None) -> MessageQueue:
        n = len(queues)
        start = next(self._rr)
        if avoid_broker is not None:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != avoid_broker:
                    return mq
        return queues[start % n]

    @staticmethod
    def select_by_key(queues: list[MessageQueue], key: object) -> MessageQueue:
        """``SelectMessageQueueByHash``: the same key always lands on the same queue (ordered messages)."""
        code = hashing.java_string_hash(key) if isinstance(key, str) else hash(key)
        return queues[abs(code) % len(queues)]

    # -- sending ---------------------------------------------------------------------------------------------------
    def _request(
        self, msg: Message, mq: MessageQueue, body: bytes, props: str, *, batch: bool, oneway: bool, sys_flag: int = 0
    ) -> RemotingCommand:
        born = int(time.time() * 1000) if msg.born_timestamp is None else msg.born_timestamp
        header = h.SendMessageRequestHeaderV2(
            a=self.group, b=mq.topic, c=AUTO_CREATE_TOPIC_KEY_TOPIC, d=self.default_topic_queue_nums, e=mq.queue_id,
            f=sys_flag, g=born, h=msg.flag, i=props, j=0, k=False, m=batch, n=mq.broker_name,
        )  # fmt: skip
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        return RemotingCommand.request(code, header, body, oneway=oneway)

    def _prepare(self, msg: Message) -> tuple[bytes, str, str]:
        if not self._started:
            raise MQClientError("producer not started")
        if msg.topic not in self._valid_topics:
            check_topic(msg.topic)
            self._valid_topics.add(msg.topic)
        body = msg.body_bytes()
        if not body:
            raise MQClientError("message body is empty")
        if len(body) > MAX_MESSAGE_SIZE:
            raise MQClientError(f"message body of {len(body)} bytes exceeds {MAX_MESSAGE_SIZE}")
        uniq = self._uniq.next()
        props = properties.encode_properties(msg.wire_properties(uniq)).decode("utf-8")
        return body, props, uniq

    async def send(
        self, msg: Message, queue: MessageQueue | None = None, selector_key: object = None
    ) -> SendResult:
        """Send one message and wait for the broker's answer; raise MQBrokerError / MQClientError on failure."""
        body, props, uniq = self._prepare(msg)
        return await self._send(msg, body, props, uniq, queue, selector_key, batch=False)

    async def send_batch(self, msgs: Sequence[Message], queue: MessageQueue | None = None) -> SendResult:
        """SEND_BATCH_MESSAGE: all messages of one topic into one queue, stored with consecutive queue offsets."""
        if not msgs:
            raise MQClientError("empty batch")
        topic = msgs[0].topic
        if any(m.topic != topic for m in msgs):
            raise MQClientError("every message of a batch must have the same topic")
        encoded = []
        uniqs = []
        for m in msgs:
            body, props, uniq = self._prepare(m)
            encoded.append(batch_body.BatchItem(m.flag, body, props.encode("utf-8")))
            uniqs.append(uniq)
        payload = batch_body.encode_batch_body(encoded)
        if len(payload) > MAX_MESSAGE_SIZE:
            raise MQClientError(f"batch of {len(payload)} bytes exceeds {MAX_MESSAGE_SIZE}")
        # The wrapper carries no UNIQ_KEY: brokers up to 5.3.3 append the wrapper's properties to every inner
        # message, which would give them all the wrapper's id (RocketMQ issue 9416).
        wrapper = Message(topic, payload, born_timestamp=msgs[0].born_timestamp)
        wrapper_props = properties.encode_properties(wrapper.wire_properties(None)).decode("utf-8")
        result = await self._send(wrapper, payload, wrapper_props, ",".join(uniqs), queue, None, batch=True)
        return result

    async def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        """Fire and forget (no answer, no retry), as ``sendOneway``."""
        body, props, _ = self._prepare(msg)
        mq = queue or self._pick(await self.publish_queues(msg.topic), None)
        addr = await self._client.find_broker_addr(mq.broker_name, mq.topic)
        await self._client.remoting.invoke_oneway(addr, self._request(msg, mq, body, props, batch=False, oneway=True))

    async def _send(
        self, msg: Message, body: bytes, props: str, uniq: str, queue: MessageQueue | None, key: object, *,
        batch: bool, sys_flag: int = 0,
    ) -> SendResult:  # fmt: skip
        fixed = queue is not None or key is not None
        attempts = 1 if fixed else 1 + self.retry_times
        last_broker: str | None = None
        error: Exception | None = None
        for attempt in range(attempts):
            if queue is not None:
                mq = queue
            else:
                queues = await self.publish_queues(msg.topic, refresh=attempt > 0)
                mq = self.select_by_key(queues, key) if key is not None else self._pick(queues, last_broker)
            last_broker = mq.broker_name
            try:
                addr = await self._client.find_broker_addr(mq.broker_name, mq.topic)
                cmd = self._request(msg, mq, body, props, batch=batch, oneway=False, sys_flag=sys_flag)
                resp = await self._client.remoting.invoke(addr, cmd, self.send_timeout)
            except (RemotingError, MQClientError) as e:
                error = e
                log.debug("send to %s failed (attempt %d): %s", mq, attempt + 1, e)
                continue
            status = _STATUS.get(resp.code)
            if status is None:
                error = MQBrokerError(resp.code, resp.remark, addr, f"send to {mq.topic}:{mq.queue_id}")
                if resp.code in RETRY_CODES:
                    continue
                raise error
            rh = resp.read_header(h.SendMessageResponseHeader)
            return SendResult(
                status, uniq, rh.msg_id, MessageQueue(mq.topic, mq.broker_name, rh.queue_id), rh.queue_offset,
                rh.transaction_id,
            )  # fmt: skip
        if isinstance(error, MQClientError):
            raise error
        raise MQClientError(f"send to {msg.topic} failed after {attempts} attempt(s): {error}") from error
