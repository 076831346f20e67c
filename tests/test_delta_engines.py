"""Both Delta engines on one table: what delta-spark (``mqlake sql``, Spark jobs) does to the tier's ``messages``
table is still served right by the broker's fall-through reader (delta-rs and the parquet files, no JVM), or
refused with a clear warning where the reader cannot apply a feature (deletion vectors, column mapping): never
a deleted row or a wrong column.  And the reverse: what delta-rs does (the tier's commits, compaction, vacuum)
Spark reads right."""

from __future__ import annotations

import logging
import shutil

import pytest
from deltalake import DeltaTable

from lake import delta as lake
from lake.reader import LakeReader
from pipelines import spark_tables
from store.format import records

# Spark rewrites and vacuums on a busy machine take minutes; the suite default (300 s) includes the session start
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture
def own_lake(spark_lake, tmp_path):
    """A private copy of the shared lake (Delta paths are relative), for tests that change it."""
    root = tmp_path / "lake"
    shutil.copytree(spark_lake, root)
    return root


def _served(reader: LakeReader, offsets) -> dict[int, bytes | None]:
    return {o: reader.message_at(o) for o in offsets}


def _sample(spark_store) -> list[int]:
    return sorted(spark_store.sealed_rows())[::5]


def test_optimize_zorder_and_vacuum_by_spark_are_served_the_same_by_the_broker(spark, own_lake, spark_store):
    table = own_lake / "messages"
    offsets = _sample(spark_store)
    old_reader = LakeReader(own_lake)
    before = _served(old_reader, offsets)
    assert all(before.values())
    for o in offsets:  # the reader rebuilds the very records that were stored
        rec = records.decode_record(before[o])
        assert rec.body == spark_store.expected[o]["body"]
    files_before = set(table.rglob("*.parquet"))

    spark.sql(f"OPTIMIZE delta.`{table}` ZORDER BY (queue_offset)")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert not (files_before & set(table.rglob("*.parquet")))  # every old file rewritten, then deleted

    assert _served(LakeReader(own_lake), offsets) == before
    assert _served(old_reader, offsets) == before  # its snapshot's files are gone: it takes a fresh one
    assert lake.to_arrow(table).num_rows == len(spark_store.sealed_rows())


def test_a_spark_delete_leaving_deletion_vectors_is_refused_by_the_broker_not_served(
    spark, own_lake, spark_store, caplog
):
    table = own_lake / "messages"
    offsets = _sample(spark_store)
    deleted = [o for o in offsets if spark_store.expected[o]["topic"] == "Orders"][:3]
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{table}` WHERE commitlog_offset IN ({', '.join(map(str, deleted))})")
    ops = [r.operationMetrics for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()]
    assert int(ops[0]["numDeletionVectorsAdded"]) > 0  # the files still hold the rows; a vector hides them

    gone = f"commitlog_offset IN ({', '.join(map(str, deleted))})"
    assert spark_tables.read_table(spark, table).where(gone).count() == 0
    with caplog.at_level(logging.WARNING, logger="lake.reader"):
        served = _served(LakeReader(own_lake), offsets)
    assert set(served.values()) == {None}  # refused whole: no deleted row, no row from a half-read table
    assert "deletionVectors" in caplog.text and "not served from the tier" in caplog.text
    with pytest.raises(lake.LakeError, match="deletionVectors"):
        lake.to_arrow(table)


def test_column_mapping_set_by_spark_is_refused_by_the_broker(spark, own_lake, spark_store, caplog):
    table = own_lake / "messages"
    spark.sql(
        f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        f"'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
    )
    spark.sql(f"ALTER TABLE delta.`{table}` RENAME COLUMN tags TO tag_text")
    assert spark_tables.read_table(spark, table).where("tag_text = 'tag2'").count() == sum(
        r["tags"] == "tag2" for r in spark_store.sealed_rows().values()
    )
    with caplog.at_level(logging.WARNING, logger="lake.reader"):
        assert set(_served(LakeReader(own_lake), _sample(spark_store)).values()) == {None}
    assert "columnMapping" in caplog.text
    with pytest.raises(lake.LakeError, match="columnMapping"):
        lake.to_arrow(table)


def test_delta_rs_compaction_and_vacuum_read_right_by_spark(spark, own_lake, spark_store):
    table = own_lake / "messages"
    dt = DeltaTable(str(table))
    dt.optimize.compact()
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    want = spark_store.sealed_rows()
    got = spark_tables.read_table(spark, table).select("commitlog_offset", "body").collect()
    assert {r.commitlog_offset: bytes(r.body) for r in got} == {o: r["body"] for o, r in want.items()}
    ops = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()]
    assert ops[:2] == ["VACUUM END", "VACUUM START"] and "OPTIMIZE" in ops
