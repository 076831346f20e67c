"""The gRPC endpoint over real gRPC on loopback with mqlake's generated stubs (``broker.proxy.v2``) against an
in-process broker: bad input (each refusal the v2 status code RocketMQ's proxy answers, with a message naming what
was wrong, nothing stored or acked, the broker serving on), dead-lettering, filters, settings sync, a receive
closed mid-wait or parked when the proxy stops."""

from __future__ import annotations

import hashlib
import hmac
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


def test_one_ack_of_a_batch_acks_each_handle_once_and_refuses_a_repeated_entry(proxied) -> None:
    topic, g = proxied.topic(queues=2), group(proxied)
    for i in range(5):
        assert proxied.send(topic, f"m{i}".encode()).status.code == pb.OK
    wait_until(lambda: sum(proxied.store.get_max_offset_in_queue(topic, q) for q in (0, 1)) == 5,
               what="the five messages in their queues")  # fmt: skip
    status, msgs = proxied.receive(topic, g, wait_s=5)
    assert status.code == pb.OK and len(msgs) == 5
    handles = [m.system_properties.receipt_handle for m in msgs]
    revive = proxied.proxy.pop.revive_topic
    wait_until(lambda: proxied.store.get_max_offset_in_queue(revive, 0) == 5, what="the five checkpoints")
    entries = [svc.AckMessageEntry(message_id="m", receipt_handle=h) for h in [*handles, handles[2]]]
    req = svc.AckMessageRequest(group=pb.Resource(name=g), topic=pb.Resource(name=topic), entries=entries)
    r = proxied.stub.AckMessage(req, metadata=META, timeout=10)
    assert r.status.code == pb.MULTIPLE_RESULTS
    assert [e.status.code for e in r.entries] == [pb.OK] * 5 + [pb.INVALID_RECEIPT_HANDLE]
    assert "twice in one ack" in r.entries[5].status.message
    # each of the five closed by one ack record: none is left to be revived
    assert not proxied.proxy.pop.inflight
    wait_until(lambda: proxied.store.get_max_offset_in_queue(revive, 0) == 10, what="the five ack records")


def test_sends_in_sync_flush_are_answered_once_the_group_commit_covers_them(tmp_path) -> None:
    """SYNC_FLUSH: the send path answers a gRPC send (no remoting connection to hold the reply for) with a future
    that the group commit completes; plain and transactional sends alike."""
    conf = {"grpcServerPort": "0", "flushDiskType": "SYNC_FLUSH"}
    p = Proxied(LiveBroker(tmp_path / "store", **conf).start())
    try:
        topic = p.topic()
        sent = [p.send(topic, f"durable {i}".encode()) for i in range(3)]
        assert [r.status.code for r in sent] == [pb.OK] * 3
        assert [r.entries[0].offset for r in sent] == [0, 1, 2]
        half = pb.Message(topic=pb.Resource(name=topic), body=b"half")
        half.system_properties.message_id, half.system_properties.message_type = "01TXSYNCFLUSH", pb.TRANSACTION
        r = p.stub.SendMessage(svc.SendMessageRequest(messages=[half]), metadata=META, timeout=10)
        assert r.status.code == pb.OK and r.entries[0].transaction_id
        end = svc.EndTransactionRequest(topic=pb.Resource(name=topic), message_id="01TXSYNCFLUSH",
                                        transaction_id=r.entries[0].transaction_id, resolution=pb.COMMIT)  # fmt: skip
        assert p.stub.EndTransaction(end, metadata=META, timeout=10).status.code == pb.OK
        wait_until(lambda: p.store.get_max_offset_in_queue(topic, 0) == 4, what="the three sends and the commit")
    finally:
        p.close()


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
    r = proxied.stub.SyncLiteSubscription(svc.SyncLiteSubscriptionRequest(), metadata=META)
    assert r.status.code == pb.UNSUPPORTED and "SyncLiteSubscription" in r.status.message



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


def _signed(access_key: str, secret_key: str, date_time: str = "20261129T003000Z") -> tuple[tuple[str, str], ...]:
    """The metadata a 5.x client's credentials provider adds: the hex HmacSHA1 of x-mq-date-time."""
    sig = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    auth = f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={sig}"
    return (*META, ("x-mq-date-time", date_time), ("authorization", auth))


@pytest.fixture
def acl_proxied(tmp_path):
    from tests.test_acl_broker import ACL, write_acl

    write_acl(tmp_path / "home", ACL)
    conf = {"grpcServerPort": "0", "aclEnable": "true", "rocketmqHome": str(tmp_path / "home")}
    p = Proxied(LiveBroker(tmp_path / "store", **conf).start())
    yield p
    p.close()


def test_acl_checks_signatures_and_permissions_of_every_call(acl_proxied) -> None:
    p = acl_proxied
    topic, denied, read_only = p.topic(), "Denied", "ReadOnly"
    for name in (denied, read_only):
        p.on_loop(p.broker.controller.topics.update, TopicConfig(topic_name=name, read_queue_nums=1,
                                                                 write_queue_nums=1))  # fmt: skip
    route = svc.QueryRouteRequest(topic=pb.Resource(name=topic))
    producer = _signed("producer-key", "producer-secret")
    assert p.stub.QueryRoute(route, metadata=producer).status.code == pb.OK
    msg = pb.Message(topic=pb.Resource(name=topic), body=b"signed")
    msg.system_properties.message_id = "01000000000000000000000000AC1"
    msg.system_properties.message_type = pb.NORMAL
    sent = p.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=producer)
    assert sent.status.code == pb.OK
    wait_until(lambda: p.store.get_max_offset_in_queue(topic, 0) == 1, what="the signed send dispatched")

    committed = p.store.max_phy_offset
    refusals = {
        "wrong secret": (_signed("producer-key", "not-the-secret"), pb.UNAUTHORIZED, "Check signature failed"),
        "unknown key": (_signed("stranger-key", "whatever-secret"), pb.UNAUTHORIZED, "No acl config for stranger"),
        "unsigned (a client without credentials)": (_signed("", ""), pb.UNAUTHORIZED, "No accessKey"),
        "no authorization at all": (META, pb.UNAUTHORIZED, "No accessKey"),
    }
    for what, (metadata, code, text) in refusals.items():
        r = p.stub.QueryRoute(route, metadata=metadata)
        assert (r.status.code, text in r.status.message) == (code, True), (what, r.status)
        r = p.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=metadata)
        assert r.status.code == code, (what, r.status)
        assert "producer-secret" not in r.status.message
    bad = (*META, ("authorization", "MQv2-HMAC-SHA1 Credential=producer-key, Signature=not-hex"))
    assert p.stub.QueryRoute(route, metadata=bad).status.code == pb.UNAUTHORIZED
    assert p.store.max_phy_offset == committed  # nothing refused was stored

    # signed, but without the permission: FORBIDDEN naming the resource
    r = p.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=denied)), metadata=producer)
    assert r.status.code == pb.FORBIDDEN and "topic:Denied" in r.status.message
    msg.topic.name = read_only
    r = p.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=producer)
    assert r.status.code == pb.FORBIDDEN and "topic:ReadOnly" in r.status.message
    assert p.store.max_phy_offset == committed
    req = svc.ReceiveMessageRequest(group=pb.Resource(name="NoGroup"), batch_size=1,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))  # fmt: skip
    statuses = [r.status for r in p.stub.ReceiveMessage(req, metadata=producer, timeout=10)]
    assert [s.code for s in statuses] == [pb.FORBIDDEN] and "group:NoGroup" in statuses[0].message
    pull = svc.PullMessageRequest(group=pb.Resource(name="NoGroup"), offset=0, batch_size=1,
                                  message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))  # fmt: skip
    replies = list(p.stub.PullMessage(pull, metadata=producer, timeout=10))
    assert [r.status.code for r in replies] == [pb.FORBIDDEN] and "group:NoGroup" in replies[0].status.message
    # a namespace's names are what the rules name: ns1%Denied is another topic than Denied
    route = svc.QueryRouteRequest(topic=pb.Resource(name=denied, resource_namespace="ns1"))
    assert p.stub.QueryRoute(route, metadata=producer).status.code == pb.TOPIC_NOT_FOUND  # allowed, and absent
    # an admin account holds everything: its receive reaches the RPC, which reads the signed message
    replies = list(p.stub.ReceiveMessage(req, metadata=_signed("admin-key", "admin-secret"), timeout=10))
    assert replies[0].status.code == pb.OK and [r.message.body for r in replies if r.HasField("message")] == [b"signed"]

    # Telemetry: the stream's signature first, then each settings command's topics and group
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=denied)]))
    replies = list(p.stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=META, timeout=10))
    assert [r.status.code for r in replies] == [pb.UNAUTHORIZED]
    replies = list(p.stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=producer, timeout=10))
    assert [r.status.code for r in replies] == [pb.FORBIDDEN] and not replies[0].HasField("settings")
    settings.publishing.topics[0].name = topic
    replies = list(p.stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=producer, timeout=10))
    assert [r.status.code for r in replies] == [pb.OK] and replies[0].settings.publishing.topics[0].name == topic


def test_acl_white_listed_peer_needs_no_signature(tmp_path) -> None:
    from tests.test_acl_broker import ACL, write_acl

    write_acl(tmp_path / "home", {**ACL, "globalWhiteRemoteAddresses": ["127.0.0.1"]})
    p = Proxied(LiveBroker(tmp_path / "store", grpcServerPort="0", aclEnable="true",
                           rocketmqHome=str(tmp_path / "home")).start())  # fmt: skip
    try:
        topic = p.topic()
        assert p.send(topic).status.code == pb.OK  # META: no authorization
    finally:
        p.close()


def _create_typed_topic(p: Proxied, name: str, change: str):
    from broker.remoting import headers as h

    hdr = h.CreateTopicRequestHeader(topic=name, default_topic="TBW102", read_queue_nums=1, write_queue_nums=1,
                                     perm=6, topic_filter_type="SINGLE_TAG", attributes=change)  # fmt: skip
    return p.broker.call(RequestCode.UPDATE_AND_CREATE_TOPIC, hdr)


def test_message_types_are_checked_on_remoting_and_grpc_sends(tmp_path) -> None:
    from broker.remoting.codes import ResponseCode

    p = Proxied(LiveBroker(tmp_path / "store", grpcServerPort="0", enableTopicMessageTypeCheck="true").start())
    try:
        assert _create_typed_topic(p, "Fifo", "+message.type=FIFO").code == ResponseCode.SUCCESS
        assert p.broker.controller.topics.get("Fifo").attributes == {"message.type": "FIFO"}
        assert _create_typed_topic(p, "Fifo", "").code == ResponseCode.SUCCESS  # an update without -a keeps it
        assert p.broker.controller.topics.get("Fifo").attributes == {"message.type": "FIFO"}
        bad = _create_typed_topic(p, "Other", "+message.type=BATCH")
        assert bad.code == ResponseCode.SYSTEM_ERROR and "value is not in set" in bad.remark
        mixed = _create_typed_topic(p, "Other", "+message.type=MIXED")
        assert (mixed.code, mixed.remark) == (ResponseCode.INVALID_PARAMETER, "MIXED message type is not supported.")
        assert p.broker.controller.topics.get("Other") is None
        plain = p.topic()  # no attributes: NORMAL

        # the route names the topic's type; the settings tell the client to validate its sends against it
        route = p.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="Fifo")), metadata=META)
        assert list(route.message_queues[0].accept_message_types) == [pb.FIFO]
        settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Fifo")]))
        reply = next(iter(p.stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=META)))
        assert reply.settings.publishing.validate_message_type

        # gRPC: a normal message to a FIFO topic is refused, a message of its group is taken
        sent = p.send("Fifo")
        assert sent.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert "the expected type is FIFO, but actual type is NORMAL" in sent.entries[0].status.message
        msg = pb.Message(topic=pb.Resource(name="Fifo"), body=b"ordered")
        msg.system_properties.message_id = "01000000000000000000000000F1F0"
        msg.system_properties.message_group = "g1"
        msg.system_properties.message_type = pb.FIFO
        assert p.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META).status.code == pb.OK
        assert p.send(plain).status.code == pb.OK

        # remoting: MESSAGE_ILLEGAL, as RocketMQ 5's proxy answers a remoting client
        refused = p.broker.send("Fifo", b"normal")
        assert refused.code == ResponseCode.MESSAGE_ILLEGAL and "expected type is FIFO" in refused.remark
        assert p.broker.send("Fifo", b"ordered", __SHARDINGKEY="g1").code == ResponseCode.SUCCESS
        delayed = p.broker.send(plain, b"later", v2=False, DELAY="2")
        assert delayed.code == ResponseCode.MESSAGE_ILLEGAL and "actual type is DELAY" in delayed.remark
        assert p.broker.send("NoSuchTopic", b"x").code == ResponseCode.MESSAGE_ILLEGAL  # no topic, no type
        wait_until(lambda: p.store.get_max_offset_in_queue("Fifo", 0) == 2, what="the two ordered sends stored")
    finally:
        p.close()


def test_without_the_check_every_type_goes_to_every_topic(proxied) -> None:
    from broker.remoting.codes import ResponseCode

    assert _create_typed_topic(proxied, "FifoToo", "+message.type=FIFO").code == ResponseCode.SUCCESS
    route = proxied.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="FifoToo")), metadata=META)
    assert set(route.message_queues[0].accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
    assert proxied.send("FifoToo").status.code == pb.OK
    assert proxied.broker.send("FifoToo", b"normal").code == ResponseCode.SUCCESS
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="FifoToo")]))
    reply = next(iter(proxied.stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=META)))
    assert not reply.settings.publishing.validate_message_type


def test_a_pull_consumer_pulls_and_keeps_its_offsets(proxied) -> None:
    from google.protobuf.timestamp_pb2 import Timestamp

    from broker.remoting import headers as h

    p, topic = proxied, proxied.topic()
    g = group(p)
    for i, tag in enumerate(("a", "b", "a")):
        assert p.send(topic, f"m{i}".encode(), tag=tag).status.code == pb.OK
    wait_until(lambda: p.store.get_max_offset_in_queue(topic, 0) == 3, what="three messages dispatched")
    mq = pb.MessageQueue(topic=pb.Resource(name=topic), id=0)

    def query(policy: int, ms: int | None = None) -> int:
        req = svc.QueryOffsetRequest(message_queue=mq, query_offset_policy=policy)
        if ms is not None:
            req.timestamp.CopyFrom(Timestamp(seconds=ms // 1000))
        r = p.stub.QueryOffset(req, metadata=META)
        assert r.status.code == pb.OK, r.status
        return r.offset

    # a time after the last message: SEARCH_OFFSET_BY_TIMESTAMP's answer, the last message's offset
    assert (query(pb.BEGINNING), query(pb.END), query(pb.TIMESTAMP, 0), query(pb.TIMESTAMP, 2**41)) == (0, 3, 0, 2)

    def pull(offset: int, batch: int = 32, expression: str = "*", wait_ms: int = 0, queue: int = 0):
        req = svc.PullMessageRequest(group=pb.Resource(name=g), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=queue), offset=offset, batch_size=batch,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=expression))  # fmt: skip
        req.long_polling_timeout.FromMilliseconds(wait_ms)
        replies = list(p.stub.PullMessage(req, metadata=META, timeout=30))
        assert replies[0].HasField("status"), replies
        bodies = [r.message.body.decode() for r in replies if r.HasField("message")]
        nexts = [r.next_offset for r in replies if r.WhichOneof("content") == "next_offset"]
        return replies[0].status, bodies, nexts[-1] if nexts else None

    status, bodies, nxt = pull(0, batch=2)
    assert (status.code, bodies, nxt) == (pb.OK, ["m0", "m1"], 2)
    assert pull(0, expression="a")[1:] == (["m0", "m2"], 3)  # a tag filter, as a remoting pull's
    status, bodies, nxt = pull(3)
    assert (status.code, bodies, nxt) == (pb.MESSAGE_NOT_FOUND, [], 3)
    status, _, nxt = pull(100)
    assert (status.code, nxt) == (pb.ILLEGAL_OFFSET, 3)  # the nearest offset to go on from
    assert pull(-1)[0].code == pb.ILLEGAL_OFFSET and pull(0, queue=5)[0].code == pb.BAD_REQUEST

    # long polling: a pull at the end waits for the next message (parked as a remoting pull is)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(r=pull(3, wait_ms=20_000)))
    waiter.start()
    wait_until(lambda: p.broker.controller.hold.parked_count == 1, what="the pull parked")
    assert p.send(topic, b"m3").status.code == pb.OK
    waiter.join(30)
    assert got["r"][0].code == pb.OK and got["r"][1:] == (["m3"], 4)

    # offsets: the group's consumer offsets, which remoting consumers of the group share
    get = svc.GetOffsetRequest(group=pb.Resource(name=g), message_queue=mq)
    assert p.stub.GetOffset(get, metadata=META).status.code == pb.OFFSET_NOT_FOUND
    update = svc.UpdateOffsetRequest(group=pb.Resource(name=g), message_queue=mq, offset=2)
    assert p.stub.UpdateOffset(update, metadata=META).status.code == pb.OK
    r = p.stub.GetOffset(get, metadata=META)
    assert (r.status.code, r.offset) == (pb.OK, 2)
    q = p.broker.call(RequestCode.QUERY_CONSUMER_OFFSET, h.QueryConsumerOffsetRequestHeader(
        consumer_group=g, topic=topic, queue_id=0))  # fmt: skip
    assert q.ext_fields["offset"] == "2"
    update.offset = -5
    assert p.stub.UpdateOffset(update, metadata=META).status.code == pb.ILLEGAL_OFFSET
    assert p.stub.GetOffset(svc.GetOffsetRequest(group=pb.Resource(name="NoSuchGroup"), message_queue=mq),
                            metadata=META).status.code == pb.CONSUMER_GROUP_NOT_FOUND  # fmt: skip


def test_system_topics_and_illegal_groups_are_refused(proxied) -> None:
    """A gRPC send to a broker-owned topic is refused as a remoting one is (FORBIDDEN, nothing stored); a group no
    client could create (a NUL, too long, a path) is an illegal group, never auto-created."""
    for topic in ("rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX"):  # topics the broker holds from its start
        before = proxied.store.commitlog.max_offset
        sent = proxied.send(topic, b"smuggled", REAL_TOPIC="../../../../grpc_escape", REAL_QID="0")
        assert sent.entries[0].status.code in (pb.FORBIDDEN, pb.ILLEGAL_MESSAGE_PROPERTY_KEY), (topic, sent)
        assert proxied.store.commitlog.max_offset == before
        sent = proxied.send(topic, b"plain")
        assert sent.entries[0].status.code == pb.FORBIDDEN and "is forbidden" in sent.entries[0].status.message
        assert proxied.store.commitlog.max_offset == before
    topic = proxied.topic()
    proxied.on_loop(setattr, proxied.broker.controller.groups, "auto_create", True)
    for bad in ("bad\x00group", "g" * 300, "../../escape"):
        status, _ = proxied.receive(topic, bad)
        assert status.code == pb.ILLEGAL_CONSUMER_GROUP, (bad[:20], status)
        assert bad not in proxied.broker.controller.groups.table
