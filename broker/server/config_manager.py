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
from typing import Any, Generic, TypeVar

from store import config_files as cf

Content = TypeVar("Content")


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

