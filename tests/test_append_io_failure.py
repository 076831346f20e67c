"""An append whose next CommitLog segment cannot be created for a reason other than a full disk.

The CommitLog directory is made read-only under the running store by a read-only bind mount over it (the tests
run as root, so a chmod would not stop them): segments already mapped keep taking writes, but the next one can
be neither created nor opened for writing (EROFS).  RocketMQ answers such a put ``CREATE_MAPPED_FILE_FAILED``
(a send: SYSTEM_ERROR); the disk is not full, so the store does not refuse later puts, and they succeed once the
directory is writable.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from pathlib import Path

import pytest

from broker.client import Message, MQBrokerError, Producer
from broker.remoting.codes import ResponseCode
from store.message_store import MessageStore, PutMessageStatus
from tests.fixtures_broker import MqlakeServer, read_topic, stop_servers
from tests.helpers import make_config, make_message, read_queue, wait_dispatched, wait_until

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MNT_DETACH = 1, 32, 4096, 2
SEGMENT = 64 * 1024


def _read_only(directory: Path) -> None:
    """Bind ``directory`` over itself, then make that bind read-only (files already open stay writable)."""
    target = str(directory).encode()
    for source, flags in ((target, _MS_BIND), (None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)):
        if _libc.mount(source, target, None, flags, None) != 0:
            e = ctypes.get_errno()
            pytest.fail(f"a read-only bind mount on {directory} was refused: {os.strerror(e)} (the tests run as root)")


def _writable_again(directory: Path) -> None:
    if _libc.umount2(str(directory).encode(), 0) != 0:
        _libc.umount2(str(directory).encode(), _MNT_DETACH)


def _store(tmp_path: Path) -> MessageStore:
    return MessageStore(make_config(tmp_path, mappedFileSizeCommitLog=SEGMENT)).start()


@pytest.mark.unit
@pytest.mark.expected_errors(r"append failed: .*Read-only file system")
def test_a_segment_that_cannot_be_created_fails_the_put_and_a_later_put_succeeds(tmp_path):
    s = _store(tmp_path)
    commitlog = tmp_path / "store" / "commitlog"
    body = b"r" * 1000
    acked: list[bytes] = []
    mounted = False
    try:
        assert s.put_message(make_message("Ro", 0, body + b"0")).ok
        acked.append(body + b"0")
        # the next segment is preallocated in the background: let it finish before the directory turns read-only
        wait_until(lambda: (commitlog / f"{SEGMENT:020d}").exists(), what="the next segment's preallocation")
        _read_only(commitlog)
        mounted = True
        for i in range(1, 2 * SEGMENT // len(body)):
            res = s.put_message(make_message("Ro", 0, body + str(i).encode()))
            if not res.ok:
                break
            acked.append(body + str(i).encode())
        else:
            raise AssertionError("no put needed a new segment")
        assert res.status == PutMessageStatus.CREATE_MAPPED_FILE_FAILED, res
        assert f"{SEGMENT:020d}" in (res.error or ""), "the error names the segment that could not be made"
        assert not s.disk_full, "a read-only directory is not a full disk"
        again = s.put_message(make_message("Ro", 0, b"still read-only"))
        assert again.status == PutMessageStatus.CREATE_MAPPED_FILE_FAILED, again

        _writable_again(commitlog)
        mounted = False
        assert s.put_message(make_message("Ro", 0, b"after")).ok, "the cause is gone: puts succeed again"
        acked.append(b"after")
        wait_dispatched(s)
        assert [rec.body for _, rec in read_queue(s, "Ro", 0)] == acked
    finally:
        if mounted:
            _writable_again(commitlog)
        s.shutdown()
    s = _store(tmp_path)  # and after a restart: every acknowledged message, nothing else
    try:
        assert s.last_exit_ok
        assert [rec.body for _, rec in read_queue(s, "Ro", 0)] == acked
    finally:
        s.shutdown()


async def _send_until_refused(server: MqlakeServer, bodies: int) -> tuple[list[bytes], MQBrokerError]:
    producer = Producer("ro-pg", server.namesrv_addr, retry_times=0)
    await producer.start()
    acked: list[bytes] = []
    try:
        for i in range(bodies):
            body = f"w{i:05d}".encode() + b"x" * 1000
            try:
                await producer.send(Message("RoWire", body))
            except MQBrokerError as e:
                return acked, e
            acked.append(body)
        raise AssertionError("no send needed a new segment")
    finally:
        await producer.shutdown()


async def _send_one(server: MqlakeServer, body: bytes) -> None:
    producer = Producer("ro-pg2", server.namesrv_addr, retry_times=0)
    await producer.start()
    try:
        await producer.send(Message("RoWire", body))
    finally:
        await producer.shutdown()


@pytest.mark.integration
@pytest.mark.expected_errors(r"append failed: .*Read-only file system")
def test_a_broker_answers_a_send_that_needs_an_uncreatable_segment_with_a_system_error(tmp_path):
    segment = 1024 * 1024
    server = MqlakeServer(tmp_path / "broker", mappedFileSizeCommitLog=str(segment))
    commitlog = server.store_dir / "commitlog"
    mounted = False
    try:
        server.start()
        asyncio.run(_send_one(server, b"first"))
        wait_until(lambda: (commitlog / f"{segment:020d}").exists(), what="the next segment's preallocation")
        _read_only(commitlog)
        mounted = True
        acked, refused = asyncio.run(_send_until_refused(server, 2 * segment // 1000))
        assert refused.code == ResponseCode.SYSTEM_ERROR, refused
        assert f"{segment:020d}" in (refused.remark or ""), "the remark names the segment"
        assert server.running
        _writable_again(commitlog)
        mounted = False
        asyncio.run(_send_one(server, b"after"))
        got = read_topic(server.namesrv_addr, "RoWire", len(acked) + 2)
        bodies = sorted(m.body for q in got.values() for m in q)
        assert bodies == sorted([b"first", *acked, b"after"]), "every acknowledged send is readable"
    finally:
        if mounted:
            _writable_again(commitlog)
        stop_servers([server])
