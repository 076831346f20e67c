"""The tier's Delta tables under a lake root: the names the tier job writes and the broker reads, where each
table lives, how it is partitioned and its schema.

Table properties (log / deleted-file retention, checkpoints, txn ids never expiring) are lake/delta.py's
``TABLE_PROPERTIES``, set when a table is created.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lake.schema import BROKER_NAME, BROKER_NAME_FIELD, MESSAGE_FIELDS

MESSAGES = "messages"  # one row per tiered record (lake/schema.py), by broker name, topic and UTC store date
SEGMENTS = "segments"  # one row per tiered CommitLog segment, with the queue offset ranges it held
STORE_DATE = "store_date"  # UTC date of store_timestamp: partitions close at UTC midnight
QUALITY_RESULTS = "quality_results"
REPORTS_DIR = "_reports"

# broker first: a broker's fall-through reads (lake/reader.py) and a per-broker query prune to its
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


def table_uri(lake: str | Path, name: str) -> str:
    """The table's location: ``lake/name``, absolute for a local lake, as is for an ``s3://`` one."""
    if str(lake).startswith("s3://"):
        return f"{str(lake).rstrip('/')}/{name}"
    return str(Path(lake).absolute() / name)
