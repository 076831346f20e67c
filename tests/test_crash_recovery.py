"""Crash recovery with real processes: a writer child is SIGKILLed mid-stream and the store is reopened.

The child (tests/store_writer_child.py) logs every acknowledged message to a side file after its put
returned PUT_OK; the parent kills it, optionally damages or drops the CommitLog tail the way a crash
can, reopens the store (abort file present -> abnormal recovery) and checks the result against both the
acknowledgement log and an independent scan of the files with ``store.format``.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from store.checkpoint import abort_file
from store.config import FlushDiskType, MessageStoreConfig
from store.format import hashing, properties, records, units
from store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from tests.helpers import make_config, make_message, wait_dispatched, wait_until

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("store_writer_child.py")
TOPIC = "CrashTopic"
QUEUES = 4


# ---------------------------------------------------------------------------------------------------------
# the writer child and its acknowledgement log
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ack:
    key: str
    queue_id: int
    queue_offset: int
    phy: int
    size: int
    body: bytes


@dataclass
class AckLog:
    acks: list[Ack] = field(default_factory=list)
    flushes: list[tuple[int, int]] = field(default_factory=list)  # (flushed offset, acks logged before it)
    queries: dict[str, set[int]] = field(default_factory=dict)
    query_done: bool = False
    held: bool = False
    acks_after_query: int = 0


def read_ack_log(path: Path) -> AckLog:
    out = AckLog()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return out
    lines = data.split(b"\n")[:-1]  # a last line without its newline is incomplete
    for raw in lines:
        parts = raw.decode().split(" ")
        if parts[0] == "A":
            out.acks.append(Ack(parts[1], int(parts[2]), int(parts[3]), int(parts[4]), int(parts[5]),
                                bytes.fromhex(parts[6])))  # fmt: skip
            if out.query_done:
                out.acks_after_query += 1
        elif parts[0] == "F":
            out.flushes.append((int(parts[1]), len(out.acks)))
        elif parts[0] == "Q":
            out.queries[parts[1]] = {int(x) for x in parts[2].split(",") if x} if len(parts) > 2 else set()
        elif parts[0] == "QDONE":
            out.query_done = True
        elif parts[0] == "HOLD":
            out.held = True
    return out


class Writer:
    """The child process; ``wait_for(pred)`` polls the acknowledgement log until ``pred(log)`` holds."""

    def __init__(self, tmp_path: Path, cfg: MessageStoreConfig, **spec) -> None:
        self.ack_path = tmp_path / "acks.log"
        self.err_path = tmp_path / "child.err"
        spec = {"config": cfg.model_dump(mode="json", by_alias=True), "ack_log": str(self.ack_path),
                "topic": TOPIC, "queues": QUEUES, **spec}  # fmt: skip
        self.started_ms = int(time.time() * 1000)
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], stdout=err, stderr=err)

    def wait_for(self, pred, what: str, timeout: float = 40.0) -> AckLog:
        def check():
            if self.proc.poll() is not None:
                raise AssertionError(f"writer exited with {self.proc.returncode}: {self.err_path.read_text()}")
            log = read_ack_log(self.ack_path)
            return log if pred(log) else None

        return wait_until(check, timeout, what)

    def frozen_when(self, pred, what: str, timeout: float = 40.0) -> None:
        """Freeze the writer (SIGSTOP) at the first check where ``pred()`` holds, so that the state it saw is the
        one a :meth:`kill` lands in; between checks the writer runs on (SIGCONT)."""

        def check() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"writer exited with {self.proc.returncode}: {self.err_path.read_text()}")
            self.proc.send_signal(signal.SIGSTOP)
            if pred():
                return True
            self.proc.send_signal(signal.SIGCONT)
            return False

        wait_until(check, timeout, what)

    def kill(self) -> AckLog:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=20) == -signal.SIGKILL
        return read_ack_log(self.ack_path)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)


@pytest.fixture
def writer_factory(tmp_path):
    writers: list[Writer] = []

    def factory(cfg: MessageStoreConfig, **spec) -> Writer:
        w = Writer(tmp_path, cfg, **spec)
        writers.append(w)
        return w

    yield factory
    for w in writers:
        w.close()


# ---------------------------------------------------------------------------------------------------------
# independent views of the files
# ---------------------------------------------------------------------------------------------------------
def segment_files(directory: Path) -> list[Path]:
    """The segments of a log directory (20-digit names; not an interrupted preallocation's ``.tmp``)."""
    return sorted(p for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit())


def scan_commitlog(cfg: MessageStoreConfig) -> tuple[dict[int, records.MessageRecord], int]:
    """Every valid record from the first segment on, decoded from the files; and the end of the valid data."""
    by_offset: dict[int, records.MessageRecord] = {}
    files = segment_files(cfg.commitlog_dir)
    end = int(files[0].name) if files else 0
    for p in files:
        data = p.read_bytes()
        base, pos = int(p.name), 0
        if base != end:
            break
        while True:
            res = records.check_record(data, pos, check_crc=True)
            if res.blank:
                pos = len(data)
                break
            if not res.ok or res.size <= 0:
                break
            by_offset[base + pos] = records.decode_record(data, pos)
            pos += res.size
        end = base + pos
        if pos < len(data):
            break
    return by_offset, end


def cq_units_on_disk(cfg: MessageStoreConfig, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    qdir = cfg.consume_queue_dir / topic / str(queue_id)
    if not qdir.exists():
        return []
    data = b"".join(p.read_bytes() for p in segment_files(qdir))
    on_disk = []
    for unit in units.iter_cq_units(data):
        if unit[1] == 0:
            break
        on_disk.append(unit)
    return on_disk


def index_headers(cfg: MessageStoreConfig) -> dict[str, units.IndexHeader]:
    if not cfg.index_dir.exists():
        return {}
    return {p.name: units.decode_index_header(p.read_bytes()) for p in sorted(cfg.index_dir.iterdir())}


def record_keys(rec: records.MessageRecord) -> list[str]:
    return properties.split_keys(rec.keys) + ([rec.uniq_key] if rec.uniq_key else [])


def query_offsets(store: MessageStore, topic: str, key: str) -> set[int]:
    res = store.query_message(topic, key, 64, 0, 2**62)
    return {records.read_physical_offset(m, 0) for m in res.messages}


def assert_store_consistent(store: MessageStore, *, strict_index: bool = True) -> dict[int, records.MessageRecord]:
    """ConsumeQueue and IndexFile agree with the CommitLog as the files hold it; returns the scanned records."""
    cfg = store.config
    by_offset, end = scan_commitlog(cfg)
    assert end == store.max_phy_offset, "the store's max offset is not the end of the valid data on disk"
    by_queue: dict[tuple[str, int], list[records.MessageRecord]] = {}
    for rec in by_offset.values():
        assert rec.physical_offset in by_offset
        by_queue.setdefault((rec.topic, rec.queue_id), []).append(rec)
    for (topic, qid), recs in by_queue.items():
        offsets = sorted(r.queue_offset for r in recs)
        assert offsets == list(range(len(recs))), f"{topic}-{qid}: duplicate or missing queue offsets in the log"
        on_disk = cq_units_on_disk(cfg, topic, qid)
        assert len(on_disk) == len(recs) == store.get_max_offset_in_queue(topic, qid), f"{topic}-{qid}"
        for i, (phy, size, tags) in enumerate(on_disk):
            rec = by_offset.get(phy)
            assert rec is not None, f"{topic}-{qid} unit {i} points at {phy}, which is not a record"
            assert (rec.topic, rec.queue_id, rec.queue_offset) == (topic, qid, i)
            assert size == rec.total_size and tags == hashing.tags_code(rec.tags)
    assert sum(len(v) for v in by_queue.values()) == len(by_offset)
    # every key of every record is found by a query, at the record's offset
    for phy, rec in by_offset.items():
        for key in record_keys(rec):
            assert phy in query_offsets(store, rec.topic, key), f"key {key} of the record at {phy} is not found"
    if strict_index:
        # and every index entry is one of those keys (nothing points into a cut-off tail)
        hashes = {phy: {hashing.index_key_hash(hashing.index_key(r.topic, k)) for k in record_keys(r)}
                  for phy, r in by_offset.items()}  # fmt: skip
        for f in store.index.files:
            for n in range(1, f.header.index_count):
                key_hash, phy, _diff, _prev = units.read_index_entry(f.mm, f.hash_slot_num, n)
                assert phy in by_offset, f"{f.path} entry {n} points at {phy}, which is not a record"
                assert key_hash in hashes[phy], f"{f.path} entry {n}: hash is not a key of the record at {phy}"
    return by_offset


def assert_acked_readable(store: MessageStore, acks: list[Ack]) -> None:
    for a in acks:
        res = store.get_message(TOPIC, a.queue_id, a.queue_offset, 1)
        assert res.status == GetMessageStatus.FOUND, f"acked {a.key} at {a.queue_id}/{a.queue_offset}: {res.status}"
        assert res.queue_offsets == [a.queue_offset]
        rec = records.decode_record(res.messages[0])
        assert (rec.body, rec.keys, rec.physical_offset) == (a.body, a.key, a.phy), f"acked {a.key} differs"
        assert a.phy in query_offsets(store, TOPIC, a.key), f"acked {a.key} is not found by key"


def zero_commitlog_after(cfg: MessageStoreConfig, offset: int) -> int:
    """The OS lost every CommitLog page after ``offset``: zero those bytes on disk; returns non-zero bytes lost."""
    lost = 0
    for p in segment_files(cfg.commitlog_dir):
        base = int(p.name)
        size = p.stat().st_size
        if base + size <= offset:
            continue
        start = max(0, offset - base)
        with open(p, "r+b") as f:
            f.seek(start)
            lost += sum(1 for b in f.read(size - start) if b)
            f.seek(start)
            f.write(bytes(size - start))
    return lost


def reopen(cfg: MessageStoreConfig) -> MessageStore:
    assert abort_file(cfg.store_path_root_dir).exists(), "a killed store must leave its abort file"
    store = MessageStore(cfg).start()
    assert store.recovery_report.abnormal is True and store.last_exit_ok is False
    return store


@contextlib.contextmanager
def clean_restart(cfg: MessageStoreConfig) -> Iterator[MessageStore]:
    """Start the store after a clean shutdown: it must take the normal recovery path."""
    store = MessageStore(cfg).start()
    try:
        assert store.recovery_report.abnormal is False and store.last_exit_ok is True
        yield store
    finally:
        store.shutdown()


def crash_config(tmp_path: Path, flush: FlushDiskType, **overrides) -> MessageStoreConfig:
    return make_config(tmp_path, flush_disk_type=flush, **overrides)


def append_one_per_queue(store: MessageStore, tag: str) -> list[tuple[int, int, int, bytes]]:
    """Put a message into every queue; returns (queue, queue offset, phy offset, body)."""
    out = []
    for q in range(QUEUES):
        expect = store.get_max_offset_in_queue(TOPIC, q)
        body = f"after-{tag}-{q}".encode()
        res = store.put_message(make_message(TOPIC, q, body, tags="after", keys=f"after-{tag}-{q}"))
        assert res.status == PutMessageStatus.PUT_OK
        assert res.append.queue_offset == expect, "queue offsets must continue where the recovered queue ends"
        out.append((q, expect, res.append.wrote_offset, body))
    wait_dispatched(store)
    for q, qoff, _phy, body in out:
        got = store.get_message(TOPIC, q, qoff, 1)
        assert got.status == GetMessageStatus.FOUND and records.decode_record(got.messages[0]).body == body
    return out


# ---------------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------------
def test_sync_flush_crash_loses_no_acknowledged_message(tmp_path, writer_factory):
    cfg = crash_config(tmp_path, FlushDiskType.SYNC_FLUSH)
    w = writer_factory(cfg, threads=4)
    w.wait_for(lambda log: len(log.acks) >= 1500, "1500 acknowledged messages")
    log = w.kill()
    acks = log.acks
    assert len({a.key for a in acks}) == len(acks) >= 1500
    assert len(segment_files(cfg.commitlog_dir)) > 3, "the run must roll over several segments"
    # SYNC_FLUSH acknowledged only what was fsynced; the OS may lose everything after the last ack.
    last_acked_end = max(a.phy + a.size for a in acks)
    zero_commitlog_after(cfg, last_acked_end)

    store = reopen(cfg)
    try:
        assert store.recovery_report.process_offset == store.max_phy_offset >= last_acked_end
        assert_acked_readable(store, acks)
        per_queue = {q: sorted(a.queue_offset for a in acks if a.queue_id == q) for q in range(QUEUES)}
        for q, offs in per_queue.items():
            assert len(offs) == len(set(offs)), f"queue {q}: two acks share a queue offset"
        by_offset = assert_store_consistent(store, strict_index=False)
        assert {a.phy for a in acks} <= set(by_offset)
        append_one_per_queue(store, "sync")
        assert_store_consistent(store, strict_index=False)
    finally:
        store.shutdown()
    assert not abort_file(cfg.store_path_root_dir).exists()


@pytest.mark.parametrize("garbage", ["random-then-header", "torn-record"])
def test_torn_tail_is_cut_and_quarantined(tmp_path, writer_factory, garbage):
    cfg = crash_config(tmp_path, FlushDiskType.SYNC_FLUSH)
    w = writer_factory(cfg, threads=2)
    w.wait_for(lambda log: len(log.acks) >= 400, "400 acknowledged messages")
    acks = w.kill().acks

    by_offset, old_end = scan_commitlog(cfg)
    last = by_offset[max(by_offset)]
    # A header that looks right (size, magic, queue and offsets of the next record) but whose record never
    # finished: the first 60 bytes of a real record, the rest of it missing.
    header = bytearray(records.encode_record(last)[:60])
    struct.pack_into(">q", header, records.QUEUE_OFFSET_POS, last.queue_offset + 1)
    struct.pack_into(">q", header, records.PHYSICAL_OFFSET_POS, old_end)
    rng = random.Random(20240601)
    if garbage == "random-then-header":
        noise = bytearray(rng.randbytes(200))
        struct.pack_into(">i", noise, 4, 0x1234567)  # not a V1/V2/BLANK magic
        junk = bytes(noise) + bytes(header)
    else:
        junk = bytes(header) + rng.randbytes(40)
    seg = cfg.commitlog_dir / units.offset_to_file_name(old_end - old_end % cfg.mapped_file_size_commit_log)
    pos = old_end - int(seg.name)
    junk = junk[: cfg.mapped_file_size_commit_log - pos]
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(junk)

    store = reopen(cfg)
    try:
        report = store.recovery_report
        assert report.process_offset == old_end == store.max_phy_offset
        assert report.truncated_bytes >= len(junk)
        assert Path(report.quarantined_to).read_bytes()[: len(junk)] == junk, "the cut bytes are kept aside"
        assert seg.read_bytes()[pos : pos + len(junk)] == bytes(len(junk)), "the torn tail is gone from the file"
        assert_acked_readable(store, acks)
        assert_store_consistent(store)
        msg = make_message(TOPIC, 0, b"first after the torn tail", keys="after-torn")
        res = store.put_message(msg)
        assert res.status == PutMessageStatus.PUT_OK
        room = cfg.mapped_file_size_commit_log - pos
        if room >= res.append.wrote_bytes + records.END_FILE_MIN_BLANK_LENGTH:
            assert res.append.wrote_offset == old_end, "the next append lands exactly where the valid data ended"
        else:  # no room left in that segment: a blank record fills it and the append opens the next one
            assert res.append.wrote_offset == old_end + room
        wait_dispatched(store)
        append_one_per_queue(store, "torn")
        assert_store_consistent(store)
    finally:
        store.shutdown()
    # and a clean restart on top of the repaired store takes the normal path
    with clean_restart(cfg) as store:
        assert_store_consistent(store)


def test_async_flush_crash_keeps_everything_flushed(tmp_path, writer_factory):
    """SIGKILL mid-stream: the page cache survives, so everything acknowledged is there after recovery."""
    cfg = crash_config(tmp_path, FlushDiskType.ASYNC_FLUSH)
    w = writer_factory(cfg, threads=1, flush_every=100)
    w.wait_for(lambda log: len(log.acks) >= 1500 and log.flushes, "1500 acks and a flush")
    log = w.kill()
    acks = log.acks
    flushed_offset, flushed_acks = log.flushes[-1]
    assert all(a.phy + a.size <= flushed_offset for a in acks[:flushed_acks])

    store = reopen(cfg)
    try:
        assert_acked_readable(store, acks[:flushed_acks])
        present = acked_present(store, acks)
        assert_prefix_per_queue(acks, present)
        assert all(present), "a SIGKILL keeps the page cache: every acknowledged message survives"
        assert_store_consistent(store)
        append_one_per_queue(store, "async")
    finally:
        store.shutdown()


def test_async_flush_os_crash_loses_only_unflushed_tail(tmp_path, writer_factory):
    """The OS loses every CommitLog page after the last flush, while ConsumeQueue and IndexFile already
    point past it: recovery cuts them back to the log, and the survivors are a prefix of what was acked."""
    cfg = crash_config(tmp_path, FlushDiskType.ASYNC_FLUSH)
    w = writer_factory(cfg, threads=1, flush_every=100, hold_after=1550)
    log = w.wait_for(lambda log: log.held, "the writer to stop 50 acks after a flush, fully dispatched")
    log = w.kill()
    acks = log.acks
    cut, flushed_acks = log.flushes[-1]
    assert flushed_acks == 1500 and len(acks) == 1550
    dispatched_end = max(phy + size for q in range(QUEUES) for phy, size, _ in cq_units_on_disk(cfg, TOPIC, q))
    assert dispatched_end == acks[-1].phy + acks[-1].size > cut, "the queues must run ahead of the flushed log"
    assert zero_commitlog_after(cfg, cut) > 0

    store = reopen(cfg)
    try:
        assert store.max_phy_offset == cut
        assert_acked_readable(store, acks[:flushed_acks])
        present = acked_present(store, acks)
        assert_prefix_per_queue(acks, present)
        assert sum(present) == flushed_acks
        for q in range(QUEUES):
            assert store.get_max_offset_in_queue(TOPIC, q) == sum(1 for a in acks[:flushed_acks] if a.queue_id == q)
        # entries of the lost tail may survive in an index file that was full and flushed: not strict
        assert_store_consistent(store, strict_index=False)
        append_one_per_queue(store, "async-lost")
    finally:
        store.shutdown()


def acked_present(store: MessageStore, acks: list[Ack]) -> list[bool]:
    present = []
    for a in acks:
        res = store.get_message(TOPIC, a.queue_id, a.queue_offset, 1)
        present.append(res.status == GetMessageStatus.FOUND and records.decode_record(res.messages[0]).body == a.body)
    return present


def assert_prefix_per_queue(acks: list[Ack], present: list[bool]) -> None:
    """Whatever survived is a prefix of the acknowledged sequence: nothing is missing in the middle."""
    n = sum(present)
    assert present == [True] * n + [False] * (len(acks) - n)
    for q in range(QUEUES):
        in_q = [p for a, p in zip(acks, present, strict=True) if a.queue_id == q]
        assert in_q == sorted(in_q, reverse=True), f"queue {q}: a gap in the recovered messages"


@pytest.mark.parametrize("via_send", [False, True], ids=["put", "send"])
@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
def test_kill_inside_an_append_leaves_no_half_record(tmp_path, writer_factory, flush, via_send):
    """The writer dies in the middle of its 301st append; the record it was writing must not come back.  A put's
    append is the single put's appender (``store.format.appender``) in ASYNC_FLUSH, the CommitLog's in SYNC_FLUSH;
    a send's (the broker's fast path) is the appender's ``put_send`` in both."""
    cfg = crash_config(tmp_path, flush)
    w = writer_factory(cfg, threads=1, die_in_append=301, via_send=via_send)
    wait_until(lambda: w.proc.poll() is not None, 30, "the writer to die inside an append")
    assert w.proc.returncode == -signal.SIGKILL, w.err_path.read_text()
    acks = read_ack_log(w.ack_path).acks
    assert len(acks) == 300
    end = acks[-1].phy + acks[-1].size
    seg_size = cfg.mapped_file_size_commit_log
    seg = cfg.commitlog_dir / units.offset_to_file_name(end - end % seg_size)
    if end % seg_size and records.check_record(seg.read_bytes(), end % seg_size).blank:
        end += seg_size - end % seg_size  # the dying append had rolled to the next segment first

    store = reopen(cfg)
    try:
        assert store.max_phy_offset == end, "the interrupted record is not part of the log"
        by_offset = assert_store_consistent(store)
        assert len(by_offset) == 300
        assert_acked_readable(store, acks)
        res = store.put_message(make_message(TOPIC, 0, b"next", keys="next"))
        assert res.status == PutMessageStatus.PUT_OK and res.append.wrote_offset == end
        wait_dispatched(store)
        assert_store_consistent(store)
    finally:
        store.shutdown()


def first_record_times(cfg: MessageStoreConfig) -> list[tuple[int, int]]:
    """(base offset, store timestamp of the first record) of every segment that starts with a valid one."""
    out = []
    for p in segment_files(cfg.commitlog_dir):
        with open(p, "rb") as f:
            head = f.read(4096)
        res = records.check_record(head, 0, check_crc=False)
        if res.ok and res.size > 0:
            out.append((int(p.name), res.request.store_timestamp))
    return out


def expected_abnormal_start(cfg: MessageStoreConfig, cp: tuple[int, int, int]) -> int:
    """RocketMQ's rule: the newest segment whose first record is not newer than min(physic, logics) - 3 s
    and (messageIndexSafe) not newer than indexMsgTimestamp; segment 0 when none qualifies."""
    physic, logics, index_ts = cp
    bound = min(max(0, min(physic, logics) - 3000), index_ts)
    ok = [base for base, ts in first_record_times(cfg) if 0 < ts <= bound]
    return max(ok, default=0)


def test_index_files_newer_than_checkpoint_are_rebuilt(tmp_path, writer_factory):
    cfg = crash_config(tmp_path, FlushDiskType.SYNC_FLUSH, flush_interval_consume_queue=20,
                       flush_consume_queue_thorough_interval=100)  # fmt: skip
    cp_path = cfg.store_path_root_dir / "checkpoint"

    def checkpoint() -> tuple[int, int, int]:
        data = cp_path.read_bytes() if cp_path.exists() else bytes(24)
        return struct.unpack(">qqq", data[:24])

    w = writer_factory(cfg, threads=1, query_after=700, pace_ms=2)
    w.wait_for(lambda log: log.query_done and log.acks_after_query >= 200, "index queries and 200 more acks")
    def past_first_segment_with_index_files_on_both_sides() -> bool:
        cp = checkpoint()
        if not (all(cp) and expected_abnormal_start(cfg, cp) > 0):
            return False
        ends = [(h.end_timestamp, h.index_count) for h in index_headers(cfg).values()]
        return any(end > cp[2] for end, _ in ends) and any(end <= cp[2] and n >= cfg.max_index_num for end, n in ends)

    # Run until the checkpoint is far enough ahead (it keeps 3 s of slack) that recovery can start past segment 0,
    # with index files written after the checkpoint's and full ones before it: frozen when seen, killed as seen.
    w.frozen_when(past_first_segment_with_index_files_on_both_sides, "the checkpoint to move past the first segment "
                  "with index files on both sides of it")  # fmt: skip
    log = w.kill()
    assert cp_path.stat().st_size == units.CHECKPOINT_SIZE
    cp = checkpoint()
    physic, logics, index_ts = cp
    by_offset, _end = scan_commitlog(cfg)
    newest = max(r.store_timestamp for r in by_offset.values())
    for ts in cp:
        assert w.started_ms - 1000 <= ts <= newest, f"checkpoint {cp} is outside the run"
    start = expected_abnormal_start(cfg, cp)
    before = index_headers(cfg)
    assert index_ts in {h.end_timestamp for h in before.values()}, "indexMsgTimestamp is a flushed file's end"
    discard = {n for n, h in before.items() if h.end_timestamp > index_ts}
    keep = {n: (cfg.index_dir / n).read_bytes() for n, h in before.items() if h.end_timestamp <= index_ts}
    full_kept = {n for n, h in before.items() if n in keep and h.index_count >= cfg.max_index_num}
    assert discard and full_kept, f"need index files on both sides of the checkpoint: {before}"
    assert len(log.queries) >= 700 and all(log.queries.values())

    store = reopen(cfg)
    try:
        assert store.recovery_report.dispatch_from == start > 0, "re-dispatch starts where the checkpoint says"
        after = index_headers(cfg)
        assert not discard & set(after), "index files newer than the checkpoint must be discarded"
        for n in full_kept:
            assert (cfg.index_dir / n).read_bytes() == keep[n], f"full index file {n} must be kept as it was"
        assert len(set(after) - set(keep)) >= 1, "the discarded part of the index is rebuilt in new files"
        for key, offs in log.queries.items():
            assert query_offsets(store, TOPIC, key) == offs, f"query for {key} differs from before the crash"
        assert_acked_readable(store, log.acks)
        assert_store_consistent(store)
    finally:
        store.shutdown()
    # the rebuilt index is durable like the rest: a clean restart keeps it
    with clean_restart(cfg) as store:
        for key, offs in log.queries.items():
            assert query_offsets(store, TOPIC, key) == offs


def test_clean_restart_takes_normal_path_and_dispatches_nothing_twice(tmp_path):
    cfg = make_config(tmp_path)
    root = cfg.store_path_root_dir
    counts = {0: 150, 1: 120, 2: 90}
    store = MessageStore(cfg).start()
    for i in range(max(counts.values())):
        for q, n in counts.items():
            if i < n:
                assert store.put_message(make_message(TOPIC, q, f"m-{q}-{i}" * 20, keys=f"k-{q}-{i}")).ok
    wait_dispatched(store)
    store.shutdown()
    assert not abort_file(root).exists(), "a clean shutdown removes the abort file"
    assert len(segment_files(cfg.commitlog_dir)) >= 3
    cq_bytes = {q: b"".join(p.read_bytes() for p in sorted((cfg.consume_queue_dir / TOPIC / str(q)).iterdir()))
                for q in counts}  # fmt: skip
    idx_bytes = {p.name: p.read_bytes() for p in cfg.index_dir.iterdir()}
    assert len(idx_bytes) >= 2

    for round_no in range(2):
        with clean_restart(cfg) as store:
            assert abort_file(root).exists(), "a running store holds an abort file"
            report = store.recovery_report
            assert report.dispatch_from == store.max_phy_offset, "nothing is left to dispatch after a clean exit"
            for q, n in counts.items():
                assert store.get_max_offset_in_queue(TOPIC, q) == n
                assert len(cq_units_on_disk(cfg, TOPIC, q)) == n
                now = b"".join(p.read_bytes() for p in sorted((cfg.consume_queue_dir / TOPIC / str(q)).iterdir()))
                assert now == cq_bytes[q], f"queue {q} changed across a clean restart (round {round_no})"
            assert {p.name: p.read_bytes() for p in cfg.index_dir.iterdir()} == idx_bytes
            assert_store_consistent(store)
        assert not abort_file(root).exists()
