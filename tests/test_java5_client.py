"""Apache RocketMQ's 5.x Java client (``rocketmq-client-java`` 5.2.0, from ``make peers``) against ``mqlake up``
with ``enableProxy=true``, its body-digest check on (the client's default), and the official Python 5.x client
reading the same messages with its own check.

One Java program (``tests/java/client5/Client5Messages.java``) runs every path in one JVM: a Producer (bodies of
every length 0..64 bytes and one of 4 MiB, FIFO, delay (one recalled), transactional commit / rollback /
check-back), a SimpleConsumer per path and a PushConsumer.  The tests read its JSON and check every message: body,
keys, tag, properties, message id, queue, offset, and that neither client found a body corrupted.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from store.format import msgid, properties
from tests.fixtures_broker import remoting_call, stop_servers
from tests.peers import JAVA_SOURCES, compile_java, java
from tests.test_grpc_clients import ProxyServer, _start

pytestmark = pytest.mark.integration

BIG = 4 * 1024 * 1024
LENGTHS = [*range(65), BIG]  # the body lengths the Java producer sends (65 stands for the 4 MiB one)


def pattern(length: int, seed: int) -> bytes:
    """The Java program's body of ``length`` bytes for message ``seed`` (``Client5Messages.pattern``)."""
    return bytes((i * 31 + seed * 7) & 0xFF for i in range(length))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    # maxMessageSize above 4 MiB: the 4 MiB body and its properties fit
    p = _start(tmp_path_factory.mktemp("java5"), "up", maxMessageSize=str(BIG + 64 * 1024))
    yield p
    stop_servers([p.server])


@pytest.fixture(scope="module")
def run(proxy: ProxyServer, tmp_path_factory) -> dict:
    """The Java program's one run: what it sent and what each of its consumers received."""
    classes = compile_java(sorted((JAVA_SOURCES / "client5").glob("*.java")), "client-java-5",
                           tmp_path_factory.getbasetemp() / "java-classes")  # fmt: skip
    names = {"normal": proxy.create_topic(8), "fifo": proxy.create_topic(), "delay": proxy.create_topic(1),
             "tx": proxy.create_topic(), "sgroup": proxy.create_group(),
             "fgroup": proxy.create_group(consumeMessageOrderly=True), "dgroup": proxy.create_group(),
             "tgroup": proxy.create_group(), "pgroup": proxy.create_group()}  # fmt: skip
    uniq, empty = send_empty_body(proxy, names["normal"])
    # stored, though Apache RocketMQ's broker cannot store an empty body (docs/compatibility.md)
    assert empty.code == ResponseCode.SUCCESS, empty.remark
    preloaded = [{"message_id": uniq, "offset": int(empty.ext_fields["queueOffset"]), "len": 0}]
    args = [f"endpoint={proxy.endpoint}", f"preloaded={len(preloaded)}", *(f"{k}={v}" for k, v in names.items())]
    proc = java("Client5Messages", "client-java-5", *args, classes=classes, home=proxy.home / "java", timeout=600)
    assert proc.returncode == 0, f"Client5Messages exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "names": names, "preloaded": preloaded}


def send_empty_body(proxy: ProxyServer, topic: str) -> tuple[str, RemotingCommand]:
    """A message with an empty body, which only a remoting client can send (both 5.x paths refuse one), so that its
    digest reaches the 5.x consumers too: its UNIQ_KEY and the broker's answer."""
    uniq = msgid.UniqKeyGenerator().next()
    props = {"UNIQ_KEY": uniq, "TAGS": "TagA", "KEYS": "k-0 common", "len": "0", "WAIT": "true"}
    header = h.SendMessageRequestHeader(producer_group="pg", topic=topic, default_topic="TBW102",
                                        default_topic_queue_nums=8, queue_id=0, sys_flag=0,
                                        born_timestamp=int(time.time() * 1000), flag=0,
                                        properties=properties.encode_properties(props).decode())  # fmt: skip
    return uniq, remoting_call(proxy.server.broker_addr, RequestCode.SEND_MESSAGE, header, b"")


def check_normal(received: list[dict], run: dict) -> None:
    """Every message of the normal topic (the Java producer's, and the empty one where the broker stored it), once,
    as it was sent, and found intact by the client's digest check."""
    sent, topic = [*run["preloaded"], *run["normal_sent"]], run["names"]["normal"]
    by_id = {m["message_id"]: m for m in received}
    assert len(received) == len(sent) == len(by_id) == 65 + len(run["preloaded"])
    for s in sent:
        m = by_id[s["message_id"]]
        n = 65 if s["len"] == BIG else s["len"]
        body = pattern(s["len"], n)
        assert (m["len"], m["md5"], m["corrupted"]) == (len(body), hashlib.md5(body).hexdigest(), False)
        if len(body) <= 64:
            assert m["hex"] == body.hex()
        assert (m["topic"], m["tag"], m["keys"]) == (topic, "TagA", sorted([f"k-{n}", "common"]))
        assert m["properties"] == {"len": str(len(body))} and m["attempt"] == 1
        assert m.get("offset", s["offset"]) == s["offset"]  # the Python client does not show the offset


def test_bodies_of_every_length_pass_the_java_clients_digest_check(run) -> None:
    assert sorted(s["len"] for s in run["normal_sent"]) == LENGTHS[1:]  # 1..64 and 4 MiB stored
    [refused] = run["normal_refused"]  # the Java client refuses an empty body itself
    assert refused["len"] == 0 and "empty" in refused["error"], refused
    sent = [*run["preloaded"], *run["normal_sent"]]
    assert len({s["message_id"] for s in sent}) == len(sent)
    check_normal(run["simple"]["received"], run)


def test_the_push_consumer_gets_every_message_none_discarded_as_corrupted(run) -> None:
    check_normal(run["push"]["received"], run)


def test_the_same_bodies_pass_the_python_clients_digest_check(run, proxy: ProxyServer) -> None:
    group = proxy.create_group()
    expect = str(65 + len(run["preloaded"]))
    got = proxy.client("receive", "--topic", run["names"]["normal"], "--group", group, "--expect", expect, "--ack")
    check_normal(got["received"], run)


def test_fifo_messages_arrive_in_order_with_their_group(run) -> None:
    received = run["fifo"]["received"]
    assert [bytes.fromhex(m["hex"]) for m in received] == [f"fifo-{i}".encode() for i in range(5)]
    assert [m["message_id"] for m in received] == [s["message_id"] for s in run["fifo_sent"]]
    assert [s["offset"] for s in run["fifo_sent"]] == [0, 1, 2, 3, 4]  # one message group, one queue
    assert {m["group"] for m in received} == {"order-1"}
    # the message group shows as a user property too, as RocketMQ's proxy shows every non-system property
    assert [m["properties"] for m in received] == [{"index": str(i), "__SHARDINGKEY": "order-1"} for i in range(5)]


def test_a_delay_message_comes_at_its_delivery_time(run) -> None:
    [m] = run["delay"]["received"]
    assert m["message_id"] == run["delay_sent"]["message_id"] and bytes.fromhex(m["hex"]) == b"delayed"
    assert m["delivery_timestamp"] == run["delay_deliver_at"] and m["received_at"] >= run["delay_deliver_at"]


def test_a_recalled_delay_message_never_comes(run) -> None:
    # one queue, one delivery time: the recalled message, sent first, would have been received first
    assert run["recalled"] == run["recall_sent"]["message_id"]
    assert [m["message_id"] for m in run["delay"]["received"]] == [run["delay_sent"]["message_id"]]


def test_transactions_commit_rollback_and_the_checker_resolves_an_open_one(run) -> None:
    sent = run["tx_sent"]
    assert all(s["transaction_id"] for s in sent.values())
    # the broker asked the checker about the open one (maybe more than once, until its answer landed); a broker may
    # also ask about a committed or rolled-back one whose end it has not read yet when its check runs (RocketMQ's
    # does, with the half-second transactionTimeOut here): the checker answers as the producer decided
    assert sent["check"]["message_id"] in run["tx_checked"]
    assert set(run["tx_checked"]) <= {s["message_id"] for s in sent.values()}
    got = {bytes.fromhex(m["hex"]).decode(): m for m in run["tx"]["received"]}
    assert sorted(got) == ["tx-check", "tx-commit"]
    assert run["tx_after"]["received"] == []  # the rolled-back one never comes
    for how, m in got.items():
        assert m["message_id"] == sent[how.removeprefix("tx-")]["message_id"]
        # the broker's __transactionId__ (the half message's id) shows, as RocketMQ's proxy shows it, and so does
        # the check count a checked half message carries when the commit came from its re-put copy
        props = dict(m["properties"])
        if how == "tx-check":
            assert props.pop("TRANSACTION_CHECK_TIMES", "1").isdigit()
        assert props == {"how": how.removeprefix("tx-"), "__transactionId__": m["message_id"]}
        assert not m["corrupted"]

