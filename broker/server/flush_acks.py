"""SYNC_FLUSH acknowledgements on the event loop, a whole group commit at a time.

RocketMQ's GroupCommitService answers a synchronous send only after the fdatasync that covers its record, and
with FLUSH_DISK_TIMEOUT when that has not happened within ``syncFlushTimeout``.  A future per put, each waited
on with ``asyncio.wrap_future``, costs a ``call_soon_threadsafe`` (a wake-up of the loop) per put; here the
commit thread schedules ONE loop callback per group commit, which answers every waiter the commit made durable.

Waiters are kept in append order: the puts of the loop are appended one after the other on the loop's thread,
so their end offsets grow along the queue, and so do the times they were added.  A commit answers from the
front while the end offset is covered; one timer, armed for the oldest waiter, answers from the front while the
timeout (read when the timer fires, not per waiter) has passed since a waiter was added.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection
from store.commitlog import GroupCommitService

Done = Callable[[bool], None]

log = logging.getLogger(__name__)


class FlushAcks:
    """Waiters for the group commit of one store, answered on ``loop``: ``done(True)`` once the record is on
    disk, ``done(False)`` when the flush failed or ``timeout()`` seconds passed first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, commit: GroupCommitService, timeout: Callable[[], float]):
        self._loop = loop
        self._commit = commit
        self._timeout = timeout
        # (end offset, time added, done, None) for ``wait``; (end offset, time added, connection, frame) for ``reply``
        self._waiters: collections.deque[tuple[int, float, Any, bytes | None]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self.groups = 0  # loop callbacks made by commits that had waiters (each answers a whole group)
        commit.add_group_listener(self._committed)

    def wait(self, end_offset: int, done: Done) -> None:
        """Call ``done`` once everything before ``end_offset`` (the end of a record just appended) is durable.
        On the loop's thread, right after the append, so that waiters stay in offset order."""
        self._add(end_offset, done, None)

    def expect(self) -> None:
        """Ask for a group commit before appending a send that ``reply`` or ``wait`` will then hold.

        The append wakes the dispatch thread, and of the threads waiting for the GIL while the loop handles a burst
        of sends, the one woken first gets it first when the loop goes idle.  Asked after the append, the commit
        thread came second: its fdatasync started 110 us after the burst, behind dispatch's turn; asked before,
        30 us after it (traced, 64 sends a burst).  A commit that takes this request before the append (only a
        forced switch of the GIL lets it) covers less, never too much: ``reply`` asks again after the append,
        and a waiter is answered only by a commit whose fdatasync covered its end offset."""
        self._commit.request()

    def reply(self, end_offset: int, conn: Connection, frame: bytes) -> None:
        """Answer a request of ``conn`` with its ready reply ``frame`` once everything before ``end_offset`` is
        durable, or with the same answer coded FLUSH_DISK_TIMEOUT when the flush failed or took longer than the
        timeout.  The request is held on the connection meanwhile (``Connection.hold_answer``): no future, no
        callback per request; a group's replies to one connection go out in one write."""
        conn.hold_answer()
        self._add(end_offset, conn, frame)

    def future(self, end_offset: int, frame: bytes) -> asyncio.Future[RemotingCommand | bytes]:
        """:meth:`reply` for a channel that is no remoting connection (the gRPC proxy's): a loop future completed
        with ``frame``, or with the same answer coded FLUSH_DISK_TIMEOUT."""
        fut: asyncio.Future[RemotingCommand | bytes] = self._loop.create_future()

        def settle(flushed: bool) -> None:
            if not fut.done():  # cancelled by a server that stopped waiting
                fut.set_result(frame if flushed else _late(frame))

        self._add(end_offset, settle, None)
        return fut

    def _add(self, end_offset: int, answer: Connection | Done, frame: bytes | None) -> None:
        added = self._loop.time()
        self._waiters.append((end_offset, added, answer, frame))
        if self._timer is None:
            self._timer = self._loop.call_at(added + self._timeout(), self._expire)
        self._commit.request()

    def _committed(self, ok: bool, offset: int) -> None:
        # On the commit thread. Nothing to answer: no wake-up of the loop (a waiter added after this check made
        # its own request, which the next commit serves).
        if self._waiters:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to answer
                self._loop.call_soon_threadsafe(self._answer, ok, offset)

    def _answer(self, ok: bool, offset: int) -> None:
        waiters = self._waiters
        if not waiters or waiters[0][0] > offset:
            return
        self.groups += 1
        # A run of flushed replies to one connection (64 sends in flight on one channel make a group of 64) is
        # handed over in one call: per reply, only the deque's pop and a list append.
        conn: Connection | None = None
        frames: list[bytes] = []
        while waiters and waiters[0][0] <= offset:
            _, _, answer, frame = waiters.popleft()
            if frame is not None and ok:
                if answer is not conn:
                    if conn is not None:
                        _answer_frames(conn, frames)
                    conn, frames = answer, []
                frames.append(frame)
            else:
                _answer(answer, frame, ok)
        if conn is not None:
            _answer_frames(conn, frames)

    def _expire(self) -> None:
        self._timer = None
        waiters = self._waiters
        now = self._loop.time()
        timeout = self._timeout()
        while waiters and waiters[0][1] + timeout <= now:
            _, _, answer, frame = waiters.popleft()
            _answer(answer, frame, False)
        if waiters:
            self._timer = self._loop.call_at(waiters[0][1] + timeout, self._expire)


def _answer(answer: Connection | Done, frame: bytes | None, ok: bool) -> None:
    try:
        if frame is None:  # a ``wait``
            cast(Done, answer)(ok)
        elif ok:
            cast(Connection, answer).answer_held(frame)
        else:
            cast(Connection, answer).answer_held(_late(frame))
    except Exception:  # one waiter's failure must not leave the rest of its group unanswered
        log.exception("answering a SYNC_FLUSH waiter failed")


def _late(frame: bytes) -> RemotingCommand:
    """A send's ready reply ``frame`` coded FLUSH_DISK_TIMEOUT: Java's answer when the message is stored and only
    its flush is not confirmed."""
    late = RemotingCommand.decode(frame[4:])
    late.code = ResponseCode.FLUSH_DISK_TIMEOUT
    return late


def _answer_frames(conn: Connection, frames: list[bytes]) -> None:
    try:
        conn.answer_held_frames(frames)
    except Exception:  # one connection's failure must not leave the other connections of the group unanswered
        log.exception("answering SYNC_FLUSH sends failed")
