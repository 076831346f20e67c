"""CommitLog records: the layout (``MessageDecoder``, ``CommitLog.doAppend``), the one walk from record to
record, and the per-record decoders that read what the walk finds.

A record is TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP,
BORNHOST, STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH + BODY,
TOPICLENGTH (1 byte, 2 in V2) + TOPIC, PROPERTIESLENGTH (2 bytes) + PROPERTIES.  Every integer is big-endian.

:class:`RecordWalk` is the only code that steps from one record to the next (TOTALSIZE) and decides how a
run of records ends (BLANK, zeros, bad bytes, a limit).  The decoders — :func:`decode_record` (every field),
:func:`check_record` (what dispatch needs: ``checkMessageAndReturnSize``) — check a record's fields; given
the ``size`` the walk found they skip its head, otherwise they take one step of the walk themselves.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from store.constants import SCHEDULE_TOPIC
from store.errors import MQLakeError
from store.format import native
from store.format.buffers import ReadBuffer, WriteBuffer
from store.format.delay import DEFAULT_DELAY_MILLIS, schedule_tags_code
from store.format.hashing import body_crc32, tags_code
from store.format.msgid import Host, create_offset_msg_id, decode_addr, pack_ip
from store.format.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    decode_properties,
    split_keys,
)

# --- magic codes (Java ints, so kept signed) -------------------------------------------------------
MESSAGE_MAGIC_V1 = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_V2 = -626843477  # 0xDAA320AB, 2-byte topic length (RocketMQ 5.1+)
BLANK_MAGIC = -875286124  # 0xCBD43194, end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8
SIZE_MAGIC_LENGTH = 8  # TOTALSIZE + MAGICCODE open every record; a reader sees zeros there until both are written

# --- sysflag bits (MessageSysFlag) -------------------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TAG_INDEX_TYPE = "T"  # RocketMQ 5.x's IndexService: a tag's index key is topic#T#tags
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700

# --- limits ------------------------------------------------------------------------------------------
MAX_TOPIC_LENGTH_V1 = 127  # V1 reads the topic length as a signed byte
MAX_PROPERTIES_LENGTH = 32767  # signed short

# --- fixed positions (MessageDecoder) -----------------------------------------------------------------
TOTAL_SIZE_POS = 0
MAGIC_POS = 4
BODY_CRC_POS = 8
QUEUE_ID_POS = 12
FLAG_POS = 16
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYSFLAG_POS = 36
BORN_TIMESTAMP_POS = 40
BORN_HOST_POS = 48

_PREFIX = struct.Struct(">iiiiiqqiq")  # totalSize .. bornTimestamp: 48 bytes, the least a record can be
MIN_RECORD_SIZE = _PREFIX.size
_SIZE_MAGIC = struct.Struct(">ii")
_MESSAGE_MAGICS = frozenset((MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2))
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET


def header_fields(born_v6: bool, store_v6: bool) -> tuple[tuple[str, str], ...]:
    """(name, big-endian ``struct`` code) of every field from TOTALSIZE to BODYLENGTH, in record order."""
    return (
        ("total_size", "i"), ("magic", "i"), ("body_crc", "i"), ("queue_id", "i"), ("flag", "i"),
        ("queue_offset", "q"), ("physical_offset", "q"), ("sys_flag", "i"), ("born_timestamp", "q"),
        ("born_ip", "16s" if born_v6 else "4s"), ("born_port", "i"), ("store_timestamp", "q"),
        ("store_ip", "16s" if store_v6 else "4s"), ("store_port", "i"), ("reconsume_times", "i"),
        ("prepared_transaction_offset", "q"), ("body_length", "i"),
    )  # fmt: skip


# One struct per (bornHost v6, storeHost v6): everything from TOTALSIZE to BODYLENGTH.
_HEADERS: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(">" + "".join(code for _, code in header_fields(b, s)))
    for b in (False, True)
    for s in (False, True)
}
# Only the numbers dispatch needs, hosts skipped: (size, magic, crc, queueId, flag, queueOffset, physOffset,
# sysFlag, bornTs, storeTs, reconsumeTimes, preparedTxOffset, bodyLength).
_DISPATCH_HEADERS: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(">iiiiiqqiq" + ("20x" if b else "8x") + "q" + ("20x" if s else "8x") + "iqi")
    for b in (False, True)
    for s in (False, True)
}


class RecordError(MQLakeError, ValueError):
    """A CommitLog record that cannot be decoded; names where it sits."""

    def __init__(self, position: int, reason: str, source: str = "") -> None:
        where = f"{source} at offset {position}" if source else f"offset {position}"
        super().__init__(f"invalid CommitLog record in {where}: {reason}")
        self.position = position
        self.reason = reason
        self.source = source


class RecordEncodeError(MQLakeError, ValueError):
    """A message no record can hold (a topic or properties string too long for its length field)."""


# =====================================================================================================
# The record and its encoding
# =====================================================================================================


@dataclass(slots=True)
class MessageRecord:
    """One CommitLog record. ``properties`` is the raw 0x01/0x02 string as stored."""

    topic: str
    queue_id: int
    body: bytes
    properties: bytes = b""
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    body_crc: int | None = None  # computed from the body when None
    magic: int | None = None  # V2 chosen for topics over 127 bytes when None
    total_size: int = 0
    _props: dict[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def property_map(self) -> dict[str, str]:
        if self._props is None:
            self._props = decode_properties(self.properties)
        return self._props

    @property
    def tags(self) -> str | None:
        return self.property_map.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.property_map.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.property_map.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def offset_msg_id(self) -> str:
        return create_offset_msg_id(self.store_host, self.physical_offset)


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


def is_consumable(sys_flag: int) -> bool:
    """Normal and committed records get a queue offset and a ConsumeQueue unit; half and rollback ones do not."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def record_length(sys_flag: int, body_len: int, topic_len: int, props_len: int, magic: int = MESSAGE_MAGIC_V1) -> int:
    """``calMsgLength``: the TOTALSIZE a record with these field lengths must have."""
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    topic_len_size = 2 if magic == MESSAGE_MAGIC_V2 else 1
    return (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + born
        + 8
        + store
        + 4
        + 8
        + 4
        + body_len
        + topic_len_size
        + topic_len
        + 2
        + props_len
    )


def store_timestamp_position(sys_flag: int) -> int:
    return BORN_HOST_POS + (20 if sys_flag & BORNHOST_V6_FLAG else 8)


def magic_for_topic(topic_bytes: bytes) -> int:
    """``autoMessageVersionOnTopicLen``: V2 only when the topic does not fit a signed byte."""
    return MESSAGE_MAGIC_V2 if len(topic_bytes) > MAX_TOPIC_LENGTH_V1 else MESSAGE_MAGIC_V1


def encode_record(rec: MessageRecord) -> bytes:
    """Encode a full record. ``rec.sys_flag`` host bits are derived from the hosts."""
    topic = rec.topic.encode("utf-8")
    topic_len = len(topic)
    magic = rec.magic
    if magic is None:
        magic = magic_for_topic(topic)
    elif magic == MESSAGE_MAGIC_V1 and topic_len > MAX_TOPIC_LENGTH_V1:
        raise RecordEncodeError(f"topic of {topic_len} bytes needs the V2 record format")
    if topic_len > 0x7FFF:
        raise RecordEncodeError(f"topic of {topic_len} bytes is too long")
    props = rec.properties
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise RecordEncodeError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_LENGTH}")
    born_ip = pack_ip(rec.born_host[0])
    store_ip = pack_ip(rec.store_host[0])
    v6 = (len(born_ip) == 16, len(store_ip) == 16)
    sys_flag = rec.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if v6[0]:
        sys_flag |= BORNHOST_V6_FLAG
    if v6[1]:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
    body = rec.body
    hdr = _HEADERS[v6]
    topic_len_field = _SHORT.pack(topic_len) if magic == MESSAGE_MAGIC_V2 else bytes((topic_len,))
    total = hdr.size + len(body) + len(topic_len_field) + topic_len + 2 + len(props)
    crc = rec.body_crc if rec.body_crc is not None else zlib.crc32(body) & 0x7FFFFFFF
    head = hdr.pack(
        total, magic, crc, rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset, sys_flag,
        rec.born_timestamp, born_ip, rec.born_host[1], rec.store_timestamp, store_ip, rec.store_host[1],
        rec.reconsume_times, rec.prepared_transaction_offset, len(body),
    )  # fmt: skip
    return b"".join((head, body, topic_len_field, topic, _SHORT.pack(len(props)), props))


def patch_record(
    buf: WriteBuffer, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int
) -> None:
    """Back-fill what is only known inside the put lock (``doAppend``)."""
    _OFFSETS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, physical_offset)  # adjacent fields
    born_v6 = buf[pos + SYSFLAG_POS + 3] & BORNHOST_V6_FLAG
    _LONG.pack_into(buf, pos + (68 if born_v6 else 56), store_timestamp)


def put_record(
    dest: WriteBuffer, pos: int, limit: int, rec: MessageRecord, queue_offset: int, physical_offset: int,
    store_timestamp: int,
) -> int:  # fmt: skip
    """A single put's append: ``rec`` encoded (:func:`encode_record`) straight into ``dest[pos:]`` with what only
    the put lock knows back-filled (:func:`patch_record`), its TOTALSIZE and MAGIC written last, so that until
    then ``dest`` holds zeros there, which recovery reads as the end of the log (a back-filled value out of its
    field's range raises before they are written).  Returns the record's size; or, writing nothing, minus its size
    when it would end past ``limit`` (the caller rolls to a new segment)."""
    data = encode_record(rec)
    n = len(data)
    if pos < 0 or limit > len(dest):
        raise RecordEncodeError(f"a record at {pos} up to {limit} does not fit a buffer of {len(dest)} bytes")
    if pos + n > limit:
        return -n
    dest[pos + SIZE_MAGIC_LENGTH : pos + n] = data[SIZE_MAGIC_LENGTH:]
    patch_record(dest, pos, queue_offset, physical_offset, store_timestamp)
    dest[pos : pos + SIZE_MAGIC_LENGTH] = data[:SIZE_MAGIC_LENGTH]
    return n


def encode_blank(remaining: int) -> bytes:
    """End-of-file filler: TOTALSIZE = every byte left in the file, then BLANK magic."""
    return _SIZE_MAGIC.pack(remaining, BLANK_MAGIC)


# =====================================================================================================
# The walk
# =====================================================================================================


class WalkEnd(enum.Enum):
    """Why a :class:`RecordWalk` stopped."""

    LIMIT = "limit"  # reached the stop position or the number of records asked for
    BLANK = "blank"  # the end-of-file BLANK record
    ZEROS = "zeros"  # zeros where the next record would start: the end of the data (an active tail)
    EOF = "eof"  # the last record ends exactly at the end of the buffer
    INVALID = "invalid"  # bytes that cannot start a record (``reason`` says why)


class RecordWalk:
    """The one walk over CommitLog records: from a record boundary, follow TOTALSIZE.

    Iterating yields ``(position, size)`` of every record that starts before ``stop`` (up to ``max_records``)
    whose MAGICCODE is a message's and whose size fits the buffer; the per-record decoders check its fields.
    Once the iteration is over, ``end`` is where the walk stopped and ``ended`` why (``reason`` words it,
    ``blank_size`` is the BLANK record's TOTALSIZE).  A caller that breaks out early knows its own position.
    """

    __slots__ = ("_buf", "start", "_stop", "_max", "end", "ended", "reason", "blank_size")

    def __init__(
        self, buf: ReadBuffer, start: int = 0, stop: int | None = None,
        max_records: int | None = None,
    ) -> None:  # fmt: skip
        self._buf = buf
        self.start = start
        self._stop = stop
        self._max = max_records
        self.end = start
        self.ended: WalkEnd | None = None
        self.reason = ""
        self.blank_size = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        buf = self._buf
        end = len(buf)
        stop = end if self._stop is None else min(self._stop, end)
        wanted = end if self._max is None else self._max  # every record takes at least one byte
        unpack = _SIZE_MAGIC.unpack_from
        magics, least = _MESSAGE_MAGICS, MIN_RECORD_SIZE
        pos = self.start
        while pos < stop and wanted > 0:
            if end - pos >= SIZE_MAGIC_LENGTH:
                total, magic = unpack(buf, pos)
                if magic in magics and least <= total <= end - pos:
                    yield pos, total
                    pos += total
                    wanted -= 1
                    continue
            self.end = pos
            self.ended, self.reason, self.blank_size = _no_record_at(buf, pos, end)
            return
        self.end = pos
        if pos >= end:
            self.ended, self.reason = WalkEnd.EOF, f"no bytes left at {pos}"
        else:
            self.ended = WalkEnd.LIMIT

    def positions(self) -> list[int]:
        """Walk to the end and return where every record starts."""
        return [pos for pos, _ in self]


def record_incomplete_at(buf: ReadBuffer, pos: int) -> bool:
    """Whether ``buf`` ends inside a record starting at ``pos``: too few bytes for its header, or a message's
    header whose TOTALSIZE runs past the end.  A slave's CommitLog ends so while a transfer is half received."""
    left = len(buf) - pos
    if left < SIZE_MAGIC_LENGTH:
        return True
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return magic in _MESSAGE_MAGICS and total > left


def _no_record_at(buf: ReadBuffer, pos: int, end: int) -> tuple[WalkEnd, str, int]:
    """Why no record starts at ``pos``: (how the walk ends, the reason, the BLANK size)."""
    left = end - pos
    if left < SIZE_MAGIC_LENGTH:
        if any(bytes(buf[pos:end])):
            return WalkEnd.INVALID, f"{left} bytes left, fewer than a record's TOTALSIZE and MAGICCODE", 0
        return WalkEnd.ZEROS, "end of data (zeros)", 0
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return WalkEnd.BLANK, f"the end-of-file BLANK record ({total} bytes), not a message", total
    if total == 0 and magic == 0:
        return WalkEnd.ZEROS, "end of data (zeros)", 0
    if magic not in _MESSAGE_MAGICS:
        return WalkEnd.INVALID, f"bad magic 0x{magic & 0xFFFFFFFF:08X}", 0
    if total < MIN_RECORD_SIZE:
        return WalkEnd.INVALID, f"size {total} is shorter than a record header ({MIN_RECORD_SIZE} bytes)", 0
    return WalkEnd.INVALID, f"size {total} does not fit the {left} bytes left", 0


def step(buf: ReadBuffer, pos: int = 0) -> RecordWalk:
    """One step of the walk: a record starts at ``pos`` when ``.end > pos`` (its size is ``.end - pos``);
    otherwise ``.ended`` and ``.reason`` say what is there."""
    walk = RecordWalk(buf, pos, max_records=1)
    for _ in walk:
        pass
    return walk


# =====================================================================================================
# Per-record decoders
# =====================================================================================================


def decode_record(
    buf: ReadBuffer, pos: int = 0, *, check_crc: bool = False, source: str = "",
    size: int | None = None,
) -> MessageRecord:  # fmt: skip
    """Decode the record at ``pos``; raise :class:`RecordError` naming ``source`` and the offset.

    ``size``: the record's TOTALSIZE as a :class:`RecordWalk` found it; without it this takes the step itself.
    """
    if size is None:
        walk = step(buf, pos)
        size = walk.end - pos
        if size <= 0:
            raise RecordError(pos, walk.reason, source)
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hdr = _HEADERS[(bool(sys_flag & BORNHOST_V6_FLAG), bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
    if size < hdr.size:
        raise RecordError(pos, f"size {size} is shorter than the fixed header", source)
    (
        total, magic, crc, queue_id, flag, queue_offset, phys, _, born_ts, born_ip, born_port,
        store_ts, store_ip, store_port, reconsume, prepared, body_len,
    ) = hdr.unpack_from(buf, pos)  # fmt: skip
    p = pos + hdr.size
    limit = pos + total
    if body_len < 0 or p + body_len > limit:
        raise RecordError(pos, f"body length {body_len} overruns the record of {total} bytes", source)
    body = bytes(buf[p : p + body_len])
    p += body_len
    if magic == MESSAGE_MAGIC_V2:
        if p + 2 > limit:
            raise RecordError(pos, "truncated before the topic length", source)
        topic_len = _SHORT.unpack_from(buf, p)[0]
        p += 2
    else:
        if p + 1 > limit:
            raise RecordError(pos, "truncated before the topic length", source)
        topic_len = struct.unpack_from(">b", buf, p)[0]
        p += 1
    if topic_len < 0 or p + topic_len + 2 > limit:
        raise RecordError(pos, f"topic length {topic_len} overruns the record", source)
    topic = bytes(buf[p : p + topic_len]).decode("utf-8", "replace")
    p += topic_len
    props_len = _SHORT.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len > limit:
        raise RecordError(pos, f"properties length {props_len} overruns the record", source)
    props = bytes(buf[p : p + props_len])
    expected = record_length(sys_flag, body_len, topic_len, props_len, magic)
    if expected != total:
        raise RecordError(pos, f"size {total} differs from the {expected} its fields add up to", source)
    if check_crc and body_len > 0 and body_crc32(body) != crc:
        raise RecordError(pos, f"body CRC {body_crc32(body)} differs from the stored {crc}", source)
    return MessageRecord(
        topic=topic, queue_id=queue_id, body=body, properties=props, flag=flag, sys_flag=sys_flag,
        born_timestamp=born_ts, born_host=(decode_addr(born_ip), born_port), store_timestamp=store_ts,
        store_host=(decode_addr(store_ip), store_port), reconsume_times=reconsume,
        prepared_transaction_offset=prepared, queue_offset=queue_offset, physical_offset=phys,
        body_crc=crc, magic=magic, total_size=total,
    )  # fmt: skip


@dataclass(slots=True)
class DispatchRequest:
    """What the reput service needs from a record to build ConsumeQueue and IndexFile entries."""

    topic: str
    queue_id: int
    commitlog_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int
    consumable: bool  # is_consumable(sys_flag): it gets a ConsumeQueue unit and wakes long polls


def index_keys(req: DispatchRequest, tags: str | None = None) -> list[str]:
    """The IndexFile keys ``IndexService.buildIndex`` puts for a record, in put order, each to follow
    ``topic#`` (``hashing.index_key``): none for a rollback; the UNIQ_KEY, then each KEYS entry (RocketMQ
    4.x's rule, which the store writes).  ``tags``, the record's TAGS, adds RocketMQ 5.x's tag key
    ``T#tags`` last; pass it only to reproduce a 5.x broker's files."""
    if req.sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE:
        return []
    keys = [req.uniq_key] if req.uniq_key else []
    keys.extend(split_keys(req.keys))
    if tags:
        keys.append(f"{TAG_INDEX_TYPE}#{tags}")
    return keys


@dataclass(slots=True)
class CheckResult:
    """``checkMessageAndReturnSize``: size > 0 a record, size 0 with ``blank`` end of file, else invalid."""

    ok: bool
    size: int
    request: DispatchRequest | None = None
    blank: bool = False
    reason: str = ""


_TAGS_B = PROPERTY_TAGS.encode()
_KEYS_B = PROPERTY_KEYS.encode()
_UNIQ_B = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_DELAY_B = PROPERTY_DELAY_TIME_LEVEL.encode()
_topic_cache: dict[bytes, str] = {}
_tags_code_cache: dict[bytes, int] = {}  # a topic uses few distinct tags; hashing each message's anew is waste


def check_record(
    buf: ReadBuffer,
    pos: int,
    *,
    check_crc: bool = True,
    delay_millis: list[int] = DEFAULT_DELAY_MILLIS,
    size: int | None = None,
) -> CheckResult:
    """``checkMessageAndReturnSize``: validate the record at ``pos`` and extract its dispatch request.

    This is the reput and recovery hot path, so it reads only what dispatch needs (no hosts, no body
    copy) yet checks the same things as :func:`decode_record`: every length, the size formula and, with
    ``check_crc``, the body CRC.  ``size``: the record's TOTALSIZE as a :class:`RecordWalk` found it;
    without it this takes the step itself (and reports BLANK and zeros as RocketMQ does).
    """
    if size is None:
        walk = step(buf, pos)
        size = walk.end - pos
        if size <= 0:
            if walk.ended is WalkEnd.BLANK:
                return CheckResult(True, 0, blank=True)
            return CheckResult(False, 0 if walk.ended is WalkEnd.ZEROS else -1, reason=walk.reason)
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hdr = _DISPATCH_HEADERS[(bool(sys_flag & BORNHOST_V6_FLAG), bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
    if size < hdr.size:
        return CheckResult(False, -1, reason=f"size {size} is shorter than the fixed header")
    (total, magic, crc, queue_id, _, queue_offset, phys, _, _, store_ts, _, prepared, body_len) = hdr.unpack_from(
        buf, pos
    )
    limit = pos + total
    p = pos + hdr.size
    if body_len < 0 or p + body_len > limit:
        return CheckResult(False, -1, reason=f"body length {body_len} overruns the record of {total} bytes")
    body_at = p
    p += body_len
    if magic == MESSAGE_MAGIC_V2:
        topic_len = _SHORT.unpack_from(buf, p)[0] if p + 2 <= limit else -1
        p += 2
    else:
        topic_len = struct.unpack_from(">b", buf, p)[0] if p + 1 <= limit else -1
        p += 1
    if topic_len < 0 or p + topic_len + 2 > limit:
        return CheckResult(False, -1, reason=f"topic length {topic_len} overruns the record")
    raw_topic = bytes(buf[p : p + topic_len])
    p += topic_len
    props_len = _SHORT.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len > limit:
        return CheckResult(False, -1, reason=f"properties length {props_len} overruns the record")
    if record_length(sys_flag, body_len, topic_len, props_len, magic) != total:
        return CheckResult(False, total, reason=f"size {total} differs from what its fields add up to")
    if check_crc and body_len > 0:
        actual = zlib.crc32(buf[body_at : body_at + body_len]) & 0x7FFFFFFF
        if actual != crc:
            return CheckResult(False, -1, reason=f"body CRC {actual} differs from the stored {crc}")
    topic = _topic_cache.get(raw_topic)
    if topic is None:
        topic = raw_topic.decode("utf-8", "replace")
        if len(_topic_cache) > 100_000:
            _topic_cache.clear()
        _topic_cache[raw_topic] = topic
    tags = keys = uniq = delay = None
    # properties.iter_properties, inlined: a generator costs a quarter of this function's time on the reput path.
    for seg in bytes(buf[p : p + props_len]).split(b"\x02"):
        name, sep, value = seg.partition(b"\x01")
        if not (sep and name and value):
            continue
        if name == _TAGS_B:
            tags = value
        elif name == _KEYS_B:
            keys = value
        elif name == _UNIQ_B:
            uniq = value
        elif name == _DELAY_B:
            delay = value
    code = 0
    if tags:
        known = _tags_code_cache.get(tags)
        if known is None:
            if len(_tags_code_cache) > 100_000:
                _tags_code_cache.clear()
            known = _tags_code_cache[tags] = tags_code(tags.decode("utf-8", "replace"))
        code = known
    if delay is not None and topic == SCHEDULE_TOPIC:
        code = schedule_tags_code(delay, store_ts, code, delay_millis)
    return CheckResult(
        True,
        total,
        DispatchRequest(
            topic,
            queue_id,
            phys,
            total,
            code,
            store_ts,
            queue_offset,
            keys.decode("utf-8", "replace") if keys else None,
            uniq.decode("utf-8", "replace") if uniq else None,
            sys_flag,
            prepared,
            is_consumable(sys_flag),
        ),
    )


# =====================================================================================================
# Single fields, read in place
# =====================================================================================================


def read_store_timestamp(buf: ReadBuffer, pos: int) -> int:
    """STORETIMESTAMP of the record at ``pos`` without decoding the rest."""
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    return _LONG.unpack_from(buf, pos + store_timestamp_position(sys_flag))[0]


_PROPS_HEAD = struct.Struct(">ii28xi")  # TOTALSIZE, MAGIC, (BODYCRC .. PHYSICALOFFSET), SYSFLAG
_HEADER_SIZES = {  # by sysFlag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    (BORNHOST_V6_FLAG if b else 0) | (STOREHOSTADDRESS_V6_FLAG if s else 0): h.size for (b, s), h in _HEADERS.items()
}


def record_properties(buf: ReadBuffer, pos: int = 0) -> bytes:
    """The raw PROPERTIES of the record at ``pos`` without decoding the rest (a property filter reads only
    these, per record scanned: three unpacks); raise :class:`RecordError` when a length overruns the record."""
    total, magic, sys_flag = _PROPS_HEAD.unpack_from(buf, pos)
    header = _HEADER_SIZES[sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)]
    limit = pos + total
    if total < header + 3 or len(buf) < limit:
        raise RecordError(pos, f"size {total} cannot hold a record", "")
    p = pos + header + _INT.unpack_from(buf, pos + header - 4)[0]  # the header ends with BODYLENGTH
    v2 = magic == MESSAGE_MAGIC_V2
    if p + (2 if v2 else 1) > limit:
        raise RecordError(pos, "truncated before the topic length", "")
    p += 2 + _SHORT.unpack_from(buf, p)[0] if v2 else 1 + struct.unpack_from(">b", buf, p)[0]
    if p + 2 > limit:
        raise RecordError(pos, "truncated before the properties length", "")
    props_len = _SHORT.unpack_from(buf, p)[0]
    if props_len < 0 or p + 2 + props_len > limit:
        raise RecordError(pos, f"properties length {props_len} overruns the record", "")
    return bytes(buf[p + 2 : p + 2 + props_len])


def record_sections(buf: ReadBuffer, pos: int = 0) -> tuple[int, int, int, int]:
    """(body start, topic-length field start, properties start, properties end) of the record at ``pos``, from its
    length fields alone; :class:`RecordError` when they overrun its TOTALSIZE."""
    if len(buf) - pos < MIN_RECORD_SIZE:
        raise RecordError(pos, "shorter than a record header")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hdr = _HEADERS[(bool(sys_flag & BORNHOST_V6_FLAG), bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
    limit = pos + total
    if total < hdr.size or limit > len(buf) or magic not in _MESSAGE_MAGICS:
        raise RecordError(pos, f"TOTALSIZE {total} / magic {magic:#x} do not frame a message record")
    body_start = pos + hdr.size
    topic_field = body_start + _INT.unpack_from(buf, body_start - 4)[0]
    wide = magic == MESSAGE_MAGIC_V2
    if topic_field < body_start or topic_field + (2 if wide else 1) > limit:
        raise RecordError(pos, "body length overruns the record")
    if wide:
        topic_start, topic_len = topic_field + 2, _SHORT.unpack_from(buf, topic_field)[0]
    else:
        topic_start, topic_len = topic_field + 1, struct.unpack_from(">b", buf, topic_field)[0]
    props_field = topic_start + topic_len
    if topic_len < 0 or props_field + 2 > limit:
        raise RecordError(pos, f"topic length {topic_len} overruns the record")
    props_len = _SHORT.unpack_from(buf, props_field)[0]
    if props_len < 0 or props_field + 2 + props_len > limit:
        raise RecordError(pos, f"properties length {props_len} overruns the record")
    return body_start, topic_field, props_field + 2, props_field + 2 + props_len


def retarget_record(
    raw: bytes, topic: str, queue_id: int, extra_properties: bytes = b"",
    sections: tuple[int, int, int, int] | None = None,
) -> bytes:  # fmt: skip
    """A stored record re-addressed to ``topic``/``queue_id`` with ``extra_properties`` appended, every other field
    kept (body, CRC, flags, born and store hosts): the copy a delayed message is re-put as.  The append fills in
    queue offset, physical offset and store time.  ``sections``: ``record_sections(raw)`` if already known."""
    _, topic_field, props_start, props_end = sections or record_sections(raw)
    props_len = props_end - props_start + len(extra_properties)
    if props_len > MAX_PROPERTIES_LENGTH:
        raise RecordEncodeError(f"properties of {props_len} bytes exceed {MAX_PROPERTIES_LENGTH}")
    t = topic.encode("utf-8")
    if len(t) > 0x7FFF:
        raise RecordEncodeError(f"topic of {len(t)} bytes is too long")
    magic = magic_for_topic(t)
    topic_len_field = _SHORT.pack(len(t)) if magic == MESSAGE_MAGIC_V2 else bytes((len(t),))
    total = topic_field + len(topic_len_field) + len(t) + 2 + props_len
    mv = memoryview(raw)
    return b"".join((
        _SIZE_MAGIC.pack(total, magic), mv[BODY_CRC_POS:QUEUE_ID_POS], _INT.pack(queue_id), mv[FLAG_POS:topic_field],
        topic_len_field, t, _SHORT.pack(props_len), mv[props_start:props_end], extra_properties,
    ))  # fmt: skip


_PLACEMENT = struct.Struct(">iiiiiq")  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET
PLACEMENT_SIZE = _PLACEMENT.size


def read_record_placement(buf: ReadBuffer, pos: int = 0) -> tuple[int, int, int, int]:
    """(TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET) of the record at ``pos``: what tells whether a ConsumeQueue
    unit really points at it. Needs ``PLACEMENT_SIZE`` bytes."""
    total, magic, _crc, queue_id, _flag, queue_offset = _PLACEMENT.unpack_from(buf, pos)
    return total, magic, queue_id, queue_offset


def read_physical_offset(buf: ReadBuffer, pos: int) -> int:
    return _LONG.unpack_from(buf, pos + PHYSICAL_OFFSET_POS)[0]


def read_topic(buf: ReadBuffer, pos: int = 0) -> str:
    """The TOPIC of the record at ``pos`` from its length fields alone (decoded as ``decode_record`` does);
    :class:`RecordError` when they overrun its TOTALSIZE."""
    _, topic_field, props_start, _ = record_sections(buf, pos)
    width = 2 if _SIZE_MAGIC.unpack_from(buf, pos)[1] == MESSAGE_MAGIC_V2 else 1
    return bytes(buf[topic_field + width : props_start - 2]).decode("utf-8", "replace")


_MAGIC_BYTES = (_INT.pack(MESSAGE_MAGIC_V1), _INT.pack(MESSAGE_MAGIC_V2))


def find_record_boundary(
    buf: bytes | bytearray | mmap.mmap, base_offset: int, start: int, end: int | None = None
) -> int:
    """The first position in ``[start, end)`` where a record of the segment based at ``base_offset``
    begins, or ``end`` when there is none; ``buf`` needs ``find`` (bytes, bytearray, mmap).

    A split of a segment begins here: a record's MAGICCODE followed by a PHYSICALOFFSET equal to its own
    offset is a 12-byte signature a body would have to forge at exactly its own position.  The record
    itself may run past ``end`` (a split owns the records that start in it).
    """
    size = len(buf)
    end = size if end is None else min(end, size)
    if start <= 0:
        return 0
    cursor = start + MAGIC_POS
    limit = min(size, end + MAGIC_POS + 4)  # a magic starting before end + MAGIC_POS, wholly inside
    while cursor < limit:
        hits = [h for h in (buf.find(m, cursor, limit) for m in _MAGIC_BYTES) if h >= 0]
        if not hits:
            break
        at = min(hits)
        pos = at - MAGIC_POS
        if pos + MIN_RECORD_SIZE <= size:
            total = _INT.unpack_from(buf, pos)[0]
            phys = _LONG.unpack_from(buf, pos + PHYSICAL_OFFSET_POS)[0]
            if phys == base_offset + pos and MIN_RECORD_SIZE <= total <= size - pos:
                return pos
        cursor = at + 1
    return end


# The compiled twin (store/format/_records.pyx) replaces these when it is built; see store.format.native.
native.install(globals(), "store.format._records", ("encode_record", "patch_record", "check_record", "put_record"))
