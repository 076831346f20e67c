"""The tier's Delta tables under a lake root: the names the tier job writes and the broker reads, where each
table lives and how it is partitioned.  Their columns are lake/schema.py's.  No pyarrow here: the broker imports
these names at start, and reads the lake only when it has one.

Table properties (log / deleted-file retention, checkpoints, txn ids never expiring) are lake/delta.py's
``TABLE_PROPERTIES``, set when a table is created.
"""

from __future__ import annotations

from pathlib import Path

MESSAGES = "messages"  # one row per tiered record (lake/schema.py), by broker name, topic and UTC store date
SEGMENTS = "segments"  # one row per tiered CommitLog segment, with the queue offset ranges it held
STORE_DATE = "store_date"  # UTC date of store_timestamp: partitions close at UTC midnight
# The broker group whose store held the record: the first partition of ``messages``, a column of ``segments``
BROKER_NAME = "broker_name"
QUALITY_RESULTS = "quality_results"
# Typed per-topic tables (lake/typed.py): the declared body schemas, the typed tables (one per topic, under
# TYPED_DIR, named in SQL by the topic) and the bodies that did not decode
SCHEMAS_DIR = "_schemas"
TYPED_DIR = "typed"
DECODE_ERRORS = "decode_errors"
REPORTS_DIR = "_reports"

# broker first: a broker's fall-through reads (lake/reader.py) and a per-broker query prune to its
# own directory, and each tiering run (one store, one broker) adds files under one broker_name= directory
MESSAGES_PARTITION_BY = [BROKER_NAME, "topic", STORE_DATE]
ROW_GROUP_BYTES = 8 * 1024 * 1024  # encoded row group size of the messages table
ROW_GROUP_ROWS = 8192  # and at most this many rows (the compaction writer counts only rows)


def typed_table_uri(lake: str | Path, topic: str) -> str:
    """Where ``topic``'s typed table lives: ``lake/typed/<topic>``."""
    return table_uri(lake, f"{TYPED_DIR}/{topic}")


def table_uri(lake: str | Path, name: str) -> str:
    """The table's location: ``lake/name``, absolute for a local lake, as is for an ``s3://`` one."""
    if str(lake).startswith("s3://"):
        return f"{str(lake).rstrip('/')}/{name}"
    return str(Path(lake).absolute() / name)
