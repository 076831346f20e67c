"""The one codec: every byte offset of RocketMQ's store files lives here.

CommitLog records, ConsumeQueue units, IndexFile header/slot/entry, the checkpoint, the properties
string, message ids, Java ``String.hashCode`` and the 31-bit body CRC.  Pure functions over bytes;
the broker, the pipelines and the tests all encode and decode through this module.

Layouts follow Apache RocketMQ 4.9.8 / 5.x (``MessageDecoder``, ``CommitLog.doAppend``,
``ConsumeQueue``, ``IndexFile``, ``StoreCheckpoint``).  Every integer is big-endian.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

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
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700

# --- limits ------------------------------------------------------------------------------------------
MAX_TOPIC_LENGTH_V1 = 127  # V1 reads the topic length as a signed byte
MAX_PROPERTIES_LENGTH = 32767  # signed short

# --- properties (MessageConst) -------------------------------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# --- ConsumeQueue ------------------------------------------------------------------------------------
CQ_UNIT_SIZE = 20
_CQ_UNIT = struct.Struct(">qiq")
CQ_FILL_SIZE = 0x7FFFFFFF  # the size of a fillPreBlank unit (Integer.MAX_VALUE): it points nowhere
CQ_FILL_UNIT = (0, CQ_FILL_SIZE, 0)

# --- IndexFile -----------------------------------------------------------------------------------------
INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
_INDEX_HEADER = struct.Struct(">qqqqii")
_INDEX_ENTRY = struct.Struct(">iqii")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")

# --- checkpoint ------------------------------------------------------------------------------------------
CHECKPOINT_SIZE = 4096
_CHECKPOINT = struct.Struct(">qqq")  # physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp

# --- CommitLog record: fixed positions (MessageDecoder) -----------------------------------------------
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

_PREFIX = struct.Struct(">iiiiiqqiq")  # totalSize .. bornTimestamp: 48 bytes
_SIZE_MAGIC = struct.Struct(">ii")


def _host_struct(v6: bool) -> str:
    return "16si" if v6 else "4si"


# One struct per (bornHost v6, storeHost v6): everything from TOTALSIZE to BODYLENGTH.
_HEADERS: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(">iiiiiqqiq" + _host_struct(b) + "q" + _host_struct(s) + "iqi")
    for b in (False, True)
    for s in (False, True)
}


class RecordError(ValueError):
    """A CommitLog record that cannot be decoded; names where it sits."""

    def __init__(self, position: int, reason: str, source: str = "") -> None:
        where = f"{source} at offset {position}" if source else f"offset {position}"
        super().__init__(f"invalid CommitLog record in {where}: {reason}")
        self.position = position
        self.reason = reason
        self.source = source


# =====================================================================================================
# Java semantics
# =====================================================================================================


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: ``31*h + c`` over UTF-16 code units, as a signed 32-bit int."""
    if s.isascii():
        units: bytes | tuple[int, ...] = s.encode("ascii")
    else:
        raw = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    h = 0
    if len(units) <= 256:
        for c in units:
            h = 31 * h + c
        h &= 0xFFFFFFFF
    else:
        for c in units:
            h = (31 * h + c) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def body_crc32(data: bytes | bytearray | memoryview) -> int:
    """``UtilAll.crc32``: java.util.zip.CRC32 masked to 31 bits."""
    return zlib.crc32(data) & 0x7FFFFFFF


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a normal message: ``tags.hashCode()`` widened to long, 0 when empty."""
    return java_string_hash(tags) if tags else 0


_prefix_hash_cache: dict[str, int] = {}


def _unsigned_hash(s: str) -> int:
    return java_string_hash(s) & 0xFFFFFFFF


def index_key_hash(key: str) -> int:
    """IndexFile key hash: ``Math.abs(key.hashCode())``, 0 for Integer.MIN_VALUE (abs stays negative).

    Index keys share long prefixes (``topic#`` and a producer's UNIQ_KEY prefix), and
    ``hash(a + b) = hash(a) * 31**len(b) + hash(b)``, so the prefix hash is cached and only the last
    16 characters are hashed per key.
    """
    if len(key) > 16:
        head, tail = key[:-16], key[-16:]
        hh = _prefix_hash_cache.get(head)
        if hh is None:
            if len(_prefix_hash_cache) > 65_536:
                _prefix_hash_cache.clear()
            hh = _prefix_hash_cache[head] = _unsigned_hash(head)
        # The multiplier counts UTF-16 units, which differ from characters only outside ASCII.
        units = 16 if tail.isascii() else len(tail.encode("utf-16-be", "surrogatepass")) // 2
        h = (hh * pow(31, units, 1 << 32) + _unsigned_hash(tail)) & 0xFFFFFFFF
    else:
        h = _unsigned_hash(key)
    if h == 0x80000000:
        return 0
    return 0x100000000 - h if h & 0x80000000 else h


def index_key_hashes(keys) -> object:
    """:func:`index_key_hash` of every string of an Arrow string array, as a numpy int64 array.

    ASCII keys (nearly all) are hashed with numpy: ``h = sum(c[i] * 31**(n-1-i))`` in uint32 arithmetic,
    which wraps exactly as Java's int does; others go through :func:`index_key_hash` one by one.
    """
    import numpy as np
    import pyarrow as pa

    keys = keys.cast(pa.string())
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int64)
    offs = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset : keys.offset + n + 1].astype(np.int64)
    raw = keys.buffers()[2]
    data = np.frombuffer(raw, np.uint8)[offs[0] : offs[-1]] if raw is not None else np.zeros(0, np.uint8)
    offs -= offs[0]
    lens = np.diff(offs)
    out = np.zeros(n, np.int64)
    nonempty = lens > 0
    if len(data):
        owner = np.repeat(np.arange(n), lens)
        exp = (lens[owner] - 1 - (np.arange(len(data)) - offs[owner])).astype(np.int64)
        pow31 = np.ones(int(lens.max()), np.uint32)
        for i in range(1, len(pow31)):
            pow31[i] = (int(pow31[i - 1]) * 31) & 0xFFFFFFFF
        terms = data.astype(np.uint32) * pow31[exp]
        starts = offs[:-1][nonempty]
        h = np.add.reduceat(terms, starts, dtype=np.uint32).astype(np.int64)
        ascii_ok = np.maximum.reduceat(data, starts) < 0x80
        signed = np.where(h >= 0x80000000, h - 0x100000000, h)
        vals = np.where(h == 0x80000000, 0, np.abs(signed))
        out[nonempty] = vals
        for i in np.flatnonzero(nonempty)[~ascii_ok].tolist():
            out[i] = index_key_hash(keys[i].as_py())
    return out


def index_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``."""
    return f"{topic}#{key}"


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


def is_consumable(sys_flag: int) -> bool:
    """Normal and committed records get a queue offset and a ConsumeQueue unit; half and rollback ones do not."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def parse_delay_levels(levels: str = DEFAULT_DELAY_LEVELS) -> list[int]:
    """``ScheduleMessageService.parseDelayLevel``: level n (1-based) -> milliseconds at index n-1."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    return [int(tok[:-1]) * units[tok[-1]] for tok in levels.split()]


_DELAY_MILLIS = parse_delay_levels()


def delay_deliver_timestamp(level: int, store_timestamp: int, delay_millis: list[int] = _DELAY_MILLIS) -> int:
    """``computeDeliverTimestamp``: the tagsCode of a SCHEDULE_TOPIC_XXXX unit."""
    level = min(level, len(delay_millis))
    if level >= 1:
        return store_timestamp + delay_millis[level - 1]
    return store_timestamp + 1000


def schedule_tags_code(
    delay: str | bytes | None, store_timestamp: int, tag_hash: int, delay_millis: list[int] = _DELAY_MILLIS
) -> int:
    """tagsCode of a SCHEDULE_TOPIC_XXXX unit: the deliver time when DELAY is a positive level, else ``tag_hash``.

    Java rejects the whole record on a non-numeric DELAY; we keep the tag hash rather than let recovery
    truncate the log at a message whose only fault is a bad property.
    """
    raw = delay.encode("utf-8") if isinstance(delay, str) else delay
    if raw is not None and raw.isdigit() and int(raw) > 0:  # bytes.isdigit: ASCII digits only
        return delay_deliver_timestamp(int(raw), store_timestamp, delay_millis)
    return tag_hash


# =====================================================================================================
# Properties string
# =====================================================================================================


def encode_properties(props: Mapping[str, str | None]) -> bytes:
    """``messageProperties2String``: ``name 0x01 value 0x02`` per entry, null values skipped."""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items() if v is not None
    ).encode("utf-8")


def iter_properties(raw: bytes):
    """(name, value) byte pairs of a properties string, with ``string2messageProperties``'s quirks:
    a segment without 0x01, with an empty name or with an empty value is dropped."""
    for seg in raw.split(b"\x02"):
        name, sep, value = seg.partition(b"\x01")
        if sep and name and value:
            yield name, value


def decode_properties(data: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """``string2messageProperties``."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return {n.decode("utf-8", "replace"): v.decode("utf-8", "replace") for n, v in iter_properties(raw)}


def split_keys(keys: str | None) -> list[str]:
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


# =====================================================================================================
# Hosts and message ids
# =====================================================================================================

Host = tuple[str, int]


@functools.lru_cache(maxsize=4096)
def pack_ip(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def encode_host(host: Host) -> bytes:
    """Socket address as stored: 4 (or 16) address bytes + 4-byte port."""
    ip, port = host
    return pack_ip(ip) + _INT.pack(port)


@functools.lru_cache(maxsize=256)
def _host_hex(host: Host) -> str:
    return encode_host(host).hex().upper()


def _decode_addr(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def create_offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """``MessageDecoder.createMessageId``: upper-case hex of store ip + port + physical offset."""
    return f"{_host_hex(store_host)}{physical_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def decode_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """``decodeMessageId``: 32 hex characters are IPv4, 56 are IPv6."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise ValueError(f"message id {msg_id!r} is not hex") from e
    if len(raw) not in (16, 28):
        raise ValueError(f"message id {msg_id!r} has {len(msg_id)} hex characters, expected 32 or 56")
    n = len(raw) - 12
    return (_decode_addr(raw[:n]), _INT.unpack_from(raw, n)[0]), _LONG.unpack_from(raw, n + 4)[0]


def _start_of_month_ms(now_ms: int) -> int:
    d = datetime.fromtimestamp(now_ms / 1000).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    # Where local midnight happens twice or not at all, java.util.Calendar lands on the later instant.
    return int(max(d.timestamp(), d.replace(fold=1).timestamp()) * 1000)


def _local_ip_bytes() -> bytes:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it picks the outbound address
            return socket.inet_aton(s.getsockname()[0])
    except OSError:
        return _INT.pack(int(time.time()) & 0x7FFFFFFF)


class UniqKeyGenerator:
    """``MessageClientIDSetter``: ip + pid(short) + loader hash(int) + ms since month start + counter."""

    def __init__(self, ip: bytes | None = None, pid: int | None = None, salt: int | None = None) -> None:
        ip = ip if ip is not None else _local_ip_bytes()
        pid = (os.getpid() if pid is None else pid) & 0xFFFF
        salt = random.getrandbits(32) if salt is None else salt & 0xFFFFFFFF
        self._prefix = (ip + struct.pack(">HI", pid, salt)).hex().upper()
        self._counter = itertools.count(random.getrandbits(16))
        self._lock = threading.Lock()
        self._month_start = 0
        self._next_month = 0

    def next(self, now_ms: int | None = None) -> str:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if now >= self._next_month or now < self._month_start:
                self._month_start = _start_of_month_ms(now)
                self._next_month = _start_of_month_ms(self._month_start + 32 * 86_400_000)
            diff = now - self._month_start
            count = next(self._counter) & 0xFFFF
        diff = 0 if -1_000_000 < diff < 0 else diff
        return self._prefix + struct.pack(">IH", diff & 0xFFFFFFFF, count).hex().upper()


# =====================================================================================================
# CommitLog record
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


_SHORT = struct.Struct(">h")
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET


def encode_record(rec: MessageRecord) -> bytes:
    """Encode a full record. ``rec.sys_flag`` host bits are derived from the hosts."""
    topic = rec.topic.encode("utf-8")
    topic_len = len(topic)
    magic = rec.magic
    if magic is None:
        magic = magic_for_topic(topic)
    elif magic == MESSAGE_MAGIC_V1 and topic_len > MAX_TOPIC_LENGTH_V1:
        raise ValueError(f"topic of {topic_len} bytes needs the V2 record format")
    if topic_len > 0x7FFF:
        raise ValueError(f"topic of {topic_len} bytes is too long")
    props = rec.properties
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_LENGTH}")
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
    buf: bytearray | memoryview, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int
) -> None:
    """Back-fill what is only known inside the put lock (``doAppend``)."""
    _OFFSETS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, physical_offset)  # adjacent fields
    born_v6 = buf[pos + SYSFLAG_POS + 3] & BORNHOST_V6_FLAG
    _LONG.pack_into(buf, pos + (68 if born_v6 else 56), store_timestamp)


def encode_blank(remaining: int) -> bytes:
    """End-of-file filler: TOTALSIZE = every byte left in the file, then BLANK magic."""
    return _SIZE_MAGIC.pack(remaining, BLANK_MAGIC)


def peek_size_magic(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    return _SIZE_MAGIC.unpack_from(buf, pos)


def decode_record(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = False, source: str = ""
) -> MessageRecord:
    """Decode the record at ``pos``; raise :class:`RecordError` naming ``source`` and the offset."""
    end = len(buf)
    if end - pos < _PREFIX.size:
        raise RecordError(pos, f"truncated: {end - pos} bytes left, a record header needs {_PREFIX.size}", source)
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        raise RecordError(pos, f"bad magic 0x{magic & 0xFFFFFFFF:08X}", source)
    if total < _PREFIX.size or total > end - pos:
        raise RecordError(pos, f"size {total} does not fit the {end - pos} bytes left", source)
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hdr = _HEADERS[(bool(sys_flag & BORNHOST_V6_FLAG), bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
    if total < hdr.size:
        raise RecordError(pos, f"size {total} is shorter than the fixed header", source)
    (
        _, _, crc, queue_id, flag, queue_offset, phys, _, born_ts, born_ip, born_port,
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
        topic_len = struct.unpack_from(">h", buf, p)[0]
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
    props_len = struct.unpack_from(">h", buf, p)[0]
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
        born_timestamp=born_ts, born_host=(_decode_addr(born_ip), born_port), store_timestamp=store_ts,
        store_host=(_decode_addr(store_ip), store_port), reconsume_times=reconsume,
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


@dataclass(slots=True)
class CheckResult:
    """``checkMessageAndReturnSize``: size > 0 a record, size 0 with ``blank`` end of file, else invalid."""

    ok: bool
    size: int
    request: DispatchRequest | None = None
    blank: bool = False
    reason: str = ""


# Only the numbers dispatch needs, hosts skipped: (size, magic, crc, queueId, flag, queueOffset, physOffset,
# sysFlag, bornTs, storeTs, reconsumeTimes, preparedTxOffset, bodyLength).
_DISPATCH_HEADERS: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(">iiiiiqqiq" + ("20x" if b else "8x") + "q" + ("20x" if s else "8x") + "iqi")
    for b in (False, True)
    for s in (False, True)
}
_TAGS_B = PROPERTY_TAGS.encode()
_KEYS_B = PROPERTY_KEYS.encode()
_UNIQ_B = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_DELAY_B = PROPERTY_DELAY_TIME_LEVEL.encode()
_topic_cache: dict[bytes, str] = {}
_tags_code_cache: dict[bytes, int] = {}  # a topic uses few distinct tags; hashing each message's anew is waste


def check_record(
    buf: bytes | bytearray | memoryview,
    pos: int,
    *,
    check_crc: bool = True,
    delay_millis: list[int] = _DELAY_MILLIS,
) -> CheckResult:
    """``checkMessageAndReturnSize``: validate the record at ``pos`` and extract its dispatch request.

    This is the reput and recovery hot path, so it reads only what dispatch needs (no hosts, no body
    copy) yet checks the same things as :func:`decode_record`: magic, every length, the size formula
    and, with ``check_crc``, the body CRC.
    """
    end = len(buf)
    if end - pos < 8:
        return CheckResult(False, -1, reason="fewer than 8 bytes left")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return CheckResult(True, 0, blank=True)
    if total == 0 and magic == 0:
        return CheckResult(False, 0, reason="end of data (zeros)")
    if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
        return CheckResult(False, -1, reason=f"bad magic 0x{magic & 0xFFFFFFFF:08X}")
    limit = pos + total
    if total < _PREFIX.size or limit > end:
        return CheckResult(False, -1, reason=f"size {total} does not fit the {end - pos} bytes left")
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hdr = _DISPATCH_HEADERS[(bool(sys_flag & BORNHOST_V6_FLAG), bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
    if total < hdr.size:
        return CheckResult(False, -1, reason=f"size {total} is shorter than the fixed header")
    (_, _, crc, queue_id, _, queue_offset, phys, _, _, store_ts, _, prepared, body_len) = hdr.unpack_from(buf, pos)
    p = pos + hdr.size
    if body_len < 0 or p + body_len > limit:
        return CheckResult(False, -1, reason=f"body length {body_len} overruns the record of {total} bytes")
    body_at = p
    p += body_len
    if magic == MESSAGE_MAGIC_V2:
        topic_len = struct.unpack_from(">h", buf, p)[0] if p + 2 <= limit else -1
        p += 2
    else:
        topic_len = struct.unpack_from(">b", buf, p)[0] if p + 1 <= limit else -1
        p += 1
    if topic_len < 0 or p + topic_len + 2 > limit:
        return CheckResult(False, -1, reason=f"topic length {topic_len} overruns the record")
    raw_topic = bytes(buf[p : p + topic_len])
    p += topic_len
    props_len = struct.unpack_from(">h", buf, p)[0]
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
    # iter_properties, inlined: a generator costs a quarter of this function's time on the reput path.
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
        code = _tags_code_cache.get(tags)
        if code is None:
            if len(_tags_code_cache) > 100_000:
                _tags_code_cache.clear()
            code = _tags_code_cache[tags] = tags_code(tags.decode("utf-8", "replace"))
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
        ),
    )


def read_store_timestamp(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """STORETIMESTAMP of the record at ``pos`` without decoding the rest."""
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POS)[0]
    return _LONG.unpack_from(buf, pos + store_timestamp_position(sys_flag))[0]


_PLACEMENT = struct.Struct(">iiiiiq")  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET
PLACEMENT_SIZE = _PLACEMENT.size


def read_record_placement(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int, int]:
    """(TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET) of the record at ``pos``: what tells whether a ConsumeQueue
    unit really points at it. Needs ``PLACEMENT_SIZE`` bytes."""
    total, magic, _crc, queue_id, _flag, queue_offset = _PLACEMENT.unpack_from(buf, pos)
    return total, magic, queue_id, queue_offset


def read_physical_offset(buf: bytes | bytearray | memoryview, pos: int) -> int:
    return _LONG.unpack_from(buf, pos + PHYSICAL_OFFSET_POS)[0]


# =====================================================================================================
# ConsumeQueue unit
# =====================================================================================================


def encode_cq_unit(commitlog_offset: int, size: int, tags_code: int) -> bytes:
    return _CQ_UNIT.pack(commitlog_offset, size, tags_code)


def pack_cq_unit_into(buf: bytearray | memoryview, pos: int, commitlog_offset: int, size: int, tags_code: int) -> None:
    _CQ_UNIT.pack_into(buf, pos, commitlog_offset, size, tags_code)


def decode_cq_unit(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int]:
    """(commitLogOffset, size, tagsCode)."""
    return _CQ_UNIT.unpack_from(buf, pos)


def iter_cq_units(buf: bytes | bytearray | memoryview):
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


def decode_index_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> IndexHeader:
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


def read_index_slot(buf: bytes | bytearray | memoryview, slot: int) -> int:
    return _INT.unpack_from(buf, index_slot_position(slot))[0]


def write_index_slot(buf: bytearray | memoryview, slot: int, entry_no: int) -> None:
    _INT.pack_into(buf, index_slot_position(slot), entry_no)


def encode_index_entry(key_hash: int, phy_offset: int, time_diff: int, prev_index: int) -> bytes:
    return _INDEX_ENTRY.pack(key_hash, phy_offset, time_diff, prev_index)


def pack_index_entry_into(
    buf: bytearray | memoryview, hash_slot_num: int, entry_no: int, key_hash: int, phy_offset: int,
    time_diff: int, prev_index: int,
) -> None:  # fmt: skip
    _INDEX_ENTRY.pack_into(
        buf, index_entry_position(hash_slot_num, entry_no), key_hash, phy_offset, time_diff, prev_index
    )


def read_index_entry(
    buf: bytes | bytearray | memoryview, hash_slot_num: int, entry_no: int
) -> tuple[int, int, int, int]:
    """(keyHash, phyOffset, timeDiff seconds, prevIndex)."""
    return _INDEX_ENTRY.unpack_from(buf, index_entry_position(hash_slot_num, entry_no))


def index_file_name(timestamp_ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: yyyyMMddHHmmssSSS in local time."""
    t = datetime.fromtimestamp(timestamp_ms / 1000)
    return t.strftime("%Y%m%d%H%M%S") + f"{timestamp_ms % 1000:03d}"


# =====================================================================================================
# Checkpoint and segment names
# =====================================================================================================


def encode_checkpoint(physic_msg_timestamp: int, logics_msg_timestamp: int, index_msg_timestamp: int) -> bytes:
    return _CHECKPOINT.pack(physic_msg_timestamp, logics_msg_timestamp, index_msg_timestamp)


def decode_checkpoint(buf: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp)."""
    return _CHECKPOINT.unpack_from(buf, 0)


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: 20-digit zero-padded decimal."""
    return f"{offset:020d}"


# =====================================================================================================
# Columnar decode: many CommitLog records at once into Arrow arrays (the Spark CommitLog source)
# =====================================================================================================
# The per-record decode above builds a Python object per field; at a million records per GiB that is
# the bottleneck of a Spark scan.  Here a sequential walk of the size fields finds the records, then
# every fixed field is gathered for all of them with numpy, and the variable fields (body, topic,
# properties) become Arrow binary-view arrays pointing into the segment that Arrow compacts in C++.
# numpy and pyarrow are imported lazily so that the store itself never needs them.

WALK_LIMIT = "limit"  # reached the requested stop position or record count
WALK_BLANK = "blank"  # the end-of-file BLANK record
WALK_ZEROS = "zeros"  # zeros where the next record would start: the end of the data (an active tail)
WALK_EOF = "eof"  # the last record ends exactly at the end of the buffer
WALK_INVALID = "invalid"  # bytes that cannot start a record


@dataclass(slots=True)
class RecordWalk:
    """Where the records between two positions start, and why the walk stopped."""

    positions: list[int]
    end: int
    stop: str
    blank_size: int = 0  # TOTALSIZE of the BLANK record when ``stop == WALK_BLANK``


def walk_records(
    buf: bytes | bytearray | memoryview, start: int = 0, stop: int | None = None, max_records: int | None = None
) -> RecordWalk:
    """Follow TOTALSIZE from ``start`` (a record boundary) while the position is below ``stop``.

    Checks only magic and that the size fits; :func:`decode_batch` checks every field of what it finds.
    """
    end = len(buf)
    stop = end if stop is None else min(stop, end)
    limit = max_records if max_records is not None else end
    unpack = _SIZE_MAGIC.unpack_from
    positions: list[int] = []
    append = positions.append
    pos = start
    while pos < stop and len(positions) < limit:
        if end - pos < SIZE_MAGIC_LENGTH:
            return RecordWalk(positions, pos, WALK_ZEROS if not any(buf[pos:end]) else WALK_INVALID)
        total, magic = unpack(buf, pos)
        if magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
            if total < _PREFIX.size or total > end - pos:
                return RecordWalk(positions, pos, WALK_INVALID)
            append(pos)
            pos += total
        elif magic == BLANK_MAGIC:
            return RecordWalk(positions, pos, WALK_BLANK, total)
        elif total == 0 and magic == 0:
            return RecordWalk(positions, pos, WALK_ZEROS)
        else:
            return RecordWalk(positions, pos, WALK_INVALID)
    return RecordWalk(positions, pos, WALK_EOF if pos == end else WALK_LIMIT)


_MAGIC_BYTES = (_INT.pack(MESSAGE_MAGIC_V1), _INT.pack(MESSAGE_MAGIC_V2))


def find_record_boundary(buf, base_offset: int, start: int, end: int | None = None) -> int:
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
        if pos + _PREFIX.size <= size:
            total = _INT.unpack_from(buf, pos)[0]
            phys = _LONG.unpack_from(buf, pos + PHYSICAL_OFFSET_POS)[0]
            if phys == base_offset + pos and _PREFIX.size <= total <= size - pos:
                return pos
        cursor = at + 1
    return end


def host_string(host: Host) -> str:
    """``ip:port``, as the Python client shows hosts (IPv6 unbracketed; split on the last colon)."""
    return f"{host[0]}:{host[1]}"


def parse_host_string(text: str) -> Host:
    ip, _, port = text.rpartition(":")
    return ip, int(port)


def _rows(arr, at, width: int):
    """``width`` bytes at each position ``at`` as an (n, width) array; positions are clipped to the buffer
    (rows found invalid are dropped later).  A sliding-window view makes this one row copy per position,
    many times faster than gathering ``at[:, None] + arange(width)``."""
    import numpy as np

    if len(arr) < width:
        arr = np.concatenate([arr, np.zeros(width - len(arr), np.uint8)])
    windows = np.lib.stride_tricks.sliding_window_view(arr, width)
    return windows[np.clip(at, 0, len(arr) - width)]


def _gather_be(arr, at, width: int, dtype: str):
    """Big-endian integers of ``width`` bytes at positions ``at``, in native byte order."""
    return _rows(arr, at, width).view(dtype).reshape(-1).astype(dtype.replace(">", "="))


def _gather_binary(pa_buf, arr, starts, lengths):
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


def _utf8(binary):
    """Binary -> string; invalid UTF-8 becomes U+FFFD as in :func:`decode_record` instead of failing the batch."""
    import pyarrow as pa

    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()], pa.string())


def properties_map_array(props):
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


def _host_strings(arr, at, v6):
    """``ip:port`` per row from the stored socket address at ``at``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if v6.any():  # rare: per row
        out = []
        for a, is6 in zip(at.tolist(), v6.tolist(), strict=True):
            n = 16 if is6 else 4
            out.append(host_string((_decode_addr(bytes(arr[a : a + n])), _INT.unpack_from(arr, a + n)[0])))
        return pa.array(out, pa.string())
    octets = _rows(arr, at, 4)
    parts = [pa.array(octets[:, i]).cast(pa.string()) for i in range(4)]
    port = pa.array(_gather_be(arr, at + 4, 4, ">i4")).cast(pa.string())
    return pc.binary_join_element_wise(pc.binary_join_element_wise(*parts, "."), port, ":")


_HEX = b"".join(f"{i:02X}".encode() for i in range(256))


def _offset_msg_ids(arr, store_host_at, store_v6, phys, host_strings):
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

    pos: object
    total: object
    magic: object
    sys_flag: object
    born_v6: object
    store_v6: object
    store_ts_at: object
    store_host_at: object
    reconsume_at: object
    body_at: object
    body_len: object
    topic_at: object
    topic_len: object
    props_at: object
    props_len: object
    error: RecordError | None = None

    def __len__(self) -> int:
        return len(self.pos)


def layout_records(buf, positions: list[int], *, source: str = "") -> RecordLayout:
    """Locate every field of the records at ``positions`` (from :func:`walk_records`) and check them as
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


def body_crc_ok(buf, layout: RecordLayout):
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


def read_columns(buf, layout: RecordLayout, names: tuple[str, ...]) -> dict:
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


def decode_columns(buf, layout: RecordLayout) -> dict:
    """Decode the laid-out records into Arrow arrays, one per column of ``pipelines/schema.py`` but
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


# =====================================================================================================
# SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessages`` / ``decodeMessages``)
# =====================================================================================================

# Per message: TOTALSIZE, MAGICCODE (client writes 0), BODYCRC (0), FLAG, BODYLEN; then BODY, PROPLEN (short),
# PROPERTIES.
_BATCH_ITEM_HEAD = struct.Struct(">iiiii")


@dataclass(slots=True)
class BatchItem:
    flag: int
    body: bytes
    properties: bytes


def encode_batch_body(items: list[BatchItem]) -> bytes:
    """``MessageDecoder.encodeMessages``: what a producer sends as a SEND_BATCH_MESSAGE body."""
    out = []
    for it in items:
        if len(it.properties) > MAX_PROPERTIES_LENGTH:
            raise ValueError(f"properties of {len(it.properties)} bytes exceed {MAX_PROPERTIES_LENGTH}")
        total = _BATCH_ITEM_HEAD.size + len(it.body) + 2 + len(it.properties)
        out += (_BATCH_ITEM_HEAD.pack(total, 0, 0, it.flag, len(it.body)), it.body, _SHORT.pack(len(it.properties)))
        out.append(it.properties)
    return b"".join(out)


def decode_batch_body(buf: bytes | bytearray | memoryview) -> list[BatchItem]:
    """``MessageDecoder.decodeMessages``; a malformed body raises ValueError naming the byte offset."""
    items = []
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos < _BATCH_ITEM_HEAD.size + 2:
            raise ValueError(f"batch body truncated at offset {pos}: {end - pos} bytes left")
        total, _magic, _crc, flag, body_len = _BATCH_ITEM_HEAD.unpack_from(buf, pos)
        p = pos + _BATCH_ITEM_HEAD.size
        if body_len < 0 or p + body_len + 2 > end:
            raise ValueError(f"batch message at offset {pos}: body length {body_len} overruns the body")
        body = bytes(buf[p : p + body_len])
        p += body_len
        (props_len,) = _SHORT.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise ValueError(f"batch message at offset {pos}: properties length {props_len} overruns the body")
        if total != p + props_len - pos:
            fields = p + props_len - pos
            raise ValueError(f"batch message at offset {pos}: size {total} differs from its fields' {fields}")
        items.append(BatchItem(flag, body, bytes(buf[p : p + props_len])))
        pos = p + props_len
    return items
