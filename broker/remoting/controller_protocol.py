"""RocketMQ 5's controller requests as a broker sends and answers them (Java's
``remoting.protocol.header.controller``, ``BrokerHeartbeatRequestHeader``, ``NotifyBrokerRoleChangedRequestHeader``,
and the ``SyncStateSet`` / ``ElectMasterResponseBody`` bodies).  Broker ids here are the controller's (1, 2, ...),
not the NameServer's 0-for-master."""

from __future__ import annotations

from broker.remoting.headers import Header
from broker.remoting.protocol.wire import WireModel


class GetMetaDataResponseHeader(Header):
    """CONTROLLER_GET_METADATA_INFO (1005)'s answer: which node leads the controller group."""

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool | None = None
    peers: str | None = None


class GetNextBrokerIdRequestHeader(Header):
    cluster_name: str
    broker_name: str


class GetNextBrokerIdResponseHeader(Header):
    cluster_name: str | None = None
    broker_name: str | None = None
    next_broker_id: int | None = None


class ApplyBrokerIdRequestHeader(Header):
    cluster_name: str
    broker_name: str
    applied_broker_id: int
    register_check_code: str  # "<brokerAddr>;<millis>": who claimed the id


class RegisterBrokerToControllerRequestHeader(Header):
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_address: str
    invoke_time: int


class MasterInfoHeader(Header):
    """The master a controller names: the answer of REGISTER_BROKER (1003), GET_REPLICA_INFO (1004) and
    ELECT_MASTER (1002); ``sync_state_set_epoch`` is absent from GET_REPLICA_INFO's (its body carries it)."""

    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None


class BrokerHeartbeatRequestHeader(Header):
    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int
    epoch: int
    max_offset: int
    confirm_offset: int
    heartbeat_timeout_mills: int
    election_priority: int


class GetReplicaInfoRequestHeader(Header):
    broker_name: str


class ElectMasterRequestHeader(Header):
    cluster_name: str
    broker_name: str
    broker_id: int
    designate_elect: bool = False
    invoke_time: int


class AlterSyncStateSetRequestHeader(Header):
    broker_name: str
    master_broker_id: int
    master_epoch: int
    invoke_time: int


class AlterSyncStateSetResponseHeader(Header):
    new_sync_state_set_epoch: int | None = None


class NotifyBrokerRoleChangedRequestHeader(Header):
    """NOTIFY_BROKER_ROLE_CHANGED (1008), controller -> broker, after an election; the body is the SyncStateSet."""

    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None
    master_broker_id: int | None = None


class SyncStateSet(WireModel):
    """The replicas a master counts as in sync, and the epoch of that set."""

    sync_state_set: list[int] = []
    sync_state_set_epoch: int = 0


class ElectMasterResponseBody(WireModel):
    """ELECT_MASTER's body (its ``brokerMemberGroup`` is not read)."""

    sync_state_set: list[int] = []
