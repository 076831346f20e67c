"""Subscription group configs (``SubscriptionGroupManager``), persisted as ``config/subscriptionGroup.json``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store import config_files as cf

# Groups a RocketMQ broker pre-creates for its own tools.
SYSTEM_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_RMQ_SYS_TRANS")


class SubscriptionGroupManager:
    """Group configs by name; like the topic table, persisted by ``on_change`` when set, else at once."""

    def __init__(self, config_dir: Path, auto_create: bool = True) -> None:
        self.config_dir = Path(config_dir)
        self.auto_create = auto_create
        self.table: dict[str, dict[str, Any]] = {}
        self.data_version: dict[str, Any] = {"counter": 0, "timestamp": 0}
        self.on_change: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        data = cf.load_subscription_groups(self.config_dir)
        self.data_version = data["dataVersion"]
        self.table = {name: dict(cfg) for name, cfg in data["subscriptionGroupTable"].items()}
        missing = [g for g in SYSTEM_GROUPS if g not in self.table]
        for g in missing:
            self.table[g] = cf.subscription_group_config(g)
        if missing:
            self._changed()

    def _changed(self) -> None:
        self.data_version = cf.next_data_version(self.data_version)
        if self.on_change is not None:
            self.on_change()
        else:
            self.persist()

    def persist(self) -> None:
        with self._lock:
            snapshot = {name: dict(cfg) for name, cfg in list(self.table.items())}
            cf.save_subscription_groups(self.config_dir, snapshot, dict(self.data_version))

    def find(self, group: str, create: bool = True) -> dict[str, Any] | None:
        """The group's config; created with RocketMQ's defaults when allowed (``autoCreateSubscriptionGroup``)."""
        cfg = self.table.get(group)
        if cfg is None and create and self.auto_create:
            cfg = self.table[group] = cf.subscription_group_config(group)
            self._changed()
        return cfg

    def update(self, cfg: dict[str, Any]) -> None:
        self.table[cfg["groupName"]] = {**cf.subscription_group_config(cfg["groupName"]), **cfg}
        self._changed()
