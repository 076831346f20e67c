"""``PushConsumer`` (``DefaultMQPushConsumer``, concurrently-consumed, trimmed to what correctness needs).

- Heartbeat (HEART_BEAT with the subscriptions) to every broker at start and every 30 s.
- Rebalance every 20 s and at once on the broker's NOTIFY_CONSUMER_IDS_CHANGED: clustering consumers split the
  sorted queues by ``allocate_averagely``; broadcasting consumers take every queue.
- Two tasks per assigned queue, as ``PullMessageService`` and the consume pool split it: one long-polls
  PULL_MESSAGE (suspend 15 s, commit-offset flag) and pulls again as soon as a batch arrives, up to
  ``PULL_THRESHOLD_FOR_QUEUE`` messages ahead of the handler; the other hands them to the handler one by one, in
  queue order.  So the next pull is on its way while a batch is consumed (a pull round trip per batch no longer
  adds the handler's time).  A queue being taken away finishes the batch in hand, then its offset (the next
  message not yet consumed) is committed before anyone else can be expected to start from it.
- Offsets: clustering commits to the broker every 5 s (oneway) and at shutdown (acknowledged); broadcasting keeps
  them in this process.  A new queue starts at the broker's stored offset, else per ``consume_from_where``.
- A handler answering RETRY (or raising) sends the message back (CONSUMER_SEND_MSG_BACK) so it comes again via
  ``%RETRY%<group>``; if the broker refuses, it is retried here after a back-off, holding the queue's offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.client.allocate import allocate_averagely
from broker.client.errors import MQClientError
from broker.client.instance import ClientInstance, check
from broker.client.message import ConsumeFromWhere, ConsumeResult, MessageExt, MessageModel, MessageQueue
from broker.client.pull_consumer import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    PullResult,
    Subscription,
    check_client_config,
    pull_message,
)
from broker.remoting import headers as h
from broker.remoting.client import RemotingError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.protocol.heartbeat import EXPRESSION_TYPE_TAG, ConsumerData, HeartbeatData
from broker.remoting.signing import Credentials
from store.constants import RETRY_GROUP_TOPIC_PREFIX
from store.format.properties import PROPERTY_RETRY_TOPIC

log = logging.getLogger(__name__)

DEFAULT_MAX_RECONSUME_TIMES = 16
PULL_THRESHOLD_FOR_QUEUE = 1000  # Java's pullThresholdForQueue: messages pulled, not yet consumed, per queue

Handler = Callable[[MessageExt], ConsumeResult | bool | None | Awaitable[ConsumeResult | bool | None]]


@dataclass
class _Worker:
    """The pull and consume tasks of one assigned queue (its ``PullRequest`` and ``ProcessQueue``)."""

    mq: MessageQueue
    batches: asyncio.Queue[PullResult]  # pulled, in queue order, not yet handed to the handler
    task: asyncio.Task | None = None  # the pulls
    consumer: asyncio.Task | None = None  # the handler calls
    waiting: int = 0  # messages in ``batches`` (ProcessQueue's msgCount)
    dropped: bool = False
    consuming: bool = False  # between taking a batch and recording its offset: not cancelled, asked to stop


class PushConsumer:
    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        message_model: MessageModel = MessageModel.CLUSTERING,
        *,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        pull_batch_size: int = 32,
        suspend_millis: int = 15_000,
        heartbeat_interval: float = 30.0,
        rebalance_interval: float = 20.0,
        persist_interval: float = 5.0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        retry_backoff: float = 1.0,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.group = group
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp = consume_timestamp
        self.pull_batch_size = pull_batch_size
        self.suspend_millis = suspend_millis
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.persist_interval = persist_interval
        self.max_reconsume_times = max_reconsume_times
        self.retry_backoff = retry_backoff
        self._client = ClientInstance(
            namesrv_addr, instance_name=instance_name, request_handler=self._on_request, credentials=credentials,
            ssl_context=ssl_context,
        )
        self._subs: dict[str, tuple[Subscription, Handler]] = {}
        self._workers: dict[MessageQueue, _Worker] = {}
        self._offsets: dict[MessageQueue, int] = {}  # next offset to consume, per queue ever assigned
        self._committed: dict[MessageQueue, int] = {}
        self._rebalance_now = asyncio.Event()
        self._background: list[asyncio.Task] = []
        self._rebalance_lock = asyncio.Lock()
        self._started = False

    @property
    def client_id(self) -> str:
        return self._client.client_id

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    @property
    def assigned_queues(self) -> set[MessageQueue]:
        """The queues this consumer pulls right now (retry topic included)."""
        return {mq for mq, w in self._workers.items() if not w.dropped}

    def backlog(self) -> dict[MessageQueue, int]:
        """Messages pulled and waiting for the handler, per assigned queue (the batch in hand not counted)."""
        return {mq: w.waiting for mq, w in self._workers.items() if not w.dropped}

    def offsets(self) -> dict[MessageQueue, int]:
        """Next offset to consume per queue (what is committed, or kept locally when broadcasting)."""
        return dict(self._offsets)

    def subscribe(
        self, topic: str, expression: str | None, handler: Handler, expression_type: str = EXPRESSION_TYPE_TAG
    ) -> None:
        """Consume ``topic`` messages matching ``expression`` (``*`` or ``TagA || TagB``; with
        ``expression_type="SQL92"`` an SQL92 expression over properties, checked by the brokers at start) with
        ``handler``.

        The handler gets one :class:`MessageExt` and returns ``ConsumeResult.SUCCESS`` (or True/None) or
        ``ConsumeResult.RETRY`` (or False); an exception counts as RETRY.  Sync handlers run in a worker thread.
        """
        if self._started:
            raise MQClientError("subscribe before start()")
        self._subs[topic] = (Subscription.parse(topic, expression, expression_type), handler)

    # -- life cycle ---------------------------------------------------------------------------------------------
    async def start(self) -> PushConsumer:
        if not self._subs:
            raise MQClientError("no subscription: call subscribe() before start()")
        if self.clustering:
            retry = RETRY_GROUP_TOPIC_PREFIX + self.group
            self._retry_sub = Subscription.parse(retry, "*")
        await self._client.start()
        for topic in self._topics():
            await self._client.update_route(topic)
        if not self._client.broker_addrs:
            raise MQClientError(f"no route for any of {sorted(self._subs)}")
        for sub, _ in self._subs.values():
            await check_client_config(self._client, self.group, self.client_id, sub)
        self._started = True
        await self._heartbeat()
        await self._rebalance()
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._every(self.heartbeat_interval, self._heartbeat)),
            loop.create_task(self._rebalance_loop()),
            loop.create_task(self._every(self.persist_interval, self._persist)),
        ]
        return self

    async def shutdown(self) -> None:
        if not self._started:
            await self._client.close()
            return
        self._started = False
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await asyncio.gather(*(self._stop_worker(w) for w in list(self._workers.values())))
        self._workers.clear()
        try:
            await self._persist(oneway=False)
        except (RemotingError, MQClientError) as e:
            log.warning("final offset commit of %s failed: %s", self.group, e)
        await self._unregister()
        await self._client.close()

    async def __aenter__(self) -> PushConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _topics(self) -> list[str]:
        topics = list(self._subs)
        if self.clustering:
            topics.append(self._retry_sub.topic)
        return topics

    def _subscription(self, topic: str) -> Subscription:
        return self._retry_sub if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else self._subs[topic][0]

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception as e:  # keep the periodic job alive across broker restarts
                log.warning("%s of %s failed: %s", fn.__name__, self.group, e)

    async def _on_request(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        """Server-initiated requests: NOTIFY_CONSUMER_IDS_CHANGED rebalances at once; the rest is not supported."""
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalance_now.set()
            return None
        if cmd.is_oneway:
            return None
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")

    # -- heartbeat ----------------------------------------------------------------------------------------------
    def heartbeat_body(self) -> bytes:
        subs = [s.to_wire() for s, _ in self._subs.values()]
        if self.clustering:
            subs.append(self._retry_sub.to_wire())
        consumer = ConsumerData(
            group_name=self.group, consume_type="CONSUME_PASSIVELY", message_model=self.message_model.value,
            consume_from_where=self.consume_from_where.value, subscription_data_set=subs,
        )  # fmt: skip
        return HeartbeatData(client_id=self.client_id, consumer_data_set=[consumer]).encode()

    async def _heartbeat(self) -> None:
        body = self.heartbeat_body()
        for addr in sorted(set(self._client.broker_addrs.values())):
            try:
                cmd = RemotingCommand.request(RequestCode.HEART_BEAT, None, body)
                resp = await self._client.remoting.invoke(addr, cmd)
                check(resp, f"heartbeat of {self.group}", addr)
            except (RemotingError, MQClientError) as e:
                log.warning("heartbeat to %s failed: %s", addr, e)

    async def _unregister(self) -> None:
        header = h.UnregisterClientRequestHeader(client_id=self.client_id, consumer_group=self.group)
        for addr in sorted(set(self._client.broker_addrs.values())):
            with contextlib.suppress(RemotingError, MQClientError):
                cmd = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, header)
                await self._client.remoting.invoke(addr, cmd, self._client.timeout)

    # -- rebalance ----------------------------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rebalance_interval):
                    await self._rebalance_now.wait()
            self._rebalance_now.clear()
            try:
                await self._rebalance()
            except Exception as e:
                log.warning("rebalance of %s failed: %s", self.group, e)

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            wanted: set[MessageQueue] = set()
            for topic in self._topics():
                try:
                    route = await self._client.update_route(topic)
                except (RemotingError, MQClientError) as e:
                    log.warning("route of %s unavailable: %s", topic, e)
                    route = self._client.routes.get(topic)
                if route is None:
                    continue
                mqs = route.subscribe_queues(topic)
                if not mqs:
                    continue
                if self.clustering:
                    cids = await self._client.consumer_ids(self.group, mqs[0].broker_name)
                    if not cids:
                        # The broker does not list us (yet): keep what we have rather than drop everything.
                        wanted.update(mq for mq in self._workers if mq.topic == topic)
                        continue
                    wanted.update(allocate_averagely(self.client_id, cids, mqs))
                else:
                    wanted.update(mqs)
            removed = [w for mq, w in self._workers.items() if mq not in wanted]
            await asyncio.gather(*(self._stop_worker(w) for w in removed))
            for w in removed:
                self._workers.pop(w.mq, None)
                await self._commit_one(w.mq)
                if self.clustering:
                    self._offsets.pop(w.mq, None)  # someone else owns it now; re-read it if it comes back
            for mq in sorted(wanted - self._workers.keys()):
                try:
                    offset = await self._start_offset(mq)
                except (RemotingError, MQClientError) as e:
                    log.warning("no start offset for %s yet: %s", mq, e)
                    continue
                self._offsets[mq] = offset
                w = _Worker(mq, asyncio.Queue(max(1, PULL_THRESHOLD_FOR_QUEUE // self.pull_batch_size)))
                loop = asyncio.get_running_loop()
                w.task = loop.create_task(self._pull_loop(w))
                w.consumer = loop.create_task(self._consume_loop(w))
                self._workers[mq] = w

    async def _stop_worker(self, w: _Worker) -> None:
        w.dropped = True
        if w.task is not None:
            w.task.cancel()  # a pull holds no message: what it would bring is pulled again by the next owner
        if w.consumer is not None and not w.consuming:
            w.consumer.cancel()
        for task in (w.task, w.consumer):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _start_offset(self, mq: MessageQueue) -> int:
        """``computePullFromWhere``: the stored offset, else per consume_from_where (retry topics from 0)."""
        if mq in self._offsets:
            return self._offsets[mq]
        if self.clustering:
            stored = await self._client.query_consumer_offset(self.group, mq)
            if stored is not None and stored >= 0:
                return stored
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return 0
        if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return await self._client.min_offset(mq)
        if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and self.consume_timestamp is not None:
            return await self._client.search_offset(mq, self.consume_timestamp)
        return await self._client.max_offset(mq)

    # -- offsets ------------------------------------------------------------------------------------------------
    async def _commit_one(self, mq: MessageQueue, oneway: bool = False) -> None:
        offset = self._offsets.get(mq)
        if not self.clustering or offset is None or self._committed.get(mq) == offset:
            return
        try:
            await self._client.update_consumer_offset(self.group, mq, offset, oneway=oneway)
            self._committed[mq] = offset
        except (RemotingError, MQClientError) as e:
            log.warning("offset commit %s=%d failed: %s", mq, offset, e)

    async def _persist(self, oneway: bool = True) -> None:
        for mq in list(self._offsets):
            await self._commit_one(mq, oneway)

    # -- pulling and consuming ----------------------------------------------------------------------------------------
    async def _pull_loop(self, w: _Worker) -> None:
        mq = w.mq
        sub = self._subscription(mq.topic)
        timeout = self.suspend_millis / 1000 + 15.0  # the Java client's 30 s socket timeout around a 15 s park
        offset = self._offsets[mq]  # the next to pull; self._offsets[mq] is the next to consume
        while not w.dropped:
            flags = FLAG_SUSPEND | FLAG_SUBSCRIPTION
            committed = 0
            if self.clustering and self._offsets[mq] > 0:
                flags |= FLAG_COMMIT_OFFSET
                committed = self._offsets[mq]
            try:
                result = await pull_message(
                    self._client, self.group, mq, offset, self.pull_batch_size, sub, sys_flag=flags,
                    commit_offset=committed, suspend_millis=self.suspend_millis, timeout=timeout,
                )  # fmt: skip
            except (RemotingError, MQClientError) as e:
                log.debug("pull %s@%d failed: %s", mq, offset, e)
                await asyncio.sleep(self.retry_backoff)
                continue
            if committed:
                self._committed[mq] = committed
            offset = result.next_begin_offset
            # Also an empty result: its next offset (a moved one, say) becomes the consumed offset in turn.  Waits
            # while PULL_THRESHOLD_FOR_QUEUE messages are pulled and not yet consumed.
            await w.batches.put(result)
            w.waiting += len(result.messages)

    async def _consume_loop(self, w: _Worker) -> None:
        mq = w.mq
        while not w.dropped:
            result = await w.batches.get()
            w.waiting -= len(result.messages)
            w.consuming = True
            try:
                for msg in result.messages:
                    await self._consume(msg)
                    self._offsets[mq] = msg.queue_offset + 1
                self._offsets[mq] = result.next_begin_offset
            finally:
                w.consuming = False

    async def _consume(self, msg: MessageExt) -> None:
        original = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and original:
            msg.topic = original  # resetRetryAndNamespace: the handler sees the topic it subscribed to
        entry = self._subs.get(msg.topic)
        if entry is None:
            log.warning("no handler for %s message %s; skipped", msg.topic, msg.msg_id)
            return
        handler = entry[1]
        while True:
            if await self._call(handler, msg) is ConsumeResult.SUCCESS:
                return
            if not self.clustering:
                log.warning("broadcast message %s failed in the handler; not redelivered", msg.msg_id)
                return
            if await self._send_back(msg):
                return
            await asyncio.sleep(self.retry_backoff)  # retry here; the queue offset stays below this message
            msg.reconsume_times += 1

    @staticmethod
    async def _call(handler: Handler, msg: MessageExt) -> ConsumeResult:
        try:
            if inspect.iscoroutinefunction(handler):
                result = await handler(msg)
            else:
                result = await asyncio.to_thread(handler, msg)
                if inspect.isawaitable(result):
                    result = await result
        except Exception:
            log.exception("handler failed on %s", msg.msg_id)
            return ConsumeResult.RETRY
        if result is None or result is True or result is ConsumeResult.SUCCESS:
            return ConsumeResult.SUCCESS
        return ConsumeResult.RETRY

    async def _send_back(self, msg: MessageExt) -> bool:
        """CONSUMER_SEND_MSG_BACK: the broker re-queues the message on ``%RETRY%<group>`` (or the DLQ)."""
        header = h.ConsumerSendMsgBackRequestHeader(
            offset=msg.commit_log_offset, group=self.group, delay_level=0, origin_msg_id=msg.msg_id,
            origin_topic=msg.topic, unit_mode=False, max_reconsume_times=self.max_reconsume_times,
        )  # fmt: skip
        try:
            addr, resp = await self._client.invoke_broker(
                msg.broker_name, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header)
            )
        except (RemotingError, MQClientError) as e:
            log.warning("send back of %s failed: %s", msg.msg_id, e)
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.warning("send back of %s refused by %s: %d %s", msg.msg_id, addr, resp.code, resp.remark)
            return False
        return True
