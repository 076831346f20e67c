"""``BrokerContext``: what the request processors use of the broker, as a structural type.

Processors are built on a context rather than on the ``BrokerController`` itself, so none of them imports the
controller; the controller satisfies the protocol (a type checker verifies it where it builds them). A
``Processor`` names its own request codes (``routes``); the controller only composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.acl.manager import PlainAclManager
from broker.config import BrokerConfig
from broker.remoting.connection import Handler
from broker.remoting.protocol.topic import TopicConfig
from broker.server.clients import ConsumerManager, ProducerManager
from broker.server.flush_acks import FlushAcks
from broker.server.groups import SubscriptionGroupManager
from broker.server.half_messages import RecentHalves
from broker.server.long_polling import PullRequestHoldService
from broker.server.offsets import ConsumerOffsetManager
from broker.server.queue_locks import RebalanceLockManager
from broker.server.stats import BrokerStatsManager
from broker.server.topics import TopicConfigManager
from lake.reader import LakeReader
from store.config import MessageStoreConfig
from store.format import records
from store.message_store import MessageStore, PutMessageResult


class BrokerContext(Protocol):
    config: BrokerConfig
    store_config: MessageStoreConfig
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    producers: ProducerManager
    locks: RebalanceLockManager
    hold: PullRequestHoldService  # parked pulls
    stats: BrokerStatsManager
    lake: LakeReader | None  # the tier under lakePath; None: reads stay local
    recent_halves: RecentHalves  # half messages just stored by sends, for their END_TRANSACTION
    flush_acks: FlushAcks | None  # SYNC_FLUSH: sends answered a group commit at a time
    acl: PlainAclManager | None  # aclEnable: for checks a handler can make only once it has read what it serves

    @property
    def store(self) -> MessageStore:
        """The open store (requests reach processors only once it is)."""
        ...

    @property
    def stopping(self) -> bool:
        """Shutting down: pulls no longer park."""
        ...

    def ha_runtime_info(self) -> dict[str, str]:
        """Replication figures for GET_BROKER_RUNTIME_INFO (the master's slaves, or the slave's master)."""
        ...

    async def learn_topic(self, topic: str) -> None:
        """A slave: take the config of ``topic``, which its replicated log holds, from its master (else the
        NameServers' route) now; it stays unknown when neither knows it.  A master: nothing."""
        ...

    async def put(self, msgs: list[records.MessageRecord]) -> PutMessageResult:
        """Append; in SYNC_FLUSH wait (without blocking the loop) for the group commit that makes it durable."""
        ...

    def create_retry_topic(self, group: str, queue_nums: int = 1) -> TopicConfig:
        """``%RETRY%<group>``, created on first use."""
        ...

    def create_dlq_topic(self, group: str) -> TopicConfig:
        """``%DLQ%<group>``, created on first use."""
        ...

    def config_changed(self, keys: set[str]) -> None:
        """Settings named by ``keys`` were changed at run time (UPDATE_BROKER_CONFIG): push them where they are
        held."""
        ...

    async def topics_persisted(self) -> None:
        """Wait until the latest topic change is on disk (and announced to the NameServers)."""
        ...

    async def topics_saved(self) -> None:
        """Wait until every topic change so far is on disk (not for the NameServers): before a send to a topic in
        ``topics.unsaved`` is acknowledged."""
        ...


class Processor(Protocol):
    def routes(self) -> Mapping[int, Handler]:
        """The request codes this processor answers, each with its handler."""
        ...
