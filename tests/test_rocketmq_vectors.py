"""store/format/ against Apache RocketMQ's own classes: tests/java/vectors/StoreVectors.java runs the 4.9.7 store
and common jars (a real DefaultMessageStore writing CommitLog records and ConsumeQueue units, an IndexFile, a
StoreCheckpoint, UtilAll, MessageDecoder, MessageClientIDSetter, MessageExtBrokerInner, ScheduleMessageService)
once per session, tests/java/vectors5/StoreVectors5.java runs the 5.4.0 store for the records 4.x cannot write
(V2, long topics), and every test here compares mqlake's codec with what those classes produced. Nothing between
RocketMQ and the check is written by hand."""

from __future__ import annotations

import pytest

from store.format import delay, hashing, msgid, properties, records, units
from tests.helpers import local_zone

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("twin")]


def test_string_hash_index_key_hash_and_tags_code(rmq):
    assert len(rmq["strings"]) >= 10 and any(v["index_key_hash"] == 0 and v["hash"] for v in rmq["strings"])
    for v in rmq["strings"]:
        assert hashing.java_string_hash(v["s"]) == v["hash"], v
        assert hashing.index_key_hash(v["s"]) == v["index_key_hash"], v  # IndexFile.indexKeyHashMethod
        assert hashing.tags_code(v["s"] or None) == v["tags_code"], v  # tagsString2tagsCode


def test_body_crc32_is_utilall_crc32(rmq):
    for v in rmq["crc32"]:
        assert hashing.body_crc32(bytes.fromhex(v["hex"])) == v["crc32"], v


def test_offset_to_file_name_is_utilall_offset2filename(rmq):
    for v in rmq["offset_file_names"]:
        assert units.offset_to_file_name(v["offset"]) == v["name"]
        assert units.is_offset_file_name(v["name"])


def test_offset_msg_id_is_message_decoder_create_message_id(rmq):
    for v in rmq["offset_msg_ids"]:
        host = (v["host"], v["port"])
        assert msgid.create_offset_msg_id(host, v["offset"]) == v["id"], v
        (got_host, got_offset) = msgid.decode_offset_msg_id(v["id"])
        assert got_offset == v["offset"] and msgid.host_string(got_host) == msgid.host_string(
            msgid.parse_host_string(msgid.host_string(host))
        )


def test_properties_parse_like_message_decoder(rmq):
    p = rmq["properties"]
    for case in p["parsed"]:
        assert properties.decode_properties(case["input"].encode()) == case["map"], case
    # RocketMQ 4.9.x's messageProperties2String leaves out the separator after the last entry; mqlake writes it
    # (as 5.x does). Both parse to the same map.
    serialized = p["serialized"].encode()
    assert properties.encode_properties(p["map"]) in (serialized, serialized + b"\x02")
    assert properties.decode_properties(serialized) == p["map"]


def test_uniq_ids_of_message_client_id_setter(rmq):
    """The IDs RocketMQ's client makes (this machine's address, which may be IPv6) have the layout mqlake's
    generator uses: address, pid, class-loader hash, then ms since the month started and a counter."""
    ids = [v["id"] for v in rmq["uniq_ids"]]
    prefix = ids[0][:-12]
    assert all(i[:-12] == prefix and len(i) in (32, 56) for i in ids)
    ip_len = (len(ids[0]) - 24) // 2  # then pid (2 bytes), loader hash (4), ms since month start (4), counter (2)
    ip = bytes.fromhex(ids[0][: 2 * ip_len])
    pid, salt = int(ids[0][2 * ip_len : 2 * ip_len + 4], 16), int(ids[0][2 * ip_len + 4 : 2 * ip_len + 12], 16)
    generator = msgid.UniqKeyGenerator(ip=ip, pid=pid, salt=salt)
    assert generator.next(0)[:-12] == prefix
    counters = [int(i[-4:], 16) for i in ids]
    assert counters == [(counters[0] + n) & 0xFFFF for n in range(len(ids))]


def test_uniq_key_time_field_and_index_file_name_in_local_time(rmq):
    """Per time zone: the UNIQ_KEY time field counts from the month start MessageClientIDSetter computes (all 32
    bits of ``(int)(now - start)``), and an IndexFile is named as
    UtilAll.timeMillisToHumanString names it."""
    assert {v["tz"] for v in rmq["local_time"]} >= {"UTC", "America/Havana", "Asia/Amman", "Australia/Lord_Howe"}
    for v in rmq["local_time"]:
        with local_zone(v["tz"]):
            generator = msgid.UniqKeyGenerator(ip=b"\x0a\x00\x00\x01", pid=1, salt=2)
            field = int(generator.next(v["now_ms"])[-12:-4], 16)
            assert field == (v["now_ms"] - v["month_start_ms"]) & 0xFFFFFFFF, v
            assert units.index_file_name(v["now_ms"]) == v["human"], v


def test_commitlog_records_are_the_java_store_bytes(stored):
    assert {r["name"] for r in stored} >= {"ipv4", "ipv6_born", "ipv6_both", "v2_long_topic", "v1_short_topic"}
    assert {int.from_bytes(bytes.fromhex(r["hex"][8:16]), "big", signed=True) for r in stored} == {
        records.MESSAGE_MAGIC_V1, records.MESSAGE_MAGIC_V2,
    }  # fmt: skip
    for r in stored:
        raw = bytes.fromhex(r["hex"])
        rec = records.MessageRecord(
            topic=r["topic"], queue_id=r["queue_id"], body=r["body"].encode(), properties=r["properties"].encode(),
            flag=r["flag"], sys_flag=r["sys_flag"], born_timestamp=r["born_timestamp"],
            born_host=tuple(r["born_host"]), store_timestamp=r["store_timestamp"], store_host=tuple(r["store_host"]),
            reconsume_times=r["reconsume_times"], prepared_transaction_offset=0, queue_offset=r["queue_offset"],
            physical_offset=r["physical_offset"],
        )  # fmt: skip
        assert records.encode_record(rec).hex() == r["hex"], r["name"]
        got = records.decode_record(raw, 0)
        assert (got.topic, got.body, got.properties, got.sys_flag, got.store_timestamp) == (
            rec.topic, rec.body, rec.properties, rec.sys_flag, rec.store_timestamp,
        ), r["name"]  # fmt: skip
        assert got.total_size == r["size"] == len(raw)


def test_consume_queue_units_are_the_java_dispatch(stored):
    assert any(r["tags_code"] < 0 for r in stored)  # a negative tags code is stored sign-extended
    for r in stored:
        unit = (r["physical_offset"], r["size"], r["tags_code"])
        assert units.encode_cq_unit(*unit).hex() == r["cq_unit"], r["name"]
        assert units.decode_cq_unit(bytes.fromhex(r["cq_unit"])) == unit


def test_blank_record_ends_a_segment_as_the_java_store_ends_it(rmq):
    v = rmq["blank"]
    assert records.encode_blank(rmq["commitlog_segment"] - v["position"]).hex() == v["hex"]


def test_delay_level_deliver_time_is_schedule_message_service(rmq):
    v = rmq["delay_levels"]
    millis = delay.parse_delay_levels(v["levels"])
    assert len(millis) == len(v["deliver"]) == 18
    for d in v["deliver"]:
        assert delay.delay_deliver_timestamp(d["level"], d["store_timestamp"], millis) == d["deliver_timestamp"], d


def test_index_file_is_what_rocketmq_index_file_wrote(rmq):
    """The same keys put into an IndexFile by mqlake's units and by RocketMQ's IndexFile give the same file."""
    v = rmq["index"]
    slots, entries, puts = v["hash_slot_num"], v["index_num"], v["puts"]
    java_file = bytes.fromhex(v["hex"])
    assert len(java_file) == units.index_file_size(slots, entries)
    buf = bytearray(units.index_file_size(slots, entries))
    begin = puts[0]["store_timestamp"]
    used_slots = set()
    for n, p in enumerate(puts, start=1):
        key_hash = hashing.index_key_hash(p["key"])
        used_slots.add(key_hash % slots)
        units.put_index_entry(buf, slots, n, key_hash, p["phy_offset"], (p["store_timestamp"] - begin) // 1000)
    header = units.IndexHeader(
        begin_timestamp=begin, end_timestamp=puts[-1]["store_timestamp"], begin_phy_offset=puts[0]["phy_offset"],
        end_phy_offset=puts[-1]["phy_offset"], hash_slot_count=len(used_slots), index_count=len(puts) + 1,
    )  # fmt: skip
    buf[: units.INDEX_HEADER_SIZE] = units.encode_index_header(header)
    assert units.decode_index_header(java_file) == header
    assert bytes(buf) == java_file


def test_checkpoint_is_what_store_checkpoint_wrote(rmq):
    v = rmq["checkpoint"]
    stamps = (v["physic_msg_timestamp"], v["logics_msg_timestamp"], v["index_msg_timestamp"])
    assert units.encode_checkpoint(*stamps).hex() == v["hex"]
    assert units.decode_checkpoint(bytes.fromhex(v["hex"]) + bytes(units.CHECKPOINT_SIZE - 24)) == stamps
