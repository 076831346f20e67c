"""The body of a SEND_BATCH_MESSAGE request (``MessageDecoder.encodeMessages`` / ``decodeMessages``).

A wire format, not a store one: the broker turns each item into a CommitLog record of its own.
Per message: TOTALSIZE, MAGICCODE (the client writes 0), BODYCRC (0), FLAG, BODYLENGTH; then BODY,
PROPERTIESLENGTH (short), PROPERTIES.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from store.errors import MQLakeError
from store.format.records import MAX_PROPERTIES_LENGTH

_ITEM_HEAD = struct.Struct(">iiiii")
_SHORT = struct.Struct(">h")


class BatchBodyError(MQLakeError, ValueError):
    """A batch body that cannot be encoded or decoded; names the byte offset."""


@dataclass(slots=True)
class BatchItem:
    flag: int
    body: bytes
    properties: bytes


def encode_batch_body(items: list[BatchItem]) -> bytes:
    """``MessageDecoder.encodeMessages``: what a producer sends as a SEND_BATCH_MESSAGE body."""
    out: list[bytes] = []
    for it in items:
        if len(it.properties) > MAX_PROPERTIES_LENGTH:
            raise BatchBodyError(f"properties of {len(it.properties)} bytes exceed {MAX_PROPERTIES_LENGTH}")
        total = _ITEM_HEAD.size + len(it.body) + 2 + len(it.properties)
        out += (_ITEM_HEAD.pack(total, 0, 0, it.flag, len(it.body)), it.body, _SHORT.pack(len(it.properties)))
        out.append(it.properties)
    return b"".join(out)


def decode_batch_body(buf: bytes | bytearray | memoryview) -> list[BatchItem]:
    """``MessageDecoder.decodeMessages``; a malformed body raises :class:`BatchBodyError` naming the byte offset."""
    items = []
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos < _ITEM_HEAD.size + 2:
            raise BatchBodyError(f"batch body truncated at offset {pos}: {end - pos} bytes left")
        total, _magic, _crc, flag, body_len = _ITEM_HEAD.unpack_from(buf, pos)
        p = pos + _ITEM_HEAD.size
        if body_len < 0 or p + body_len + 2 > end:
            raise BatchBodyError(f"batch message at offset {pos}: body length {body_len} overruns the body")
        body = bytes(buf[p : p + body_len])
        p += body_len
        (props_len,) = _SHORT.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise BatchBodyError(f"batch message at offset {pos}: properties length {props_len} overruns the body")
        if total != p + props_len - pos:
            fields = p + props_len - pos
            raise BatchBodyError(f"batch message at offset {pos}: size {total} differs from its fields' {fields}")
        items.append(BatchItem(flag, body, bytes(buf[p : p + props_len])))
        pos = p + props_len
    return items
