"""The one canonical message schema: CommitLog source, Delta ``messages`` table and replay all use it.

Timestamps stay RocketMQ's Java milliseconds (``timestamp_millis(store_timestamp)`` in SQL) so a row
carries exactly what the record held and a replay can reproduce it.
"""

from __future__ import annotations

import pyarrow as pa

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


def spark_schema(schema: pa.Schema = MESSAGE_SCHEMA):
    """The same schema as a Spark ``StructType`` (pyspark imported only when asked)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
