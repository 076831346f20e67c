"""NameServer request handlers (reference §7.5): broker registration, routes, cluster info, KV config."""

from __future__ import annotations

import asyncio
import logging

from broker.namesrv.kv_config import KVConfigManager
from broker.namesrv.register_body import decode_register_body
from broker.namesrv.route_table import RouteTable
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.ops_headers import AddWritePermOfBrokerRequestHeader, AddWritePermOfBrokerResponseHeader
from broker.remoting.protocol.body import KVTable, TopicList
from broker.remoting.protocol.fastjson import dumps_standard
from broker.remoting.protocol.route import RouteForm
from broker.remoting.protocol.topic import DataVersion
from broker.remoting.protocol.wire import BodyError, WireModel
from store.format import hashing

log = logging.getLogger(__name__)

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # KV namespace returned to brokers on registration

# The codes that change what the NameServer tells clients (routes, broker liveness and permissions, KV config):
# with aclEnable each needs a signed admin account. Reads (routes, cluster info, topic lists, KV reads) stay open,
# as every client needs them before it can sign anything. UPDATE_NAMESRV_CONFIG is not served yet; listed, it stays
# guarded once it is.
WRITE_CODES = frozenset({
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.BROKER_HEARTBEAT,
    RequestCode.QUERY_DATA_VERSION,  # an unchanged version renews the broker's liveness, as a heartbeat does
    RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.ADD_WRITE_PERM_OF_BROKER, RequestCode.UPDATE_NAMESRV_CONFIG,
})  # fmt: skip


def _standard(body: WireModel) -> bytes:
    return dumps_standard(body.to_json())


class NamesrvProcessor:
    """Handlers bound to one RouteTable; ``routes`` names them by request code."""

    def __init__(self, table: RouteTable, broker_expired_seconds: float, kv: KVConfigManager | None = None) -> None:
        self.table = table
        self.broker_expired_seconds = broker_expired_seconds
        self.kv = kv if kv is not None else KVConfigManager(None)

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.BROKER_HEARTBEAT: self.broker_heartbeat,
            RequestCode.PUT_KV_CONFIG: self.put_kv,
            RequestCode.GET_KV_CONFIG: self.get_kv,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm,
        }

    # --- brokers -----------------------------------------------------------------------------------------------

    async def register_broker(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.RegisterBrokerRequestHeader)
        if hdr.body_crc32 != 0:
            actual = hashing.body_crc32(cmd.body)
            if actual != hdr.body_crc32:
                log.warning("REGISTER_BROKER from %s (%s): bodyCrc32 %d, body has %d", conn.remote_addr,
                            hdr.broker_addr, hdr.body_crc32, actual)
                return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            body = decode_register_body(cmd.body, hdr.compressed)
        except BodyError as e:
            log.warning("REGISTER_BROKER from %s (%s): %s", conn.remote_addr, hdr.broker_addr, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        wrapper = body.topic_config_serialize_wrapper if body is not None else None
        timeout = self.broker_expired_seconds
        if hdr.heartbeat_timeout_millis:
            timeout = hdr.heartbeat_timeout_millis / 1000
        result = self.table.register_broker(
            hdr.cluster_name,
            hdr.broker_addr,
            hdr.broker_name,
            hdr.broker_id,
            hdr.ha_server_addr,
            wrapper.data_version if wrapper is not None else None,
            wrapper.topics() if wrapper is not None else None,
            body.filter_server_list if body is not None else [],
            timeout,
            conn,
        )
        header = h.RegisterBrokerResponseHeader(ha_server_addr=result.ha_server_addr, master_addr=result.master_addr)
        kv_table = KVTable(table=dict(sorted(self.kv.namespace(ORDER_TOPIC_CONFIG).items())))
        return cmd.response(ResponseCode.SUCCESS, header=header, body=_standard(kv_table))

    async def unregister_broker(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.UnRegisterBrokerRequestHeader)
        self.table.unregister_broker(hdr.cluster_name, hdr.broker_addr, hdr.broker_name, hdr.broker_id)
        return cmd.response(ResponseCode.SUCCESS)

    async def query_data_version(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.QueryDataVersionRequestHeader)
        version = DataVersion.decode(cmd.body) if cmd.body else DataVersion()  # a BodyError answers SYSTEM_ERROR
        changed = self.table.data_version_changed(hdr.broker_addr, version)
        if not changed:
            self.table.touch(hdr.broker_addr)  # an unchanged broker skips re-registration: this keeps it alive
        ours = self.table.data_version(hdr.broker_addr)
        return cmd.response(
            ResponseCode.SUCCESS,
            header=h.QueryDataVersionResponseHeader(changed=changed),
            body=_standard(ours) if ours is not None else b"",
        )

    async def broker_heartbeat(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.BrokerHeartbeatRequestHeader)
        self.table.touch(hdr.broker_addr)
        return cmd.response(ResponseCode.SUCCESS)

    # --- clients -----------------------------------------------------------------------------------------------

    async def get_route_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.GetRouteInfoRequestHeader)
        route = self.table.route(hdr.topic)
        if route is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {hdr.topic}"
            )
        # Each client reads the field names and key style of its own generation's NameServer.
        form = RouteForm.for_client(cmd.version, bool(hdr.accept_standard_json_only))
        return cmd.response(ResponseCode.SUCCESS, body=route.encode_as(form))

    async def get_cluster_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=_standard(self.table.cluster_info()))

    async def get_all_topics(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=_standard(TopicList(topic_list=self.table.topics())))

    async def get_topics_by_cluster(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.GetTopicsByClusterRequestHeader)
        topics = self.table.topics_of_cluster(hdr.cluster)
        return cmd.response(ResponseCode.SUCCESS, body=_standard(TopicList(topic_list=topics)))

    async def delete_topic(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.DeleteTopicFromNamesrvRequestHeader)
        self.table.delete_topic(hdr.topic, hdr.cluster_name)
        return cmd.response(ResponseCode.SUCCESS)

    # --- KV config ---------------------------------------------------------------------------------------------

    async def put_kv(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.PutKVConfigRequestHeader)
        await asyncio.to_thread(self.kv.put, hdr.namespace, hdr.key, hdr.value)  # written to kvConfig.json
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.GetKVConfigRequestHeader)
        value = self.kv.get(hdr.namespace, hdr.key)
        if value is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {hdr.namespace} Key: {hdr.key}"
            )
        return cmd.response(ResponseCode.SUCCESS, header=h.GetKVConfigResponseHeader(value=value))

    async def delete_kv(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(h.DeleteKVConfigRequestHeader)
        await asyncio.to_thread(self.kv.delete, hdr.namespace, hdr.key)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv_list(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        namespace = cmd.ext_fields.get("namespace")
        table = self.kv.namespace(namespace or "")
        if not table:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return cmd.response(ResponseCode.SUCCESS, body=_standard(KVTable(table=dict(sorted(table.items())))))

    # --- draining a broker -------------------------------------------------------------------------------------

    async def wipe_write_perm(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        """Clients stop sending to the broker (its queues lose PERM_WRITE) until it registers a new data version."""
        hdr = cmd.read_header(h.WipeWritePermOfBrokerRequestHeader)
        count = self.table.set_write_perm(hdr.broker_name, False)
        log.info("wipe write perm of broker %s: %d topics, requested by %s", hdr.broker_name, count, conn.remote_addr)
        return cmd.response(ResponseCode.SUCCESS, header=h.WipeWritePermOfBrokerResponseHeader(wipe_topic_count=count))

    async def add_write_perm(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        hdr = cmd.read_header(AddWritePermOfBrokerRequestHeader)
        count = self.table.set_write_perm(hdr.broker_name, True)
        log.info("add write perm of broker %s: %d topics, requested by %s", hdr.broker_name, count, conn.remote_addr)
        return cmd.response(ResponseCode.SUCCESS, header=AddWritePermOfBrokerResponseHeader(add_topic_count=count))
