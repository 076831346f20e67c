"""SYNC_FLUSH acknowledgements on the event loop, a whole group commit at a time.

RocketMQ's GroupCommitService answers a synchronous send only after the fdatasync that covers its record, and
with FLUSH_DISK_TIMEOUT when that has not happened within ``syncFlushTimeout``.  A future per put, each waited
on with ``asyncio.wrap_future``, costs a ``call_soon_threadsafe`` (a wake-up of the loop) per put; here the
commit thread schedules ONE loop callback per group commit, which answers every waiter the commit made durable.

Waiters are kept in append order: the puts of the loop are appended one after the other on the loop's thread,
so their end offsets grow along the queue, and so do their deadlines (now + the timeout).  A commit answers
from the front while the end offset is covered; one timer, armed for the oldest waiter, answers from the front
while the deadline has passed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from store.commitlog import GroupCommitService

Done = Callable[[bool], None]


class FlushAcks:
    """Waiters for the group commit of one store, answered on ``loop``: ``done(True)`` once the record is on
    disk, ``done(False)`` when the flush failed or ``timeout()`` seconds passed first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, commit: GroupCommitService, timeout: Callable[[], float]):
        self._loop = loop
        self._commit = commit
        self._timeout = timeout
        self._waiters: collections.deque[tuple[int, float, Done]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self.groups = 0  # loop callbacks made by commits that had waiters (each answers a whole group)
        commit.add_group_listener(self._committed)

    def wait(self, end_offset: int, done: Done) -> None:
        """Call ``done`` once everything before ``end_offset`` (the end of a record just appended) is durable.
        On the loop's thread, right after the append, so that waiters stay in offset order."""
        deadline = self._loop.time() + self._timeout()
        self._waiters.append((end_offset, deadline, done))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._expire)
        self._commit.request()

    def _committed(self, ok: bool, offset: int) -> None:
        # On the commit thread. Nothing to answer: no wake-up of the loop (a waiter added after this check made
        # its own request, which the next commit serves).
        if self._waiters:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to answer
                self._loop.call_soon_threadsafe(self._answer, ok, offset)

    def _answer(self, ok: bool, offset: int) -> None:
        waiters = self._waiters
        answered = False
        while waiters and waiters[0][0] <= offset:
            answered = True
            waiters.popleft()[2](ok)
        if answered:
            self.groups += 1

    def _expire(self) -> None:
        self._timer = None
        waiters = self._waiters
        now = self._loop.time()
        while waiters and waiters[0][1] <= now:
            waiters.popleft()[2](False)
        if waiters:
            self._timer = self._loop.call_at(waiters[0][1], self._expire)
