"""Routes: ``TopicRouteData`` (GET_ROUTEINFO_BY_TOPIC) with its ``QueueData`` and ``BrokerData``, and
``ClusterInfo`` (GET_BROKER_CLUSTER_INFO). Written by the NameServer, read by clients.

A route is written as the NameServer of the asking client's generation writes it (``RouteForm``): field
spelling and map-key style changed in different releases. Every spelling is read.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import field_serializer, model_validator

from broker.remoting.codes import VERSION_V4_9_0, VERSION_V4_9_4
from broker.remoting.protocol.fastjson import dumps_legacy, dumps_standard
from broker.remoting.protocol.wire import WireModel

MASTER_ID = 0  # brokerAddrs key of the master; slaves are 1, 2, ...
FORM = "route_form"  # serialization context key: the RouteForm to write


class RouteForm(Enum):
    """How a RocketMQ generation's NameServer writes a route."""

    V4_8 = "4.0-4.8"  # QueueData.getTopicSynFlag; plain toJSONString: Long map keys bare
    V4_9 = "4.9.0-4.9.3"  # getTopicSysFlag since 4.9.0; still plain toJSONString
    V5 = "4.9.4+/5.x"  # BrowserCompatible (keys quoted) since 4.9.4; BrokerData.enableActingMaster since 5.0

    @classmethod
    def for_client(cls, version: int, accept_standard_json_only: bool = False) -> RouteForm:
        """The form a client of MQVersion ordinal ``version`` reads (a 5.x client may ask for the standard one)."""
        if accept_standard_json_only or version >= VERSION_V4_9_4:
            return cls.V5
        return cls.V4_9 if version >= VERSION_V4_9_0 else cls.V4_8


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
        if context.get(FORM) is RouteForm.V4_8 and "topicSysFlag" in out:
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
        if context.get(FORM) in (RouteForm.V4_8, RouteForm.V4_9):
            out.pop("enableActingMaster", None)
        return out


class TopicRouteData(WireModel):
    queue_datas: list[QueueData] = []
    broker_datas: list[BrokerData] = []
    filter_server_table: dict[str, list[str]] = {}
    order_topic_conf: str | None = None

    def to_json(self, form: RouteForm = RouteForm.V5) -> dict[str, Any]:
        """The route's fields as a NameServer of ``form``'s generation writes them."""
        return self.model_dump(exclude_none=True, context={FORM: form})

    def encode_as(self, form: RouteForm) -> bytes:
        """The body a NameServer of ``form``'s generation answers GET_ROUTEINFO_BY_TOPIC with."""
        data = self.to_json(form)
        return dumps_standard(data) if form is RouteForm.V5 else dumps_legacy(data)

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
