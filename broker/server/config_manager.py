"""``ConfigManager``: a table the broker keeps in one JSON file under ``<storeRoot>/config/`` (RocketMQ's
``ConfigManager``): topics, subscription groups, consumer offsets.

The file layer (store/config_files.py) reads a file with its ``.bak`` fallback and writes it crash-safely; each
manager names its file and its typed reader and document (``read_file``/``document``), and converts between the
file's content and its table (``decode``/``encode``).
"""

from __future__ import annotations

import asyncio
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
    running broker persists through ``persist_async``, so the encoding and the fsync stay off the event loop, and
    re-registers — else it is persisted before ``changed`` returns.
    """

    file_name: ClassVar[str]  # under config_dir

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = Path(config_dir)
        self.data_version: dict[str, Any] = {"counter": 0, "timestamp": 0}
        self.on_change: Callable[[], None] | None = None
        self._persist_lock = threading.Lock()  # a persist at start-up and a tool's must not interleave
        # On the running broker every write goes through the loop's async path, one at a time in the order asked
        # (an asyncio.Lock is FIFO), each taking its snapshot when its turn comes: the newest state is written last.
        self._async_lock = asyncio.Lock()

    @property
    def path(self) -> Path:
        return self.config_dir / self.file_name

    # --- what the file holds --------------------------------------------------------------------------------
    @abstractmethod
    def read_file(self) -> Content:
        """The file's content (its ``.bak``'s when the file is unusable; empty when neither exists)."""

    @abstractmethod
    def document(self, content: Content) -> dict[str, Any]:
        """``content`` as the file's JSON document."""

    @abstractmethod
    def decode(self, content: Content) -> None:
        """Take the file's content as the table; ConfigFileError naming the file when it does not fit."""

    @abstractmethod
    def encode(self) -> Content:
        """The table as the file's content."""

    def written(self, content: Content) -> None:
        """Called once ``content`` is on disk."""

    # --- life cycle -----------------------------------------------------------------------------------------
    def load(self) -> None:
        self.decode(self.read_file())

    def snapshot(self) -> Content | None:
        """What to persist now, or None when nothing changed since the last snapshot.

        Topics and groups take it in a worker thread (``persist_async``) while the event loop may change the
        table: their ``encode`` reads the data version, then copies the table in one step (``list(table.items())``,
        atomic under the GIL), and no entry is changed in place after loading (a change replaces it). Consumer
        offsets change in place on every commit: theirs is taken on the event loop (``write_async``).
        """
        return self.encode()

    def write_file(self, content: Content) -> None:
        """Write ``content`` (blocking; the old file becomes the ``.bak``)."""
        cf.write_config(self.path, self.document(content))
        self.written(content)

    def write(self, content: Content) -> None:
        """Write a snapshot (blocking: for start-up and tools; the running broker uses ``write_async``)."""
        with self._persist_lock:
            self.write_file(content)

    def persist(self) -> None:
        """Write the current table (blocking: for start-up and tools; the running broker uses ``persist_async``)."""
        with self._persist_lock:
            content = self.snapshot()
            if content is not None:
                self.write_file(content)

    def _payload(self, content: Content) -> bytes:
        return cf.config_payload(self.document(content))

    def _snapshot_payload(self) -> tuple[Content, bytes] | None:
        content = self.snapshot()
        return None if content is None else (content, self._payload(content))

    async def _write_payload(self, content: Content, payload: bytes) -> None:
        await cf.replace_file_async(self.path, payload, backup=True)
        self.written(content)

    async def write_async(self, content: Content) -> None:
        """Write a snapshot taken on the loop: encoded in a worker thread (a big table is milliseconds of JSON),
        written through aiofiles."""
        async with self._async_lock:
            await self._write_payload(content, await asyncio.to_thread(self._payload, content))

    async def persist_async(self) -> None:
        """Write the current table from the event loop: snapshot and encoding in a worker thread, the file through
        aiofiles."""
        async with self._async_lock:
            taken = await asyncio.to_thread(self._snapshot_payload)
            if taken is not None:
                await self._write_payload(*taken)

    def changed(self) -> None:
        self.data_version = cf.next_data_version(self.data_version)
        if self.on_change is not None:
            self.on_change()
        else:
            self.persist()


class VersionedTableManager(ConfigManager[dict[str, Any]], Generic[Entry]):
    """A table of wire models by name under a dataVersion, as topics.json and subscriptionGroup.json hold it:
    ``{"dataVersion": {...}, "<table_key>": {name: entry}}``."""

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
            raise cf.ConfigFileError(self.path, str(e)) from None
        self.data_version, self.table = content["dataVersion"], table

    def encode(self) -> dict[str, Any]:
        version = self.data_version  # first: the table written is never older than the version it claims
        table = {name: entry.to_json() for name, entry in list(self.table.items())}
        return {"dataVersion": dict(version), self.table_key: table}

