"""Queue locks for orderly consumers (``RebalanceLockManager``): one client per queue per group.

A lock lapses 60 s after its holder last renewed it (the client re-locks every 20 s), so a consumer
that died without unlocking frees its queues within a minute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from broker.remoting.protocol.body import MessageQueueKey

LOCK_MAX_LIVE_MS = 60_000


class RebalanceLockManager:
    def __init__(self, max_live_ms: int = LOCK_MAX_LIVE_MS, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: seconds from any fixed point (a test passes one it advances itself)."""
        self.max_live_ms = max_live_ms
        self._clock = clock
        self._locks: dict[str, dict[MessageQueueKey, tuple[str, float]]] = {}  # group -> mq -> (client, time)

    def _held_by_other(self, group: str, mq: MessageQueueKey, client_id: str, now: float) -> bool:
        entry = self._locks.get(group, {}).get(mq)
        return entry is not None and entry[0] != client_id and now - entry[1] < self.max_live_ms

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueueKey], client_id: str) -> list[MessageQueueKey]:
        """Lock (or renew) every queue not held by another live client; returns the ones now held."""
        now = self._clock() * 1000
        table = self._locks.setdefault(group, {})
        locked = []
        for mq in mqs:
            if self._held_by_other(group, mq, client_id, now):
                continue
            table[mq] = (client_id, now)
            locked.append(mq)
        return locked

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueueKey], client_id: str) -> None:
        table = self._locks.get(group, {})
        for mq in mqs:
            entry = table.get(mq)
            if entry is not None and entry[0] == client_id:
                del table[mq]

    def is_locked(self, group: str, topic: str | None = None, queue_id: int | None = None) -> bool:
        """Whether the group holds an unexpired lock (on ``topic``, on ``queue_id``, when given)."""
        now = self._clock() * 1000
        for (t, _b, q), (_c, ts) in list(self._locks.get(group, {}).items()):
            if (topic is None or t == topic) and (queue_id is None or q == queue_id) and now - ts < self.max_live_ms:
                return True
        return False
