"""SYNC_FLUSH acknowledgements on the event loop (``broker.server.flush_acks``): a send is answered only after the
fdatasync that covers its record, a whole group commit in one loop callback, and FLUSH_DISK_TIMEOUT when the
flush is not done within syncFlushTimeout.  The disk is held by a gate in front of the CommitLog's flush, so
nothing here depends on how fast this machine's disk is."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.server.flush_acks import FlushAcks
from broker.server.send import SendProcessor
from store.format import msgid, records
from store.message_store import MessageStore
from tests.aio import poll
from tests.helpers import make_config, make_message
from tests.live_broker import records as decode_records
from tests.test_store import running


class _Gate:
    """In front of the CommitLog's flush: holds the commit thread while closed, fails once when told to, and
    records the offset the last fdatasync made durable."""

    def __init__(self, store: MessageStore) -> None:
        self.queue = store.commitlog.queue
        self._flush = self.queue.flush
        self.queue.flush = self
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.durable = self.queue.flushed_offset

    def close(self) -> None:
        self.entered.clear()
        self.open.clear()

    def __call__(self) -> int:
        self.entered.set()
        assert self.open.wait(30), "the test never opened the gate"
        if self.fail_next and self.queue.max_offset > self.queue.flushed_offset:  # a commit with bytes to flush
            self.fail_next = False
            raise OSError(5, "Input/output error (the test's)")
        self.durable = self._flush()
        return self.durable


def _put(store: MessageStore, i: int) -> int:
    """Append one message as the broker's fast path does (no future of the store's); its record's end offset."""
    m = make_message("Acks", 0, f"m{i}".encode())
    m.store_host = store.store_host
    result, fut = store.put_run_nowait(records.encode_record(m), 1, m.topic, m.queue_id, m.sys_flag, wait=False)
    assert result.ok and fut is None and result.append is not None
    return result.append.wrote_offset + result.append.wrote_bytes


class _Answers(dict):
    """end offset -> (flushed?, the offset durable when the answer was made)."""

    def __init__(self, gate: _Gate) -> None:
        super().__init__()
        self.gate = gate

    def waiter(self, end: int):
        def done(flushed: bool) -> None:
            assert end not in self, "answered twice"
            self[end] = (flushed, self.gate.durable)

        return done


@pytest.mark.unit
def test_a_group_commit_answers_its_waiters_in_one_loop_callback_after_its_fdatasync(tmp_path) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _Gate(store)

        async def scenario() -> tuple[FlushAcks, _Answers, list[int]]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 30.0)
            answers = _Answers(gate)
            gate.close()
            ends = [_put(store, 0)]
            acks.wait(ends[0], answers.waiter(ends[0]))
            await poll(gate.entered.is_set, what="the group commit's flush")
            for i in range(1, 10):  # appended while the disk is busy: they wait for it too
                ends.append(_put(store, i))
                acks.wait(ends[-1], answers.waiter(ends[-1]))
            for _ in range(3):  # an answer scheduled before the flush would run now
                await asyncio.sleep(0)
            assert answers == {}, "answered while the fdatasync was still running"
            gate.open.set()
            await poll(lambda: len(answers) == len(ends), what="every answer")
            return acks, answers, ends

        acks, answers, ends = asyncio.run(scenario())
        for end in ends:
            flushed, durable = answers[end]
            assert flushed and durable >= end, (end, answers[end])
        # the held flush covered all ten appends: its one loop callback answered them all
        assert acks.groups == 1


@pytest.mark.unit
def test_a_flush_not_done_within_the_timeout_or_failed_is_answered_false(tmp_path) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _Gate(store)

        async def scenario() -> list[tuple[int, tuple[bool, int]]]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 0.2)
            answers = _Answers(gate)
            gate.close()
            held = _put(store, 0)
            acks.wait(held, answers.waiter(held))
            await poll(lambda: held in answers, what="the timeout's answer")  # only the 0.2 s timer can answer
            gate.open.set()
            after = _put(store, 1)
            acks.wait(after, answers.waiter(after))
            await poll(lambda: after in answers, what="the answer after the gate opened")
            gate.fail_next = True  # this commit's fdatasync fails: its waiter must not hear "flushed"
            failed = _put(store, 2)
            acks.wait(failed, answers.waiter(failed))
            await poll(lambda: failed in answers, what="the failed flush's answer")
            last = _put(store, 3)
            acks.wait(last, answers.waiter(last))
            await poll(lambda: last in answers, what="the answer after the failure")
            return [(end, answers[end]) for end in (held, after, failed, last)]

        (held, (ok0, durable0)), (after, (ok1, _)), (failed, (ok2, _)), (last, (ok3, durable3)) = asyncio.run(
            scenario()
        )
        assert not ok0 and durable0 < held  # timed out, and indeed not on disk when answered
        assert ok1 and not ok2 and ok3 and durable3 >= last


@pytest.mark.integration
def test_sync_flush_sends_wait_for_their_fdatasync_on_the_fast_path(fresh_broker) -> None:
    b = fresh_broker(flushDiskType="SYNC_FLUSH", syncFlushTimeout="300")
    assert b.send("Durable", b"first").code == ResponseCode.SUCCESS  # creates the topic (the general path)
    acks = b.controller.flush_acks
    assert acks is not None
    gate = _Gate(b.controller.store)
    # The send handler, observed: what was durable when the group commit handed each held answer to the
    # connection (Connection.answer_held, which queues the reply frame for the socket).
    proc, durable_at_answer = SendProcessor(b.controller), []

    def observed(cmd, conn):
        if "answer_held" not in vars(conn):
            answer_held = conn.answer_held

            def observed_answer(response):
                durable_at_answer.append(gate.durable)
                answer_held(response)

            conn.answer_held = observed_answer
        answer = proc.send_inline(cmd, conn)
        assert answer is None or not isinstance(answer, asyncio.Future), "a remoting connection holds the answer"
        return answer

    b.controller.server.register(RequestCode.SEND_MESSAGE_V2, observed)
    groups = acks.groups

    gate.close()  # the disk hangs: only syncFlushTimeout can answer, and it must say so
    late = b.send("Durable", b"held")
    assert late.code == ResponseCode.FLUSH_DISK_TIMEOUT
    held = h.SendMessageResponseHeader.from_ext(late.ext_fields)  # the message is stored; only its flush is late
    assert held.queue_offset == 1 and held.queue_id == 0
    gate.open.set()

    ok = b.send("Durable", b"after")
    assert ok.code == ResponseCode.SUCCESS
    offset = msgid.decode_offset_msg_id(ok.ext_fields["msgId"])[1]
    stored = decode_records(b.pull("Durable", 0, 0).body)
    assert [r.body for r in stored] == [b"first", b"held", b"after"]
    assert stored[2].physical_offset == offset
    assert len(durable_at_answer) == 2, "both sends took the fast path's group-commit answer"
    assert durable_at_answer[-1] >= offset + stored[2].total_size, "answered before the record was on disk"
    assert acks.groups > groups

    # WAIT=false: answered at once, whatever the disk does
    gate.close()
    nowait = b.send("Durable", b"nowait", WAIT="false")
    assert nowait.code == ResponseCode.SUCCESS and len(durable_at_answer) == 2
    gate.open.set()
