"""The send path's run codec (store.format.runs) and wire codec (broker.remoting.send_codec), on both twins, against
bytes written out by hand from the layouts (reference §4.1 record, MessageDecoder.encodeMessages batch body) and
the CRC-32 check value, not against the encoder itself."""

from __future__ import annotations

import struct

import pytest

from broker.remoting import send_codec
from broker.remoting.codes import SerializeType
from broker.remoting.command import RemotingCommand
from store.format import batch_body, records, runs

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("twin")]

MAGIC_V1 = struct.unpack(">i", bytes.fromhex("DAA320A7"))[0]
CRC_123456789 = 0xCBF43926 & 0x7FFFFFFF  # the CRC-32 check value, as BODYCRC keeps 31 bits
BORN = ("10.0.0.7", 40001)
STORE = ("127.0.0.1", 10911)
CLUSTER_PROP = b"CLUSTER\x01DefaultCluster\x02"


def expected_record(topic: bytes, queue_id: int, body: bytes, props: bytes, flag: int, sys_flag: int, born_ts: int,
                    crc: int, reconsume: int = 0) -> bytes:  # fmt: skip
    """A V1 record of IPv4 hosts, field by field; offsets and the store time zero (the put lock fills them)."""
    fields = struct.pack(
        ">iiiiiqqiq4si q4si iqi",
        0, MAGIC_V1, crc, queue_id, flag, 0, 0, sys_flag, born_ts, bytes([10, 0, 0, 7]), 40001,
        0, bytes([127, 0, 0, 1]), 10911, reconsume, 0, len(body),
    )  # fmt: skip
    tail = body + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props
    total = len(fields) + len(tail)
    return struct.pack(">i", total) + fields[4:] + tail


def test_the_hand_written_layout_matches_the_reference_offsets():
    rec = expected_record(b"T", 1, b"123456789", b"", 0, 0, 5, CRC_123456789)
    assert struct.unpack_from(">i", rec, records.BODY_CRC_POS)[0] == CRC_123456789
    assert struct.unpack_from(">q", rec, records.BORN_TIMESTAMP_POS)[0] == 5
    assert struct.unpack_from(">i", rec, 84)[0] == 9 and rec[88:97] == b"123456789"


def test_encode_message_is_the_record_with_the_brokers_cluster():
    props = b"TAGS\x01TagA\x02UNIQ_KEY\x01ABC\x02"
    got = runs.encode_message("BenchTopic", 3, b"123456789", props, 7, 0x2, 1_700_000_000_123, BORN, STORE, 2,
                              "DefaultCluster")  # fmt: skip
    assert got == expected_record(b"BenchTopic", 3, b"123456789", props + CLUSTER_PROP, 7, 0x2, 1_700_000_000_123,
                                  CRC_123456789, reconsume=2)  # fmt: skip


@pytest.mark.parametrize(
    ("props", "stored"),
    [
        (b"CLUSTER\x01mine\x02", b"CLUSTER\x01mine\x02"),  # the client's own CLUSTER is kept
        (b"CLUSTER\x01\x02", b"CLUSTER\x01\x02" + CLUSTER_PROP),  # an empty value is no value (Java drops it)
        (b"", CLUSTER_PROP),
        (b"XCLUSTER\x01a\x02", b"XCLUSTER\x01a\x02" + CLUSTER_PROP),  # only a whole name counts
        # Java 4.9.8's clients leave the last separator off: it is closed before CLUSTER, so KEYS stays "k"
        (b"TAGS\x01TagA\x02KEYS\x01k", b"TAGS\x01TagA\x02KEYS\x01k\x02" + CLUSTER_PROP),
    ],
)
def test_encode_message_adds_cluster_only_when_absent(props: bytes, stored: bytes):
    got = runs.encode_message("T", 0, b"123456789", props, 0, 0, 1, BORN, STORE, 0, "DefaultCluster")
    assert got == expected_record(b"T", 0, b"123456789", stored, 0, 0, 1, CRC_123456789)


def test_encode_message_with_ipv6_hosts_sets_their_flags():
    got = runs.encode_message("T", 0, b"", b"", 0, 0, 1, ("::1", 5), ("::1", 6), 0, "C")
    (sys_flag,) = struct.unpack_from(">i", got, records.SYSFLAG_POS)
    assert sys_flag == records.BORNHOST_V6_FLAG | records.STOREHOSTADDRESS_V6_FLAG
    assert got[48:64] == bytes(15) + b"\x01" and struct.unpack_from(">i", got, 64)[0] == 5


def _item(flag: int, body: bytes, props: bytes) -> bytes:
    """One message of a SEND_BATCH_MESSAGE body written by hand: TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, BODYLENGTH,
    BODY, PROPERTIESLENGTH (short), PROPERTIES."""
    return struct.pack(">iiiii", 20 + len(body) + 2 + len(props), 0, 0, flag, len(body)) + body + \
        struct.pack(">h", len(props)) + props


def test_encode_batch_turns_each_item_into_its_record():
    body = (_item(1, b"123456789", b"KEYS\x01k1\x02") + _item(2, b"123456789", b"CLUSTER\x01own\x02")
            + _item(3, b"123456789", b"KEYS\x01k3"))  # Java 4.9.8's items end without a separator
    run, count = runs.encode_batch(body, "BatchTopic", 5, 0, 42, BORN, STORE, 0, "DefaultCluster", 1024)
    assert count == 3
    assert run == (
        expected_record(b"BatchTopic", 5, b"123456789", b"KEYS\x01k1\x02" + CLUSTER_PROP, 1, 0, 42, CRC_123456789)
        + expected_record(b"BatchTopic", 5, b"123456789", b"CLUSTER\x01own\x02", 2, 0, 42, CRC_123456789)
        + expected_record(b"BatchTopic", 5, b"123456789", b"KEYS\x01k3\x02" + CLUSTER_PROP, 3, 0, 42, CRC_123456789)
    )


def test_encode_batch_refuses_what_the_general_path_refuses():
    good = _item(0, b"123456789", b"")
    args = ("T", 0, 0, 1, BORN, STORE, 0, "DefaultCluster")
    with pytest.raises(batch_body.BatchBodyError, match="at offset 0"):
        runs.encode_batch(good[:-3], *args, 1024)  # truncated
    with pytest.raises(batch_body.BatchBodyError, match="size 99 differs"):
        runs.encode_batch(struct.pack(">i", 99) + good[4:], *args, 1024)
    with pytest.raises(batch_body.BatchBodyError, match="empty batch"):
        runs.encode_batch(b"", *args, 1024)
    with pytest.raises(runs.RunError, match="body of 9 bytes exceeds maxMessageSize 8"):
        runs.encode_batch(good + good, *args, 8)
    with pytest.raises(records.RecordEncodeError, match="properties"):  # no room left for CLUSTER
        runs.encode_batch(_item(0, b"x", b"a" * 32767), *args, 1024)


def test_write_run_copies_the_run_and_backfills_each_record():
    first = expected_record(b"T", 1, b"123456789", b"", 0, 0, 1, CRC_123456789)
    second = expected_record(b"T", 1, b"12", b"A\x01b\x02", 0, 0, 1, 7)
    run = first + second
    dest = bytearray(64 + len(run) + 16)
    runs.write_run(dest, 64, run, 2, 7, 1_000_064, 1_700_000_000_999, True)
    for at, size, queue_offset in ((64, len(first), 7), (64 + len(first), len(second), 8)):
        assert struct.unpack_from(">qq", dest, at + records.QUEUE_OFFSET_POS) == (queue_offset, 1_000_000 + at)
        assert struct.unpack_from(">q", dest, at + 56)[0] == 1_700_000_000_999  # STORETIMESTAMP of IPv4 hosts
        record = bytearray(dest[at : at + size])
        record[20:36] = bytes(16)
        record[56:64] = bytes(8)
        assert bytes(record) == run[at - 64 : at - 64 + size]  # nothing else differs
    assert dest[:64] == bytes(64) and dest[64 + len(run) :] == bytes(16)
    held = bytearray(len(run))
    runs.write_run(held, 0, run, 2, 7, 0, 1, False)  # a half message's: the queue does not advance
    assert struct.unpack_from(">q", held, len(first) + records.QUEUE_OFFSET_POS)[0] == 7


@pytest.mark.parametrize(("count", "pos"), [(1, 0), (3, 0), (0, 0), (2, 1)])
def test_write_run_refuses_a_run_that_does_not_add_up_and_writes_nothing(count: int, pos: int):
    run = expected_record(b"T", 1, b"x", b"", 0, 0, 1, 0) * 2
    dest = bytearray(len(run))
    with pytest.raises(runs.RunError):
        runs.write_run(dest, pos, run, count, 0, 0, 0, True)
    assert dest == bytearray(len(run))


def test_offset_msg_ids_name_each_record_of_the_run():
    a = expected_record(b"T", 1, b"x", b"", 0, 0, 1, 0)
    b = expected_record(b"T", 1, b"yy", b"", 0, 0, 1, 0)
    assert runs.offset_msg_ids(STORE, 4096, a + b, 2) == (
        "7F00000100002A9F0000000000001000," + f"7F00000100002A9F{4096 + len(a):016X}"
    )
    assert runs.offset_msg_ids(("::1", 1), 1, a, 1) == "0" * 31 + "1" + "00000001" + "0" * 15 + "1"


JAVA_V2 = {
    "a": "pg", "b": "BenchTopic", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1795000000000", "h": "7",
    "i": "TAGS\x01TagA\x02UNIQ_KEY\x01ABC\x02", "j": "0", "k": "false", "m": "false", "n": "broker-a",
}  # fmt: skip


def test_read_send_v2_reads_the_java_clients_header():
    assert send_codec.read_send_v2(JAVA_V2) == (
        "BenchTopic", 3, 0, 7, 1795000000000, b"TAGS\x01TagA\x02UNIQ_KEY\x01ABC\x02", 0, "ABC", False
    )
    lenient = {**JAVA_V2, "e": " +3", "j": "2", "i": "UNIQ_KEY\x01A\x02UNIQ_KEY\x01B\x02"}  # int() reads " +3"
    assert send_codec.read_send_v2(lenient) == (
        "BenchTopic", 3, 0, 7, 1795000000000, lenient["i"].encode(), 2, "B", False
    )


@pytest.mark.parametrize("sys_flag", ["4", "0"])  # the Java client's prepared bit, or none
def test_read_send_v2_reads_a_half_message(sys_flag: str):
    """A transaction's half message is the same common shape, said by its last TRAN_MSG being true."""
    props = "TRAN_MSG\x01false\x02PGROUP\x01pg\x02UNIQ_KEY\x01H\x02TRAN_MSG\x01true\x02"
    ext = {**JAVA_V2, "f": sys_flag, "i": props}
    fields = send_codec.read_send_v2(ext)
    assert fields == ("BenchTopic", 3, int(sys_flag), 7, 1795000000000, props.encode(), 0, "H", True)


@pytest.mark.parametrize(
    "change",
    [
        {"m": "true"}, {"m": "1"}, {"k": "true"},  # a batch, unit mode: the general path
        {"e": "-1"},  # the broker picks the queue
        {"f": "4"}, {"f": "8"},  # a prepared or committed transaction's sysFlag without TRAN_MSG=true
        {"i": "TRAN_MSG\x01false\x02"}, {"i": "TRAN_MSG\x01true\x02TRAN_MSG\x01TRUE\x02"},  # not a half message
        {"i": "TRAN_MSG\x01true\x02DELAY\x013\x02"},  # a half message that asks for a delay
        {"i": "DELAY\x013\x02"}, {"i": "TIMER_DELAY_SEC\x0110\x02"},
        {"i": "TAGS\x01a"},  # CLUSTER would not be a segment of its own
        {"d": None}, {"e": "three"}, {"topic": "V1Topic"},  # missing or bad fields, a V1 header
        {"batch": "1"},  # V1's batch flag, which the general path also reads
    ],
)  # fmt: skip
def test_read_send_v2_leaves_anything_unusual_to_the_general_path(change: dict):
    ext = {**JAVA_V2, **change}
    for k, v in change.items():
        if v is None:
            del ext[k]
    assert send_codec.read_send_v2(ext) is None


def test_send_reply_is_the_success_frame():
    frame = send_codec.send_reply(42, SerializeType.JSON, "7F00000100002A9F0000000000001000", 3, 17, "ABC",
                                  "DefaultRegion", True)  # fmt: skip
    header = (
        b'{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000001000","queueId":"3","queueOffset":"17",'
        b'"transactionId":"ABC","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"PYTHON",'
        b'"opaque":42,"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    assert frame == struct.pack(">ii", 4 + len(header), len(header)) + header


@pytest.mark.parametrize("serialize", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_send_reply_escapes_and_binary_headers_decode_to_the_same_answer(serialize: SerializeType):
    frame = send_codec.send_reply(-5, serialize, "a,b", 0, 1 << 40, None, 'r"\u00e9\n', False)
    cmd = RemotingCommand.decode(frame[4:])
    assert (cmd.code, cmd.opaque, cmd.is_response, cmd.serialize_type) == (0, -5, True, serialize)
    assert cmd.ext_fields == {"msgId": "a,b", "queueId": "0", "queueOffset": str(1 << 40), "MSG_REGION": 'r"\u00e9\n',
                              "TRACE_ON": "false"}  # fmt: skip
