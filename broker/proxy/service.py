"""``apache.rocketmq.v2.MessagingService``: the RPCs a RocketMQ 5 client calls, answered from this broker.

Sends go through the broker's own send path (``SendProcessor``, as a SEND_MESSAGE built from the v2 message) and
END_TRANSACTION through its transaction processor, so topic checks, auto-created retry/DLQ topics, half messages,
timers and flushing are the remoting clients' to the byte.  Receives and acks are ``pop``'s; a PullConsumer's pulls
and offsets are ``pulling``'s.  Every refusal is a v2 ``Status`` with a message naming what was wrong; the RPCs a
5.x client may call that are not served (SyncLiteSubscription) answer UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc

from broker.proxy import convert, namespaces, receipt
from broker.proxy.pop import Popped, PopService
from broker.proxy.pulling import PullService
from broker.proxy.routing import MasterRoute
from broker.proxy.status import Code, ProxyError, from_remoting, status
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2 import service_pb2_grpc
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeaderV2,
)
from broker.remoting.protocol.heartbeat import EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG, SubscriptionData
from broker.server import attributes
from broker.server import half_messages as hm
from broker.server import topics as tp
from broker.server.clients import ClientChannel
from broker.server.filters import property_selector
from broker.server.recall import RecallHandle
from broker.server.send import SendProcessor
from store import names
from store.format import delay, msgid, records
from store.format import properties as P

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

log = logging.getLogger(__name__)

MAX_BATCH = 32  # messages per receive (the proxy's and the pop's limit)
DEFAULT_INVISIBLE_MS = 60_000  # ProxyConfig.defaultInvisibleTimeMills
DEFAULT_POLL_MS = 20_000
PRODUCER_MAX_ATTEMPTS = 3  # the proxy's producer retry policy: 3 attempts, exponential 10 ms .. 1 s
FIRST_RETRY_LEVEL = 3  # a consumer's n-th retry waits delay level 3 + n - 1, as CONSUMER_SEND_MSG_BACK's


@dataclass(frozen=True)
class Malformed:
    """A request whose bytes did not decode (``server``'s decoder gives it to the RPC instead of failing)."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """A Telemetry command the ACL refused (``server`` puts it in the stream in place of the command)."""

    code: int
    reason: str


def peer_ip(context: grpc.aio.ServicerContext) -> str:
    """The client's IP address, as the ACL's white lists match it."""
    return _Peer.of(context).remote_addr.rpartition(":")[0]


@dataclass
class _Peer:
    """The gRPC peer as the broker's send path sees a connection (it reads the born host only)."""

    remote_addr: str
    remote_host: tuple[str, int]

    @classmethod
    def of(cls, context: grpc.aio.ServicerContext) -> _Peer:
        peer = context.peer() or ""  # "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"
        host, _, port = peer.partition(":")[2].rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            return cls(f"{host}:{port}", (host if ":" not in host else "127.0.0.1", int(port)))
        except ValueError:
            return cls(peer, ("127.0.0.1", 0))


class TelemetryChannel:
    """A 5.x client's telemetry stream as the broker's processors see a client connection: registered as a
    producer channel of its transactional topics, so the transaction check-back (CHECK_TRANSACTION_STATE) reaches
    it, as a RecoverOrphanedTransactionCommand."""

    def __init__(self, client_id: str, peer: _Peer) -> None:
        self.client_id = client_id
        self.remote_addr = peer.remote_addr
        self.remote_host = peer.remote_host
        self.commands: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()

    def close(self) -> None:
        self.commands.put_nowait(None)

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return  # remoting-only notifications (consumer ids changed, ...) mean nothing to a 5.x client
        h = cmd.read_header(CheckTransactionStateRequestHeader)
        half = records.decode_record(cmd.body, size=len(cmd.body))
        tx_id = h.offset_msg_id or half.offset_msg_id  # what EndTransaction finds the half message by
        recover = svc.RecoverOrphanedTransactionCommand(message=convert.to_message(half, "", 0), transaction_id=tx_id)
        self.commands.put_nowait(svc.TelemetryCommand(recover_orphaned_transaction_command=recover))


@dataclass
class ClientInfo:
    client_id: str
    client_type: int = pb.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    settings: pb.Settings | None = None
    telemetry: TelemetryChannel | None = None
    producing: set[str] = field(default_factory=set)  # the topics it is registered as a producer of


def _client_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    raise ProxyError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is missing")


_ACCEPTED: dict[str, list[pb.MessageType]] = {
    attributes.NORMAL: [pb.NORMAL], attributes.FIFO: [pb.FIFO], attributes.DELAY: [pb.DELAY],
    attributes.TRANSACTION: [pb.TRANSACTION], attributes.MIXED: [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
}


def accepted(tc: tp.TopicConfig, checked: bool) -> list[pb.MessageType]:
    """The message types a route says a topic's queues take: with ``enableTopicMessageTypeCheck`` (``checked``)
    its ``message.type`` (the proxy's ``parseTopicMessageType``), without it all four, as the broker then takes
    them.  A client validates its sends against them (the official ones do so even before their first settings
    sync, so a route must not name a type the broker would not refuse)."""
    if not checked:
        return _ACCEPTED[attributes.MIXED]
    return _ACCEPTED.get(attributes.topic_type(tc.attributes), [pb.MESSAGE_TYPE_UNSPECIFIED])


def _overall(statuses: list[pb.Status]) -> pb.Status:
    if len(statuses) == 1:
        return statuses[0]
    if all(s.code == Code.OK for s in statuses):
        return status()
    return status(Code.MULTIPLE_RESULTS, "some entries failed: see each entry's status")


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, broker: BrokerController, pop: PopService) -> None:
        self.broker = broker
        self.pop = pop
        self.sender = SendProcessor(broker)
        self.pulls = PullService(broker)
        self.route = MasterRoute(broker)
        self.clients: dict[str, ClientInfo] = {}
        self._round_robin = itertools.count()

    # --- checks shared by the RPCs --------------------------------------------------------------------------
    def _topic(self, resource: pb.Resource) -> tp.TopicConfig:
        name = namespaces.wrap(resource)
        bad = names.topic_error(name)
        if bad is not None:
            raise ProxyError(Code.ILLEGAL_TOPIC, bad)
        tc = self.broker.topics.get(name)
        if tc is None:
            raise ProxyError(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        return tc

    def _group(self, resource: pb.Resource) -> str:
        name = namespaces.wrap(resource)
        bad = names.group_error(name)
        if bad is not None:
            raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, bad)
        if self.broker.groups.find(name) is None:  # created here when autoCreateSubscriptionGroup is on
            raise ProxyError(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group {name} does not exist")
        return name

    def _invisible_ms(self, d: Any, low: int) -> int:
        """An invisible duration within [low, maxInvisibleTimeMills]: minInvisibleTimeMillsForRecv for a receive,
        1 s for a renewal."""
        ms = convert.duration_ms(d)
        high = self.broker.config.max_invisible_time_mills
        if not low <= ms <= high:
            raise ProxyError(Code.ILLEGAL_INVISIBLE_TIME,
                             f"invisible duration of {ms} ms is outside [{low}, {high}] ms")  # fmt: skip
        return ms

    def _receipt(self, text: str) -> receipt.ReceiptHandle:
        return receipt.decode(text, self.broker.config.broker_name)

    def _master(self, what: str, pops: bool = False) -> None:
        """What writes to the CommitLog (sends, transaction ends, pop checkpoints and acks, offset commits, recalls)
        is a master's: a slave (controller mode, until it is elected) refuses it as the broker refuses a remoting
        send there (SERVICE_NOT_AVAILABLE, which RocketMQ 5's proxy answers as INTERNAL_SERVER_ERROR); the 5.x
        clients retry a refused send and, at their next route refresh, are routed to the master.  ``pops``: also
        while the pop service is not running (a new master starts it once its store takes puts; a stop ends it)."""
        if not self.broker.is_slave and (not pops or self.pop.running):
            return
        name = self.broker.config.broker_name
        if self.broker.is_slave:
            replicas = self.broker.replicas
            master = replicas.master_addr if replicas is not None and replicas.master_addr else "not known yet"
            why = f"broker {name} is a slave (its master: {master}); a route queried again leads to the master"
        else:
            why = f"broker {name} serves no receives or acks now (it is stopping, or was elected master a moment ago)"
        raise ProxyError(from_remoting(ResponseCode.SERVICE_NOT_AVAILABLE), f"{what}: {why}")

    # --- route, heartbeat, settings -------------------------------------------------------------------------
    async def QueryRoute(self, request: svc.QueryRouteRequest, context: Any) -> svc.QueryRouteResponse:
        try:
            tc = self._topic(request.topic)
        except ProxyError as e:
            return svc.QueryRouteResponse(status=status(e.code, e.message))
        endpoints = await self.route.endpoints(request.endpoints)
        broker = pb.Broker(name=self.broker.config.broker_name, id=0, endpoints=endpoints)
        types = accepted(tc, self.broker.config.enable_topic_message_type_check)
        queues = []
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            read = qid < tc.read_queue_nums and tp.is_readable(tc.perm)
            write = qid < tc.write_queue_nums and tp.is_writeable(tc.perm)
            perm = pb.READ_WRITE if read and write else pb.READ if read else pb.WRITE if write else pb.NONE
            queues.append(pb.MessageQueue(topic=request.topic, id=qid, permission=perm, broker=broker,
                                          accept_message_types=types))
        return svc.QueryRouteResponse(status=status(), message_queues=queues)

    def _client(self, context: Any) -> ClientInfo:
        cid = _client_id(context)
        info = self.clients.get(cid)
        if info is None:
            info = self.clients[cid] = ClientInfo(cid)
        return info

    async def Heartbeat(self, request: svc.HeartbeatRequest, context: Any) -> svc.HeartbeatResponse:
        try:
            info = self._client(context)
            info.client_type = request.client_type
            if request.HasField("group"):
                info.group = self._group(request.group)
            self._refresh(info)
        except ProxyError as e:
            return svc.HeartbeatResponse(status=status(e.code, e.message))
        return svc.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request: svc.NotifyClientTerminationRequest,
                                      context: Any) -> svc.NotifyClientTerminationResponse:  # fmt: skip
        try:
            cid = _client_id(context)
        except ProxyError as e:
            return svc.NotifyClientTerminationResponse(status=status(e.code, e.message))
        info = self.clients.pop(cid, None)
        if info is not None and info.telemetry is not None:
            self._forget(info.telemetry)
            info.telemetry.close()  # ends its telemetry stream
        return svc.NotifyClientTerminationResponse(status=status())

    def _forget(self, channel: TelemetryChannel) -> None:
        self.broker.producers.channel_closed(channel)
        self.broker.consumers.channel_closed(channel)

    def _register_producer(self, info: ClientInfo, topic: str) -> None:
        """The client as a producer of ``topic``'s transactions (their producer group is the topic)."""
        if info.telemetry is not None and topic not in info.producing:
            self.broker.producers.register(topic, ClientChannel(info.telemetry, info.client_id, "PYTHON"))
            info.producing.add(topic)

    def _register_consumer(self, info: ClientInfo) -> None:
        """A consumer's telemetry stream as a channel of its group (as RocketMQ 5 registers gRPC clients): remoting
        tools list it (consumerConnection), and the broker drops it when its heartbeats stop."""
        settings = info.settings
        if info.telemetry is None or settings is None or not settings.HasField("subscription") or not info.group:
            return
        subs = [SubscriptionData(topic=namespaces.wrap(e.topic), sub_string=e.expression.expression or "*",
                                 expression_type=EXPRESSION_TYPE_SQL92 if e.expression.type == pb.SQL
                                 else EXPRESSION_TYPE_TAG)
                for e in settings.subscription.subscriptions]  # fmt: skip
        channel = ClientChannel(info.telemetry, info.client_id, "PYTHON")
        self.broker.consumers.register(info.group, channel, "CONSUME_POP", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                                       subs)  # fmt: skip

    def _refresh(self, info: ClientInfo) -> None:
        """A heartbeat: its producer and consumer channels stay registered (the broker drops silent ones)."""
        if info.telemetry is None:
            return
        self._register_consumer(info)
        for topic in info.producing:
            channel = self.broker.producers.groups.get(topic, {}).get(info.telemetry)
            if channel is not None:
                channel.last_update = convert.now_ms()

    def settings(self, asked: pb.Settings) -> pb.Settings:
        """The settings a client is told on its telemetry stream: its retry policy, and for a producer the body
        limit, for a consumer its group's FIFO flag, batch size and long-polling time."""
        out = pb.Settings(client_type=asked.client_type, access_point=asked.access_point,
                          request_timeout=asked.request_timeout or convert.duration(3000))  # fmt: skip
        if asked.HasField("publishing"):
            out.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            backoff = out.backoff_policy.exponential_backoff
            backoff.initial.CopyFrom(convert.duration(10))
            backoff.max.CopyFrom(convert.duration(1000))
            backoff.multiplier = 2.0
            out.publishing.topics.extend(asked.publishing.topics)
            out.publishing.max_body_size = self.broker.store_config.max_message_size
            out.publishing.validate_message_type = self.broker.config.enable_topic_message_type_check
        elif asked.HasField("subscription"):
            group = namespaces.wrap(asked.subscription.group)
            out.backoff_policy.max_attempts = self.pop.max_attempts(group)
            out.backoff_policy.customized_backoff.next.extend(convert.duration(ms) for ms in self._backoff_ms())
            sub = out.subscription
            sub.group.CopyFrom(asked.subscription.group)
            sub.subscriptions.extend(asked.subscription.subscriptions)
            sub.fifo = self.pop.fifo(group)
            sub.receive_batch_size = MAX_BATCH
            polling = asked.subscription.long_polling_timeout
            sub.long_polling_timeout.CopyFrom(polling if polling.seconds or polling.nanos
                                              else convert.duration(DEFAULT_POLL_MS))  # fmt: skip
        return out

    def _backoff_ms(self) -> list[int]:
        """A push consumer's wait before each retry: the broker's delay levels from level 3 on (10 s, 30 s, 1 m, ...
        with the default messageDelayLevel), the last one when there are fewer levels."""
        levels = delay.parse_delay_levels(self.broker.store_config.message_delay_level)
        return levels[FIRST_RETRY_LEVEL - 1 :] or levels[-1:]

    async def Telemetry(self, request_iterator: AsyncIterator[svc.TelemetryCommand],
                        context: Any) -> AsyncIterator[svc.TelemetryCommand]:  # fmt: skip
        """Settings sync: each settings command the client writes is answered with the server's settings; a
        producer's stream also carries the transaction check-backs of its topics."""
        try:
            info = self._client(context)
        except ProxyError as e:
            yield svc.TelemetryCommand(status=status(e.code, e.message))
            return
        if info.telemetry is not None:  # a rebuilt stream replaces the old one
            self._forget(info.telemetry)
            info.telemetry.close()
            info.producing.clear()
        channel = info.telemetry = TelemetryChannel(info.client_id, _Peer.of(context))
        commands = channel.commands

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if isinstance(cmd, Malformed):
                        commands.put_nowait(svc.TelemetryCommand(status=status(Code.BAD_REQUEST, cmd.reason)))
                    elif isinstance(cmd, Refused):
                        commands.put_nowait(svc.TelemetryCommand(status=status(cmd.code, cmd.reason)))
                    elif cmd.HasField("settings"):
                        info.settings = cmd.settings
                        info.client_type = cmd.settings.client_type
                        if cmd.settings.HasField("subscription"):
                            info.group = namespaces.wrap(cmd.settings.subscription.group)
                        for topic in cmd.settings.publishing.topics:
                            self._register_producer(info, namespaces.wrap(topic))
                        self._register_consumer(info)
                        commands.put_nowait(svc.TelemetryCommand(status=status(), settings=self.settings(cmd.settings)))
            finally:
                commands.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (reply := await commands.get()) is not None:
                yield reply
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await reader
            self._forget(channel)
            if info.telemetry is channel:  # the client is gone (or rebuilds its stream, and is known again)
                self.clients.pop(info.client_id, None)

    # --- send -----------------------------------------------------------------------------------------------
    async def SendMessage(self, request: svc.SendMessageRequest, context: Any) -> svc.SendMessageResponse:
        if not request.messages:
            return svc.SendMessageResponse(status=status(Code.BAD_REQUEST, "no message to send"))
        peer = _Peer.of(context)
        entries = []
        for msg in request.messages:
            try:
                entries.append(await self._send_one(msg, peer))
                if msg.system_properties.message_type == pb.TRANSACTION:
                    with contextlib.suppress(ProxyError):  # no client id: no check-back, the send stands
                        self._register_producer(self._client(context), namespaces.wrap(msg.topic))
            except ProxyError as e:
                entries.append(svc.SendResultEntry(status=status(e.code, e.message),
                                                   message_id=msg.system_properties.message_id))  # fmt: skip
        return svc.SendMessageResponse(status=_overall([e.status for e in entries]), entries=entries)

    async def _send_one(self, msg: pb.Message, peer: _Peer) -> svc.SendResultEntry:
        self._master("send")
        tc = self._topic(msg.topic)
        props, sys_flag = convert.send_properties(msg, self.broker.store_config.max_message_size)
        if self.broker.config.enable_topic_message_type_check:
            why = attributes.send_refusal(tc.topic_name, tc, props)
            if why is not None:
                raise ProxyError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, why)
        queues = max(tc.write_queue_nums, 1)
        group = props.get(convert.PROPERTY_SHARDING_KEY)
        # A message group always goes to the same queue (the proxy's SendMessageQueueSelector hashes it)
        qid = convert.message_group_queue(group, queues) if group is not None else next(self._round_robin) % queues
        born = msg.system_properties.born_timestamp
        # As a SEND_MESSAGE_V2 (a remoting producer's send): the send path's native fast path takes the common
        # message (header read, put and reply frame in native calls) and hands anything unusual to the general path
        header = SendMessageRequestHeaderV2(
            a=props.get(P.PROPERTY_PRODUCER_GROUP, "PROXY_SEND"), b=tc.topic_name,
            c=tp.AUTO_CREATE_TOPIC_KEY_TOPIC, d=queues, e=qid, f=sys_flag,
            g=born.seconds * 1000 + born.nanos // 1_000_000 or convert.now_ms(), h=0,
            i=P.encode_properties(props).decode("utf-8"),
        )  # fmt: skip
        answer = self.sender.send_inline(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, msg.body),
                                         cast(Channel, peer))  # fmt: skip
        assert answer is not None  # None (an answer held for the group commit to write) is for remoting channels only
        if not isinstance(answer, bytes | RemotingCommand):
            answer = await answer
        # the fast path answers with its ready reply frame (SEND_MESSAGE_V2 and batches only)
        resp = RemotingCommand.decode(answer[4:]) if isinstance(answer, bytes) else answer
        if resp.code != ResponseCode.SUCCESS:
            code = from_remoting(resp.code)
            if code == Code.BAD_REQUEST and P.PROPERTY_TIMER_DELIVER_MS in props:
                code = Code.ILLEGAL_DELIVERY_TIME
            raise ProxyError(code, resp.remark or f"send refused ({resp.code})")
        ext = resp.ext_fields
        tx_id = ext.get("msgId", "") if sys_flag == records.TRANSACTION_PREPARED_TYPE else ""
        return svc.SendResultEntry(status=status(), message_id=msg.system_properties.message_id,
                                   transaction_id=tx_id, offset=int(ext.get("queueOffset", "0")),
                                   recall_handle=ext.get("recallHandle", ""))  # fmt: skip

    async def EndTransaction(self, request: svc.EndTransactionRequest, context: Any) -> svc.EndTransactionResponse:
        """The transaction id is the half message's offset message id: it names the half message's CommitLog
        offset, so a commit or rollback needs no state kept since the send, across restarts too."""
        try:
            code, text = await self._end_transaction(request, _Peer.of(context))
        except ProxyError as e:
            code, text = e.code, e.message
        return svc.EndTransactionResponse(status=status(code, text))

    async def _end_transaction(self, request: svc.EndTransactionRequest, peer: _Peer) -> tuple[int, str]:
        self._master("end transaction")
        kinds = {pb.COMMIT: records.TRANSACTION_COMMIT_TYPE, pb.ROLLBACK: records.TRANSACTION_ROLLBACK_TYPE}
        kind = kinds.get(request.resolution)
        if kind is None:
            return Code.OK, "resolution unknown: the transaction stays open"
        try:
            _, offset = msgid.decode_offset_msg_id(request.transaction_id)
        except (ValueError, IndexError):
            bad = f"transaction id {request.transaction_id!r} is malformed"
            raise ProxyError(Code.INVALID_TRANSACTION_ID, bad) from None
        raw = self.broker.store.look_message_by_offset(offset)
        half = records.decode_record(raw) if raw is not None else None
        if half is None or half.topic != hm.HALF_TOPIC or half.uniq_key != request.message_id:
            missing = f"no half message {request.message_id} for transaction id {request.transaction_id}"
            raise ProxyError(Code.INVALID_TRANSACTION_ID, missing)
        header = EndTransactionRequestHeader(
            producer_group=half.property_map.get(P.PROPERTY_PRODUCER_GROUP, ""),
            tran_state_table_offset=half.queue_offset, commit_log_offset=offset, commit_or_rollback=kind,
            from_transaction_check=request.source == pb.SOURCE_SERVER_CHECK, msg_id=request.transaction_id,
            transaction_id=request.message_id, topic=namespaces.wrap(request.topic),
        )  # fmt: skip
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header)
        answer = self.broker.transactions.end_transaction(cmd, cast(Channel, peer))
        resp = answer if isinstance(answer, RemotingCommand) or answer is None else await answer
        assert resp is not None  # only a oneway END_TRANSACTION goes unanswered
        if resp.code != ResponseCode.SUCCESS:
            code = Code.INVALID_TRANSACTION_ID if resp.code == ResponseCode.SYSTEM_ERROR else from_remoting(resp.code)
            raise ProxyError(code, resp.remark or "end transaction refused")
        return Code.OK, "OK"

    # --- receive, ack -------------------------------------------------------------------------------------
    async def QueryAssignment(self, request: svc.QueryAssignmentRequest, context: Any) -> svc.QueryAssignmentResponse:
        """One assignment per broker, queue id -1: a push consumer pops all of this broker's queues of the topic."""
        try:
            tc = self._topic(request.topic)
            self._group(request.group)
        except ProxyError as e:
            return svc.QueryAssignmentResponse(status=status(e.code, e.message))
        endpoints = await self.route.endpoints(request.endpoints)
        broker = pb.Broker(name=self.broker.config.broker_name, id=0, endpoints=endpoints)
        types = accepted(tc, self.broker.config.enable_topic_message_type_check)
        queue = pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE, broker=broker,
                                accept_message_types=types)  # fmt: skip
        return svc.QueryAssignmentResponse(status=status(), assignments=[pb.Assignment(message_queue=queue)])

    def _filter(self, expr: pb.FilterExpression) -> Any:
        text = expr.expression.strip()
        if expr.type == pb.SQL:
            try:
                selector = property_selector(self.broker.config, EXPRESSION_TYPE_SQL92, text)
            except RequestRefused as e:
                raise ProxyError(Code.ILLEGAL_FILTER_EXPRESSION, e.remark) from None
            return lambda rec: selector.evaluate(rec.property_map)
        if not text or text == "*":
            return lambda rec: True
        tags = {t.strip() for t in text.split("||") if t.strip()}
        if not tags:
            raise ProxyError(Code.ILLEGAL_FILTER_EXPRESSION, f"tag expression {text!r} names no tag")
        return lambda rec: rec.tags in tags

    async def ReceiveMessage(self, request: svc.ReceiveMessageRequest,
                             context: Any) -> AsyncIterator[svc.ReceiveMessageResponse]:  # fmt: skip
        try:
            self._master("receive", pops=True)
            group = self._group(request.group)
            tc = self._topic(request.message_queue.topic)
            accept = self._filter(request.filter_expression)
            if not 0 < request.batch_size <= MAX_BATCH:
                raise ProxyError(Code.BAD_REQUEST, f"batch size {request.batch_size} is outside [1, {MAX_BATCH}]")
            invisible = DEFAULT_INVISIBLE_MS
            if request.HasField("invisible_duration"):
                low = self.broker.config.min_invisible_time_mills_for_recv
                invisible = self._invisible_ms(request.invisible_duration, low)
            wait = (convert.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout")
                    else DEFAULT_POLL_MS)  # fmt: skip
            if wait < 0:
                raise ProxyError(Code.ILLEGAL_POLLING_TIME, f"long polling time of {wait} ms is negative")
            left = context.time_remaining()
            if left is not None:  # answer (empty) before the client's deadline, not after it
                wait = max(0, min(wait, int(left * 1000) - 1000))
            popped = await self.pop.receive(group, tc.topic_name, accept, request.batch_size, invisible, wait)
        except ProxyError as e:
            yield svc.ReceiveMessageResponse(status=status(e.code, e.message))
            return
        if not popped:
            yield svc.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield svc.ReceiveMessageResponse(status=status())
        for p in popped:
            yield svc.ReceiveMessageResponse(message=self._message(p))
        yield svc.ReceiveMessageResponse(delivery_timestamp=convert._timestamp(convert.now_ms()))

    @staticmethod
    def _message(p: Popped) -> pb.Message:
        m = convert.to_message(p.record, p.handle.encode(), p.handle.invisible_ms)
        m.topic.CopyFrom(namespaces.resource(m.topic.name))
        m.system_properties.delivery_attempt = p.attempt
        return m

    async def AckMessage(self, request: svc.AckMessageRequest, context: Any) -> svc.AckMessageResponse:
        try:
            self._master("ack", pops=True)
            group = self._group(request.group)
            self._topic(request.topic)
            if not request.entries:
                raise ProxyError(Code.BAD_REQUEST, "no entry to ack")
        except ProxyError as e:
            return svc.AckMessageResponse(status=status(e.code, e.message))
        handles: list[receipt.ReceiptHandle | ProxyError] = []
        for entry in request.entries:
            try:
                handles.append(self._receipt(entry.receipt_handle))
            except ProxyError as e:
                handles.append(e)
        try:
            refusals = await self.pop.ack(group, handles)
        except ProxyError as e:  # the ack records were not written: none of the entries is acked
            refusals = [e] * len(handles)
        results = [svc.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                             status=status() if e is None else status(e.code, e.message))
                   for entry, e in zip(request.entries, refusals, strict=True)]  # fmt: skip
        return svc.AckMessageResponse(status=_overall([r.status for r in results]), entries=results)

    async def ChangeInvisibleDuration(self, request: svc.ChangeInvisibleDurationRequest,
                                      context: Any) -> svc.ChangeInvisibleDurationResponse:  # fmt: skip
        try:
            self._master("change invisible duration", pops=True)
            group = self._group(request.group)
            self._topic(request.topic)
            invisible = self._invisible_ms(request.invisible_duration, 1000)
            handle = await self.pop.change_invisible(group, self._receipt(request.receipt_handle), invisible)
        except ProxyError as e:
            return svc.ChangeInvisibleDurationResponse(status=status(e.code, e.message))
        return svc.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle.encode())

    async def ForwardMessageToDeadLetterQueue(self, request: svc.ForwardMessageToDeadLetterQueueRequest,
                                              context: Any) -> svc.ForwardMessageToDeadLetterQueueResponse:  # fmt: skip
        try:
            self._master("forward to the dead letter queue", pops=True)
            group = self._group(request.group)
            self._topic(request.topic)
            await self.pop.dead_letter(group, self._receipt(request.receipt_handle))
        except ProxyError as e:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status(e.code, e.message))
        return svc.ForwardMessageToDeadLetterQueueResponse(status=status())

    # --- not served -------------------------------------------------------------------------------------------
    @staticmethod
    def _unsupported(what: str) -> pb.Status:
        return status(Code.UNSUPPORTED, f"{what} is not served by this broker (see docs/grpc.md)")

    async def PullMessage(self, request: svc.PullMessageRequest,
                          context: Any) -> AsyncIterator[svc.PullMessageResponse]:  # fmt: skip
        try:
            group = self._group(request.group)
            tc = self._topic(request.message_queue.topic)
            wait = convert.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            if wait < 0:
                raise ProxyError(Code.ILLEGAL_POLLING_TIME, f"long polling time of {wait} ms is negative")
            left = context.time_remaining()
            if left is not None:  # answer (empty) before the client's deadline, not after it
                wait = max(0, min(wait, int(left * 1000) - 1000))
            async for reply in self.pulls.pull(group, tc, request, wait, _Peer.of(context)):
                yield reply
        except ProxyError as e:
            yield svc.PullMessageResponse(status=status(e.code, e.message))

    async def UpdateOffset(self, request: svc.UpdateOffsetRequest, context: Any) -> svc.UpdateOffsetResponse:
        try:
            self._master("update offset")
            self.pulls.update_offset(self._group(request.group), self._topic(request.message_queue.topic), request)
        except ProxyError as e:
            return svc.UpdateOffsetResponse(status=status(e.code, e.message))
        return svc.UpdateOffsetResponse(status=status())

    async def GetOffset(self, request: svc.GetOffsetRequest, context: Any) -> svc.GetOffsetResponse:
        try:
            offset = self.pulls.get_offset(self._group(request.group), self._topic(request.message_queue.topic),
                                           request)  # fmt: skip
        except ProxyError as e:
            return svc.GetOffsetResponse(status=status(e.code, e.message))
        return svc.GetOffsetResponse(status=status(), offset=offset)

    async def QueryOffset(self, request: svc.QueryOffsetRequest, context: Any) -> svc.QueryOffsetResponse:
        try:
            offset = await self.pulls.query_offset(self._topic(request.message_queue.topic), request)
        except ProxyError as e:
            return svc.QueryOffsetResponse(status=status(e.code, e.message))
        return svc.QueryOffsetResponse(status=status(), offset=offset)

    async def RecallMessage(self, request: svc.RecallMessageRequest, context: Any) -> svc.RecallMessageResponse:
        """The broker's RECALL_MESSAGE (``broker.server.recall``).  As RocketMQ 5's proxy, a topic of another
        message type (under ``enableTopicMessageTypeCheck``) and a handle that does not decode (with
        INTERNAL_SERVER_ERROR) are refused here, before any broker is asked; the broker's own refusals (topic or
        broker not matching, a time past) keep its code, translated."""
        try:
            self._master("recall")
            tc = self._topic(request.topic)
        except ProxyError as e:
            return svc.RecallMessageResponse(status=status(e.code, e.message))
        if self.broker.config.enable_topic_message_type_check:  # only a DELAY (or MIXED) topic has timers
            why = attributes.type_refusal(attributes.topic_type(tc.attributes), attributes.DELAY)
            if why is not None:
                return svc.RecallMessageResponse(status=status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, why))
        try:
            RecallHandle.decode(request.recall_handle)
        except ValueError as e:
            return svc.RecallMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(e)))
        code, remark, msg_id = await self.broker.recalls.recall(tc.topic_name, request.recall_handle,
                                                                _Peer.of(context).remote_addr)  # fmt: skip
        if code != ResponseCode.SUCCESS:
            return svc.RecallMessageResponse(status=status(from_remoting(code), remark or f"recall refused ({code})"))
        return svc.RecallMessageResponse(status=status(), message_id=msg_id)

    async def SyncLiteSubscription(self, request: Any, context: Any) -> svc.SyncLiteSubscriptionResponse:
        return svc.SyncLiteSubscriptionResponse(status=self._unsupported("SyncLiteSubscription"))
