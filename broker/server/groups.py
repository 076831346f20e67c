"""Subscription group configs (``SubscriptionGroupManager``), persisted as ``config/subscriptionGroup.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.remoting.protocol.body import SubscriptionGroupConfig, SubscriptionGroupWrapper
from broker.remoting.protocol.topic import DataVersion
from broker.server.config_manager import VersionedTableManager
from store import config_files as cf
from store import names
from store.constants import FILTERSRV_CONSUMER_GROUP, SELF_TEST_CONSUMER_GROUP, TOOLS_CONSUMER_GROUP, TRANS_CHECK_GROUP

# Groups a RocketMQ broker pre-creates for its own tools.
SYSTEM_GROUPS = (TOOLS_CONSUMER_GROUP, FILTERSRV_CONSUMER_GROUP, SELF_TEST_CONSUMER_GROUP, TRANS_CHECK_GROUP)


class SubscriptionGroupManager(VersionedTableManager[SubscriptionGroupConfig]):
    """Group configs by name (``{"dataVersion": ..., "subscriptionGroupTable": {group: config}}``)."""

    file_name = cf.SUBSCRIPTION_GROUP
    table_key = "subscriptionGroupTable"

    def __init__(self, config_dir: Path, auto_create: bool = True) -> None:
        super().__init__(config_dir)
        self.auto_create = auto_create

    def read_file(self) -> dict[str, Any]:
        return cf.load_subscription_groups(self.config_dir)

    def document(self, content: dict[str, Any]) -> dict[str, Any]:
        return cf.subscription_groups_document(content["subscriptionGroupTable"], content["dataVersion"])

    def parse_entry(self, name: str, raw: Any) -> SubscriptionGroupConfig:
        # An entry without groupName is named by its key.
        entry = {"groupName": name, **raw} if isinstance(raw, dict) else raw
        return SubscriptionGroupConfig.from_json(entry, f"subscription group {name!r}")

    def load(self) -> None:
        super().load()
        missing = [g for g in SYSTEM_GROUPS if g not in self.table]
        for g in missing:
            self.table[g] = SubscriptionGroupConfig(group_name=g)
        if missing:
            self.changed()

    def wrapper(self) -> SubscriptionGroupWrapper:
        """What GET_ALL_SUBSCRIPTIONGROUP_CONFIG carries."""
        return SubscriptionGroupWrapper(
            data_version=DataVersion.from_json(self.data_version), subscription_group_table=dict(self.table)
        )

    def find(self, group: str, create: bool = True) -> SubscriptionGroupConfig | None:
        """The group's config; created with RocketMQ's defaults when allowed (``autoCreateSubscriptionGroup``) and
        the name is legal (``names.group_error``), else None, as ``findSubscriptionGroupConfig``."""
        cfg = self.table.get(group)
        if cfg is None and create and self.auto_create and names.group_error(group) is None:
            cfg = self.table[group] = SubscriptionGroupConfig(group_name=group)
            self.changed()
        return cfg

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        """Create or replace a group's config (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)."""
        self.table[cfg.group_name] = cfg
        self.changed()

    def delete(self, group: str) -> bool:
        """Remove a group's config (DELETE_SUBSCRIPTIONGROUP); False when there was none."""
        if self.table.pop(group, None) is None:
            return False
        self.changed()
        return True
