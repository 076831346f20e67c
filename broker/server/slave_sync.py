"""``SlaveSynchronize``: a slave copies its master's topics, consumer offsets, delay offsets and subscription groups.

Every ``slaveSyncInterval`` while the NameServer names a master (codes 21, 43, 45, 201, as RocketMQ's slave asks
them).  A table the master does not serve (an error answer) is skipped and the rest still copied.  Also mqlake's
own: which segments the master's tiering job has tiered (``tieredSegments`` in its runtime info), so that the
slave deletes those, and only those, of its copy.

Beyond RocketMQ: offsets clients committed to this slave (while the master was gone, clients commit where they
read) are sent to the master first (UPDATE_CONSUMER_OFFSET), so the master's older offsets do not overwrite them
when it returns.  A commit is "local" when it differs from what the last copy from the master said.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from broker.config import BrokerConfig
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from broker.remoting.headers import UpdateConsumerOffsetRequestHeader
from broker.remoting.protocol.body import ConsumerOffsetSerializeWrapper, KVTable, SubscriptionGroupWrapper
from broker.remoting.protocol.topic import TopicConfigSerializeWrapper
from broker.remoting.protocol.wire import BodyError
from broker.server.groups import SubscriptionGroupManager
from broker.server.offsets import TOPIC_GROUP_SEPARATOR, ConsumerOffsetManager, OffsetTable
from broker.server.topics import TopicConfigManager
from store import config_files as cf
from store import names

log = logging.getLogger(__name__)

TIMEOUT = 5.0
_V = TypeVar("_V")


def _legal(table: dict[str, _V], error: Callable[[str], str | None], what: str) -> dict[str, _V]:
    """The master's entries whose names this broker accepts from a client too; the others are left out, logged:
    a name a master (another program, or a tampered one) sends must not become a path here."""
    kept = {}
    for name, value in table.items():
        bad = error(name)
        if bad is None:
            kept[name] = value
        else:
            log.error("slave sync: the master's %s %r left out: %s", what, name, bad)
    return kept


class SlaveSynchronize:
    def __init__(
        self, config: BrokerConfig, topics: TopicConfigManager, offsets: ConsumerOffsetManager,
        groups: SubscriptionGroupManager, remoting: RemotingClient,
        adopt_tiered: Callable[[list[int]], list[int]],
    ) -> None:  # fmt: skip
        self.config = config
        self.topics = topics
        self.offsets = offsets
        self.groups = groups
        self.remoting = remoting
        self.adopt_tiered = adopt_tiered
        self.master_addr: str | None = None
        self._from_master: OffsetTable = {}  # the offsets as last copied (or loaded at start-up)

    def loaded(self) -> None:
        """After the config files are loaded: what they hold counts as copied from the master."""
        self._from_master = self.offsets.encode()

    async def _call(self, code: int, header: UpdateConsumerOffsetRequestHeader | None = None) -> bytes | None:
        assert self.master_addr is not None
        resp = await self.remoting.invoke(self.master_addr, RemotingCommand.request(code, header), TIMEOUT)
        if resp.code != ResponseCode.SUCCESS:
            log.info("slave sync: master %s answers code %d with %d %s", self.master_addr, code, resp.code,
                     resp.remark)  # fmt: skip
            return None
        return resp.body

    async def sync_all(self) -> None:
        if self.master_addr is None or self.master_addr == self.config.broker_addr:
            return
        steps = (self._sync_topics, self._sync_offsets, self._sync_delay_offsets, self._sync_groups, self._sync_tiered)
        for step in steps:
            try:
                await step()
            except (RemotingError, BodyError, cf.ConfigFileError) as e:
                log.warning("slave sync from master %s: %s failed: %s", self.master_addr, step.__name__, e)

    async def _sync_topics(self) -> None:
        body = await self._call(RequestCode.GET_ALL_TOPIC_CONFIG)
        if body is None:
            return
        wrapper = TopicConfigSerializeWrapper.decode(body, "master's GET_ALL_TOPIC_CONFIG")
        version = wrapper.data_version.to_json()
        if version == self.topics.data_version:
            return
        self.topics.table = _legal(wrapper.topics(), names.stored_topic_error, "topic")
        self.topics.data_version = version
        await self.topics.persist_async()

    async def _sync_offsets(self) -> None:
        local = self._locally_committed()
        for (topic, group), queues in local.items():
            for queue_id, offset in queues.items():
                header = UpdateConsumerOffsetRequestHeader(
                    consumer_group=group, topic=topic, queue_id=queue_id, commit_offset=offset
                )
                if await self._call(RequestCode.UPDATE_CONSUMER_OFFSET, header) is None:
                    return  # keep them local; the next round tries again
            log.info("slave sync: sent %s@%s offsets committed here to master %s", topic, group, self.master_addr)
        body = await self._call(RequestCode.GET_ALL_CONSUMER_OFFSET)
        if body is None:
            return
        table = ConsumerOffsetSerializeWrapper.decode(body, "master's GET_ALL_CONSUMER_OFFSET").offset_table
        for key, queues in table.items():
            for queue_id, offset in queues.items():
                topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
                self.offsets.commit(group, topic, queue_id, offset)
        self._from_master = {k: dict(v) for k, v in table.items()}
        snap = self.offsets.snapshot()
        if snap is not None:
            await self.offsets.write_async(snap)

    def _locally_committed(self) -> dict[tuple[str, str], dict[int, int]]:
        out: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in self.offsets.table.items():
            copied = self._from_master.get(key, {})
            changed = {q: off for q, off in queues.items() if copied.get(q) != off}
            if changed:
                topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
                out[(topic, group)] = changed
        return out

    async def _sync_delay_offsets(self) -> None:
        body = await self._call(RequestCode.GET_ALL_DELAY_OFFSET)
        if not body:
            return
        table = cf.load_lenient_json(body.decode("utf-8"), "master's GET_ALL_DELAY_OFFSET").get("offsetTable", {})
        offsets = {int(k): int(v) for k, v in table.items()}
        await cf.write_config_async(self.topics.config_dir / cf.DELAY_OFFSET, cf.delay_offsets_document(offsets))

    async def _sync_tiered(self) -> None:
        body = await self._call(RequestCode.GET_BROKER_RUNTIME_INFO)
        if body is None:
            return
        listed = KVTable.decode(body, "master's GET_BROKER_RUNTIME_INFO").table.get("tieredSegments", "")
        bases = [int(b) for b in listed.split(",") if b.strip().isdigit()]
        adopted = await asyncio.to_thread(self.adopt_tiered, bases) if bases else []
        if adopted:
            log.info("slave sync: segments %s tiered by master %s may be deleted here", adopted, self.master_addr)

    async def _sync_groups(self) -> None:
        body = await self._call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if body is None:
            return
        wrapper = SubscriptionGroupWrapper.decode(body, "master's GET_ALL_SUBSCRIPTIONGROUP_CONFIG")
        version = wrapper.data_version.to_json()
        if version == self.groups.data_version:
            return
        groups = dict(wrapper.subscription_group_table)
        self.groups.table = _legal(groups, names.stored_group_error, "subscription group")
        self.groups.data_version = version
        await self.groups.persist_async()
