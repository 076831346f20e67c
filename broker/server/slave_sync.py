"""``SlaveSynchronize``: a slave copies its master's topics, consumer offsets, delay offsets and subscription groups.

Every ``slaveSyncInterval`` while the NameServer names a master (codes 21, 43, 45, 201, as RocketMQ's slave asks
them).  A table the master does not serve (an error answer) is skipped and the rest still copied.  Also mqlake's
own: which segments the master's tiering job has tiered (``tieredSegments`` in its runtime info), so that the
slave deletes those, and only those, of its copy.

Beyond RocketMQ, topics are also learnt the moment they are needed, not only every ``slaveSyncInterval``: a
replicated record of a topic this slave has no config for (seen by dispatch), or a pull of one its log holds,
makes it ask its master's table (GET_ALL_TOPIC_CONFIG) at once, and, when the master does not answer (it died
just after sending the bytes), the NameServers' route (GET_ROUTEINFO_BY_TOPIC): the queue counts, permission and
flags the master registered.  So a topic created just before a master's crash stays readable on its slave.  A
topic neither knows is not invented: pulls of it stay TOPIC_NOT_EXIST.  Only requests a Java master and
NameServer answer are used, so this works against Apache RocketMQ's broker as the master too.

Also beyond RocketMQ: offsets clients committed to this slave (while the master was gone, clients commit where they
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
from broker.remoting.headers import GetRouteInfoRequestHeader, UpdateConsumerOffsetRequestHeader
from broker.remoting.protocol.body import ConsumerOffsetSerializeWrapper, KVTable, SubscriptionGroupWrapper
from broker.remoting.protocol.route import TopicRouteData
from broker.remoting.protocol.topic import TopicConfig, TopicConfigSerializeWrapper
from broker.remoting.protocol.wire import BodyError
from broker.server.groups import SubscriptionGroupManager
from broker.server.offsets import TOPIC_GROUP_SEPARATOR, ConsumerOffsetManager, OffsetTable
from broker.server.topics import TopicConfigManager
from store import config_files as cf
from store import names

log = logging.getLogger(__name__)

TIMEOUT = 5.0
LEARN_TIMEOUT = 3.0  # per request when a topic is learnt on demand: a pull waits for it
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
        # Topics to learn now (_learn_wanted), and those neither the master nor a NameServer knew when last asked:
        # not asked again before the next periodic round, so a stream of records of such a topic asks once.
        self._wanted: set[str] = set()
        self._unknown: set[str] = set()
        self._learning: asyncio.Task[None] | None = None
        # one round at a time: the periodic one and the one a new slave starts at once would otherwise write the
        # same config files together
        self._round = asyncio.Lock()
        self._loop = asyncio.get_running_loop()  # built on the broker's loop; dispatch calls in from its thread

    def loaded(self) -> None:
        """After the config files are loaded: what they hold counts as copied from the master."""
        self._from_master = self.offsets.encode()

    async def _call(
        self, code: int, header: UpdateConsumerOffsetRequestHeader | None = None, timeout: float = TIMEOUT
    ) -> bytes | None:
        if self.master_addr is None:  # this broker became master (controller mode) while a round ran
            raise RemotingError("no master to copy from any more")
        resp = await self.remoting.invoke(self.master_addr, RemotingCommand.request(code, header), timeout)
        if resp.code != ResponseCode.SUCCESS:
            log.info("slave sync: master %s answers code %d with %d %s", self.master_addr, code, resp.code,
                     resp.remark)  # fmt: skip
            return None
        return resp.body

    async def sync_all(self) -> None:
        self._unknown.clear()  # also while no master is known: the NameServers may know a topic by now
        async with self._round:
            master = self.master_addr
            if master is None or master == self.config.broker_addr:
                return
            steps = (self._sync_topics, self._sync_offsets, self._sync_delay_offsets, self._sync_groups,
                     self._sync_tiered)  # fmt: skip
            for step in steps:
                if self.master_addr != master:
                    return  # the master changed (controller mode): the next round copies the new one's
                try:
                    await step()
                except (RemotingError, BodyError, cf.ConfigFileError) as e:
                    log.warning("slave sync from master %s: %s failed: %s", master, step.__name__, e)

    async def _sync_topics(self, timeout: float = TIMEOUT) -> bool:
        """Take the master's topic table; False when the master answered with an error."""
        body = await self._call(RequestCode.GET_ALL_TOPIC_CONFIG, timeout=timeout)
        if body is None:
            return False
        wrapper = TopicConfigSerializeWrapper.decode(body, "master's GET_ALL_TOPIC_CONFIG")
        version = wrapper.data_version.to_json()
        if version == self.topics.data_version:
            return True
        self.topics.table = _legal(wrapper.topics(), names.stored_topic_error, "topic")
        self.topics.data_version = version
        await self.topics.persist_async()
        return True

    # --- topics learnt when needed ----------------------------------------------------------------------------
    def on_arrival(self, topic: str, queue_id: int, next_offset: int, tags: tuple[int, ...], store_time: int) -> None:
        """An arrival listener (on the dispatch thread): a replicated record of a topic without a config here."""
        if topic not in self.topics.table and topic not in self._wanted and topic not in self._unknown:
            self._loop.call_soon_threadsafe(self.topic_seen, topic)

    def topic_seen(self, topic: str) -> None:
        """Learn ``topic``'s config now, in the background."""
        if topic in self.topics.table or topic in self._unknown:
            return
        self._wanted.add(topic)
        if self._learning is None or self._learning.done():
            self._learning = asyncio.ensure_future(self._learn_wanted())

    async def learn_topic(self, topic: str) -> TopicConfig | None:
        """``topic``'s config, asked of the master (else the NameServers) if this slave has none yet; None when
        neither knows it."""
        self.topic_seen(topic)
        if self._learning is not None:
            await asyncio.shield(self._learning)
        return self.topics.get(topic)

    async def _learn_wanted(self) -> None:
        while self._wanted:
            wanted, self._wanted = self._wanted, set()
            answered = False
            if self.master_addr is not None and self.master_addr != self.config.broker_addr:
                try:
                    answered = await self._sync_topics(LEARN_TIMEOUT)
                except (RemotingError, BodyError, cf.ConfigFileError) as e:
                    log.warning("slave sync: master %s did not give topics %s: %s", self.master_addr, sorted(wanted),
                                e)  # fmt: skip
            for topic in sorted(t for t in wanted if t not in self.topics.table):
                # A master that answered without the topic deleted it: its route may not be gone yet
                tc = None if answered else await self._route_config(topic)
                if tc is None:
                    log.warning("slave sync: topic %s is in the replicated log, but %s of it: not served here", topic,
                                f"master {self.master_addr} has no config" if answered else
                                "neither the master nor a NameServer has a config")  # fmt: skip
                    self._unknown.add(topic)
                    continue
                log.info("slave sync: topic %s taken from the NameServers' route (master %s did not answer): %s",
                         topic, self.master_addr or "unknown", tc.encode_line())  # fmt: skip
                self.topics.update(tc)  # a new data version: the master's next table replaces it

    async def _route_config(self, topic: str) -> TopicConfig | None:
        """The config the master registered for ``topic`` (this broker name's queue data in its route)."""
        header = GetRouteInfoRequestHeader(topic=topic)
        for addr in self.config.namesrv_addrs:
            try:
                resp = await self.remoting.invoke(
                    addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, header), LEARN_TIMEOUT
                )
                if resp.code != ResponseCode.SUCCESS:
                    continue  # TOPIC_NOT_EXIST: another NameServer may know it
                route = TopicRouteData.decode(resp.body, f"NameServer {addr}'s route of {topic}")
            except (RemotingError, BodyError) as e:
                log.info("slave sync: NameServer %s: no route of %s: %s", addr, topic, e)
                continue
            for qd in route.queue_datas:
                if qd.broker_name == self.config.broker_name:
                    return TopicConfig(topic_name=topic, read_queue_nums=qd.read_queue_nums,
                                       write_queue_nums=qd.write_queue_nums, perm=qd.perm,
                                       topic_sys_flag=qd.topic_sys_flag)  # fmt: skip
        return None

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
