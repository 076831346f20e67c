"""The store's puts through the CommitLog's one locked section (``CommitLog.put``), on both twins, in a real store:
a single put (``records.put_record``) and a wire send's (``store.format.appender``, ``MessageStore.put_send``)
write the reference encoding with the offsets and store time they report, the queue offsets continue across the
put forms, the sends the encoder declines are left to the run path, a full segment rolls, concurrent putters with
dispatch running lose and repeat nothing, and a restarted store reads every put back."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from store.config import BrokerRole, FlushDiskType
from store.format import msgid, records, runs
from store.message_store import MessageStore, PutMessageStatus, Run
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


def test_single_put_writes_the_reference_record_and_continues_the_queue(tmp_path):
    with running(tmp_path) as store:
        general = store.put_message(make_message(TOPIC, 1, b"first: the segment is made here"))
        assert general.status is PutMessageStatus.PUT_OK and general.append.queue_offset == 0
        ends = []
        store.add_append_listener(ends.append)
        for i in range(1, 6):
            msg = make_message(TOPIC, 1, f"body {i}".encode() * 40, tags="TagA", keys=[f"k{i}"])
            before = time.time_ns() // 1_000_000
            res = store.put_message(msg)
            assert res.status is PutMessageStatus.PUT_OK and res.ok
            assert res.append.queue_offset == i
            assert res.append.wrote_offset == store.max_phy_offset - res.append.wrote_bytes
            assert ends[-1] == store.max_phy_offset
            _assert_reference_record(store, msg, res, before)
        wait_dispatched(store)
        assert [off for off, _ in read_queue(store, TOPIC, 1)] == list(range(6))
        assert store.commitlog.last_store_timestamp == res.append.store_timestamp


def test_a_plain_single_put_is_one_fast_put_and_the_rest_are_left_to_the_general_path(tmp_path):
    """``FastPut.put_record`` (the store's single put in one call) writes the reference record of a plain message
    and declines, writing nothing, every message the general path must park, refuse or put differently."""
    with running(tmp_path, max_message_size=2000) as store:
        store.put_message(make_message(TOPIC, 0, b"makes the segment"))
        msg = make_message(TOPIC, 0, b"plain" * 50, tags="TagA", keys=["k"])
        before = time.time_ns() // 1_000_000
        res = store._fast.put_record(msg)
        assert res is not None and res.status is PutMessageStatus.PUT_OK and res.append.queue_offset == 1
        _assert_reference_record(store, msg, res, before)
        end = store.max_phy_offset
        for declined in (
            make_message(TOPIC, 0, b"delayed", DELAY="3"),
            make_message(TOPIC, 0, b"timer", TIMER_DELAY_SEC="5"),
            make_message(TOPIC, 0, b"half", sys_flag=records.TRANSACTION_PREPARED_TYPE),
            make_message(TOPIC, 0, b"x" * 2001),
            make_message("", 0, b"no topic"),
            make_message("T" * 128, 0, b"a topic for the general path to size"),
        ):
            assert store._fast.put_record(declined) is None, declined
        assert store.max_phy_offset == end and store.commitlog.topic_queue_table[f"{TOPIC}-0"] == 2


def test_single_put_answers(tmp_path):
    """Parked, half, oversized and refused puts get the store's answers; the queue offsets skip none."""
    with running(tmp_path, max_message_size=2000, timer_wheel_enable=True) as store:
        store.put_message(make_message(TOPIC, 0, b"makes the segment"))
        assert store.put_message(make_message(TOPIC, 0, b"b" * 2001)).status is PutMessageStatus.MESSAGE_ILLEGAL
        parked = store.put_message(make_message(TOPIC, 0, b"later", DELAY="2"))
        assert parked.ok and parked.append.queue_offset == 0  # queue 1 of SCHEDULE_TOPIC_XXXX, its first
        half = store.put_message(make_message(TOPIC, 0, b"half", sys_flag=records.TRANSACTION_PREPARED_TYPE))
        assert half.ok and half.append.queue_offset == 0
        res = store.put_message(make_message(TOPIC, 0, b"next"))
        assert res.append.queue_offset == 1  # neither the parked nor the half message took a TOPIC queue offset

        store.disk_full = True
        assert store.put_message(make_message(TOPIC, 0, b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.disk_full = False
        assert store.put_message(make_message(TOPIC, 0, b"room again")).append.queue_offset == 2
    assert store.put_message(make_message(TOPIC, 0, b"shut down")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def _assert_every_key_once(store: MessageStore, threads: int, per: int) -> None:
    """Once dispatched, queues 0 and 1 hold "t9-0" and every thread's "t{t}-{i}" exactly once, at consecutive
    queue offsets."""
    wait_dispatched(store)
    seen = []
    for q in (0, 1):
        got = read_queue(store, TOPIC, q)
        assert [off for off, _ in got] == list(range(len(got)))
        seen += [r.keys for _, r in got]
    assert sorted(seen) == sorted(["t9-0"] + [f"t{t}-{i}" for t in range(threads) for i in range(per)])


def _in_threads(target: Callable[[int], None], threads: int) -> None:
    """``target(t)`` for t in range(threads), each in its own thread, all at once; back when all are done."""
    workers = [threading.Thread(target=target, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_full_segment_rolls_and_restart_reads_all(tmp_path):
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

        _in_threads(putter, threads)
        assert all(r.status is PutMessageStatus.PUT_OK for rs in results.values() for r in rs)
        _assert_every_key_once(store, threads, per)
        for rs in results.values():
            offsets = [r.append.wrote_offset for r in rs]
            assert offsets == sorted(offsets)


# --- put_send: a SEND_MESSAGE_V2's put from its header's fields (the broker's fast path) ---------------------------
CLUSTER = "AppendCluster"
BORN = ("10.0.0.7", 51234)


def _send(store: MessageStore, topic: str, queue_id: int, body: bytes, props: bytes = b"TAGS\x01a\x02",
          sys_flag: int = 0, born_host: tuple = BORN, cluster: str = CLUSTER, **kw):  # fmt: skip
    return store.put_send(topic, queue_id, body, props, kw.get("flag", 3), sys_flag, kw.get("born_ts", 1_700_000),
                          born_host, kw.get("reconsume", 0), cluster)  # fmt: skip


def _assert_sent_record(store: MessageStore, got, topic: str, queue_id: int, body: bytes, props: bytes,
                        sys_flag: int = 0, born_host: tuple = BORN, before_ms: int = 0) -> None:  # fmt: skip
    """The bytes at the reported offset are ``runs.encode_message``'s record of the same fields (the broker's
    CLUSTER added unless the properties hold one) with the queue offset, physical offset and store time the store
    gave it; the offset message id is the reply's."""
    msg_id, offset, size, queue_offset = got
    data = _stored(store, offset, size)
    stored = records.decode_record(data)
    assert before_ms <= stored.store_timestamp <= time.time_ns() // 1_000_000
    run = runs.encode_message(topic, queue_id, body, props, 3, sys_flag, 1_700_000, born_host, store.store_host, 0,
                              CLUSTER)  # fmt: skip
    want = bytearray(run)
    records.patch_record(want, 0, queue_offset, offset, stored.store_timestamp)
    assert data == bytes(want) and size == len(run)
    assert msg_id == msgid.create_offset_msg_id(store.store_host, offset)
    assert msg_id == runs.offset_msg_ids(store.store_host, offset, run, 1)


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_put_send_writes_the_encode_message_record(tmp_path, flush):
    """In SYNC_FLUSH too (the put never waits; the broker holds the reply for the group commit): every send is the
    run path's record, the queue offsets continue the single put's."""
    with running(tmp_path, flush_disk_type=flush) as store:
        assert store.put_message(make_message(TOPIC, 2, b"general")).append.queue_offset == 0
        ends = []
        store.add_append_listener(ends.append)
        cases = [
            (b"plain body" * 30, b"TAGS\x01a\x02KEYS\x01k1\x02", 0, BORN),
            (b"", b"", 0, BORN),  # no properties: CLUSTER alone
            (b"has its own cluster", b"CLUSTER\x01theirs\x02TAGS\x01b\x02", 0, BORN),  # kept as it came
            (b"empty cluster value", b"CLUSTER\x01\x02", 0, BORN),  # counts as absent: the broker's is added
            (b"java 4.9.8", b"TAGS\x01a\x02KEYS\x01k1", 0, BORN),  # no last separator: one goes before CLUSTER
            (b"ipv6 born" * 100, b"UNIQ_KEY\x01AC11\x02", 0, ("fe80::1", 4000)),
            (b"committed, multi tags", b"TAGS\x01a||b\x02", records.TRANSACTION_COMMIT_TYPE | 0x80, BORN),
            (bytes(range(256)) * 20, b"KEYS\x01x y\x02", 0, BORN),  # over the fast CRC's threshold
        ]
        for i, (body, props, sys_flag, born) in enumerate(cases, start=1):
            before = time.time_ns() // 1_000_000
            got = _send(store, TOPIC, 2, body, props, sys_flag, born)
            assert got is not None and got[3] == i
            assert got[1] + got[2] == store.max_phy_offset == ends[-1]
            _assert_sent_record(store, got, TOPIC, 2, body, props, sys_flag, born, before)
        wait_dispatched(store)
        assert [off for off, _ in read_queue(store, TOPIC, 2)] == list(range(len(cases) + 1))


def _send_declined(store: MessageStore, *args, **kw) -> None:
    end = store.max_phy_offset
    table = dict(store.commitlog.topic_queue_table)
    assert _send(store, *args, **kw) is None
    assert store.max_phy_offset == end and store.commitlog.topic_queue_table == table  # nothing written or counted


def test_put_send_declines_what_the_run_path_must_do(tmp_path):
    with running(tmp_path, max_message_size=2000) as store:
        assert store.put_message(make_message(TOPIC, 0, b"makes the segment")).ok
        _send_declined(store, TOPIC, 0, b"later", b"DELAY\x012\x02")
        _send_declined(store, TOPIC, 0, b"timer", b"TIMER_DELAY_SEC\x015\x02")
        _send_declined(store, TOPIC, 0, b"half", sys_flag=records.TRANSACTION_PREPARED_TYPE)
        _send_declined(store, TOPIC, 0, b"rolled back", sys_flag=records.TRANSACTION_ROLLBACK_TYPE)
        _send_declined(store, "T" * 128, 0, b"a V2 record")
        _send_declined(store, "", 0, b"no topic")
        _send_declined(store, TOPIC, 0, b"b" * 2001)
        _send_declined(store, TOPIC, 1 << 31, b"queue id out of range")
        _send_declined(store, TOPIC, 0, b"flag", flag=1 << 31)
        _send_declined(store, TOPIC, 0, b"born", born_ts=1 << 63)
        _send_declined(store, TOPIC, 0, b"bad address", born_host=("not an ip", 1))
        _send_declined(store, TOPIC, 0, b"port", born_host=("10.0.0.1", 1 << 31))
        _send_declined(store, TOPIC, 0, b"surrogate", cluster="\ud800")
        _send_declined(store, TOPIC, 0, b"timer in the cluster's name", cluster="TIMER_X")
        limit = records.MAX_PROPERTIES_LENGTH
        _send_declined(store, TOPIC, 0, b"p", b"K\x01" + b"v" * (limit - 5) + b"\x02")  # with CLUSTER: too long
        _send_declined(store, TOPIC, 0, b"types", b"TAGS\x01a\x02", born_host=["10.0.0.1", 1])
        _send_declined(store, TOPIC, 0, bytearray(b"types"))
        # ... where the run path is right to refuse, or answers otherwise, as before
        half = runs.encode_message(TOPIC, 0, b"x", b"", 0, records.TRANSACTION_PREPARED_TYPE, 0, BORN, store.store_host,
                                   0, CLUSTER)  # fmt: skip
        put = store.put_nowait(Run(half, 1, TOPIC, 0, records.TRANSACTION_PREPARED_TYPE))[0]
        assert put.append.queue_offset == 0
        # a cluster name of surrogates is no matter when the properties hold their own CLUSTER
        assert _send(store, TOPIC, 0, b"s", b"CLUSTER\x01c\x02", cluster="\ud800")[3] == 1

        store.disk_full = True
        _send_declined(store, TOPIC, 0, b"disk full")
        store.disk_full = False
        assert _send(store, TOPIC, 0, b"room again")[3] == 2
    _send_declined(store, TOPIC, 0, b"shut down")
    with running(tmp_path / "slave", broker_role=BrokerRole.SLAVE) as slave:
        _send_declined(slave, TOPIC, 0, b"a slave takes no sends")


def test_put_send_rolls_at_a_full_segment(tmp_path):
    """No room for the record: the locked section writes the BLANK and the record goes to the new segment, whole;
    a restarted store reads every message back."""
    size = 16 * 1024
    sent = []
    with running(tmp_path, mapped_file_size_commit_log=size) as store:
        assert store.put_message(make_message(TOPIC, 0, b"makes the segment")).ok
        sent.append(b"makes the segment")
        rolled = 0
        for i in range(40):
            body = bytes([i]) * 1000
            got = _send(store, TOPIC, 0, body)
            assert got is not None and got[3] == len(sent)
            assert got[1] // size == (got[1] + got[2] - 1) // size  # never straddles
            rolled += got[1] % size == 0
            sent.append(body)
        assert rolled >= 2
        wait_dispatched(store)
    with running(tmp_path, mapped_file_size_commit_log=size) as store:
        got = read_queue(store, TOPIC, 0)
        assert [off for off, _ in got] == list(range(len(sent)))
        assert [r.body for _, r in got] == sent


def test_put_send_from_several_threads_with_dispatch_running(tmp_path):
    """Four threads send to two queues while the reput thread reads the log: each stored once, each queue's
    offsets consecutive, each thread's sends in order, each reported record where it was said to be."""
    threads, per = 4, 300
    with running(tmp_path, mapped_file_size_commit_log=1 << 20) as store:
        store.put_message(make_message(TOPIC, 0, b"makes the segment", keys="t9-0"))
        results: dict[int, list] = {}

        def sender(t: int) -> None:
            results[t] = [_send(store, TOPIC, i % 2, f"t{t}-{i}".encode() * 20, f"KEYS\x01t{t}-{i}\x02".encode())
                          for i in range(per)]  # fmt: skip

        _in_threads(sender, threads)
        assert all(r is not None for rs in results.values() for r in rs)
        _assert_every_key_once(store, threads, per)
        for t, rs in results.items():
            assert [r[1] for r in rs] == sorted(r[1] for r in rs)
            for i, (_, offset, size, _) in enumerate(rs):
                stored = records.decode_record(_stored(store, offset, size))
                assert stored.body == f"t{t}-{i}".encode() * 20 and stored.property_map["CLUSTER"] == CLUSTER
