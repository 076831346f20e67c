"""A single put's append (``records.put_record``, the encoder ``CommitLog.put`` calls), on both twins: the record
written into the segment field by field against a layout written out by hand, nothing written when it does not
fit, and a real store's puts rolling segments, back-filled, and read back after a restart."""

from __future__ import annotations

import struct
import zlib

import pytest

from store.commitlog import AppendStatus, CommitLog
from store.format import msgid, native, records, runs
from store.message_store import MessageStore, PutMessageStatus
from tests.helpers import make_config, make_message
from tests.test_send_runs import CRC_123456789, expected_record
from tests.twins import twin_functions

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("twin")]

BORN = ("10.0.0.7", 40001)
STORE = ("127.0.0.1", 10911)


def _message(body: bytes = b"123456789", sys_flag: int = 0) -> records.MessageRecord:
    return records.MessageRecord("T", 1, body, b"TAGS\x01a\x02", flag=7, sys_flag=sys_flag, born_timestamp=5,
                                 born_host=BORN, store_host=STORE)  # fmt: skip


def _backfilled(rec: bytes, queue_offset: int, physical_offset: int, store_ts: int) -> bytes:
    out = bytearray(rec)
    struct.pack_into(">qq", out, 20, queue_offset, physical_offset)  # QUEUEOFFSET, PHYSICALOFFSET
    struct.pack_into(">q", out, 56, store_ts)  # STORETIMESTAMP after an IPv4 born host
    return bytes(out)


def test_put_record_writes_the_record_with_what_the_lock_knows():
    want = _backfilled(expected_record(b"T", 1, b"123456789", b"TAGS\x01a\x02", 7, 0, 5, CRC_123456789), 42, 1000,
                       1_700_000_000_123)  # fmt: skip
    dest = bytearray(b"\xee" * 300)
    n = records.put_record(dest, 10, 290, _message(), 42, 1000, 1_700_000_000_123)
    assert n == len(want)
    assert dest[10 : 10 + n] == want
    assert dest[:10] == b"\xee" * 10 and dest[10 + n :] == b"\xee" * (290 - n)  # nothing outside the record


@pytest.mark.parametrize("size", [255, 256, 1024, 4099])
def test_body_crc_of_long_bodies_is_zlibs(size: int):
    """From 256 bytes on the compiled twins take ISA-L's CRC (store/format/_crc.pxd): the same 31 bits as zlib's."""
    body = bytes(range(251)) * (size // 251) + bytes(size % 251)
    dest = bytearray(size + 200)
    records.put_record(dest, 0, len(dest), _message(body), 0, 0, 0)
    want = zlib.crc32(body) & 0x7FFFFFFF
    assert struct.unpack_from(">i", dest, records.BODY_CRC_POS)[0] == want
    assert struct.unpack_from(">i", records.encode_record(_message(body)), records.BODY_CRC_POS)[0] == want
    assert records.check_record(dest, 0).ok


def test_put_record_that_does_not_fit_writes_nothing():
    size = len(records.encode_record(_message()))
    dest = bytearray(300)
    assert records.put_record(dest, 100, 100 + size - 1, _message(), 0, 0, 0) == -size
    assert dest == bytearray(300)
    assert records.put_record(dest, 100, 100 + size, _message(), 0, 0, 0) == size  # exactly up to the limit


def test_put_record_refuses_a_limit_past_the_buffer():
    with pytest.raises(records.RecordEncodeError):
        records.put_record(bytearray(100), 0, 101, _message(), 0, 0, 0)


def _put(cl: CommitLog, rec: records.MessageRecord):
    return cl.put(records.put_record, rec, f"{rec.topic}-{rec.queue_id}", records.is_consumable(rec.sys_flag))


def test_commitlog_put_rolls_to_a_new_segment_and_refuses_what_no_segment_holds(tmp_path):
    cl = CommitLog(tmp_path, 4096)
    try:
        body = b"x" * 1000
        results = [_put(cl, _message(body)) for _ in range(5)]
        assert [r.status for r in results] == [AppendStatus.PUT_OK] * 5
        assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
        # three records fill the first segment; the fourth goes to the next one behind a BLANK
        assert results[3].wrote_offset == 4096
        first = cl.queue.files[0]
        end = results[2].wrote_offset + results[2].wrote_bytes
        assert struct.unpack_from(">ii", first.view, end) == (4096 - end, records.BLANK_MAGIC)
        for r in results:
            rec = records.decode_record(cl.read(r.wrote_offset, r.wrote_bytes), check_crc=True)
            assert (rec.queue_offset, rec.physical_offset, rec.body) == (r.queue_offset, r.wrote_offset, body)
            assert rec.store_timestamp == r.store_timestamp
        too_big = _put(cl, _message(b"x" * 4096))
        assert too_big.status == AppendStatus.MESSAGE_SIZE_EXCEEDED
        assert cl.max_offset == results[-1].wrote_offset + results[-1].wrote_bytes  # nothing written
        # a prepared (half) record takes queue offset 0 and does not advance the queue
        half = _put(cl, _message(sys_flag=records.TRANSACTION_PREPARED_TYPE))
        assert half.queue_offset == 0
        assert _put(cl, _message()).queue_offset == 5
    finally:
        cl.close()


@pytest.mark.parametrize("encoder", ["python", "compiled"])
def test_commitlog_put_writes_the_reference_record_through_either_encoder_twin(tmp_path, encoder: str):
    """The section (of either twin) calls a compiled encoder through its C entry (``Encoder.write``) and a Python
    one as a function: both write the reference record, back-filled with what the lock knew, twice in a row (the
    queue advances) and into a new segment after a roll."""
    put_record = twin_functions(encoder)["store.format.records.put_record"]
    reference = native.TWINS["store.format.records"].python["encode_record"]
    msg = _message(bytes(range(256)) * 4)  # 1 KiB: the compiled twin's ISA-L CRC
    cl = CommitLog(tmp_path, 4096)
    try:
        results = [cl.put(put_record, msg, "T-1", True) for _ in range(4)]  # three fit a segment
        assert [(r.status, r.queue_offset) for r in results] == [(AppendStatus.PUT_OK, i) for i in range(4)]
        assert results[3].wrote_offset == 4096
        for r in results:
            want = _backfilled(reference(msg), r.queue_offset, r.wrote_offset, r.store_timestamp)
            assert r.wrote_bytes == len(want)
            assert cl.read(r.wrote_offset, r.wrote_bytes) == want
    finally:
        cl.close()


def test_commitlog_put_of_a_run_rolls_whole_and_numbers_its_records(tmp_path):
    """``runs.put_run`` through the same locked section: a run that does not fit goes whole to the next segment,
    behind a BLANK, its records numbered from the queue's next offset."""
    cl = CommitLog(tmp_path, 4096)
    try:
        first = _put(cl, _message(b"x" * 2000))
        run = records.encode_record(_message(b"y" * 900)) * 2
        res = cl.put(runs.put_run, (run, 2, True), "T-1", True, 2)
        assert (res.status, res.wrote_offset, res.wrote_bytes, res.queue_offset) == (AppendStatus.PUT_OK, 4096,
                                                                                    len(run), 1)  # fmt: skip
        end = first.wrote_offset + first.wrote_bytes
        assert struct.unpack_from(">ii", cl.queue.files[0].view, end) == (4096 - end, records.BLANK_MAGIC)
        second = records.decode_record(cl.read(4096 + len(run) // 2, len(run) // 2), check_crc=True)
        assert (second.queue_offset, second.physical_offset) == (2, 4096 + len(run) // 2)
        assert _put(cl, _message()).queue_offset == 3
    finally:
        cl.close()


def test_store_puts_are_read_back_after_a_restart(tmp_path):
    config = make_config(tmp_path, mapped_file_size_commit_log=16 * 1024)
    sent = [make_message("PutTopic", i % 2, f"body-{i}".encode() * 50, tags="TagA") for i in range(40)]
    with MessageStore(config) as store:
        results = [store.put_message(m) for m in sent]
        assert all(r.status == PutMessageStatus.PUT_OK for r in results)
        assert len(store.commitlog.queue.files) > 1  # rolled
    with MessageStore(config) as store:
        for m, r in zip(sent, results, strict=True):
            (msg_id,) = r.msg_ids
            assert msgid.decode_offset_msg_id(msg_id)[1] == r.append.wrote_offset
            raw = store.look_message_by_offset(r.append.wrote_offset)
            rec = records.decode_record(raw, check_crc=True)
            assert (rec.topic, rec.queue_id, rec.body, rec.properties) == (m.topic, m.queue_id, m.body, m.properties)
            assert rec.queue_offset == r.append.queue_offset
        assert [r.append.queue_offset for r in results[:4]] == [0, 0, 1, 1]
        assert store.get_max_offset_in_queue("PutTopic", 0) == 20
