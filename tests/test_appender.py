"""The single put in one call (``store.format.appender``), on both twins, in a real store: each record it writes is
the reference encoding with the offsets and store time it reports, the queue offsets continue across puts it
declines (which the store's general path then takes), a full segment rolls, concurrent putters with dispatch
running lose and repeat nothing, and a restarted store reads every put back."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from store.config import BrokerRole, FlushDiskType
from store.format import msgid, records
from store.message_store import MessageStore, PutMessageStatus
from tests.helpers import make_config, make_message, read_queue, wait_dispatched

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("twin")]

TOPIC = "AppendTopic"


@contextlib.contextmanager
def running(tmp_path, **overrides) -> Iterator[MessageStore]:
    store = MessageStore(make_config(tmp_path, **overrides)).start()
    try:
        yield store
    finally:
        store.shutdown()


def _stored(store: MessageStore, offset: int, size: int) -> bytes:
    data = store.commitlog.read(offset, size)
    assert data is not None
    return data


def _assert_reference_record(store: MessageStore, msg: records.MessageRecord, res, before_ms: int) -> None:
    """The bytes at the reported offset are ``encode_record`` of the message with the reported queue offset,
    physical offset and store time, and that time is the clock's at the put."""
    a = res.append
    assert before_ms <= a.store_timestamp <= time.time_ns() // 1_000_000
    want = records.encode_record(dataclasses.replace(
        msg, store_host=store.store_host, queue_offset=a.queue_offset, physical_offset=a.wrote_offset,
        store_timestamp=a.store_timestamp,
    ))  # fmt: skip
    assert a.wrote_bytes == len(want)
    assert _stored(store, a.wrote_offset, a.wrote_bytes) == want
    assert res.msg_ids == [msgid.create_offset_msg_id(store.store_host, a.wrote_offset)]
    assert res.error == "" and a.msg_num == 1


def test_appender_writes_the_reference_record_and_continues_the_queue(tmp_path):
    with running(tmp_path) as store:
        general = store.put_message(make_message(TOPIC, 1, b"first: the segment is made here"))
        assert general.status is PutMessageStatus.PUT_OK and general.append.queue_offset == 0
        ends = []
        store.add_append_listener(ends.append)
        for i in range(1, 6):
            msg = make_message(TOPIC, 1, f"body {i}".encode() * 40, tags="TagA", keys=[f"k{i}"])
            before = time.time_ns() // 1_000_000
            res = store._appender.put(msg)  # taken, not declined
            assert res is not None and res.status is PutMessageStatus.PUT_OK and res.ok
            assert res.append.queue_offset == i
            assert res.append.wrote_offset == store.max_phy_offset - res.append.wrote_bytes
            assert ends[-1] == store.max_phy_offset
            _assert_reference_record(store, msg, res, before)
        wait_dispatched(store)
        assert [off for off, _ in read_queue(store, TOPIC, 1)] == list(range(6))
        assert store.commitlog.last_store_timestamp == res.append.store_timestamp


def _declined(store: MessageStore, msg: records.MessageRecord) -> None:
    end = store.max_phy_offset
    table = dict(store.commitlog.topic_queue_table)
    assert store._appender.put(msg) is None
    assert store.max_phy_offset == end and store.commitlog.topic_queue_table == table  # nothing written or counted


def test_appender_declines_what_the_general_path_must_do(tmp_path):
    with running(tmp_path, max_message_size=2000, timer_wheel_enable=True) as store:
        store.put_message(make_message(TOPIC, 0, b"makes the segment"))
        _declined(store, make_message(TOPIC, 0, b"later", DELAY="2"))
        _declined(store, make_message(TOPIC, 0, b"timer", TIMER_DELAY_SEC="5"))
        _declined(store, make_message(TOPIC, 0, b"half", sys_flag=records.TRANSACTION_PREPARED_TYPE))
        _declined(store, make_message(TOPIC, 0, b"rolled back", sys_flag=records.TRANSACTION_ROLLBACK_TYPE))
        _declined(store, make_message("T" * 128, 0, b"a V2 record"))
        _declined(store, make_message(TOPIC, 0, b"b" * 2001))
        _declined(store, make_message("", 0, b"no topic"))
        _declined(store, dataclasses.replace(make_message(TOPIC, 0, b"m"), magic=records.MESSAGE_MAGIC_V1))
        _declined(store, dataclasses.replace(make_message(TOPIC, 0, b"c"), body_crc=5))
        _declined(store, dataclasses.replace(make_message(TOPIC, 0, b"q"), queue_id=1 << 31))

        # the store's answers to them are the general path's
        assert store.put_message(make_message(TOPIC, 0, b"b" * 2001)).status is PutMessageStatus.MESSAGE_ILLEGAL
        parked = store.put_message(make_message(TOPIC, 0, b"later", DELAY="2"))
        assert parked.ok and parked.append.queue_offset == 0  # queue 1 of SCHEDULE_TOPIC_XXXX, its first
        half = store.put_message(make_message(TOPIC, 0, b"half", sys_flag=records.TRANSACTION_PREPARED_TYPE))
        assert half.ok and half.append.queue_offset == 0
        res = store.put_message(make_message(TOPIC, 0, b"next"))
        assert res.append.queue_offset == 1  # neither the parked nor the half message took a TOPIC queue offset

        store.disk_full = True
        _declined(store, make_message(TOPIC, 0, b"disk full"))
        assert store.put_message(make_message(TOPIC, 0, b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.disk_full = False
        assert store._appender.put(make_message(TOPIC, 0, b"room again")).append.queue_offset == 2
    _declined(store, make_message(TOPIC, 0, b"shut down"))


@pytest.mark.parametrize("overrides", [{"flush_disk_type": FlushDiskType.SYNC_FLUSH},
                                       {"broker_role": BrokerRole.SLAVE}])  # fmt: skip
def test_appender_is_off_where_a_put_waits_or_is_refused(tmp_path, overrides):
    with running(tmp_path, **overrides) as store:
        assert store._appender.put(make_message(TOPIC, 0, b"x")) is None
        assert store.max_phy_offset == 0


def test_full_segment_rolls_through_the_general_path_and_restart_reads_all(tmp_path):
    cfg_kw = {"mapped_file_size_commit_log": 16 * 1024}
    sent = []
    with running(tmp_path, **cfg_kw) as store:
        for i in range(60):  # ~1.1 KiB each: four segments
            msg = make_message(TOPIC, i % 2, bytes([i]) * 1000, keys=f"k{i}")
            res = store.put_message(msg)
            assert res.status is PutMessageStatus.PUT_OK
            sent.append((msg, res))
        assert len(store.commitlog.queue.files) >= 4
        for _, res in sent:
            off = res.append.wrote_offset
            assert off // (16 * 1024) == (off + res.append.wrote_bytes - 1) // (16 * 1024)  # never straddles
        wait_dispatched(store)
    with running(tmp_path, **cfg_kw) as store:
        for q in (0, 1):
            got = read_queue(store, TOPIC, q)
            want = [m for m, _ in sent if m.queue_id == q]
            assert [off for off, _ in got] == list(range(30))
            assert [r.body for _, r in got] == [m.body for m in want]
        assert store.put_message(make_message(TOPIC, 0, b"after restart")).append.queue_offset == 30


def test_concurrent_putters_with_dispatch_running(tmp_path):
    """Four threads put to two queues while the reput thread reads the log: every message is stored once, each
    queue's offsets are consecutive, and each thread's messages keep their order."""
    threads, per = 4, 300
    with running(tmp_path, mapped_file_size_commit_log=256 * 1024) as store:
        store.put_message(make_message(TOPIC, 0, b"makes the segment", keys="t9-0"))
        results: dict[int, list] = {}

        def putter(t: int) -> None:
            results[t] = [store.put_message(make_message(TOPIC, i % 2, f"t{t}-{i}".encode() * 20, keys=f"t{t}-{i}"))
                          for i in range(per)]  # fmt: skip

        workers = [threading.Thread(target=putter, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert all(r.status is PutMessageStatus.PUT_OK for rs in results.values() for r in rs)
        wait_dispatched(store)
        seen = []
        for q in (0, 1):
            got = read_queue(store, TOPIC, q)
            assert [off for off, _ in got] == list(range(len(got)))
            seen += [r.keys for _, r in got]
        assert sorted(seen) == sorted(["t9-0"] + [f"t{t}-{i}" for t in range(threads) for i in range(per)])
        for rs in results.values():
            offsets = [r.append.wrote_offset for r in rs]
            assert offsets == sorted(offsets)
