"""``OpsAdmin``: the operator's calls of ``DefaultMQAdminExt`` that mqadmin's commands make — topic and
group deletion, subscription groups, offset resets, broker settings, draining a broker, stats.

Each method does what the mqadmin command of the same name does on the wire; where a command acts on a cluster
(``-c``) it goes to every master of that cluster, and NameServer calls go to every NameServer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from broker.client.admin import Admin
from broker.client.errors import MQBrokerError, MQClientError
from broker.client.instance import check
from broker.client.message import MessageExt, decode_messages
from broker.remoting import headers as h
from broker.remoting import ops_headers as oh
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.protocol.body import (
    ConsumerConnection,
    ConsumeStats,
    MessageQueue,
    ProducerConnection,
    SubscriptionGroupConfig,
)
from broker.remoting.protocol.ops_body import BrokerStatsData, ConsumerRunningInfo, GroupList, ResetOffsetBody
from broker.remoting.protocol.wire import BodyError
from store.constants import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, TOOLS_CONSUMER_GROUP

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
GROUP_GET_NUMS = "GROUP_GET_NUMS"


@dataclass(frozen=True, slots=True)
class StatsRow:
    """One line of ``statsAll``."""

    topic: str
    group: str  # "" when nobody consumes the topic
    accumulation: int
    in_tps: float
    out_tps: float
    in_msg_24h: int
    out_msg_24h: int

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "consumerGroup": self.group, "accumulation": self.accumulation,
                "inTps": self.in_tps, "outTps": self.out_tps, "inMsg24Hour": self.in_msg_24h,
                "outMsg24Hour": self.out_msg_24h}  # fmt: skip


def _sum_24h(data: BrokerStatsData) -> int:
    """``StatsAllSubCommand.compute24HourSum``: the day window, else the hour's, else the minute's."""
    for item in (data.stats_day, data.stats_hour, data.stats_minute):
        if item.sum:
            return item.sum
    return 0


class OpsAdmin(Admin):
    async def _call(self, addr: str, code: int, header: h.Header | None, what: str, body: bytes = b"",
                    ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:  # fmt: skip
        resp = await self._invoke(addr, RemotingCommand.request(code, header, body))
        check(resp, what, addr, ok)
        return resp

    async def _each_namesrv(self, code: int, header: h.Header, what: str) -> list[RemotingCommand]:
        out = []
        for addr in self._client.namesrv_addrs:
            out.append(await self._call(addr, code, header, what))
        return out

    async def _topic_masters(self, topic: str) -> dict[str, str]:
        """broker name -> master address, of the brokers serving ``topic``."""
        route = await self._route(topic)
        return {b.broker_name: b.master_addr for b in route.broker_datas if b.master_addr}

    # -- topics ---------------------------------------------------------------------------------------------
    async def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """DELETE_TOPIC_IN_BROKER on every master of ``cluster``, then DELETE_TOPIC_IN_NAMESRV on every NameServer."""
        addrs = await self.target_brokers(cluster, None)
        for addr in addrs:
            await self._call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, h.DeleteTopicRequestHeader(topic=topic),
                             f"delete topic {topic}")  # fmt: skip
        await self._each_namesrv(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                 h.DeleteTopicFromNamesrvRequestHeader(topic=topic, cluster_name=cluster),
                                 f"delete topic {topic} in NameServer")  # fmt: skip
        return addrs

    # -- subscription groups ---------------------------------------------------------------------------------
    async def update_sub_group(self, cfg: SubscriptionGroupConfig, *, cluster: str | None = None,
                               broker_addr: str | None = None) -> list[str]:  # fmt: skip
        addrs = await self.target_brokers(cluster, broker_addr)
        for addr in addrs:
            await self._call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None,
                             f"update subscription group {cfg.group_name}", cfg.encode())  # fmt: skip
        return addrs

    async def delete_sub_group(self, group: str, *, cluster: str | None = None, broker_addr: str | None = None,
                               remove_offset: bool = False) -> list[str]:  # fmt: skip
        """DELETE_SUBSCRIPTIONGROUP; in a cluster also the group's retry and dead-letter topics, as mqadmin does."""
        addrs = await self.target_brokers(cluster, broker_addr)
        header = h.DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=remove_offset)
        for addr in addrs:
            await self._call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, header, f"delete subscription group {group}")
        if cluster is not None:
            for topic in (RETRY_GROUP_TOPIC_PREFIX + group, DLQ_GROUP_TOPIC_PREFIX + group):
                await self.delete_topic(topic, cluster)
        return addrs

    # -- offsets ----------------------------------------------------------------------------------------------
    async def reset_offset_by_time(self, topic: str, group: str, timestamp: int, force: bool = True
                                   ) -> dict[MessageQueue, int]:  # fmt: skip
        """INVOKE_BROKER_TO_RESET_OFFSET on every broker of the topic; the offsets each queue was reset to."""
        out: dict[MessageQueue, int] = {}
        header = h.ResetOffsetRequestHeader(topic=topic, group=group, timestamp=timestamp, is_force=force)
        for addr in sorted((await self._topic_masters(topic)).values()):
            resp = await self._call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header, f"reset offset of {group}")
            out.update(ResetOffsetBody.decode(resp.body, f"reset offsets from {addr}").offset_table)
        return dict(sorted(out.items(), key=lambda kv: (kv[0].broker_name, kv[0].queue_id)))

    async def clone_group_offset(self, src: str, dest: str, topic: str, offline: bool = False) -> list[str]:
        header = oh.CloneGroupOffsetRequestHeader(src_group=src, dest_group=dest, topic=topic, offline=offline)
        addrs = sorted((await self._topic_masters(topic)).values())
        for addr in addrs:
            await self._call(addr, RequestCode.CLONE_GROUP_OFFSET, header, f"clone offsets of {src} to {dest}")
        return addrs

    # -- clients ----------------------------------------------------------------------------------------------
    async def _any_broker_with(self, code: int, header: h.Header, what: str) -> tuple[str, RemotingCommand]:
        """The first broker that answers SUCCESS (clients connect to every broker of their topics)."""
        last: RemotingCommand | None = None
        for addr in sorted((await self._known_broker_addrs()).keys()):
            resp = await self._invoke(addr, RemotingCommand.request(code, header))
            if resp.code == ResponseCode.SUCCESS:
                return addr, resp
            last = resp
        if last is None:
            raise MQClientError(f"{what}: no broker is registered")
        raise MQBrokerError(last.code, last.remark, "", what)  # every broker refused: the last one's answer

    async def consumer_connection(self, group: str) -> ConsumerConnection:
        _, resp = await self._any_broker_with(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, h.GetConsumerConnectionListRequestHeader(consumer_group=group),
            f"consumer connections of {group}")  # fmt: skip
        return ConsumerConnection.decode(resp.body, "consumer connection")

    async def producer_connection(self, group: str, topic: str) -> ProducerConnection:
        header = h.GetProducerConnectionListRequestHeader(producer_group=group)
        seen: dict[str, Any] = {}
        for addr in sorted((await self._topic_masters(topic)).values()):
            resp = await self._invoke(addr, RemotingCommand.request(RequestCode.GET_PRODUCER_CONNECTION_LIST, header))
            if resp.code == ResponseCode.SUCCESS:
                for c in ProducerConnection.decode(resp.body, "producer connection").connection_set:
                    seen[c.client_id] = c
        if not seen:
            raise MQClientError(f"producer group {group} has no connection to the brokers of {topic}")
        return ProducerConnection(connection_set=list(seen.values()))

    async def consumer_running_info(self, group: str, client_id: str, jstack: bool = False) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO through a broker the client is connected to."""
        header = h.GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client_id, jstack_enable=jstack)
        _, resp = await self._any_broker_with(RequestCode.GET_CONSUMER_RUNNING_INFO, header,
                                              f"running info of {client_id}")  # fmt: skip
        try:
            return ConsumerRunningInfo.decode(resp.body, f"running info of {client_id}")
        except BodyError:
            # clients write this body in their own dialects: keep what parses as JSON at all
            return ConsumerRunningInfo(properties={"raw": resp.body.decode("utf-8", "replace")})

    async def consumer_status(self, group: str, client_id: str | None = None) -> dict[str, ConsumerRunningInfo]:
        """``consumerStatus``: the running info of every client of ``group`` (or of one)."""
        ids = [client_id] if client_id else sorted(c.client_id for c in
                                                   (await self.consumer_connection(group)).connection_set)  # fmt: skip
        return {cid: await self.consumer_running_info(group, cid) for cid in ids}

    # -- messages ---------------------------------------------------------------------------------------------
    async def query_msg_by_offset(self, topic: str, broker_name: str, queue_id: int, offset: int) -> MessageExt:
        addr = (await self._topic_masters(topic)).get(broker_name)
        if addr is None:
            raise MQClientError(f"broker {broker_name} does not serve topic {topic}")
        header = h.PullMessageRequestHeader(
            consumer_group=TOOLS_CONSUMER_GROUP, topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=1,
            sys_flag=0x4, commit_offset=0, suspend_timeout_millis=0, subscription="*", sub_version=0,
            expression_type="TAG",
        )  # fmt: skip
        resp = await self._invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, header))
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            raise MQClientError(f"no message at offset {offset} of {topic} queue {queue_id} on {broker_name}: "
                                f"{resp.remark or resp.code}")  # fmt: skip
        return decode_messages(resp.body, broker_name, f"pull from {addr}")[0]

    # -- brokers ----------------------------------------------------------------------------------------------
    async def get_broker_config(self, broker_addr: str) -> dict[str, str]:
        from broker.config import parse_properties

        resp = await self._call(broker_addr, RequestCode.GET_BROKER_CONFIG, None, "broker config")
        return parse_properties(resp.body.decode("utf-8"), f"config of {broker_addr}")

    async def update_broker_config(self, key: str, value: str, *, cluster: str | None = None,
                                   broker_addr: str | None = None) -> list[str]:  # fmt: skip
        addrs = await self.target_brokers(cluster, broker_addr)
        body = f"{key}={value}\n".encode()
        for addr in addrs:
            await self._call(addr, RequestCode.UPDATE_BROKER_CONFIG, None, f"update broker config {key}", body)
        return addrs

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        """NameServer address -> how many topics lost write permission there."""
        header = h.WipeWritePermOfBrokerRequestHeader(broker_name=broker_name)
        out = {}
        for addr in self._client.namesrv_addrs:
            resp = await self._call(addr, RequestCode.WIPE_WRITE_PERM_OF_BROKER, header, "wipe write perm")
            out[addr] = h.WipeWritePermOfBrokerResponseHeader.from_ext(resp.ext_fields).wipe_topic_count
        return out

    async def add_write_perm(self, broker_name: str) -> dict[str, int]:
        header = oh.AddWritePermOfBrokerRequestHeader(broker_name=broker_name)
        out = {}
        for addr in self._client.namesrv_addrs:
            resp = await self._call(addr, RequestCode.ADD_WRITE_PERM_OF_BROKER, header, "add write perm")
            out[addr] = oh.AddWritePermOfBrokerResponseHeader.from_ext(resp.ext_fields).add_topic_count
        return out

    async def delete_expired_commitlog(self, *, cluster: str | None = None, broker_addr: str | None = None
                                       ) -> list[str]:  # fmt: skip
        addrs = await self.target_brokers(cluster, broker_addr)
        for addr in addrs:
            await self._call(addr, RequestCode.DELETE_EXPIRED_COMMITLOG, None, "delete expired commitlog")
        return addrs

    # -- stats ------------------------------------------------------------------------------------------------
    async def view_broker_stats(self, broker_addr: str, name: str, key: str) -> BrokerStatsData | None:
        header = oh.ViewBrokerStatsDataRequestHeader(stats_name=name, stats_key=key)
        resp = await self._invoke(broker_addr, RemotingCommand.request(RequestCode.VIEW_BROKER_STATS_DATA, header))
        if resp.code != ResponseCode.SUCCESS:
            return None  # the item never counted anything
        return BrokerStatsData.decode(resp.body, f"stats from {broker_addr}")

    async def _consumers_of(self, topic: str, addrs: list[str]) -> set[str]:
        groups: set[str] = set()
        for addr in addrs:
            resp = await self._call(
                addr,
                RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
                h.QueryTopicConsumeByWhoRequestHeader(topic=topic),
                f"consumers of {topic}",
            )
            groups |= set(GroupList.decode(resp.body, "group list").group_list)
        return groups

    async def stats_all(self, topic: str | None = None, active_only: bool = False) -> list[StatsRow]:
        """``statsAll``: per topic and consuming group, in/out TPS over the last minute, the last 24 h's counts
        and the group's lag."""
        topics = [topic] if topic else [
            t for t in await self.topic_list() if not t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        ]
        rows: list[StatsRow] = []
        for t in topics:
            try:
                addrs = sorted((await self._topic_masters(t)).values())
            except MQClientError:
                continue
            in_tps, in_24h = 0.0, 0
            for addr in addrs:
                data = await self.view_broker_stats(addr, TOPIC_PUT_NUMS, t)
                if data is not None:
                    in_tps += data.stats_minute.tps
                    in_24h += _sum_24h(data)
            groups = sorted(await self._consumers_of(t, addrs))
            if not groups and (not active_only or in_24h > 0):
                rows.append(StatsRow(t, "", 0, in_tps, 0.0, in_24h, 0))
            for g in groups:
                out_tps, out_24h = 0.0, 0
                for addr in addrs:
                    data = await self.view_broker_stats(addr, GROUP_GET_NUMS, f"{t}@{g}")
                    if data is not None:
                        out_tps += data.stats_minute.tps
                        out_24h += _sum_24h(data)
                lag = sum(p.lag for p in await self.consumer_progress(g, t) if p.topic == t)
                if not active_only or in_24h > 0 or out_24h > 0:
                    rows.append(StatsRow(t, g, lag, in_tps, out_tps, in_24h, out_24h))
        return rows

    async def consume_tps(self, group: str) -> float:
        """``consumeTps`` of ``group`` summed over the brokers (GET_CONSUME_STATS)."""
        total = 0.0
        for addr in sorted((await self._known_broker_addrs()).keys()):
            header = h.GetConsumeStatsRequestHeader(consumer_group=group)
            resp = await self._invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, header))
            if resp.code == ResponseCode.SUCCESS:
                total += ConsumeStats.decode(resp.body, f"consume stats from {addr}").consume_tps
        return total


def running_info_json(info: ConsumerRunningInfo) -> dict[str, Any]:
    return json.loads(json.dumps(info.to_json(), default=str))
