"""Tiered rows back into CommitLog records: a row of the Delta ``messages`` table (the canonical schema of
``pipelines/schema.py``) encodes to exactly the bytes the CommitLog held, so the broker can serve history it
has deleted locally as if from its own files.

Every field of a record is a column of the row; the properties string is rebuilt from the ``properties``
map in stored order (``name 0x01 value 0x02`` per entry, as every RocketMQ version writes it).  The row's
``msg_size`` is the stored TOTALSIZE: a rebuilt record of another length (a properties string no writer
produces, with a segment ``string2messageProperties`` drops) raises instead of serving different bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from store.format.msgid import parse_host_string
from store.format.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from store.format.records import MessageRecord, RecordError, encode_record


def encode_property_pairs(pairs: Iterable[tuple[str, str]]) -> bytes:
    """``name 0x01 value 0x02`` per (name, value), in the given order (duplicates kept)."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in pairs).encode("utf-8")


def record_from_row(row: Mapping[str, Any], source: str = "") -> bytes:
    """The CommitLog record a ``messages`` row was decoded from.  ``source`` names the row's file in errors."""
    props = row["properties"] or ()
    pairs = props.items() if isinstance(props, Mapping) else props  # pyarrow gives a map as (key, value) pairs
    rec = MessageRecord(
        topic=row["topic"],
        queue_id=row["queue_id"],
        body=row["body"],
        properties=encode_property_pairs(pairs),
        flag=row["flag"],
        sys_flag=row["sys_flag"],
        born_timestamp=row["born_timestamp"],
        born_host=parse_host_string(row["born_host"]),
        store_timestamp=row["store_timestamp"],
        store_host=parse_host_string(row["store_host"]),
        reconsume_times=row["reconsume_times"],
        prepared_transaction_offset=row["prepared_txn_offset"],
        queue_offset=row["queue_offset"],
        physical_offset=row["commitlog_offset"],
        body_crc=row["body_crc"],
        magic=row["magic"],
    )
    data = encode_record(rec)
    if len(data) != row["msg_size"]:
        raise RecordError(
            row["commitlog_offset"],
            f"the tiered row rebuilds to {len(data)} bytes, the CommitLog record had {row['msg_size']}",
            source,
        )
    return data
