"""PushConsumer pulls ahead of its handler (as the Java client's PullMessageService does): the next PULL_MESSAGE
is on its way while a message is in the handler, and a queue taken away meanwhile commits only what the handler
finished, so the messages pulled ahead come again to the next consumer of the group."""

from __future__ import annotations

import asyncio
import functools

import pytest

from broker.client import Admin, ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from broker.remoting.loop import run
from tests.aio import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = {"persist_interval": 0.5, "rebalance_interval": 5.0, "retry_backoff": 0.2}
until = functools.partial(poll, timeout=20.0, interval=0.02)


async def _topic(server, topic: str) -> None:
    async with Admin(server.namesrv_addr) as admin:
        await admin.create_topic(topic, broker_addr=server.broker_addr, read_queue_nums=1, write_queue_nums=1)

        async def routed() -> bool:
            route = await admin.topic_route(topic)
            return route is not None and len(route.subscribe_queues(topic)) == 1

        await until(routed, what=f"route of {topic}")


async def _held_with_two_ahead(server, topic: str, group: str, release: asyncio.Event):
    """A started consumer of ``topic`` whose handler holds m0 until ``release`` while m1 and m2 wait pulled
    ahead; returns it and the list of bodies its handler finished."""
    ns = server.namesrv_addr
    await _topic(server, topic)
    got: list[bytes] = []
    holding = asyncio.Event()

    async def handler(msg: MessageExt) -> None:
        if not got:
            holding.set()
            await release.wait()
        got.append(msg.body)

    c = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **FAST)
    c.subscribe(topic, "*", handler)
    await c.start()
    try:
        async with Producer(f"pg_{group}", ns) as p:
            await p.send(Message(topic, b"m0"))
            await until(holding.is_set, what="m0 in the handler")
            await p.send(Message(topic, b"m1"))
            await p.send(Message(topic, b"m2"))
            # pulled while m0 is still in the handler
            await until(lambda: sum(c.backlog().values()) == 2, what="m1 and m2 pulled ahead")
    except BaseException:
        release.set()
        await c.shutdown()
        raise
    return c, got


def test_the_next_pull_goes_out_while_the_handler_holds_a_message(mqlake_server):
    topic, group = "PullAheadTopic", "cg_pull_ahead"

    async def go():
        release = asyncio.Event()
        c, got = await _held_with_two_ahead(mqlake_server, topic, group, release)
        try:
            assert got == []
            release.set()
            await until(lambda: len(got) == 3, what="all three handled")
            assert got == [b"m0", b"m1", b"m2"]  # queue order kept
            assert sum(c.backlog().values()) == 0
            assert [v for mq, v in c.offsets().items() if mq.topic == topic] == [3]
        finally:
            release.set()
            await c.shutdown()

    run(go())


def test_messages_pulled_ahead_but_not_handled_come_again_to_the_next_consumer(mqlake_server):
    ns = mqlake_server.namesrv_addr
    topic, group = "PullAheadHandover", "cg_pull_ahead_handover"

    async def go():
        release = asyncio.Event()
        c, got = await _held_with_two_ahead(mqlake_server, topic, group, release)
        stopping = asyncio.ensure_future(c.shutdown())  # finishes the message in hand, then commits
        await until(lambda: not c.assigned_queues, what="the queues given up")
        release.set()
        await stopping
        assert got == [b"m0"]

        again: list[bytes] = []
        d = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **FAST)
        d.subscribe(topic, "*", lambda m: again.append(m.body))
        await d.start()
        try:
            await until(lambda: len(again) >= 2, what="m1 and m2 for the next consumer")
            assert again == [b"m1", b"m2"]
        finally:
            await d.shutdown()

    run(go())
