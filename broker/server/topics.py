"""The broker's topic table (``TopicConfigManager``), persisted as ``config/topics.json``.

Besides user topics it holds the system topics a RocketMQ broker creates for itself, so tools that
look for them (mqadmin, the clients' auto-create path via ``TBW102``) find them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.remoting.protocol.topic import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    DataVersion,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from broker.remoting.protocol.wire import WireModel
from broker.server.config_manager import VersionedTableManager
from store import config_files as cf
from store import names
from store.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    OFFSET_MOVED_EVENT,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    TIMER_TOPIC,
)

log = logging.getLogger(__name__)

DLQ_NUMS_PER_GROUP = 1


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


class TopicConfigManager(VersionedTableManager[TopicConfig]):
    """Topic configs by name (topics.json: ``{"dataVersion": ..., "topicConfigTable": {name: config}}``)."""

    file_name = cf.TOPICS
    table_key = "topicConfigTable"

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
        super().__init__(config_dir)
        # Topics created or changed but not yet written to topics.json: a send to one waits for the write before it
        # is acknowledged, as Java's createTopicInSendMessageMethod persists before the put.
        self.unsaved: set[str] = set()
        self.auto_create_topic_enable = auto_create_topic_enable
        self.default_topic_queue_nums = default_topic_queue_nums
        inherit_rw = PERM_INHERIT | PERM_READ | PERM_WRITE
        # TBW102 is the template clients route unknown topics by; INHERIT lets a send auto-create from it.
        tbw_perm = inherit_rw if auto_create_topic_enable else PERM_READ | PERM_WRITE
        nums = default_topic_queue_nums
        self._system = [
            TopicConfig(topic_name=SELF_TEST_TOPIC, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(topic_name=AUTO_CREATE_TOPIC_KEY_TOPIC, read_queue_nums=nums, write_queue_nums=nums,
                        perm=tbw_perm),
            TopicConfig(topic_name=cluster_name, read_queue_nums=16, write_queue_nums=16,
                        perm=inherit_rw if cluster_topic_enable else PERM_INHERIT),
            TopicConfig(topic_name=broker_name, read_queue_nums=1, write_queue_nums=1,
                        perm=inherit_rw if broker_topic_enable else PERM_INHERIT),
            TopicConfig(topic_name=OFFSET_MOVED_EVENT, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(topic_name=SCHEDULE_TOPIC, read_queue_nums=18, write_queue_nums=18),
            TopicConfig(topic_name=TIMER_TOPIC, read_queue_nums=1, write_queue_nums=1),  # 5.x, timerWheelEnable
        ]  # fmt: skip

    # --- persistence -------------------------------------------------------------------------------------
    def read_file(self) -> dict[str, Any]:
        return cf.load_topics(self.config_dir)

    def document(self, content: dict[str, Any]) -> dict[str, Any]:
        return cf.topics_document(content["topicConfigTable"], content["dataVersion"])

    def written(self, content: dict[str, Any]) -> None:
        self.unsaved.difference_update(content["topicConfigTable"])  # in place: the loop may add meanwhile

    def parse_entry(self, name: str, raw: Any) -> TopicConfig:
        return TopicConfig.from_json(raw, f"topic config {name!r}")

    def load(self) -> None:
        """Read topics.json (or its .bak); add missing system topics. The file wins, except TBW102's perm."""
        super().load()
        for tc in self._system:
            existing = self.table.setdefault(tc.topic_name, tc)
            if tc.topic_name == AUTO_CREATE_TOPIC_KEY_TOPIC:
                # Whether sends may auto-create follows today's autoCreateTopicEnable, not the persisted perm.
                existing.perm = tc.perm
        try:
            self.persist()
        except OSError as e:  # a full disk: the broker starts (refusing puts); the next change writes the file
            log.warning("topics not saved at start: %s", e)

    # --- reads ---------------------------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def wrapper(self) -> TopicConfigSerializeWrapper:
        """What GET_ALL_TOPIC_CONFIG and REGISTER_BROKER carry."""
        return TopicConfigSerializeWrapper(
            data_version=DataVersion.from_json(self.data_version), topic_config_table=dict(self.table)
        )

    # --- writes --------------------------------------------------------------------------------------------
    def update(self, tc: TopicConfig) -> None:
        """Create or replace a topic (UPDATE_AND_CREATE_TOPIC)."""
        self.table[tc.topic_name] = tc
        self.unsaved.add(tc.topic_name)
        log.info("topic %s: read %d write %d perm %d", tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm)
        self.changed()

    def set_auto_create(self, enable: bool) -> None:
        """autoCreateTopicEnable changed at run time: TBW102's INHERIT bit follows it."""
        self.auto_create_topic_enable = enable
        tbw = self.table.get(AUTO_CREATE_TOPIC_KEY_TOPIC)
        if tbw is not None:
            perm = tbw.perm | PERM_INHERIT if enable else tbw.perm & ~PERM_INHERIT
            self.table[AUTO_CREATE_TOPIC_KEY_TOPIC] = tbw.model_copy(update={"perm": perm})

    def delete(self, topic: str) -> bool:
        """Remove a topic (DELETE_TOPIC_IN_BROKER); False when there was none."""
        if self.table.pop(topic, None) is None:
            return False
        self.unsaved.discard(topic)  # no write will name it: a re-creation adds it again
        log.info("topic %s deleted", topic)
        self.changed()
        return True

    def is_system_topic(self, topic: str) -> bool:
        """``TopicValidator.isSystemTopic``, plus the cluster and broker topics the broker adds to that set."""
        return names.is_system_topic(topic) or any(topic == tc.topic_name for tc in self._system)

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
        tc = TopicConfig(topic_name=topic, read_queue_nums=nums, write_queue_nums=nums,
                         perm=template.perm & ~PERM_INHERIT, topic_sys_flag=sys_flag)  # fmt: skip
        self.update(tc)
        return tc

    def create_system_topic(self, topic: str, queue_nums: int, perm: int, sys_flag: int = 0) -> TopicConfig:
        """Retry and DLQ topics (``createTopicInSendMessageBackMethod``): created on first use.  Raises
        :class:`store.names.IllegalName` for a name the store could not keep (a group checked by
        ``names.group_error`` never gives one)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        bad = names.stored_topic_error(topic)
        if bad is not None:
            raise names.IllegalName(bad)
        tc = TopicConfig(topic_name=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm,
                         topic_sys_flag=sys_flag)  # fmt: skip
        self.update(tc)
        return tc


class TableBody:
    """A body carrying the whole topic table (REGISTER_BROKER's, GET_ALL_TOPIC_CONFIG's), encoded in a worker thread
    once per data version: for 20,000 topics encoding takes ~150 ms, which the event loop cannot spare every 30 s
    and after every topic change (auto-create runs inside a send)."""

    def __init__(self, topics: TopicConfigManager, build: Callable[[TopicConfigSerializeWrapper], WireModel]) -> None:
        self._topics = topics
        self._build = build
        self._cached: tuple[dict[str, Any], bytes] | None = None  # (data version, body)

    async def encode(self) -> bytes:
        version = self._topics.data_version  # replaced, never mutated, by each change
        cached = self._cached
        if cached is not None and cached[0] == version:
            return cached[1]
        # Taken on the loop, so the table copy and the version agree; the TopicConfigs are not changed in place.
        wrapper = self._topics.wrapper()
        body = await asyncio.to_thread(lambda: self._build(wrapper).encode())
        self._cached = (version, body)
        return body
