"""``ConfigManager``: a table the broker keeps in one JSON file under ``<storeRoot>/config/`` (RocketMQ's
``ConfigManager``): topics, subscription groups, consumer offsets.

The file layer (store/config_files.py) reads a file with its ``.bak`` fallback and writes it crash-safely; each
manager names its file's typed pair (``read_file``/``write_file``) and converts between the file's content and its
table (``decode``/``encode``).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from broker.remoting.protocol.wire import BodyError, WireModel
from store import config_files as cf

Content = TypeVar("Content")
Entry = TypeVar("Entry", bound=WireModel)


class ConfigManager(ABC, Generic[Content]):
    """Load, change, persist.

    A change bumps ``data_version`` (``DataVersion.nextVersion``) and is handed to ``on_change`` when set — the
    broker persists from a worker thread, so the fsync stays off the event loop, and re-registers — else it is
    persisted before ``changed`` returns.
    """

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = Path(config_dir)
        self.data_version: dict[str, Any] = {"counter": 0, "timestamp": 0}
        self.on_change: Callable[[], None] | None = None
        self._persist_lock = threading.Lock()  # a periodic persist and the shutdown one must not interleave

    # --- what the file holds --------------------------------------------------------------------------------
    @abstractmethod
    def read_file(self) -> Content:
        """The file's content (its ``.bak``'s when the file is unusable; empty when neither exists)."""

    @abstractmethod
    def write_file(self, content: Content) -> None:
        """Write ``content`` (blocking; the old file becomes the ``.bak``)."""

    @abstractmethod
    def decode(self, content: Content) -> None:
        """Take the file's content as the table; ConfigFileError naming the file when it does not fit."""

    @abstractmethod
    def encode(self) -> Content:
        """The table as the file's content."""

    # --- life cycle -----------------------------------------------------------------------------------------
    def load(self) -> None:
        self.decode(self.read_file())

    def snapshot(self) -> Content | None:
        """What to persist now, or None when nothing changed since the last snapshot.

        Topics and groups take it in a worker thread (``persist``) while the event loop may change the table:
        their ``encode`` reads the data version, then copies the table in one step (``list(table.items())``, atomic
        under the GIL), and no entry is changed in place after loading (a change replaces it); each change
        schedules its own persist, so the newest state is written last. Consumer offsets change in place on every
        commit: theirs is taken on the event loop, and only the write runs in a thread.
        """
        return self.encode()

    def write(self, content: Content) -> None:
        """Write a snapshot (blocking: run it off the event loop)."""
        with self._persist_lock:
            self.write_file(content)

    def persist(self) -> None:
        """Write the current table (from a worker thread only where ``snapshot`` allows it)."""
        with self._persist_lock:
            content = self.snapshot()
            if content is not None:
                self.write_file(content)

    def changed(self) -> None:
        self.data_version = cf.next_data_version(self.data_version)
        if self.on_change is not None:
            self.on_change()
        else:
            self.persist()


class VersionedTableManager(ConfigManager[dict[str, Any]], Generic[Entry]):
    """A table of wire models by name under a dataVersion, as topics.json and subscriptionGroup.json hold it:
    ``{"dataVersion": {...}, "<table_key>": {name: entry}}``."""

    file_name: ClassVar[str]  # under config_dir: names the file in a ConfigFileError
    table_key: ClassVar[str]

    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self.table: dict[str, Entry] = {}

    @abstractmethod
    def parse_entry(self, name: str, raw: Any) -> Entry:
        """One entry of the file as its model; BodyError when it does not fit."""

    def decode(self, content: dict[str, Any]) -> None:
        try:
            table = {name: self.parse_entry(name, raw) for name, raw in content[self.table_key].items()}
        except BodyError as e:
            raise cf.ConfigFileError(self.config_dir / self.file_name, str(e)) from None
        self.data_version, self.table = content["dataVersion"], table

    def encode(self) -> dict[str, Any]:
        version = self.data_version  # first: the table written is never older than the version it claims
        table = {name: entry.to_json() for name, entry in list(self.table.items())}
        return {"dataVersion": dict(version), self.table_key: table}

