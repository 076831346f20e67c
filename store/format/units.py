"""The fixed-size layouts of the store's other files and their names: ConsumeQueue units (``ConsumeQueue``),
the IndexFile header, hash slots and entries (``IndexFile``), the checkpoint (``StoreCheckpoint``).

Each layout is declared once, as (name, big-endian type) fields: the ``struct`` the store packs with and the
numpy dtype the pipelines read whole files with (``CQ_UNIT_DTYPE``, ``INDEX_HEADER_DTYPE``,
``INDEX_SLOT_DTYPE``, ``INDEX_ENTRY_DTYPE``) are both built from it.  The dtypes are built on first use, so
that the store itself never imports numpy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from store.format import native
from store.format.buffers import ReadBuffer, WriteBuffer

if TYPE_CHECKING:
    import numpy as np

    CQ_UNIT_DTYPE: np.dtype
    INDEX_HEADER_DTYPE: np.dtype
    INDEX_SLOT_DTYPE: np.dtype
    INDEX_ENTRY_DTYPE: np.dtype

Fields = tuple[tuple[str, str], ...]

_STRUCT_CODES = {">i8": "q", ">i4": "i"}


def _struct(fields: Fields) -> struct.Struct:
    return struct.Struct(">" + "".join(_STRUCT_CODES[t] for _, t in fields))


# --- ConsumeQueue --------------------------------------------------------------------------------------
CQ_UNIT_FIELDS: Fields = (("phy", ">i8"), ("size", ">i4"), ("tags", ">i8"))  # commitLogOffset, size, tagsCode
CQ_UNIT_SIZE = 20
CQ_FILL_SIZE = 0x7FFFFFFF  # the size of a fillPreBlank unit (Integer.MAX_VALUE): it points nowhere
CQ_FILL_UNIT = (0, CQ_FILL_SIZE, 0)
_CQ_UNIT = _struct(CQ_UNIT_FIELDS)

# --- IndexFile: header, then hashSlotNum 4-byte slots, then indexNum entries ------------------------------
INDEX_HEADER_FIELDS: Fields = (
    ("begin_timestamp", ">i8"), ("end_timestamp", ">i8"), ("begin_phy_offset", ">i8"), ("end_phy_offset", ">i8"),
    ("hash_slot_count", ">i4"), ("index_count", ">i4"),
)  # fmt: skip
INDEX_SLOT_TYPE = ">i4"  # the entry number the slot's chain starts at
INDEX_ENTRY_FIELDS: Fields = (("hash", ">i4"), ("phy", ">i8"), ("tdiff", ">i4"), ("prev", ">i4"))
INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
_INDEX_HEADER = _struct(INDEX_HEADER_FIELDS)
_INDEX_SLOT = _struct((("slot", INDEX_SLOT_TYPE),))
_INDEX_ENTRY = _struct(INDEX_ENTRY_FIELDS)

# --- checkpoint --------------------------------------------------------------------------------------------
CHECKPOINT_FIELDS: Fields = (
    ("physic_msg_timestamp", ">i8"), ("logics_msg_timestamp", ">i8"), ("index_msg_timestamp", ">i8"),
)  # fmt: skip
CHECKPOINT_SIZE = 4096  # the file; the fields fill its first 24 bytes
_CHECKPOINT = _struct(CHECKPOINT_FIELDS)

assert (_CQ_UNIT.size, _INDEX_HEADER.size, _INDEX_SLOT.size, _INDEX_ENTRY.size) == (
    CQ_UNIT_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE, INDEX_ENTRY_SIZE,
)  # fmt: skip

_DTYPE_FIELDS: dict[str, Fields | str] = {
    "CQ_UNIT_DTYPE": CQ_UNIT_FIELDS,
    "INDEX_HEADER_DTYPE": INDEX_HEADER_FIELDS,
    "INDEX_SLOT_DTYPE": INDEX_SLOT_TYPE,
    "INDEX_ENTRY_DTYPE": INDEX_ENTRY_FIELDS,
}


def __getattr__(name: str) -> Any:
    """The numpy dtypes of the layouts above, built (once) when first asked for."""
    fields = _DTYPE_FIELDS.get(name)
    if fields is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import numpy as np

    dtype = globals()[name] = np.dtype(fields if isinstance(fields, str) else list(fields))
    return dtype


# =====================================================================================================
# ConsumeQueue unit
# =====================================================================================================


def encode_cq_unit(commitlog_offset: int, size: int, tags_code: int) -> bytes:
    return _CQ_UNIT.pack(commitlog_offset, size, tags_code)


def pack_cq_unit_into(buf: WriteBuffer, pos: int, commitlog_offset: int, size: int, tags_code: int) -> None:
    _CQ_UNIT.pack_into(buf, pos, commitlog_offset, size, tags_code)


def decode_cq_unit(buf: ReadBuffer, pos: int = 0) -> tuple[int, int, int]:
    """(commitLogOffset, size, tagsCode)."""
    return _CQ_UNIT.unpack_from(buf, pos)


def iter_cq_units(buf: ReadBuffer) -> Iterator[tuple[int, int, int]]:
    """Every unit of ``buf`` (a whole number of units)."""
    return _CQ_UNIT.iter_unpack(buf)


# =====================================================================================================
# IndexFile
# =====================================================================================================


@dataclass(slots=True)
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1  # entry 0 is never used


def encode_index_header(h: IndexHeader) -> bytes:
    return _INDEX_HEADER.pack(
        h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count, h.index_count
    )


def decode_index_header(buf: ReadBuffer, pos: int = 0) -> IndexHeader:
    h = IndexHeader(*_INDEX_HEADER.unpack_from(buf, pos))
    if h.index_count <= 0:
        h.index_count = 1
    return h


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def index_slot_position(slot: int) -> int:
    return INDEX_HEADER_SIZE + slot * INDEX_SLOT_SIZE


def index_entry_position(hash_slot_num: int, entry_no: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_SLOT_SIZE + entry_no * INDEX_ENTRY_SIZE


def read_index_slot(buf: ReadBuffer, slot: int) -> int:
    return _INDEX_SLOT.unpack_from(buf, index_slot_position(slot))[0]


def write_index_slot(buf: WriteBuffer, slot: int, entry_no: int) -> None:
    _INDEX_SLOT.pack_into(buf, index_slot_position(slot), entry_no)


def encode_index_entry(key_hash: int, phy_offset: int, time_diff: int, prev_index: int) -> bytes:
    return _INDEX_ENTRY.pack(key_hash, phy_offset, time_diff, prev_index)


def pack_index_entry_into(
    buf: WriteBuffer, hash_slot_num: int, entry_no: int, key_hash: int, phy_offset: int,
    time_diff: int, prev_index: int,
) -> None:  # fmt: skip
    _INDEX_ENTRY.pack_into(
        buf, index_entry_position(hash_slot_num, entry_no), key_hash, phy_offset, time_diff, prev_index
    )


def put_index_entry(
    buf: WriteBuffer, hash_slot_num: int, entry_no: int, key_hash: int, phy_offset: int, time_diff: int
) -> int:
    """``IndexFile.putKey``'s writes: entry ``entry_no`` chained to what the key's slot held, then the slot pointed
    at it.  Returns the entry it chains to: 0 when the slot was empty or held an entry at or past ``entry_no``
    (a slot left over from a crash before the header was written)."""
    slot = key_hash % hash_slot_num
    prev = read_index_slot(buf, slot)
    if prev <= 0 or prev > entry_no:
        prev = 0
    pack_index_entry_into(buf, hash_slot_num, entry_no, key_hash, phy_offset, time_diff, prev)
    write_index_slot(buf, slot, entry_no)
    return prev


def read_index_entry(
    buf: ReadBuffer, hash_slot_num: int, entry_no: int
) -> tuple[int, int, int, int]:
    """(keyHash, phyOffset, timeDiff seconds, prevIndex)."""
    return _INDEX_ENTRY.unpack_from(buf, index_entry_position(hash_slot_num, entry_no))


# =====================================================================================================
# Checkpoint
# =====================================================================================================


def encode_checkpoint(physic_msg_timestamp: int, logics_msg_timestamp: int, index_msg_timestamp: int) -> bytes:
    return _CHECKPOINT.pack(physic_msg_timestamp, logics_msg_timestamp, index_msg_timestamp)


def decode_checkpoint(buf: ReadBuffer) -> tuple[int, int, int]:
    """(physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp)."""
    return _CHECKPOINT.unpack_from(buf, 0)


# =====================================================================================================
# File names
# =====================================================================================================


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: 20-digit zero-padded decimal (CommitLog and ConsumeQueue files)."""
    return f"{offset:020d}"


def is_offset_file_name(name: str) -> bool:
    """A CommitLog or ConsumeQueue file's name: its start offset in 20 digits."""
    return len(name) == 20 and name.isascii() and name.isdigit()


def index_file_name(timestamp_ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: yyyyMMddHHmmssSSS in local time."""
    t = datetime.fromtimestamp(timestamp_ms / 1000)
    return t.strftime("%Y%m%d%H%M%S") + f"{timestamp_ms % 1000:03d}"


def is_index_file_name(name: str) -> bool:
    """An IndexFile's name: its creation time as yyyyMMddHHmmssSSS."""
    return len(name) == 17 and name.isascii() and name.isdigit()


# The compiled twin (store/format/_units.pyx) replaces this when it is built; see store.format.native.
native.install(globals(), "store.format._units", ("put_index_entry",))
