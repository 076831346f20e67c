"""broker/client against a real ``mqlake up`` on loopback: producer (send, pipelined sends, batch, oneway),
pull consumer, push consumer (clustering split after a NOTIFY-triggered rebalance, broadcasting, retry), and
resuming from committed offsets after a graceful restart and after SIGKILL with SYNC_FLUSH."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, defaultdict

import pytest

from broker.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeResult,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    MQClientError,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
)
from broker.remoting.loop import run
from store.config_files import load_consumer_offsets
from tests.aio import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Short client intervals keep the tests fast; rebalances in these tests are driven by NOTIFY anyway.
FAST = {"persist_interval": 0.5, "rebalance_interval": 5.0, "retry_backoff": 0.2}


# consumers rebalance and brokers dispatch on their own schedules: longer deadlines than tests.aio's default
until = functools.partial(poll, timeout=20.0, interval=0.02)


async def make_topic(server, topic: str, queues: int = 4) -> None:
    async with Admin(server.namesrv_addr) as admin:
        await admin.create_topic(topic, broker_addr=server.broker_addr, read_queue_nums=queues, write_queue_nums=queues)

        async def routed() -> bool:
            route = await admin.topic_route(topic)
            return route is not None and len(route.subscribe_queues(topic)) == queues

        await until(routed, what=f"route of {topic} with {queues} queues")


async def pull_all(
    consumer: PullConsumer, topic: str, expect: int, expression: str = "*"
) -> dict[MessageQueue, list[MessageExt]]:
    """Every message of every queue, once the broker has dispatched ``expect`` of them (pulls see a message
    only after the broker's reput has put it in the ConsumeQueue, a moment after the send was acknowledged)."""
    queues = await consumer.fetch_queues(topic)

    async def dispatched() -> bool:
        return sum([await consumer.max_offset(mq) for mq in queues]) >= expect

    await until(dispatched, what=f"{expect} messages of {topic} dispatched")
    out = {}
    for mq in queues:
        msgs, offset = [], 0
        while True:
            r = await consumer.pull(mq, offset, 32, expression)
            if r.status is PullStatus.NO_NEW_MSG:
                break
            assert r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), r.status
            assert r.next_begin_offset > offset
            msgs.extend(r.messages)
            offset = r.next_begin_offset
        out[mq] = msgs
    return out


def collector(into: list, fail_first: set | None = None):
    async def handler(msg: MessageExt) -> ConsumeResult:
        if fail_first is not None and msg.keys in fail_first:
            fail_first.discard(msg.keys)
            return ConsumeResult.RETRY
        into.append(msg)
        return ConsumeResult.SUCCESS

    return handler


def test_send_and_pull_return_exactly_what_was_sent(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic = "ClientSendPull"

    async def go():
        await make_topic(mqlake_server, topic)
        async with Producer("pg_send", ns) as p:
            sent = [
                (i, await p.send(Message(topic, f"body-{i}", tags=f"Tag{i % 3}", keys=[f"k{i}", "common"],
                                         properties={"idx": str(i), "color": "red"})))
                for i in range(24)
            ]  # fmt: skip
            # 40 more in flight at once on the one connection (pipelined)
            results = await asyncio.gather(
                *(p.send(Message(topic, f"body-{i}", tags=f"Tag{i % 3}", keys=f"k{i}", properties={"idx": str(i)}))
                  for i in range(24, 64))
            )  # fmt: skip
            sent += list(zip(range(24, 64), results, strict=True))
        assert all(r.status is SendStatus.SEND_OK for _, r in sent)
        assert len({r.msg_id for _, r in sent}) == 64 and all(len(r.msg_id) == 32 for _, r in sent)
        assert {r.queue.queue_id for _, r in sent} == {0, 1, 2, 3}

        async with PullConsumer("cg_pull", ns) as c:
            got = await pull_all(c, topic, 64)
            tag1 = await pull_all(c, topic, 64, "Tag1")
        by_id = {m.msg_id: m for msgs in got.values() for m in msgs}
        assert len(by_id) == 64
        for i, r in sent:
            m = by_id[r.msg_id]
            assert m.body == f"body-{i}".encode() and m.tags == f"Tag{i % 3}"
            assert m.key_list == ([f"k{i}", "common"] if i < 24 else [f"k{i}"])
            assert m.user_properties == ({"idx": str(i), "color": "red"} if i < 24 else {"idx": str(i)})
            assert (m.queue_id, m.queue_offset, m.offset_msg_id) == (r.queue.queue_id, r.queue_offset, r.offset_msg_id)
        for mq, msgs in got.items():
            assert [m.queue_offset for m in msgs] == list(range(len(msgs))), mq
            sequential = [int(m.body[5:]) for m in msgs if int(m.body[5:]) < 24]
            assert sequential == sorted(sequential), f"{mq}: sequential sends out of order"
        mq0 = MessageQueue(topic, "broker-a", 0)
        async with PullConsumer("cg_pull", ns) as c:
            assert await c.min_offset(mq0) == 0 and await c.max_offset(mq0) == len(got[mq0])
            assert await c.search_offset(mq0, 0) == 0
        tag1_ids = {m.msg_id for msgs in tag1.values() for m in msgs}
        assert tag1_ids == {r.msg_id for i, r in sent if i % 3 == 1}

    run(go())


def test_batch_and_oneway(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic = "ClientBatch"

    async def go():
        await make_topic(mqlake_server, topic)
        mq = MessageQueue(topic, "broker-a", 2)
        async with Producer("pg_batch", ns) as p:
            batch = [Message(topic, f"b{i}", tags="B", keys=f"bk{i}", properties={"n": str(i)}) for i in range(32)]
            r = await p.send_batch(batch, queue=mq)
            q3 = MessageQueue(topic, "broker-a", 3)
            for i in range(10):
                await p.send_oneway(Message(topic, f"o{i}", tags="O", keys=f"ok{i}"), queue=q3)
            with pytest.raises(MQClientError, match="same topic"):
                await p.send_batch([Message(topic, b"x"), Message("Other", b"y")])
        assert r.status is SendStatus.SEND_OK and r.queue == mq
        ids, offset_ids = r.msg_id.split(","), r.offset_msg_id.split(",")
        assert len(set(ids)) == 32 and len(offset_ids) == 32

        async with PullConsumer("cg_batch", ns) as c:
            got = await pull_all(c, topic, 42)
        msgs = got[mq]
        assert [m.queue_offset for m in msgs] == list(range(r.queue_offset, r.queue_offset + 32))
        assert [m.body for m in msgs] == [f"b{i}".encode() for i in range(32)]
        assert [m.msg_id for m in msgs] == ids and [m.offset_msg_id for m in msgs] == offset_ids
        assert all(m.keys == f"bk{i}" and m.user_properties == {"n": str(i)} for i, m in enumerate(msgs))
        assert [(m.body, m.tags, m.keys) for m in got[MessageQueue(topic, "broker-a", 3)]] == [
            (f"o{i}".encode(), "O", f"ok{i}") for i in range(10)
        ]

    run(go())


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(mqlake_server):
    ns = mqlake_server.namesrv_addr

    async def go():
        async with Producer("pg_bad", ns) as p:
            with pytest.raises(MQClientError, match="invalid topic"):
                await p.send(Message("bad topic!", b"x"))
            with pytest.raises(MQClientError, match="exceeds"):
                await p.send(Message("ClientBad", b"x" * (4 * 1024 * 1024 + 1)))
            with pytest.raises(MQClientError, match="empty"):
                await p.send(Message("ClientBad", b""))
            # A topic nobody created goes through TBW102 (autoCreateTopicEnable) and gets stored.
            r = await p.send(Message("ClientAutoCreated", b"auto", keys="a1", born_timestamp=1_500_000_000_000))
            assert r.status is SendStatus.SEND_OK
        async with PullConsumer("cg_bad", ns) as c:
            mq = r.queue

            async def dispatched() -> bool:
                # the broker registers an auto-created topic with the NameServer after the send: until then
                # the consumer has no route for it (a RocketMQ client retries the same way)
                try:
                    return await c.max_offset(mq) == r.queue_offset + 1
                except MQClientError:
                    return False

            await until(dispatched, what="the auto-created topic's route and its message dispatched")
            far = await c.pull(mq, 1000)
            assert far.status is PullStatus.OFFSET_ILLEGAL and far.next_begin_offset == r.queue_offset + 1
            [m] = (await c.pull(mq, r.queue_offset)).messages
            assert m.body == b"auto" and m.keys == "a1" and m.born_timestamp == 1_500_000_000_000
            with pytest.raises(MQClientError, match="no route"):
                await c.fetch_queues("NoSuchTopicAnywhere")

    run(go())


def test_push_clustering_splits_queues_after_notify_and_consumes_everything_once(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic, group = "ClientPushCluster", "cg_push_cluster"

    async def go():
        await make_topic(mqlake_server, topic)
        got_a, got_b = [], []
        # no periodic rebalance within the test: only the broker's NOTIFY can make a give up queues
        slow = {**FAST, "rebalance_interval": 60.0}
        a = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **slow)
        a.subscribe(topic, "*", collector(got_a))
        b = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **slow)
        b.subscribe(topic, "*", collector(got_b))

        def own(c):
            return {mq for mq in c.assigned_queues if mq.topic == topic}

        await a.start()
        try:
            await until(lambda: len(own(a)) == 4, what="a alone owns all 4 queues")
            await b.start()
            # b's heartbeat makes the broker NOTIFY a, which rebalances at once
            await until(lambda: len(own(a)) == 2 and len(own(b)) == 2, timeout=10.0, what="a NOTIFY-driven split")
            assert own(a).isdisjoint(own(b))
            async with Producer("pg_push_cluster", ns) as p:
                sent = [await p.send(Message(topic, f"m{i}", keys=f"k{i}")) for i in range(40)]
            await until(lambda: len(got_a) + len(got_b) >= 40, what="40 messages consumed")
            ids = [m.msg_id for m in got_a + got_b]
            assert Counter(ids) == Counter(r.msg_id for r in sent)  # everything, nothing twice
            assert got_a and got_b
            assert {m.queue_id for m in got_a} <= {mq.queue_id for mq in own(a)}
            await b.shutdown()  # UNREGISTER_CLIENT: the broker notifies a, which takes every queue back
            await until(lambda: len(own(a)) == 4, timeout=10.0, what="a to own all 4 queues again")
        finally:
            await b.shutdown()
            await a.shutdown()

    run(go())


def test_push_broadcasting_gives_everything_to_each_consumer(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic, group = "ClientPushBroadcast", "cg_push_broadcast"

    async def go():
        await make_topic(mqlake_server, topic)
        got = defaultdict(list)
        consumers = []
        x = PushConsumer(group, ns, MessageModel.BROADCASTING, **FAST)
        x.subscribe(topic, "TagA", collector(got["x"]))
        y = PushConsumer(group, ns, MessageModel.BROADCASTING, **FAST)
        y.subscribe(topic, "TagA", lambda m: got["y"].append(m))  # a plain function: runs in a worker thread
        for c in (x, y):
            consumers.append(await c.start())
        try:
            await until(lambda: all(len(c.assigned_queues) == 4 for c in consumers), what="each consumer on 4 queues")
            async with Producer("pg_push_broadcast", ns) as p:
                for i in range(20):
                    await p.send(Message(topic, f"m{i}", tags="TagA" if i % 2 == 0 else "TagB"))
            await until(lambda: len(got["x"]) >= 10 and len(got["y"]) >= 10, what="both consumers got 10")
            for name in ("x", "y"):
                assert sorted(m.body for m in got[name]) == sorted(f"m{i}".encode() for i in range(0, 20, 2))
        finally:
            for c in consumers:
                await c.shutdown()

    run(go())


def test_push_retry_redelivers_a_failed_message(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic, group = "ClientPushRetry", "cg_push_retry"

    async def go():
        await make_topic(mqlake_server, topic, queues=1)
        got: list[MessageExt] = []
        c = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **FAST)
        c.subscribe(topic, "*", collector(got, fail_first={"k1"}))
        await c.start()
        try:
            async with Producer("pg_push_retry", ns) as p:
                for i in range(3):
                    await p.send(Message(topic, f"m{i}", keys=f"k{i}"))
            await until(lambda: len(got) >= 3, what="3 messages, one after a retry")
            assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
            [retried] = [m for m in got if m.keys == "k1"]
            assert retried.topic == topic and retried.reconsume_times == 1
            # it came back through the broker (CONSUMER_SEND_MSG_BACK -> %RETRY%<group>), not a local retry
            assert retried.properties.get("RETRY_TOPIC") == topic
        finally:
            await c.shutdown()

    run(go())


async def _consume(ns: str, topic: str, group: str, expect: int) -> list[MessageExt]:
    """Start a push consumer, wait for ``expect`` messages, shut it down (committing), return what it got."""
    got: list[MessageExt] = []
    c = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **FAST)
    c.subscribe(topic, "*", collector(got))
    await c.start()
    try:
        await until(lambda: len(got) >= expect, what=f"{expect} messages for {group}")
    finally:
        await c.shutdown()
    return got


async def _send(ns: str, topic: str, bodies: list[str]) -> None:
    async with Producer("pg_restart", ns) as p:
        for b in bodies:
            assert (await p.send(Message(topic, b))).status is SendStatus.SEND_OK


def test_consumer_resumes_from_committed_offsets_after_graceful_restart(mqlake_server_factory):
    server = mqlake_server_factory()
    ns, topic, group = server.namesrv_addr, "ClientRestart", "cg_restart"
    first, second = [f"a{i}" for i in range(10)], [f"b{i}" for i in range(10)]

    async def before():
        await make_topic(server, topic, queues=2)
        await _send(ns, topic, first)
        got = await _consume(ns, topic, group, 10)
        assert sorted(m.body.decode() for m in got) == sorted(first)

    run(before())
    server.restart(graceful=True)

    async def after():
        await _send(ns, topic, second)
        got = await _consume(ns, topic, group, 10)
        # Per queue, pulls go in offset order: had it restarted from 0, the first batch would have come first.
        assert sorted(m.body.decode() for m in got) == sorted(second)

    run(after())


def test_consumer_resumes_after_sigkill_with_sync_flush_and_nothing_acked_is_lost(mqlake_server_factory):
    server = mqlake_server_factory(flushDiskType="SYNC_FLUSH")
    ns, topic, group = server.namesrv_addr, "ClientKill", "cg_kill"
    first, second = [f"a{i}" for i in range(10)], [f"b{i}" for i in range(10)]

    async def before():
        await make_topic(server, topic, queues=2)
        await _send(ns, topic, first)
        got = await _consume(ns, topic, group, 10)
        assert sorted(m.body.decode() for m in got) == sorted(first)
        await _send(ns, topic, second)  # acknowledged after fsync, never consumed before the kill

    run(before())

    def persisted() -> bool:
        offsets = load_consumer_offsets(server.store_dir / "config")
        return sum(offsets.get(f"{topic}@{group}", {}).values()) == 10

    run(until(persisted, what="the broker to persist the group's offsets"))
    server.restart(graceful=False)  # SIGKILL, then start on the same store

    async def after():
        got = await _consume(ns, topic, group, 10)
        assert sorted(m.body.decode() for m in got) == sorted(second)
        async with PullConsumer("cg_kill_audit", ns) as c:
            everything = await pull_all(c, topic, 20)
        assert sorted(m.body.decode() for msgs in everything.values() for m in msgs) == sorted(first + second)

    run(after())
