"""Committed consumer offsets (``ConsumerOffsetManager``), persisted as ``config/consumerOffset.json``.

Commits happen on the event loop; the periodic persist takes a snapshot there and writes it from a
worker thread, so a slow fsync never stalls request handling.
"""

from __future__ import annotations

import threading
from pathlib import Path

from store import config_files as cf

TOPIC_GROUP_SEPARATOR = "@"


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


class ConsumerOffsetManager:
    def __init__(self, config_dir: Path) -> None:
        self.config_dir = Path(config_dir)
        self.table: dict[str, dict[int, int]] = {}
        self._dirty = False
        self._persist_lock = threading.Lock()  # a periodic persist and the shutdown one must not interleave

    def load(self) -> None:
        self.table = cf.load_consumer_offsets(self.config_dir)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.setdefault(offset_key(topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for this queue."""
        return self.table.get(offset_key(topic, group), {}).get(queue_id, -1)

    def query_all(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(offset_key(topic, group), {}))

    def groups_of_topic(self, topic: str) -> set[str]:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return {k[len(prefix) :] for k in list(self.table) if k.startswith(prefix)}

    def topics_of_group(self, group: str) -> set[str]:
        suffix = TOPIC_GROUP_SEPARATOR + group
        return {k[: -len(suffix)] for k in list(self.table) if k.endswith(suffix)}

    def snapshot(self) -> dict[str, dict[int, int]] | None:
        """A copy to persist, or None when nothing changed since the last snapshot."""
        if not self._dirty:
            return None
        self._dirty = False
        return {k: dict(v) for k, v in self.table.items()}

    def write(self, snapshot: dict[str, dict[int, int]]) -> None:
        """Blocking write of a snapshot (run it off the event loop)."""
        with self._persist_lock:
            cf.save_consumer_offsets(self.config_dir, snapshot)

    def persist(self) -> None:
        snap = self.snapshot()
        if snap is not None:
            self.write(snap)
