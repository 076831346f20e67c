"""Queue allocation for clustering consumers: ``AllocateMessageQueueAveragely`` semantics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def allocate_averagely(current_cid: str, cids: Sequence[str], queues: Sequence[T]) -> list[T]:
    """The contiguous slice of the sorted ``queues`` that ``current_cid`` owns among the sorted ``cids``.

    Every consumer of a group computes this from the same inputs, so together they cover each queue exactly
    once: the first ``len(queues) % len(cids)`` consumers take one queue more than the rest, and consumers
    beyond the queue count get nothing.  A cid missing from ``cids`` (not yet seen by the broker) gets nothing.
    """
    cids = sorted(cids)
    queues = sorted(queues)  # type: ignore[type-var]
    if current_cid not in cids or not queues:
        return []
    index = cids.index(current_cid)
    n, m = len(queues), len(cids)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))]
