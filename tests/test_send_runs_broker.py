"""The send fast paths on a live broker, on both codec twins: a plain SEND_MESSAGE_V2 and a SEND_BATCH_MESSAGE are
answered with a ready frame (no RemotingCommand, no task) and store what the general path stores; bad input still
gets the general path's RocketMQ response code and stores nothing."""

from __future__ import annotations

import time

import pytest

from broker.remoting import batch_body
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server.send import SendProcessor
from store.format import msgid, properties
from tests.live_broker import records

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("twin")]


class _Peer:
    remote_addr = "10.1.2.3:4567"
    remote_host = ("10.1.2.3", 4567)


def _header(topic: str, queue_id: int, batch: bool = False, **props: str) -> h.SendMessageRequestHeaderV2:
    return h.SendMessageRequestHeaderV2(
        a="pg", b=topic, c="TBW102", d=4, e=queue_id, f=0, g=int(time.time() * 1000), h=0,
        i=properties.encode_properties(props).decode(), j=0, k=False, m=batch, n="broker-a",
    )  # fmt: skip


def _answer(resp: object) -> RemotingCommand:
    assert isinstance(resp, bytes), f"the fast path answers with a ready frame, not {type(resp).__name__}"
    return RemotingCommand.decode(resp[4:])


def test_plain_sends_and_batches_are_answered_with_a_frame_and_stored(fresh_broker):
    b = fresh_broker()
    assert b.send("Runs", b"creates the topic", queue_id=1).code == ResponseCode.SUCCESS  # general path: new topic
    proc = SendProcessor(b.controller)
    gen = msgid.UniqKeyGenerator()
    uniq = gen.next()
    single = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, _header("Runs", 1, UNIQ_KEY=uniq, TAGS="T"), b"one")
    single.opaque = 77
    items = [
        batch_body.BatchItem(i, b"b%d" % i, properties.encode_properties({"UNIQ_KEY": gen.next(), "KEYS": f"k{i}"}))
        for i in range(3)
    ]
    batch = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, _header("Runs", 1, batch=True),
                                    batch_body.encode_batch_body(items))  # fmt: skip

    async def on_loop() -> tuple[object, object]:  # as the remoting layer calls the handler
        return proc.send_inline(single, _Peer()), proc.send_inline(batch, _Peer())

    one, many = (_answer(r) for r in b.run(on_loop()))
    assert (one.code, one.opaque, one.ext_fields["queueOffset"], one.ext_fields["transactionId"]) == (0, 77, "1", uniq)
    assert many.code == 0 and many.ext_fields["queueOffset"] == "2" and "transactionId" not in many.ext_fields
    b.dispatched()
    got = records(b.pull("Runs", 1, 1).body)
    ids = [one.ext_fields["msgId"], *many.ext_fields["msgId"].split(",")]
    assert [r.offset_msg_id for r in got] == ids
    assert [(r.body, r.queue_offset, r.flag, r.born_host) for r in got] == [
        (b"one", 1, 0, _Peer.remote_host), (b"b0", 2, 0, _Peer.remote_host), (b"b1", 3, 1, _Peer.remote_host),
        (b"b2", 4, 2, _Peer.remote_host),
    ]  # fmt: skip
    assert [r.property_map.get("CLUSTER") for r in got] == [b.controller.config.broker_cluster_name] * 4
    assert [r.keys for r in got] == [None, "k0", "k1", "k2"] and got[0].tags == "T"


def test_bad_sends_get_the_general_paths_codes_and_store_nothing(fresh_broker):
    b = fresh_broker()
    assert b.send("Bad", b"creates the topic").code == ResponseCode.SUCCESS
    stored = b.controller.store.commitlog.max_offset
    limit = b.controller.store_config.max_message_size
    good = batch_body.encode_batch_body([batch_body.BatchItem(0, b"x", b"")])
    big = batch_body.encode_batch_body([batch_body.BatchItem(0, b"x", b""), batch_body.BatchItem(0, b"y" * (limit + 1),
                                                                                                   b"")])  # fmt: skip
    illegal = ResponseCode.MESSAGE_ILLEGAL
    cases = [
        (RequestCode.SEND_BATCH_MESSAGE, "Bad", good[:-2], illegal, "bad batch body: "),
        (RequestCode.SEND_BATCH_MESSAGE, "Bad", b"", illegal, "empty batch"),
        (RequestCode.SEND_BATCH_MESSAGE, "Bad", big, illegal, f"exceeds maxMessageSize {limit}"),
        (RequestCode.SEND_MESSAGE_V2, "Bad", b"z" * (limit + 1), illegal, f"exceeds maxMessageSize {limit}"),
        # a topic name is refused as msgCheck refuses it: SYSTEM_ERROR
        (RequestCode.SEND_MESSAGE_V2, "Bad topic!", b"z", ResponseCode.SYSTEM_ERROR, "illegal characters"),
    ]
    for code, topic, body, want, remark in cases:
        r = b.call(code, _header(topic, 0, batch=code == RequestCode.SEND_BATCH_MESSAGE), body)
        assert (r.code, remark in (r.remark or "")) == (want, True), (topic, body[:20], r)
    assert b.controller.store.commitlog.max_offset == stored


def test_a_one_message_batch_asking_for_a_delay_is_parked_as_before(fresh_broker):
    """The general path's put treats a batch of one as a single send, whose DELAY parks it; the fast path hands
    such a batch over rather than store it at once."""
    b = fresh_broker()
    assert b.send("Later", b"creates the topic", queue_id=0).code == ResponseCode.SUCCESS
    item = batch_body.BatchItem(0, b"later", properties.encode_properties({"DELAY": "3"}))
    r = b.call(RequestCode.SEND_BATCH_MESSAGE, _header("Later", 0, batch=True), batch_body.encode_batch_body([item]))
    assert r.code == ResponseCode.SUCCESS, r.remark
    b.dispatched()
    assert b.controller.store.get_max_offset_in_queue("Later", 0) == 1  # only the first send is in the queue
    assert b.controller.store.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 2) == 1  # level 3 waits in queue 2
