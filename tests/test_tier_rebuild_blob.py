"""The vectorised rebuild of a row group (``records_blob``) against the per-row reference (``record_from_row``)
and the store's own encoder, over rows that take every branch of the layout: empty, null and non-empty
properties, IPv4 and IPv6 born and store hosts, V1 and V2 records (a short topic written V2, a topic only V2
can hold), empty bodies, and a slice of a table."""

from __future__ import annotations

import struct
import zlib

import pyarrow as pa
import pytest

from lake.rebuild import record_from_row, records_blob, records_from_table
from lake.schema import MESSAGE_SCHEMA
from store.format.msgid import host_string
from store.format.records import (
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    STOREHOSTADDRESS_V6_FLAG,
    SYSFLAG_POS,
    MessageRecord,
    RecordError,
    decode_record,
    encode_record,
)

HOSTS = [("10.0.0.7", 10911), ("::1", 10912), ("fe80::1:2", 1), ("192.168.1.20", 65535)]
PROPERTIES = [None, [], [("TAGS", "a")], [("KEYS", "k1 k2"), ("UNIQ_KEY", "u" * 32), ("TAGS", "é")]]
COLUMNS = [f.name for f in MESSAGE_SCHEMA if f.name not in ("crc_ok", "tags", "keys", "uniq_key", "msg_id",
                                                             "segment", "position")]  # fmt: skip


def _records(topic: str, magic: int, count: int = 24) -> list[MessageRecord]:
    out = []
    for i in range(count):
        props = PROPERTIES[i % len(PROPERTIES)]
        body = b"" if i % 5 == 0 else bytes(range(i % 7, i % 7 + 3 * i))
        out.append(MessageRecord(
            topic=topic, queue_id=i % 3, body=body,
            properties=b"".join(f"{k}\x01{v}\x02".encode() for k, v in props or ()),
            flag=i * 7, sys_flag=(i % 4) * 4 | (BORNHOST_V6_FLAG if i % 6 == 1 else 0),  # a stale v6 bit too
            born_timestamp=1_700_000_000_000 + i, born_host=HOSTS[i % len(HOSTS)],
            store_timestamp=1_700_000_000_500 + i, store_host=HOSTS[(i // 2) % len(HOSTS)],
            reconsume_times=i % 2, prepared_transaction_offset=-i, queue_offset=100 + i,
            physical_offset=4096 * i, body_crc=zlib.crc32(body) & 0x7FFFFFFF, magic=magic,
        ))  # fmt: skip
    return out


def _table(records: list[MessageRecord]) -> pa.Table:
    props = {r.physical_offset: p for r, p in zip(records, [PROPERTIES[i % len(PROPERTIES)]
                                                          for i in range(len(records))], strict=True)}  # fmt: skip
    rows = [{
        "topic": r.topic, "queue_id": r.queue_id, "queue_offset": r.queue_offset,
        "commitlog_offset": r.physical_offset, "msg_size": len(encode_record(r)), "magic": r.magic,
        "body_crc": r.body_crc, "flag": r.flag, "sys_flag": r.sys_flag, "born_timestamp": r.born_timestamp,
        "born_host": host_string(r.born_host), "store_timestamp": r.store_timestamp,
        "store_host": host_string(r.store_host), "reconsume_times": r.reconsume_times,
        "prepared_txn_offset": r.prepared_transaction_offset, "properties": props[r.physical_offset], "body": r.body,
    } for r in records]  # fmt: skip
    return pa.Table.from_pylist(rows, pa.schema([MESSAGE_SCHEMA.field(c) for c in COLUMNS]))


@pytest.mark.unit
@pytest.mark.parametrize(("topic", "magic"), [("Orders", MESSAGE_MAGIC_V1), ("Orders", MESSAGE_MAGIC_V2),
                                              ("T" * 200, MESSAGE_MAGIC_V2)])  # fmt: skip
def test_the_vectorised_rebuild_equals_the_row_by_row_one_and_the_store_encoder(topic, magic):
    records = _records(topic, magic)
    table = _table(records)
    expected = [encode_record(r) for r in records]
    assert [record_from_row(row) for row in table.to_pylist()] == expected
    blob = records_blob(table.drop_columns(["topic"]), topic)
    assert blob.all() == expected
    assert blob.data == b"".join(expected) and len(blob) == len(records)
    assert blob.records([5, 0, 23]) == [expected[5], expected[0], expected[23]]
    assert records_from_table(table.slice(7, 9), topic) == expected[7:16]  # offsets of a slice start past 0
    for raw, rec in zip(blob.all(), records, strict=True):
        (sys_flag,) = struct.unpack_from(">i", raw, SYSFLAG_POS)
        assert bool(sys_flag & BORNHOST_V6_FLAG) == (":" in rec.born_host[0])  # bits follow the hosts
        assert bool(sys_flag & STOREHOSTADDRESS_V6_FLAG) == (":" in rec.store_host[0])
        back = decode_record(raw, 0)
        assert (back.topic, back.body, back.born_host, back.store_host, back.magic) == (
            topic, rec.body, rec.born_host, rec.store_host, magic)  # fmt: skip


@pytest.mark.unit
def test_an_empty_table_rebuilds_to_no_records():
    blob = records_blob(_table([]).drop_columns(["topic"]), "Orders")
    assert len(blob) == 0 and blob.all() == [] and blob.data == b""


@pytest.mark.unit
def test_a_row_of_another_size_is_refused_naming_its_offset_and_source():
    table = _table(_records("Orders", MESSAGE_MAGIC_V1, 4)).drop_columns(["topic"])
    sizes = table.column("msg_size").to_pylist()
    sizes[2] += 1
    table = table.set_column(table.schema.get_field_index("msg_size"), "msg_size", pa.array(sizes, pa.int32()))
    with pytest.raises(RecordError, match=r"part-0\.parquet row group 3 at offset 8192: .*rebuilds to"):
        records_blob(table, "Orders", "part-0.parquet row group 3")
