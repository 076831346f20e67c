"""Conformance with a stock client: the PyPI ``rocketmq`` package (RocketMQ's C++ client) against ``mqlake up``.

The C++ client runs its own threads and calls back on them: received messages go into a locked list and the
tests poll it with a deadline. Its rebalance round is 20 s; the broker's NOTIFY_CONSUMER_IDS_CHANGED makes it
rebalance at once, which is what keeps these tests fast. Topics and groups are unique per test, because the
session server is shared.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import threading
from dataclasses import dataclass

import pytest
from rocketmq.client import Message, MessageModel, Producer, PullConsumer, PushConsumer
from rocketmq.exceptions import ProducerSendSyncFailed

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from tests.fixtures_broker import remoting_call as broker_call
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_ids)}"


@dataclass(frozen=True)
class Got:
    topic: str
    body: bytes
    tags: bytes
    keys: bytes
    prop: bytes | None
    queue_id: int
    queue_offset: int


class Collector:
    """A push-consumer callback that records every message it is given (called on the client's threads)."""

    def __init__(self, prop: str = "color") -> None:
        self.prop = prop
        self.items: list[Got] = []
        self._lock = threading.Lock()

    def __call__(self, msg) -> None:
        prop = msg.get_property(self.prop)
        got = Got(msg.topic, msg.body, msg.tags, msg.keys, prop, msg.queue_id, msg.queue_offset)
        with self._lock:
            self.items.append(got)

    def snapshot(self) -> list[Got]:
        with self._lock:
            return list(self.items)

    def bodies(self) -> set[bytes]:
        return {g.body for g in self.snapshot()}

    def wait_bodies(self, expected: set[bytes], timeout: float = 30.0, what: str = "") -> None:
        wait_until(lambda: expected <= self.bodies(), timeout,
                   what=what or f"{len(expected - self.bodies())} of {len(expected)} messages")  # fmt: skip


def message(topic: str, body: str, tags: str = "TagA", keys: str | None = None, **props: str) -> Message:
    m = Message(topic)
    m.set_body(body)
    m.set_tags(tags)
    if keys:
        m.set_keys(keys)
    for k, v in props.items():
        m.set_property(k, v)
    return m


def producer(server, group: str | None = None, **kwargs) -> Producer:
    p = Producer(group or unique("PG"), **kwargs)
    p.set_namesrv_addr(server.namesrv_addr)
    p.start()
    return p


def push_consumer(
    server, group: str, topic: str, callback, expression: str = "*", *, orderly: bool = False,
    model: MessageModel = MessageModel.CLUSTERING, instance: str | None = None,
) -> PushConsumer:  # fmt: skip
    wait_routed(server, topic)  # every test's topic exists (a send created it) before its consumers start
    c = PushConsumer(group, orderly=orderly, message_model=model)
    c.set_namesrv_addr(server.namesrv_addr)
    if instance:
        c.set_instance_name(instance)
    c.subscribe(topic, callback, expression)
    c.start()
    return c


def committed(server, group: str, topic: str, queue_id: int) -> int:
    q = h.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                           set_zero_if_not_found=False)  # fmt: skip
    r = broker_call(server.broker_addr, RequestCode.QUERY_CONSUMER_OFFSET, q)
    return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1


def max_offset(server, topic: str, queue_id: int) -> int:
    hdr = h.GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
    r = broker_call(server.broker_addr, RequestCode.GET_MAX_OFFSET, hdr)
    return int(r.ext_fields["offset"])


def wait_routed(server, topic: str) -> None:
    """A topic auto-created by a send reaches the NameServer with the broker's next registration (as in RocketMQ);
    a consumer started before that finds no route and stays idle until its next 30 s round."""

    def routed() -> bool:
        hdr = h.GetRouteInfoRequestHeader(topic=topic)
        return broker_call(server.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, hdr).code == ResponseCode.SUCCESS

    wait_until(routed, 20, what=f"the NameServer to route {topic}")


def all_committed(server, group: str, topic: str, queues: int = 4) -> bool:
    return all(committed(server, group, topic, q) == max_offset(server, topic, q) for q in range(queues))


def consumer_ids(server, group: str) -> list[str]:
    r = broker_call(server.broker_addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                    h.GetConsumerListByGroupRequestHeader(consumer_group=group))  # fmt: skip
    return json.loads(r.body)["consumerIdList"] if r.code == ResponseCode.SUCCESS else []


# =====================================================================================================
# produce and consume
# =====================================================================================================


def test_send_sync_and_push_consume_with_keys_tags_and_properties(mqlake_server) -> None:
    topic, group = unique("SyncT"), unique("CG")
    p = producer(mqlake_server)
    sent = {}
    try:
        for i in range(12):
            r = p.send_sync(message(topic, f"sync-{i}", tags=f"Tag{i % 3}", keys=f"key-{i}", color=f"c{i}"))
            assert r.status == 0 and r.msg_id
            sent[f"sync-{i}".encode()] = (f"Tag{i % 3}".encode(), f"key-{i}".encode(), f"c{i}".encode())
    finally:
        p.shutdown()
    got = Collector()
    c = push_consumer(mqlake_server, group, topic, got)
    try:
        got.wait_bodies(set(sent))
    finally:
        c.shutdown()
    by_body = {g.body: g for g in got.snapshot()}
    for body, (tags, keys, color) in sent.items():
        g = by_body[body]
        assert (g.topic, g.tags, g.keys, g.prop) == (topic, tags, keys, color)
    # Queue offsets per queue are 0..n-1 with no gaps.
    per_queue: dict[int, list[int]] = {}
    for g in by_body.values():
        per_queue.setdefault(g.queue_id, []).append(g.queue_offset)
    assert len(per_queue) == 4  # TBW102 template: 4 queues for the C++ client
    for offsets in per_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_tag_filtered_push_consumer_and_long_poll(mqlake_server) -> None:
    topic, group = unique("TagT"), unique("CG")
    p = producer(mqlake_server)
    got = Collector()
    c = None
    try:
        p.send_sync(message(topic, "create", tags="Other"))  # the topic exists before the consumer routes it
        c = push_consumer(mqlake_server, group, topic, got, "Wanted || Also")
        wait_until(lambda: consumer_ids(mqlake_server, group), 20, what="the consumer's heartbeat")
        for i in range(3):
            p.send_sync(message(topic, f"warm-{i}", tags="Wanted"))
        got.wait_bodies({b"warm-0", b"warm-1", b"warm-2"})
        # Now every queue has a parked pull, suspended for 15 s by the client: the new message is delivered
        # before that runs out, so the broker answered the parked pull (test_broker_protocol shows that a
        # message's arrival alone wakes one).
        p.send_sync(message(topic, "prompt", tags="Also"))
        got.wait_bodies({b"prompt"}, timeout=10)
        p.send_sync(message(topic, "filtered-out", tags="Nope"))
        p.send_sync(message(topic, "last", tags="Wanted"))
        got.wait_bodies({b"last"})
        assert b"filtered-out" not in got.bodies() and b"create" not in got.bodies()
    finally:
        if c is not None:
            c.shutdown()
        p.shutdown()


def test_send_oneway_and_send_batch(mqlake_server) -> None:
    topic, group = unique("BatchT"), unique("CG")
    p = producer(mqlake_server)
    got = Collector()
    c = None
    try:
        p.send_sync(message(topic, "first"))
        batch = [message(topic, f"batch-{i}", tags="B", keys=f"bk-{i}", color=f"b{i}") for i in range(5)]
        r = p.send_batch(batch)
        assert r.status == 0
        for i in range(5):
            p.send_oneway(message(topic, f"oneway-{i}", tags="O", keys=f"ok-{i}", color="one"))
        c = push_consumer(mqlake_server, group, topic, got)
        expected = {b"first"} | {f"batch-{i}".encode() for i in range(5)} | {f"oneway-{i}".encode() for i in range(5)}
        got.wait_bodies(expected)
    finally:
        if c is not None:
            c.shutdown()
        p.shutdown()
    by_body = {g.body: g for g in got.snapshot()}
    for i in range(5):
        g = by_body[f"batch-{i}".encode()]
        assert (g.tags, g.keys, g.prop) == (b"B", f"bk-{i}".encode(), f"b{i}".encode())
    batch_items = sorted((by_body[f"batch-{i}".encode()] for i in range(5)), key=lambda g: g.queue_offset)
    assert len({g.queue_id for g in batch_items}) == 1  # a batch lands in one queue, consecutively
    assert [g.body for g in batch_items] == [f"batch-{i}".encode() for i in range(5)]
    assert by_body[b"oneway-3"].keys == b"ok-3" and by_body[b"oneway-3"].prop == b"one"


def test_send_orderly_and_orderly_push_consumer(mqlake_server) -> None:
    topic, group = unique("OrderT"), unique("CG")
    p = producer(mqlake_server)
    got = Collector()
    c = None
    try:
        for order_id in range(3):
            for step in range(6):
                msg = message(topic, f"o{order_id}-s{step}", tags="Ord", keys=f"order-{order_id}", color=str(step))
                r = p.send_orderly(msg, order_id)
                assert r.status == 0
        c = push_consumer(mqlake_server, group, topic, got, orderly=True)
        got.wait_bodies({f"o{o}-s{s}".encode() for o in range(3) for s in range(6)})
    finally:
        if c is not None:
            c.shutdown()
        p.shutdown()
    items = got.snapshot()
    for order_id in range(3):
        mine = [g for g in items if g.keys == f"order-{order_id}".encode()]
        assert len({g.queue_id for g in mine}) == 1  # the selector kept an order in one queue
        assert [g.body for g in mine][:6] == [f"o{order_id}-s{s}".encode() for s in range(6)]  # in order
        assert [g.prop for g in mine][:6] == [str(s).encode() for s in range(6)] and mine[0].tags == b"Ord"


def test_pull_consumer(mqlake_server) -> None:
    topic = unique("PullT")
    p = producer(mqlake_server)
    try:
        sent = {f"pull-{i}".encode(): "Q" if i % 3 == 0 else "P" for i in range(12)}
        for body, tag in sorted(sent.items()):
            p.send_sync(message(topic, body.decode(), tags=tag, keys=body.decode()))
    finally:
        p.shutdown()

    def pull_until(expression: str, want: set[bytes]) -> dict[bytes, tuple[bytes, bytes]]:
        # The Python binding keeps the offsets it reached in a class-wide table keyed topic@queue, shared by
        # every PullConsumer: each consumer here gets a table of its own, so it reads every queue from 0.
        c = PullConsumer(unique("PullG"))
        c.offset_table = {}
        c.set_namesrv_addr(mqlake_server.namesrv_addr)
        c.start()
        got: dict[bytes, tuple[bytes, bytes]] = {}
        try:

            def pull_all() -> bool:
                for msg in c.pull(topic, expression):
                    got[msg.body] = (msg.keys, msg.tags)
                return want <= set(got)

            wait_until(pull_all, 30, what=f"the pull consumer to read {len(want)} messages with {expression!r}")
        finally:
            c.shutdown()
        return got

    everything = pull_until("*", set(sent))
    assert everything == {body: (body, tag.encode()) for body, tag in sent.items()}
    # Filtering by tag on the pull path: the matching messages arrive, the others do not.
    tagged = {body for body, tag in sent.items() if tag == "Q"}
    assert set(pull_until("Q", tagged)) == tagged
    assert pull_until("NoSuchTag", set()) == {}


def test_two_consumers_in_one_group_split_the_queues(mqlake_server) -> None:
    topic, group = unique("SplitT"), unique("CG")
    p = producer(mqlake_server)
    a, b = Collector(), Collector()
    ca = cb = None
    try:
        p.send_sync(message(topic, "create"))
        ca = push_consumer(mqlake_server, group, topic, a, instance=unique("A"))
        cb = push_consumer(mqlake_server, group, topic, b, instance=unique("B"))
        wait_until(lambda: len(consumer_ids(mqlake_server, group)) == 2, 20, what="both consumers to register")
        first = {f"warm-{i}".encode() for i in range(16)}
        for body in sorted(first):
            p.send_sync(message(topic, body.decode()))
        wait_until(lambda: first <= a.bodies() | b.bodies(), 30, what="the first round to be consumed")
        mark_a, mark_b = len(a.snapshot()), len(b.snapshot())
        second = {f"split-{i}".encode() for i in range(24)}
        for body in sorted(second):
            p.send_sync(message(topic, body.decode()))
        wait_until(lambda: second <= a.bodies() | b.bodies(), 30, what="the second round to be consumed")
    finally:
        for c in (ca, cb):
            if c is not None:
                c.shutdown()
        p.shutdown()
    qa = {g.queue_id for g in a.snapshot()[mark_a:] if g.body in second}
    qb = {g.queue_id for g in b.snapshot()[mark_b:] if g.body in second}
    assert qa and qb, (qa, qb)
    assert not qa & qb and qa | qb == {0, 1, 2, 3}


def test_broadcasting_consumers_each_get_everything(mqlake_server) -> None:
    topic, group = unique("BcastT"), unique("CG")
    p = producer(mqlake_server)
    a, b = Collector(), Collector()
    ca = cb = None
    try:
        p.send_sync(message(topic, "create"))
        ca = push_consumer(mqlake_server, group, topic, a, model=MessageModel.BROADCASTING, instance=unique("A"))
        cb = push_consumer(mqlake_server, group, topic, b, model=MessageModel.BROADCASTING, instance=unique("B"))
        wait_until(lambda: len(consumer_ids(mqlake_server, group)) == 2, 20, what="both consumers to register")
        sent = {f"all-{i}".encode() for i in range(8)}
        for body in sorted(sent):
            p.send_sync(message(topic, body.decode(), tags="Bc", keys=body.decode(), color="teal"))
        a.wait_bodies(sent, what="the first broadcasting consumer")
        b.wait_bodies(sent, what="the second broadcasting consumer")
    finally:
        for c in (ca, cb):
            if c is not None:
                c.shutdown()
        p.shutdown()
    for got in (a, b):
        for g in got.snapshot():
            if g.body in sent:
                assert (g.tags, g.keys, g.prop) == (b"Bc", g.body, b"teal")


# =====================================================================================================
# bad input from the wire and from the client
# =====================================================================================================


def test_oversized_bodies_and_garbage_leave_the_broker_serving(mqlake_server) -> None:
    topic, group = unique("RobustT"), unique("CG")
    p = producer(mqlake_server, max_message_size=15 * 1024 * 1024, timeout=10_000)
    try:
        assert p.send_sync(message(topic, "acked-before")).status == 0
        big = Message(topic)
        # The client compresses bodies over 4 KiB and passes them as C strings: base64 of random bytes stays
        # about 6 MiB compressed, over the broker's 4 MiB maxMessageSize.
        big.set_body(base64.b64encode(os.urandom(6 * 1024 * 1024)))
        # The broker answers MESSAGE_ILLEGAL (13) naming maxMessageSize; the client retries, then raises its own
        # generic error. What was stored is checked below: nothing large.
        with pytest.raises(ProducerSendSyncFailed):
            p.send_sync(big)
        host, _, port = mqlake_server.broker_addr.rpartition(":")
        for junk in (os.urandom(2048), b"\x7f\xff\xff\xff" + b"\x00" * 16, b"\x00\x00\x00\x40{\"code\":"):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(5)
                assert s.recv(1024) == b""  # closed, nothing answered
        assert p.send_sync(message(topic, "acked-after")).status == 0
    finally:
        p.shutdown()
    got = Collector()
    c = push_consumer(mqlake_server, group, topic, got)
    try:
        got.wait_bodies({b"acked-before", b"acked-after"})
        assert not any(len(b) > 1024 for b in got.bodies())
    finally:
        c.shutdown()


# =====================================================================================================
# restarts
# =====================================================================================================


def test_consumption_resumes_from_committed_offsets_after_a_graceful_restart(mqlake_server_factory) -> None:
    server = mqlake_server_factory(flushDiskType="SYNC_FLUSH")
    topic, group = unique("ResumeT"), unique("CG")
    p = producer(server)
    before = {f"before-{i}".encode() for i in range(12)}
    for body in sorted(before):
        assert p.send_sync(message(topic, body.decode())).status == 0
    got = Collector()
    c = push_consumer(server, group, topic, got)
    got.wait_bodies(before)
    # The client commits every 5 s; wait until the broker holds every queue's offset at its end.
    wait_until(lambda: all_committed(server, group, topic), 30, what="the consumer's offsets to be committed")
    c.shutdown()
    p.shutdown()
    assert server.stop() == 0
    server.start()
    p = producer(server)
    after = {f"after-{i}".encode() for i in range(8)}
    for body in sorted(after):
        assert p.send_sync(message(topic, body.decode())).status == 0
    p.shutdown()
    again = Collector()
    c = push_consumer(server, group, topic, again)
    try:
        again.wait_bodies(after)
        assert not again.bodies() & before, "messages consumed before the restart were delivered again"
    finally:
        c.shutdown()


def test_sigkill_loses_nothing_acknowledged(mqlake_server_factory) -> None:
    server = mqlake_server_factory(flushDiskType="SYNC_FLUSH")
    topic, group = unique("KillT"), unique("CG")
    p = producer(server)
    consumed = {f"consumed-{i}".encode() for i in range(8)}
    for body in sorted(consumed):
        assert p.send_sync(message(topic, body.decode(), keys=body.decode())).status == 0
    got = Collector()
    c = push_consumer(server, group, topic, got)
    got.wait_bodies(consumed)
    wait_until(lambda: all_committed(server, group, topic), 30, what="the consumer's offsets to be committed")
    c.shutdown()
    pending = {f"pending-{i}".encode() for i in range(20)}
    for body in sorted(pending):
        assert p.send_sync(message(topic, body.decode(), keys=body.decode())).status == 0  # acked = on disk
    p.shutdown()
    server.kill()  # no shutdown: SIGKILL right after the last acknowledgement
    server.start()
    # The group resumes: every message sent after its commits arrives (at least once).
    resumed = Collector()
    c = push_consumer(server, group, topic, resumed)
    try:
        resumed.wait_bodies(pending, what="every acknowledged message after the crash")
    finally:
        c.shutdown()
    # And the log holds everything ever acknowledged: a new group reads it all from the start.
    everything = Collector()
    c = push_consumer(server, unique("Fresh"), topic, everything)
    try:
        everything.wait_bodies(consumed | pending)
    finally:
        c.shutdown()
