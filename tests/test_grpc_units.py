"""The gRPC endpoint's pure parts: receipt handles in RocketMQ's layout, v2 message <-> record properties, and the
stubs generated at install time (names on the wire as the 5.x clients call them)."""

from __future__ import annotations

import hashlib
import zlib

import pytest

from broker.proxy import convert, receipt
from broker.proxy.status import ProxyError
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from store.format import records

pytestmark = pytest.mark.unit

# ReceiptHandle.encode of RocketMQ 5 for: startOffset 7, retrieveTime 1700000000123, invisibleTime 30000,
# reviveQueueId 0, a retry topic ("1"), broker-a, queue 3, offset 42, commitLogOffset 123456 (space-separated).
JAVA_HANDLE = "7 1700000000123 30000 0 1 broker-a 3 42 123456"


def test_receipt_handle_layout_is_rocketmqs() -> None:
    h = receipt.decode(JAVA_HANDLE, "broker-a")
    assert (h.ck_offset, h.pop_time, h.invisible_ms, h.revive_qid, h.topic_type) == (7, 1700000000123, 30000, 0, 1)
    assert (h.broker_name, h.queue_id, h.queue_offset, h.commitlog_offset) == ("broker-a", 3, 42, 123456)
    assert h.next_visible == 1700000030123
    assert h.encode() == JAVA_HANDLE


@pytest.mark.parametrize(("text", "why"), [
    ("", "expected 9 fields"),
    ("7 1700000000123 30000 0 1 broker-a 3 42", "expected 9 fields"),
    ("7 x 30000 0 1 broker-a 3 42 1", "not a number"),
    ("7 1 30000 0 5 broker-a 3 42 1", "out of range"),
    ("7 1 30000 0 1 broker-b 3 42 1", "from broker broker-b"),
])  # fmt: skip
def test_bad_receipt_handles_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ProxyError) as e:
        receipt.decode(text, "broker-a")
    assert e.value.code == pb.INVALID_RECEIPT_HANDLE and why in e.value.message


def _message(kind: int = pb.NORMAL, body: bytes = b"hello", **props: str) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="T"), body=body, user_properties=props)
    m.system_properties.message_id = "01AABBCC"
    m.system_properties.message_type = kind  # type: ignore[assignment]
    return m


def test_send_properties_map_the_system_properties_as_the_proxy_does() -> None:
    m = _message(pb.FIFO, color="red")
    m.system_properties.tag = "TagA"
    m.system_properties.keys.extend(["k1", "k2"])
    m.system_properties.message_group = "g1"
    props, sys_flag = convert.send_properties(m, 1024)
    assert props == {"color": "red", "TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "01AABBCC", "__SHARDINGKEY": "g1"}
    assert sys_flag == 0
    d = _message(pb.DELAY)
    d.system_properties.delivery_timestamp.FromMilliseconds(1700000000123)
    assert convert.send_properties(d, 1024)[0]["TIMER_DELIVER_MS"] == "1700000000123"
    props, sys_flag = convert.send_properties(_message(pb.TRANSACTION), 1024)
    assert (props["TRAN_MSG"], props["PGROUP"], sys_flag) == ("true", "T", records.TRANSACTION_PREPARED_TYPE)


@pytest.mark.parametrize(("message", "code"), [
    (_message(body=b""), pb.MESSAGE_BODY_EMPTY),
    (_message(body=b"x" * 1025), pb.MESSAGE_BODY_TOO_LARGE),
    (_message(DELAY="3"), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (_message(**{"a\x01b": "v"}), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (_message(pb.FIFO), pb.ILLEGAL_MESSAGE_GROUP),
    (_message(pb.DELAY), pb.ILLEGAL_DELIVERY_TIME),
    (_message(pb.LITE), pb.UNSUPPORTED),
])  # fmt: skip
def test_bad_messages_are_refused_with_their_code(message: pb.Message, code: int) -> None:
    with pytest.raises(ProxyError) as e:
        convert.send_properties(message, 1024)
    assert e.value.code == code


def test_a_group_on_a_normal_message_conflicts_with_its_type() -> None:
    m = _message(pb.NORMAL)
    m.system_properties.message_group = "g"
    with pytest.raises(ProxyError) as e:
        convert.send_properties(m, 1024)
    assert e.value.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


def test_a_retried_record_is_shown_under_its_topic_with_body_digest_and_attempt() -> None:
    from store.format import properties as P

    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "01AABBCC", "RETRY_TOPIC": "Orders", "CLUSTER": "c",
             "color": "red", "__SHARDINGKEY": "g1"}  # fmt: skip
    rec = records.MessageRecord(topic="%RETRY%G", queue_id=0, body=b"hello", properties=P.encode_properties(props),
                                reconsume_times=2, born_timestamp=1700000000123, store_timestamp=1700000000456)
    m = convert.to_message(rec, "handle", 30_000)
    sp = m.system_properties
    # every property but RocketMQ's system ones is a user property, the message group too, as its proxy shows them
    assert m.topic.name == "Orders" and dict(m.user_properties) == {"color": "red", "__SHARDINGKEY": "g1"}
    assert (sp.tag, list(sp.keys), sp.message_id, sp.message_group) == ("TagA", ["k1", "k2"], "01AABBCC", "g1")
    assert sp.message_type == pb.FIFO and sp.delivery_attempt == 3 and sp.receipt_handle == "handle"
    md5_hello = "5D41402ABC4B2A76B9719D911017C592"
    assert (sp.body_digest.type, sp.body_digest.checksum) == (pb.MD5, md5_hello)
    assert sp.born_timestamp.ToMilliseconds() == 1700000000123 and sp.invisible_duration.seconds == 30


@pytest.mark.parametrize(("value", "kind"), [("true", pb.TRANSACTION), ("TRUE", pb.TRANSACTION), ("yes", pb.NORMAL)])
def test_a_record_is_a_transaction_message_as_boolean_parse_boolean_reads_tran_msg(value: str, kind: int) -> None:
    assert convert.message_type({"TRAN_MSG": value}) == kind


def _digested(kind: int, checksum: str, body: bytes = b"hello") -> pb.Message:
    m = _message(body=body)
    m.system_properties.body_digest.CopyFrom(pb.Digest(type=kind, checksum=checksum))  # type: ignore[arg-type]
    return m


@pytest.mark.parametrize(("kind", "checksum"), [
    (pb.CRC32, "3610A686"), (pb.CRC32, "3610a686"), (pb.CRC32, "907060870"),  # hex either case, decimal
    (pb.MD5, "5D41402ABC4B2A76B9719D911017C592"), (pb.MD5, "5d41402abc4b2a76b9719d911017c592"),
    (pb.SHA1, "AAF4C61DDCC5E8A2DABEDE0F3B482CD9AEA9434D"), (pb.DIGEST_TYPE_UNSPECIFIED, ""),
])  # fmt: skip
def test_a_producers_body_digest_of_each_type_and_form_is_accepted(kind: int, checksum: str) -> None:
    assert convert.send_properties(_digested(kind, checksum), 1024)[0]["UNIQ_KEY"] == "01AABBCC"


def test_a_crc32_without_leading_zeros_is_accepted_as_the_java_client_writes_it() -> None:
    body = next(bytes([i]) * 3 for i in range(256) if zlib.crc32(bytes([i]) * 3) < 0x10000000)
    short = format(zlib.crc32(body), "X")
    assert len(short) < 8
    convert.send_properties(_digested(pb.CRC32, short, body), 1024)


@pytest.mark.parametrize(("kind", "checksum"), [
    (pb.CRC32, "3610A687"), (pb.CRC32, "0x3610A686"), (pb.CRC32, ""), (pb.MD5, "5D41402ABC4B2A76B9719D911017C593"),
    (pb.SHA1, "5D41402ABC4B2A76B9719D911017C592"), (pb.MD5, "not hex"),
])  # fmt: skip
def test_a_body_digest_mismatch_is_refused_as_corrupted(kind: int, checksum: str) -> None:
    with pytest.raises(ProxyError) as e:
        convert.send_properties(_digested(kind, checksum), 1024)
    assert e.value.code == pb.MESSAGE_CORRUPTED and "5-byte body" in e.value.message


def test_the_consumers_digest_is_md5_upper_hex_for_every_body() -> None:
    for body in (b"", b"\x00" * 64, bytes(range(256)) * 4):
        d = convert.body_digest(body)
        assert (d.type, d.checksum) == (pb.MD5, hashlib.md5(body).hexdigest().upper())


# Guava 32's Hashing.consistentHash(key.hashCode(), n) (RocketMQ 5.4.0's proxy), for n in 1, 2, 3, 4, 8, 16, 100
GUAVA_CONSISTENT_HASH = {
    "order-1": [0, 0, 0, 3, 3, 3, 3], "g1": [0, 0, 0, 0, 6, 9, 41], "": [0, 0, 0, 0, 0, 0, 0],
    "a": [0, 0, 0, 0, 0, 0, 29], "message-group-with-a-long-name": [0, 1, 2, 2, 7, 7, 92],
    "\u4e2d\u6587": [0, 0, 0, 3, 3, 3, 80], "x": [0, 1, 1, 1, 4, 12, 36],
}  # fmt: skip


@pytest.mark.parametrize("group", sorted(GUAVA_CONSISTENT_HASH))
def test_a_message_group_goes_to_the_queue_rocketmqs_proxy_picks(group: str) -> None:
    got = [convert.message_group_queue(group, n) for n in (1, 2, 3, 4, 8, 16, 100)]
    assert got == GUAVA_CONSISTENT_HASH[group]


def test_generated_stubs_keep_the_protocols_names() -> None:
    service = svc.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == "apache.rocketmq.v2.MessagingService"
    assert {"QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "ReceiveMessage", "AckMessage",
            "ForwardMessageToDeadLetterQueue", "EndTransaction", "Telemetry", "NotifyClientTermination",
            "ChangeInvisibleDuration"} <= {m.name for m in service.methods}  # fmt: skip
    assert pb.Code.Value("INVALID_RECEIPT_HANDLE") == 40013 and pb.Code.Value("MESSAGE_NOT_FOUND") == 40401


def test_namespaces_map_names_as_rocketmq_5s_namespace_util() -> None:
    from broker.proxy import namespaces

    def wrap(name: str, ns: str = "ns1") -> str:
        return namespaces.wrap(pb.Resource(name=name, resource_namespace=ns))

    assert [wrap("T"), wrap("T", ""), wrap("ns1%T"), wrap("%RETRY%G"), wrap("%DLQ%G"), wrap("%RETRY%ns1%G")] == [
        "ns1%T", "T", "ns1%T", "%RETRY%ns1%G", "%DLQ%ns1%G", "%RETRY%ns1%G"]  # fmt: skip
    assert wrap("rmq_sys_REVIVE_LOG_c") == "rmq_sys_REVIVE_LOG_c" and wrap("TBW102") == "TBW102"  # system: as is
    assert namespaces.resource("ns1%T") == pb.Resource(name="T", resource_namespace="ns1")
    assert namespaces.resource("%RETRY%ns1%G") == pb.Resource(name="%RETRY%G", resource_namespace="ns1")
    assert namespaces.resource("T") == pb.Resource(name="T")
    assert namespaces.resource("%RETRY%G") == pb.Resource(name="%RETRY%G")
