"""The gRPC endpoint over real gRPC on loopback with mqlake's generated stubs (``broker.proxy.v2``) against an
in-process broker: bad input (each refusal the v2 status code RocketMQ's proxy answers, with a message naming what
was wrong, nothing stored or acked, the broker serving on), dead-lettering, filters, settings sync, a receive
closed mid-wait or parked when the proxy stops."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading

import grpc
import pytest

from broker.proxy.server import GrpcProxy, ProxyRoleError
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2.service_pb2_grpc import MessagingServiceStub
from broker.remoting.codes import RequestCode
from broker.remoting.headers import GetConsumerListByGroupRequestHeader
from broker.remoting.protocol.topic import TopicConfig
from broker.server import topics as tp
from tests.helpers import wait_until
from tests.live_broker import SMALL, LiveBroker

pytestmark = pytest.mark.integration

META = (("x-mq-client-id", "test-client"),)
_ids = itertools.count()


class Proxied:
    """A LiveBroker with the gRPC proxy on its loop, and a blocking stub to it."""

    def __init__(self, broker: LiveBroker) -> None:
        self.broker = broker
        self.proxy: GrpcProxy = broker.run(self._start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.proxy.port}",
                                             options=[("grpc.max_send_message_length", -1)])  # fmt: skip
        self.stub = MessagingServiceStub(self.channel)

    async def _start(self) -> GrpcProxy:
        proxy = GrpcProxy(self.broker.controller, host="127.0.0.1")
        await proxy.start()
        return proxy

    def close(self) -> None:
        self.channel.close()
        self.broker.run(self.proxy.stop(grace=0))
        self.broker.close()

    @property
    def store(self):
        return self.broker.controller.store

    def on_loop(self, fn, *args) -> None:
        """``fn(*args)`` on the broker's loop (a config change schedules its write there)."""

        async def call() -> None:
            fn(*args)

        self.broker.run(call())

    def topic(self, queues: int = 1) -> str:
        name = f"BadT{next(_ids)}"
        self.on_loop(self.broker.controller.topics.update, TopicConfig(topic_name=name, read_queue_nums=queues,
                                                                       write_queue_nums=queues))  # fmt: skip
        return name

    def send(self, topic: str, body: bytes = b"hello", tag: str | None = None, **props: str) -> svc.SendMessageResponse:
        msg = pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=props)
        if tag is not None:
            msg.system_properties.tag = tag
        msg.system_properties.message_id = f"0100000000000000000000000{next(_ids):09d}"
        msg.system_properties.message_type = pb.NORMAL
        return self.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META, timeout=10)

    def receive(self, topic: str, group: str, invisible_s: int = 10, wait_s: float = 0, batch: int = 32,
                timeout: float = 10, expression: str = "*", kind: int = pb.TAG) -> tuple[pb.Status, list[pb.Message]]:
        req = svc.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=batch,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
                                        filter_expression=pb.FilterExpression(type=kind, expression=expression))
        req.invisible_duration.FromMilliseconds(int(invisible_s * 1000))
        req.long_polling_timeout.FromMilliseconds(int(wait_s * 1000))
        status, msgs = None, []
        for r in self.stub.ReceiveMessage(req, metadata=META, timeout=timeout):
            if r.HasField("status"):
                status = r.status
            elif r.HasField("message"):
                msgs.append(r.message)
        return status, msgs

    def ack(self, topic: str, group: str, handle: str) -> svc.AckMessageResponse:
        entry = svc.AckMessageEntry(message_id="m", receipt_handle=handle)
        req = svc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry])
        return self.stub.AckMessage(req, metadata=META, timeout=10)


@pytest.fixture
def proxied(tmp_path):
    conf = {"grpcServerPort": "0", "minInvisibleTimeMillsForRecv": "1000", "autoCreateSubscriptionGroup": "false",
            "enablePropertyFilter": "true"}
    p = Proxied(LiveBroker(tmp_path / "store", **conf).start())
    yield p
    p.close()


def group(p: Proxied, **fields) -> str:
    from broker.remoting.protocol.body import SubscriptionGroupConfig

    name = f"BadG{next(_ids)}"
    p.on_loop(p.broker.controller.groups.update, SubscriptionGroupConfig(group_name=name, **fields))
    return name


def test_unknown_topic_and_group_and_bad_names(proxied) -> None:
    r = proxied.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="NoSuchTopic")), metadata=META)
    assert r.status.code == pb.TOPIC_NOT_FOUND and "NoSuchTopic" in r.status.message
    r = proxied.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="bad topic!")), metadata=META)
    assert r.status.code == pb.ILLEGAL_TOPIC
    sent = proxied.send("NoSuchTopic")
    assert sent.status.code == pb.TOPIC_NOT_FOUND and sent.entries[0].status.code == pb.TOPIC_NOT_FOUND
    assert proxied.store.get_max_offset_in_queue("NoSuchTopic", 0) == 0  # not auto-created by a gRPC send
    topic = proxied.topic()
    status, _ = proxied.receive(topic, "NoSuchGroup")
    assert status.code == pb.CONSUMER_GROUP_NOT_FOUND and "NoSuchGroup" in status.message
    hb = proxied.stub.Heartbeat(svc.HeartbeatRequest(client_type=pb.PRODUCER), timeout=10)  # no client id
    assert hb.status.code == pb.CLIENT_ID_REQUIRED


def test_malformed_and_oversized_messages_are_refused_and_nothing_is_stored(proxied) -> None:
    topic = proxied.topic()
    assert proxied.send(topic, b"").entries[0].status.code == pb.MESSAGE_BODY_EMPTY
    limit = int(SMALL["maxMessageSize"])
    too_big = proxied.send(topic, b"x" * (limit + 1)).entries[0].status
    assert too_big.code == pb.MESSAGE_BODY_TOO_LARGE and str(limit) in too_big.message
    assert proxied.send(topic, **{"TAGS": "x"}).entries[0].status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    # larger than the gRPC limit (maxMessageSize + room for the envelope): gRPC refuses it before decoding
    with pytest.raises(grpc.RpcError) as huge:
        proxied.send(topic, b"x" * (limit + 200 * 1024))
    assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # bytes that are no SendMessageRequest
    raw = proxied.channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                      response_deserializer=svc.SendMessageResponse.FromString)  # fmt: skip
    garbage = raw(b"\xff\xff\xff\xff", metadata=META, timeout=10).status
    assert garbage.code == pb.BAD_REQUEST and "malformed SendMessageRequest" in garbage.message
    # a FIFO message without its group, a DELAY one without its time
    msg = pb.Message(topic=pb.Resource(name=topic), body=b"b")
    msg.system_properties.message_id = "01000000000000000000000000000000AA"
    msg.system_properties.message_type = pb.FIFO
    r = proxied.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META)
    assert r.entries[0].status.code == pb.ILLEGAL_MESSAGE_GROUP
    assert proxied.store.get_max_offset_in_queue(topic, 0) == 0  # none of them was stored
    assert proxied.send(topic).status.code == pb.OK  # and the endpoint still serves
    wait_until(lambda: proxied.store.get_max_offset_in_queue(topic, 0) == 1, what="the good message stored")


def test_a_body_digest_mismatch_is_refused_as_corrupted_and_a_matching_one_is_stored(proxied) -> None:
    topic = proxied.topic()

    def send(checksum: str) -> svc.SendMessageResponse:
        msg = pb.Message(topic=pb.Resource(name=topic), body=b"hello")
        msg.system_properties.message_id = f"0100000000000000000000000{next(_ids):09d}"
        msg.system_properties.message_type = pb.NORMAL
        msg.system_properties.body_digest.CopyFrom(pb.Digest(type=pb.MD5, checksum=checksum))
        return proxied.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META, timeout=10)

    bad = send("00000000000000000000000000000000")
    assert bad.status.code == pb.MESSAGE_CORRUPTED and bad.entries[0].status.code == pb.MESSAGE_CORRUPTED
    assert send("5d41402abc4b2a76b9719d911017c592").status.code == pb.OK
    wait_until(lambda: proxied.store.get_max_offset_in_queue(topic, 0) == 1, what="the good message stored")
    g = group(proxied)
    status, msgs = proxied.receive(topic, g)
    assert status.code == pb.OK and [m.body for m in msgs] == [b"hello"]  # only the matching one was stored
    assert msgs[0].system_properties.body_digest == pb.Digest(type=pb.MD5, checksum="5D41402ABC4B2A76B9719D911017C592")


def test_bad_receipt_handles_and_invisible_times(proxied) -> None:
    topic, g = proxied.topic(), group(proxied)
    assert proxied.send(topic).status.code == pb.OK
    status, _ = proxied.receive(topic, g, invisible_s=0.5)
    assert status.code == pb.ILLEGAL_INVISIBLE_TIME and "1000" in status.message
    status, [m] = proxied.receive(topic, g, wait_s=5)
    handle = m.system_properties.receipt_handle
    assert m.system_properties.delivery_attempt == 1
    assert proxied.ack(topic, g, "not a handle").status.code == pb.INVALID_RECEIPT_HANDLE
    fields = handle.split(" ")
    other = " ".join(fields[:5] + ["broker-z"] + fields[6:])
    refused = proxied.ack(topic, g, other).status
    assert refused.code == pb.INVALID_RECEIPT_HANDLE and "broker-z" in refused.message
    assert proxied.ack(topic, g, handle).status.code == pb.OK
    again = proxied.ack(topic, g, handle).status
    assert again.code == pb.INVALID_RECEIPT_HANDLE and "already acked" in again.message
    req = svc.ChangeInvisibleDurationRequest(group=pb.Resource(name=g), topic=pb.Resource(name=topic),
                                             receipt_handle=handle, message_id="m")  # fmt: skip
    req.invisible_duration.FromSeconds(30)
    assert proxied.stub.ChangeInvisibleDuration(req, metadata=META).status.code == pb.INVALID_RECEIPT_HANDLE
    tx = svc.EndTransactionRequest(topic=pb.Resource(name=topic), message_id="m", transaction_id="nonsense",
                                   resolution=pb.COMMIT)  # fmt: skip
    assert proxied.stub.EndTransaction(tx, metadata=META).status.code == pb.INVALID_TRANSACTION_ID


def test_message_past_the_retry_limit_goes_to_the_dlq_and_forward_to_dlq(proxied) -> None:
    topic, g = proxied.topic(), group(proxied, retry_max_times=1)  # two deliveries in all
    dlq = tp.dlq_topic(g)
    proxied.send(topic, b"unlucky")
    _, [first] = proxied.receive(topic, g, invisible_s=1, wait_s=5)
    _, [second] = proxied.receive(topic, g, invisible_s=1, wait_s=10)  # after 1 s, from the retry topic
    assert (first.body, second.body) == (b"unlucky", b"unlucky")
    assert second.system_properties.delivery_attempt == 2 and second.topic.name == topic
    wait_until(lambda: proxied.store.get_max_offset_in_queue(dlq, 0) == 1, what="the DLQ to get it")
    status, msgs = proxied.receive(topic, g, wait_s=1.5)
    assert status.code == pb.MESSAGE_NOT_FOUND and msgs == []
    # ForwardMessageToDeadLetterQueue: at once, and it is acked
    proxied.send(topic, b"poison")
    _, [m] = proxied.receive(topic, g, wait_s=5)
    req = svc.ForwardMessageToDeadLetterQueueRequest(group=pb.Resource(name=g), topic=pb.Resource(name=topic),
                                                     receipt_handle=m.system_properties.receipt_handle,
                                                     message_id=m.system_properties.message_id)  # fmt: skip
    assert proxied.stub.ForwardMessageToDeadLetterQueue(req, metadata=META).status.code == pb.OK
    wait_until(lambda: proxied.store.get_max_offset_in_queue(dlq, 0) == 2, what="the forwarded message in the DLQ")
    assert proxied.ack(topic, g, m.system_properties.receipt_handle).status.code == pb.INVALID_RECEIPT_HANDLE


def test_receive_cancelled_while_waiting_loses_nothing(proxied) -> None:
    topic, g = proxied.topic(), group(proxied)
    req = svc.ReceiveMessageRequest(group=pb.Resource(name=g), batch_size=1,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))  # fmt: skip
    req.long_polling_timeout.FromSeconds(20)
    call = proxied.stub.ReceiveMessage(req, metadata=META, timeout=30)

    def parked() -> bool:  # the receive is parked on the broker, waiting for the topic
        return proxied.proxy.pop.waiting(topic) > 0

    wait_until(parked, what="the receive to park")
    call.cancel()
    wait_until(lambda: not parked(), what="the cancelled receive to leave")
    proxied.send(topic, b"after")
    status, [m] = proxied.receive(topic, g, wait_s=5)
    assert status.code == pb.OK and m.body == b"after" and m.system_properties.delivery_attempt == 1


def test_unserved_rpcs_answer_unsupported(proxied) -> None:
    r = proxied.stub.GetOffset(svc.GetOffsetRequest(), metadata=META)
    assert r.status.code == pb.UNSUPPORTED and "GetOffset" in r.status.message



def test_stopping_the_proxy_answers_a_parked_receive(proxied) -> None:
    topic, g = proxied.topic(), group(proxied)
    result: list = []

    def receive() -> None:
        result.append(proxied.receive(topic, g, wait_s=20, timeout=30))

    waiter = threading.Thread(target=receive)
    waiter.start()
    wait_until(lambda: proxied.proxy.pop.waiting(topic) > 0, what="the receive to park")
    proxied.broker.run(proxied.proxy.stop(grace=5))
    waiter.join(10)
    assert not waiter.is_alive()
    [(status, msgs)] = result
    assert status.code == pb.MESSAGE_NOT_FOUND and msgs == []


def test_tag_and_sql92_filters_pick_the_messages_and_a_bad_expression_is_refused(proxied) -> None:
    topic = proxied.topic()
    for i, (tag, color) in enumerate([("TagA", "red"), ("TagB", "red"), ("TagA", "blue"), ("TagC", "red")]):
        assert proxied.send(topic, f"m{i}".encode(), tag=tag, color=color).status.code == pb.OK
    wait_until(lambda: proxied.store.get_max_offset_in_queue(topic, 0) == 4, what="four messages stored")
    _, by_tag = proxied.receive(topic, group(proxied), expression="TagA || TagC", wait_s=5)
    assert sorted(m.body for m in by_tag) == [b"m0", b"m2", b"m3"]
    _, by_sql = proxied.receive(topic, group(proxied), expression="color = 'red' AND TAGS <> 'TagC'", kind=pb.SQL,
                                wait_s=5)  # fmt: skip
    assert sorted(m.body for m in by_sql) == [b"m0", b"m1"]
    status, _ = proxied.receive(topic, group(proxied), expression="color = = 'red'", kind=pb.SQL)
    assert status.code == pb.ILLEGAL_FILTER_EXPRESSION and status.message


def test_telemetry_answers_settings_and_query_assignment_names_this_broker(proxied) -> None:
    fifo = group(proxied, consumeMessageOrderly=True, retry_max_times=3)
    topic = proxied.topic(queues=2)
    publish = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))
    subscribe = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(name=fifo)))
    stream = proxied.stub.Telemetry(iter([svc.TelemetryCommand(settings=publish),
                                          svc.TelemetryCommand(settings=subscribe)]), metadata=META, timeout=10)
    producer, consumer = next(stream), next(stream)
    stream.cancel()
    assert producer.status.code == pb.OK and producer.settings.publishing.max_body_size == int(SMALL["maxMessageSize"])
    assert producer.settings.backoff_policy.max_attempts == 3
    assert consumer.settings.subscription.fifo and consumer.settings.backoff_policy.max_attempts == 4
    req = svc.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name=fifo))
    [assignment] = proxied.stub.QueryAssignment(req, metadata=META).assignments
    assert assignment.message_queue.id == -1 and assignment.message_queue.broker.name == "broker-a"
    req.topic.name = "NoSuchTopic"
    assert proxied.stub.QueryAssignment(req, metadata=META).status.code == pb.TOPIC_NOT_FOUND


def test_fifo_message_past_the_retry_limit_goes_to_the_dlq_and_the_next_one_follows(proxied) -> None:
    topic, g = proxied.topic(), group(proxied, consumeMessageOrderly=True, retry_max_times=1)
    for body in (b"first", b"second"):
        assert proxied.send(topic, body).status.code == pb.OK
    wait_until(lambda: proxied.store.get_max_offset_in_queue(topic, 0) == 2, what="both stored")
    _, [a] = proxied.receive(topic, g, invisible_s=1, wait_s=5)
    _, [b] = proxied.receive(topic, g, invisible_s=1, wait_s=10)  # the same message again, from the same queue
    assert (a.body, a.system_properties.delivery_attempt) == (b"first", 1)
    assert (b.body, b.system_properties.delivery_attempt) == (b"first", 2)
    _, [c] = proxied.receive(topic, g, invisible_s=1, wait_s=10)  # two attempts used: dead-lettered, the next follows
    assert (c.body, c.system_properties.delivery_attempt) == (b"second", 1)
    wait_until(lambda: proxied.store.get_max_offset_in_queue(tp.dlq_topic(g), 0) == 1, what="first in the DLQ")


def test_a_clients_telemetry_stream_is_its_producer_and_consumer_channel_until_it_terminates(proxied) -> None:
    """Producer: the transaction check-back channel of its topics; consumer: a member of its group, as remoting
    consumers are (GET_CONSUMER_LIST_BY_GROUP lists it)."""
    topic, g = proxied.topic(), group(proxied)
    publish = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))
    entry = pb.SubscriptionEntry(topic=pb.Resource(name=topic), expression=pb.FilterExpression(type=pb.TAG,
                                                                                               expression="TagA"))
    subscribe = pb.Settings(client_type=pb.SIMPLE_CONSUMER,
                            subscription=pb.Subscription(group=pb.Resource(name=g), subscriptions=[entry]))
    release = threading.Event()

    def commands():  # the settings, then an open stream, as a live client keeps it
        yield svc.TelemetryCommand(settings=publish)
        yield svc.TelemetryCommand(settings=subscribe)
        release.wait(30)

    stream = proxied.stub.Telemetry(commands(), metadata=META, timeout=30)
    try:
        assert next(stream).status.code == pb.OK and next(stream).status.code == pb.OK
        c = proxied.broker.controller
        wait_until(lambda: topic in c.producers.groups, what="the producer channel of its topic")
        assert c.consumers.client_ids(g) == ["test-client"]
        assert c.consumers.find_subscription(g, topic).sub_string == "TagA"
        members = proxied.broker.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, GetConsumerListByGroupRequestHeader(
            consumer_group=g))  # fmt: skip
        assert json.loads(members.body)["consumerIdList"] == ["test-client"]
        r = proxied.stub.NotifyClientTermination(svc.NotifyClientTerminationRequest(), metadata=META)
        assert r.status.code == pb.OK
        wait_until(lambda: topic not in c.producers.groups and not c.consumers.client_ids(g),
                   what="the channels gone with the client")  # fmt: skip
        assert list(stream) == []  # the server ended the stream
    finally:
        release.set()


def test_a_slave_refuses_to_serve_the_endpoint(tmp_path) -> None:
    slave = LiveBroker(tmp_path / "slave", brokerRole="SLAVE", brokerId="1").start()
    try:
        async def start() -> None:
            await GrpcProxy(slave.controller, host="127.0.0.1").start()

        with pytest.raises(ProxyRoleError, match="SLAVE"):
            slave.run(start())
    finally:
        slave.close()


def test_an_acl_broker_refuses_to_serve_the_endpoint_unchecked(tmp_path) -> None:
    from broker.config import build_configs
    from broker.server.controller import BrokerController

    async def start() -> None:
        conf = {**SMALL, "listenPort": "0", "storePathRootDir": str(tmp_path / "s"), "aclEnable": "true",
                "rocketmqHome": str(tmp_path)}  # fmt: skip
        await GrpcProxy(BrokerController(*build_configs(conf)), host="127.0.0.1").start()

    with pytest.raises(ProxyRoleError, match="aclEnable"):
        asyncio.run(start())
