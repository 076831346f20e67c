"""The NameServer's KV config (``KVConfigManager``), persisted as RocketMQ's ``kvConfig.json``:
``{"configTable": {namespace: {key: value}}}``, rewritten (crash-safely, the old file kept as ``.bak``) on every
put and delete, loaded at start. A file that cannot be read stops the NameServer with an error naming it
(RocketMQ starts empty instead, which silently drops e.g. ORDER_TOPIC_CONFIG)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from store import config_files as cf

log = logging.getLogger(__name__)

DEFAULT_KV_CONFIG_PATH = Path.home() / "namesrv" / "kvConfig.json"  # NamesrvConfig.kvConfigPath


class KVConfigManager:
    def __init__(self, path: Path | None) -> None:
        """``path`` None: kept in memory only."""
        self.path = path
        self.table: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()  # puts run in worker threads (the write fsyncs): one change at a time

    def load(self) -> None:
        if self.path is None:
            return
        data = cf.read_config(self.path)
        if data is None:
            return
        table = data.get("configTable", {})
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise cf.ConfigFileError(self.path, "configTable must map namespaces to {key: value} objects")
        self.table = {ns: {str(k): str(v) for k, v in kv.items()} for ns, kv in table.items()}
        log.info("loaded %d KV namespaces from %s", len(self.table), self.path)

    def _persist(self) -> None:
        if self.path is not None:
            cf.write_config(self.path, {"configTable": self.table})

    def put(self, namespace: str, key: str, value: str) -> None:
        with self._lock:
            self.table.setdefault(namespace, {})[key] = value
            self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        with self._lock:
            kv = self.table.get(namespace)
            if kv is not None and kv.pop(key, None) is not None:
                if not kv:
                    del self.table[namespace]
                self._persist()

    def namespace(self, namespace: str) -> dict[str, str]:
        return dict(self.table.get(namespace, {}))
