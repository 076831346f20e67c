"""The broker's topic table (``TopicConfigManager``), persisted as ``config/topics.json``.

Besides user topics it holds the system topics a RocketMQ broker creates for itself, so tools that
look for them (mqadmin, the clients' auto-create path via ``TBW102``) find them.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store import config_files as cf

log = logging.getLogger(__name__)

# PermName bits
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
DLQ_NUMS_PER_GROUP = 1
TOPIC_MAX_LENGTH = 127
_TOPIC_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")

# TopicSysFlag
FLAG_UNIT = 0x1
FLAG_UNIT_SUB = 0x2


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def topic_name_error(topic: str | None) -> str | None:
    """Why a topic name is unacceptable (``Validators.checkTopic`` / ``TopicValidator``), or None."""
    if not topic:
        return "the specified topic is blank"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"the specified topic is longer than topic max length {TOPIC_MAX_LENGTH}"
    if not _TOPIC_CHARS.match(topic):
        return f"the specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


@dataclass(slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        d = cf.topic_config(
            self.topic_name, self.read_queue_nums, self.write_queue_nums, self.perm, self.order, self.topic_sys_flag
        )
        d["topicFilterType"] = self.topic_filter_type
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(d["topicName"]),
            read_queue_nums=int(d.get("readQueueNums", 16)),
            write_queue_nums=int(d.get("writeQueueNums", 16)),
            perm=int(d.get("perm", PERM_READ | PERM_WRITE)),
            topic_filter_type=str(d.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(d.get("topicSysFlag", 0)),
            order=bool(d.get("order", False)),
        )


class TopicConfigManager:
    """Topic configs by name; every change bumps the data version and is persisted.

    With ``on_change`` set (the broker does), persisting is left to it, so the fsync can run off the event
    loop; without it, ``update`` persists before returning.
    """

    def __init__(
        self,
        config_dir: Path,
        *,
        cluster_name: str,
        broker_name: str,
        auto_create_topic_enable: bool,
        default_topic_queue_nums: int,
        cluster_topic_enable: bool = True,
        broker_topic_enable: bool = True,
    ) -> None:
        self.config_dir = Path(config_dir)
        self.auto_create_topic_enable = auto_create_topic_enable
        self.default_topic_queue_nums = default_topic_queue_nums
        self.table: dict[str, TopicConfig] = {}
        self.data_version: dict[str, Any] = {"counter": 0, "timestamp": 0}
        self.on_change: Callable[[], None] | None = None
        self._lock = threading.Lock()
        inherit_rw = PERM_INHERIT | PERM_READ | PERM_WRITE
        # TBW102 is the template clients route unknown topics by; INHERIT lets a send auto-create from it.
        tbw_perm = inherit_rw if auto_create_topic_enable else PERM_READ | PERM_WRITE
        self._system = [
            TopicConfig(SELF_TEST_TOPIC, 1, 1),
            TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums, default_topic_queue_nums, tbw_perm),
            TopicConfig(cluster_name, 16, 16, inherit_rw if cluster_topic_enable else PERM_INHERIT),
            TopicConfig(broker_name, 1, 1, inherit_rw if broker_topic_enable else PERM_INHERIT),
            TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
            TopicConfig(SCHEDULE_TOPIC, 18, 18),
        ]

    # --- persistence -------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read topics.json (or its .bak); add missing system topics. The file wins, except TBW102's perm."""
        data = cf.load_topics(self.config_dir)
        self.data_version = data["dataVersion"]
        for name, raw in data["topicConfigTable"].items():
            try:
                self.table[name] = TopicConfig.from_json(raw)
            except (KeyError, TypeError, ValueError) as e:
                raise cf.ConfigFileError(self.config_dir / cf.TOPICS, f"bad topic config {name!r}: {e}") from None
        for tc in self._system:
            existing = self.table.setdefault(tc.topic_name, tc)
            if tc.topic_name == AUTO_CREATE_TOPIC_KEY_TOPIC:
                # Whether sends may auto-create follows today's autoCreateTopicEnable, not the persisted perm.
                existing.perm = tc.perm
        self.persist()

    def persist(self) -> None:
        """Write the current table (safe from a worker thread: the newest state is written last)."""
        with self._lock:
            snapshot = {name: tc.to_json() for name, tc in list(self.table.items())}
            cf.save_topics(self.config_dir, snapshot, dict(self.data_version))

    def _changed(self) -> None:
        self.data_version = cf.next_data_version(self.data_version)
        if self.on_change is not None:
            self.on_change()
        else:
            self.persist()

    # --- reads ---------------------------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def wrapper_json(self) -> dict[str, Any]:
        """``TopicConfigSerializeWrapper``: what GET_ALL_TOPIC_CONFIG and REGISTER_BROKER carry."""
        return {
            "dataVersion": dict(self.data_version),
            "topicConfigTable": {name: tc.to_json() for name, tc in list(self.table.items())},
        }

    # --- writes --------------------------------------------------------------------------------------------
    def update(self, tc: TopicConfig) -> None:
        """Create or replace a topic (UPDATE_AND_CREATE_TOPIC)."""
        self.table[tc.topic_name] = tc
        log.info("topic %s: read %d write %d perm %d", tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm)
        self._changed()

    def delete(self, topic: str) -> bool:
        if self.table.pop(topic, None) is None:
            return False
        self._changed()
        return True

    def create_in_send(
        self, topic: str, default_topic: str | None, queue_nums: int, sys_flag: int
    ) -> TopicConfig | None:
        """``createTopicInSendMessageMethod``: a new topic shaped by ``default_topic`` if it may be inherited."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        template = self.table.get(default_topic or "")
        if template is None:
            return None
        if template.topic_name == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create_topic_enable:
            return None
        if not template.perm & PERM_INHERIT:
            return None
        nums = max(1, min(queue_nums, template.write_queue_nums))
        tc = TopicConfig(topic, nums, nums, template.perm & ~PERM_INHERIT, topic_sys_flag=sys_flag)
        self.update(tc)
        return tc

    def create_system_topic(self, topic: str, queue_nums: int, perm: int, sys_flag: int = 0) -> TopicConfig:
        """Retry and DLQ topics (``createTopicInSendMessageBackMethod``): created on first use."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=sys_flag)
        self.update(tc)
        return tc
