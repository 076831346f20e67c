"""ASYNC_FLUSH: the CommitLog's periodic flush (RocketMQ's FlushRealTimeService).

Every ``flushIntervalCommitLog`` ms the service looks at the dirty bytes: it flushes once they reach
``flushCommitLogLeastPages`` pages, or all of them once ``flushCommitLogThoroughInterval`` has passed.  The tests
watch the flushed position the store reports (``runtime_info()["flushedOffset"]``) and count the service's looks
(a spy on the dirty-bytes measure it takes every interval), so "not flushed" is seen after the service looked,
not after a sleep.  A flush that fails is logged naming the segment and tried again; the service goes on.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

import pytest

from store.message_store import MessageStore
from tests.helpers import make_config, make_message, wait_until

PAGE = 4096
HOUR_MS = 3_600_000


def _flushed(s: MessageStore) -> int:
    return int(s.runtime_info()["flushedOffset"])


class _Looks:
    """Counts the flush service's looks at the dirty bytes (one per ``flushIntervalCommitLog``)."""

    def __init__(self, monkeypatch, s: MessageStore) -> None:
        queue = s.commitlog.queue
        measure = queue.dirty_bytes
        self.count = 0

        def counted() -> int:
            n = measure()
            if threading.current_thread().name == "flush-commitlog":
                self.count += 1
            return n

        monkeypatch.setattr(queue, "dirty_bytes", counted)

    def wait(self, more: int) -> None:
        """Return once the service has looked ``more`` further times."""
        target = self.count + more
        wait_until(lambda: self.count >= target, what=f"{more} looks of the flush service")


def _store(tmp_path, **flush) -> MessageStore:
    return MessageStore(make_config(tmp_path, flushDiskType="ASYNC_FLUSH", **flush)).start()


@pytest.mark.unit
def test_the_flush_waits_for_the_least_pages_then_flushes_everything(tmp_path, monkeypatch):
    s = _store(tmp_path, flushIntervalCommitLog=10, flushCommitLogLeastPages=4,
               flushCommitLogThoroughInterval=HOUR_MS)  # fmt: skip
    try:
        looks = _Looks(monkeypatch, s)
        assert s.put_message(make_message("Flush", 0, b"s" * 500)).ok
        start = _flushed(s)
        looks.wait(5)
        assert _flushed(s) == start < s.max_phy_offset, "under 4 dirty pages, no flush at any interval"
        while s.max_phy_offset - start < 4 * PAGE:
            assert s.put_message(make_message("Flush", 0, b"p" * 1000)).ok
        end = s.max_phy_offset
        wait_until(lambda: _flushed(s) >= end, what="the flush of 4 dirty pages")
        assert _flushed(s) == end
    finally:
        s.shutdown()


@pytest.mark.unit
def test_the_thorough_interval_flushes_fewer_than_the_least_pages(tmp_path, monkeypatch):
    s = _store(tmp_path, flushIntervalCommitLog=10, flushCommitLogLeastPages=1000,
               flushCommitLogThoroughInterval=50)  # fmt: skip
    try:
        assert s.put_message(make_message("Flush", 0, b"t" * 100)).ok
        end = s.max_phy_offset
        wait_until(lambda: _flushed(s) == end, what="the thorough flush of one small message")
    finally:
        s.shutdown()


@pytest.mark.unit
@pytest.mark.expected_errors(r"commitlog flush failed: .*cannot flush")
def test_a_failed_flush_is_logged_with_the_segment_and_retried(tmp_path, monkeypatch, caplog):
    s = _store(tmp_path, flushIntervalCommitLog=10, flushCommitLogLeastPages=1,
               flushCommitLogThoroughInterval=HOUR_MS)  # fmt: skip
    segments = str(tmp_path / "store" / "commitlog")
    sync, failures = os.fdatasync, []

    def failing(fd: int) -> None:  # the device's error (EIO) for the CommitLog's first two flushes
        if os.readlink(f"/proc/self/fd/{fd}").startswith(segments) and len(failures) < 2:
            failures.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        sync(fd)

    try:
        looks = _Looks(monkeypatch, s)
        caplog.set_level(logging.ERROR, logger="store.commitlog")
        monkeypatch.setattr(os, "fdatasync", failing)
        while s.max_phy_offset < PAGE:
            assert s.put_message(make_message("Flush", 0, b"e" * 1000)).ok
        end = s.max_phy_offset
        wait_until(lambda: len(failures) == 2, what="two failed flushes")
        wait_until(lambda: _flushed(s) >= end, what="the retried flush")
        failed = [r.getMessage() for r in caplog.records if "flush failed" in r.getMessage()]
        assert len(failed) == 2 and all(f"{0:020d}: cannot flush" in m for m in failed), failed
        # the service goes on: later puts are flushed too, and the store takes them
        looks.wait(1)
        while s.max_phy_offset < end + PAGE:
            assert s.put_message(make_message("Flush", 0, b"a" * 1000)).ok
        after = s.max_phy_offset
        wait_until(lambda: _flushed(s) >= after, what="the flush after the failures")
    finally:
        s.shutdown()
