"""Java's hashes as RocketMQ computes them: ``String.hashCode``, the ConsumeQueue tagsCode, IndexFile key
hashes and the 31-bit body CRC (``UtilAll.crc32``)."""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

from store.format import native

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


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


def index_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``."""
    return f"{topic}#{key}"


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


def index_key_hashes(keys: pa.Array) -> np.ndarray:
    """:func:`index_key_hash` of every string of an Arrow string array, as a numpy int64 array.

    ASCII keys (nearly all) are hashed with numpy: ``h = sum(c[i] * 31**(n-1-i))`` in uint32 arithmetic,
    which wraps exactly as Java's int does; others go through :func:`index_key_hash` one by one.
    numpy and pyarrow are imported here, not at the top, so that the store never needs them.
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


# The compiled twin (store/format/_hashing.pyx) replaces these when it is built; see store.format.native.
native.install(globals(), "store.format._hashing", ("java_string_hash", "index_key_hash"))
