"""Differential fuzz targets: each feeds one input to both twins of a codec function (store.format.native) and
raises :class:`Disagreement` unless they give the same result, or raise the same type of error.

A target takes raw bytes and derives its arguments from them, so the same functions serve atheris
(``make fuzz``, ``tools/fuzz.py``: coverage-guided, a million inputs per target) and the quick seeded smoke of
``tests/test_twins.py``.  Inputs that matter are near-valid ones, so most targets start from a valid record,
properties string or key and overlay the fuzzer's bytes on it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.remoting import send_codec, tx_codec  # noqa: F401 - imported for their twins (store.format.native)
from broker.remoting.codes import RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from store.format import (
    appender,
    batch_body,
    delay,
    native,
    properties,
    records,
    runs,  # noqa: F401 - imported for its twins
    transaction,
    units,
)


class Disagreement(AssertionError):
    """The twins answered one input differently."""


def _pair(module: str, name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    twins = native.TWINS[module]
    if name not in twins.compiled:
        raise RuntimeError(f"{twins.extension} is not built ({native.missing_cause}): nothing to compare")
    return twins.python[name], twins.compiled[name]


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    try:
        return True, fn(*args, **kwargs)
    except Exception as e:  # the error's type is part of the answer
        return False, type(e)


def same(module: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call both twins of ``module.name``; return the Python twin's result when they agree."""
    py, c = _pair(module, name)
    a, b = _outcome(py, *args, **kwargs), _outcome(c, *args, **kwargs)
    if a != b:
        raise Disagreement(f"{module}.{name}{_show(args)}: python {a!r:.300} != compiled {b!r:.300}")
    return a[1]


def _show(args: tuple[Any, ...]) -> str:
    return "(" + ", ".join(f"{a!r:.120}" for a in args) + ")"


SEED_RECORDS: list[bytes] = [
    records.encode_record(r)
    for r in (
        records.MessageRecord(
            "TopicTest", 3, b"hello body" * 10,
            properties.encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "7F0000010001" + "0" * 20,
                                          "WAIT": "true"}),
            queue_offset=12, physical_offset=4096, store_timestamp=1_700_000_000_000, born_timestamp=1_699_000_000_000,
        ),
        records.MessageRecord(
            "SCHEDULE_TOPIC_XXXX", 2, b"x", properties.encode_properties({"DELAY": "3", "TAGS": "\u6807\u7b7e"}),
            born_host=("::1", 9876), sys_flag=records.TRANSACTION_COMMIT_TYPE,
        ),
        records.MessageRecord("T" * 130, 0, b"", b"", store_host=("fe80::1", 10911)),  # V2, two IPv6 hosts
        records.MessageRecord("half", 1, b"prepared", b"TAGS\x01a\x02", sys_flag=records.TRANSACTION_PREPARED_TYPE),
        # a body long enough for the compiled twins' fast CRC (store/format/_crc.pxd)
        records.MessageRecord("TopicTest", 0, bytes(range(256)) * 4, b"TAGS\x01k\x02", born_timestamp=7),
    )
]  # fmt: skip


def _overlay(seed: bytes, data: bytes) -> bytearray:
    """``seed`` with the fuzzer's bytes written over it: pairs of (position, value), the rest appended."""
    buf = bytearray(seed)
    pairs = len(data) // 3
    for i in range(min(pairs, 8)):
        at = int.from_bytes(data[3 * i : 3 * i + 2], "big") % (len(buf) + 1)
        if at == len(buf):
            buf.append(data[3 * i + 2])
        else:
            buf[at] = data[3 * i + 2]
    cut = data[0] % 8 if data else 0
    if cut == 7 and len(buf) > 1:  # sometimes truncate the record
        del buf[int.from_bytes(data[-2:], "big") % len(buf) :]
    return buf


def check_record(data: bytes) -> None:
    """``records.check_record`` over raw bytes and over mutated valid records, with and without the walk's size."""
    if not data:
        return
    mode = data[0]
    body = data[1:]
    buf = bytes(body) if mode % 3 == 0 else bytes(_overlay(SEED_RECORDS[mode % len(SEED_RECORDS)], body))
    pos = 0
    if mode & 0x40 and len(body) > 1:  # the record after some bytes, or a position past the end
        buf = body[: body[0] % 16] + buf
        pos = body[0] % 16 if not mode & 0x80 else body[0] % 64 - 8
    size = None
    if mode & 0x20 and len(buf) >= pos + 4 >= 4:
        size = struct.unpack_from(">i", buf, pos)[0]
        if mode & 0x08 and len(body) > 2:  # a size that disagrees with TOTALSIZE
            size += body[-1] - 128
    for crc in (True, False):
        same("store.format.records", "check_record", buf, pos, check_crc=crc, size=size)
        if mode & 0x10:
            same("store.format.records", "check_record", memoryview(bytearray(buf)), pos, check_crc=crc, size=size)


_INT_EDGES = (0, 1, -1, 0x7FFFFFFF, -0x80000000, 0x80000000, 1 << 63, -(1 << 63), (1 << 63) - 1, 1 << 70)


def _int_from(b: int, data: bytes, at: int) -> int:
    if b & 0x80:
        return _INT_EDGES[b % len(_INT_EDGES)]
    return int.from_bytes(data[at : at + 8], "big", signed=True)


def _record_from(data: bytes) -> records.MessageRecord | None:
    """A record built from the bytes: topics, bodies, properties, hosts, magic, ints (None under 4 bytes)."""
    if len(data) < 4:
        return None
    flags, split1, split2, knob = data[0], data[1], data[2], data[3]
    rest = data[4:]
    topic_b, body, props = rest[: split1 % 40], rest[split1 % 40 : split1 % 40 + split2], rest[split1 % 40 + split2 :]
    if flags & 0x01:
        topic_b = topic_b * (1 + knob % 8)  # past 127 bytes: V2
    if flags & 0x40:
        body = body * (2 + knob % 7)  # past 256 bytes: the compiled twins' fast CRC (store/format/_crc.pxd)
    topic = topic_b.decode("utf-8", "replace")
    hosts = ["127.0.0.1", "10.0.0.2", "::1", "2001:db8::7"]
    magic = (None, records.MESSAGE_MAGIC_V1, records.MESSAGE_MAGIC_V2, 12345)[(flags >> 1) % 4]
    ints = [_int_from(knob if (flags & 0x08 and i == knob % 12) else 0, rest, i) for i in range(12)]
    return records.MessageRecord(
        topic, ints[0] % 64 if not flags & 0x08 else ints[0], bytes(body),
        bytes(props) if not flags & 0x10 else bytes(props) * 2000,
        flag=ints[1], sys_flag=ints[2] & 0xFFF if not flags & 0x08 else ints[2],
        born_timestamp=ints[3], born_host=(hosts[knob % 4], ints[4] & 0xFFFF), store_timestamp=ints[5],
        store_host=(hosts[(knob >> 2) % 4], ints[6] & 0xFFFF), reconsume_times=ints[7] & 0xFF,
        prepared_transaction_offset=ints[8], queue_offset=ints[9], physical_offset=ints[10],
        body_crc=None if not flags & 0x20 else ints[11], magic=magic,
    )  # fmt: skip


def encode_record(data: bytes) -> None:
    """``records.encode_record`` of records built from the bytes (:func:`_record_from`)."""
    rec = _record_from(data)
    if rec is not None:
        same("store.format.records", "encode_record", rec)


def put_record(data: bytes) -> None:
    """``records.put_record`` of the records :func:`encode_record` builds, into a buffer at positions and limits
    in and out of it, with back-filled values at the edges: the same result (a size, or minus it when the record
    does not fit) and the same bytes afterwards, or the same error with the buffer untouched alike."""
    if len(data) < 8:
        return
    knob, room = data[4], data[5]
    rec = _record_from(data[:4] + data[8:])
    assert rec is not None
    if not data[6] & 1:  # most records in range, so that most puts get as far as the buffer
        i31, i63 = 0x7FFFFFFF, (1 << 63) - 1
        rec = dataclasses.replace(
            rec, queue_id=rec.queue_id & i31, flag=rec.flag & i31, sys_flag=rec.sys_flag & 0xFFF,
            born_timestamp=rec.born_timestamp & i63, store_timestamp=rec.store_timestamp & i63,
            prepared_transaction_offset=rec.prepared_transaction_offset & i63, queue_offset=rec.queue_offset & i63,
            physical_offset=rec.physical_offset & i63, body_crc=None if rec.body_crc is None else rec.body_crc & i31,
            properties=rec.properties[:40000],
        )  # fmt: skip
    size = 256 + room * 8
    pos = (knob % 64) - 4 if knob & 0x40 else knob % 64
    limit = size - (data[6] % 128) if not knob & 0x80 else size + data[6] % 4
    values = [_int_from(data[7] if i == data[7] % 3 else 0, data[8:], i * 8) for i in range(3)]
    if not data[7] & 0x40:
        values = [v & ((1 << 63) - 1) for v in values]
    a, b = bytearray(size), bytearray(size)
    py, c = _pair("store.format.records", "put_record")
    ra, rb = _outcome(py, a, pos, limit, rec, *values), _outcome(c, b, pos, limit, rec, *values)
    if ra != rb or a != b:
        raise Disagreement(f"put_record(pos={pos}, limit={limit}, {values}, {rec!r:.200}): python {ra} != {rb}")


_CLUSTERS = ("DefaultCluster", "", "TIMER_C", "c\x02DELAY\x01", "\ud800", "集群")


def _in_range(rec: records.MessageRecord, data: bytes) -> records.MessageRecord:
    """``rec`` with its send fields in their ranges (mostly not a half message) and short properties: an input
    the encoder may take rather than one it declines."""
    i31, i63 = 0x7FFFFFFF, (1 << 63) - 1
    return dataclasses.replace(
        rec, queue_id=rec.queue_id & i31, flag=rec.flag & i31,
        sys_flag=rec.sys_flag & (0xFFF if data[5] & 0x40 else 0xFF3), born_timestamp=rec.born_timestamp & i63,
        properties=rec.properties[:400],
    )  # fmt: skip


def _send_once(kind: str, data: bytes, rec: records.MessageRecord) -> tuple[Any, ...]:
    """One twin's ``prepare_send`` of ``rec``'s fields, then, when it takes them, its ``put_prepared`` into a
    buffer at a position and limit ``data`` picks, with offsets and a store time in their ranges (as
    ``CommitLog.put`` gives them): (declined, the put's outcome, the buffer)."""
    twins = native.TWINS[appender.__name__]
    fns = twins.python if kind == "python" else twins.compiled
    hosts = [("127.0.0.1", 10911), ("::1", 10911), ("10.1.2.3", 0)]
    max_body = 64 + data[6] * 8 if data[6] & 0x40 else 4 << 20
    ok, item = _outcome(fns["prepare_send"], rec.topic, rec.queue_id, rec.body, rec.properties, rec.flag,
                        rec.sys_flag, rec.born_timestamp, rec.born_host, rec.reconsume_times,
                        _CLUSTERS[data[4] % len(_CLUSTERS)], hosts[(data[7] >> 6) % 3], max_body)  # fmt: skip
    if not ok or item is None:
        return ok, item, None, b""
    room = data[5]
    size = 512 + room * 16
    pos = (data[4] % 64) - 4 if data[4] & 0x40 else data[4] % 64
    limit = size - (data[6] % 128) if not data[4] & 0x20 else size + data[6] % 4
    values = [_int_from(data[7] if i == data[7] % 3 else 0, data[8:], i * 8) & ((1 << 63) - 1) for i in range(3)]
    buf = bytearray(size)
    return True, True, _outcome(fns["put_prepared"], buf, pos, limit, item, *values), bytes(buf)


def append_send(data: bytes) -> None:
    """``appender.prepare_send`` of the fields of the records :func:`put_record` builds (properties with a
    CLUSTER of their own or an empty one, some with a delay or timer, a half message's flag; cluster names that
    hold a marker, a surrogate or none at all; arguments of other types), then ``put_prepared`` of what it takes
    into a buffer with more or less room: the same decline or error, the same size (or minus it when it does not
    fit) and the same bytes."""
    if len(data) < 8:
        return
    rec = _record_from(data[:4] + data[8:])
    assert rec is not None
    if not data[6] & 1:
        rec = _in_range(rec, data)
    if data[5] & 0x80:
        rec.properties += (b"DELAY\x013\x02", b"TIMER_DELAY_SEC\x015\x02", b"XDELA\x01", b"CLUSTER\x01own\x02",
                           b"CLUSTER\x01\x02", b"\x02CLUSTER\x01x")[data[5] % 6]  # fmt: skip
    if data[7] & 0x08 and data[4] & 0x80:  # other types, declined alike
        rec = dataclasses.replace(rec, **(
            {"born_host": list(rec.born_host)}, {"body": bytearray(rec.body)}, {"queue_id": str(rec.queue_id)},
            {"born_host": ("localhost", 1)},
        )[data[4] % 4])  # fmt: skip
    python, compiled = _send_once("python", data, rec), _send_once("compiled", data, rec)
    if python[0] != compiled[0] or (python[1] is None) != (compiled[1] is None) or python[2:] != compiled[2:]:
        raise Disagreement(f"appender send of {rec!r:.200}: the twins differ: {python[:3]!r:.300} != "
                           f"{compiled[:3]!r:.300}")  # fmt: skip


def patch_record(data: bytes) -> None:
    """``records.patch_record`` into a copy of a seed record (or raw bytes): same bytes afterwards, or same error."""
    if len(data) < 3:
        return
    seed = SEED_RECORDS[data[0] % len(SEED_RECORDS)] if data[0] & 0x80 == 0 else bytes(data[3:])
    pos = (data[1] % 96) - 8 if data[0] & 0x40 else 0
    values = [_int_from(data[2] if i == data[2] % 3 else 0, data[3:], i * 8) for i in range(3)]
    a, b = bytearray(seed), bytearray(seed)
    py, c = _pair("store.format.records", "patch_record")
    ra, rb = _outcome(py, a, pos, *values), _outcome(c, b, pos, *values)
    if ra != rb or a != b:
        raise Disagreement(f"patch_record(pos={pos}, {values}): python {ra} {a.hex()} != compiled {rb} {b.hex()}")


def hashes(data: bytes) -> None:
    """Java ``String.hashCode`` and the IndexFile key hash of strings from the bytes: UTF-8, Latin-1, UTF-16
    (lone surrogates included), and index keys with a long shared prefix."""
    texts = [
        data.decode("utf-8", "replace"),
        data.decode("latin-1"),
        data[: len(data) // 2 * 2].decode("utf-16-be", "surrogatepass") if len(data) > 1 else "",
        "TopicTest#7F00000100002A9F0000" + data.decode("utf-8", "replace"),
    ]
    for text in texts:
        same("store.format.hashing", "java_string_hash", text)
        same("store.format.hashing", "index_key_hash", text)


def decode_properties(data: bytes) -> None:
    """``properties.decode_properties`` of the bytes (0x01 / 0x02 made common), as bytes and as a string."""
    raw = bytes(b if b > 3 else (1 if b % 2 else 2) for b in data) if data and data[0] & 1 else data
    same("store.format.properties", "decode_properties", raw)
    same("store.format.properties", "decode_properties", raw.decode("utf-8", "replace"))
    same("store.format.properties", "decode_properties", memoryview(raw))


def put_index_entry(data: bytes) -> None:
    """``units.put_index_entry`` into a small IndexFile image (slots possibly stale): same bytes and answer, or
    same error, for in-range and out-of-range entries, hashes and offsets."""
    if len(data) < 4:
        return
    slots = 1 + data[0] % 8
    entries = 1 + data[1] % 8
    image = bytes(_overlay(bytes(units.index_file_size(slots, entries)), data[4:]))
    values = [_int_from(data[3] if i == data[3] % 3 else 0, data[4:], i * 8) for i in range(3)]
    key_hash, phy, tdiff = values[0] & 0x7FFFFFFF if not data[2] & 0x80 else values[0], values[1], values[2] & 0xFFFF
    entry_no = data[2] % 12 - 1
    a, b = bytearray(image), bytearray(image)
    py, c = _pair("store.format.units", "put_index_entry")
    ra = _outcome(py, a, slots, entry_no, key_hash, phy, tdiff)
    rb = _outcome(c, b, slots, entry_no, key_hash, phy, tdiff)
    if ra != rb or a != b:
        raise Disagreement(f"put_index_entry({slots}, {entry_no}, {values}): python {ra} != compiled {rb}")


_SEND_EXT = {
    "a": "producer", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1700000000000", "h": "0",
    "i": "TAGS\x01TagA\x02KEYS\x01ORDER-1\x02UNIQ_KEY\x01" + "A" * 32 + "\x02", "j": "0", "k": "false",
    "m": "false", "n": "broker-a",
}  # fmt: skip


def _frame(cmd: RemotingCommand) -> bytes:
    return cmd.encode()[4:]  # decode_frame takes a frame without its length prefix


# Numbers as strings and strings as numbers, escaped surrogates (a pair and a lone one), a digit for a language.
_LENIENT_HEADER = (
    b'{"code":10,"extFields":{"n":12,"s":"\\ud83d\\ude00\\ud800x"},"language":"3","remark":null,"extra":true}'
)
SEED_FRAMES: list[bytes] = [
    _frame(RemotingCommand(RequestCode.SEND_MESSAGE_V2, "JAVA", 409, 7, 0, None, dict(_SEND_EXT), b"x" * 64)),
    _frame(RemotingCommand(0, "JAVA", 409, 7, 1, None, {"msgId": "7F00000100002A9F0000000000000000", "queueId": "3",
                                                        "queueOffset": "12", "MSG_REGION": "DefaultRegion"})),
    _frame(RemotingCommand(1, "PYTHON", 1, -5, 1, "b\u00e4d \"quoted\"\n\t\u6807\U0001F600", {"k\u00e9y": "v\\al"})),
    _frame(RemotingCommand(RequestCode.SEND_MESSAGE_V2, "CPP", 1, 9, 2, None, dict(_SEND_EXT), b"b",
                           SerializeType.ROCKETMQ)),
    _LENIENT_HEADER.__len__().to_bytes(4, "big") + _LENIENT_HEADER,
]  # fmt: skip


def decode_frame(data: bytes) -> None:
    """``command.decode_frame`` (RemotingCommand.decode) of raw bytes and of mutated real frames: JSON headers as
    the Java client writes them, escapes and surrogates, the ROCKETMQ binary header, lenient shapes."""
    if not data:
        return
    mode = data[0]
    seed = SEED_FRAMES[mode % len(SEED_FRAMES)]
    frame = bytes(data[1:]) if mode % 4 == 0 else bytes(_overlay(seed, data[1:]))
    same("broker.remoting.command", "decode_frame", frame)
    if mode & 0x80:
        same("broker.remoting.command", "decode_frame", memoryview(frame))


def json_header(data: bytes) -> None:
    """``command.json_header`` of commands whose strings come from the bytes (ASCII, escapes, non-ASCII, lone
    surrogates) and whose numbers are edge values or not numbers at all."""
    if len(data) < 2:
        return
    knob = data[0]
    texts = data[2:].split(b"\x00")
    decode = ("ascii", "utf-8", "utf-16-be", "latin-1")[knob % 4]

    def text(i: int) -> str:
        raw = texts[i % len(texts)]
        return raw[: len(raw) // 2 * 2].decode(decode, "surrogatepass" if decode == "utf-16-be" else "replace")

    ext: dict = {text(i): text(i + 1) for i in range(0, min(len(texts), 12), 2)}
    if knob & 0x10:
        ext[text(0) + "n"] = data[1]  # a non-string value: _ext_value's conversion
    numbers = (0, -1, RequestCode.SEND_MESSAGE_V2, 1 << 40, "12", 3.7, None)
    cmd = RemotingCommand(
        code=numbers[data[1] % len(numbers)] if knob & 0x20 else data[1], language=text(1) if knob & 0x40 else "JAVA",
        version=409, opaque=int.from_bytes(data[:2], "big", signed=True), flag=knob & 3,
        remark=text(2) if knob & 0x80 else None, ext_fields=ext,
    )  # fmt: skip
    same("broker.remoting.command", "json_header", cmd)


_HOSTS = ("127.0.0.1", "10.0.0.2", "::1", "2001:db8::7", "not-an-ip")
_PROPS = (
    b"TAGS\x01TagA\x02KEYS\x01ORDER-1\x02UNIQ_KEY\x01" + b"A" * 32 + b"\x02",
    b"CLUSTER\x01mine\x02",
    b"CLUSTER\x01\x02TAGS\x01x\x02",  # an empty CLUSTER counts as absent
    b"",
    b"TAGS\x01no separator at the end",
)
SEED_BATCHES: list[bytes] = [
    batch_body.encode_batch_body([batch_body.BatchItem(i, b"b%d" % i * (1 + 7 * i), _PROPS[i % len(_PROPS)])
                                  for i in range(n)])
    for n in (1, 3, 6)
] + [  # bodies long enough for the compiled twins' fast CRC (store/format/_crc.pxd)
    batch_body.encode_batch_body([batch_body.BatchItem(0, bytes(range(256)) * 4, _PROPS[0]),
                                  batch_body.BatchItem(1, b"x" * 256, _PROPS[1])])
]  # fmt: skip


def _send_args(data: bytes) -> tuple:
    """(topic, queueId, sysFlag, bornTimestamp, bornHost, storeHost, reconsumeTimes, cluster) from the bytes."""
    knob = data[0]
    topic = ("TopicTest", "T" * 130, "t\u00e9", "%RETRY%g", "\ud800")[knob % 5] if knob & 0x80 else "TopicTest"
    ints = [_int_from(data[1] if i == data[1] % 4 else 0, data[2:], i * 8) for i in range(4)]
    born = (_HOSTS[knob % 5] if knob & 0x40 else "127.0.0.1", ints[1] & 0xFFFF if not knob & 0x20 else ints[1])
    store = (_HOSTS[(knob >> 3) % 4], 10911)
    cluster = ("DefaultCluster", "cl\u00e4", "\udc00")[knob % 3] if knob & 0x10 else "DefaultCluster"
    return topic, ints[0] % 64 if not knob & 0x08 else ints[0], ints[2] & 0xFFF, ints[3], born, store, \
        data[1] % 3, cluster


def encode_message(data: bytes) -> None:
    """``runs.encode_message``: a send's record from fields of the bytes, properties with or without CLUSTER."""
    if len(data) < 4:
        return
    topic, queue_id, sys_flag, born_ts, born, store, reconsume, cluster = _send_args(data)
    props = _PROPS[data[2] % len(_PROPS)] if data[3] & 1 else bytes(data[4:40])
    if data[3] & 2:
        props = props * 2000  # past the properties length a record can hold
    same("store.format.runs", "encode_message", topic, queue_id, bytes(data[40:]), props, data[3] - 128, sys_flag,
         born_ts, born, store, reconsume, cluster)  # fmt: skip


def encode_batch(data: bytes) -> None:
    """``runs.encode_batch`` of raw bytes and of mutated real batch bodies, with item size limits."""
    if len(data) < 4:
        return
    mode = data[0]
    seed = SEED_BATCHES[mode % len(SEED_BATCHES)]
    body = bytes(data[4:]) if mode % 5 == 0 else bytes(_overlay(seed, data[4:]))
    topic, queue_id, sys_flag, born_ts, born, store, reconsume, cluster = _send_args(data)
    max_body = (4 * 1024 * 1024, 10, 0, -1)[data[3] % 4]
    same("store.format.runs", "encode_batch", body, topic, queue_id, sys_flag, born_ts, born, store, reconsume,
         cluster, max_body)  # fmt: skip


def _seed_run(data: bytes) -> tuple[bytes, int]:
    """A run of 1-3 seed records, its bytes overlaid by the input's tail and its count off by one when the
    input's flags say so."""
    n = 1 + data[0] % 3
    run = b"".join(SEED_RECORDS[(data[0] + i) % len(SEED_RECORDS)] for i in range(n))
    if data[1] & 0x80:
        run = bytes(_overlay(run, data[4:]))
    if data[1] & 0x40:
        n += data[2] % 3 - 1
    return run, n


def write_run(data: bytes) -> None:
    """``runs.write_run`` of real runs (or mutated ones, or wrong counts) into a buffer, at positions in and out of
    it: the same bytes afterwards, or the same error and the buffer untouched alike."""
    if len(data) < 4:
        return
    run, count = _seed_run(data)
    pos = data[2] * 3 - 16 if data[1] & 0x20 else data[2]
    values = [_int_from(data[3] if i == data[3] % 3 else 0, data[4:], i * 8) for i in range(3)]
    size = len(run) + 256 - (data[3] % 64 if data[1] & 0x10 else 0)
    a, b = bytearray(size), bytearray(size)
    advances = bool(data[1] & 1)
    py, c = _pair("store.format.runs", "write_run")
    ra = _outcome(py, a, pos, run, count, values[0], values[1], values[2], advances)
    rb = _outcome(c, b, pos, run, count, values[0], values[1], values[2], advances)
    if ra != rb or a != b:
        raise Disagreement(f"write_run(pos={pos}, count={count}, {values}): python {ra} != compiled {rb}")


def offset_msg_ids(data: bytes) -> None:
    """``runs.offset_msg_ids`` of real or mutated runs, offsets at the edges, IPv4 and IPv6 store hosts."""
    if len(data) < 4:
        return
    run, count = _seed_run(data)
    offset = _int_from(data[3], data[4:], 0)
    same("store.format.runs", "offset_msg_ids", (_HOSTS[data[1] % 4], 10911), offset, run, count)


def _edited_header(base: dict[str, str], keys: list[str], data: bytes, edits: int,
                   keep_some: bool = False) -> dict[str, str]:
    """``base`` with up to ``edits`` fields of ``keys`` replaced or dropped by the NUL-separated texts after
    ``data[0]``: a text's first byte picks the key and drops it (a multiple of 5) or, with ``keep_some``, leaves it
    as it was (a multiple of 7); the rest of the text is the new value, decoded with surrogate escapes when
    ``data[0]`` is odd."""
    ext = dict(base)
    for i, raw in enumerate(data[1:].split(b"\x00")[:edits]):
        key = keys[(data[0] + 3 * i + (raw[0] if raw else 0)) % len(keys)]
        if raw and raw[0] % 5 == 0:
            ext.pop(key, None)
        elif not (keep_some and raw and raw[0] % 7 == 0):
            ext[key] = raw[1:].decode("utf-8", "surrogateescape" if data[0] & 1 else "replace")
    return ext


_SEND_KEYS = [*"abcdefghijklmn", "topic"]


def read_send_v2(data: bytes) -> None:
    """``send_codec.read_send_v2`` of the Java client's header with fields replaced or dropped by the bytes."""
    if len(data) < 2:
        return
    same("broker.remoting.send_codec", "read_send_v2", _edited_header(_SEND_EXT, _SEND_KEYS, data, 6))


_HALF_EXT = {**_SEND_EXT, "f": "4", "i": _SEND_EXT["i"] + "TRAN_MSG\x01true\x02PGROUP\x01producer\x02"}
_TRAN_VALUES = ("true", "false", "", "TRUE", "true\x02DELAY\x013", "tru")


def read_send_v2_half(data: bytes) -> None:
    """``send_codec.read_send_v2`` of the Java client's half message header with fields replaced or dropped by the
    bytes, and TRAN_MSG values that are not quite ``true``."""
    if len(data) < 2:
        return
    base = _HALF_EXT
    if data[0] & 2:
        base = {**_HALF_EXT, "i": _HALF_EXT["i"] + f"TRAN_MSG\x01{_TRAN_VALUES[data[1] % len(_TRAN_VALUES)]}\x02"}
    same("broker.remoting.send_codec", "read_send_v2", _edited_header(base, _SEND_KEYS, data, 6, keep_some=True))


_END_EXT = {"producerGroup": "pg", "tranStateTableOffset": "7", "commitLogOffset": "4096", "commitOrRollback": "8",
            "fromTransactionCheck": "false", "msgId": "AC11000100002A9F0000000000000001"}  # fmt: skip


def read_end_transaction(data: bytes) -> None:
    """``tx_codec.read_end_transaction`` of the producer's header with fields replaced or dropped by the bytes."""
    if len(data) < 2:
        return
    ext = _edited_header(_END_EXT, [*_END_EXT, "transactionId"], data, 4)
    same("broker.remoting.tx_codec", "read_end_transaction", ext)


def send_reply(data: bytes) -> None:
    """``send_codec.send_reply`` with strings that need escaping or not and numbers at the edges."""
    if len(data) < 3:
        return
    texts = data[3:].split(b"\x00")

    def text(i: int) -> str:
        raw = texts[i % len(texts)]
        return raw.decode("utf-8", "surrogateescape" if data[0] & 1 else "replace")

    tx = None if data[0] & 2 else text(2)
    same("broker.remoting.send_codec", "send_reply", int.from_bytes(data[:2], "big", signed=True), data[2] % 3,
         text(0) if data[0] & 4 else "7F00000100002A9F" + data[3:11].hex().upper()[:16], _int_from(data[1], data, 2),
         _int_from(data[2], data, 5), tx, text(1) if data[0] & 8 else "DefaultRegion", bool(data[0] & 16))  # fmt: skip


def encode_half(data: bytes) -> None:
    """``transaction.encode_half``: a prepared send's half record, properties with or without CLUSTER and
    UNIQ_KEY (empty, repeated, without a trailing separator), clusters and topics that need escaping or cannot
    be encoded."""
    if len(data) < 4:
        return
    topic, queue_id, sys_flag, born_ts, born, store, reconsume, cluster = _send_args(data)
    if data[0] & 4:
        cluster = ("cl\x02UNIQ_KEY\x01x", "", "c\x01")[data[1] % 3]
    props = _PROPS[data[2] % len(_PROPS)] if data[3] & 1 else bytes(data[4:40])
    if data[3] & 4:
        props += (b"UNIQ_KEY\x01\x02", b"UNIQ_KEY\x01\xff\xfeU\x02", b"UNIQ_KEY\x01late")[data[2] % 3]
    if data[3] & 2:
        props = props * 2000  # past the properties length a record can hold
    same("store.format.transaction", "encode_half", topic, queue_id, bytes(data[40:]), props, data[3] - 128,
         sys_flag | records.TRANSACTION_PREPARED_TYPE, born_ts, born, store, reconsume, cluster)  # fmt: skip


SEED_HALVES: list[bytes] = [
    transaction.encode_half("Orders", 3, b"half body" * 9, _PROPS[0], 1, 0x6, 1_700_000_000_000, ("10.0.0.1", 4),
                            ("127.0.0.1", 10911), 0, "DefaultCluster")[0],
    transaction.encode_half("T" * 130, 0, b"", b"", 0, 0x4, 5, ("::1", 1), ("2001:db8::7", 10911), 2, "c")[0],
]  # fmt: skip


def commit_record(data: bytes) -> None:
    """``transaction.commit_record`` of real half records (or mutated ones, or other records) re-addressed to
    topics of either record format, queue ids and offsets at the edges."""
    if len(data) < 4:
        return
    seeds = SEED_HALVES + SEED_RECORDS
    half = seeds[data[0] % len(seeds)]
    if data[1] & 0x80:
        half = bytes(_overlay(half, data[4:]))
    topic = ("Orders", "L" * 200, "t\u00e9", "\ud800", "X" * 0x8000)[data[1] % 5]
    queue_id = _int_from(data[2], data[4:], 0) if data[1] & 0x40 else data[2] % 8
    offset = _int_from(data[3], data[4:], 8)
    same("store.format.transaction", "commit_record", half, topic, queue_id, offset)


# =====================================================================================================
# The dispatch loop: a whole CommitLog segment into ConsumeQueue and IndexFile files, by both twins
# =====================================================================================================

DISPATCH_SEGMENT = 8192
DISPATCH_TOPICS = ("TopicA", "TopicB", "T\u00f6pic", delay.SCHEDULE_TOPIC, "V2" * 70, "rmq_sys_wheel_timer")
DISPATCH_KEYS = ("k1", "k1 k2", " k1  k3 ", "\u00e9t\u00e9", "polygenelubricants", "a b c d e f g")
_SYS_FLAGS = (0, 0, 0, records.TRANSACTION_PREPARED_TYPE, records.TRANSACTION_COMMIT_TYPE,
              records.TRANSACTION_ROLLBACK_TYPE, records.MULTI_TAGS_FLAG)  # fmt: skip


def dispatch_segment_from(data: bytes) -> bytes:
    """A CommitLog segment of up to 24 records chosen by ``data`` (topics, queues, tags, keys, transaction states,
    V2 and IPv6 records; queue and physical offsets as an append gives them), then ``data`` written over it."""
    n = 1 + (data[0] % 24 if data else 0)
    next_offset: dict[tuple[str, int], int] = {}
    out = bytearray()
    for i in range(n):
        b = data[1 + i] if 1 + i < len(data) else i * 37 % 256
        topic = DISPATCH_TOPICS[b % len(DISPATCH_TOPICS)] if b % 11 else DISPATCH_TOPICS[0]
        qid = (b >> 3) % 3
        props: dict[str, str] = {}
        if b & 0x20:
            props["TAGS"] = ("TagA", "TagB", "\u6807\u7b7e", "")[b % 4]
        if b & 0x40:
            props["KEYS"] = DISPATCH_KEYS[(b >> 2) % len(DISPATCH_KEYS)]
        if b & 0x80 or b % 5 == 0:
            props["UNIQ_KEY"] = f"7F0000010001{i:020X}" if b % 7 else "uniq \u00fc"
        if topic == delay.SCHEDULE_TOPIC and b & 1:
            props["DELAY"] = str(1 + b % 4)
        sys_flag = _SYS_FLAGS[(b >> 1) % len(_SYS_FLAGS)]
        consumable = records.is_consumable(sys_flag)
        qoff = next_offset.get((topic, qid), 0)
        if consumable:
            next_offset[(topic, qid)] = qoff + 1
        rec = records.MessageRecord(
            topic, qid, bytes([b]) * (b % 50), properties.encode_properties(props), sys_flag=sys_flag,
            born_host=("::1", 9876) if b % 13 == 0 else ("127.0.0.1", 1), queue_offset=qoff if consumable else 0,
            physical_offset=len(out), store_timestamp=1_700_000_000_000 + 1500 * i - (5000 if b % 17 == 0 else 0),
        )  # fmt: skip
        out += records.encode_record(rec)
    if data and data[0] & 0x80:  # the segment ends with a BLANK
        out += records.encode_blank(DISPATCH_SEGMENT - len(out))
    return bytes(_overlay(bytes(out), data[1 + n :]))[:DISPATCH_SEGMENT]


def _safe_topics(segment: bytes) -> bool:
    """Every topic a record names makes a ConsumeQueue directory under the harness's root (a mutated topic such
    as ``/x`` or ``..`` would not; those inputs are skipped)."""
    for pos, size in records.RecordWalk(segment):
        req = records.check_record(segment, pos, check_crc=False, size=size).request
        if req is not None and (req.topic in ("", ".", "..") or "/" in req.topic or "\x00" in req.topic):
            return False
    return True


def _dispatch_once(root: Path, segment: bytes, compiled: bool) -> tuple[Any, ...]:
    """Dispatch ``segment`` into ConsumeQueue and IndexFile files under ``root``; what it did and wrote, the
    listeners' store times last (the loop's calls tell a subset of the reference's: :func:`_arrived`)."""
    from store.commitlog import CommitLog
    from store.consume_queue import ConsumeQueueTable
    from store.dispatch import ReputService
    from store.dispatchers import BuildConsumeQueue, BuildIndex
    from store.index import IndexService

    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / units.offset_to_file_name(0)).write_bytes(segment.ljust(DISPATCH_SEGMENT, b"\0"))
    cl = CommitLog(root / "commitlog", DISPATCH_SEGMENT)
    cl.queue.load()
    cl.queue.files[0].wrote = len(segment)
    queues = ConsumeQueueTable(root / "consumequeue", UNIT_FILE)
    index = IndexService(root / "index", 8, 24)
    reput = ReputService(cl, [BuildConsumeQueue(queues), BuildIndex(index)])
    reput.use_compiled = compiled
    if compiled and reput._compiled_loop() is None:
        raise RuntimeError(f"store._dispatch is not built ({native.missing_cause}): nothing to compare")
    heard: list[tuple[Any, ...]] = []
    reput.add_arrival_listener(lambda *a: heard.append(a))
    reput.set_reput_from(0)
    try:
        outcome: tuple[Any, ...] = (True, [reput.do_reput(limit) for limit in (3, None, None)])
    except Exception as e:  # the error's type is part of the answer
        outcome = (False, type(e))
    finally:
        reput.close()
    cq_files = {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*"))
                if p.is_file()}  # fmt: skip
    index_files = [f.mm[:] for f in index.files]  # named by wall clock: compared in order, by content
    cq_state = sorted((cq.topic, cq.queue_id, cq.max_physic_offset, cq.min_logic_offset,
                       [mf.wrote for mf in cq.queue.files]) for cq in queues.all())  # fmt: skip
    stats = [(b, s.count, s.first_store_time, s.last_store_time) for b, s in reput.sealed_stats.items()]
    if reput._current is not None:
        c = reput._current[1]
        stats.append((-1, c.count, c.first_store_time, c.last_store_time))
    told, newest = _arrived(heard)
    result = (outcome, reput.reput_from, told, cq_files, index_files, cq_state, stats,
              [dataclasses.astuple(f.header) for f in index.files], newest)  # fmt: skip
    for cq in queues.all():
        cq.close()
    index.close()
    cl.close()
    return result


UNIT_FILE = 20 * 6  # six units per ConsumeQueue file: runs cross file ends


def _arrived(heard: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """The listener calls as (every record told of, in queue order: topic, queue id, its next offset, its tags
    code; and the (topic, queue id, next offset, store time) of each call's newest record).  The reference calls
    once per record, the loop once per queue and run: both must tell of the same records, and a call's store
    time must be its newest record's."""
    told, newest = [], set()
    for topic, queue_id, nxt, codes, ts in heard:
        told.extend((topic, queue_id, nxt - len(codes) + 1 + i, code) for i, code in enumerate(codes))
        newest.add((topic, queue_id, nxt, ts))
    return sorted(told), newest


def dispatch(data: bytes) -> None:
    """The dispatch loop over a segment built from ``data``: both twins write the same ConsumeQueue and IndexFile
    bytes, tell the listeners the same, stop at the same place."""
    segment = dispatch_segment_from(data)
    if not _safe_topics(segment):
        return
    tmp = Path(tempfile.mkdtemp(prefix="mqlake-dispatch-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    quiet = [logging.getLogger(name) for name in ("store.dispatch", "store.consume_queue")]
    was = [q.disabled for q in quiet]
    for q in quiet:
        q.disabled = True  # both twins log every damaged record and queue gap they meet
    try:
        python = _dispatch_once(tmp / "python", segment, compiled=False)
        compiled = _dispatch_once(tmp / "compiled", segment, compiled=True)
    finally:
        for q, w in zip(quiet, was, strict=True):
            q.disabled = w
        shutil.rmtree(tmp, ignore_errors=True)
    if python[:-1] != compiled[:-1] or not compiled[-1] <= python[-1]:
        names = ("outcome", "reput_from", "listener calls", "ConsumeQueue files", "IndexFiles", "queue state",
                 "segment stats", "index headers", "listener calls' store times")  # fmt: skip
        diff = [n for n, a, b in zip(names, python, compiled, strict=True) if a != b]
        raise Disagreement(f"dispatch of {segment!r:.200}: the twins differ in {', '.join(diff)}")


# Inputs per target in `make test`'s smoke (tests/test_twins.py) where 3,000 would take long: each dispatch input
# writes a small store twice.
SMOKE_RUNS = {"dispatch": 300}
# `make fuzz`'s count where a million inputs would take hours: each dispatch input builds and dispatches a whole
# segment (30-50 inputs a second here).
FUZZ_RUNS = {"dispatch": 50_000}

TARGETS: dict[str, Callable[[bytes], None]] = {
    "encode_message": encode_message,
    "encode_batch": encode_batch,
    "write_run": write_run,
    "offset_msg_ids": offset_msg_ids,
    "read_send_v2": read_send_v2,
    "read_send_v2_half": read_send_v2_half,
    "read_end_transaction": read_end_transaction,
    "encode_half": encode_half,
    "commit_record": commit_record,
    "send_reply": send_reply,
    "decode_frame": decode_frame,
    "json_header": json_header,
    "check_record": check_record,
    "encode_record": encode_record,
    "put_record": put_record,
    "append_send": append_send,
    "patch_record": patch_record,
    "hashes": hashes,
    "decode_properties": decode_properties,
    "put_index_entry": put_index_entry,
    "dispatch": dispatch,
}
