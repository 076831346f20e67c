"""A full disk: store files allocated before they are mapped, the disk check first, config writes that keep the
previous file, a stop that completes, delayed deliveries retried, and a broker whose disk another process fills.

Every disk here is a small tmpfs mounted in the test's temp dir (the tests run as root; a refused mount fails the
test), so ENOSPC is real and the stores read its real usage, not the half-full figure the suite pins elsewhere.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

import store.retention
from broker.client import Message, MQBrokerError, Producer
from broker.remoting.codes import RequestCode, ResponseCode
from store import config_files as cf
from store.checkpoint import StoreCheckpoint, abort_file
from store.format import units
from store.index import IndexFile
from store.mapped_file import MappedFile
from store.message_store import MessageStore, PutMessageStatus
from store.retention import SegmentManifest
from tests.fixtures_broker import MqlakeServer, read_topic, remoting_call, stop_servers
from tests.helpers import make_config, make_message, read_queue, wait_dispatched, wait_until

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
REMARK = "the broker's disk is full [CL:  1.00 CQ:  1.00 INDEX:  1.00]"  # RocketMQ's, at 100 %


def _mount_tmpfs(target: Path, size: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        e = ctypes.get_errno()
        pytest.fail(f"mounting a {size} tmpfs on {target} was refused: {os.strerror(e)} (the tests run as root)")


def _unmount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), 0) != 0:
        _libc.umount2(str(target).encode(), _MNT_DETACH)  # a file still open (a killed process's): detach it


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)`` -> a fresh tmpfs of that size (``"4m"``) under tmp_path, unmounted at the end."""
    mounts: list[Path] = []

    def mount(size: str, name: str = "disk") -> Path:
        target = tmp_path / name
        _mount_tmpfs(target, size)
        mounts.append(target)
        return target

    yield mount
    for target in reversed(mounts):
        _unmount(target)


def _fill(directory: Path) -> Path:
    """Take every free byte of ``directory``'s filesystem with one file; returns it (delete it to free)."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (64 * 1024, 4096, 1):  # a write takes what fits, then ENOSPC
            try:
                while os.write(fd, bytes(size)) > 0:
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return path


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def real_disk(monkeypatch):
    """The stores of this test read their disk's real usage (the suite pins it at half full elsewhere)."""
    monkeypatch.setattr("store.message_store.disk_used_ratio", store.retention.disk_used_ratio)


# --- allocation before mapping ------------------------------------------------------------------------------------
@pytest.mark.unit
def test_every_store_file_is_allocated_before_it_is_mapped(tmp_path):
    size = units.index_file_size(64, 256)
    new = IndexFile(tmp_path / "20261129000000000", 64, 256, create=True)
    assert _allocated(new.path) >= size, "a new IndexFile must not be sparse"
    new.close()
    # RocketMQ's own files are sparse (RandomAccessFile.setLength): each is allocated when it is mapped
    seg = tmp_path / "00000000000000000000"
    for p, length in ((tmp_path / "index", size), (seg, 64 * 1024), (tmp_path / "checkpoint", 0)):
        with open(p, "wb") as f:
            f.truncate(length)
        assert _allocated(p) == 0
    f1 = IndexFile(tmp_path / "index", 64, 256)
    mf = MappedFile(seg, 64 * 1024)
    cp = StoreCheckpoint(tmp_path / "checkpoint")
    try:
        assert _allocated(tmp_path / "index") >= size
        assert _allocated(seg) >= 64 * 1024
        assert _allocated(tmp_path / "checkpoint") >= units.CHECKPOINT_SIZE
        assert (tmp_path / "checkpoint").stat().st_size == units.CHECKPOINT_SIZE
    finally:
        f1.close()
        mf.close()
        cp.close()


@pytest.mark.unit
def test_a_full_disk_fails_a_new_index_file_with_an_error_not_a_fault(small_disk):
    disk = small_disk("1m")
    filler = _fill(disk)
    with pytest.raises(OSError) as e:
        IndexFile(disk / "20261129000000000", 64, 256, create=True)
    assert e.value.errno == errno.ENOSPC and "20261129000000000" in str(e.value)
    assert sorted(p.name for p in disk.iterdir()) == ["filler"], "nothing half-made is left"
    filler.unlink()
    IndexFile(disk / "20261129000000000", 64, 256, create=True).close()


# --- config and manifest writes -----------------------------------------------------------------------------------
@pytest.mark.unit
def test_config_and_manifest_writes_on_a_full_disk_keep_the_previous_file(small_disk):
    disk = small_disk("1m")
    config = disk / "config"
    cf.save_topics(config, {"T": {"topicName": "T"}}, {"counter": 1, "timestamp": 1})
    cf.save_topics(config, {"T": {"topicName": "T", "readQueueNums": 8}}, {"counter": 2, "timestamp": 2})
    cf.save_consumer_offsets(config, {"T@g": {0: 5}})
    manifest = SegmentManifest(disk)
    manifest.sync_files([(0, 1024)], {})
    before = {p.name: p.read_bytes() for p in sorted(config.iterdir())} | {"segments.json": manifest.path.read_bytes()}
    filler = _fill(disk)
    big = {f"T{i}": {"topicName": f"T{i}", "perm": 6} for i in range(2000)}  # more than one free block
    with pytest.raises(OSError):
        cf.save_topics(config, big, {"counter": 3, "timestamp": 3})
    with pytest.raises(OSError):
        cf.save_consumer_offsets(config, {f"T{i}@g": {0: i} for i in range(2000)})
    with pytest.raises(OSError):
        manifest.sync_files([(i * 1024, 1024) for i in range(500)], {})
    after = {p.name: p.read_bytes() for p in sorted(config.iterdir())} | {"segments.json": manifest.path.read_bytes()}
    assert after == before, "the files and their .bak are as they were, and no temp file is left"
    assert cf.load_topics(config)["topicConfigTable"]["T"]["readQueueNums"] == 8
    filler.unlink()
    cf.save_topics(config, big, {"counter": 3, "timestamp": 3})
    assert len(cf.load_topics(config)["topicConfigTable"]) == 2000
    assert cf.read_config(config / "topics.json.bak")["dataVersion"]["counter"] == 2


@pytest.mark.unit
def test_an_async_config_write_on_a_full_disk_keeps_the_previous_file(small_disk):
    config = small_disk("1m") / "config"
    cf.save_topics(config, {"T": {"topicName": "T"}}, {"counter": 1, "timestamp": 1})
    cf.save_topics(config, {"T": {"topicName": "T", "readQueueNums": 8}}, {"counter": 2, "timestamp": 2})
    before = {p.name: p.read_bytes() for p in sorted(config.iterdir())}
    filler = _fill(config.parent)
    big = {f"T{i}": {"topicName": f"T{i}", "perm": 6} for i in range(2000)}  # more than one free block
    with pytest.raises(OSError):
        asyncio.run(cf.write_config_async(config / cf.TOPICS, cf.topics_document(big, {"counter": 3})))
    assert {p.name: p.read_bytes() for p in sorted(config.iterdir())} == before, "no temp file, nothing rotated"
    filler.unlink()
    asyncio.run(cf.write_config_async(config / cf.TOPICS, cf.topics_document(big, {"counter": 3})))
    assert len(cf.load_topics(config)["topicConfigTable"]) == 2000
    assert cf.read_config(config / "topics.json.bak")["dataVersion"]["counter"] == 2


# --- the store on a full disk --------------------------------------------------------------------------------------
def _disk_store(disk: Path, **overrides) -> MessageStore:
    """A store on ``disk`` whose ConsumeQueue files do not roll within a test (unless it says otherwise)."""
    values = {"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeConsumeQueue": 20 * 3000, "maxIndexNum": 4000,
              **overrides}  # fmt: skip
    return MessageStore(make_config(disk, **values)).start()


@pytest.mark.expected_errors(r"append failed: \[Errno 28\]", "disk maybe full soon")
@pytest.mark.unit
def test_a_failed_append_marks_the_disk_full_at_once_and_a_stop_completes(small_disk, real_disk):
    disk = small_disk("4m")
    s = _disk_store(disk)
    acked: list[bytes] = []
    filler = None
    body = b"m" * 1000
    for i in range(2000):
        if i == 10:
            wait_dispatched(s)  # the queues' files exist (dispatch on a full disk waits for room: tested below)
            filler = _fill(disk)  # between two disk checks: the clean pass does not run in this test
            assert not s.disk_full
        res = s.put_message(make_message("Full", i % 2, body + str(i).encode()))
        if not res.ok:
            break
        acked.append(body + str(i).encode())
    else:
        raise AssertionError("the full disk never refused a put")
    # the append that found no room for a new segment: RocketMQ's answer at once, not CREATE_MAPPED_FILE_FAILED
    assert res.status == PutMessageStatus.SERVICE_NOT_AVAILABLE, res
    assert REMARK in res.error
    assert s.disk_full and s.runtime_info()["commitLogDiskRatio"] == "1.0"
    assert not list((disk / "store" / "commitlog").glob("*.tmp")), "the failed segment's part is given back"
    assert s.put_message(make_message("Full", 0, b"x")).status == PutMessageStatus.SERVICE_NOT_AVAILABLE
    wait_dispatched(s)
    s.shutdown()  # on the full disk: segments.json, the checkpoint and the flushes must not stop it
    assert not abort_file(s.root).exists(), "everything was dispatched: the stop was clean"
    assert filler is not None
    filler.unlink()
    s = _disk_store(disk)
    try:
        assert s.last_exit_ok and not s.disk_full
        got = sorted(rec.body for q in (0, 1) for _, rec in read_queue(s, "Full", q))
        assert got == sorted(acked)
        assert s.put_message(make_message("Full", 0, b"after")).ok
    finally:
        s.shutdown()


@pytest.mark.expected_errors("reput failed at offset")
@pytest.mark.unit
@pytest.mark.parametrize("rolls", [{"mappedFileSizeConsumeQueue": 20 * 50}, {"maxIndexNum": 50}],
                         ids=["consume-queue", "index-file"])  # fmt: skip
def test_dispatch_waits_for_room_for_a_new_file_and_loses_nothing(small_disk, real_disk, rolls):
    disk = small_disk("2m")
    s = _disk_store(disk, **rolls)  # a new ConsumeQueue file, or IndexFile, every 50 messages
    acked = []
    for i in range(40):
        assert s.put_message(make_message("Roll", 0, f"a{i}")).ok
        acked.append(f"a{i}".encode())
    wait_dispatched(s)
    filler = _fill(disk)
    for i in range(20):  # the 51st needs the queue's second file, which the full disk cannot give
        assert s.put_message(make_message("Roll", 0, f"b{i}")).ok  # the CommitLog segment had room
        acked.append(f"b{i}".encode())
    wait_until(lambda: s.get_max_offset_in_queue("Roll", 0) >= 49, 10, what="dispatch up to the file's end")
    assert s.dispatch_behind_bytes > 0
    s.shutdown()  # completes; dispatch is not finished, so the abort marker stays for the next start
    assert abort_file(s.root).exists()
    filler.unlink()
    s = _disk_store(disk, **rolls)
    try:
        assert not s.last_exit_ok
        assert [rec.body for _, rec in read_queue(s, "Roll", 0)] == acked
        for i in (0, 55):  # the keys of every message are indexed, the ones dispatched after the room came too
            uniq = read_queue(s, "Roll", 0)[i][1].uniq_key
            assert len(s.query_message("Roll", uniq, 4, 0, 2**62).messages) == 1
    finally:
        s.shutdown()


@pytest.mark.expected_errors("disk maybe full soon")
@pytest.mark.unit
def test_the_clean_pass_checks_the_disk_before_it_writes_anything(small_disk, real_disk):
    disk = small_disk("2m")
    s = _disk_store(disk)
    try:
        assert s.put_message(make_message("Full", 0, b"before")).ok
        wait_dispatched(s)  # its ConsumeQueue file exists before the disk fills (the dispatch is not under test)
        filler = _fill(disk)
        (disk / "store" / "segments.json").unlink(missing_ok=True)  # the pass must write it again: it cannot
        s.clean_expired_files()  # a housekeeping pass: no ENOSPC escapes it, and the disk is seen full
        assert s.disk_full and s.runtime_info()["commitLogDiskRatio"] == "1.0"
        res = s.put_message(make_message("Full", 0, b"refused"))
        assert res.status == PutMessageStatus.SERVICE_NOT_AVAILABLE and REMARK in res.error
        filler.unlink()
        s.clean_expired_files()
        assert not s.disk_full and (disk / "store" / "segments.json").exists()
        assert s.put_message(make_message("Full", 0, b"after")).ok
    finally:
        s.shutdown()


@pytest.mark.expected_errors("disk maybe full soon")
@pytest.mark.unit
@pytest.mark.parametrize("kind", ["delay", "timer"])
def test_a_delivery_refused_on_a_full_disk_is_retried_not_lost(small_disk, real_disk, kind):
    disk = small_disk("2m")
    s = _disk_store(disk, message_delay_level="1s", flush_delay_offset_interval=50)
    try:
        props = {"DELAY": "1"} if kind == "delay" else {"TIMER_DELAY_MS": "1000"}
        assert s.put_message(make_message("Due", 0, b"later", **props)).ok
        wait_dispatched(s)
        filler = _fill(disk)
        s.check_disk_space()
        assert s.disk_full
        service = s.schedule if kind == "delay" else s.timers
        put, refused = service._put, []

        def watched(topic: str, queue_id: int, encoded: list[bytes]) -> bool:
            ok = put(topic, queue_id, encoded)
            if not ok:
                refused.append(topic)
            return ok

        service._put = watched
        wait_until(lambda: refused, 15, what="the due delivery to be refused")
        assert s.get_max_offset_in_queue("Due", 0) == 0
        if kind == "delay":
            assert s.schedule.offset_table().get(1, 0) == 0, "the level's offset waits for the delivery"
        filler.unlink()
        s.check_disk_space()
        wait_until(lambda: s.get_max_offset_in_queue("Due", 0) == 1, 15, what="the retried delivery")
        wait_dispatched(s)
        [(_, rec)] = read_queue(s, "Due", 0)
        assert rec.body == b"later"
        if kind == "delay":
            assert rec.property_map["REAL_TOPIC"] == "Due"
    finally:
        s.shutdown()


# --- a broker whose disk another process fills during sends -------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("found_by", ["disk-check", "append"])
def test_a_broker_whose_disk_is_filled_during_sends_refuses_and_loses_nothing(tmp_path, small_disk, found_by):
    # found_by: the clean pass's disk check (every 0.5 s) sees the full disk first, or (no pass during the test)
    # the append that needs a new segment finds no room for it
    work = tmp_path / "broker"
    small_disk("24m", "broker/store")
    interval = "500" if found_by == "disk-check" else "3600000"
    server = MqlakeServer(work, real_disk=True, cleanResourceInterval=interval,
                          mappedFileSizeCommitLog=str(1024 * 1024))  # fmt: skip
    try:
        server.start()
        acked, refusals = asyncio.run(_send_while_filling(server, work / "store"))
        assert server.running, f"the broker died (exit {server.process.returncode}):\n{server.run_log()[-3000:]}"
        assert refusals, "no send was refused"
        assert all(code == ResponseCode.SERVICE_NOT_AVAILABLE and "the broker's disk is full [" in remark
                   for code, remark in refusals), refusals[:3]  # fmt: skip
        assert len(acked) > 100
        info = json.loads(remoting_call(server.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
        assert info["commitLogDiskRatio"] == "1.0"  # brokerStatus shows the full disk
        if found_by == "append":
            assert "append failed: [Errno 28]" in server.run_log()
        assert server.stop() == 0  # a graceful stop on the full disk: exit 0, no error logged on the way out
        assert not (work / "store" / "abort").exists()
        server.start()  # on the still full disk: it starts, and refuses from the first send
        assert asyncio.run(_send_one(server)) == ResponseCode.SERVICE_NOT_AVAILABLE
        assert server.stop() == 0
        (work / "store" / "filler").unlink()
        server.start()
        got = read_topic(server.namesrv_addr, "Filled", len(acked))
        bodies = sorted(m.body for q in got.values() for m in q)
        assert bodies == sorted(acked), "every acknowledged message is readable after the restart"
        assert asyncio.run(_send_one(server)) == ResponseCode.SUCCESS
    finally:
        stop_servers([server])


async def _send_while_filling(server: MqlakeServer, store_dir: Path) -> tuple[list[bytes], list[tuple[int, str]]]:
    """Send until the broker refuses for a while; another process fills the store's disk after the first sends."""
    producer = Producer("fill-pg", server.namesrv_addr, retry_times=0)
    await producer.start()
    acked: list[bytes] = []
    refusals: list[tuple[int, str]] = []
    filler: subprocess.Popen | None = None
    try:
        for i in range(30_000):
            if i == 200:
                filler = subprocess.Popen(["dd", "if=/dev/zero", f"of={store_dir / 'filler'}", "bs=1M"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            body = f"m{i:06d}".encode() + b"x" * 1000
            try:
                await producer.send(Message("Filled", body))
            except MQBrokerError as e:
                refusals.append((e.code, e.remark or ""))
                if len(refusals) >= 20:
                    break
                continue
            acked.append(body)
    finally:
        await producer.shutdown()
        if filler is not None:
            try:
                assert filler.wait(60) != 0, "dd ends when the disk is full"
            finally:
                if filler.poll() is None:
                    filler.kill()
                    filler.wait()
    return acked, refusals


async def _send_one(server: MqlakeServer) -> int:
    producer = Producer("fill-pg2", server.namesrv_addr)
    await producer.start()
    try:
        await producer.send(Message("Filled", b"after"))
        return ResponseCode.SUCCESS
    except MQBrokerError as e:
        return e.code
    finally:
        await producer.shutdown()
