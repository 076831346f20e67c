"""The native store through its facade: a real MessageStore on tmp_path with small segment sizes."""

from __future__ import annotations

import contextlib
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from store.checkpoint import LOCK_FILE, StoreLock, StoreLockedError, flock_held
from store.commitlog import GroupCommitService
from store.format import msgid, properties, records, units
from store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from store.retention import SegmentManifest
from tests.helpers import Worker, make_config, make_message, read_queue, wait_dispatched, wait_until

SEG = 64 * 1024
BLANK_MAGIC_BYTES = bytes.fromhex("CBD43194")
MAGIC_V1_BYTES = bytes.fromhex("DAA320A7")
TAG_A_HASH = 2598919  # "TagA".hashCode() in Java
MIN_INT_TAG = "polygenelubricants"  # "polygenelubricants".hashCode() == Integer.MIN_VALUE in Java
REPO = Path(__file__).resolve().parents[1]


def java_hash(s: str) -> int:
    """Java String.hashCode, written independently of store.format."""
    h = 0
    for (unit,) in struct.iter_unpack(">H", s.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@contextlib.contextmanager
def running(config):
    store = MessageStore(config).start()
    try:
        yield store
    finally:
        store.shutdown()


def put_ok(store: MessageStore, msg: records.MessageRecord):
    res = store.put_message(msg)
    assert res.status == PutMessageStatus.PUT_OK, res
    return res


def cl_file_bytes(config, offset: int, size: int) -> bytes:
    """Read a CommitLog range straight from the segment file on disk."""
    base = offset - offset % config.mapped_file_size_commit_log
    path = config.commitlog_dir / f"{base:020d}"
    with open(path, "rb") as f:
        f.seek(offset - base)
        return f.read(size)


def body_len_for_total(total: int, topic: str, props_len: int) -> int:
    return total - records.record_length(0, 0, len(topic.encode()), props_len)


# =====================================================================================================
# put / get
# =====================================================================================================


@pytest.mark.unit
def test_put_get_round_trip(tmp_path):
    cfg = make_config(tmp_path)
    sent: dict[int, list[records.MessageRecord]] = {0: [], 1: []}
    results = []
    with running(cfg) as store:
        for i in range(40):
            q = i % 2
            msg = make_message("RoundTrip", q, f"body-{i}-".encode() * (i + 1), tags=f"Tag{i % 3}", keys=[f"k{i}"])
            sent[q].append(msg)
            results.append((q, put_ok(store, msg)))
        wait_dispatched(store)

        # queue offsets consecutive per queue; physical offsets are where the records sit
        for q in (0, 1):
            offs = [r.append.queue_offset for qq, r in results if qq == q]
            assert offs == list(range(20))
        positions = [r.append.wrote_offset for _, r in results]
        assert positions == sorted(positions)
        for (_, a), (_, b) in zip(results, results[1:], strict=False):
            if a.append.wrote_offset // SEG == b.append.wrote_offset // SEG:
                assert b.append.wrote_offset == a.append.wrote_offset + a.append.wrote_bytes

        for _q, res in results:
            (host, port), phy = msgid.decode_offset_msg_id(res.msg_ids[0])
            assert phy == res.append.wrote_offset
            assert f"{host}:{port}" == cfg.store_host
            assert len(res.msg_ids[0]) == 32 and res.msg_ids[0] == res.msg_ids[0].upper()

        for q in (0, 1):
            got = store.get_message("RoundTrip", q, 0, 32)
            assert got.status == GetMessageStatus.FOUND
            assert got.queue_offsets == list(range(20))
            for i, raw in enumerate(got.messages):
                rec = records.decode_record(raw, check_crc=True)
                want = sent[q][i]
                assert rec.topic == "RoundTrip" and rec.queue_id == q
                assert rec.body == want.body
                assert rec.tags == want.tags and rec.keys == want.keys and rec.uniq_key == want.uniq_key
                assert rec.queue_offset == i
                assert rec.born_timestamp == want.born_timestamp
                assert rec.store_host == ("127.0.0.1", 10911)
                # byte-identical to the CommitLog file
                assert bytes(raw) == cl_file_bytes(cfg, rec.physical_offset, len(raw))
                assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
                assert raw[4:8] == MAGIC_V1_BYTES
            assert got.next_begin_offset == 20 and got.min_offset == 0 and got.max_offset == 20


@pytest.mark.unit
def test_roll_over_writes_blank_at_end_of_each_full_file(tmp_path):
    cfg = make_config(tmp_path)
    puts = []
    with running(cfg) as store:
        for i in range(260):  # ~ 520 KB: 8+ segments
            body = bytes([i % 251]) * (1000 + (i * 37) % 2100)
            res = put_ok(store, make_message("Roll", i % 4, body, tags="T"))
            puts.append((res.append.wrote_offset, res.append.wrote_bytes, body))
        wait_dispatched(store)
        max_phy = store.max_phy_offset

        # (a "<name>.tmp" is the next segment being preallocated in the background right now)
        names = sorted(p.name for p in cfg.commitlog_dir.iterdir() if not p.name.endswith(".tmp"))
        assert all(re.fullmatch(r"\d{20}", n) for n in names), names
        assert names == [f"{n * SEG:020d}" for n in range(len(names))]
        data_files = max_phy // SEG + 1
        assert data_files >= 8 and len(names) >= data_files

        starts = {off: (size, body) for off, size, body in puts}
        seen = []
        for n in range(data_files - 1):  # every full file
            data = (cfg.commitlog_dir / names[n]).read_bytes()
            assert len(data) == SEG
            pos = 0
            while True:
                size, magic = struct.unpack_from(">ii", data, pos)
                if data[pos + 4 : pos + 8] == BLANK_MAGIC_BYTES:
                    assert size == SEG - pos, f"blank in {names[n]} at {pos}"
                    break
                assert data[pos + 4 : pos + 8] == MAGIC_V1_BYTES
                phy = n * SEG + pos
                assert phy in starts, f"record at {phy} was not written by a put"
                assert size == starts[phy][0]
                assert pos + size + 8 <= SEG  # never ends closer than 8 bytes to the end
                assert struct.unpack_from(">q", data, pos + 28)[0] == phy  # PHYSICALOFFSET
                seen.append(phy)
                pos += size
            # the blank is where the next put did not fit: the first record of the next file
            nxt = (n + 1) * SEG
            assert nxt in starts
            assert starts[nxt][0] + 8 > SEG - pos
        last_full_end = (data_files - 1) * SEG
        assert seen == [off for off, _, _ in puts if off < last_full_end]
        for off, size, _ in puts:
            assert off // SEG == (off + size - 1) // SEG  # no record straddles two files

        # every message is readable afterwards, in order
        bodies = {}
        for q in range(4):
            for qoff, rec in read_queue(store, "Roll", q):
                bodies[rec.physical_offset] = rec.body
                assert rec.queue_offset == qoff
        assert bodies == {off: body for off, _, body in puts}


@pytest.mark.unit
def test_record_of_exactly_file_size_minus_8_fills_a_fresh_segment(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        put_ok(store, make_message("Edge", 0, b"small", uniq_key=False))
        props_len = len(properties.encode_properties({}))
        big = make_message("Edge", 0, b"", uniq_key=False)
        big.body = b"x" * body_len_for_total(SEG - 8, "Edge", props_len)
        res = put_ok(store, big)
        assert res.append.wrote_offset == SEG and res.append.wrote_bytes == SEG - 8
        after = put_ok(store, make_message("Edge", 0, b"after", uniq_key=False))
        assert after.append.wrote_offset == 2 * SEG
        wait_dispatched(store)
        seg1 = (cfg.commitlog_dir / f"{SEG:020d}").read_bytes()
        assert struct.unpack_from(">i", seg1, 0)[0] == SEG - 8
        assert seg1[SEG - 8 : SEG] == struct.pack(">i", 8) + BLANK_MAGIC_BYTES
        assert [rec.body for _, rec in read_queue(store, "Edge", 0)] == [b"small", big.body, b"after"]


@pytest.mark.unit
def test_oversized_messages_are_rejected_and_nothing_is_appended(tmp_path):
    cfg = make_config(tmp_path, max_message_size=8 * 1024)
    with running(cfg) as store:
        put_ok(store, make_message("Big", 0, b"first"))
        before_phy = store.max_phy_offset
        over_max = store.put_message(make_message("Big", 0, b"x" * (8 * 1024 + 1)))
        assert over_max.status == PutMessageStatus.MESSAGE_ILLEGAL and not over_max.ok
        assert over_max.msg_ids == [] and store.max_phy_offset == before_phy

        at_max = store.put_message(make_message("Big", 0, b"x" * (8 * 1024)))
        assert at_max.status == PutMessageStatus.PUT_OK
        before_phy = store.max_phy_offset
        huge_props = store.put_message(make_message("Big", 0, b"p", BIG="v" * 32800))
        assert huge_props.status == PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert store.max_phy_offset == before_phy
        wait_dispatched(store)
        assert [len(r.body) for _, r in read_queue(store, "Big", 0)] == [5, 8 * 1024]

    # a body allowed by maxMessageSize that cannot fit any segment
    cfg2 = make_config(tmp_path / "two")
    with running(cfg2) as store:
        put_ok(store, make_message("Big", 0, b"first"))
        before_phy = store.max_phy_offset
        too_big = store.put_message(make_message("Big", 0, b"y" * (SEG - 100)))
        assert too_big.status == PutMessageStatus.MESSAGE_ILLEGAL
        assert store.max_phy_offset == before_phy
        after = put_ok(store, make_message("Big", 0, b"second"))
        assert after.append.wrote_offset == before_phy and after.append.queue_offset == 1
        wait_dispatched(store)
        assert [r.body for _, r in read_queue(store, "Big", 0)] == [b"first", b"second"]


# =====================================================================================================
# flush
# =====================================================================================================


@pytest.mark.unit
def test_group_commit_groups_concurrent_writers(tmp_path, monkeypatch):
    # The disk is held at the group commit's first fdatasync until every writer waits for its own flush, so how
    # the writers share syncs does not depend on this machine's speed: the first sync serves the first writer
    # and the next one all the others, whose requests queued meanwhile.
    cfg = make_config(tmp_path, flush_disk_type="SYNC_FLUSH", mapped_file_size_commit_log=1024 * 1024)
    writers = 16
    real_submit, real_fdatasync = GroupCommitService.submit, os.fdatasync
    submitted: list[int] = []
    all_waiting = threading.Event()
    syncs: list[str] = []  # the thread of each fdatasync while the writers run

    def submit(self, next_offset: int):
        fut = real_submit(self, next_offset)
        submitted.append(next_offset)
        if len(submitted) == writers:
            all_waiting.set()
        return fut

    def fdatasync(fd: int) -> None:
        syncs.append(threading.current_thread().name)
        if threading.current_thread().name == "group-commit":
            all_waiting.wait(30)  # the disk is busy until every writer waits
        real_fdatasync(fd)

    with running(cfg) as store:
        monkeypatch.setattr(GroupCommitService, "submit", submit)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        statuses: list[PutMessageStatus] = []
        start = threading.Barrier(writers)

        def writer(t: int) -> None:
            start.wait()
            statuses.append(store.put_message(make_message("Sync", t, f"{t}:0".encode(), tags="S")).status)

        ts = [Worker(writer, t, name=f"writer-{t}") for t in range(writers)]
        for t in ts:
            t.start()
        for t in ts:
            t.finish()
        monkeypatch.undo()
        assert statuses == [PutMessageStatus.PUT_OK] * writers
        assert store.commitlog.queue.flushed_offset >= store.max_phy_offset
        assert syncs.count("group-commit") <= 2, f"{len(syncs)} fdatasync calls ({syncs}) for {writers} writers"
        assert len(syncs) < writers // 2, f"{len(syncs)} fdatasync calls ({syncs}) for {writers} writers"

        wait_dispatched(store)
        for t in range(writers):
            assert [r.body for _, r in read_queue(store, "Sync", t)] == [f"{t}:0".encode()]


@pytest.mark.unit
def test_flush_disk_timeout_keeps_the_message(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=200)
    release = threading.Event()
    real_commit = GroupCommitService._commit

    def slow_commit(self):
        with self._lock:
            pending = bool(self._requests)
        if pending:
            release.wait(30)  # the disk hangs until the test lets it go
        real_commit(self)

    monkeypatch.setattr(GroupCommitService, "_commit", slow_commit)
    with running(cfg) as store:
        try:
            # the disk hangs until `release`: only the 200 ms syncFlushTimeout can answer this put
            res = store.put_message(make_message("Slow", 0, b"late", tags="TagA"))
            assert res.status == PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert res.ok  # stored, only not confirmed on disk
            wait_dispatched(store)
            got = store.get_message("Slow", 0, 0, 32)
            assert got.status == GetMessageStatus.FOUND
            assert records.decode_record(got.messages[0]).body == b"late"

            # a message that does not wait for the flush is not timed out
            nowait = store.put_message(make_message("Slow", 0, b"nowait", WAIT="false"))
            assert nowait.status == PutMessageStatus.PUT_OK
        finally:
            release.set()
        # the disk is back: a put now waits as long as a loaded machine's fsync may take, not a short budget
        store.config.sync_flush_timeout = 60_000
        ok = store.put_message(make_message("Slow", 0, b"after"))
        assert ok.status == PutMessageStatus.PUT_OK
        assert store.commitlog.queue.flushed_offset >= store.max_phy_offset


# =====================================================================================================
# reads
# =====================================================================================================


@pytest.mark.unit
def test_tag_filtering(tmp_path):
    cfg = make_config(tmp_path)
    tags = ["TagA", "TagB", "TagC"]
    assert java_hash("TagA") == TAG_A_HASH
    with running(cfg) as store:
        for i in range(30):
            put_ok(store, make_message("Tags", 0, f"m{i}", tags=tags[i % 3]))
        wait_dispatched(store)

        r = store.get_message("Tags", 0, 0, 32, tag_codes={TAG_A_HASH})
        assert r.status == GetMessageStatus.FOUND
        assert r.queue_offsets == list(range(0, 30, 3))
        assert [records.decode_record(m).tags for m in r.messages] == ["TagA"] * 10
        assert r.next_begin_offset == 30

        # the batch ends at max_msg_nums; the next begin is the first unit not looked at
        r = store.get_message("Tags", 0, 1, 3, tag_codes={TAG_A_HASH})
        assert r.queue_offsets == [3, 6, 9] and r.next_begin_offset == 10

        r = store.get_message("Tags", 0, 0, 32, tag_codes={java_hash("TagB"), java_hash("TagC")})
        assert r.queue_offsets == [i for i in range(30) if i % 3]

        r = store.get_message("Tags", 0, 4, 32, tag_codes={java_hash("TagZ")})
        assert r.status == GetMessageStatus.NO_MATCHED_MESSAGE
        assert r.messages == [] and r.next_begin_offset == 30


@pytest.mark.unit
def test_read_statuses(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        r = store.get_message("Nope", 0, 0, 32)
        assert r.status == GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        store.find_consume_queue("Empty", 3)  # an existing queue with nothing in it
        r = store.get_message("Empty", 3, 0, 32)
        assert r.status == GetMessageStatus.NO_MESSAGE_IN_QUEUE and r.next_begin_offset == 0

        for i in range(12):
            put_ok(store, make_message("St", 0, f"s{i}"))
        wait_dispatched(store)
        r = store.get_message("St", 0, 12, 32)
        assert r.status == GetMessageStatus.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 12
        r = store.get_message("St", 0, 50, 32)
        assert r.status == GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 12
        assert (r.min_offset, r.max_offset) == (0, 12)
        r = store.get_message("St", 0, 2, 5)
        assert r.status == GetMessageStatus.FOUND and r.queue_offsets == [2, 3, 4, 5, 6]
        assert r.next_begin_offset == 7
        r = store.get_message("St", 0, 0, 32, max_total_bytes=1)
        assert len(r.messages) == 1  # the first message always goes, the byte limit stops the rest


@pytest.mark.unit
def test_offset_too_small_after_head_segments_are_deleted(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        for i in range(200):
            put_ok(store, make_message("Ret", 0, bytes([i]) * 1500, tags="R"))
        wait_dispatched(store)
        assert store.get_max_offset_in_queue("Ret", 0) == 200
        store.clean_expired_files()  # records the sealed segments in the manifest

        manifest = SegmentManifest(cfg.store_path_root_dir)
        claimed = manifest.claim("test-tierer", treat_sealed_as_expired=True)
        assert claimed, "sealed segments must be claimable"
        for e in claimed:
            manifest.mark_tiered(e.base_offset, "test-tierer")
        store.delete_expired_files_manually()

        cl_min = store.min_phy_offset
        assert cl_min > 0 and cl_min % SEG == 0
        assert not (cfg.commitlog_dir / f"{0:020d}").exists()
        lo = store.get_min_offset_in_queue("Ret", 0)
        assert lo > 0

        r = store.get_message("Ret", 0, 0, 32)
        assert r.status == GetMessageStatus.OFFSET_TOO_SMALL
        assert r.next_begin_offset == lo == r.min_offset
        r = store.get_message("Ret", 0, lo, 32)
        assert r.status == GetMessageStatus.FOUND and r.queue_offsets[0] == lo
        first = records.decode_record(r.messages[0])
        assert first.physical_offset >= cl_min and first.body == bytes([lo]) * 1500
        # the unit just below the minimum pointed into the deleted segment
        prev = store.find_consume_queue("Ret", 0, create=False).get_unit(lo - 1)
        assert prev is None or prev[0] < cl_min


# =====================================================================================================
# index
# =====================================================================================================


@pytest.mark.unit
@pytest.mark.parametrize("cut", [0, 37, 120, 10_000], ids=["all", "most", "few", "none"])
def test_index_truncate_equals_a_file_never_given_the_dropped_entries(tmp_path, cut):
    """Recovery cuts an IndexFile back to a truncated CommitLog: the result is byte for byte the file that only
    ever received the kept entries (slots, chains, header), with 4 slots so that every chain interleaves."""
    from store.index import IndexFile

    def build(path: Path, n: int) -> IndexFile:
        f = IndexFile(path, 4, 400, create=True)
        for i in range(n):
            for key in (f"k{i}", f"k{i % 7}-shared"):
                assert f.put_key(f"T#{key}", 100 + 10 * i, 1_000_000 + 1500 * i)
        return f

    n = 150
    whole = build(tmp_path / "whole", n)
    keep = min(n, cut)
    dropped = whole.truncate(100 + 10 * keep, lambda phy: 1_000_000 + 1500 * ((phy - 100) // 10))
    assert dropped == 2 * (n - keep)
    assert whole.header.index_count == 1 + 2 * keep
    if keep >= 1:
        fresh = build(tmp_path / "fresh", keep)
        assert bytes(whole.mm) == bytes(fresh.mm)
        fresh.close()
    out: list[int] = []
    whole.select_phy_offsets("T#k1-shared", 64, 0, 2**62, out)
    assert out == [100 + 10 * i for i in reversed(range(keep)) if i % 7 == 1]
    whole.close()


@pytest.mark.unit
def test_query_by_key_across_index_files(tmp_path):
    cfg = make_config(tmp_path)
    n = 400
    with running(cfg) as store:
        first_ts_floor = int(time.time() * 1000)
        res = []
        msgs = []
        for i in range(n):
            keys = [f"k{i}", "shared"] if i < 70 else [f"k{i}"]
            m = make_message("Idx", i % 2, f"q{i}", keys=keys)
            msgs.append(m)
            res.append(put_ok(store, m))
        wait_dispatched(store)
        now = int(time.time() * 1000) + 1000
        phys = [r.append.wrote_offset for r in res]

        idx_files = sorted(cfg.index_dir.iterdir())
        names = [p.name for p in idx_files]
        assert len(names) >= 4
        assert all(re.fullmatch(r"\d{17}", x) for x in names)
        size = 40 + 64 * 4 + 256 * 20
        headers = []
        for p in idx_files:
            data = p.read_bytes()
            assert len(data) == size
            headers.append(units.decode_index_header(data))
            entry0 = 40 + 64 * 4
            assert data[entry0 : entry0 + 20] == bytes(20)  # indexCount starts at 1: entry 0 is never used
        total_entries = sum(h.index_count - 1 for h in headers)
        assert total_entries == 2 * n + 70  # UNIQ_KEY + each KEYS entry
        assert all(2 <= h.index_count <= 256 for h in headers)
        assert all(h.index_count == 256 for h in headers[:-1])  # only the newest is not full
        assert headers[0].begin_phy_offset == phys[0]
        assert headers[-1].end_phy_offset == phys[-1]
        for a, b in zip(headers, headers[1:], strict=False):
            assert a.begin_phy_offset <= a.end_phy_offset <= b.begin_phy_offset <= b.end_phy_offset
            assert a.begin_timestamp <= b.begin_timestamp
        assert all(h.hash_slot_count <= 64 for h in headers)

        def query(key, begin=0, end=now, max_num=64):
            q = store.query_message("Idx", key, max_num, begin, end)
            return [records.decode_record(m) for m in q.messages], q

        old, q = query("k5")
        assert [r.body for r in old] == [b"q5"] and old[0].physical_offset == phys[5]
        assert q.index_last_update_phyoffset == phys[-1]
        newest, _ = query(f"k{n - 1}")
        assert [r.body for r in newest] == [f"q{n - 1}".encode()]
        uniq, _ = query(msgs[200].uniq_key)
        assert [r.body for r in uniq] == [b"q200"]

        shared, _ = query("shared", max_num=1000)
        assert len(shared) == 64
        assert {r.body for r in shared} == {f"q{i}".encode() for i in range(70 - 64, 70)}  # newest first

        assert query("k5", begin=0, end=first_ts_floor - 10_000)[0] == []
        assert query(f"k{n - 1}", begin=now + 10_000, end=now + 20_000)[0] == []
        assert query("no-such-key")[0] == []
        assert store.query_message("Other", "k5", 64, 0, now).messages == []


@pytest.mark.unit
def test_offsets_by_time_and_lookups(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        assert store.get_earliest_message_time("T", 0) == -1
        batches = []
        for b in range(3):
            rs = [put_ok(store, make_message("T", 0, f"b{b}m{i}")) for i in range(5)]
            batches.append(rs)
            last = rs[-1].append.store_timestamp
            wait_until(lambda last=last: time.time_ns() // 1_000_000 > last + 5, 2, "the clock to move on")
        wait_dispatched(store)
        ts = [[r.append.store_timestamp for r in rs] for rs in batches]

        assert store.get_earliest_message_time("T", 0) == ts[0][0]
        assert store.get_offset_in_queue_by_time("T", 0, 0) == 0
        assert store.get_offset_in_queue_by_time("T", 0, ts[1][0]) == batches[1][0].append.queue_offset == 5
        between = ts[1][-1] + 1  # after batch 1, before batch 2
        assert store.get_offset_in_queue_by_time("T", 0, between) == 10
        assert store.get_offset_in_queue_by_time("T", 0, between, upper=True) == 9
        assert store.get_offset_in_queue_by_time("T", 0, ts[2][-1] + 100_000) == 14  # clamps to the last
        assert store.get_offset_in_queue_by_time("Nope", 0, 0) == 0
        assert store.get_message_store_timestamp("T", 0, 7) == ts[1][2]

        for rs in batches:
            for r in rs:
                raw = store.look_message_by_offset(r.append.wrote_offset)
                assert raw is not None and len(raw) == r.append.wrote_bytes
                assert bytes(raw) == cl_file_bytes(cfg, r.append.wrote_offset, len(raw))
                assert bytes(store.view_message_by_id(r.msg_ids[0])) == bytes(raw)
        assert store.look_message_by_offset(store.max_phy_offset) is None
        assert store.look_message_by_offset(batches[0][0].append.wrote_offset + 3) is None


# =====================================================================================================
# transactions, ConsumeQueue files
# =====================================================================================================


@pytest.mark.unit
def test_transaction_records_per_type(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        put_ok(store, make_message("Tx", 0, b"n0", keys="normal0"))
        put_ok(store, make_message("Tx", 0, b"n1", keys="normal1"))
        half = records.TRANSACTION_PREPARED_TYPE
        prepared = put_ok(store, make_message("Tx", 0, b"half", keys="halfkey", sys_flag=half))
        rollback = put_ok(store, make_message("Tx", 0, b"rb", keys="rbkey", sys_flag=records.TRANSACTION_ROLLBACK_TYPE))
        committed = records.TRANSACTION_COMMIT_TYPE
        commit = put_ok(store, make_message("Tx", 0, b"commit", keys="commitkey", sys_flag=committed))
        wait_dispatched(store)

        assert prepared.append.queue_offset == 0 and rollback.append.queue_offset == 0
        assert commit.append.queue_offset == 2
        for res in (prepared, rollback):
            rec = records.decode_record(cl_file_bytes(cfg, res.append.wrote_offset, res.append.wrote_bytes))
            assert rec.queue_offset == 0
        assert records.decode_record(store.look_message_by_offset(prepared.append.wrote_offset)).sys_flag & 0xC == 0x4

        assert store.get_max_offset_in_queue("Tx", 0) == 3
        got = read_queue(store, "Tx", 0)
        assert [(q, r.body) for q, r in got] == [(0, b"n0"), (1, b"n1"), (2, b"commit")]

        now = int(time.time() * 1000) + 1000
        assert [records.decode_record(m).body for m in store.query_message("Tx", "halfkey", 64, 0, now).messages] == [
            b"half"
        ]
        assert store.query_message("Tx", "rbkey", 64, 0, now).messages == []
        assert len(store.query_message("Tx", "commitkey", 64, 0, now).messages) == 1


@pytest.mark.unit
def test_consume_queue_files_on_disk(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        res = []
        for i in range(60):
            tag = MIN_INT_TAG if i == 7 else ("TagA" if i % 2 == 0 else None)
            res.append((tag, put_ok(store, make_message("CqT", 3, f"c{i}", tags=tag))))
        wait_dispatched(store)
        store.find_consume_queue("CqT", 3).flush()

        qdir = cfg.store_path_root_dir / "consumequeue" / "CqT" / "3"
        assert sorted(p.name for p in qdir.iterdir()) == [f"{0:020d}", f"{1000:020d}"]
        raw = (qdir / f"{0:020d}").read_bytes() + (qdir / f"{1000:020d}").read_bytes()
        assert len(raw) == 2000
        for i, (tag, r) in enumerate(res):
            phy, size, tags_code = struct.unpack_from(">qiq", raw, i * 20)
            assert phy == r.append.wrote_offset and size == r.append.wrote_bytes
            assert tags_code == (java_hash(tag) if tag else 0)
        assert java_hash(MIN_INT_TAG) == -(2**31)
        assert raw[7 * 20 + 12 : 7 * 20 + 20] == bytes.fromhex("FFFFFFFF80000000")  # sign-extended
        assert raw[60 * 20 :] == bytes(len(raw) - 60 * 20)
        r = store.get_message("CqT", 3, 0, 32, tag_codes={-(2**31)})
        assert r.queue_offsets == [7]
        r = store.get_message("CqT", 3, 45, 32)  # a read starting in the first file
        assert r.queue_offsets[0] == 45 and r.status == GetMessageStatus.FOUND


# =====================================================================================================
# lifecycle
# =====================================================================================================


@pytest.mark.integration
def test_second_store_on_same_dir_is_refused(tmp_path):
    cfg = make_config(tmp_path)
    root = str(cfg.store_path_root_dir)
    with running(cfg) as store:
        put_ok(store, make_message("L", 0, b"x"))
        with pytest.raises(StoreLockedError, match=re.escape(root)):
            MessageStore(make_config(tmp_path)).start()

        code = (
            "import sys; from pathlib import Path\n"
            "from store.config import MessageStoreConfig\n"
            "from store.message_store import MessageStore\n"
            "cfg = MessageStoreConfig(storePathRootDir=Path(sys.argv[1]), mappedFileSizeCommitLog=65536)\n"
            "MessageStore(cfg).start()\n"
        )
        # refused rather than waiting for the lock, which this store holds until the end of the block
        proc = subprocess.run([sys.executable, "-c", code, root], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "StoreLockedError" in proc.stderr and root in proc.stderr
        # the running store is unaffected
        put_ok(store, make_message("L", 0, b"y"))
    # released at shutdown
    with running(make_config(tmp_path)) as again:
        assert again.get_max_offset_in_queue("L", 0) == 2


@pytest.mark.unit
def test_dispatch_lag_and_runtime_info(tmp_path, monkeypatch):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        gate = threading.Event()

        class Gate:  # a CommitLogDispatcher ahead of the others: dispatch is held up until the test lets it go
            def dispatch(self, req):
                gate.wait(30)

        monkeypatch.setattr(store.reput, "dispatchers", [Gate(), *store.reput.dispatchers])
        try:
            puts = [put_ok(store, make_message("Lag", 0, b"z" * 500)) for _ in range(50)]
            total = sum(r.append.wrote_bytes for r in puts)
            assert store.dispatch_behind_bytes == total
            info = store.runtime_info()
            assert info["dispatchBehindBytes"] == str(total)
            assert store.get_max_offset_in_queue("Lag", 0) == 0  # not readable yet
        finally:
            gate.set()
        wait_dispatched(store)
        assert store.dispatch_behind_bytes == 0
        assert store.get_max_offset_in_queue("Lag", 0) == 50
        info = store.runtime_info()
        for key in (
            "commitLogMinOffset",
            "commitLogMaxOffset",
            "dispatchBehindBytes",
            "flushedOffset",
            "consumeQueueCount",
            "indexFileCount",
        ):
            assert key in info
        assert info["commitLogMinOffset"] == "0"
        assert info["commitLogMaxOffset"] == str(store.max_phy_offset) == str(total)
        assert info["dispatchBehindBytes"] == "0"
        assert info["consumeQueueCount"] == "1"
        assert info["indexFileCount"] == "1"


@pytest.mark.unit
def test_normal_restart(tmp_path):
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        first = [put_ok(store, make_message("Re", q, f"a{q}-{i}", keys=f"ka{i}")) for i in range(40) for q in (0, 1)]
    assert not (cfg.store_path_root_dir / "abort").exists()
    assert (cfg.store_path_root_dir / "checkpoint").stat().st_size == 4096

    with running(make_config(tmp_path)) as store:
        assert store.recovery_report.abnormal is False
        assert store.recovery_report.truncated_bytes == 0
        assert (cfg.store_path_root_dir / "abort").exists()
        assert store.get_max_offset_in_queue("Re", 0) == 40
        more = put_ok(store, make_message("Re", 0, "b0"))
        assert more.append.queue_offset == 40
        assert more.append.wrote_offset == first[-1].append.wrote_offset + first[-1].append.wrote_bytes
        wait_dispatched(store)
        got = read_queue(store, "Re", 0)
        assert [r.body for _, r in got] == [f"a0-{i}".encode() for i in range(40)] + [b"b0"]
        assert [q for q, _ in got] == list(range(41))
        assert len(read_queue(store, "Re", 1)) == 40
        hits = store.query_message("Re", "ka3", 64, 0, int(time.time() * 1000) + 1000).messages
        assert sorted(records.decode_record(m).body for m in hits) == [b"a0-3", b"a1-3"]


@pytest.mark.unit
def test_arrival_listener(tmp_path):
    cfg = make_config(tmp_path)
    seen = []
    with running(cfg) as store:
        store.add_arrival_listener(lambda *args: seen.append(args))
        res = [put_ok(store, make_message("Arr", i % 2, f"x{i}", tags="TagA")) for i in range(6)]
        put_ok(store, make_message("Arr", 0, "half", sys_flag=records.TRANSACTION_PREPARED_TYPE))
        wait_until(lambda: sum(len(s[3]) for s in seen) >= 6, 10, "6 arrival notifications")
        wait_dispatched(store)
    # one call per queue for the records one pass dispatched (per record on the reference path); the prepared
    # record is not readable, so no notification
    told = [(topic, qid, nxt - len(codes) + 1 + i, code) for topic, qid, nxt, codes, _ in seen
            for i, code in enumerate(codes)]  # fmt: skip
    assert sorted(told) == sorted(("Arr", i % 2, r.append.queue_offset + 1, TAG_A_HASH) for i, r in enumerate(res))
    newest = {(r.append.queue_offset + 1, i % 2): r.append.store_timestamp for i, r in enumerate(res)}
    for _, qid, nxt, _, store_ts in seen:
        assert store_ts == newest[(nxt, qid)]  # the store time of the call's newest record
    for qid in (0, 1):
        assert [t[2] for t in told if t[1] == qid] == [1, 2, 3]  # in queue order


@pytest.mark.unit
def test_a_removed_arrival_listener_hears_of_no_later_message(tmp_path):
    gone, kept = [], []

    def removed(*args):
        gone.append(args)

    with running(make_config(tmp_path)) as store:
        store.add_arrival_listener(removed)
        store.add_arrival_listener(lambda *args: kept.append(args))
        put_ok(store, make_message("Arr", 0, "first"))
        wait_until(lambda: len(kept) == 1 and len(gone) == 1, 10, "both listeners told of the first message")
        store.remove_arrival_listener(removed)
        put_ok(store, make_message("Arr", 0, "second"))
        wait_until(lambda: len(kept) == 2, 10, "the listener still registered told of the second message")
        assert len(gone) == 1
        store.remove_arrival_listener(removed)  # not registered any more: nothing to do


@pytest.mark.unit
def test_reads_racing_retention_do_not_fail(tmp_path, monkeypatch):
    """A file deleted between a reader's lookup and its copy: the read still completes.

    The interleaving is forced: retention runs inside the reader's file lookup.
    """
    cfg = make_config(tmp_path)
    with running(cfg) as store:
        puts = [put_ok(store, make_message("Race", 0, bytes([i]) * 1500)) for i in range(200)]
        wait_dispatched(store)
        store.clean_expired_files()
        manifest = SegmentManifest(cfg.store_path_root_dir)

        def tier_oldest():
            (e,) = manifest.claim("racer", limit=1, treat_sealed_as_expired=True)
            manifest.mark_tiered(e.base_offset, "racer")
            return e.base_offset

        def retention_inside(queue, base):
            real_find = queue.find
            fired = []

            def find(offset):
                mf = real_find(offset)
                if mf is not None and mf.file_from_offset == base and not fired:
                    fired.append(offset)
                    store.delete_expired_files_manually()  # deletes files while this reader holds one
                return mf

            monkeypatch.setattr(queue, "find", find)
            return fired

        # 1. a CommitLog segment deleted under get_message
        assert tier_oldest() == 0
        fired = retention_inside(store.commitlog.queue, 0)
        r = store.get_message("Race", 0, 0, 4)
        assert fired and store.min_phy_offset == SEG
        assert not (cfg.commitlog_dir / f"{0:020d}").exists()
        # the reader that already held the segment gets its bytes (RocketMQ's reference-counted MappedFile)
        # and the rest of the batch skips what was deleted, as RocketMQ's getMessage does
        lo = store.get_min_offset_in_queue("Race", 0)
        assert r.status == GetMessageStatus.FOUND
        assert r.queue_offsets == [0, lo, lo + 1, lo + 2]
        assert [records.decode_record(m).body for m in r.messages] == [bytes([i]) * 1500 for i in r.queue_offsets]
        monkeypatch.undo()
        r = store.get_message("Race", 0, 0, 4)  # later readers see the deletion
        assert r.status == GetMessageStatus.OFFSET_TOO_SMALL
        assert store.look_message_by_offset(puts[0].append.wrote_offset) is None

        # 2. a ConsumeQueue file deleted under get_message (its units all point below the new minimum)
        assert 0 < lo < 50
        assert tier_oldest() == SEG
        cq = store.find_consume_queue("Race", 0, create=False)
        fired = retention_inside(cq.queue, 0)
        r = store.get_message("Race", 0, lo, 4)
        assert fired and store.min_phy_offset == 2 * SEG
        assert not (cfg.consume_queue_dir / "Race" / "0" / f"{0:020d}").exists()
        assert r.status == GetMessageStatus.MESSAGE_WAS_REMOVING and r.messages == []
        monkeypatch.undo()

        # 3. a segment deleted under look_message_by_offset
        off = puts[store.get_min_offset_in_queue("Race", 0)].append.wrote_offset
        assert off // SEG == 2
        assert tier_oldest() == 2 * SEG
        fired = retention_inside(store.commitlog.queue, 2 * SEG)
        raw = store.look_message_by_offset(off)
        assert fired and store.min_phy_offset == 3 * SEG
        assert raw is not None and records.decode_record(raw).physical_offset == off


@pytest.mark.unit
def test_long_topic_ipv6_store_host_and_batches(tmp_path):
    cfg = make_config(tmp_path, store_host="[::1]:10912")
    long_topic = "L" * 200  # over 127 bytes: the V2 record with a 2-byte topic length
    with running(cfg) as store:
        res = put_ok(store, make_message(long_topic, 0, b"v2", tags="TagA"))
        batch = store.put_message([make_message("Batch", 1, f"b{i}") for i in range(5)])
        assert batch.status == PutMessageStatus.PUT_OK and len(batch.msg_ids) == 5
        assert batch.append.queue_offset == 0 and batch.append.msg_num == 5
        wait_dispatched(store)

        raw = bytes(store.get_message(long_topic, 0, 0, 1).messages[0])
        assert raw[4:8] == bytes.fromhex("DAA320AB")
        rec = records.decode_record(raw)
        assert rec.topic == long_topic and rec.store_host == ("::1", 10912)
        assert rec.sys_flag & records.STOREHOSTADDRESS_V6_FLAG
        assert len(res.msg_ids[0]) == 56
        assert msgid.decode_offset_msg_id(res.msg_ids[0]) == (("::1", 10912), res.append.wrote_offset)
        assert bytes(store.view_message_by_id(res.msg_ids[0])) == raw
        assert (cfg.consume_queue_dir / long_topic / "0" / f"{0:020d}").exists()

        got = read_queue(store, "Batch", 1)
        assert [(q, r.body) for q, r in got] == [(i, f"b{i}".encode()) for i in range(5)]
        off = batch.append.wrote_offset
        for msg_id, (_, r) in zip(batch.msg_ids, got, strict=True):
            assert msgid.decode_offset_msg_id(msg_id)[1] == r.physical_offset == off
            off += r.total_size


@pytest.mark.unit
def test_puts_racing_shutdown_are_refused_cleanly(tmp_path):
    """Writers still putting while the store shuts down get SERVICE_NOT_AVAILABLE, never an exception,
    and every message acknowledged before is there after a restart."""
    cfg = make_config(tmp_path)
    store = MessageStore(cfg).start()
    acked: list[int] = []
    errors: list[BaseException] = []
    go = threading.Event()

    def writer(q: int) -> None:
        i = 0
        try:
            while True:
                r = store.put_message(make_message("Race", q, f"m{q}-{i}"))
                if r.status == PutMessageStatus.SERVICE_NOT_AVAILABLE:
                    return
                assert r.status == PutMessageStatus.PUT_OK, r
                acked.append(q)
                i += 1
                if i == 50:
                    go.set()
        except BaseException as e:  # the assertion is that nothing is raised
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    assert go.wait(10)
    store.shutdown()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), f"writer {t.name} still running after the shutdown"
    assert not errors
    assert store.put_message(make_message("Race", 0, "late")).status == PutMessageStatus.SERVICE_NOT_AVAILABLE
    with MessageStore(cfg) as again:
        # a writer the shutdown beat before its first put has no queue at all (on a loaded machine it happens)
        for q in range(4):
            assert (again.find_consume_queue("Race", q, create=False) is not None) == (q in acked)
        assert sum(len(read_queue(again, "Race", q)) for q in set(acked)) == len(acked)


@pytest.mark.unit
@pytest.mark.parametrize("appended", [5, 12], ids=["same-file", "into-the-next-file"])
def test_min_offset_correction_keeps_units_dispatched_during_the_scan(tmp_path, monkeypatch, appended):
    """The clean pass corrects each queue's min offset after a deletion while the dispatch thread appends.
    A queue whose units all point below the new CommitLog minimum gets new units in the middle of that scan:
    they must stay consumable (min = the first of them), not be skipped until a restart."""
    from store import consume_queue as cqm

    cq = cqm.ConsumeQueue(tmp_path, "Idle", 0, 10 * units.CQ_UNIT_SIZE)  # 10 units per file
    for i in range(5):
        cq.put(1_000 + i * 100, 100, 0, i)  # their CommitLog bytes are deleted
    cl_min = 1_000_000
    real, calls = units.decode_cq_unit, []

    def decode_while_dispatching(buf, pos):
        calls.append(pos)
        if len(calls) == 3:  # the dispatcher appends new messages mid-scan
            for i in range(5, 5 + appended):
                assert cq.put(cl_min + (i - 5) * 100, 100, 0, i)
        return real(buf, pos)

    monkeypatch.setattr(cqm.units, "decode_cq_unit", decode_while_dispatching)
    cq.correct_min_offset(cl_min)
    monkeypatch.undo()
    assert cq.max_offset_in_queue == 5 + appended
    assert cq.min_offset_in_queue == 5


@pytest.mark.unit
def test_a_consume_queue_file_size_must_hold_whole_units(tmp_path: Path) -> None:
    from store.consume_queue import ConsumeQueue, ConsumeQueueSizeError
    from store.errors import MQLakeError

    with pytest.raises(ConsumeQueueSizeError, match="30 is not a multiple of 20") as e:
        ConsumeQueue(tmp_path, "T", 0, 30)
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, ValueError)
    assert ConsumeQueue(tmp_path, "T", 0, 40).file_size == 40


@pytest.mark.unit
def test_flock_held_sees_the_store_lock_and_leaves_it_held(tmp_path):
    root = tmp_path / "store"
    assert not flock_held(root / LOCK_FILE)  # no file: nobody holds it
    lock = StoreLock(root)
    try:
        assert flock_held(root / LOCK_FILE)
        assert flock_held(root / LOCK_FILE)  # the first probe left no lock of its own behind
        with pytest.raises(StoreLockedError):  # nor dropped the holder's
            StoreLock(root)
    finally:
        lock.release()
    assert not flock_held(root / LOCK_FILE)
