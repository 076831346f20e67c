"""Damaged or foreign files in the store dir: recovery, or a clear error naming the file and offset.

Never a silent loss of valid earlier records.
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from store.format import hashing, records
from store.mapped_file import StoreFileError
from store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from store.recovery import StoreCorruptError
from tests.helpers import make_config, make_message, read_queue, wait_dispatched

pytestmark = pytest.mark.unit

SEG = 64 * 1024


@dataclass
class Sent:
    phy: int
    size: int
    body: bytes
    queue_id: int
    queue_offset: int
    tags: str
    key: str


def populate(cfg, n: int, *, topic: str = "Bad", queues: int = 1, body_size: int = 600) -> list[Sent]:
    """Start a store, put ``n`` messages, shut it down cleanly; return what was written where."""
    out = []
    store = MessageStore(cfg).start()
    try:
        for i in range(n):
            q = i % queues
            body = (f"{i:05d}-".encode() * (body_size // 6 + 1))[:body_size]
            tags = ("TagA", "TagB", "TagC")[i % 3]
            key = f"key-{i}"
            res = store.put_message(make_message(topic, q, body, tags=tags, keys=key))
            assert res.status == PutMessageStatus.PUT_OK
            out.append(
                Sent(res.append.wrote_offset, res.append.wrote_bytes, body, q, res.append.queue_offset, tags, key)
            )
        wait_dispatched(store)
    finally:
        store.shutdown()
    assert not (cfg.store_path_root_dir / "abort").exists()
    return out


def seg_path(cfg, offset: int) -> Path:
    return cfg.commitlog_dir / f"{offset - offset % cfg.mapped_file_size_commit_log:020d}"


def overwrite(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def read_at(path: Path, pos: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def snapshot(root: Path, *, skip=("lock",)) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def crash_marker(cfg) -> None:
    (cfg.store_path_root_dir / "abort").touch()


def assert_serves(store: MessageStore, sent: list[Sent], topic: str = "Bad") -> None:
    """Every message in ``sent`` is served at its queue offset, in order, and nothing else is."""
    for q in sorted({s.queue_id for s in sent}):
        want = [s for s in sent if s.queue_id == q]
        got = read_queue(store, topic, q)
        assert [qo for qo, _ in got] == [s.queue_offset for s in want]
        assert [r.body for _, r in got] == [s.body for s in want]
        assert [r.physical_offset for _, r in got] == [s.phy for s in want]
        assert store.get_max_offset_in_queue(topic, q) == len(want)


def start_fails(cfg, exc_type):
    store = MessageStore(cfg)
    with pytest.raises(exc_type) as info:
        store.start()
    return str(info.value)


# =====================================================================================================
# file names and sizes
# =====================================================================================================


@pytest.mark.parametrize("delta", [+1, -4096], ids=["longer", "shorter"])
def test_commitlog_segment_of_wrong_size(tmp_path, delta):
    cfg = make_config(tmp_path)
    populate(cfg, 150)  # > 1 segment
    bad = cfg.commitlog_dir / f"{0:020d}"
    with open(bad, "r+b") as f:
        f.truncate(SEG + delta)
    before = snapshot(cfg.store_path_root_dir)
    msg = start_fails(cfg, StoreFileError)
    assert str(bad) in msg and str(SEG + delta) in msg
    # nothing was changed, and the failed start released the lock (same error again, not "locked")
    assert snapshot(cfg.store_path_root_dir) == before
    assert start_fails(cfg, StoreFileError) == msg


def test_truncated_last_segment_is_a_wrong_size_error(tmp_path):
    cfg = make_config(tmp_path)
    sent = populate(cfg, 150)
    last = seg_path(cfg, sent[-1].phy)
    assert last.name != f"{0:020d}"
    keep = sent[-1].phy % SEG + sent[-1].size  # even cut right after the last record: the size rule holds
    with open(last, "r+b") as f:
        f.truncate(keep)
    msg = start_fails(cfg, StoreFileError)
    assert str(last) in msg and str(keep) in msg and str(SEG) in msg


@pytest.mark.parametrize("name", ["0000000000000000000", "00000000000000065536.bak", "notes.txt"])
def test_foreign_file_in_commitlog_dir(tmp_path, name):
    cfg = make_config(tmp_path)
    populate(cfg, 5)
    stray = cfg.commitlog_dir / name
    stray.write_bytes(b"x" * SEG)
    msg = start_fails(cfg, StoreFileError)
    assert str(stray) in msg and "20-digit" in msg


def test_commitlog_segments_not_contiguous(tmp_path):
    cfg = make_config(tmp_path)
    populate(cfg, 150)
    names = sorted(p.name for p in cfg.commitlog_dir.iterdir())
    moved = cfg.commitlog_dir / names[-1]
    target = cfg.commitlog_dir / f"{int(names[-1]) + SEG:020d}"
    moved.rename(target)
    msg = start_fails(cfg, StoreFileError)
    assert str(target) in msg


def test_index_file_of_wrong_size(tmp_path):
    cfg = make_config(tmp_path)
    populate(cfg, 20)
    files = sorted(cfg.index_dir.iterdir())
    assert files
    bad = files[-1]
    with open(bad, "ab") as f:
        f.write(b"\0" * 7)
    msg = start_fails(cfg, StoreFileError)
    assert str(bad) in msg
    assert start_fails(cfg, StoreFileError) == msg


@pytest.mark.parametrize("damage", ["short", "gap", "missing-last", "missing-dir", "empty-dir"])
@pytest.mark.parametrize("crashed", [False, True], ids=["clean-exit", "abort-file"])
def test_damaged_consume_queue_is_rebuilt_and_logged(tmp_path, caplog, damage, crashed):
    """ConsumeQueue files are derived data: a short file, a gap, a last file or a whole queue directory gone while
    the store was stopped are rebuilt from the CommitLog at the next start, whether or not that stop was clean,
    and the rebuild is logged naming the queue and its offsets."""
    cfg = make_config(tmp_path)
    sent = populate(cfg, 240, queues=2)  # 120 per queue: three ConsumeQueue files of 50 units each
    qdir = cfg.consume_queue_dir / "Bad" / "0"
    files = sorted(qdir.iterdir())
    assert len(files) == 3
    if damage == "short":
        with open(files[1], "r+b") as f:
            f.truncate(999)
    elif damage == "gap":
        files[1].unlink()
    elif damage == "missing-last":
        files[2].unlink()
    else:
        for f in files:
            f.unlink()
        if damage == "missing-dir":
            qdir.rmdir()
    if crashed:
        crash_marker(cfg)
    caplog.set_level("INFO", logger="store")
    with MessageStore(cfg) as store:
        assert_serves(store, sent)
    rebuilt = [r.getMessage() for r in caplog.records if "ConsumeQueue Bad-0 rebuilt" in r.getMessage()]
    first = {"short": 50, "gap": 50, "missing-last": 100, "missing-dir": 0, "empty-dir": 0}[damage]
    assert rebuilt == [f"ConsumeQueue Bad-0 rebuilt from the CommitLog: queue offsets {first} to 120"]
    assert not [r for r in caplog.records if "ConsumeQueue Bad-1" in r.getMessage()]
    caplog.clear()
    with MessageStore(cfg) as store:  # a sound store rebuilds nothing
        assert_serves(store, sent)
    assert not [r for r in caplog.records if "rebuil" in r.getMessage()]


# =====================================================================================================
# torn tail
# =====================================================================================================


@pytest.mark.parametrize("crashed", [True, False], ids=["abort-file", "clean-exit"])
@pytest.mark.parametrize(
    "damage,back",
    [("garbage", 1), ("zeros", 1), ("garbage", 3)],
    ids=["garbage-last", "unfinished-last", "garbage-3rd-last"],
)
def test_torn_tail_is_cut_and_quarantined(tmp_path, crashed, damage, back):
    cfg = make_config(tmp_path)
    sent = populate(cfg, 120, queues=2)
    victim = sent[-back]
    assert all(s.phy // SEG == victim.phy // SEG for s in sent[-back:])
    path = seg_path(cfg, victim.phy)
    pos = victim.phy % SEG
    end = sent[-1].phy % SEG + sent[-1].size  # end of the data in the segment
    if damage == "garbage":
        cut = random.Random(7).randbytes(victim.size - 16)
        overwrite(path, pos + 8, cut)  # TOTALSIZE and MAGIC still look right
    else:
        overwrite(path, pos + victim.size // 2, bytes(victim.size - victim.size // 2))  # the write never finished
    cut_bytes = read_at(path, pos, end - pos).rstrip(b"\0")
    if crashed:
        crash_marker(cfg)

    with MessageStore(cfg) as store:
        rep = store.recovery_report
        assert rep.abnormal is crashed
        assert rep.process_offset == victim.phy
        assert store.max_phy_offset == victim.phy
        assert_serves(store, sent[:-back])  # every record before the damage, nothing from it on
        for q in (0, 1):
            n = len([s for s in sent[:-back] if s.queue_id == q])
            assert store.get_message("Bad", q, n, 32).status == GetMessageStatus.OFFSET_OVERFLOW_ONE
        for s in sent[-back:]:
            assert store.look_message_by_offset(s.phy) is None
        now = int(time.time() * 1000) + 1000
        for s in sent[-back - 5 : -back]:
            assert len(store.query_message("Bad", s.key, 64, 0, now).messages) == 1

        # the cut bytes are kept under quarantine/
        assert rep.quarantined_to is not None
        q = Path(rep.quarantined_to)
        assert q.parent == cfg.store_path_root_dir / "quarantine"
        kept = q.read_bytes()
        assert rep.truncated_bytes == len(kept) >= len(cut_bytes)
        assert kept[: len(cut_bytes)] == cut_bytes and not any(kept[len(cut_bytes) :])

        # they are gone from the segment, and the next put takes their place
        assert read_at(path, pos, end - pos) == bytes(end - pos)
        res = store.put_message(make_message("Bad", victim.queue_id, b"again"))
        assert res.append.wrote_offset == victim.phy and res.append.queue_offset == victim.queue_offset
        wait_dispatched(store)
        r = store.get_message("Bad", victim.queue_id, victim.queue_offset, 32)
        assert [records.decode_record(m).body for m in r.messages] == [b"again"]
    assert not (cfg.store_path_root_dir / "abort").exists()


# =====================================================================================================
# damage in the middle of the log
# =====================================================================================================


@pytest.mark.parametrize("crashed", [True, False], ids=["abort-file", "clean-exit"])
def test_corruption_in_a_sealed_segment_refuses_to_start(tmp_path, crashed):
    cfg = make_config(tmp_path)
    sent = populate(cfg, 400, body_size=700)  # ~ 5 segments
    data_segments = sorted({s.phy // SEG for s in sent})
    assert len(data_segments) >= 4
    # a clean exit scans the last segments only (RocketMQ's 3rd-last rule); a crash scans from the checkpoint
    victim_seg = data_segments[-2] if not crashed else data_segments[1]
    in_seg = [s for s in sent if s.phy // SEG == victim_seg]
    victim = in_seg[len(in_seg) // 2]
    path = seg_path(cfg, victim.phy)
    pos = victim.phy % SEG
    assert struct.unpack_from(">i", read_at(path, pos + 84, 4))[0] == len(victim.body)  # IPv4: body at 88
    overwrite(path, pos + 88 + 10, b"\xde\xad\xbe\xef")  # the body CRC no longer matches
    if crashed:
        crash_marker(cfg)
    commitlog_before = snapshot(cfg.commitlog_dir)
    cq_before = snapshot(cfg.consume_queue_dir)
    all_before = snapshot(cfg.store_path_root_dir)

    msg = start_fails(cfg, StoreCorruptError)
    assert str(path) in msg
    assert f"position {pos}" in msg and str(victim.phy) in msg
    assert snapshot(cfg.commitlog_dir) == commitlog_before
    assert snapshot(cfg.consume_queue_dir) == cq_before
    if not crashed:
        assert snapshot(cfg.store_path_root_dir) == all_before
    assert (cfg.store_path_root_dir / "abort").exists() is crashed
    assert not (cfg.store_path_root_dir / "quarantine").exists()
    # the lock was released: a second attempt reports the same damage
    assert start_fails(cfg, StoreCorruptError) == msg


# =====================================================================================================
# ConsumeQueue and checkpoint damage
# =====================================================================================================


def _flip_phy(unit: bytes) -> bytes:
    phy, size, tags = struct.unpack(">qiq", unit)
    return struct.pack(">qiq", phy + 1, size, tags)


def _flip_size(unit: bytes) -> bytes:
    phy, size, tags = struct.unpack(">qiq", unit)
    return struct.pack(">qiq", phy, size - 4, tags)


def _invert(unit: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in unit)


def _swap_with_next(unit: bytes) -> bytes:
    return unit  # replaced by the caller: two units exchanged (each points at a real, wrong record)


@pytest.mark.parametrize("crashed", [True, False], ids=["abort-file", "clean-exit"])
@pytest.mark.parametrize(
    "unit_no,damage",
    [(55, _invert), (55, _flip_phy), (57, _flip_size), (52, _swap_with_next), (12, _flip_phy)],
    ids=["invert", "phy+1", "size", "swapped", "first-file"],
)
def test_corrupted_consume_queue_unit_is_rebuilt(tmp_path, crashed, unit_no, damage):
    cfg = make_config(tmp_path)
    sent = populate(cfg, 70, queues=1)
    qdir = cfg.consume_queue_dir / "Bad" / "0"
    assert sorted(p.name for p in qdir.iterdir()) == [f"{0:020d}", f"{1000:020d}"]
    path = qdir / f"{unit_no * 20 // 1000 * 1000:020d}"
    pos = unit_no * 20 % 1000
    unit = read_at(path, pos, 20)
    assert struct.unpack(">qiq", unit)[:2] == (sent[unit_no].phy, sent[unit_no].size)
    if damage is _swap_with_next:
        nxt = read_at(path, pos + 20, 20)
        overwrite(path, pos, nxt + unit)
    else:
        overwrite(path, pos, damage(unit))
    if crashed:
        crash_marker(cfg)

    with MessageStore(cfg) as store:
        if damage is not _invert:  # an inverted unit has a negative offset: ConsumeQueue.recover stops before it
            assert store.recovery_report.cq_units_dropped > 0
        assert_serves(store, sent)
        cq = store.find_consume_queue("Bad", 0, create=False)
        for s in sent:
            assert cq.get_unit(s.queue_offset) == (s.phy, s.size, hashing.java_string_hash(s.tags))
        res = store.put_message(make_message("Bad", 0, b"next"))
        assert res.append.queue_offset == len(sent)


@pytest.mark.parametrize("variant", ["random", "far-future", "zero"])
def test_corrupted_checkpoint_still_recovers_everything(tmp_path, variant):
    cfg = make_config(tmp_path)
    sent = populate(cfg, 300, queues=3)
    cp = cfg.store_path_root_dir / "checkpoint"
    if variant == "random":
        data = random.Random(11).randbytes(4096)
    elif variant == "far-future":
        data = struct.pack(">qqq", 2**62, 2**62, 2**62) + bytes(4096 - 24)
    else:
        data = bytes(4096)
    cp.write_bytes(data)
    crash_marker(cfg)

    with MessageStore(cfg) as store:
        assert store.recovery_report.abnormal
        assert_serves(store, sent)
        now = int(time.time() * 1000) + 1000
        for s in sent[::37]:
            hits = store.query_message("Bad", s.key, 64, 0, now).messages
            assert [records.decode_record(m).body for m in hits] == [s.body]


@pytest.mark.parametrize(
    "variant",
    [
        "random",
        "far-future",
    ],
)
def test_corrupted_checkpoint_after_crash_that_lost_consume_queue_tail(tmp_path, variant):
    """The crash lost unflushed ConsumeQueue pages and the checkpoint is garbage: rebuild from the log."""
    cfg = make_config(tmp_path)
    sent = populate(cfg, 300, queues=3)
    # the ConsumeQueue pages past unit 20 of every queue never reached the disk
    for q in range(3):
        qdir = cfg.consume_queue_dir / "Bad" / str(q)
        for p in sorted(qdir.iterdir()):
            base = int(p.name)
            raw = bytearray(p.read_bytes())
            for i in range(len(raw) // 20):
                if base // 20 + i >= 20:
                    raw[i * 20 : i * 20 + 20] = bytes(20)
            p.write_bytes(bytes(raw))
    cp = cfg.store_path_root_dir / "checkpoint"
    if variant == "random":
        cp.write_bytes(random.Random(5).randbytes(4096))
    else:
        cp.write_bytes(struct.pack(">qqq", 2**62, 2**62, 2**62) + bytes(4096 - 24))
    crash_marker(cfg)

    with MessageStore(cfg) as store:
        assert_serves(store, sent)
