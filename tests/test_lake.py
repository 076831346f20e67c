"""Delta tables through lake.delta: idempotent commits, snapshot reads, tables for Spark SQL."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from lake import delta as lake
from lake.schema import MESSAGE_COLUMNS, MESSAGE_SCHEMA
from pipelines import spark_tables
from tests.fixtures_spark import TOPICS, spark_row

pytestmark = pytest.mark.spark

PARTS = ["topic", "store_date"]


def table_schema() -> pa.Schema:
    return pa.schema(list(MESSAGE_SCHEMA) + [pa.field("store_date", pa.date32(), nullable=False)])


@pytest.fixture
def own_lake(spark_lake, tmp_path):
    """A private copy of the shared lake (Delta paths are relative), for tests that change it."""
    dst = tmp_path / "lake"
    shutil.copytree(spark_lake, dst)
    return dst


def test_commit_creates_then_appends_once_per_transaction(spark_lake, spark_store, own_lake):
    table = own_lake / "messages"
    sealed = spark_store.segment_names()[:-1]
    dt = DeltaTable(str(table))
    assert dt.version() == len(sealed) - 1  # one create, then one append per segment (asserted in the fixture)
    for seg in sealed:
        assert lake.transaction_version(table, f"test:{int(seg)}") == 1
    assert lake.transaction_version(table, "never") is None
    assert lake.transaction_version(own_lake / "absent", "x") is None
    config = dt.metadata().configuration
    assert {k: config.get(k) for k in lake.TABLE_PROPERTIES} == lake.TABLE_PROPERTIES
    assert "delta.setTransactionRetentionDuration" not in config

    # the same (app id, version) again, or an older version: nothing is committed
    files = sorted(p for p in table.rglob("*.parquet"))[:1]
    adds = lake.add_actions(table, files, PARTS)
    app = f"test:{int(sealed[0])}"
    for version in (1, 0):
        assert lake.commit_files(table, adds, schema=table_schema(), partition_by=PARTS, app_id=app,
                                 version=version) is None  # fmt: skip
    assert DeltaTable(str(table)).version() == len(sealed) - 1
    # a newer version of it is a new commit, carrying its metadata
    new = lake.commit_files(table, [], schema=table_schema(), partition_by=PARTS, app_id=app, version=2,
                            metadata={"run_id": "r-42"})  # fmt: skip
    assert new == len(sealed) and lake.transaction_version(table, app) == 2
    assert DeltaTable(str(table)).history(1)[0]["run_id"] == "r-42"


def test_add_actions_carry_partition_values_and_footer_stats(spark_lake):
    table = spark_lake / "messages"
    actions = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()
    assert actions
    for a in actions:
        path = table / unquote(a["path"])
        data = pq.read_table(path)
        assert a["num_records"] == data.num_rows
        assert a["min.queue_offset"] == pa.compute.min(data["queue_offset"]).as_py()
        assert a["max.queue_offset"] == pa.compute.max(data["queue_offset"]).as_py()
        assert a["null_count.tags"] == data["tags"].null_count
        assert a["partition.topic"] in TOPICS and a["partition.store_date"] is not None
        assert "min.body" not in a  # binary columns have no bounds


def test_register_and_sql_equal_the_messages_written(spark, spark_lake, spark_store):
    assert spark_tables.register(spark, spark_lake) == ["messages"]
    want = spark_store.sealed_rows()
    got = {r["commitlog_offset"]: r for r in map(spark_row, spark.sql(
        f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages").collect())}  # fmt: skip
    assert got == want
    assert spark.table("messages").columns == MESSAGE_COLUMNS + ["store_date"]

    # the README's worked queries
    t0 = sorted(r["store_timestamp"] for r in want.values())
    lo, hi = t0[len(t0) // 4], t0[3 * len(t0) // 4]
    in_range = spark.sql(
        "SELECT commitlog_offset FROM messages WHERE topic = 'Orders' "
        f"AND store_timestamp BETWEEN {lo} AND {hi}"
    ).collect()
    assert sorted(r[0] for r in in_range) == sorted(
        o for o, r in want.items() if r["topic"] == "Orders" and lo <= r["store_timestamp"] <= hi
    )
    by_key = spark.sql("SELECT commitlog_offset FROM messages WHERE array_contains(split(keys, ' '), 'g3')").collect()
    assert sorted(r[0] for r in by_key) == sorted(o for o, r in want.items() if "g3" in r["keys"].split(" "))
    by_tag = spark.sql("SELECT count(*) FROM messages WHERE tags = 'tag2'").collect()[0][0]
    assert by_tag == sum(r["tags"] == "tag2" for r in want.values())
    per_day = spark.sql(
        "SELECT to_date(timestamp_millis(store_timestamp)) AS day, count(*) AS n FROM messages GROUP BY day"
    ).collect()
    days: dict = {}
    for r in want.values():
        day = datetime.fromtimestamp(r["store_timestamp"] / 1000, UTC).date()
        days[day] = days.get(day, 0) + 1
    assert {r["day"]: r["n"] for r in per_day} == days
    text = spark.sql(
        "SELECT commitlog_offset, CAST(body AS STRING) AS text FROM messages WHERE topic = 'Payments'"
    ).collect()
    assert {r[0]: r[1] for r in text} == {
        o: r["body"].decode("utf-8", "replace") for o, r in want.items() if r["topic"] == "Payments"
    }


def test_read_table_is_exactly_the_snapshot(spark, own_lake, spark_store):
    table = own_lake / "messages"
    before = DeltaTable(str(table)).version()
    files_before = set(table.rglob("*.parquet"))
    DeltaTable(str(table)).delete("topic = 'Audit'")  # a partition delete: remove actions only
    assert set(table.rglob("*.parquet")) == files_before  # the removed files are still on disk

    now = spark_tables.read_table(spark, table)
    want = spark_store.sealed_rows()
    assert now.count() == sum(r["topic"] != "Audit" for r in want.values())
    assert now.filter("topic = 'Audit'").count() == 0
    # the trap it avoids: a directory read also returns the removed files' rows
    assert spark.read.option("recursiveFileLookup", "true").parquet(str(table)).count() == len(want)
    # time travel to before the delete
    old = spark_tables.read_table(spark, table, version=before)
    assert old.filter("topic = 'Audit'").count() == sum(r["topic"] == "Audit" for r in want.values())
    assert lake.to_arrow(table, [("topic", "=", "Audit")]).num_rows == 0
    assert lake.to_arrow(table, [("topic", "=", "Orders")]).num_rows == sum(
        r["topic"] == "Orders" for r in want.values()
    )


def test_unreadable_tables_and_bad_commits_are_clear_errors(spark, tmp_path, own_lake):
    dv = tmp_path / "dv"
    write_deltalake(str(dv), pa.table({"a": [1, 2]}), configuration={"delta.enableDeletionVectors": "true"})
    spark.sql(f"DELETE FROM delta.`{dv}` WHERE a = 1")  # delta-spark marks the row in a deletion vector
    assert [r.a for r in spark_tables.read_table(spark, dv).collect()] == [2]  # Delta's reader applies it
    with pytest.raises(lake.LakeError, match="deletionVectors"):
        lake.snapshot_files(dv)  # its data file alone still holds the deleted row
    with pytest.raises(lake.LakeError, match="not a Delta table"):
        spark_tables.read_table(spark, tmp_path / "nothing")
    with pytest.raises(lake.LakeError, match="does not exist"):
        spark_tables.register(spark, tmp_path / "no-lake")

    table = own_lake / "messages"
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"a": [1]}), outside)
    with pytest.raises(lake.LakeError, match="not under the table root"):
        lake.add_actions(table, [outside], PARTS)
    flat = table / "flat.parquet"
    pq.write_table(pa.table({"a": [1]}), flat)
    with pytest.raises(lake.LakeError, match="no directory for partition column"):
        lake.add_actions(table, [flat], PARTS)
    with pytest.raises(lake.LakeError, match="partitioned by"):
        lake.commit_files(table, [], schema=table_schema(), partition_by=["topic"], app_id="p", version=1)
    assert lake.transaction_version(table, "p") is None


def test_empty_table_reads_as_no_rows(spark, tmp_path):
    table = tmp_path / "quality_results"
    schema = pa.schema([pa.field("segment", pa.string()), pa.field("ok", pa.bool_())])
    assert lake.commit_files(table, [], schema=schema, partition_by=[], app_id="qr", version=1) == 0
    df = spark_tables.read_table(spark, table)
    assert df.count() == 0 and df.columns == ["segment", "ok"]
    assert json.loads(json.dumps(spark_tables.register(spark, tmp_path))) == ["quality_results"]


def test_files_laid_out_anyhow_read_with_the_log_partition_values(spark, tmp_path):
    """Same file names in several partitions, and values that need escaping in a directory name."""
    table = tmp_path / "t"
    schema = pa.schema([pa.field("n", pa.int64()), pa.field("topic", pa.string())])
    files = []
    for i, topic in enumerate(["%RETRY%grp", "a:b c", "plain"]):
        d = table / f"topic={topic.replace('%', '%25').replace(':', '%3A')}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"n": [i, i + 10]}), d / "data.parquet")
        files.append(d / "data.parquet")
    adds = lake.add_actions(table, files, ["topic"])
    assert [a.partition_values for a in adds] == [{"topic": "%RETRY%grp"}, {"topic": "a:b c"}, {"topic": "plain"}]
    assert lake.commit_files(table, adds, schema=schema, partition_by=["topic"], app_id="x", version=1) == 0
    rows = sorted(tuple(r) for r in spark_tables.read_table(spark, table).collect())
    assert rows == [(0, "%RETRY%grp"), (1, "a:b c"), (2, "plain"), (10, "%RETRY%grp"), (11, "a:b c"), (12, "plain")]
