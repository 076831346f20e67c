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
from dataclasses import dataclass, field
from typing import Any

from store.config_files import load_lenient_json

_INT = struct.Struct(">i")
# A registration body is at most a few MiB even with 100k topics; refuse to inflate more than this.
MAX_INFLATED = 256 * 1024 * 1024


class RegisterBodyError(ValueError):
    """A REGISTER_BROKER body that cannot be decoded; the message says where."""


@dataclass
class TopicConf:
    """What the name server keeps of a broker's TopicConfig."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_sys_flag: int = 0
    topic_filter_type: str = "SINGLE_TAG"
    order: bool = False

    def encode(self) -> str:
        """``TopicConfig.encode``: the space-separated line the compressed body carries."""
        return (
            f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} {self.topic_filter_type}"
        )


@dataclass
class RegisterBody:
    data_version: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, TopicConf] = field(default_factory=dict)
    filter_servers: list[str] = field(default_factory=list)


def _topic_from_json(name: str, cfg: Any) -> TopicConf:
    if not isinstance(cfg, dict):
        raise RegisterBodyError(f"topicConfigTable[{name!r}] is not an object")
    try:
        return TopicConf(
            topic_name=str(cfg.get("topicName") or name),
            read_queue_nums=int(cfg.get("readQueueNums", 16)),
            write_queue_nums=int(cfg.get("writeQueueNums", 16)),
            perm=int(cfg.get("perm", 6)),
            topic_sys_flag=int(cfg.get("topicSysFlag", 0)),
            topic_filter_type=str(cfg.get("topicFilterType", "SINGLE_TAG")),
            order=bool(cfg.get("order", False)),
        )
    except (TypeError, ValueError) as e:
        raise RegisterBodyError(f"topicConfigTable[{name!r}]: {e}") from None


def _decode_plain(body: bytes) -> RegisterBody:
    try:
        obj = load_lenient_json(body.decode("utf-8"), "RegisterBrokerBody")
    except (ValueError, UnicodeDecodeError) as e:
        raise RegisterBodyError(f"RegisterBrokerBody is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RegisterBodyError("RegisterBrokerBody is not a JSON object")
    # Brokers older than 3.0.11 sent the wrapper itself; accept both shapes.
    wrapper = obj.get("topicConfigSerializeWrapper", obj if "topicConfigTable" in obj else {})
    if not isinstance(wrapper, dict):
        raise RegisterBodyError("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise RegisterBodyError("topicConfigTable is not an object")
    version = wrapper.get("dataVersion") or {}
    filters = obj.get("filterServerList") or []
    if not isinstance(version, dict) or not isinstance(filters, list):
        raise RegisterBodyError("dataVersion must be an object and filterServerList a list")
    topics = {}
    for name, cfg in table.items():
        conf = _topic_from_json(str(name), cfg)
        topics[conf.topic_name] = conf
    return RegisterBody(version, topics, [str(f) for f in filters])


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def int(self, what: str) -> int:
        if self.pos + 4 > len(self.data):
            raise RegisterBodyError(f"compressed RegisterBrokerBody ends at byte {self.pos} inside {what}")
        (value,) = _INT.unpack_from(self.data, self.pos)
        self.pos += 4
        return value

    def chunk(self, what: str) -> bytes:
        n = self.int(f"the length of {what}")
        if n < 0 or self.pos + n > len(self.data):
            raise RegisterBodyError(
                f"compressed RegisterBrokerBody: {what} length {n} at byte {self.pos - 4} runs past the end "
                f"({len(self.data)} bytes)"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _parse_topic_line(line: str) -> TopicConf:
    parts = line.split(" ", 5)
    if len(parts) < 5:
        raise RegisterBodyError(f"TopicConfig line {line!r} has fewer than 5 fields")
    try:
        return TopicConf(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), topic_filter_type=parts[4])
    except ValueError as e:
        raise RegisterBodyError(f"TopicConfig line {line!r}: {e}") from None


def _decode_compressed(body: bytes) -> RegisterBody:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(body, MAX_INFLATED)
    except zlib.error as e:
        raise RegisterBodyError(f"compressed RegisterBrokerBody does not inflate: {e}") from None
    if inflater.unconsumed_tail:
        raise RegisterBodyError(f"compressed RegisterBrokerBody inflates to more than {MAX_INFLATED} bytes")
    r = _Reader(data)
    try:
        version = json.loads(r.chunk("DataVersion"))
        count = r.int("topic count")
        if count < 0:
            raise RegisterBodyError(f"compressed RegisterBrokerBody: negative topic count {count}")
        topics = {}
        for i in range(count):
            conf = _parse_topic_line(r.chunk(f"TopicConfig #{i}").decode("utf-8"))
            topics[conf.topic_name] = conf
        filters = json.loads(r.chunk("filterServerList")) if r.pos < len(data) else []
    except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, RegisterBodyError):
            raise
        raise RegisterBodyError(f"compressed RegisterBrokerBody near byte {r.pos}: {e}") from None
    if not isinstance(version, dict) or not isinstance(filters, list):
        raise RegisterBodyError("compressed RegisterBrokerBody: bad DataVersion or filterServerList JSON")
    return RegisterBody(version, topics, [str(f) for f in filters])


def decode_register_body(body: bytes, compressed: bool) -> RegisterBody:
    """Decode a REGISTER_BROKER body; raises RegisterBodyError naming what is wrong."""
    if not body:
        return RegisterBody()
    return _decode_compressed(body) if compressed else _decode_plain(body)


def encode_register_body(
    data_version: dict[str, Any],
    topic_config_table: dict[str, dict[str, Any]],
    filter_servers: list[str] | None = None,
    *,
    compressed: bool = False,
) -> bytes:
    """A REGISTER_BROKER body as a 4.9 broker sends it (``topic_config_table`` as in topics.json)."""
    filters = list(filter_servers or [])
    if not compressed:
        wrapper = {"dataVersion": data_version, "topicConfigTable": topic_config_table}
        return json.dumps({"filterServerList": filters, "topicConfigSerializeWrapper": wrapper}).encode()
    parts = []

    def chunk(data: bytes) -> None:
        parts.append(_INT.pack(len(data)))
        parts.append(data)

    chunk(json.dumps(data_version).encode())
    parts.append(_INT.pack(len(topic_config_table)))
    for name, cfg in topic_config_table.items():
        chunk(_topic_from_json(name, cfg).encode().encode())
    chunk(json.dumps(filters).encode())
    return zlib.compress(b"".join(parts), 9)
