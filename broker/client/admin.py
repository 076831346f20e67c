"""``Admin`` (``DefaultMQAdminExt``, the calls ``mqadmin`` makes): topics, queries, consumer progress, clusters.

Where a broker offers the aggregate call (GET_TOPIC_STATS_INFO 202, GET_CONSUME_STATS 208) it is used; a broker
that answers REQUEST_CODE_NOT_SUPPORTED is asked queue by queue with the basic offset calls instead.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

from broker.client.errors import MQBrokerError, MQClientError
from broker.client.instance import ClientInstance, check
from broker.client.message import MessageExt, MessageQueue, decode_messages
from broker.client.producer import check_topic
from broker.client.route import PERM_READ, PERM_WRITE, TopicRouteData
from broker.remoting import headers as h
from broker.remoting.client import RemotingError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.protocol.body import ConsumeStats, KVTable, TopicList, TopicStatsTable
from broker.remoting.protocol.route import ClusterInfo
from broker.remoting.signing import Credentials
from store.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    TOOLS_CONSUMER_GROUP,
    UNIQUE_MSG_QUERY_FLAG,
)
from store.format import msgid


@dataclass(frozen=True, slots=True)
class QueueStatus:
    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)

    def to_json(self) -> dict[str, object]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id,
                "brokerOffset": self.broker_offset, "consumerOffset": self.consumer_offset, "lag": self.lag,
                "lastTimestamp": self.last_timestamp}  # fmt: skip


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    runtime: dict[str, str]


class Admin:
    """Administration calls against the NameServer(s) and every broker they list."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        timeout: float = 5.0,
        credentials: Credentials | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._client = ClientInstance(namesrv_addr, timeout=timeout, credentials=credentials, ssl_context=ssl_context)

    async def start(self) -> Admin:
        return self

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> Admin:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _invoke(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        return await self._client.remoting.invoke(addr, cmd, self._client.timeout)

    async def invoke(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        """One request to a broker (signed and over TLS as this admin is), for calls kept in other modules."""
        return await self._invoke(addr, cmd)

    async def topic_route(self, topic: str) -> TopicRouteData | None:
        """The NameServer's current route of ``topic`` (None when it does not know the topic)."""
        return await self._client.update_route(topic)

    async def _route(self, topic: str) -> TopicRouteData:
        route = await self._client.update_route(topic)
        if route is None:
            raise MQClientError(f"topic {topic!r} does not exist on the NameServer")
        return route

    # -- clusters ---------------------------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        return await self._client.cluster_info()

    async def master_addrs(self, cluster: str) -> list[str]:
        info = await self.cluster_info()
        if cluster not in info.cluster_addr_table:
            raise MQClientError(f"cluster {cluster!r} not found; known: {sorted(info.cluster_addr_table)}")
        return info.master_addrs(cluster)

    async def target_brokers(self, cluster: str | None, broker_addr: str | None) -> list[str]:
        """mqadmin's ``-b`` (this broker) or ``-c`` (every master of the cluster): exactly one of them."""
        if (cluster is None) == (broker_addr is None):
            raise MQClientError("give exactly one of cluster or broker address")
        addrs = [broker_addr] if broker_addr else await self.master_addrs(cluster or "")
        if not addrs:
            raise MQClientError(f"cluster {cluster!r} has no master broker")
        return addrs

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        resp = await self._invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
        check(resp, "broker runtime info", addr)
        return KVTable.decode(resp.body, f"runtime info of {addr}").table if resp.body else {}

    async def cluster_list(self) -> list[BrokerInfo]:
        """Every broker the NameServer knows, with its runtime figures (empty if it did not answer)."""
        info = await self.cluster_info()
        out = []
        for cluster, names in sorted(info.cluster_addr_table.items()):
            for name in sorted(names):
                b = info.broker_addr_table.get(name)
                for bid, addr in sorted(b.broker_addrs.items()) if b is not None else ():
                    try:
                        runtime = await self.broker_runtime_info(addr)
                    except (RemotingError, MQClientError):
                        runtime = {}
                    out.append(BrokerInfo(cluster, name, bid, addr, runtime))
        return out

    # -- topics -------------------------------------------------------------------------------------------------
    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ | PERM_WRITE,
        order: bool = False,
        attributes: str | None = None,
    ) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on one broker or on every master of a cluster; returns the addresses done.
        ``attributes``: RocketMQ 5's change to the topic's attributes, ``+message.type=FIFO,-key`` (the broker
        checks it)."""
        check_topic(topic)
        addrs = await self.target_brokers(cluster, broker_addr)
        header = h.CreateTopicRequestHeader(
            topic=topic, default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC, read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums, perm=perm, topic_filter_type="SINGLE_TAG", topic_sys_flag=0,
            order=order, attributes=attributes or None,
        )  # fmt: skip
        for addr in addrs:
            resp = await self._invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header))
            check(resp, f"create topic {topic}", addr)
        return addrs

    async def topic_list(self) -> list[str]:
        cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        resp = await self._client.invoke_namesrv(cmd)
        check(resp, "topic list")
        return sorted(TopicList.decode(resp.body, "topic list").topic_list) if resp.body else []

    async def topic_status(self, topic: str) -> list[QueueStatus]:
        """Per queue min/max offset and the store time of the newest message."""
        route = await self._route(topic)
        out: list[QueueStatus] = []
        for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = b.master_addr
            if not addr:
                continue
            header = h.GetTopicStatsInfoRequestHeader(topic=topic)
            resp = await self._invoke(addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, header))
            if resp.code == ResponseCode.SUCCESS:
                stats = TopicStatsTable.decode(resp.body, f"topic stats from {addr}")
                for q, v in stats.offset_table.items():
                    out.append(QueueStatus(q.topic, q.broker_name, q.queue_id, v.min_offset, v.max_offset,
                                           v.last_update_timestamp))  # fmt: skip
                continue
            if resp.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise MQBrokerError(resp.code, resp.remark, addr, f"topic stats of {topic}")
            for mq in route.subscribe_queues(topic):
                if mq.broker_name == b.broker_name:
                    out.append(await self._queue_status(mq))
        return sorted(out, key=lambda s: (s.broker_name, s.queue_id))

    async def _queue_status(self, mq: MessageQueue) -> QueueStatus:
        lo, hi = await self._client.min_offset(mq), await self._client.max_offset(mq)
        last = 0
        if hi > lo:
            header = h.PullMessageRequestHeader(
                consumer_group=TOOLS_CONSUMER_GROUP, topic=mq.topic, queue_id=mq.queue_id, queue_offset=hi - 1,
                max_msg_nums=1, sys_flag=0x4, commit_offset=0, suspend_timeout_millis=0, subscription="*",
                sub_version=0, expression_type="TAG",
            )  # fmt: skip
            _, resp = await self._client.invoke_broker(mq, RemotingCommand.request(RequestCode.PULL_MESSAGE, header))
            if resp.code == ResponseCode.SUCCESS and resp.body:
                last = decode_messages(resp.body, mq.broker_name)[-1].store_timestamp
        return QueueStatus(mq.topic, mq.broker_name, mq.queue_id, lo, hi, last)

    # -- messages -----------------------------------------------------------------------------------------------
    async def _query(self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool) -> list[MessageExt]:
        route = await self._route(topic)
        header = h.QueryMessageRequestHeader(
            topic=topic, key=key, max_num=max_num, begin_timestamp=begin, end_timestamp=end
        )
        ext = {UNIQUE_MSG_QUERY_FLAG: "true"} if unique else None
        found: dict[tuple[str, int], MessageExt] = {}
        for b in route.broker_datas:
            if not b.master_addr:
                continue
            cmd = RemotingCommand.request(RequestCode.QUERY_MESSAGE, header, ext=ext)
            resp = await self._invoke(b.master_addr, cmd)
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            check(resp, f"query {topic} key {key}", b.master_addr)
            for m in decode_messages(resp.body, b.broker_name, f"query body from {b.master_addr}"):
                # The index matches by hash: keep only real matches, as the Java admin does.
                if m.topic == topic and (m.uniq_key == key if unique else key in m.key_list):
                    found[(b.broker_name, m.commit_log_offset)] = m
        return sorted(found.values(), key=lambda m: (m.store_timestamp, m.commit_log_offset))

    async def query_msg_by_key(
        self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int | None = None
    ) -> list[MessageExt]:
        """Messages of ``topic`` carrying ``key`` in KEYS, stored between ``begin`` and ``end`` (ms)."""
        return await self._query(topic, key, max_num, begin, end or int(time.time() * 1000) + 60_000, False)

    async def query_msg_by_unique_key(self, topic: str, msg_id: str) -> list[MessageExt]:
        return await self._query(topic, msg_id, 32, 0, int(time.time() * 1000) + 60_000, True)

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID on the broker address the offset id encodes."""
        (ip, port), offset = msgid.decode_offset_msg_id(offset_msg_id)
        addr = f"{ip}:{port}"
        resp = await self._invoke(
            addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, h.ViewMessageRequestHeader(offset=offset))
        )
        check(resp, f"view message {offset_msg_id}", addr)
        msgs = decode_messages(resp.body, "", f"view body from {addr}")
        if not msgs:
            raise MQClientError(f"broker {addr} returned no record for {offset_msg_id}")
        return msgs[0]

    async def _known_broker_addrs(self) -> dict[str, str]:
        info = await self.cluster_info()
        return {addr: name for name, b in info.broker_addr_table.items() for addr in b.broker_addrs.values()}

    async def query_msg_by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """A broker offset id is viewed directly; otherwise ``msg_id`` is taken as a UNIQ_KEY and looked up in
        ``topic`` (or in every topic when none is given)."""
        brokers = await self._known_broker_addrs()
        try:
            (ip, port), _ = msgid.decode_offset_msg_id(msg_id)
            addr = f"{ip}:{port}"
        except ValueError:
            addr = None
        # A UNIQ_KEY also has 32 hex digits; only an id naming a broker we know is an offset id.
        if addr in brokers:
            m = await self.view_message(msg_id)
            m.broker_name = brokers[addr]
            return [m]
        topics = [topic] if topic else [
            t for t in await self.topic_list() if not t.startswith(RETRY_GROUP_TOPIC_PREFIX)
        ]
        out: list[MessageExt] = []
        for t in topics:
            try:
                out.extend(await self.query_msg_by_unique_key(t, msg_id))
            except MQClientError:
                continue  # a topic without a route or a broker that lost it: nothing to find there
        return out

    # -- consumers ----------------------------------------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue broker offset, consumer offset and lag of ``group`` (its retry topic included)."""
        return (await self.consume_stats(group, topic))[0]

    async def consume_stats(self, group: str, topic: str | None = None) -> tuple[list[QueueProgress], float]:
        """:meth:`consumer_progress` and the group's consume TPS summed over its brokers (``ConsumeStats``)."""
        addrs = sorted(set((await self._known_broker_addrs()).keys()))
        out: list[QueueProgress] = []
        tps = 0.0
        for addr in addrs:
            header = h.GetConsumeStatsRequestHeader(consumer_group=group, topic=topic)
            resp = await self._invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, header))
            if resp.code == ResponseCode.SUCCESS:
                stats = ConsumeStats.decode(resp.body, f"consume stats from {addr}")
                tps += stats.consume_tps
                for q, v in stats.offset_table.items():
                    out.append(QueueProgress(q.topic, q.broker_name, q.queue_id, v.broker_offset,
                                             v.consumer_offset, v.last_timestamp))  # fmt: skip
            elif resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                out.extend(await self._progress_by_queue(group, topic))
                break
            elif resp.code not in (ResponseCode.CONSUMER_NOT_ONLINE, ResponseCode.SYSTEM_ERROR):
                raise MQBrokerError(resp.code, resp.remark, addr, f"consume stats of {group}")
        return sorted(out, key=lambda p: (p.topic, p.broker_name, p.queue_id)), tps

    async def _progress_by_queue(self, group: str, topic: str | None) -> list[QueueProgress]:
        topics = [topic, RETRY_GROUP_TOPIC_PREFIX + group] if topic else await self.topic_list()
        out = []
        for t in topics:
            route = await self._client.update_route(t)
            if route is None:
                continue
            for mq in route.subscribe_queues(t):
                offset = await self._client.query_consumer_offset(group, mq)
                if offset is None:
                    continue
                out.append(QueueProgress(t, mq.broker_name, mq.queue_id, await self._client.max_offset(mq), offset, 0))
        return out
