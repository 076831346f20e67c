"""SQL92 subscriptions against a real ``mqlake up`` through the Python client: pull and push consumers get only
matching messages, a parked SQL92 pull ignores non-matching arrivals, CHECK_CLIENT_CONFIG answers as Java's
broker, and bad expressions get SUBSCRIPTION_PARSE_FAILED while the broker keeps serving."""

from __future__ import annotations

import asyncio
import functools

import pytest

from broker.client import (
    ConsumeFromWhere,
    ConsumeResult,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
)
from broker.client.errors import MQBrokerError
from broker.client.message import decode_messages
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.protocol.body import CheckClientRequestBody
from broker.remoting.protocol.heartbeat import ConsumerData, HeartbeatData, SubscriptionData
from tests.aio import poll
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.test_client_broker import make_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def filter_server(tmp_path_factory):
    """One broker with enablePropertyFilter for the module (each test has topics and groups of its own)."""
    server = MqlakeServer(tmp_path_factory.mktemp("sql92"), enablePropertyFilter="true").start()
    yield server
    stop_servers([server])

until = functools.partial(poll, timeout=20.0, interval=0.02)
SQL = "SQL92"


def _msg(topic: str, i: int) -> Message:
    color = ("red", "green", "blue")[i % 3]
    return Message(topic, f"m{i}", tags=f"T{i % 2}", keys=f"k{i}", properties={"color": color, "n": str(i)})


async def _send(ns: str, topic: str, count: int) -> None:
    async with Producer("pg_sql92", ns) as p:
        for i in range(count):
            await p.send(_msg(topic, i))


async def _pull_matching(consumer: PullConsumer, topic: str, expect_total: int, expression: str) -> list[str]:
    queues = await consumer.fetch_queues(topic)

    async def dispatched() -> bool:
        return sum([await consumer.max_offset(mq) for mq in queues]) >= expect_total

    await until(dispatched, what=f"{expect_total} messages dispatched")
    keys = []
    for mq in queues:
        offset = 0
        while True:
            r = await consumer.pull(mq, offset, 32, expression, SQL)
            if r.status is PullStatus.NO_NEW_MSG:
                break
            assert r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), r.status
            keys += [m.keys for m in r.messages]
            offset = r.next_begin_offset
    return sorted(keys)


async def _at_least(consumer: PullConsumer, mq, n: int) -> bool:
    return await consumer.max_offset(mq) >= n


def _check_config(addr: str, sub: SubscriptionData | None) -> RemotingCommand:
    async def go() -> RemotingCommand:
        client = RemotingClient()
        try:
            body = CheckClientRequestBody(client_id="c@1", group="g_check", subscription_data=sub).encode()
            return await client.invoke(addr, RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, None, body))
        finally:
            await client.close()

    return run(go())


def test_sql92_pull_returns_exactly_the_matching_messages(filter_server):
    server = filter_server
    ns, topic = server.namesrv_addr, "sql92_pull"

    async def go():
        await make_topic(server, topic, queues=2)
        await _send(ns, topic, 30)
        async with PullConsumer("cg_sql92_pull", ns) as c:
            expr = "color = 'red' AND n >= 9 AND TAGS = 'T1'"
            want = sorted(f"k{i}" for i in range(30) if i % 3 == 0 and i >= 9 and i % 2 == 1)
            assert await _pull_matching(c, topic, 30, expr) == want
            want_in = sorted(f"k{i}" for i in range(30) if i % 3 != 2 and not (10 <= i <= 20))
            got = await _pull_matching(c, topic, 30, "color IN ('red', 'green') AND n NOT BETWEEN 10 AND 20")
            assert got == want_in
            assert await _pull_matching(c, topic, 30, "missing = 1 OR missing <> 1") == []

            mq = (await c.fetch_queues(topic))[0]
            for bad in ("color = ", "n > 'x'", "(" * 100 + "n = 1" + ")" * 100, "n = 1" + " OR n = 1" * 2000):
                with pytest.raises(MQBrokerError) as e:
                    await c.pull(mq, 0, 32, bad, SQL)
                assert e.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
                assert "Invalid MessageSelector" in (e.value.remark or "")
            # the broker is unaffected: the same consumer still pulls with a good expression
            assert await _pull_matching(c, topic, 30, "n = 0") == ["k0"]

    run(go())


def test_sql92_needs_enable_property_filter(mqlake_server):
    ns, topic = mqlake_server.namesrv_addr, "sql92_disabled"

    async def go():
        await make_topic(mqlake_server, topic, queues=1)
        await _send(ns, topic, 1)
        async with PullConsumer("cg_sql92_off", ns) as c:
            mq = (await c.fetch_queues(topic))[0]
            with pytest.raises(MQBrokerError) as e:
                await c.pull(mq, 0, 32, "n = 0", SQL)
            assert e.value.code == ResponseCode.SYSTEM_ERROR
            assert "does not support consumer to filter message by SQL92" in (e.value.remark or "")

    run(go())
    sub = SubscriptionData(topic=topic, sub_string="n = 0", expression_type=SQL)
    resp = _check_config(mqlake_server.broker_addr, sub)
    assert resp.code == ResponseCode.SYSTEM_ERROR


def test_check_client_config_answers_as_java(filter_server):
    server = filter_server
    good = SubscriptionData(topic="t", sub_string="a > 1 AND b IS NOT NULL", expression_type=SQL)
    assert _check_config(server.broker_addr, good).code == ResponseCode.SUCCESS
    tag = SubscriptionData(topic="t", sub_string="A || B")
    assert _check_config(server.broker_addr, tag).code == ResponseCode.SUCCESS
    assert _check_config(server.broker_addr, None).code == ResponseCode.SUCCESS
    bad = SubscriptionData(topic="t", sub_string="a >> 1", expression_type=SQL)
    resp = _check_config(server.broker_addr, bad)
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "Invalid MessageSelector" in resp.remark
    unknown = SubscriptionData(topic="t", sub_string="x", expression_type="GROOVY")
    assert _check_config(server.broker_addr, unknown).code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_push_consumer_with_sql92_gets_only_matching_and_a_bad_expression_fails_at_start(filter_server):
    server = filter_server
    ns, topic = server.namesrv_addr, "sql92_push"

    async def go():
        await make_topic(server, topic, queues=2)
        got: list[MessageExt] = []

        async def handler(msg: MessageExt) -> ConsumeResult:
            got.append(msg)
            return ConsumeResult.SUCCESS

        bad = PushConsumer("cg_sql92_bad", ns)
        bad.subscribe(topic, "color = = 'red'", handler, SQL)
        with pytest.raises(MQBrokerError) as e:
            await bad.start()
        assert e.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        await bad.shutdown()

        consumer = PushConsumer("cg_sql92_push", ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe(topic, "color = 'blue' OR n < 2", handler, SQL)
        async with consumer:
            await until(lambda: len({q for q in consumer.assigned_queues if q.topic == topic}) == 2, what="queues")
            await _send(ns, topic, 12)  # sent while the consumer's pulls are parked
            want = sorted(f"k{i}" for i in range(12) if i % 3 == 2 or i < 2)
            await until(lambda: len(got) >= len(want), what=f"{len(want)} matching messages")
            assert sorted(m.keys for m in got) == want
            assert all(m.properties["color"] == "blue" or int(m.properties["n"]) < 2 for m in got)

    run(go())


def test_a_parked_sql92_pull_is_not_woken_by_a_message_that_does_not_match(filter_server):
    """With the filter on the wake-up, the parked pull answers with the matching message; woken by the
    non-matching one it would answer PULL_RETRY_IMMEDIATELY (nothing matched) before the second send."""
    server = filter_server
    ns, topic, group = server.namesrv_addr, "sql92_park", "cg_sql92_park"

    async def go():
        await make_topic(server, topic, queues=1)
        client = RemotingClient()
        try:
            sub = SubscriptionData(topic=topic, sub_string="color = 'red'", expression_type=SQL, sub_version=1)
            consumer = ConsumerData(group_name=group, consume_type="CONSUME_ACTIVELY", subscription_data_set=[sub])
            beat = HeartbeatData(client_id="127.0.0.1@park", consumer_data_set=[consumer]).encode()
            resp = await client.invoke(server.broker_addr, RemotingCommand.request(RequestCode.HEART_BEAT, None, beat))
            assert resp.code == ResponseCode.SUCCESS
            # no subscription flag: the broker filters with the heartbeat's registered SQL92 subscription
            header = h.PullMessageRequestHeader(
                consumer_group=group, topic=topic, queue_id=0, queue_offset=0, max_msg_nums=32, sys_flag=0x2,
                commit_offset=0, suspend_timeout_millis=20_000, sub_version=1,
            )  # fmt: skip
            cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header)
            pull = asyncio.ensure_future(client.invoke(server.broker_addr, cmd, 30.0))
            async with Producer("pg_sql92_park", ns) as p, PullConsumer("cg_sql92_probe", ns) as probe:
                mq = (await probe.fetch_queues(topic))[0]
                # two non-matching arrivals, each dispatched before the next send: woken by either, the pull
                # would have answered PULL_RETRY_IMMEDIATELY before the matching message exists
                for i, color in enumerate(("green", "blue"), 1):
                    await p.send(Message(topic, color, keys=color, properties={"color": color}))
                    await until(lambda i=i: _at_least(probe, mq, i), what=f"{color} dispatched")
                    assert not pull.done(), (pull.result().code, pull.result().remark)
                await p.send(Message(topic, "red", keys="r", properties={"color": "red"}))
                resp = await asyncio.wait_for(pull, 20)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert [m.keys for m in decode_messages(resp.body, "broker-a", "pull")] == ["r"]
        finally:
            await client.close()

    run(go())
