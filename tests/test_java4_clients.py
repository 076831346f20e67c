"""Apache RocketMQ's 4.9.8 Java clients (``rocketmq-client`` from the fetched jars) against ``mqlake up``: every
send path of DefaultMQProducer, TransactionMQProducer with its check-back, DefaultMQPushConsumer (concurrent,
orderly, broadcasting, retry to the DLQ, SQL92) and DefaultLitePullConsumer (assign/seek, subscribe).

Each test runs one Java program of tests/java/clients4 (one JVM) and checks every message it reports: body, tags,
keys, user properties, msgId, queue and offset, with exact counts. One server serves the module (topics and groups
are unique per test); it filters by SQL92 and checks transactions every second."""

from __future__ import annotations

import itertools
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.clients4 import check_received, clients4, committed_offset, expected, run
from tests.fixtures_broker import MqlakeServer, count_topic, read_topic, stop_servers

pytestmark = pytest.mark.integration
__all__ = ["clients4"]  # the fixture, used by name

_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_ids)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = MqlakeServer(tmp_path_factory.mktemp("mqlake-java4"), enablePropertyFilter="true",
                     transactionCheckInterval="1000", transactionTimeOut="1000").start()  # fmt: skip
    yield s
    stop_servers([s])


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "java-home"


def by_body(items: list[dict]) -> dict[str, dict]:
    out = {m["body"]: m for m in items}
    assert len(out) == len(items), "a body twice"
    return out


# --- DefaultMQProducer ----------------------------------------------------------------------------------------


def test_producer_sync_async_oneway_batch_and_ordered_sends(server, clients4, home) -> None:
    topic, n = unique("J4Send"), 8
    doc = run("Produce", clients4, home, namesrv=server.namesrv_addr, topic=topic, group=unique("PG"), n=n)
    assert doc["errors"] == []
    sent = doc["sent"]
    assert Counter(s["mode"] for s in sent) == {"sync": n, "async": n, "batch": 1, "ordered": n}
    assert all(s["status"] == "SEND_OK" and s["brokerName"] == "broker-a" for s in sent)
    stored = [m for msgs in read_topic(server.namesrv_addr, topic, 5 * n).values() for m in msgs]
    assert len(stored) == 5 * n  # the oneway ones too, each once
    records = {m.body.decode(): m for m in stored}
    assert set(records) == {f"{mode}-{i}" for mode in ("sync", "async", "oneway", "batch", "ordered") for i in range(n)}
    for body, m in records.items():
        want = expected(body)
        assert (m.tags, m.keys) == (want["tags"], want["keys"])
        assert m.user_properties.items() >= want["properties"].items()
        assert m.properties["CLUSTER"] == "DefaultCluster" and m.topic == topic
    for s in sent:
        if s["mode"] == "batch":  # one answer: the messages' ids joined, the first one's offset, one queue
            ids, offset_ids = s["msgId"].split(","), s["offsetMsgId"].split(",")
            batch = [records[f"batch-{i}"] for i in range(n)]
            assert [m.uniq_key for m in batch] == ids and [m.offset_msg_id for m in batch] == offset_ids
            assert [(m.queue_id, m.queue_offset) for m in batch] == [(s["queueId"], s["queueOffset"] + i)
                                                                     for i in range(n)]  # fmt: skip
            continue
        m = records[s["body"]]
        assert (m.uniq_key, m.offset_msg_id) == (s["msgId"], s["offsetMsgId"])
        assert (m.queue_id, m.queue_offset) == (s["queueId"], s["queueOffset"])
    ordered = sorted((s for s in sent if s["mode"] == "ordered"), key=lambda s: int(s["body"].rsplit("-", 1)[1]))
    for order_id in range(4):  # the selector's queue for each order id, its messages in send order there
        mine = [s for s in ordered if s["orderId"] == order_id]
        assert {s["queueId"] for s in mine} == {order_id}
        assert [s["queueOffset"] for s in mine] == sorted(s["queueOffset"] for s in mine)


# --- DefaultMQPushConsumer ------------------------------------------------------------------------------------


def push(server, clients4, home, mode: str, n: int, expect: int, **extra: object) -> tuple[str, str, dict]:
    topic, group = unique(f"J4{mode.title()}"), unique("CG")
    doc = run("Push", clients4, home, namesrv=server.namesrv_addr, topic=topic, group=group, mode=mode, n=n,
              expect=expect, **extra)  # fmt: skip
    assert doc["caughtUp"], doc
    assert len(doc["sent"]) == n and all(s["status"] == "SEND_OK" for s in doc["sent"])
    return topic, group, doc


def test_push_consumer_concurrently_gets_each_message_once_and_commits_its_offsets(server, clients4, home) -> None:
    topic, group, doc = push(server, clients4, home, "concurrent", 16, 16)
    sent, got = by_body(doc["sent"]), doc["consumers"]["a"]
    assert sorted(m["body"] for m in got) == sorted(sent)  # every message, once
    for m in got:
        check_received(m, sent[m["body"]], topic)
        assert m["reconsumeTimes"] == 0
    ends = Counter(s["queueId"] for s in doc["sent"])
    for queue_id, count in ends.items():  # the consumer's shutdown persisted its offsets on the broker
        assert committed_offset(server.broker_addr, group, topic, queue_id) == count


def test_push_consumer_orderly_gets_each_queue_in_send_order(server, clients4, home) -> None:
    topic, _, doc = push(server, clients4, home, "orderly", 20, 20)
    sent, got = by_body(doc["sent"]), doc["consumers"]["a"]
    assert sorted(m["body"] for m in got) == sorted(sent)
    per_queue: dict[int, list[dict]] = defaultdict(list)
    for m in got:
        check_received(m, sent[m["body"]], topic)
        per_queue[m["queueId"]].append(m)
    assert set(per_queue) == {0, 1, 2, 3}
    for queue_id, msgs in per_queue.items():
        assert [m["queueOffset"] for m in msgs] == list(range(5))  # in queue order, on one thread at a time
        assert {m["properties"]["orderId"] for m in msgs} == {str(queue_id)}
        assert [int(m["properties"]["idx"]) for m in msgs] == list(range(queue_id, 20, 4))


def test_push_consumers_broadcasting_each_get_every_message(server, clients4, home) -> None:
    topic, _, doc = push(server, clients4, home, "broadcast", 6, 12)
    sent = by_body(doc["sent"])
    assert set(doc["consumers"]) == {"a", "b"}
    for got in doc["consumers"].values():
        assert sorted(m["body"] for m in got) == sorted(sent)
        for m in got:
            check_received(m, sent[m["body"]], topic)


def test_push_consumer_reconsume_later_retries_then_dead_letters(server, clients4, home) -> None:
    n, retries = 3, 2
    topic, group, doc = push(server, clients4, home, "retry", n, n * (retries + 1), maxReconsumeTimes=retries)
    sent, got = by_body(doc["sent"]), doc["consumers"]["a"]
    assert len(got) == n * (retries + 1)
    for body, s in sent.items():  # the first delivery, then one per retry, the message as it was sent
        deliveries = [m for m in got if m["body"] == body]
        assert sorted(m["reconsumeTimes"] for m in deliveries) == list(range(retries + 1))
        for m in deliveries:
            assert m["topic"] == topic and m["msgId"] == s["msgId"] and m["keys"] == expected(body)["keys"]
        first = next(m for m in deliveries if m["reconsumeTimes"] == 0)
        assert (first["queueId"], first["queueOffset"]) == (s["queueId"], s["queueOffset"])
        retried = [m for m in deliveries if m["reconsumeTimes"] > 0]
        assert all(m["properties"]["RETRY_TOPIC"] == topic for m in retried)
    dlq = [m for msgs in read_topic(server.namesrv_addr, f"%DLQ%{group}", n).values() for m in msgs]
    assert sorted(m.body.decode() for m in dlq) == sorted(sent)
    for m in dlq:
        s = sent[m.body.decode()]
        want = expected(m.body.decode())
        assert (m.uniq_key, m.tags, m.keys) == (s["msgId"], want["tags"], want["keys"])
        assert m.user_properties.items() >= want["properties"].items()
        assert m.properties["RETRY_TOPIC"] == topic
        assert m.reconsume_times == retries + 1


def test_push_consumer_sql92_selector_gets_exactly_the_matching_messages(server, clients4, home) -> None:
    # a = i, color red for even i: 4, 6 and 8 match
    topic, _, doc = push(server, clients4, home, "sql", 12, 3, sql="a BETWEEN 3 AND 8 AND color = 'red'")
    sent, got = by_body(doc["sent"]), doc["consumers"]["a"]
    assert sorted(m["body"] for m in got) == ["sql-4", "sql-6", "sql-8"]
    for m in got:
        check_received(m, sent[m["body"]], topic)
        assert m["properties"]["color"] == "red"


# --- TransactionMQProducer ------------------------------------------------------------------------------------


def test_transaction_producer_commit_rollback_and_unknown_checked_back(server, clients4, home) -> None:
    topic, n = unique("J4Tx"), 3
    doc = run("Transaction", clients4, home, namesrv=server.namesrv_addr, topic=topic, group=unique("CG"), n=n)
    assert doc["done"], doc
    sent = by_body(doc["sent"])
    states = {"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}
    for body, s in sent.items():
        assert s["status"] == "SEND_OK" and s["localTransactionState"] == states[body.split("-")[0]]
        assert s["transactionId"] == s["msgId"]
    # the check-back asked about each unknown one, with its transaction id, and about nothing else
    checked = by_body(doc["checks"])
    assert sorted(checked) == [f"unknown-{i}" for i in range(n)]
    for body, c in checked.items():
        assert c["transactionId"] == sent[body]["msgId"] == c["properties"]["UNIQ_KEY"]
        assert c["properties"]["REAL_TOPIC"] == topic and c["keys"] == expected(body)["keys"]
    got = doc["received"]
    assert sorted(m["body"] for m in got) == sorted(f"{mode}-{i}" for mode in ("commit", "unknown") for i in range(n))
    for m in got:
        assert m["topic"] == topic and m["msgId"] == sent[m["body"]]["msgId"]
        assert m["properties"]["TRAN_MSG"] == "true" and m["keys"] == expected(m["body"])["keys"]
    assert count_topic(server.namesrv_addr, topic) == 2 * n  # the rolled-back ones never reached the topic
    # the committed messages are in the topic's queues one after the other
    assert sorted((m["queueId"], m["queueOffset"]) for m in got) == sorted(
        (q, o) for q, c in Counter(m["queueId"] for m in got).items() for o in range(c))


# --- DefaultLitePullConsumer ----------------------------------------------------------------------------------


def test_lite_pull_consumer_assign_seek_and_subscribe(server, clients4, home) -> None:
    topic, n = unique("J4Lite"), 12
    doc = run("LitePull", clients4, home, namesrv=server.namesrv_addr, topic=topic, group=unique("CG"), n=n, seek=1,
              expectAssign=n - 1, expectSubscribe=8, tags="Tag0 || Tag1")  # fmt: skip
    sent = by_body(doc["sent"])
    assert sorted(doc["queues"]) == [0, 1, 2, 3]
    # assign: queue 0 from offset 1, the others from their beginning; nothing twice, nothing more
    skipped = {b for b, s in sent.items() if (s["queueId"], s["queueOffset"]) == (0, 0)}
    assert len(skipped) == 1
    assert sorted(m["body"] for m in doc["assign"]) == sorted(set(sent) - skipped)
    for m in doc["assign"]:
        check_received(m, sent[m["body"]], topic)
    # subscribe: the tag expression filters (Tag0 and Tag1 of i % 3)
    assert sorted(m["body"] for m in doc["subscribe"]) == sorted(f"lite-{i}" for i in range(n) if i % 3 != 2)
    for m in doc["subscribe"]:
        check_received(m, sent[m["body"]], topic)
