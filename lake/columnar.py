"""Columnar decode: many CommitLog records at once into numpy and Arrow arrays (the Spark ``commitlog`` source
and the segment scan).

The per-record decoders of :mod:`store.format.records` build a Python object per field; at a million records
per GiB that is the bottleneck of a Spark scan.  Here :class:`~store.format.records.RecordWalk` finds the
records, then every fixed field is gathered for all of them with numpy, and the variable fields (body, topic,
properties) become Arrow binary-view arrays pointing into the segment that Arrow compacts in C++.
numpy and pyarrow are imported inside the functions, so that importing this module costs nothing.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from store.format.buffers import ReadBuffer
from store.format.msgid import create_offset_msg_id, decode_addr, host_string, parse_host_string
from store.format.properties import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
from store.format.records import (
    BODY_CRC_POS,
    BORN_HOST_POS,
    BORN_TIMESTAMP_POS,
    BORNHOST_V6_FLAG,
    FLAG_POS,
    MAGIC_POS,
    MESSAGE_MAGIC_V2,
    PHYSICAL_OFFSET_POS,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    STOREHOSTADDRESS_V6_FLAG,
    SYSFLAG_POS,
    RecordError,
    decode_record,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_INT = struct.Struct(">i")


def _rows(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each position ``at`` as an (n, width) array; positions are clipped to the buffer
    (rows found invalid are dropped later).  A sliding-window view makes this one row copy per position,
    many times faster than gathering ``at[:, None] + arange(width)``."""
    import numpy as np

    if len(arr) < width:
        arr = np.concatenate([arr, np.zeros(width - len(arr), np.uint8)])
    windows = np.lib.stride_tricks.sliding_window_view(arr, width)
    return windows[np.clip(at, 0, len(arr) - width)]


def _gather_be(arr: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian integers of ``width`` bytes at positions ``at``, in native byte order."""
    return _rows(arr, at, width).view(dtype).reshape(-1).astype(dtype.replace(">", "="))


def _gather_binary(pa_buf: pa.Buffer, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of ``buf[start:start+length]`` per row: Arrow binary views into ``pa_buf``, compacted."""
    import numpy as np
    import pyarrow as pa

    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    lo = int(starts.min())  # view offsets are int32: address from the lowest start
    # A view is 16 bytes: int32 length, then the value inline (<= 12 bytes, zero padded), or else a
    # 4-byte prefix, int32 buffer index (0) and int32 offset.  Whole-column writes, no boolean indexing.
    views = np.empty((n, 4), "<i4")
    v8 = views.view(np.uint8)
    head = _rows(arr, starts, 12)
    for i in np.flatnonzero(starts > len(arr) - 12).tolist():  # rows _rows shifted to fit: short values only
        s, ln = int(starts[i]), int(lengths[i])
        head[i, :ln] = arr[s : s + ln]
    head *= np.arange(12) < lengths[:, None]
    v8[:, 4:16] = head
    views[:, 0] = lengths
    long = lengths > 12
    views[:, 2] = np.where(long, 0, views[:, 2])
    views[:, 3] = np.where(long, starts - lo, views[:, 3])
    view_arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), pa_buf.slice(lo)])
    return view_arr.cast(pa.binary())


def _utf8(binary: pa.Array) -> pa.Array:
    """Binary -> string; invalid UTF-8 becomes U+FFFD as in :func:`decode_record` instead of failing the batch."""
    import pyarrow as pa

    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()], pa.string())


def properties_map_array(props: pa.Array) -> pa.MapArray:
    """:func:`decode_properties` for a whole binary array at once: a ``map<string, string>`` array.

    Same quirks: segments without 0x01, or with an empty name or value, are dropped.  Works on the
    bytes: 0x01 and 0x02 never occur inside a multi-byte UTF-8 character, so splitting there is exact.
    """
    import numpy as np
    import pyarrow as pa

    props = props.cast(pa.binary())
    n = len(props)
    if n == 0 or props.buffers()[2] is None:
        return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                       pa.array([], pa.string()))  # fmt: skip
    offs = np.frombuffer(props.buffers()[1], np.int32)[props.offset : props.offset + n + 1].astype(np.int64)
    data = np.frombuffer(props.buffers()[2], np.uint8)
    seps = np.flatnonzero(data == PROPERTY_SEPARATOR.encode()[0])
    eqs = np.flatnonzero(data == NAME_VALUE_SEPARATOR.encode()[0])
    # every segment starts at a record's start or just after a 0x02 and ends at the next 0x02 or the record's end
    starts = np.concatenate([offs[:-1], seps + 1])
    starts.sort()
    starts = starts[np.append(True, starts[1:] != starts[:-1])]  # a 0x02 ending a record: next one's start
    starts = starts[starts < offs[-1]]
    parent = np.searchsorted(offs, starts, side="right") - 1
    nxt = np.searchsorted(seps, starts)
    ends = np.minimum(np.append(seps, offs[-1])[nxt], offs[parent + 1])
    eq = np.append(eqs, offs[-1])[np.searchsorted(eqs, starts)]
    keep = (eq < ends) & (eq > starts) & (ends > eq + 1)
    starts, ends, eq, parent = starts[keep], ends[keep], eq[keep], parent[keep]
    map_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(parent, minlength=n), out=map_offsets[1:])
    buf = props.buffers()[2]
    names = _utf8(_gather_binary(buf, data, starts, eq - starts))
    values = _utf8(_gather_binary(buf, data, eq + 1, ends - eq - 1))
    return pa.MapArray.from_arrays(pa.array(map_offsets), names, values)


def _host_strings(arr: np.ndarray, at: np.ndarray, v6: np.ndarray) -> pa.Array:
    """``ip:port`` per row from the stored socket address at ``at``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if v6.any():  # rare: per row
        out = []
        for a, is6 in zip(at.tolist(), v6.tolist(), strict=True):
            n = 16 if is6 else 4
            out.append(host_string((decode_addr(bytes(arr[a : a + n])), _INT.unpack_from(arr.data, a + n)[0])))
        return pa.array(out, pa.string())
    octets = _rows(arr, at, 4)
    parts = [pa.array(octets[:, i]).cast(pa.string()) for i in range(4)]
    port = pa.array(_gather_be(arr, at + 4, 4, ">i4")).cast(pa.string())
    return pc.binary_join_element_wise(pc.binary_join_element_wise(*parts, "."), port, ":")


_HEX = b"".join(f"{i:02X}".encode() for i in range(256))


def _offset_msg_ids(
    arr: np.ndarray, store_host_at: np.ndarray, store_v6: np.ndarray, phys: np.ndarray, host_strings: pa.Array
) -> pa.Array:
    """:func:`create_offset_msg_id` for every row: hex of the stored address and the physical offset."""
    import numpy as np
    import pyarrow as pa

    n = len(phys)
    if store_v6.any():
        return pa.array(
            [create_offset_msg_id(parse_host_string(h), p) for h, p in zip(host_strings.to_pylist(), phys.tolist(),
                                                                            strict=True)],
            pa.string(),
        )
    raw = np.empty((n, 16), np.uint8)
    raw[:, :8] = _rows(arr, store_host_at, 8)
    raw[:, 8:] = phys.astype(">i8").view(np.uint8).reshape(n, 8)
    hexed = np.frombuffer(_HEX, np.uint8).reshape(256, 2)[raw].reshape(-1)
    offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(hexed)])


@dataclass(slots=True)
class RecordLayout:
    """Where each field of a run of records sits (numpy arrays, one entry per record), all checked.

    Rows stop before the first record whose fields do not fit its size; ``error`` names that record.
    """

    pos: np.ndarray
    total: np.ndarray
    magic: np.ndarray
    sys_flag: np.ndarray
    born_v6: np.ndarray
    store_v6: np.ndarray
    store_ts_at: np.ndarray
    store_host_at: np.ndarray
    reconsume_at: np.ndarray
    body_at: np.ndarray
    body_len: np.ndarray
    topic_at: np.ndarray
    topic_len: np.ndarray
    props_at: np.ndarray
    props_len: np.ndarray
    _: KW_ONLY
    error: RecordError | None = None

    def __len__(self) -> int:
        return len(self.pos)


def layout_records(buf: ReadBuffer, positions: list[int], *, source: str = "") -> RecordLayout:
    """Locate every field of the records at ``positions`` (from a :class:`RecordWalk`) and check them as
    :func:`decode_record` does: each length fits, and the size equals what the fields add up to."""
    import numpy as np

    arr = np.frombuffer(buf, np.uint8)
    pos = np.asarray(positions, np.int64)
    total = _gather_be(arr, pos, 4, ">i4").astype(np.int64)
    magic = _gather_be(arr, pos + MAGIC_POS, 4, ">i4")
    sys_flag = _gather_be(arr, pos + SYSFLAG_POS, 4, ">i4")
    born_v6 = (sys_flag & BORNHOST_V6_FLAG) != 0
    store_v6 = (sys_flag & STOREHOSTADDRESS_V6_FLAG) != 0
    store_ts_at = pos + BORN_HOST_POS + np.where(born_v6, 20, 8)
    store_host_at = store_ts_at + 8
    reconsume_at = store_host_at + np.where(store_v6, 20, 8)
    body_at = reconsume_at + 16  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH
    limit = pos + total
    body_len = _gather_be(arr, body_at - 4, 4, ">i4").astype(np.int64)
    v2 = magic == MESSAGE_MAGIC_V2
    tl_at = body_at + np.maximum(body_len, 0)
    topic_at = tl_at + np.where(v2, 2, 1)
    topic_len = np.where(
        v2, _gather_be(arr, tl_at, 2, ">i2"), arr[np.minimum(tl_at, len(arr) - 1)].view(np.int8)
    ).astype(np.int64)
    props_at = topic_at + np.maximum(topic_len, 0) + 2
    props_len = _gather_be(arr, props_at - 2, 2, ">i2").astype(np.int64)
    del arr
    ok = (
        (body_at <= limit)
        & (body_len >= 0)
        & (topic_at <= limit)
        & (topic_len >= 0)
        & (props_at <= limit)
        & (props_len >= 0)
        & (props_at + props_len == limit)  # the size equals what the fields add up to
    )
    fields = [pos, total, magic, sys_flag, born_v6, store_v6, store_ts_at, store_host_at, reconsume_at, body_at,
              body_len, topic_at, topic_len, props_at, props_len]  # fmt: skip
    error = None
    if not ok.all():
        k = int(np.argmin(ok))
        try:  # the scalar decoder words the reason
            decode_record(buf, positions[k], source=source)
            error = RecordError(positions[k], "fields do not add up to its size", source)
        except RecordError as e:
            error = e
        fields = [f[:k] for f in fields]
    return RecordLayout(*fields, error=error)


def body_crc_ok(buf: ReadBuffer, layout: RecordLayout) -> np.ndarray:
    """Per record: the stored BODYCRC equals the CRC recomputed over the body (an empty body is not checked)."""
    import numpy as np

    crc = zlib.crc32
    with memoryview(buf) as mv:
        computed = np.fromiter(
            (crc(mv[s : s + n]) for s, n in zip(layout.body_at.tolist(), layout.body_len.tolist(), strict=True)),
            np.int64,
            len(layout),
        )
    arr = np.frombuffer(buf, np.uint8)
    stored = _gather_be(arr, layout.pos + BODY_CRC_POS, 4, ">i4")
    return (layout.body_len == 0) | ((computed & 0x7FFFFFFF) == stored)


def read_columns(buf: ReadBuffer, layout: RecordLayout, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Some fixed fields of the laid-out records as numpy arrays: ``store_timestamp``, ``commitlog_offset``,
    ``queue_id``, ``queue_offset`` (what a scan needs without decoding whole records)."""
    import numpy as np

    arr = np.frombuffer(buf, np.uint8)
    at = {
        "store_timestamp": (layout.store_ts_at, 8, ">i8"),
        "commitlog_offset": (layout.pos + PHYSICAL_OFFSET_POS, 8, ">i8"),
        "queue_id": (layout.pos + QUEUE_ID_POS, 4, ">i4"),
        "queue_offset": (layout.pos + QUEUE_OFFSET_POS, 8, ">i8"),
    }
    return {n: _gather_be(arr, *at[n]) for n in names}


def decode_columns(buf: ReadBuffer, layout: RecordLayout) -> dict[str, pa.Array]:
    """Decode the laid-out records into Arrow arrays, one per column of ``lake/schema.py`` but
    ``segment``: every field, ``crc_ok``, ``properties`` as a map plus ``tags``/``keys``/``uniq_key`` from
    it, ``msg_id`` and ``position``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = np.frombuffer(buf, np.uint8)
    pa_buf = pa.py_buffer(buf)
    pos = layout.pos
    props = properties_map_array(_gather_binary(pa_buf, arr, layout.props_at, layout.props_len))
    phys = _gather_be(arr, pos + PHYSICAL_OFFSET_POS, 8, ">i8")
    store_host = _host_strings(arr, layout.store_host_at, layout.store_v6)
    columns = {
        "topic": _utf8(_gather_binary(pa_buf, arr, layout.topic_at, layout.topic_len)),
        "queue_id": pa.array(_gather_be(arr, pos + QUEUE_ID_POS, 4, ">i4")),
        "queue_offset": pa.array(_gather_be(arr, pos + QUEUE_OFFSET_POS, 8, ">i8")),
        "commitlog_offset": pa.array(phys),
        "msg_size": pa.array(layout.total.astype(np.int32)),
        "magic": pa.array(layout.magic),
        "body_crc": pa.array(_gather_be(arr, pos + BODY_CRC_POS, 4, ">i4")),
        "crc_ok": pa.array(body_crc_ok(buf, layout)),
        "flag": pa.array(_gather_be(arr, pos + FLAG_POS, 4, ">i4")),
        "sys_flag": pa.array(layout.sys_flag),
        "born_timestamp": pa.array(_gather_be(arr, pos + BORN_TIMESTAMP_POS, 8, ">i8")),
        "born_host": _host_strings(arr, pos + BORN_HOST_POS, layout.born_v6),
        "store_timestamp": pa.array(_gather_be(arr, layout.store_ts_at, 8, ">i8")),
        "store_host": store_host,
        "reconsume_times": pa.array(_gather_be(arr, layout.reconsume_at, 4, ">i4")),
        "prepared_txn_offset": pa.array(_gather_be(arr, layout.reconsume_at + 4, 8, ">i8")),
        "tags": pc.map_lookup(props, PROPERTY_TAGS, "last"),
        "keys": pc.map_lookup(props, PROPERTY_KEYS, "last"),
        "uniq_key": pc.map_lookup(props, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "last"),
        "msg_id": _offset_msg_ids(arr, layout.store_host_at, layout.store_v6, phys, store_host),
        "properties": props,
        "body": _gather_binary(pa_buf, arr, layout.body_at, layout.body_len),
        "position": pa.array(pos.astype(np.int32)),
    }
    return columns


MS_PER_DAY = 86_400_000


def store_date(store_timestamp: pa.Array) -> pa.Array:
    """The UTC day of each store time (the ``store_date`` partition), independent of any time zone setting."""
    import numpy as np
    import pyarrow as pa

    days = np.floor_divide(store_timestamp.to_numpy(zero_copy_only=False), MS_PER_DAY)
    return pa.array(days.astype(np.int32), pa.date32())


def table_rows(batch: pa.RecordBatch, broker_name: str) -> pa.RecordBatch:
    """Decoded records (``MESSAGE_SCHEMA``'s columns) as rows of the ``messages`` table (``MESSAGES_SCHEMA``): the
    broker whose store held them and their UTC store date appended, as the tier writes them and the live views
    read them.  Columns ``batch`` has besides the record's stay where they are."""
    import pyarrow as pa

    from lake.schema import MESSAGES_SCHEMA
    from lake.tables import BROKER_NAME, STORE_DATE

    broker = pa.repeat(pa.scalar(broker_name, pa.string()), batch.num_rows)
    day = store_date(batch.column("store_timestamp"))
    with_broker = batch.append_column(MESSAGES_SCHEMA.field(BROKER_NAME), broker)
    return with_broker.append_column(MESSAGES_SCHEMA.field(STORE_DATE), day)
