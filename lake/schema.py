"""The one canonical message schema: CommitLog source, Delta ``messages`` table, the broker's lake reader and
replay all take their columns from it; and the schemas of the tier's ``messages`` and ``segments`` tables and of
the segment scan, built on it.

Timestamps stay RocketMQ's Java milliseconds (``timestamp_millis(store_timestamp)`` in SQL) so a row
carries exactly what the record held and a replay can reproduce it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from lake.tables import BROKER_NAME, STORE_DATE

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

MESSAGE_FIELDS: list[pa.Field] = [
    pa.field("topic", pa.string(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("queue_offset", pa.int64(), nullable=False),
    pa.field("commitlog_offset", pa.int64(), nullable=False),
    pa.field("msg_size", pa.int32(), nullable=False),
    pa.field("magic", pa.int32(), nullable=False),
    pa.field("body_crc", pa.int32(), nullable=False),
    pa.field("crc_ok", pa.bool_(), nullable=False),
    pa.field("flag", pa.int32(), nullable=False),
    pa.field("sys_flag", pa.int32(), nullable=False),
    pa.field("born_timestamp", pa.int64(), nullable=False),
    pa.field("born_host", pa.string(), nullable=False),
    pa.field("store_timestamp", pa.int64(), nullable=False),
    pa.field("store_host", pa.string(), nullable=False),
    pa.field("reconsume_times", pa.int32(), nullable=False),
    pa.field("prepared_txn_offset", pa.int64(), nullable=False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.string()),
    pa.field("uniq_key", pa.string()),
    pa.field("msg_id", pa.string(), nullable=False),  # the broker's offset msgId
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("body", pa.binary(), nullable=False),
    pa.field("segment", pa.string(), nullable=False),  # the CommitLog file name (20-digit base offset)
    pa.field("position", pa.int32(), nullable=False),  # byte position inside that file
]

MESSAGE_SCHEMA = pa.schema(MESSAGE_FIELDS)
MESSAGE_COLUMNS: list[str] = [f.name for f in MESSAGE_FIELDS]
# Columns that are no bytes of the record: what the decoder concluded (``crc_ok``; ``msg_id``, made of the store
# host and the CommitLog offset) and where the record lay (``segment``, ``position``).  The others are the
# record's fields, and ``tags``, ``keys`` and ``uniq_key`` as its properties hold them: a reader that serves
# records reads these, and ``lake.rebuild`` encodes the record from them.
NOT_IN_RECORD = frozenset({"crc_ok", "msg_id", "segment", "position"})
RECORD_COLUMNS: list[str] = [c for c in MESSAGE_COLUMNS if c not in NOT_IN_RECORD]

# The broker group whose store held the record.  Not in the record itself (a CommitLog knows no broker name),
# so not in MESSAGE_FIELDS, which is what the commitlog source decodes: the tier adds it to every row of the
# ``messages`` table (lake/tables.py), where it is the first partition column.  Segment names
# and CommitLog offsets repeat from broker to broker; (broker_name, segment) and (broker_name, commitlog_offset)
# do not.
BROKER_NAME_FIELD = pa.field(BROKER_NAME, pa.string(), nullable=False)

# The ``messages`` table: a row per record, with its broker and UTC store date (the partition columns).
MESSAGES_SCHEMA = pa.schema([*MESSAGE_FIELDS, BROKER_NAME_FIELD, pa.field(STORE_DATE, pa.date32(), nullable=False)])

# The fixed columns of a topic's typed table (lake/typed.py), before the declared body fields: where the
# message lay and what identifies it.  All are the ``messages`` table's columns, under the same names.
TYPED_FIXED_FIELDS: list[pa.Field] = [
    MESSAGES_SCHEMA.field(name)
    for name in ("topic", "queue_id", "queue_offset", "keys", "tags", "store_timestamp", "msg_id", BROKER_NAME)
]
TYPED_FIXED_SCHEMA = pa.schema(TYPED_FIXED_FIELDS)
# The ``decode_errors`` table: a row per body that did not decode with its topic's declared schema, with why
# and the body as it was.
DECODE_ERRORS_SCHEMA = pa.schema(
    [
        *TYPED_FIXED_FIELDS,
        pa.field("schema_kind", pa.string(), nullable=False),  # json | avro | protobuf
        pa.field("reason", pa.string(), nullable=False),
        MESSAGES_SCHEMA.field("body"),
    ]
)

QUEUE_RANGE = pa.struct(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("first_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)

# The ``segments`` table: a row per tiered CommitLog segment, with the queue offset ranges it held.
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


def spark_schema(schema: pa.Schema = MESSAGE_SCHEMA) -> StructType:
    """The same schema as a Spark ``StructType`` (pyspark imported only when asked)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


# One row per CommitLog segment file: the ``segments`` view of the commitlog source and
# ``pipelines.segment_reader.scan_segment`` (positions are bytes inside the file, offsets are CommitLog offsets).
SEGMENT_FACTS_FIELDS: list[pa.Field] = [
    pa.field("segment", pa.string(), nullable=False),  # file name (20-digit base offset)
    pa.field("path", pa.string(), nullable=False),
    pa.field("base_offset", pa.int64(), nullable=False),
    pa.field("file_size", pa.int64(), nullable=False),
    pa.field("record_count", pa.int64(), nullable=False),
    pa.field("valid_bytes", pa.int64(), nullable=False),  # where the last valid record ends
    pa.field("ends_with_blank", pa.bool_(), nullable=False),
    pa.field("torn_tail", pa.bool_(), nullable=False),  # bytes after the data that are not a whole record
    pa.field("torn_tail_bytes", pa.int64(), nullable=False),
    pa.field("crc_errors", pa.int64(), nullable=False),  # records whose body CRC does not match
    pa.field("first_store_timestamp", pa.int64()),
    pa.field("last_store_timestamp", pa.int64()),
    pa.field("min_commitlog_offset", pa.int64()),
    pa.field("max_commitlog_offset", pa.int64()),
    pa.field("error", pa.string()),  # the first decode error, naming file and position
]

SEGMENT_FACTS_SCHEMA = pa.schema(SEGMENT_FACTS_FIELDS)
