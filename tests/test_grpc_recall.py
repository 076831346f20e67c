"""RecallMessage over real gRPC on loopback (mqlake's generated stubs) against an in-process broker: a timer
message's send answers a recall handle, a recall keeps the message from ever being delivered while its neighbour
is, also across a broker restart, and bad recalls get RocketMQ's codes."""

from __future__ import annotations

import base64
import time

import pytest

from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from store.constants import DEFAULT_BROKER_NAME, TIMER_TOPIC
from tests.helpers import read_queue, wait_dispatched, wait_until
from tests.live_broker import LiveBroker
from tests.test_grpc_endpoint import META, Proxied, _ids

pytestmark = pytest.mark.integration

CONF = {"grpcServerPort": "0", "timerPrecisionMs": "100", "recallMessageEnable": "true"}


def _send_timer(p: Proxied, topic: str, body: bytes, deliver_ms: int) -> svc.SendResultEntry:
    msg = pb.Message(topic=pb.Resource(name=topic), body=body)
    msg.system_properties.message_id = f"0100000000000000000000000{next(_ids):09d}"
    msg.system_properties.message_type = pb.DELAY
    msg.system_properties.delivery_timestamp.FromMilliseconds(deliver_ms)
    r = p.stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META, timeout=10)
    assert r.status.code == pb.OK, r.status
    [entry] = r.entries
    return entry


def _recall(p: Proxied, topic: str, handle: str) -> svc.RecallMessageResponse:
    req = svc.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
    return p.stub.RecallMessage(req, metadata=META, timeout=10)


def _delivered(p: Proxied, topic: str) -> list[bytes]:
    """Every message stored in the topic's queue 0 (where the timer delivers a one-queue topic's messages)."""
    store = p.broker.controller.store
    if store.get_max_offset_in_queue(topic, 0) == 0:  # no queue yet: nothing delivered
        return []
    return [rec.body for _, rec in read_queue(store, topic, 0)]


def _settled(p: Proxied) -> bool:
    timers = p.broker.controller.store.timers
    return timers.pending == 0 and timers.offset_behind == 0


@pytest.fixture
def proxied(tmp_path):
    p = Proxied(LiveBroker(tmp_path / "store", **CONF).start())
    yield p
    p.close()


def test_a_recalled_timer_message_is_never_delivered_while_its_neighbour_is(proxied) -> None:
    topic = proxied.topic()
    deliver = int(time.time() * 1000) + 3000
    gone, kept = _send_timer(proxied, topic, b"gone", deliver), _send_timer(proxied, topic, b"kept", deliver)
    # v1 <topic> <broker name> <TIMER_OUT_MS + 1> <message id>, URL-safe base64
    v, t, broker, at, msg_id = base64.urlsafe_b64decode(gone.recall_handle).decode().split(" ")
    assert (v, t, broker, msg_id) == ("v1", topic, DEFAULT_BROKER_NAME, gone.message_id)
    assert deliver - 200 <= int(at) <= deliver + 1
    r = _recall(proxied, topic, gone.recall_handle)
    assert r.status.code == pb.OK and r.message_id == gone.message_id
    wait_until(lambda: _delivered(proxied, topic), 20, what="the kept timer message delivered")
    wait_until(lambda: _settled(proxied), 10, what="the timer settled")
    assert _delivered(proxied, topic) == [b"kept"]
    status, msgs = proxied.receive(topic, "recallG", wait_s=0)
    assert [m.body for m in msgs] == [b"kept"]
    assert kept.recall_handle  # not recalled: it was delivered
    # delivered (its time past): Java's ILLEGAL_OPERATION, BAD_REQUEST through the proxy
    late = _recall(proxied, topic, kept.recall_handle)
    assert late.status.code == pb.BAD_REQUEST and "timestamp invalid" in late.status.message


def test_bad_recalls_answer_rocketmqs_codes_and_store_nothing(proxied) -> None:
    topic, other = proxied.topic(), proxied.topic()
    normal = proxied.send(topic, b"now")
    assert normal.entries[0].recall_handle == ""  # only a parked timer message can be recalled
    timer = _send_timer(proxied, topic, b"later", int(time.time() * 1000) + 60_000)
    for handle in ["", "not base64 !", base64.urlsafe_b64encode(b"v2 a b 1 c").decode(),
                   base64.urlsafe_b64encode(b"v1 too few").decode()]:  # fmt: skip
        r = _recall(proxied, topic, handle)
        assert (r.status.code, r.status.message) == (pb.INTERNAL_SERVER_ERROR, "recall handle is invalid"), handle
    mismatch = _recall(proxied, other, timer.recall_handle)
    assert mismatch.status.code == pb.BAD_REQUEST and "topic not match" in mismatch.status.message
    unknown = _recall(proxied, "NoSuchTopic", timer.recall_handle)
    assert unknown.status.code == pb.TOPIC_NOT_FOUND
    v, t, _broker, at, msg_id = base64.urlsafe_b64decode(timer.recall_handle).decode().split(" ")
    elsewhere = base64.urlsafe_b64encode(f"{v} {t} broker-z {at} {msg_id}".encode()).decode()
    assert _recall(proxied, topic, elsewhere).status.code == pb.BAD_REQUEST
    store = proxied.broker.controller.store
    wait_dispatched(store)
    assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 1  # the timer message only: no mark was written
    assert _recall(proxied, topic, timer.recall_handle).status.code == pb.OK  # and the broker serves on
    wait_until(lambda: store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 2, 10, what="the delete mark")


def test_a_recall_survives_a_broker_restart_before_the_delivery_time(tmp_path) -> None:
    p = Proxied(LiveBroker(tmp_path / "store", **CONF).start())
    deliver = int(time.time() * 1000) + 6000
    try:
        topic = p.topic()
        gone, _kept = _send_timer(p, topic, b"gone", deliver), _send_timer(p, topic, b"kept", deliver)
        assert _recall(p, topic, gone.recall_handle).status.code == pb.OK
        timers = p.broker.controller.store.timers
        wait_until(lambda: timers.pending == 3, 10, what="both timers and the delete mark indexed")
        assert _delivered(p, topic) == []
    finally:
        p.close()
    p = Proxied(LiveBroker(tmp_path / "store", **CONF).start())
    try:
        wait_until(lambda: _delivered(p, topic), 20, what="the kept timer message delivered")
        wait_until(lambda: _settled(p), 10, what="the timer settled")
        assert _delivered(p, topic) == [b"kept"]
    finally:
        p.close()


def test_with_the_type_check_only_a_delay_topic_takes_a_recall(tmp_path) -> None:
    p = Proxied(LiveBroker(tmp_path / "store", **CONF, enableTopicMessageTypeCheck="true").start())
    try:
        normal = p.topic()  # no message.type: NORMAL
        r = _recall(p, normal, "anything")  # refused before the handle is read, as RocketMQ's proxy
        assert r.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert "expected type is NORMAL, but actual type is DELAY" in r.status.message
    finally:
        p.close()


def test_recall_is_forbidden_unless_enabled(tmp_path) -> None:
    p = Proxied(LiveBroker(tmp_path / "store", **{**CONF, "recallMessageEnable": "false"}).start())
    try:
        topic = p.topic()
        timer = _send_timer(p, topic, b"later", int(time.time() * 1000) + 60_000)
        assert timer.recall_handle  # the send still answers its handle, as RocketMQ's
        r = _recall(p, topic, timer.recall_handle)
        assert (r.status.code, r.status.message) == (pb.FORBIDDEN, "recall failed, operation is forbidden")
    finally:
        p.close()
