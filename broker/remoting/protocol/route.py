"""Routes: ``TopicRouteData`` (GET_ROUTEINFO_BY_TOPIC) with its ``QueueData`` and ``BrokerData``, and
``ClusterInfo`` (GET_BROKER_CLUSTER_INFO). Written by the NameServer, read by clients.

A route is written as the NameServer version it answers as would: 5.x's fields by default, or with
``to_json(legacy=True)`` those of 4.0-4.8 (``topicSynFlag`` instead of ``topicSysFlag``, no
``enableActingMaster``). Both spellings are read.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_serializer, model_validator

from broker.remoting.protocol.wire import WireModel

MASTER_ID = 0  # brokerAddrs key of the master; slaves are 1, 2, ...
LEGACY = "legacy"  # serialization context key: write the fields of RocketMQ 4.0-4.8


class QueueData(WireModel):
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @model_validator(mode="before")
    @classmethod
    def _old_spelling(cls, data: Any) -> Any:
        # NameServers before 4.9 wrote only topicSynFlag.
        if isinstance(data, dict) and "topicSysFlag" not in data and "topicSynFlag" in data:
            return {**data, "topicSysFlag": data["topicSynFlag"]}
        return data

    def _as_written_by(self, out: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        # 4.0-4.8's getter was getTopicSynFlag; 4.9.0 and 5.x write topicSysFlag.
        if context.get(LEGACY) and "topicSysFlag" in out:
            out["topicSynFlag"] = out.pop("topicSysFlag")
        return out


class BrokerData(WireModel):
    cluster: str = ""
    broker_name: str
    broker_addrs: dict[int, str] = {}  # brokerId -> address; int keys: the encoder decides whether to quote them
    enable_acting_master: bool = False

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    @field_serializer("broker_addrs")
    def _by_id(self, addrs: dict[int, str]) -> dict[int, str]:
        return dict(sorted(addrs.items()))

    def _as_written_by(self, out: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        if context.get(LEGACY):
            out.pop("enableActingMaster", None)  # 5.0's
        return out


class TopicRouteData(WireModel):
    queue_datas: list[QueueData] = []
    broker_datas: list[BrokerData] = []
    filter_server_table: dict[str, list[str]] = {}
    order_topic_conf: str | None = None

    def to_json(self, legacy: bool = False) -> dict[str, Any]:
        """``legacy``: as a 4.0-4.8 NameServer writes it (what a client older than V4_9_4 is answered)."""
        return self.model_dump(exclude_none=True, context={LEGACY: legacy})

    def master_addr(self, broker_name: str) -> str | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b.master_addr
        return None


class ClusterInfo(WireModel):
    broker_addr_table: dict[str, BrokerData] = {}  # brokerName -> its addresses
    cluster_addr_table: dict[str, list[str]] = {}  # cluster -> brokerNames

    def master_addrs(self, cluster: str) -> list[str]:
        """The master address of each of ``cluster``'s brokers, by broker name."""
        out = []
        for name in sorted(self.cluster_addr_table.get(cluster, ())):
            b = self.broker_addr_table.get(name)
            if b is not None and b.master_addr:
                out.append(b.master_addr)
        return out
