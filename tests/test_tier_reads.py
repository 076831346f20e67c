"""Tiered rows read back as CommitLog records: the byte-for-byte rebuild, and the broker's lake reader over a
real Delta table (delta-rs, no Spark) — pulls in queue order, tag filters, msgId and key lookups, time
searches, the cache bound, and a lake that is missing or broken."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lake.reader import LakeReader
from lake.rebuild import record_from_row, records_from_table
from lake.tables import MESSAGES, STORE_DATE, table_uri
from store.format import hashing
from store.format.records import RecordError
from tests.fixtures_spark import LONG_TOPIC, TOPICS, WrittenStore, write_store

COUNT = 400


def _segment_rows(written: WrittenStore, sealed_only: bool = True) -> pa.Table:
    from pipelines.segment_reader import read_segment

    names = written.segment_names()[:-1] if sealed_only else written.segment_names()
    batches = [b for n in names for b in read_segment(written.commitlog / n)]
    return pa.Table.from_batches(batches)


def _raw(written: WrittenStore, row: dict) -> bytes:
    data = (written.commitlog / row["segment"]).read_bytes()
    return data[row["position"] : row["position"] + row["msg_size"]]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> WrittenStore:
    return write_store(tmp_path_factory.mktemp("tier_reads"), COUNT)


@pytest.fixture(scope="module")
def lake(written, tmp_path_factory) -> Path:
    """A ``messages`` table as the tier lays it out (partitioned by topic and UTC day), in small row groups so
    reads must pick among them; rows in CommitLog order, as older tier runs wrote them."""
    import pyarrow.compute as pc
    from deltalake import WriterProperties, write_deltalake

    rows = _segment_rows(written)
    day = pc.cast(pc.divide(rows["store_timestamp"], 86_400_000), pa.int32()).cast(pa.date32())
    rows = rows.append_column(STORE_DATE, day)
    root = tmp_path_factory.mktemp("lake")
    write_deltalake(table_uri(root, MESSAGES), rows, partition_by=["topic", STORE_DATE],
                    writer_properties=WriterProperties(max_row_group_size=16))  # fmt: skip
    return root


@pytest.mark.unit
def test_every_tiered_row_rebuilds_the_bytes_the_commitlog_held(written):
    rows = _segment_rows(written, sealed_only=False).to_pylist()
    assert len(rows) == COUNT
    assert any(r["topic"] == LONG_TOPIC for r in rows) and any(r["uniq_key"] is None for r in rows)
    for row in rows:
        assert record_from_row(row) == _raw(written, row), row["commitlog_offset"]


@pytest.mark.unit
def test_a_whole_table_rebuilds_as_row_by_row(written):
    table = _segment_rows(written, sealed_only=False)
    for topic in TOPICS:
        rows = table.filter(pc.equal(table["topic"], topic))
        raw = [_raw(written, r) for r in rows.to_pylist()]
        assert records_from_table(rows.drop_columns(["topic"]), topic) == raw
        assert records_from_table(rows.slice(3, 5), topic) == raw[3:8]  # a slice: map offsets start past 0


@pytest.mark.unit
def test_a_row_that_cannot_rebuild_its_record_is_refused_naming_it(written):
    row = _segment_rows(written).slice(0, 1).to_pylist()[0]
    row["properties"] = [*row["properties"], ("EXTRA", "x")]
    with pytest.raises(RecordError, match=f"offset {row['commitlog_offset']}.*rebuilds to"):
        record_from_row(row, "messages/part-0.parquet")


def _expected(written: WrittenStore) -> dict[tuple[str, int], list[dict]]:
    sealed = set(written.segment_names()[:-1])
    out: dict[tuple[str, int], list[dict]] = {}
    for row in sorted(written.expected.values(), key=lambda r: r["queue_offset"]):
        if row["segment"] in sealed:
            out.setdefault((row["topic"], row["queue_id"]), []).append(row)
    return out


@pytest.mark.unit
def test_pulls_walk_each_queue_in_order_with_every_record_byte_for_byte(written, lake):
    reader = LakeReader(lake)
    for (topic, queue_id), rows in _expected(written).items():
        got, offset = [], 0
        while True:
            found = reader.pull(topic, queue_id, offset, 1 << 62, 7, 1 << 20)
            if found is None:
                break
            assert found.queue_offsets == list(range(offset, offset + len(found.queue_offsets)))
            got.extend(found.messages)
            offset = found.next_begin_offset
        assert got == [_raw(written, r) for r in rows], (topic, queue_id)
    # an upper bound (where the local store takes over) is never crossed
    rows = _expected(written)[("Payments", 1)]
    found = reader.pull("Orders", 0, 0, 3, 32, 1 << 20)
    assert found.queue_offsets == [0, 1, 2] and found.next_begin_offset == 3
    assert reader.pull("Orders", 0, len(rows), 1 << 62, 32, 1 << 20) is None


@pytest.mark.unit
def test_a_tag_filter_skips_other_tags_and_moves_the_next_offset_on(written, lake):
    reader = LakeReader(lake)
    rows = _expected(written)[("Payments", 1)]
    want = {hashing.tags_code("tag1")}
    found = reader.pull("Payments", 1, 0, 1 << 62, 32, 1 << 20, want)
    expected = [r for r in rows if r["tags"] == "tag1"]
    assert expected and found.messages == [_raw(written, r) for r in expected][: len(found.messages)]
    assert found.next_begin_offset > found.queue_offsets[-1]


@pytest.mark.unit
def test_msg_id_key_and_time_lookups_find_tiered_messages(written, lake):
    reader = LakeReader(lake)
    rows = [r for rs in _expected(written).values() for r in rs]
    some = rows[len(rows) // 2]
    assert reader.message_at(some["commitlog_offset"]) == _raw(written, some)
    assert reader.message_at(some["commitlog_offset"] + 1) is None
    key = some["keys"].split()[0]  # k<i>: one message
    assert reader.query_key(some["topic"], key, 32, 0, 1 << 62) == [_raw(written, some)]
    uniq = next(r for r in rows if r["uniq_key"])
    assert reader.query_key(uniq["topic"], uniq["uniq_key"], 32, 0, 1 << 62) == [_raw(written, uniq)]
    group = [r for r in rows if r["topic"] == "Audit" and "g3" in r["keys"].split()]
    assert sorted(reader.query_key("Audit", "g3", 100, 0, 1 << 62)) == sorted(_raw(written, r) for r in group)
    assert reader.query_key("Audit", "g3", 100, 0, 0) == []  # outside the time range
    queue = _expected(written)[("Audit", 2)]
    mid = queue[len(queue) // 2]
    assert reader.offset_by_time("Audit", 2, mid["store_timestamp"]) == min(
        r["queue_offset"] for r in queue if r["store_timestamp"] >= mid["store_timestamp"]
    )
    assert reader.offset_by_time("Audit", 2, mid["store_timestamp"], upper=True) == max(
        r["queue_offset"] for r in queue if r["store_timestamp"] <= mid["store_timestamp"]
    )
    assert reader.store_time_at("Audit", 2, mid["queue_offset"]) == mid["store_timestamp"]


@pytest.mark.unit
def test_the_row_group_cache_stays_under_its_bound_while_queues_are_walked(written, lake):
    reader = LakeReader(lake, cache_bytes=64 * 1024)
    for topic in TOPICS:
        for queue_id in range(4):
            offset = 0
            while (found := reader.pull(topic, queue_id, offset, 1 << 62, 4, 1 << 20)) is not None:
                offset = found.next_begin_offset
                assert reader.cache.bytes <= 64 * 1024
    assert reader.cache.hits > 0 and len(reader.cache) > 0


@pytest.mark.unit
def test_a_missing_or_broken_lake_answers_nothing_and_logs_each_cause_once(tmp_path, lake, caplog):
    caplog.set_level(logging.WARNING, "lake.reader")
    missing = LakeReader(tmp_path / "nowhere")
    for _ in range(3):
        assert missing.pull("Orders", 0, 0, 1 << 62, 32, 1 << 20) is None
        assert missing.message_at(0) is None and missing.query_key("Orders", "k1", 32, 0, 1 << 62) == []
    assert sum("has no Delta table 'messages'" in r.getMessage() for r in caplog.records) == 1

    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(lake, broken)
    for f in (broken / MESSAGES).rglob("*.parquet"):
        f.write_bytes(b"not parquet")
    reader = LakeReader(broken)
    caplog.clear()
    for _ in range(3):
        assert reader.pull("Orders", 0, 0, 1 << 62, 32, 1 << 20) is None
    assert len([r for r in caplog.records if "cannot read the tier" in r.getMessage()]) == 1


@pytest.mark.unit
def test_a_sql92_filter_sees_the_rebuilt_records(written, lake):
    from broker.filter.sql92 import compile_selector

    selector = compile_selector("color = 'red'")
    reader = LakeReader(lake)
    rows = _expected(written)[("Payments", 1)]
    got, offset = [], 0
    while (found := reader.pull("Payments", 1, offset, 1 << 62, 4, 1 << 20, None, selector.matches_record)) is not None:
        got.extend(found.messages)
        offset = found.next_begin_offset
    expected = [_raw(written, r) for r in rows if r["properties"].get("color") == "red"]
    assert expected and got == expected
