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
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from store.format.msgid import parse_host_string
from store.format.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from store.format.records import MessageRecord, RecordError, encode_record

if TYPE_CHECKING:
    import pyarrow as pa

_host = lru_cache(maxsize=4096)(parse_host_string)  # a lake holds few distinct hosts: parse each once


def encode_property_pairs(pairs: Iterable[tuple[str, str]]) -> bytes:
    """``name 0x01 value 0x02`` per (name, value), in the given order (duplicates kept)."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in pairs).encode("utf-8")


def record_from_row(row: Mapping[str, Any], source: str = "") -> bytes:
    """The CommitLog record a ``messages`` row was decoded from.  ``source`` names the row's file in errors."""
    props = row["properties"] or ()
    pairs = props.items() if isinstance(props, Mapping) else props  # pyarrow gives a map as (key, value) pairs
    return _encode(row, row["topic"], encode_property_pairs(pairs), source)


_FIELDS = (
    "queue_id", "body", "flag", "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host",
    "reconsume_times", "prepared_txn_offset", "queue_offset", "commitlog_offset", "body_crc", "magic", "msg_size",
)  # fmt: skip


def records_from_table(table: pa.Table, topic: str, source: str = "") -> list[bytes]:
    """:func:`record_from_row` for every row of an Arrow table of ``messages`` columns (all of one topic, the
    partition column left out): the properties strings are joined by Arrow, the rest is one encode per row."""
    columns = {name: table.column(name).to_pylist() for name in _FIELDS}
    props = _properties_strings(table.column("properties"))
    rows = ({name: columns[name][i] for name in _FIELDS} for i in range(table.num_rows))
    return [_encode(row, topic, p or b"", source) for row, p in zip(rows, props, strict=True)]


def _properties_strings(column: pa.ChunkedArray) -> list[bytes | None]:
    """Each row's ``map<string, string>`` as the stored ``name 0x01 value 0x02 ...`` string (None: null map)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    maps = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(maps) == 0:
        return []
    maps = pa.concat_arrays([maps])  # unsliced: offsets then index the children from 0
    entries = pc.binary_join_element_wise(maps.keys, maps.items, NAME_VALUE_SEPARATOR)
    entries = pc.binary_join_element_wise(entries, "", PROPERTY_SEPARATOR)  # a separator after every entry
    lists = pa.ListArray.from_arrays(maps.offsets, entries, mask=maps.is_null())
    return [None if v is None else v.encode("utf-8") for v in pc.binary_join(lists, "").to_pylist()]


def _encode(row: Mapping[str, Any], topic: str, properties: bytes, source: str) -> bytes:
    rec = MessageRecord(
        topic=topic,
        queue_id=row["queue_id"],
        body=row["body"],
        properties=properties,
        flag=row["flag"],
        sys_flag=row["sys_flag"],
        born_timestamp=row["born_timestamp"],
        born_host=_host(row["born_host"]),
        store_timestamp=row["store_timestamp"],
        store_host=_host(row["store_host"]),
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
