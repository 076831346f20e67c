"""Tiered rows back into CommitLog records: a row of the Delta ``messages`` table (the canonical schema of
``lake/schema.py``) encodes to exactly the bytes the CommitLog held, so the broker can serve history it
has deleted locally as if from its own files.

Every field of a record is a column of the row; the properties string is rebuilt from the ``properties``
map in stored order (``name 0x01 value 0x02`` per entry, as every RocketMQ version writes it).  The row's
``msg_size`` is the stored TOTALSIZE: a rebuilt record of another length (a properties string no writer
produces, with a segment ``string2messageProperties`` drops) raises instead of serving different bytes.

:func:`record_from_row` encodes one row (the reference); :func:`records_blob` builds a whole row group's
records at once into one buffer, so a reader can keep them and serve each pull as slices of it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from store.format.msgid import pack_ip, parse_host_string
from store.format.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from store.format.records import (
    BORNHOST_V6_FLAG,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MESSAGE_MAGIC_V2,
    STOREHOSTADDRESS_V6_FLAG,
    MessageRecord,
    RecordEncodeError,
    RecordError,
    encode_record,
    header_fields,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_SHORT = struct.Struct(">h")
_host = lru_cache(maxsize=4096)(parse_host_string)  # a lake holds few distinct hosts: parse each once


def encode_property_pairs(pairs: Iterable[tuple[str, str]]) -> bytes:
    """``name 0x01 value 0x02`` per (name, value), in the given order (duplicates kept)."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in pairs).encode("utf-8")


def record_from_row(row: Mapping[str, Any], source: str = "") -> bytes:
    """The CommitLog record a ``messages`` row was decoded from.  ``source`` names the row's file in errors."""
    props = row["properties"] or ()
    pairs = props.items() if isinstance(props, Mapping) else props  # pyarrow gives a map as (key, value) pairs
    return _encode(row, row["topic"], encode_property_pairs(pairs), source)


def records_from_table(table: pa.Table, topic: str, source: str = "") -> list[bytes]:
    """:func:`record_from_row` for every row of an Arrow table of ``messages`` columns (all of one topic, the
    partition column left out)."""
    return [r.tobytes() for r in records_blob(table, topic, source).all()]


@dataclass(frozen=True, slots=True)
class RecordBlob:
    """The records of many rows laid end to end: record ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

    ``data`` is a read-only view of the buffer Arrow built them in (copying 8 MiB into a new ``bytes``
    faulted in fresh pages: about 5 ms of a row group's 15), and so is every record handed out: each keeps
    the whole buffer alive while it is held (``bytes(record)`` for a copy that does not)."""

    data: memoryview
    offsets: np.ndarray  # int64, one more than there are records

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.offsets.nbytes

    def records(self, indices: Sequence[int]) -> list[memoryview]:
        import numpy as np

        at = np.asarray(indices, np.int64)
        data = self.data
        if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) < 2 or (np.diff(at) == 1).all()):
            bounds = self.offsets[at[0] : at[-1] + 2].tolist()  # a run of rows: their records are adjacent
            return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        return [data[a:b] for a, b in zip(self.offsets[at].tolist(), self.offsets[at + 1].tolist(), strict=True)]

    def all(self) -> list[memoryview]:
        bounds = self.offsets.tolist()
        data = self.data
        return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def records_blob(table: pa.Table, topic: str, source: str = "") -> RecordBlob:
    """The records of every row of ``table`` (``messages`` columns, all of one topic, the partition column left
    out), built at once: the fixed header of all rows is laid out by a numpy record dtype derived from
    :func:`~store.format.records.header_fields`, the body CRC is the stored one, and Arrow joins header, body,
    topic and properties into one buffer.  Equal, record for record, to :func:`record_from_row`; a row whose
    record would not be ``msg_size`` bytes raises :class:`RecordError` naming it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    if n == 0:
        return RecordBlob(memoryview(b""), np.zeros(1, np.int64))

    def ints(name: str) -> np.ndarray:
        return table.column(name).to_numpy()

    topic_b = topic.encode("utf-8")
    if len(topic_b) > 0x7FFF:
        raise RecordEncodeError(f"topic of {len(topic_b)} bytes is too long")
    magic = ints("magic")
    v2 = magic == MESSAGE_MAGIC_V2
    if len(topic_b) > MAX_TOPIC_LENGTH_V1 and not v2.all():
        raise RecordEncodeError(f"topic of {len(topic_b)} bytes needs the V2 record format")
    body = _large_binary(table.column("body"))
    props = _large_binary(_properties_array(table.column("properties")))
    body_len = pc.binary_length(body).to_numpy()
    props_len = pc.binary_length(props).to_numpy()
    if n and int(props_len.max()) > MAX_PROPERTIES_LENGTH:
        raise RecordEncodeError(f"properties of {int(props_len.max())} bytes exceed {MAX_PROPERTIES_LENGTH}")
    born_ip, born_port, born_v6 = _hosts(table.column("born_host"))
    store_ip, store_port, store_v6 = _hosts(table.column("store_host"))
    sys_flag = (ints("sys_flag") & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) | np.where(
        born_v6, BORNHOST_V6_FLAG, 0) | np.where(store_v6, STOREHOSTADDRESS_V6_FLAG, 0)  # fmt: skip
    tail_len = np.where(v2, 2, 1) + len(topic_b) + 2  # TOPICLENGTH + TOPIC + PROPERTIESLENGTH

    columns = {
        "magic": magic, "body_crc": ints("body_crc"), "queue_id": ints("queue_id"), "flag": ints("flag"),
        "queue_offset": ints("queue_offset"), "physical_offset": ints("commitlog_offset"), "sys_flag": sys_flag,
        "born_timestamp": ints("born_timestamp"), "born_port": born_port, "store_timestamp": ints("store_timestamp"),
        "store_port": store_port, "reconsume_times": ints("reconsume_times"),
        "prepared_transaction_offset": ints("prepared_txn_offset"), "body_length": body_len,
    }  # fmt: skip
    total = np.empty(n, np.int64)
    heads: list[tuple[np.ndarray, np.ndarray]] = []
    for b6 in (False, True):
        for s6 in (False, True):
            rows = np.flatnonzero((born_v6 == b6) & (store_v6 == s6))
            if not len(rows):
                continue
            at: slice | np.ndarray = slice(None) if len(rows) == n else rows  # all rows: no copies to select them
            dtype = _header_dtype(b6, s6)
            head = np.zeros(len(rows), dtype)
            total[at] = dtype.itemsize + body_len[at] + tail_len[at] + props_len[at]
            head["total_size"] = total[at]
            for name, values in columns.items():
                head[name] = values[at]
            head["born_ip"] = born_ip[at, : dtype["born_ip"].shape[0]]
            head["store_ip"] = store_ip[at, : dtype["store_ip"].shape[0]]
            heads.append((rows, head.view(np.uint8).reshape(len(rows), dtype.itemsize)))
    tails: list[tuple[np.ndarray, np.ndarray]] = []
    for wide in (False, True):
        rows = np.flatnonzero(v2 == wide)
        if not len(rows):
            continue
        prefix = (_SHORT.pack(len(topic_b)) if wide else bytes((len(topic_b),))) + topic_b
        tail = np.empty((len(rows), len(prefix) + 2), np.uint8)
        tail[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
        tail[:, len(prefix) :] = props_len[rows].astype(">i2").view(np.uint8).reshape(-1, 2)
        tails.append((rows, tail))

    msg_size = ints("msg_size")
    bad = np.flatnonzero(total != msg_size)
    if len(bad):
        i = int(bad[0])
        raise RecordError(
            int(columns["physical_offset"][i]),
            f"the tiered row rebuilds to {int(total[i])} bytes, the CommitLog record had {int(msg_size[i])}",
            source,
        )
    joined = pc.binary_join_element_wise(
        _binary_rows(heads, n), body, _binary_rows(tails, n), props, pa.scalar(b"", pa.large_binary())
    )
    offsets = np.frombuffer(joined.buffers()[1], np.int64, n + 1, joined.offset * 8)
    data = memoryview(joined.buffers()[2]).cast("B")  # Arrow exports signed chars; records are unsigned bytes
    return RecordBlob(data[int(offsets[0]) :], offsets - offsets[0])


def _header_dtype(born_v6: bool, store_v6: bool) -> np.dtype:
    """The record header as a numpy record dtype: the fields and order of ``header_fields``, big-endian."""
    import numpy as np

    codes = {"i": ">i4", "q": ">i8"}
    return np.dtype([
        (name, codes[code] if code in codes else ("u1", (int(code[:-1]),)))
        for name, code in header_fields(born_v6, store_v6)
    ])  # fmt: skip


def _hosts(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(address bytes as (n, 16) uint8 — an IPv4 one in the first 4 —, port, is IPv6) of ``ip:port`` strings:
    each distinct host parsed once."""
    import numpy as np
    import pyarrow as pa

    coded = _one_array(column)
    if not pa.types.is_dictionary(coded.type):  # a reader may ask parquet for the dictionary it stores
        coded = coded.dictionary_encode()
    hosts = [_host(h) for h in coded.dictionary.to_pylist()]
    packed = [pack_ip(ip) for ip, _ in hosts]
    ips = np.zeros((len(hosts), 16), np.uint8)
    for k, raw in enumerate(packed):
        ips[k, : len(raw)] = np.frombuffer(raw, np.uint8)
    ports = np.array([port for _, port in hosts], np.int64)
    v6 = np.array([len(raw) == 16 for raw in packed], bool)
    idx = coded.indices.to_numpy()
    return ips[idx], ports[idx], v6[idx]


def _binary_rows(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> pa.Array:
    """A large-binary array of ``n`` values from (row indices, their values as a 2-D uint8 array) parts."""
    import numpy as np
    import pyarrow as pa

    if len(parts) == 1 and len(parts[0][0]) == n:  # every row of one width (the usual case): the values are the data
        values = np.ascontiguousarray(parts[0][1])
        offsets = np.arange(n + 1, dtype=np.int64) * values.shape[1]
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values.reshape(-1))]
        )
    widths = np.zeros(n, np.int64)
    for rows, values in parts:
        widths[rows] = values.shape[1]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(widths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    for rows, values in parts:
        data[offsets[rows][:, None] + np.arange(values.shape[1])] = values
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _large_binary(column: Any) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = _one_array(column).cast(pa.large_binary())
    return pc.fill_null(arr, pa.scalar(b"", pa.large_binary())) if arr.null_count else arr


def _one_array(column: Any) -> pa.Array:
    """A column as one array: a chunked one of a single chunk without copying it."""
    import pyarrow as pa

    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _properties_array(column: pa.ChunkedArray) -> pa.Array:
    """Each row's ``map<string, string>`` as the stored ``name 0x01 value 0x02 ...`` string (null: null map)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    maps = _one_array(column)
    if len(maps) == 0:
        return pa.array([], pa.string())
    if maps.offset:
        maps = pa.concat_arrays([maps])  # unsliced: offsets then index the children from 0
    # name 0x01 value 0x02: the separators as scalar parts joined with an empty separator, in one pass
    entries = pc.binary_join_element_wise(maps.keys, NAME_VALUE_SEPARATOR, maps.items, PROPERTY_SEPARATOR, "")
    lists = pa.ListArray.from_arrays(maps.offsets, entries, mask=maps.is_null())
    return pc.binary_join(lists, "")


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
