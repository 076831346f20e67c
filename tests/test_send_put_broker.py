"""A plain SEND_MESSAGE_V2 over the wire is put by ``MessageStore.put_send`` (the record written straight into the
segment through ``CommitLog.put``, ``store.format.appender``), on both codec twins: the replies and the stored
records are the run path's, a full segment is rolled by the same put, and in SYNC_FLUSH the reply still goes out only
after the fdatasync that covers its record."""

from __future__ import annotations

import concurrent.futures

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import ResponseCode
from store.format import msgid
from tests.helpers import wait_until
from tests.live_broker import records
from tests.test_flush_acks import _Gate

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("twin")]


class _Counted:
    """``MessageStore.put_send`` with its answers counted: (taken, declined)."""

    def __init__(self, store) -> None:
        self.real, self.taken, self.declined = store.put_send, 0, 0
        store.put_send = self

    def __call__(self, *args):
        got = self.real(*args)
        if got is None:
            self.declined += 1
        else:
            self.taken += 1
        return got


def test_wire_sends_are_put_in_one_call_and_a_full_segment_rolls(fresh_broker):
    """Sends of 3 KiB into 64 KiB segments: every one is put by put_send, which writes the BLANK and rolls at
    each segment's end; every reply names its stored record."""
    b = fresh_broker(mappedFileSizeCommitLog=str(64 * 1024))
    assert b.send("Wire", b"creates the topic").code == ResponseCode.SUCCESS  # the general path: a new topic
    counted = _Counted(b.controller.store)
    sent = [b"creates the topic"]
    replies = []
    for i in range(60):
        body = bytes([i]) * 3000
        resp = b.send("Wire", body, keys=f"k{i}")
        assert resp.code == ResponseCode.SUCCESS
        replies.append(h.SendMessageResponseHeader.from_ext(resp.ext_fields))
        sent.append(body)
    assert (counted.taken, counted.declined) == (60, 0)
    assert [r.queue_offset for r in replies] == list(range(1, 61))
    got = []
    while len(got) < len(sent):
        got += records(b.pull("Wire", 0, len(got)).body)
    assert [r.body for r in got] == sent
    assert [r.offset_msg_id for r in got[1:]] == [r.msg_id for r in replies]
    assert {r.property_map["CLUSTER"] for r in got} == {b.controller.config.broker_cluster_name}
    size = 64 * 1024
    assert all(r.physical_offset // size == (r.physical_offset + r.total_size - 1) // size for r in got)
    assert sum(r.physical_offset % size == 0 for r in got[1:]) >= 2  # ~2.8 segments: at least two rolls


def test_sync_flush_wire_send_is_answered_only_after_its_fdatasync(fresh_broker):
    b = fresh_broker(flushDiskType="SYNC_FLUSH", syncFlushTimeout="20000")
    assert b.send("Durable", b"creates the topic").code == ResponseCode.SUCCESS
    store = b.controller.store
    counted = _Counted(store)
    gate = _Gate(store)
    gate.close()  # the disk hangs
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            pending = pool.submit(b.send, "Durable", b"held by the group commit")
            wait_until(lambda: counted.taken == 1 and gate.entered.is_set(), what="the put and its group commit")
            end = store.max_phy_offset
            assert gate.durable < end and not pending.done()  # stored, not durable: not answered
        finally:
            gate.open.set()
        resp = pending.result(30)
    assert resp.code == ResponseCode.SUCCESS
    assert gate.durable >= end
    offset = msgid.decode_offset_msg_id(resp.ext_fields["msgId"])[1]
    (stored,) = records(b.pull("Durable", 0, 1).body)
    assert stored.physical_offset == offset and offset + stored.total_size == end
    assert counted.taken == 1 and counted.declined == 0
