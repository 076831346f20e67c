"""Byte-compatibility tests for store/format/ against values computed independently of it.

The edge-case vectors come from Apache RocketMQ's own classes, run once per session from the fetched 4.9.7 jars
(tests/java/vectors/FormatVectors.java, the ``rmq`` fixture's "format" part; the V2 record from the 5.4.0 store):
String.hashCode through IndexFile.indexKeyHashMethod and tagsString2tagsCode, UtilAll.crc32, MessageDecoder's
record encoder, message ID and properties codec, ConsumeQueue.putMessagePositionInfo, IndexFile, StoreCheckpoint,
UtilAll's file names and MessageClientIDSetter's own UNIQ_KEY code. Tests reading them need the JVM (integration);
the others build their expectations by hand with ``struct``/``zlib``/``time``, never through store/format (unit).
The local-time vectors run in zones read from the pinned ``tzdata`` package, not the host's tz database.
"""

from __future__ import annotations

import random
import struct
import time
import zlib

import pytest

from store.format import delay, hashing, msgid, properties, records, units
from tests.fixtures_vectors import java_string
from tests.helpers import local_zone

# Every codec test runs on both twins (store.format.native): the pure-Python reference and the compiled one.
pytestmark = pytest.mark.usefixtures("twin")


@pytest.fixture
def fv(rmq) -> dict:
    """The edge-case vectors RocketMQ's classes computed (FormatVectors.java), each string decoded."""
    v = rmq["format"]
    return {**v, "string_hash": [{**h, "s": java_string(h["utf16"])} for h in v["string_hash"]]}


RECORD_NAMES = ("ipv4", "ipv6_store", "ipv6_both", "committed_tx_utf8", "v2_long_topic")


@pytest.fixture
def recs(fv, stored) -> dict[str, dict]:
    """Records by name: MessageDecoder.encode's, and the V2 record the 5.4.0 store wrote for a long topic."""
    (v2,) = [r for r in stored if r["name"] == "v2_long_topic"]
    raw = bytes.fromhex(v2["hex"])
    v2 = {**v2, "prepared_transaction_offset": 0, "total_size": v2["size"],
          "magic": struct.unpack_from(">i", raw, 4)[0], "body_crc": struct.unpack_from(">i", raw, 8)[0]}  # fmt: skip
    return {r["name"]: r for r in fv["records"]} | {"v2_long_topic": v2}


def _record_from_vector(r: dict, **overrides) -> records.MessageRecord:
    kw = dict(
        topic=r["topic"],
        queue_id=r["queue_id"],
        body=r["body"].encode("utf-8"),
        properties=r["properties"].encode("utf-8"),
        flag=r["flag"],
        sys_flag=r["sys_flag"],
        born_timestamp=r["born_timestamp"],
        born_host=tuple(r["born_host"]),
        store_timestamp=r["store_timestamp"],
        store_host=tuple(r["store_host"]),
        reconsume_times=r["reconsume_times"],
        prepared_transaction_offset=r["prepared_transaction_offset"],
        queue_offset=r["queue_offset"],
        physical_offset=r["physical_offset"],
    )
    kw.update(overrides)
    return records.MessageRecord(**kw)


# =====================================================================================================
# Java String.hashCode, Math.abs, tagsCode
# =====================================================================================================


@pytest.mark.integration
def test_java_string_hash_matches_java(fv):
    for vec in fv["string_hash"]:
        assert hashing.java_string_hash(vec["s"]) == vec["hash"], vec["utf16"][:40]


@pytest.mark.integration
def test_index_key_hash_matches_java_abs_semantics(fv):
    for vec in fv["string_hash"]:
        assert hashing.index_key_hash(vec["s"]) == vec["index_key_hash"], vec["utf16"][:40]
        assert 0 <= hashing.index_key_hash(vec["s"]) <= 0x7FFFFFFF


@pytest.mark.integration
def test_index_key_hash_of_integer_min_value_is_zero(fv):
    (vec,) = [v for v in fv["string_hash"] if v["s"] == "polygenelubricants"]
    assert vec["hash"] == fv["integer_min_value"] == -(2**31)
    assert vec["math_abs"] == -(2**31)  # Java's Math.abs leaves MIN_VALUE negative ...
    assert vec["index_key_hash"] == 0  # ... so IndexFile forces it to 0
    assert hashing.java_string_hash("polygenelubricants") == -(2**31)
    assert hashing.index_key_hash("polygenelubricants") == 0


@pytest.mark.integration
def test_vectors_cover_the_interesting_cases(fv):
    units = {v["s"]: v["utf16_units"] for v in fv["string_hash"]}
    assert units["\U0001f600"] == 2 and units["a\U0001f600b"] == 4 and units["\U0001d11emusic"] == 7
    assert any(v["hash"] < 0 for v in fv["string_hash"])
    assert any(v["utf16_units"] > 256 and not v["s"].isascii() for v in fv["string_hash"])
    assert any(v["utf16_units"] > 256 and v["s"].isascii() for v in fv["string_hash"])


@pytest.mark.integration
def test_tags_code(fv):
    assert hashing.tags_code(None) == 0
    assert hashing.tags_code("") == 0
    for vec in fv["string_hash"]:
        if vec["s"]:
            assert hashing.tags_code(vec["s"]) == vec["tags_code"] == vec["hash"]  # sign-extended int
    assert hashing.tags_code("TopicTest") == -1902610879


# =====================================================================================================
# CRC
# =====================================================================================================


@pytest.mark.integration
def test_body_crc32_matches_masked_java_crc32(fv):
    for vec in fv["crc32"]:
        data = bytes.fromhex(vec["hex"])
        assert hashing.body_crc32(data) == vec["masked"] == vec["crc32"] & 0x7FFFFFFF, vec["name"]
        assert hashing.body_crc32(bytearray(data)) == vec["masked"]
        assert hashing.body_crc32(memoryview(data)) == vec["masked"]


@pytest.mark.integration
def test_crc32_standard_check_value(fv):
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert hashing.body_crc32(b"123456789") == 0x4BF43926
    (vec,) = [v for v in fv["crc32"] if v["name"] == "check_123456789"]
    assert vec["crc32"] == 0xCBF43926 and vec["masked"] == 0x4BF43926


@pytest.mark.integration
def test_crc_vectors_have_the_intended_inputs(fv):
    by_name = {v["name"]: bytes.fromhex(v["hex"]) for v in fv["crc32"]}
    assert by_name["empty"] == b""
    assert by_name["bytes_0_to_255"] == bytes(range(256))
    assert by_name["pattern_1KiB_(i*31+7)&0xFF"] == bytes((i * 31 + 7) & 0xFF for i in range(1024))


# =====================================================================================================
# CommitLog records
# =====================================================================================================


@pytest.mark.integration
@pytest.mark.parametrize("name", RECORD_NAMES)
def test_encode_record_equals_java_bytes(name, recs):
    r = recs[name]
    encoded = records.encode_record(_record_from_vector(r, sys_flag=r["sys_flag"] & ~0x30))  # host bits derived
    assert encoded.hex() == r["hex"]
    assert len(encoded) == r["total_size"]


@pytest.mark.integration
@pytest.mark.parametrize("name", RECORD_NAMES)
def test_decode_record_round_trips_java_bytes(name, recs):
    r = recs[name]
    raw = bytes.fromhex(r["hex"])
    rec = records.decode_record(raw, check_crc=True)
    assert rec.topic == r["topic"]
    assert rec.queue_id == r["queue_id"]
    assert rec.body == r["body"].encode("utf-8")
    assert rec.properties == r["properties"].encode("utf-8")
    assert rec.flag == r["flag"]
    assert rec.sys_flag == r["sys_flag"]
    assert rec.born_timestamp == r["born_timestamp"]
    assert rec.born_host == tuple(r["born_host"])
    assert rec.store_timestamp == r["store_timestamp"]
    assert rec.store_host == tuple(r["store_host"])
    assert rec.reconsume_times == r["reconsume_times"]
    assert rec.prepared_transaction_offset == r["prepared_transaction_offset"]
    assert rec.queue_offset == r["queue_offset"]
    assert rec.physical_offset == r["physical_offset"]
    assert rec.body_crc == r["body_crc"]
    assert rec.magic == r["magic"]
    assert rec.total_size == r["total_size"] == len(raw)
    assert bytes(records.encode_record(rec)) == raw
    topic_len = len(r["topic"].encode("utf-8"))
    assert records.record_length(rec.sys_flag, len(rec.body), topic_len, len(rec.properties), rec.magic) == len(raw)


@pytest.mark.integration
def test_java_records_have_expected_flags_and_magic(recs):
    assert set(recs) == set(RECORD_NAMES)
    assert recs["ipv4"]["sys_flag"] == 0
    assert recs["ipv6_store"]["sys_flag"] == 0x20
    assert recs["ipv6_both"]["sys_flag"] == 0x30
    assert recs["committed_tx_utf8"]["sys_flag"] == 0x8
    v2 = struct.unpack(">i", bytes.fromhex("DAA320AB"))[0]
    assert recs["v2_long_topic"]["magic"] == records.MESSAGE_MAGIC_V2 == v2
    assert recs["ipv4"]["magic"] == records.MESSAGE_MAGIC_V1 == struct.unpack(">i", bytes.fromhex("DAA320A7"))[0]
    assert len(recs["v2_long_topic"]["topic"].encode()) == 154 > 127  # the 5.4.0 store chose V2 for it


@pytest.mark.integration
def test_ipv4_fixed_positions(recs):
    raw = bytes.fromhex(recs["ipv4"]["hex"])
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
    assert raw[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", raw, 84)[0] == len(b"hello world")  # BODYLENGTH at 84
    assert raw[88 : 88 + 11] == b"hello world"
    assert struct.unpack_from(">q", raw, 56)[0] == 1700000000123  # STORETIMESTAMP at 56
    assert struct.unpack_from(">q", raw, 40)[0] == 1700000000000  # BORNTIMESTAMP at 40
    assert struct.unpack_from(">q", raw, 28)[0] == 1024  # PHYSICALOFFSET at 28
    assert records.store_timestamp_position(0) == 56
    assert records.read_store_timestamp(raw, 0) == 1700000000123
    assert records.read_physical_offset(raw, 0) == 1024
    assert records.step(raw).end == len(raw)  # TOTALSIZE and MAGICCODE read back by the walk
    props_len = len(recs["ipv4"]["properties"].encode())
    assert records.record_length(0, 11, 9, props_len, records.MESSAGE_MAGIC_V1) == len(raw) == 131


@pytest.mark.integration
def test_ipv6_born_host_shifts_store_timestamp(recs):
    raw = bytes.fromhex(recs["ipv6_both"]["hex"])
    assert records.store_timestamp_position(0x30) == 48 + 20 == 68
    assert struct.unpack_from(">q", raw, 68)[0] == 1700000000123
    assert records.read_store_timestamp(raw, 0) == 1700000000123


@pytest.mark.integration
def test_record_assembled_with_struct_pack_equals_codec_and_java(recs):
    topic = b"TopicTest"
    body = b"hello world"
    props = b"KEYS\x01k1 k2\x02TAGS\x01tagA"  # 4.9.x's MessageDecoder writes no separator after the last entry
    crc = zlib.crc32(body) & 0x7FFFFFFF
    tail = struct.pack(">i", len(body)) + body + struct.pack(">b", len(topic)) + topic
    tail += struct.pack(">h", len(props)) + props
    head_len = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8
    total = head_len + len(tail)
    raw = (
        struct.pack(">i", total)
        + struct.pack(">I", 0xDAA320A7)
        + struct.pack(">i", crc)
        + struct.pack(">i", 3)  # queueId
        + struct.pack(">i", 7)  # flag
        + struct.pack(">q", 42)  # queueOffset
        + struct.pack(">q", 1024)  # physicalOffset
        + struct.pack(">i", 0)  # sysFlag
        + struct.pack(">q", 1700000000000)  # bornTimestamp
        + bytes([10, 0, 0, 1])
        + struct.pack(">i", 1234)
        + struct.pack(">q", 1700000000123)  # storeTimestamp
        + bytes([10, 0, 0, 2])
        + struct.pack(">i", 10911)
        + struct.pack(">i", 1)  # reconsumeTimes
        + struct.pack(">q", 0)  # preparedTransactionOffset
        + tail
    )
    assert len(raw) == total == 131
    assert raw.hex() == recs["ipv4"]["hex"]
    assert bytes(records.encode_record(_record_from_vector(recs["ipv4"]))) == raw


@pytest.mark.integration
def test_v2_chosen_automatically_for_long_topics(recs):
    r = recs["v2_long_topic"]
    rec = _record_from_vector(r)
    assert rec.magic is None
    assert records.encode_record(rec).hex() == r["hex"]
    assert records.magic_for_topic(b"x" * 127) == records.MESSAGE_MAGIC_V1
    assert records.magic_for_topic(b"x" * 128) == records.MESSAGE_MAGIC_V2
    with pytest.raises(ValueError):
        records.encode_record(_record_from_vector(r, magic=records.MESSAGE_MAGIC_V1))


@pytest.mark.integration
def test_127_byte_topic_stays_v1_with_one_byte_length(recs):
    rec = _record_from_vector(recs["ipv4"], topic="t" * 127)
    raw = bytes(records.encode_record(rec))
    assert raw[4:8] == bytes.fromhex("DAA320A7")
    assert raw[88 + 11] == 127
    assert records.decode_record(raw).topic == "t" * 127


@pytest.mark.integration
def test_encode_rejects_oversized_properties(recs):
    with pytest.raises(ValueError):
        records.encode_record(_record_from_vector(recs["ipv4"], properties=b"a" * 32768))


@pytest.mark.integration
def test_patch_record_back_fills_like_java(recs):
    for name in ("ipv4", "ipv6_both"):
        r = recs[name]
        unpatched = _record_from_vector(r, queue_offset=0, physical_offset=0, store_timestamp=0)
        buf = bytearray(100) + records.encode_record(unpatched)
        records.patch_record(buf, 100, r["queue_offset"], r["physical_offset"], r["store_timestamp"])
        assert buf[100:].hex() == r["hex"]


@pytest.mark.integration
def test_decode_record_at_nonzero_position(recs):
    raw = bytes.fromhex(recs["ipv4"]["hex"])
    buf = bytes(37) + raw + bytes.fromhex(recs["ipv6_store"]["hex"])
    assert records.decode_record(buf, 37).total_size == len(raw)
    assert records.decode_record(buf, 37 + len(raw)).store_host == ("2001:db8::2", 10911)


# =====================================================================================================
# Blank record, check_record, errors
# =====================================================================================================


@pytest.mark.integration
def test_encode_blank(rmq):
    """The BLANK record RocketMQ's CommitLog wrote at the end of a segment a message did not fit in."""
    size = rmq["commitlog_segment"] - rmq["blank"]["position"]
    blank = records.encode_blank(size)
    assert len(blank) == 8 == records.END_FILE_MIN_BLANK_LENGTH
    assert blank.hex() == rmq["blank"]["hex"]
    assert blank == struct.pack(">i", size) + bytes.fromhex("CBD43194")
    res = records.check_record(blank + bytes(size - 8), 0)
    assert res.ok and res.blank and res.size == 0
    with pytest.raises(records.RecordError):
        records.decode_record(blank + bytes(size - 8))


@pytest.mark.integration
def test_check_record_dispatch_request_from_java_record(recs):
    raw = bytes.fromhex(recs["ipv4"]["hex"])
    res = records.check_record(raw, 0)
    assert res.ok and not res.blank and res.size == len(raw)
    req = res.request
    assert req.topic == "TopicTest"
    assert req.queue_id == 3
    assert req.commitlog_offset == 1024
    assert req.msg_size == len(raw)
    assert req.tags_code == 3552231  # "tagA".hashCode() from Java
    assert req.store_timestamp == 1700000000123
    assert req.queue_offset == 42
    assert req.keys == "k1 k2"
    assert req.uniq_key is None
    assert req.sys_flag == 0
    assert req.prepared_transaction_offset == 0
    assert req.consumable is True
    assert records.index_keys(req) == ["k1", "k2"]  # RocketMQ 4.x's rule
    assert records.index_keys(req, "tagA") == ["k1", "k2", "T#tagA"]  # 5.x's adds the tag key last
    tx = records.check_record(bytes.fromhex(recs["committed_tx_utf8"]["hex"]), 0).request
    assert tx.prepared_transaction_offset == 1024
    assert records.transaction_type(tx.sys_flag) == records.TRANSACTION_COMMIT_TYPE
    assert tx.consumable is True  # a committed transaction's record gets a unit
    for half in (records.TRANSACTION_PREPARED_TYPE, records.TRANSACTION_ROLLBACK_TYPE):
        flagged = bytearray(raw)
        struct.pack_into(">i", flagged, 36, half)  # SYSFLAG at 36 (its CRC covers the body only)
        flagged_req = records.check_record(bytes(flagged), 0).request
        assert flagged_req.consumable is False
        rolled_back = half == records.TRANSACTION_ROLLBACK_TYPE  # a rollback is not indexed, by either rule
        assert records.index_keys(flagged_req, "tagA") == ([] if rolled_back else ["k1", "k2", "T#tagA"])
    assert tx.uniq_key == "0A0000010000000000000000000000"
    assert tx.tags_code == hashing.java_string_hash("\u6807\u7b7e")


@pytest.mark.unit
def test_random_bytes_are_rejected():
    rng = random.Random(20240601)
    for _ in range(200):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
        res = records.check_record(data, 0)
        assert not res.ok and res.reason
        with pytest.raises(records.RecordError):
            records.decode_record(data, 0)


@pytest.mark.unit
def test_zeros_are_not_a_record():
    res = records.check_record(bytes(256), 0)
    assert not res.ok and not res.blank


@pytest.mark.integration
def test_truncated_record_is_rejected(recs):
    raw = bytes.fromhex(recs["ipv4"]["hex"])
    for cut in (1, 10, 47, 48, 90, len(raw) - 1):
        res = records.check_record(raw[:cut], 0)
        assert not res.ok and res.reason, cut
        with pytest.raises(records.RecordError):
            records.decode_record(raw[:cut])


@pytest.mark.integration
def test_size_field_not_matching_contents_is_rejected(recs):
    raw = bytearray.fromhex(recs["ipv4"]["hex"]) + bytes(16)
    struct.pack_into(">i", raw, 0, len(raw))  # claims 16 more bytes than its fields add up to
    res = records.check_record(raw, 0)
    assert not res.ok and res.reason
    with pytest.raises(records.RecordError):
        records.decode_record(raw)


@pytest.mark.integration
def test_flipped_body_byte_fails_crc_check(recs):
    raw = bytearray.fromhex(recs["ipv4"]["hex"])
    raw[88] ^= 0x01  # first body byte
    res = records.check_record(raw, 0, check_crc=True)
    assert not res.ok and res.size == -1 and "CRC" in res.reason
    with pytest.raises(records.RecordError) as ei:
        records.decode_record(raw, check_crc=True)
    assert "CRC" in ei.value.reason
    assert records.decode_record(raw, check_crc=False).body == b"iello world"
    assert records.check_record(raw, 0, check_crc=False).ok


@pytest.mark.integration
def test_record_error_names_source_and_offset(recs):
    raw = bytearray(64) + bytearray.fromhex(recs["ipv4"]["hex"])
    raw[64 + 88] ^= 0xFF
    with pytest.raises(records.RecordError) as ei:
        records.decode_record(raw, 64, check_crc=True, source="commitlog/00000000000000000000")
    msg = str(ei.value)
    assert "commitlog/00000000000000000000" in msg and "64" in msg
    assert ei.value.position == 64 and ei.value.source == "commitlog/00000000000000000000"
    assert isinstance(ei.value, ValueError)
    with pytest.raises(records.RecordError) as ei:
        records.decode_record(b"\x00" * 10, 0, source="seg-A")
    assert "seg-A" in str(ei.value) and "offset 0" in str(ei.value)


# =====================================================================================================
# Properties string
# =====================================================================================================


@pytest.mark.integration
def test_encode_properties_matches_java_serialiser(fv):
    ser = fv["properties_serialize"]
    props = {k: v for k, v in ser["entries"]}
    props_with_null = dict(props)
    props_with_null[ser["null_key"]] = None
    for p in (props, props_with_null):
        out = properties.encode_properties(p)
        # 4.9.x writes no separator after the last entry; mqlake writes it, as 5.x does
        assert out == ser["string"].encode("utf-8") + b"\x02"
        assert out.hex() == ser["utf8_hex"] + "02"
        assert properties.decode_properties(out) == properties.decode_properties(ser["string"]) == props
        assert out.count(b"\x01") == out.count(b"\x02") == 3


@pytest.mark.integration
def test_decode_properties_matches_java_parser(fv):
    for vec in fv["properties_parse"]:
        assert properties.decode_properties(vec["input"]) == vec["map"], vec
        assert properties.decode_properties(vec["input"].encode("utf-8")) == vec["map"], vec


@pytest.mark.unit
def test_properties_parser_quirks():
    assert properties.decode_properties(b"ab\x02") == {}  # segment shorter than 3 chars
    assert properties.decode_properties(b"a\x01\x02") == {}  # empty value dropped
    assert properties.decode_properties(b"key\x01\x02") == {}  # empty value dropped (long segment)
    assert properties.decode_properties(b"\x01value\x02") == {}  # missing key dropped
    assert properties.decode_properties(b"") == {}
    a = properties.decode_properties(b"KEYS\x01k1\x02TAGS\x01t\x02")
    b = properties.decode_properties(b"TAGS\x01t\x02KEYS\x01k1\x02")
    assert a == b == {"KEYS": "k1", "TAGS": "t"}  # order not significant
    m = {"UNIQ_KEY": "X", "TAGS": "\u6807\u7b7e", "KEYS": "a b"}
    assert properties.decode_properties(properties.encode_properties(m)) == m
    assert properties.split_keys("k1  k2 ") == ["k1", "k2"] and properties.split_keys(None) == []


# =====================================================================================================
# Message ids
# =====================================================================================================


@pytest.mark.integration
def test_offset_msg_id_matches_java(fv):
    for vec in fv["offset_msg_ids"]:
        host = tuple(vec["host"])
        msg_id = msgid.create_offset_msg_id(host, vec["offset"])
        assert msg_id == vec["id"]
        assert msg_id == msg_id.upper()
        assert len(msg_id) == (56 if ":" in host[0] else 32)
        assert msgid.decode_offset_msg_id(msg_id) == (host, vec["offset"])
        assert msgid.decode_offset_msg_id(msg_id.lower()) == (host, vec["offset"])


@pytest.mark.integration
def test_offset_msg_id_by_hand_and_via_record(recs):
    expected = (bytes([10, 0, 0, 2]) + struct.pack(">iq", 10911, 1024)).hex().upper()
    assert expected == "0A00000200002A9F0000000000000400"
    assert records.decode_record(bytes.fromhex(recs["ipv4"]["hex"])).offset_msg_id == expected


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["", "XYZ", "0A0000020", "0A00000200002A9F00000000000004", "G" * 32, "00" * 20])
def test_decode_offset_msg_id_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        msgid.decode_offset_msg_id(bad)


# =====================================================================================================
# UNIQ_KEY generator (MessageClientIDSetter)
# =====================================================================================================


@pytest.mark.integration
def test_uniq_key_prefix_matches_java(fv):
    """MessageClientIDSetter's static initialiser, loaded by a class loader whose hash is the chosen salt (a
    negative int), made an ID from this machine's address and the JVM's pid."""
    vec = fv["uniq_prefix"]
    prefix = vec["id"][:-12]
    gen = msgid.UniqKeyGenerator(ip=bytes.fromhex(vec["ip_hex"]), pid=vec["pid"], salt=vec["salt"])
    a = gen.next(1795320580000)
    b = gen.next(1795320580001)
    assert len(a) == len(b) == len(vec["id"]) == (32 if len(vec["ip_hex"]) == 8 else 56)
    assert a == a.upper() and int(a, 16) >= 0
    assert a[: len(prefix)] == b[: len(prefix)] == prefix
    assert vec["id"][len(vec["ip_hex"]) + 4 : len(prefix)] == "9ABCDEF0" == f"{vec['salt']:08X}"


@pytest.mark.unit
def test_uniq_key_prefix_of_ipv6_and_a_pid_past_16_bits():
    """Layout by hand: a 16-byte address, then the pid cast to a short (70000 -> 0x1170), then the salt."""
    ip = bytes.fromhex("20010db8000000000000000000000001")
    a = msgid.UniqKeyGenerator(ip=ip, pid=70000, salt=0x9ABCDEF0).next(1795320580000)
    assert len(a) == 56
    assert a[:44] == (ip + struct.pack(">HI", 70000 & 0xFFFF, 0x9ABCDEF0)).hex().upper()
    assert a[:44] == "20010DB800000000000000000000000111709ABCDEF0"


@pytest.mark.unit
def test_uniq_key_prefix_fixed_across_calls_with_defaults():
    gen = msgid.UniqKeyGenerator(ip=b"\x0a\x00\x00\x01")
    ids = [gen.next() for _ in range(50)]
    assert len({i[:20] for i in ids}) == 1
    assert all(len(i) == 32 and i == i.upper() for i in ids)
    assert ids[0][:8] == "0A000001"


AMBIGUOUS_MIDNIGHT_ZONES = {"America/Havana"}  # local 00:00 on day 1 occurred twice (DST ended at 01:00)


def _uniq_time_field(vec: dict) -> str:
    with local_zone(vec["tz"]):
        gen = msgid.UniqKeyGenerator(ip=b"\x0a\x00\x00\x01", pid=1, salt=2)
        return gen.next(vec["now_ms"])[20:28]


@pytest.mark.integration
def test_uniq_key_time_field_matches_java(fv):
    cases = [v for v in fv["local_time"] if v["diff_ms"] < 2**31 and v["tz"] not in AMBIGUOUS_MIDNIGHT_ZONES]
    assert len(cases) >= 8
    for vec in cases:
        assert _uniq_time_field(vec) == vec["uniq_tail"][:8], vec
        assert int(vec["uniq_tail"][:8], 16) == vec["diff_ms"]
        assert int(vec["uniq_tail"][8:], 16) == vec["counter"] & 0xFFFF  # the counter, cast to a short


@pytest.mark.integration
def test_uniq_key_time_field_keeps_bit_31_after_day_24_like_java(fv):
    """Java writes ``(int)(now - startOfMonth)``: all 32 bits, so from ~24.86 days into a month bit 31 is set.

    MessageClientIDSetter.createUniqID (4.9.8 and 5.x) applies no mask, and getNearlyTimeFromID reads the
    4 bytes back as an unsigned value.
    """
    cases = [v for v in fv["local_time"] if v["diff_ms"] >= 2**31]
    assert len(cases) >= 2
    for vec in cases:
        assert _uniq_time_field(vec) == vec["uniq_tail"][:8], vec
        assert int(vec["uniq_tail"][:8], 16) == vec["diff_ms"] & 0xFFFFFFFF


@pytest.mark.integration
def test_uniq_key_month_start_at_ambiguous_local_midnight_like_java(fv):
    """java.util.Calendar resolves the repeated 00:00 to the later instant (standard time)."""
    cases = [v for v in fv["local_time"] if v["tz"] in AMBIGUOUS_MIDNIGHT_ZONES]
    assert cases
    for vec in cases:
        assert _uniq_time_field(vec) == vec["uniq_tail"][:8], vec


@pytest.mark.unit
def test_uniq_key_time_field_in_local_zone_computed_independently(pinned_zone):
    """Early in a month (no top-bit or DST edge), using time.mktime for the local month start."""
    now_s = time.time()
    lt = time.localtime(now_s)
    month_start = int(time.mktime((lt.tm_year, lt.tm_mon, 1, 0, 0, 0, 0, 0, -1))) * 1000
    now_ms = month_start + 3 * 86_400_000 + 4_567  # the 4th of the current month, 00:00:04.567
    gen = msgid.UniqKeyGenerator(ip=b"\x7f\x00\x00\x01", pid=7, salt=9)
    uid = gen.next(now_ms)
    assert int(uid[20:28], 16) == now_ms - month_start


@pytest.mark.unit
def test_uniq_key_counter_increments_mod_65536():
    gen = msgid.UniqKeyGenerator(ip=b"\x0a\x00\x00\x01", pid=1, salt=2)
    counters = [int(gen.next(1795320580000)[28:32], 16) for _ in range(65_538)]
    assert all((b - a) % 65536 == 1 for a, b in zip(counters, counters[1:], strict=False))
    assert 65535 in counters and counters.count(counters[0]) == 2  # wrapped around


# =====================================================================================================
# ConsumeQueue, IndexFile, checkpoint, names
# =====================================================================================================


@pytest.mark.integration
def test_cq_unit_matches_java(fv):
    """Units ConsumeQueue.putMessagePositionInfo wrote: a negative tags code, the largest size and offset."""
    assert any(v["tags_code"] < 0 for v in fv["cq_units"]) and any(v["offset"] > 2**62 for v in fv["cq_units"])
    for vec in fv["cq_units"]:
        unit = units.encode_cq_unit(vec["offset"], vec["size"], vec["tags_code"])
        assert len(unit) == units.CQ_UNIT_SIZE == 20
        assert unit.hex() == vec["hex"]
        assert unit == struct.pack(">qiq", vec["offset"], vec["size"], vec["tags_code"])
        assert units.decode_cq_unit(unit) == (vec["offset"], vec["size"], vec["tags_code"])
        buf = bytearray(60)
        units.pack_cq_unit_into(buf, 40, vec["offset"], vec["size"], vec["tags_code"])
        assert bytes(buf[40:]) == unit
        assert list(units.iter_cq_units(bytes(buf)))[2] == (vec["offset"], vec["size"], vec["tags_code"])


@pytest.mark.integration
def test_cq_negative_tags_code_is_sign_extended(fv):
    code = hashing.tags_code("TopicTest#KEY1")
    assert code == -1656969516
    assert units.encode_cq_unit(0, 1, code)[12:] == bytes.fromhex("ffffffff9d3ca6d4")
    assert units.CQ_FILL_UNIT == (0, 0x7FFFFFFF, 0)
    assert units.encode_cq_unit(*units.CQ_FILL_UNIT).hex() == fv["cq_units"][2]["hex"]


@pytest.mark.integration
def test_index_header_matches_java(fv):
    vec = fv["index_header"]
    h = units.IndexHeader(
        vec["begin_timestamp"], vec["end_timestamp"], vec["begin_phy_offset"], vec["end_phy_offset"],
        vec["hash_slot_count"], vec["index_count"],
    )  # fmt: skip
    raw = units.encode_index_header(h)
    assert len(raw) == units.INDEX_HEADER_SIZE == 40
    assert raw.hex() == vec["hex"]
    assert raw == struct.pack(">qqqqii", *(vec[k] for k in (
        "begin_timestamp", "end_timestamp", "begin_phy_offset", "end_phy_offset", "hash_slot_count", "index_count",
    )))  # fmt: skip
    assert units.decode_index_header(raw) == h
    zero = units.decode_index_header(bytes(40))
    assert zero.index_count == 1  # a loaded value <= 0 is forced to 1
    assert units.IndexHeader().index_count == 1


@pytest.mark.integration
def test_index_entry_and_slots_match_java(fv):
    vec = fv["index_entry"]
    assert hashing.index_key_hash(vec["key"]) == vec["key_hash"]
    raw = units.encode_index_entry(vec["key_hash"], vec["phy_offset"], vec["time_diff"], vec["prev_index"])
    assert len(raw) == units.INDEX_ENTRY_SIZE == 20
    assert raw.hex() == vec["hex"]
    assert raw == struct.pack(">iqii", vec["key_hash"], vec["phy_offset"], vec["time_diff"], vec["prev_index"])
    slots, entries = 8, 4
    size = units.index_file_size(slots, entries)
    assert size == 40 + 8 * 4 + 4 * 20
    buf = bytearray(size)
    units.write_index_slot(buf, 5, 3)
    assert buf[40 + 5 * 4 : 40 + 6 * 4] == struct.pack(">i", 3)
    assert units.read_index_slot(buf, 5) == 3
    units.pack_index_entry_into(buf, slots, 3, vec["key_hash"], vec["phy_offset"], vec["time_diff"], vec["prev_index"])
    pos = 40 + slots * 4 + 3 * 20
    assert buf[pos : pos + 20].hex() == vec["hex"]
    fields = (vec["key_hash"], vec["phy_offset"], vec["time_diff"], vec["prev_index"])
    assert units.read_index_entry(buf, slots, 3) == fields


@pytest.mark.integration
def test_put_index_entry_chains_keys_of_one_slot_like_java(fv):
    vec = fv["index_entry"]
    slots, entries = 8, 6
    buf = bytearray(units.index_file_size(slots, entries))
    slot = vec["key_hash"] % slots
    assert units.put_index_entry(buf, slots, 1, vec["key_hash"], vec["phy_offset"], vec["time_diff"]) == 0
    assert units.put_index_entry(buf, slots, 2, vec["key_hash"] + slots, 4096, 7) == 1  # same slot: chained to 1
    assert units.read_index_slot(buf, slot) == 2
    first = 40 + slots * 4 + 1 * 20
    assert buf[first : first + 20].hex() == struct.pack(">iqii", vec["key_hash"], vec["phy_offset"],
                                                        vec["time_diff"], 0).hex()  # fmt: skip
    assert units.read_index_entry(buf, slots, 2) == (vec["key_hash"] + slots, 4096, 7, 1)
    units.write_index_slot(buf, slot, 5)  # a slot pointing past the entries written (a crash before the header)
    assert units.put_index_entry(buf, slots, 3, vec["key_hash"], 1, 1) == 0
    assert units.read_index_entry(buf, slots, 3) == (vec["key_hash"], 1, 1, 0)
    with pytest.raises(struct.error):
        units.put_index_entry(buf, slots, entries, vec["key_hash"], 1, 1)  # past the last entry


@pytest.mark.integration
def test_index_file_size_default(fv):
    """IndexFile's size at MessageStoreConfig's default slot and entry counts."""
    assert fv["index_defaults"] == [5_000_000, 20_000_000]
    assert units.index_file_size(*fv["index_defaults"]) == 420_000_040 == fv["index_file_size_default"]


@pytest.mark.integration
def test_index_file_name_matches_java_local_time(fv):
    for vec in fv["local_time"]:
        with local_zone(vec["tz"]):
            name = units.index_file_name(vec["now_ms"])
        assert name == vec["human"], vec
        assert len(name) == 17 and name.isdigit()


@pytest.mark.integration
def test_checkpoint_matches_java(fv):
    vec = fv["checkpoint"]
    raw = units.encode_checkpoint(vec["physic"], vec["logics"], vec["index"])
    assert raw.hex() == vec["hex"]
    page = raw + bytes(units.CHECKPOINT_SIZE - len(raw))
    assert len(page) == 4096 == vec["file_size"]
    assert units.decode_checkpoint(page) == (vec["physic"], vec["logics"], vec["index"])


@pytest.mark.integration
def test_offset_to_file_name_matches_java(fv):
    for vec in fv["offset_file_names"]:
        assert units.offset_to_file_name(vec["offset"]) == vec["name"]


@pytest.mark.unit
def test_offset_to_file_name_1gib():
    assert units.offset_to_file_name(1073741824) == "00000000001073741824"


# =====================================================================================================
# Delay levels
# =====================================================================================================


@pytest.mark.integration
def test_default_delay_levels_match_java(rmq):
    """MessageStoreConfig's default levels, and the delivery times ScheduleMessageService computes from them."""
    vec = rmq["delay_levels"]
    assert vec["levels"] == delay.DEFAULT_DELAY_LEVELS
    levels = delay.parse_delay_levels()
    assert levels == [d["deliver_timestamp"] - d["store_timestamp"] for d in vec["deliver"]]
    assert len(levels) == 18
    assert levels[3 - 1] == 10_000
    for d in vec["deliver"]:
        assert delay.delay_deliver_timestamp(d["level"], d["store_timestamp"]) == d["deliver_timestamp"], d
    assert delay.parse_delay_levels("1s 2m 3h 1d") == [1000, 120_000, 10_800_000, 86_400_000]


def _schedule_record(
    template: dict, level: str | None, tags: str | None = "tagA", topic: str = delay.SCHEDULE_TOPIC
) -> bytes:
    props = {"TAGS": tags, "DELAY": level, "REAL_TOPIC": "TopicTest", "REAL_QID": "3"}
    rec = _record_from_vector(template, topic=topic, queue_id=2, properties=properties.encode_properties(props))
    return bytes(records.encode_record(rec))


@pytest.mark.integration
def test_check_record_schedule_topic_tags_code_is_delivery_time(recs):
    res = records.check_record(_schedule_record(recs["ipv4"], "3"), 0)
    assert res.ok
    assert res.request.tags_code == 1700000000123 + 10_000


@pytest.mark.integration
def test_check_record_schedule_topic_level_capped_at_max(recs):
    res = records.check_record(_schedule_record(recs["ipv4"], "99"), 0)
    assert res.request.tags_code == 1700000000123 + 7_200_000  # level 18 = 2h


@pytest.mark.integration
def test_check_record_delay_outside_schedule_topic_keeps_tags_hash(recs):
    res = records.check_record(_schedule_record(recs["ipv4"], "3", topic="TopicTest"), 0)
    assert res.request.tags_code == 3552231


@pytest.mark.integration
def test_check_record_schedule_topic_delay_level_zero_keeps_tags_hash(recs):
    """CommitLog.checkMessageAndReturnSize (4.9.8 and 5.x) only replaces tagsCode when ``delayLevel > 0``."""
    res = records.check_record(_schedule_record(recs["ipv4"], "0"), 0)
    assert res.ok
    assert res.request.tags_code == 3552231  # "tagA".hashCode(), not storeTimestamp + 1000
