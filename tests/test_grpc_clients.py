"""The RocketMQ 5 gRPC endpoint against the official 5.x Python client (PyPI ``rocketmq-python-client``, run from
``.venv-rmq5`` by ``tests/rmq5.py``) and the 4.x C++ client, on one ``mqlake up`` with ``enableProxy=true``.

Producer: normal, FIFO (message group), delay (delivery timestamp; a recalled one is not delivered) and
transactional (commit / rollback).
SimpleConsumer: receive + ack, invisible-time expiry redelivers through the retry topic, ChangeInvisibleDuration,
an already-acked receipt handle is refused.  PushConsumer: settings, assignment, a failed message redelivered after
its back-off.  Mixed traffic: 4.x and 5.x producers on one topic, read by a 5.x
SimpleConsumer and a 4.x push consumer.  A broker killed with messages in flight redelivers them after restart.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.protocol.body import SubscriptionGroupConfig
from broker.remoting.tls import client_context
from tests import rmq5
from tests.fixtures_broker import TEST_CONF, MqlakeServer, remoting_call, stop_servers
from tests.helpers import wait_until
from tests.test_conformance_cpp_client import Collector, message, producer, push_consumer, unique
from tests.tls_certs import self_signed

pytestmark = pytest.mark.integration

# transactionTimeOut and transactionCheckInterval shortened: an open transaction is checked back within a second
PROXY_CONF = {"enableProxy": "true", "minInvisibleTimeMillsForRecv": "1000", "transactionTimeOut": "500",
              "transactionCheckInterval": "300", "recallMessageEnable": "true"}


class ProxyServer:
    def __init__(self, server: MqlakeServer, home, ssl_context=None, credentials=None) -> None:
        self.server = server
        self.home = home
        self.ssl_context = ssl_context  # the broker's remoting port speaks TLS
        self.credentials = credentials  # an admin account the topics and groups are made with (aclEnable)

    @property
    def endpoint(self) -> str:
        return self.server.grpc_endpoint

    def wait_proxy(self) -> None:
        wait_until(lambda: "gRPC proxy ready at" in self.server.run_log(), 30, what="the gRPC proxy to serve")

    def client(self, command: str, *args: str, trust=None) -> dict:
        return rmq5.client(command, self.endpoint, self.home, *args, trust=trust)

    def create_topic(self, queues: int = 4, name: str | None = None) -> str:
        topic = name or unique("T5")
        hdr = h.CreateTopicRequestHeader(topic=topic, default_topic="TBW102", read_queue_nums=queues,
                                         write_queue_nums=queues, perm=6, topic_filter_type="SINGLE_TAG")  # fmt: skip
        r = remoting_call(self.server.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, hdr,
                          ssl_context=self.ssl_context, credentials=self.credentials)  # fmt: skip
        assert r.code == ResponseCode.SUCCESS, r.remark
        return topic

    def create_group(self, name: str | None = None, **fields: object) -> str:
        group = name or unique("G5")
        body = SubscriptionGroupConfig(group_name=group, **fields).encode()
        r = remoting_call(self.server.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body,
                          ssl_context=self.ssl_context, credentials=self.credentials)  # fmt: skip
        assert r.code == ResponseCode.SUCCESS, r.remark
        return group


def _start(tmp_path, name: str, ssl_context=None, credentials=None, **conf: str) -> ProxyServer:
    server = MqlakeServer(tmp_path / name, **PROXY_CONF, **conf)
    proxy = ProxyServer(server, tmp_path / f"{name}-home", ssl_context, credentials)
    server.start()
    proxy.wait_proxy()
    return proxy


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    p = _start(tmp_path_factory.mktemp("grpc"), "up")
    yield p
    stop_servers([p.server])


def bodies(result: dict) -> list[str]:
    return [m["body"] for m in result["received"]]


def test_5x_producer_to_5x_simple_consumer_with_tags_keys_properties_and_ack(proxy) -> None:
    topic, group = proxy.create_topic(), proxy.create_group()
    sent = proxy.client("produce", "--topic", topic, "--count", "4", "--tag", "TagA", "--keys", "k1", "k2")["sent"]
    assert len({s["message_id"] for s in sent}) == 4
    got = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "4", "--ack", "--ack-again")
    assert sorted(bodies(got)) == [f"m-{i}" for i in range(4)]
    by_body = {m["body"]: m for m in got["received"]}
    for i, s in enumerate(sent):
        m = by_body[f"m-{i}"]
        assert (m["message_id"], m["tag"], m["keys"], m["topic"]) == (s["message_id"], "TagA", ["k1", "k2"], topic)
        assert m["properties"] == {"index": str(i)} and m["attempt"] == 1
    # the first message's handle was acked above: acking it again is refused with the v2 code
    [error] = got["errors"]
    assert error["message"].startswith("40013, ") and "already acked" in error["message"]  # INVALID_RECEIPT_HANDLE
    # acked: nothing comes back after the invisible time (1 s) has passed
    later = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "1", "--deadline", "3")
    assert later["received"] == []


def test_a_namespace_maps_topics_and_groups_as_rocketmq_5s_proxy_does(proxy) -> None:
    topic, group = unique("T5"), unique("G5")
    proxy.create_topic(queues=1, name=f"ns1%{topic}")  # the broker's names carry the namespace
    proxy.create_group(name=f"ns1%{group}")
    sent = proxy.client("produce", "--namespace", "ns1", "--topic", topic, "--count", "2")["sent"]
    assert len(sent) == 2

    def stored() -> str:
        r = remoting_call(proxy.server.broker_addr, RequestCode.GET_MAX_OFFSET,
                          h.GetMaxOffsetRequestHeader(topic=f"ns1%{topic}", queue_id=0))  # fmt: skip
        return r.ext_fields["offset"]

    wait_until(lambda: stored() == "2", what="both messages in the broker's topic ns1%<topic>")
    got = proxy.client("receive", "--namespace", "ns1", "--topic", topic, "--group", group, "--expect", "2", "--ack")
    assert sorted(bodies(got)) == ["m-0", "m-1"]
    assert {(m["topic"], m["namespace"]) for m in got["received"]} == {(topic, "ns1")}
    # without the namespace the topic is not the client's (another namespace's names do not leak)
    other = proxy.client("produce", "--topic", topic, "--report-error")
    assert "sent" not in other


def test_unacked_message_is_redelivered_after_its_invisible_time_and_renew_keeps_it(proxy) -> None:
    topic, group = proxy.create_topic(), proxy.create_group()
    proxy.client("produce", "--topic", topic, "--count", "2")
    first = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "2", "--invisible", "2")
    assert sorted(bodies(first)) == ["m-0", "m-1"] and {m["attempt"] for m in first["received"]} == {1}
    # not acked: after 2 s both come again (from the group's retry topic), as attempt 2, under the original topic
    again = proxy.client("receive_renew", "--topic", topic, "--group", group, "--expect", "2", "--invisible", "2")
    assert sorted(bodies(again)) == ["m-0", "m-1"]
    assert {m["attempt"] for m in again["received"]} == {2}
    assert {m["topic"] for m in again["received"]} == {topic}
    for m in again["received"]:  # ChangeInvisibleDuration answers a new handle (a new checkpoint)
        assert m["renewed_handle"] != m["receipt_handle"]
    # renewed then acked with the renewed handle: never delivered again
    assert proxy.client("receive", "--topic", topic, "--group", group, "--deadline", "4")["received"] == []


def test_5x_message_consumed_by_4x_client_and_4x_message_by_5x_consumer(proxy) -> None:
    topic = proxy.create_topic()
    group5 = proxy.create_group()
    proxy.client("produce", "--topic", topic, "--count", "3", "--prefix", "five", "--tag", "T5", "--keys", "key5")
    p = producer(proxy.server)
    try:
        for i in range(3):
            assert p.send_sync(message(topic, f"four-{i}", tags="T4", keys="key4", index=str(i))).status == 0
    finally:
        p.shutdown()
    expected = {f"five-{i}" for i in range(3)} | {f"four-{i}" for i in range(3)}
    got = proxy.client("receive", "--topic", topic, "--group", group5, "--expect", "6", "--ack")
    assert set(bodies(got)) == expected and len(bodies(got)) == 6
    four = {m["body"]: m for m in got["received"] if m["body"].startswith("four")}
    assert all(m["tag"] == "T4" and m["keys"] == ["key4"] and m["properties"] == {"index": b[-1]}
               for b, m in four.items())  # fmt: skip
    # the 4.x C++ push consumer reads the same topic in its own group: the 5.x messages with their tag and keys
    collector = Collector(prop="index")
    c = push_consumer(proxy.server, unique("G4"), topic, collector)
    try:
        collector.wait_bodies({b.encode() for b in expected}, what="the 4.x consumer to read all six")
    finally:
        c.shutdown()
    five = [g for g in collector.snapshot() if g.body.startswith(b"five")]
    assert {(g.tags, g.keys) for g in five} == {(b"T5", b"key5")}
    assert sorted(g.prop for g in five) == [b"0", b"1", b"2"]


def test_fifo_messages_of_a_group_are_delivered_in_order_one_at_a_time(proxy) -> None:
    topic = proxy.create_topic()
    group = proxy.create_group(consumeMessageOrderly=True)
    sent = proxy.client("produce", "--topic", topic, "--count", "5", "--group", "order-1")["sent"]
    assert [s["offset"] for s in sent] == [0, 1, 2, 3, 4]  # one message group, one queue
    got = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "5", "--ack")
    assert bodies(got) == [f"m-{i}" for i in range(5)]
    assert {m["group"] for m in got["received"]} == {"order-1"}


def test_fifo_unacked_message_is_redelivered_before_the_next_one(proxy) -> None:
    topic = proxy.create_topic()
    group = proxy.create_group(consumeMessageOrderly=True)
    proxy.client("produce", "--topic", topic, "--count", "2", "--group", "order-2")
    # m-0 in flight, not acked: m-1 (same message group) is held back, though two were asked for (m-0's invisible
    # time is well past the 2 s the client asks for: a busy machine's slow receive cannot see m-0 come back)
    first = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "2", "--invisible", "10",
                         "--deadline", "2", "--await-s", "1")  # fmt: skip
    assert bodies(first) == ["m-0"]
    # after the invisible time m-0 comes again first (attempt 2), and m-1 only once it is acked
    again = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "2", "--ack")
    assert bodies(again) == ["m-0", "m-1"]
    assert [m["attempt"] for m in again["received"]] == [2, 1]


def test_delay_message_is_received_only_after_its_delivery_time(proxy) -> None:
    topic, group = proxy.create_topic(), proxy.create_group()
    sent_at = time.time()
    proxy.client("produce", "--topic", topic, "--delay-ms", "2000")
    got = proxy.client("receive", "--topic", topic, "--group", group, "--ack")
    assert bodies(got) == ["m-0"]
    m = got["received"][0]
    assert m["received_at"] >= m["delivery_timestamp"] / 1000 >= sent_at + 1


def test_5x_producer_recalls_a_delay_message_which_is_never_delivered(proxy) -> None:
    topic, group = proxy.create_topic(queues=1), proxy.create_group()
    out = proxy.client("produce", "--topic", topic, "--count", "2", "--delay-ms", "3000", "--recall", "1")
    recalled, kept = out["sent"]
    assert recalled["recall_handle"] and out["recalled"] == [recalled["message_id"]]
    # one queue, one delivery time: the timer re-puts the slot in send order, so the first message received
    # would be the recalled one had it been delivered
    got = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "1", "--ack")
    assert bodies(got) == ["m-1"] and got["received"][0]["message_id"] == kept["message_id"]


def test_transactional_commit_is_delivered_and_rollback_is_not(proxy) -> None:
    topic, group = proxy.create_topic(), proxy.create_group()
    rolled = proxy.client("produce", "--topic", topic, "--tx", "rollback", "--prefix", "rolled")["sent"]
    committed = proxy.client("produce", "--topic", topic, "--tx", "commit", "--prefix", "committed")["sent"]
    assert rolled[0]["transaction_id"] and committed[0]["transaction_id"]
    got = proxy.client("receive", "--topic", topic, "--group", group, "--expect", "2", "--ack", "--deadline", "5")
    assert bodies(got) == ["committed-0"]
    assert got["received"][0]["message_id"] == committed[0]["message_id"]


def test_messages_in_flight_survive_a_broker_crash(tmp_path) -> None:
    """The pop checkpoints are in the CommitLog: a broker killed with un-acked messages redelivers them."""
    p = _start(tmp_path, "crash", flushConsumerOffsetInterval="100")
    try:
        topic, group = p.create_topic(), p.create_group()
        p.client("produce", "--topic", topic, "--count", "3")
        first = p.client("receive", "--topic", topic, "--group", group, "--expect", "3", "--invisible", "2")
        assert sorted(bodies(first)) == ["m-0", "m-1", "m-2"]
        offsets = p.server.store_dir / "config" / "consumerOffset.json"

        def popped_offsets_on_disk() -> bool:
            try:
                table = json.loads(offsets.read_text())["offsetTable"]
            except (OSError, ValueError, KeyError):
                return False
            return sum(table.get(f"{topic}@{group}", {}).values()) == 3

        wait_until(popped_offsets_on_disk, 10, what="the pop offsets to be persisted")
        p.server.kill()
        p.server.start()
        p.wait_proxy()
        again = p.client("receive", "--topic", topic, "--group", group, "--expect", "3", "--ack")
        assert sorted(bodies(again)) == ["m-0", "m-1", "m-2"]
        assert {m["attempt"] for m in again["received"]} == {2}  # revived from the checkpoints, not re-read
    finally:
        stop_servers([p.server])


def test_open_transaction_is_resolved_by_the_check_back_on_the_telemetry_stream(proxy) -> None:
    """A half message neither committed nor rolled back: the broker asks the producer (RecoverOrphanedTransaction-
    Command on its telemetry stream), the client's checker answers COMMIT, and the message is delivered."""
    topic, group = proxy.create_topic(), proxy.create_group()
    out = proxy.client("produce", "--topic", topic, "--tx", "check-commit", "--consume-group", group, "--expect", "1")
    assert out["checked"] == [out["sent"][0]["message_id"]]
    assert bodies(out) == ["m-0"]


def test_push_consumer_gets_settings_assignment_and_a_failed_message_again(proxy) -> None:
    """The 5.x PushConsumer waits for its settings (telemetry), finds its queues by QueryAssignment, and a message
    whose consumption fails comes again after the back-off the settings gave (ChangeInvisibleDuration)."""
    topic, group = proxy.create_topic(), proxy.create_group()
    proxy.client("produce", "--topic", topic, "--count", "3")
    out = proxy.client("push", "--topic", topic, "--group", group, "--expect", "3", "--fail-first")
    by_body: dict[str, list] = {}
    for d in out["deliveries"]:
        by_body.setdefault(d["body"], []).append((d["attempt"], d["ok"]))
    assert by_body == {f"m-{i}": [(1, False), (2, True)] for i in range(3)}


def test_a_taken_grpc_port_stops_mqlake_up_with_one_clear_line(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        # the other ports 0: the OS picks them (the HA port too)
        values = {**TEST_CONF, "storePathRootDir": str(tmp_path / "store"), "listenPort": "0",
                  "enableProxy": "true", "grpcServerPort": str(busy.getsockname()[1])}  # fmt: skip
        conf = tmp_path / "broker.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        out = subprocess.run([sys.executable, "-P", "-c", "from cli.main import main; main()", "up", "-c", str(conf),
                              "--namesrv-port", "0", "--log-level", "INFO"], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "grpcServerPort" in out.stderr, text
    assert "Traceback" not in text
    # the gRPC port is opened before the broker registers: a start it stops never reached the NameServer
    assert "NameServer started" in text and "registered broker" not in text and "Broker ready" not in text, text


def test_the_5x_client_over_tls_when_the_broker_enforces_it(tmp_path) -> None:
    cert, key = self_signed(tmp_path / "tls")
    tls = {"tls.server.mode": "enforcing", "tls.server.certPath": str(cert), "tls.server.keyPath": str(key)}
    p = _start(tmp_path, "tls", ssl_context=client_context(trust=cert), **tls)
    try:
        topic, group = p.create_topic(), p.create_group()
        sent = p.client("produce", "--topic", topic, trust=cert)["sent"]
        got = p.client("receive", "--topic", topic, "--group", group, "--ack", trust=cert)
        assert [m["message_id"] for m in got["received"]] == [sent[0]["message_id"]]
        with pytest.raises(AssertionError, match="rmq5_client produce exited"):  # a plaintext client gets nowhere
            p.client("produce", "--topic", topic)
    finally:
        stop_servers([p.server])
