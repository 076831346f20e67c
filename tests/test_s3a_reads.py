"""Spark reads a Delta table on S3 with Delta Lake over Hadoop's S3A (lake/delta.py read_table), against
moto's server (tests/s3_server.py) and a local Spark session: filtered reads skip the files and row groups they do
not need, and no AWS credential shows in the plan or the session's configuration.

Pruning is shown by damage a pruned read cannot notice: once the reference rows are read, the files a filter
rules out are deleted from the bucket and the row groups it rules out are overwritten with zeros.  The filtered
reads still return exactly the reference's matching rows, while an unfiltered read now fails on what was
damaged.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.s3_server import BUCKET, KEY_ID, SECRET, S3Server, aws_env

SCHEMA = pa.schema([
    pa.field("broker_name", pa.string(), nullable=False), pa.field("topic", pa.string(), nullable=False),
    pa.field("queue_offset", pa.int64(), nullable=False), pa.field("store_timestamp", pa.int64(), nullable=False),
    pa.field("body", pa.binary(), nullable=False),
])  # fmt: skip
PARTITION_BY = ["broker_name", "topic"]
ROW_GROUP = 10
# (broker, topic) -> (first queue offset, rows, first store timestamp): a-T1 has three row groups
FILES = {("broker-a", "T1"): (0, 30, 1_000), ("broker-a", "T2"): (0, 10, 2_000), ("broker-b", "T1"): (0, 10, 3_000)}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("snapshot_s3")).start()
    try:
        with aws_env(server.env()):
            yield server
    finally:
        server.stop()


def _rows(broker: str, topic: str) -> list[dict]:
    first, n, ts = FILES[(broker, topic)]
    return [{"broker_name": broker, "topic": topic, "queue_offset": first + i, "store_timestamp": ts + i,
             "body": f"{broker}/{topic}/{first + i}".encode()} for i in range(n)]  # fmt: skip


def _write_table(root: Path, uri: str) -> dict[tuple[str, str], Path]:
    """The Delta table at ``uri``: one file per (broker, topic), ``ROW_GROUP`` rows a row group; returns the
    local copies of the files by partition."""
    from lake import delta as lk
    from lake import objectstore

    files = {}
    for broker, topic in FILES:
        path = root / f"broker_name={broker}" / f"topic={topic}" / "part-0.parquet"
        path.parent.mkdir(parents=True)
        data = pa.Table.from_pylist(_rows(broker, topic), SCHEMA).drop_columns(PARTITION_BY)
        pq.write_table(data, path, row_group_size=ROW_GROUP)
        files[(broker, topic)] = path
    objectstore.upload(list(files.values()), root, uri)
    adds = lk.add_actions(root, list(files.values()), PARTITION_BY)
    assert lk.commit_files(uri, adds, schema=SCHEMA, partition_by=PARTITION_BY, app_id="t", version=1) == 0
    return files


def _zero_row_groups(path: Path, row_groups: list[int]) -> bytes:
    """``path``'s bytes with every column chunk of ``row_groups`` overwritten with zeros (the footer intact)."""
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    for rg in row_groups:
        for c in range(meta.num_columns):
            chunk = meta.row_group(rg).column(c)
            start = chunk.dictionary_page_offset or chunk.data_page_offset
            data[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    return bytes(data)


def _collect(df) -> list[dict]:
    rows = [r.asDict() for r in df.collect()]
    for r in rows:
        r["body"] = bytes(r["body"])
    return _sorted(rows)


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["broker_name"], r["topic"], r["queue_offset"]))


@pytest.mark.spark
def test_filtered_reads_skip_files_and_row_groups_and_return_the_same_rows(spark, s3, tmp_path):
    from pyspark.sql import functions as F

    from pipelines import spark_tables

    uri = f"s3://{BUCKET}/pruning/messages"
    local = _write_table(tmp_path / "table", uri)
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in local.values()] == [3, 1, 1]
    reference = _collect(spark_tables.read_table(spark, uri))  # everything, before any damage
    assert reference == _sorted([r for key in FILES for r in _rows(*key)])

    # Damage what the filters below rule out: the a-T1 file's first and last row groups, the other two files
    s3_client = s3._client()

    def key(broker: str, topic: str) -> str:
        return f"pruning/messages/broker_name={broker}/topic={topic}/part-0.parquet"

    damaged = _zero_row_groups(local[("broker-a", "T1")], [0, 2])
    s3_client.put_object(Bucket=BUCKET, Key=key("broker-a", "T1"), Body=damaged)
    for broker, topic in [("broker-a", "T2"), ("broker-b", "T1")]:
        s3_client.delete_object(Bucket=BUCKET, Key=key(broker, topic))

    def expect(keep) -> list[dict]:
        return [r for r in reference if keep(r)]

    table = spark_tables.read_table(spark, uri)
    # partition values (=, IN) prune the other files; queue-offset bounds prune a-T1's first and last row groups
    by_partition = table.where((F.col("broker_name") == "broker-a") & F.col("topic").isin("T1", "T9")
                               & F.col("queue_offset").between(12, 17))  # fmt: skip
    assert _collect(by_partition) == expect(
        lambda r: (r["broker_name"], r["topic"]) == ("broker-a", "T1") and 12 <= r["queue_offset"] <= 17
    )
    # store-time bounds alone: the Delta log's min/max statistics prune the files, Parquet's the row groups
    by_time = table.where((F.col("store_timestamp") >= 1_010) & (F.col("store_timestamp") < 1_020))
    assert _collect(by_time) == expect(lambda r: 1_010 <= r["store_timestamp"] < 1_020)
    # a filter that rules out everything reads nothing
    assert table.where(F.col("queue_offset") > 1_000).count() == 0

    # the damage is there: an unfiltered read, or one whose bounds reach it, fails
    with pytest.raises(Exception, match="broker_name=broker-b"):
        spark_tables.read_table(spark, uri).where(F.col("broker_name") == "broker-b").collect()
    with pytest.raises(Exception):  # noqa: B017 - a corrupt page: pyarrow's error text is its own
        own = (F.col("topic") == "T1") & (F.col("broker_name") == "broker-a")
        spark_tables.read_table(spark, uri).where(own).collect()


@pytest.mark.spark
def test_no_aws_credential_shows_in_the_plan_or_the_configuration(spark, s3, tmp_path):
    from pyspark.sql import functions as F

    from pipelines import spark_tables

    uri = f"s3://{BUCKET}/settings/messages"
    _write_table(tmp_path / "table", uri)
    df = spark_tables.read_table(spark, uri).where(F.col("topic") == "T1")
    qe = df._jdf.queryExecution()
    utils = spark.sparkContext._jvm.PythonSQLUtils
    plans = qe.toString() + utils.explainString(qe, "formatted")  # what explain() and the UI's SQL tab show
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    conf = str(spark.sparkContext.getConf().getAll()) + str(spark.conf.getAll) + hadoop.toString()
    props = dict(hadoop.getPropsWithPrefix("fs.s3a."))
    for text in (plans, conf, str(props)):
        assert KEY_ID not in text and SECRET not in text
    assert props["aws.credentials.provider"].endswith("DefaultCredentialsProvider")  # the SDK's standard chain
    assert "s3a" in plans or "S3A" in plans or uri in plans
    assert len(df.collect()) == FILES[("broker-a", "T1")][1] + FILES[("broker-b", "T1")][1]
