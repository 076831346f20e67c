"""NameServer request handlers (reference §7.5): broker registration, routes, cluster info, KV config."""

from __future__ import annotations

import logging

from broker.namesrv.fastjson import dumps_legacy, dumps_standard
from broker.namesrv.register_body import RegisterBodyError, decode_register_body
from broker.namesrv.route_table import RouteTable
from broker.remoting import headers as h
from broker.remoting.codes import VERSION_V4_9_4, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.server import Connection, RemotingServer
from store.config_files import load_lenient_json
from store.format import hashing

log = logging.getLogger(__name__)

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # KV namespace returned to brokers on registration


class NamesrvProcessor:
    """Handlers bound to one RouteTable; ``install`` registers them on a RemotingServer."""

    def __init__(self, table: RouteTable, broker_expired_seconds: float) -> None:
        self.table = table
        self.broker_expired_seconds = broker_expired_seconds
        self.kv: dict[str, dict[str, str]] = {}

    def install(self, server: RemotingServer) -> None:
        for code, handler in {
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
        }.items():
            server.register(code, handler)

    # --- brokers -----------------------------------------------------------------------------------------------

    async def register_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.RegisterBrokerRequestHeader)
        if hdr.body_crc32 != 0:
            actual = hashing.body_crc32(cmd.body)
            if actual != hdr.body_crc32:
                log.warning("REGISTER_BROKER from %s (%s): bodyCrc32 %d, body has %d", conn.remote_addr,
                            hdr.broker_addr, hdr.body_crc32, actual)
                return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            body = decode_register_body(cmd.body, hdr.compressed)
        except RegisterBodyError as e:
            log.warning("REGISTER_BROKER from %s (%s): %s", conn.remote_addr, hdr.broker_addr, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        timeout = self.broker_expired_seconds
        if hdr.heartbeat_timeout_millis:
            timeout = hdr.heartbeat_timeout_millis / 1000
        result = self.table.register_broker(
            hdr.cluster_name,
            hdr.broker_addr,
            hdr.broker_name,
            hdr.broker_id,
            hdr.ha_server_addr,
            body.data_version if cmd.body else None,
            body.topics if cmd.body else None,
            body.filter_servers,
            timeout,
            conn,
        )
        header = h.RegisterBrokerResponseHeader(ha_server_addr=result.ha_server_addr, master_addr=result.master_addr)
        kv_table = {"table": dict(sorted(self.kv.get(ORDER_TOPIC_CONFIG, {}).items()))}
        return cmd.response(ResponseCode.SUCCESS, header=header, body=dumps_standard(kv_table))

    async def unregister_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.UnRegisterBrokerRequestHeader)
        self.table.unregister_broker(hdr.cluster_name, hdr.broker_addr, hdr.broker_name, hdr.broker_id)
        return cmd.response(ResponseCode.SUCCESS)

    async def query_data_version(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.QueryDataVersionRequestHeader)
        try:
            version = load_lenient_json(cmd.body.decode("utf-8"), "DataVersion") if cmd.body else {}
        except (ValueError, UnicodeDecodeError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"DataVersion body is not JSON: {e}")
        if not isinstance(version, dict):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "DataVersion body is not a JSON object")
        changed = self.table.data_version_changed(hdr.broker_addr, version)
        if not changed:
            self.table.touch(hdr.broker_addr)  # an unchanged broker skips re-registration: this keeps it alive
        ours = self.table.data_version(hdr.broker_addr)
        return cmd.response(
            ResponseCode.SUCCESS,
            header=h.QueryDataVersionResponseHeader(changed=changed),
            body=dumps_standard(ours) if ours is not None else b"",
        )

    async def broker_heartbeat(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.BrokerHeartbeatRequestHeader)
        self.table.touch(hdr.broker_addr)
        return cmd.response(ResponseCode.SUCCESS)

    # --- clients -----------------------------------------------------------------------------------------------

    async def get_route_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.GetRouteInfoRequestHeader)
        # 4.9.4+ clients (and 5.x ones asking explicitly) get a 5.x NameServer's route: quoted map keys,
        # topicSysFlag. Older ones get a 4.8 NameServer's: fastjson's default bare keys, topicSynFlag.
        standard = cmd.version >= VERSION_V4_9_4 or bool(hdr.accept_standard_json_only)
        route = self.table.route(hdr.topic, legacy=not standard)
        if route is None:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {hdr.topic}"
            )
        return cmd.response(ResponseCode.SUCCESS, body=dumps_standard(route) if standard else dumps_legacy(route))

    async def get_cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=dumps_standard(self.table.cluster_info()))

    async def get_all_topics(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=dumps_standard({"topicList": self.table.topics()}))

    async def get_topics_by_cluster(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.GetTopicsByClusterRequestHeader)
        topics = self.table.topics_of_cluster(hdr.cluster)
        return cmd.response(ResponseCode.SUCCESS, body=dumps_standard({"topicList": topics}))

    async def delete_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.DeleteTopicFromNamesrvRequestHeader)
        self.table.delete_topic(hdr.topic, hdr.cluster_name)
        return cmd.response(ResponseCode.SUCCESS)

    # --- KV config ---------------------------------------------------------------------------------------------

    async def put_kv(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.PutKVConfigRequestHeader)
        self.kv.setdefault(hdr.namespace, {})[hdr.key] = hdr.value
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.GetKVConfigRequestHeader)
        value = self.kv.get(hdr.namespace, {}).get(hdr.key)
        if value is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {hdr.namespace} Key: {hdr.key}"
            )
        return cmd.response(ResponseCode.SUCCESS, header=h.GetKVConfigResponseHeader(value=value))

    async def delete_kv(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        hdr = cmd.read_header(h.DeleteKVConfigRequestHeader)
        self.kv.get(hdr.namespace, {}).pop(hdr.key, None)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_kv_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        namespace = cmd.ext_fields.get("namespace")
        table = self.kv.get(namespace or "")
        if not table:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return cmd.response(ResponseCode.SUCCESS, body=dumps_standard({"table": dict(sorted(table.items()))}))

