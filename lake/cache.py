"""A bounded, thread-safe LRU of decoded parquet row groups, so a consumer walking a tiered queue reads each
row group once rather than once per pull."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class SizedLRU(Generic[V]):
    """Values with a size in bytes; the least recently used leave once the total passes ``capacity``.

    A value larger than the whole capacity is returned to its caller but not kept.  Loads run outside the
    lock (they read files); two threads missing the same key may both load it, and the later one wins.
    """

    def __init__(self, capacity: int, size_of: Callable[[V], int]) -> None:
        self.capacity = capacity
        self._size_of = size_of
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, load: Callable[[], V]) -> V:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found[0]
            self.misses += 1
        value = load()
        size = self._size_of(value)
        if size > self.capacity:
            return value
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.capacity:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value kept under ``key`` (None: none), leaving hit and miss counts and the order as they are."""
        with self._lock:
            found = self._items.get(key)
        return None if found is None else found[0]

    def __len__(self) -> int:
        return len(self._items)
