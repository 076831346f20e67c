"""Parked pulls (``PullRequestHoldService``): a PULL_MESSAGE that found nothing waits for a message.

A parked pull waits under ``topic@queueId`` until (a) the store's dispatch thread reports a message for
that queue past the pull's offset that matches its tags, (b) its own suspend timeout, or (c) shutdown.
The arrival listener runs on the dispatch thread: it only looks at a dict of parked keys and, when one
matches, hops to the event loop with ``call_soon_threadsafe``, so an idle queue costs no wake-ups.
A periodic re-check (5 s, or the short-polling interval) catches anything a notification missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from store.message_store import MAX_FILTER_UNITS

log = logging.getLogger(__name__)


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(False)


@dataclass(slots=True, eq=False)
class _Parked:
    offset: int
    tag_codes: set[int] | None
    future: asyncio.Future
    # a property filter's test of the arrived messages: whether one at or after next offset - 1 matches
    accept: Callable[[int], bool] | None = None


class PullRequestHoldService:
    def __init__(self, max_offset: Callable[[str, int], int], check_interval: float = 5.0) -> None:
        self._max_offset = max_offset  # store.get_max_offset_in_queue
        self._check_interval = check_interval
        self._parked: dict[str, list[_Parked]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._closing = False

    @staticmethod
    def key(topic: str, queue_id: int) -> str:
        return f"{topic}@{queue_id}"

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._periodic_check(), name="pull-hold-check")

    async def stop(self) -> None:
        """Release every parked pull (each is then answered normally) and stop the periodic check."""
        self._closing = True
        for waiters in list(self._parked.values()):
            for p in waiters:
                if not p.future.done():
                    p.future.set_result(False)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def parked_count(self) -> int:
        return sum(len(v) for v in self._parked.values())

    async def wait(self, topic: str, queue_id: int, offset: int, tag_codes: set[int] | None, timeout: float,
                   accept: Callable[[int], bool] | None = None) -> bool:  # fmt: skip
        """Park until a message at or after ``offset`` arrives (True) or ``timeout`` seconds pass (False).
        ``accept``, when given, is asked on the loop whether an arrived message matches the pull's filter."""
        if self._closing or timeout <= 0:
            return False
        key = self.key(topic, queue_id)
        loop = asyncio.get_running_loop()
        parked = _Parked(offset, tag_codes, loop.create_future(), accept)
        self._parked.setdefault(key, []).append(parked)
        # A timer resolving the future with False, rather than wait_for + shield: every delivered message
        # re-parks a pull, and wait_for's extra futures and callbacks cost more than the pull itself.
        timer = loop.call_later(timeout, _expire, parked.future)
        try:
            # A message may have been dispatched between the pull's read and this registration.
            if self._max_offset(topic, queue_id) > offset:
                return True
            return await parked.future
        finally:
            timer.cancel()
            waiters = self._parked.get(key)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(parked)
                if not waiters:
                    self._parked.pop(key, None)

    # --- notifications ---------------------------------------------------------------------------------
    def on_arrival(self, topic: str, queue_id: int, max_offset: int, tags_codes: tuple[int, ...], _ts: int) -> None:
        """The store's arrival listener (once per queue for a run of records); runs on the dispatch thread."""
        key = self.key(topic, queue_id)
        if key in self._parked and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                self._loop.call_soon_threadsafe(self._wake, key, max_offset, tags_codes)

    def _wake(self, key: str, max_offset: int, tags_codes: tuple[int, ...] | None) -> None:
        """Wake the pulls parked under ``key`` that the records arrived before ``max_offset`` answer: ``tags_codes``
        are those records' tags codes in queue order, or None when unknown (the periodic re-check)."""
        for p in list(self._parked.get(key, ())):
            if p.future.done() or max_offset <= p.offset:
                continue
            if tags_codes is not None:
                # the arrived records end at max_offset; those before the pull's offset do not answer it
                fresh = tags_codes[max(0, len(tags_codes) - (max_offset - p.offset)) :]
                if p.tag_codes is not None and p.tag_codes.isdisjoint(fresh):
                    continue
                # the filter's read scans up to MAX_FILTER_UNITS forward from where it starts
                first = max_offset - len(fresh)
                if p.accept is not None and not any(
                    self._accepts(p, at + 1) for at in range(first, max_offset, MAX_FILTER_UNITS)
                ):
                    continue
            p.future.set_result(True)

    @staticmethod
    def _accepts(p: _Parked, next_offset: int) -> bool:
        try:
            return p.accept is not None and p.accept(next_offset)
        except Exception:  # a filter that fails wakes the pull, whose own read then answers
            log.exception("long-poll filter failed")
            return True

    async def _periodic_check(self) -> None:
        while True:
            await asyncio.sleep(self._check_interval)
            for key in list(self._parked):
                topic, _, qid = key.rpartition("@")
                try:
                    # Without a tags code every parked pull behind the queue's end is re-run (it may find
                    # only non-matching messages and park again, as RocketMQ's re-check does).
                    self._wake(key, self._max_offset(topic, int(qid)), None)
                except Exception:
                    log.exception("long-poll re-check of %s failed", key)
