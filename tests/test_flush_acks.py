"""SYNC_FLUSH acknowledgements on the event loop (``broker.server.flush_acks``): a send is answered only after the
fdatasync that covers its record, a whole group commit in one loop callback, and FLUSH_DISK_TIMEOUT when the
flush is not done within syncFlushTimeout.  The disk is held by a gate in front of the CommitLog's flush, so
nothing here depends on how fast this machine's disk is."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection
from broker.remoting.loop import run as run_on_loop
from broker.server.flush_acks import FlushAcks
from broker.server.send import SendProcessor
from store.format import msgid, records
from store.message_store import MessageStore, Run
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
    result, fut = store.put_nowait(Run(records.encode_record(m), 1, m.topic, m.queue_id, m.sys_flag), wait=False)
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


@pytest.mark.expected_errors("group commit flush failed")
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
    # Short, for the send held behind the gate; raised once the gate opens.
    b = fresh_broker(flushDiskType="SYNC_FLUSH", syncFlushTimeout="1000")
    assert b.send("Durable", b"first").code == ResponseCode.SUCCESS  # creates the topic (the general path)
    acks = b.controller.flush_acks
    assert acks is not None
    gate = _Gate(b.controller.store)
    # The send handler, observed: what was durable when the group commit handed each held answer to the
    # connection (Connection.answer_held, or answer_held_frames for a run of flushed ones, which queue the reply
    # frames for the socket).
    proc, durable_at_answer = SendProcessor(b.controller), []

    def observed(cmd, conn):
        if "answer_held" not in vars(conn):
            answer_held, answer_held_frames = conn.answer_held, conn.answer_held_frames

            def observed_answer(response):
                durable_at_answer.append(gate.durable)
                answer_held(response)

            def observed_frames(frames):
                durable_at_answer.extend(gate.durable for _ in frames)
                answer_held_frames(frames)

            conn.answer_held, conn.answer_held_frames = observed_answer, observed_frames
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
    # the disk is back: a send now waits as long as a loaded machine's fdatasync may take, not a short budget
    b.controller.store_config.sync_flush_timeout = 60_000

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


# --- FlushAcks.reply: the group commit writes the held replies to real connections (a socket pair each) ---------


def _reply_frame(opaque: int) -> bytes:
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=opaque)
    return request.response(ResponseCode.SUCCESS, ext={"queueOffset": str(opaque)}).encode()


class _Peer:
    """The client's end of a socket pair whose other end is a broker-side ``Connection``."""

    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        self.sock, self.conn, self._buf = sock, conn, b""

    def written(self) -> bytes:
        """Everything the connection has written so far (non-blocking)."""
        while True:
            try:
                chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return self._buf
            if not chunk:
                return self._buf
            self._buf += chunk

    def replies(self) -> list[RemotingCommand]:
        data, out = self.written(), []
        while len(data) >= 4:
            (length,) = struct.unpack_from(">i", data)
            out.append(RemotingCommand.decode(data[4 : 4 + length]))
            data = data[4 + length :]
        return out


async def _peers(count: int) -> list[_Peer]:
    loop, peers = asyncio.get_running_loop(), []
    for _ in range(count):
        ours, theirs = socket.socketpair()
        _, conn = await loop.connect_accepted_socket(lambda: Connection(lambda code: None), ours)
        peers.append(_Peer(theirs, conn))
    return peers


async def _loop_turns(n: int = 5) -> None:
    for _ in range(n):  # a reply queued or written too early would reach the socket within these
        await asyncio.sleep(0)


@pytest.mark.unit
def test_held_replies_are_written_only_after_their_fdatasync_and_a_closed_connection_spares_the_others(
    tmp_path,
) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _Gate(store)

        async def scenario() -> tuple[list[RemotingCommand], int, int, int]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 30.0)
            kept, dropped = await _peers(2)
            gate.close()
            ends = []
            for i in range(12):  # alternately to each connection, as two producers would
                ends.append(_put(store, i))
                acks.reply(ends[-1], (kept, dropped)[i % 2].conn, _reply_frame(i))
                if i == 0:
                    await poll(gate.entered.is_set, what="the group commit's flush")
            await _loop_turns()
            if kept.written() or dropped.written():
                gate.open.set()  # let the commit thread go before failing
                raise AssertionError("a reply was written before its fdatasync")
            held = kept.conn._in_flight
            dropped.sock.close()  # the peer goes away mid-group ...
            await poll(lambda: dropped.conn.closed, what="the closed connection seen")
            gate.open.set()  # ... and the group's commit still answers the other connection, all of it
            await poll(lambda: len(kept.replies()) == 6, what="the kept connection's six replies")
            replies = kept.replies()
            kept.conn.close()
            kept.sock.close()
            return replies, held, kept.conn._in_flight, dropped.conn._in_flight

        replies, held, kept_after, dropped_after = run_on_loop(scenario())
        assert held == 6 and kept_after == 0 and dropped_after == 0  # held as in flight until answered
        assert [(r.opaque, r.code, r.is_response) for r in replies] == [
            (i, ResponseCode.SUCCESS, True) for i in range(0, 12, 2)
        ]


@pytest.mark.expected_errors("group commit flush failed")
@pytest.mark.unit
def test_a_failed_fdatasync_answers_every_held_reply_before_it_flush_disk_timeout(tmp_path) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _Gate(store)

        async def scenario() -> tuple[list[RemotingCommand], asyncio.Future]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 30.0)
            (peer,) = await _peers(1)
            gate.close()
            gate.fail_next = True
            first = _put(store, 0)
            acks.reply(first, peer.conn, _reply_frame(0))
            await poll(gate.entered.is_set, what="the failing flush")
            for i in (1, 2):  # appended while that flush runs: not covered by it, answered by the next commit
                acks.reply(_put(store, i), peer.conn, _reply_frame(i))
            peer.conn.stop_reading()  # a server stopping waits for the held answers as for its tasks
            (stopping,) = peer.conn.tasks
            gate.open.set()
            await poll(lambda: len(peer.replies()) == 3, what="three answers")
            replies = peer.replies()
            peer.conn.close()
            peer.sock.close()
            return replies, stopping

        replies, stopping = run_on_loop(scenario())
        assert [(r.opaque, r.code) for r in replies] == [
            (0, ResponseCode.FLUSH_DISK_TIMEOUT),
            (1, ResponseCode.SUCCESS),
            (2, ResponseCode.SUCCESS),
        ]
        assert replies[0].is_response and replies[0].ext_fields["queueOffset"] == "0"  # the same answer, re-coded
        assert stopping.done()
        assert store.commitlog.queue.flushed_offset >= store.commitlog.max_offset


class _FlushThenHold:
    """In front of the CommitLog's flush: makes the real fdatasync first, then holds the commit thread (and so
    its answers) while closed; a commit covers only what was appended before it flushed."""

    def __init__(self, store: MessageStore) -> None:
        self.queue = store.commitlog.queue
        self._flush = self.queue.flush
        self.queue.flush = self
        self.open = threading.Event()
        self.held = threading.Event()
        self.durable = self.queue.flushed_offset
        self.held_durable = -1  # what the held commit made durable

    def __call__(self) -> int:
        durable = self._flush()
        if not self.open.is_set():
            self.held_durable = durable
            self.held.set()
            assert self.open.wait(30), "the test never opened the gate"
        self.durable = durable
        return durable


def _observe_handovers(conn: Connection, gate: _FlushThenHold) -> list[tuple[int, int]]:
    """(frames handed over in one ``answer_held_frames`` call, offset durable then), as the calls happen."""
    handovers: list[tuple[int, int]] = []
    answer_held_frames = conn.answer_held_frames

    def observed(frames: list[bytes]) -> None:
        handovers.append((len(frames), gate.durable))
        answer_held_frames(frames)

    conn.answer_held_frames = observed  # type: ignore[method-assign]
    return handovers


async def _nothing_written_until_the_gate_opens(peer: _Peer, gate: _FlushThenHold, count: int) -> list[RemotingCommand]:
    """With the commit held: nothing on ``peer``'s socket after some loop turns; then the gate opened, ``count``
    replies read, and the peer closed."""
    await _loop_turns()
    if peer.written():
        gate.open.set()
        raise AssertionError("a reply was written before the commit covering it told its listeners")
    gate.open.set()
    await poll(lambda: len(peer.replies()) == count, what=f"{count} replies")
    replies = peer.replies()
    peer.conn.close()
    peer.sock.close()
    return replies


@pytest.mark.unit
def test_a_commit_answers_exactly_the_replies_it_covers_in_one_handover_per_connection(tmp_path) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _FlushThenHold(store)

        async def scenario() -> tuple[list[tuple[int, int]], list[int], list[RemotingCommand]]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 30.0)
            (peer,) = await _peers(1)
            handovers = _observe_handovers(peer.conn, gate)
            # one burst, appended before any reply asks for a commit, so the first commit covers all three
            # (a reply after each put would let the commit thread flush after the first put alone)
            ends = [_put(store, i) for i in range(3)]
            for i in range(3):
                acks.reply(ends[i], peer.conn, _reply_frame(i))
            await poll(gate.held.is_set, what="the first commit's fdatasync")
            for i in range(3, 6):  # appended after that fdatasync: the next commit's
                ends.append(_put(store, i))
                acks.reply(ends[-1], peer.conn, _reply_frame(i))
            replies = await _nothing_written_until_the_gate_opens(peer, gate, 6)
            return handovers, ends, replies

        handovers, ends, replies = run_on_loop(scenario())
        assert [(r.opaque, r.code) for r in replies] == [(i, ResponseCode.SUCCESS) for i in range(6)]
        (first, first_durable), (second, second_durable) = handovers
        # the held commit covered the burst and no more; the handover after it answered exactly those three (the
        # offset durable when it ran may already be the next commit's, which can complete before the loop runs it)
        assert ends[2] <= gate.held_durable < ends[3]
        assert first == 3 and first_durable >= ends[2], "the first commit answered only what it covered"
        assert second == 3 and second_durable >= ends[5]


@pytest.mark.unit
def test_a_commit_asked_for_before_the_append_does_not_answer_the_reply_appended_after_it(tmp_path) -> None:
    with running(make_config(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        gate = _FlushThenHold(store)

        async def scenario() -> tuple[list[tuple[int, int]], int, list[RemotingCommand]]:
            acks = FlushAcks(asyncio.get_running_loop(), store.group_commit, lambda: 30.0)
            (peer,) = await _peers(1)
            handovers = _observe_handovers(peer.conn, gate)
            before = store.commitlog.max_offset
            acks.expect()  # the send path asks before its put
            await poll(gate.held.is_set, what="the commit asked for before the append")
            end = _put(store, 0)  # appended while that commit is held: it is not covered by it
            acks.reply(end, peer.conn, _reply_frame(0))
            replies = await _nothing_written_until_the_gate_opens(peer, gate, 1)
            assert before < end
            return handovers, end, replies

        handovers, end, replies = run_on_loop(scenario())
        assert [(r.opaque, r.code) for r in replies] == [(0, ResponseCode.SUCCESS)]
        ((count, durable),) = handovers
        assert count == 1 and durable >= end, "answered only by the commit covering it"
