"""REGISTER_BROKER bodies (reference §7.5): plain JSON ``RegisterBrokerBody`` and the zlib-compressed form.

Compressed layout (big-endian, inside one zlib stream): ``int len + DataVersion JSON``, ``int topicCount``,
per topic ``int len + TopicConfig.encode()`` (``name readQ writeQ perm filterType [attributesJson]``),
``int len + filterServerList JSON``, then on 5.x brokers ``int count`` + ``int len + TopicQueueMappingInfo``
each (read past, not used: we serve no static topics).
"""

from __future__ import annotations

import json
import struct
import zlib

from broker.remoting.protocol.topic import DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigSerializeWrapper
from broker.remoting.protocol.wire import BodyError

_INT = struct.Struct(">i")
# A registration body is at most a few MiB even with 100k topics; refuse to inflate more than this.
MAX_INFLATED = 256 * 1024 * 1024
_WHAT = "compressed RegisterBrokerBody"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def int(self, what: str) -> int:
        if self.pos + 4 > len(self.data):
            raise BodyError(f"{_WHAT} ends at byte {self.pos} inside {what}")
        (value,) = _INT.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(value)

    def chunk(self, what: str) -> bytes:
        n = self.int(f"the length of {what}")
        if n < 0 or self.pos + n > len(self.data):
            raise BodyError(
                f"{_WHAT}: {what} length {n} at byte {self.pos - 4} runs past the end ({len(self.data)} bytes)"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _decode_compressed(body: bytes) -> RegisterBrokerBody:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(body, MAX_INFLATED)
    except zlib.error as e:
        raise BodyError(f"{_WHAT} does not inflate: {e}") from None
    if inflater.unconsumed_tail:
        raise BodyError(f"{_WHAT} inflates to more than {MAX_INFLATED} bytes")
    r = _Reader(data)
    version = DataVersion.decode(r.chunk("DataVersion"), f"{_WHAT}'s DataVersion")
    count = r.int("topic count")
    if count < 0:
        raise BodyError(f"{_WHAT}: negative topic count {count}")
    topics = {}
    for i in range(count):
        line = r.chunk(f"TopicConfig #{i}")
        try:
            conf = TopicConfig.decode_line(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise BodyError(f"{_WHAT}: TopicConfig #{i} is not UTF-8: {e}") from None
        topics[conf.topic_name] = conf
    filters: object = []
    if r.pos < len(data):
        try:
            filters = json.loads(r.chunk("filterServerList"))
        except ValueError as e:  # UnicodeDecodeError is one
            raise BodyError(f"{_WHAT} near byte {r.pos}: filterServerList: {e}") from None
    wrapper = TopicConfigSerializeWrapper(data_version=version, topic_config_table=topics)
    return RegisterBrokerBody.from_json(
        {"filterServerList": filters, "topicConfigSerializeWrapper": wrapper}, f"{_WHAT}"
    )


def decode_register_body(body: bytes, compressed: bool) -> RegisterBrokerBody | None:
    """Decode a REGISTER_BROKER body (None when there is none); raises BodyError naming what is wrong."""
    if not body:
        return None
    return _decode_compressed(body) if compressed else RegisterBrokerBody.decode(body)
