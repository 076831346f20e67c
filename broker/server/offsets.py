"""Committed consumer offsets (``ConsumerOffsetManager``), persisted as ``config/consumerOffset.json``.

Commits happen on the event loop; the periodic persist takes a snapshot there and writes it through aiofiles
(``write_async``), so a slow fsync never stalls request handling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.server.config_manager import ConfigManager
from store import config_files as cf

TOPIC_GROUP_SEPARATOR = "@"

OffsetTable = dict[str, dict[int, int]]  # "topic@group" -> queueId -> offset


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


class ConsumerOffsetManager(ConfigManager[OffsetTable]):
    file_name = cf.CONSUMER_OFFSET

    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self.table: OffsetTable = {}
        self._dirty = False

    def read_file(self) -> OffsetTable:
        return cf.load_consumer_offsets(self.config_dir)

    def document(self, content: OffsetTable) -> dict[str, Any]:
        return cf.consumer_offsets_document(content)

    def decode(self, content: OffsetTable) -> None:
        self.table = content

    def encode(self) -> OffsetTable:
        return {k: dict(v) for k, v in self.table.items()}

    def snapshot(self) -> OffsetTable | None:
        """A copy to persist, or None when nothing changed since the last snapshot; take it on the event loop,
        where commits change the table in place."""
        if not self._dirty:
            return None
        self._dirty = False
        return self.encode()

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

    def remove_topic(self, topic: str) -> None:
        """Every group's offsets of ``topic`` (``cleanOffsetByTopic``)."""
        for key in [k for k in self.table if k.startswith(topic + TOPIC_GROUP_SEPARATOR)]:
            del self.table[key]
            self._dirty = True

    def remove_group(self, group: str) -> None:
        """Every offset ``group`` committed (``removeOffset``)."""
        for key in [k for k in self.table if k.endswith(TOPIC_GROUP_SEPARATOR + group)]:
            del self.table[key]
            self._dirty = True

    def clone(self, src: str, dest: str, topic: str) -> None:
        """``dest`` takes ``src``'s offsets of ``topic`` (``cloneOffset``)."""
        queues = self.table.get(offset_key(topic, src))
        if queues is not None:
            self.table[offset_key(topic, dest)] = dict(queues)
            self._dirty = True
