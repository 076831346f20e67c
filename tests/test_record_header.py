"""One record-header reader for both compiled log scanners (``store/format/_record_header.pxd``): the store's
dispatch loop (``store/_dispatch.pyx``) and verify-index's scan (``pipelines/index_rebuild/_scan.pyx``) take or
leave each record as the pure-Python codec (``records.check_record``, ``records.decode_record``) does, and read
the same fields from it: IPv4 and IPv6 born and store hosts, batch flags, V2 topics, BLANK and zeros, records cut
short and lengths that do not add up."""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from store.format import hashing, native, records, units

pytestmark = pytest.mark.unit

BASE = 1 << 30  # the segment's first CommitLog offset
TOPIC = "Orders"
LONG_TOPIC = "V" * 140  # over 127 bytes: a MAGIC_V2 record
UNIT = 20  # a ConsumeQueue unit


def _compiled(extension: str) -> Any:
    """The compiled scanner, loaded even when MQLAKE_NO_EXTENSIONS keeps the codecs on their references (as the
    dispatch twin tests do); a missing build fails unless that switch is set."""
    module, why = native.load_extension(extension)
    if module is None:
        if native.disabled():
            pytest.skip(f"{native.ENV_DISABLE} is set and {extension} is not built")
        pytest.fail(f"{why}; run `make install`")
    return module


def _record(pos: int, queue_offset: int, **fields: Any) -> bytes:
    """A record as the store writes it at ``pos`` of the segment."""
    values: dict[str, Any] = {
        "topic": TOPIC, "queue_id": 3, "body": b"body of %d" % pos, "flag": 7,
        "born_timestamp": 1_700_000_000_000 + pos, "born_host": ("10.0.0.1", 4001),
        "store_timestamp": 1_700_000_000_500 + pos, "store_host": ("10.0.0.2", 10911), "reconsume_times": 2,
        "properties": b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01AC1E0001\x02",
        **fields,
    }  # fmt: skip
    return records.encode_record(records.MessageRecord(queue_offset=queue_offset, physical_offset=BASE + pos, **values))


# Each shape the header reader tells apart; the hosts' sysFlag bits come from the hosts (encode_record sets them).
SHAPES: dict[str, dict[str, Any]] = {
    "ipv4": {},
    "born ipv6": {"born_host": ("2001:db8::1", 4001)},
    "store ipv6": {"store_host": ("2001:db8::2", 10911)},
    "both ipv6": {"born_host": ("::1", 1), "store_host": ("fe80::2", 2)},
    "inner batch flag": {"sys_flag": records.INNER_BATCH_FLAG | records.NEED_UNWRAP_FLAG | records.MULTI_TAGS_FLAG},
    "committed": {"sys_flag": records.TRANSACTION_COMMIT_TYPE, "prepared_transaction_offset": 12345},
    "empty body and properties": {"body": b"", "properties": b""},
    "v2 topic": {"topic": LONG_TOPIC, "queue_id": 0},
}


def _log(shapes: list[str]) -> tuple[bytes, list[int]]:
    """The records of ``shapes`` one after the other (queue offsets counted per queue), and where each starts."""
    out, starts, next_offset = b"", [], {}
    for name in shapes:
        fields = SHAPES[name]
        queue = (fields.get("topic", TOPIC), fields.get("queue_id", 3))
        starts.append(len(out))
        out += _record(len(out), next_offset.get(queue, 0), **fields)
        next_offset[queue] = next_offset.get(queue, 0) + 1
    return out, starts


def _reference(log: bytes, starts: list[int]) -> list[records.DispatchRequest]:
    """The pure-Python codec's reading of every record; each also decodes whole, with the fields it was given."""
    out = []
    for pos in starts:
        res = records.check_record(log, pos)
        assert res.ok and res.request is not None, res.reason
        rec = records.decode_record(log, pos)
        req = res.request
        assert (rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset, rec.total_size, rec.store_timestamp,
                rec.sys_flag) == (req.topic, req.queue_id, req.queue_offset, req.commitlog_offset, req.msg_size,
                                  req.store_timestamp, req.sys_flag)  # fmt: skip
        out.append(req)
    return out


def _scan(log: bytes, start: int = 0, topics: tuple[str, ...] = (TOPIC, LONG_TOPIC)) -> dict[str, Any]:
    """verify-index's compiled scan over ``log`` from ``start``: where it stopped, why, and its rows."""
    scan = _compiled("pipelines.index_rebuild._scan")
    n = 16
    cols = {k: np.zeros(n, t) for k, t in (("topic", np.int32), ("queue_id", np.int32), ("queue_offset", np.int64),
                                           ("phys", np.int64), ("size", np.int32), ("sys_flag", np.int32),
                                           ("store_ts", np.int64), ("tags_code", np.int64),
                                           ("key_count", np.int32), ("tag_key", np.uint8))}  # fmt: skip
    hashes = np.zeros(4 * n, np.int32)
    pos, rows, keys, why = scan.scan_run(
        np.frombuffer(log, np.uint8), BASE, start, len(log), -1, [t.encode() for t in topics], cols["topic"],
        cols["queue_id"], cols["queue_offset"], cols["phys"], cols["size"], cols["sys_flag"], cols["store_ts"],
        cols["tags_code"], cols["key_count"], cols["tag_key"], hashes, 0, 0,
    )  # fmt: skip
    rows_out = [
        (topics[cols["topic"][i]], int(cols["queue_id"][i]), int(cols["queue_offset"][i]), int(cols["phys"][i]),
         int(cols["size"][i]), int(cols["sys_flag"][i]), int(cols["store_ts"][i]), int(cols["tags_code"][i]))
        for i in range(rows)
    ]  # fmt: skip
    reason = {scan.DONE: "done", scan.FULL: "full", scan.REFERENCE: "reference"}[why]
    return {"pos": pos, "why": reason, "rows": rows_out, "hashes": [int(h) for h in hashes[:keys]]}


def _dispatch(log: bytes, start: int = 0) -> dict[str, Any]:
    """The store's compiled dispatch loop over ``log`` from ``start`` (no IndexFile), into a ConsumeQueue file
    (in memory) per queue: where it stopped, how many records it took, and the units it wrote."""
    loop = _compiled("store._dispatch").DispatchLoop(False)
    files = {}
    for queue in ((TOPIC, 3), (LONG_TOPIC, 0)):
        cq = SimpleNamespace(max_physic_offset=0)
        mf = SimpleNamespace(mm=bytearray(16 * UNIT), file_size=16 * UNIT, wrote=0, file_from_offset=0)
        loop.set_target(*queue, cq, mf)
        files[queue] = mf
    try:
        pos = loop.run(log, start, len(log), 1024, False)
        written = {q: [units.decode_cq_unit(mf.mm, i) for i in range(0, mf.wrote, UNIT)] for q, mf in files.items()}
        return {"pos": pos, "count": loop.count, "last_ts": loop.last_ts, "units": written}
    finally:
        loop.close()


def _expected_hashes(log: bytes, starts: list[int], reqs: list[records.DispatchRequest]) -> list[int]:
    out = []
    for pos, req in zip(starts, reqs, strict=True):
        for key in records.index_keys(req, records.decode_record(log, pos).tags):
            out.append(hashing.index_key_hash(hashing.index_key(req.topic, key)))
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_is_read_alike_by_both_scanners_and_the_codec(shape: str) -> None:
    log, starts = _log([shape])
    (req,) = _reference(log, starts)
    row = (req.topic, req.queue_id, req.queue_offset, req.commitlog_offset, req.msg_size, req.sys_flag,
           req.store_timestamp, req.tags_code)  # fmt: skip
    scanned = _scan(log)
    assert scanned == {"pos": len(log), "why": "done", "rows": [row],
                       "hashes": _expected_hashes(log, starts, [req])}  # fmt: skip
    dispatched = _dispatch(log)
    assert (dispatched["pos"], dispatched["count"], dispatched["last_ts"]) == (len(log), 1, req.store_timestamp)
    assert dispatched["units"][(req.topic, req.queue_id)] == [(req.commitlog_offset, req.msg_size, req.tags_code)]


def test_a_run_of_every_shape_ends_at_the_blank_that_closes_the_segment() -> None:
    shapes = list(SHAPES)
    log, starts = _log(shapes)
    reqs = _reference(log, starts)
    end = len(log)
    log += records.encode_blank(64)
    assert records.check_record(log, end).blank
    scanned = _scan(log)
    assert (scanned["pos"], scanned["why"]) == (end, "reference")  # the reference words the BLANK
    assert [r[3] for r in scanned["rows"]] == [q.commitlog_offset for q in reqs]
    assert scanned["hashes"] == _expected_hashes(log, starts, reqs)
    dispatched = _dispatch(log)
    assert (dispatched["pos"], dispatched["count"], dispatched["last_ts"]) == (end, len(reqs), reqs[-1].store_timestamp)
    for queue, got in dispatched["units"].items():
        assert got == [(q.commitlog_offset, q.msg_size, q.tags_code) for q in reqs if (q.topic, q.queue_id) == queue]


def _overwrite(at: Callable[[bytes], int], fmt: str, value: int) -> Callable[[bytes], bytes]:
    def damage(rec: bytes) -> bytes:
        out = bytearray(rec)
        struct.pack_into(fmt, out, at(rec), value)
        return bytes(out)

    return damage


_HEADER_V4 = records.record_length(0, 0, 0, 0) - 3  # TOTALSIZE to BODYLENGTH, both hosts IPv4


def _body_length_at(rec: bytes) -> int:
    return _HEADER_V4 - 4


def _topic_length_at(rec: bytes) -> int:
    return _HEADER_V4 + len(records.decode_record(rec).body)


def _properties_length_at(rec: bytes) -> int:
    return _topic_length_at(rec) + 1 + len(TOPIC)


# Bytes that are no record, or not a whole one: the codec refuses each (or says BLANK); both scanners stop there.
DAMAGED: dict[str, Callable[[bytes], bytes]] = {
    "blank": lambda rec: records.encode_blank(len(rec)),
    "zeros": lambda rec: bytes(len(rec)),
    "cut short": lambda rec: rec[:-1],
    "only its size and magic": lambda rec: rec[:8],
    "fewer than 8 bytes": lambda rec: rec[:7],
    "bad magic": _overwrite(lambda rec: records.MAGIC_POS, ">i", 0x12345678),
    "size below the header": _overwrite(lambda rec: records.TOTAL_SIZE_POS, ">i", 60),
    "size past the bytes": _overwrite(lambda rec: records.TOTAL_SIZE_POS, ">i", 1 << 20),
    "ipv6 bit on an ipv4 record": _overwrite(lambda rec: records.SYSFLAG_POS, ">i", records.BORNHOST_V6_FLAG),
    "body length overruns": _overwrite(_body_length_at, ">i", 1 << 20),
    "negative body length": _overwrite(_body_length_at, ">i", -1),
    "topic length overruns": _overwrite(_topic_length_at, ">b", 120),
    "negative topic length": _overwrite(_topic_length_at, ">b", -3),
    "properties length overruns": _overwrite(_properties_length_at, ">h", 30000),
    "fields short of the size": lambda rec: struct.pack(">i", len(rec) + 4) + rec[4:] + bytes(4),
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_record_is_left_to_the_reference_by_both_scanners(damage: str) -> None:
    log, starts = _log(["ipv4", "born ipv6"])
    end = len(log)
    log += DAMAGED[damage](_record(end, 9))
    ref = records.check_record(log, end)
    assert not ref.ok or ref.blank, "the codec takes no damaged record"
    reqs = _reference(log, starts)
    scanned = _scan(log)
    assert (scanned["pos"], scanned["why"]) == (end, "reference")
    assert [r[3] for r in scanned["rows"]] == [q.commitlog_offset for q in reqs]
    assert _scan(log, end)["rows"] == []
    dispatched = _dispatch(log)
    assert (dispatched["pos"], dispatched["count"]) == (end, len(reqs))
    assert _dispatch(log, end)["count"] == 0
