"""The tier's Delta tables under ``--lake``: names, schemas, and appends of small driver-side tables.

Table properties (log / deleted-file retention, checkpoints, txn ids never expiring) are lake.py's
``TABLE_PROPERTIES``, set when a table is created.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from broker.lake import objectstore
from pipelines.schema import BROKER_NAME, BROKER_NAME_FIELD, MESSAGE_FIELDS
from store.tier_tables import MESSAGES as MESSAGES  # re-exported: where the tier job's users look for them
from store.tier_tables import SEGMENTS as SEGMENTS
from store.tier_tables import STORE_DATE as STORE_DATE
from store.tier_tables import table_uri as table_uri

QUALITY_RESULTS = "quality_results"
REPORTS_DIR = "_reports"

# broker first: a broker's fall-through reads (broker/lake/reader.py) and a per-broker query prune to its
# own directory, and each tiering run (one store, one broker) adds files under one broker_name= directory
MESSAGES_PARTITION_BY = [BROKER_NAME, "topic", STORE_DATE]
ROW_GROUP_BYTES = 8 * 1024 * 1024  # encoded row group size of the messages table
ROW_GROUP_ROWS = 8192  # and at most this many rows (the compaction writer counts only rows)
MESSAGES_SCHEMA = pa.schema([*MESSAGE_FIELDS, BROKER_NAME_FIELD, pa.field(STORE_DATE, pa.date32(), nullable=False)])

QUEUE_RANGE = pa.struct(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("first_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)

SEGMENTS_SCHEMA = pa.schema(
    [
        pa.field("store_id", pa.string(), nullable=False),
        BROKER_NAME_FIELD,
        pa.field("segment", pa.string(), nullable=False),
        pa.field("base_offset", pa.int64(), nullable=False),
        pa.field("file_size", pa.int64(), nullable=False),
        pa.field("record_count", pa.int64(), nullable=False),
        pa.field("valid_bytes", pa.int64(), nullable=False),
        pa.field("min_commitlog_offset", pa.int64()),
        pa.field("max_commitlog_offset", pa.int64()),
        pa.field("min_queue_offset", pa.int64()),
        pa.field("max_queue_offset", pa.int64()),
        pa.field("min_store_timestamp", pa.int64()),
        pa.field("max_store_timestamp", pa.int64()),
        pa.field("file_crc32c", pa.int64(), nullable=False),
        pa.field("body_crc_sum", pa.int64(), nullable=False),
        pa.field("queue_ranges", pa.list_(QUEUE_RANGE)),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("messages_version", pa.int64(), nullable=False),
        pa.field("tiered_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def append_arrow(table_uri: str, table: pa.Table, *, app_id: str, version: int) -> int | None:
    """Append a small driver-side table as one parquet file, committed through lake.commit_files (so the
    same txn check, table properties and commit path as the Spark-written data)."""
    from pipelines import lake

    remote = objectstore.is_remote(table_uri)
    if remote:  # written locally (its stats come from the footer), uploaded, then committed
        recorded = lake.transaction_version(table_uri, app_id)
        if recorded is not None and version <= recorded:
            return None
        root = objectstore.local_staging_root() / f"append-{uuid.uuid4().hex}"
    else:
        root = Path(table_uri)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"part-{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(table, path)
        adds = lake.add_actions(root, [path])
        if remote:
            objectstore.upload([path], root, table_uri)
        committed = lake.commit_files(
            table_uri, adds, schema=table.schema, partition_by=[], app_id=app_id, version=version
        )
    finally:
        if remote:
            shutil.rmtree(root, ignore_errors=True)
    if committed is None and not remote:
        path.unlink(missing_ok=True)  # already committed by an earlier attempt: this copy is not needed
    return committed
