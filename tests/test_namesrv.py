"""NameServer over the wire: registration (plain, compressed, CRC), routes in both JSON dialects, cluster info,
topic list, data versions, expiry, unregistration, channel close, and the ``mqlake namesrv`` command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import struct
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest

from broker.namesrv import NamesrvController
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.server import RemotingServer
from tests.aio import async_test, poll
from tests.helpers import wait_until
from tests.peers import JavaServer, write_conf

pytestmark = pytest.mark.integration

CLUSTER = "DefaultCluster"
DATA_VERSION = {"counter": 1, "timestamp": 1_700_000_000_000}


def topic_json(name: str, queues: int = 4, perm: int = 6) -> dict:
    return {"order": False, "perm": perm, "readQueueNums": queues, "topicFilterType": "SINGLE_TAG",
            "topicName": name, "topicSysFlag": 0, "writeQueueNums": queues}


def plain_body(topics: dict[str, dict], version: dict = DATA_VERSION) -> bytes:
    wrapper = {"dataVersion": version, "topicConfigTable": topics}
    return json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": wrapper}).encode()


def compressed_body(lines: list[str], version: dict = DATA_VERSION) -> bytes:
    """Assembled from the documented layout, independently of broker.namesrv.register_body."""

    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    raw = chunk(json.dumps(version).encode()) + struct.pack(">i", len(lines))
    raw += b"".join(chunk(line.encode()) for line in lines) + chunk(b"[]")
    return zlib.compress(raw, 9)


def java_crc32(body: bytes) -> int:
    """UtilAll.crc32: java.util.zip.CRC32 masked with 0x7FFFFFFF."""
    return zlib.crc32(body) & 0x7FFFFFFF


async def register(client, ns, *, name="broker-a", addr="127.0.0.1:10911", broker_id=0, body=b"",
                   compressed=False, crc: int | None = None, ha="127.0.0.1:10912", version=409):
    hdr = h.RegisterBrokerRequestHeader(
        broker_name=name, broker_addr=addr, cluster_name=CLUSTER, ha_server_addr=ha, broker_id=broker_id,
        compressed=compressed, body_crc32=java_crc32(body) if crc is None else crc,
    )
    cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, hdr, body)
    cmd.version = version
    return await client.invoke(ns.address, cmd)


async def route(client, ns, topic: str, version: int = 409, standard_only: bool | None = None):
    cmd = RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, h.GetRouteInfoRequestHeader(topic=topic,
                                                                       accept_standard_json_only=standard_only)
    )
    cmd.version = version
    return await client.invoke(ns.address, cmd)


@contextlib.asynccontextmanager
async def namesrv(**kwargs):
    ns = NamesrvController("127.0.0.1", 0, **kwargs)
    await ns.start()
    client = RemotingClient()
    try:
        yield ns, client
    finally:
        await client.close()
        await ns.stop()


# TopicRouteData for one broker and topic as RocketMQ's NameServers write it, from the Java classes (fastjson:
# getters' fields in alphabetical order, nulls such as orderTopicConf and zoneName omitted, filterServerTable {}).
# 4.8.0 (QueueData.getTopicSynFlag; BrokerData: brokerAddrs, brokerName, cluster), written with plain
# toJSONString, so brokerAddrs' Long key is bare -- what a client older than V4_9_0 is answered:
ROUTE_4_8 = (
    '{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster"}],'
    '"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":0,'
    '"writeQueueNums":4}]}'
)
# 4.9.0-4.9.3 (QueueData.getTopicSysFlag; BrokerData as in 4.8), still plain toJSONString: the key is bare --
# what a V4_9_0..V4_9_3 client is answered:
ROUTE_4_9 = (
    '{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster"}],'
    '"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    '"writeQueueNums":4}]}'
)
# 5.x (QueueData.getTopicSysFlag since 4.9.0; BrokerData.isEnableActingMaster since 5.0), BrowserCompatible, so
# the key is quoted -- what a V4_9_4+ client, or one sending acceptStandardJsonOnly, is answered:
ROUTE_5 = (
    '{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster",'
    '"enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
    '"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
)


@async_test
async def test_register_plain_body_and_route_in_both_dialects():
    async with namesrv() as (ns, client):
        body = plain_body({"TBW102": topic_json("TBW102", 8, 7), "Orders": topic_json("Orders")})
        r = await register(client, ns, body=body)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.body == b'{"table":{}}'
        assert "masterAddr" not in r.ext_fields and "haServerAddr" not in r.ext_fields

        # MQVersion ordinals: V4_8_9 = 391, V4_9_0 = 393, V4_9_3 = 399, V4_9_4 = 401, V5_0_0 = 413
        for version, expected in [
            (213, ROUTE_4_8), (391, ROUTE_4_8),
            (393, ROUTE_4_9), (399, ROUTE_4_9), (400, ROUTE_4_9),  # 400: V4_9_4_SNAPSHOT
            (401, ROUTE_5), (413, ROUTE_5),
        ]:  # fmt: skip
            r = await route(client, ns, "Orders", version=version)
            assert r.code == ResponseCode.SUCCESS and r.body == expected.encode(), version
        # a 5.x client that asks for standard JSON gets it whatever its version
        for version in (391, 399):
            r = await route(client, ns, "Orders", version=version, standard_only=True)
            assert r.body == ROUTE_5.encode()

        # clients ask for TBW102 themselves when auto-creating a topic
        r = await route(client, ns, "TBW102")
        data = json.loads(r.body)
        assert r.code == ResponseCode.SUCCESS and data["queueDatas"][0]["perm"] == 7
        assert data["queueDatas"][0]["readQueueNums"] == 8

        r = await route(client, ns, "NoSuchTopic")
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in r.remark


@async_test
async def test_register_compressed_body():
    async with namesrv() as (ns, client):
        body = compressed_body(["Orders 8 8 6 SINGLE_TAG", 'Ro 2 2 4 SINGLE_TAG {"+message.type":"NORMAL"}'])
        r = await register(client, ns, body=body, compressed=True)
        assert r.code == ResponseCode.SUCCESS, r.remark
        orders = json.loads((await route(client, ns, "Orders")).body)["queueDatas"][0]
        assert (orders["readQueueNums"], orders["writeQueueNums"], orders["perm"]) == (8, 8, 6)
        ro = json.loads((await route(client, ns, "Ro")).body)["queueDatas"][0]
        assert (ro["readQueueNums"], ro["perm"]) == (2, 4)


@async_test
async def test_crc_is_java_masked_crc32_and_mismatch_is_rejected():
    async with namesrv() as (ns, client):
        # a body whose plain CRC32 has the top bit set, so masked and unmasked values differ
        for counter in range(1000):
            body = plain_body({"Orders": topic_json("Orders")}, {"counter": counter, "timestamp": 1})
            if zlib.crc32(body) >= 2**31:
                break
        unmasked_as_java_int = zlib.crc32(body) - 2**32
        r = await register(client, ns, body=body, crc=unmasked_as_java_int)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "crc32 not match"
        r = await register(client, ns, body=body, crc=java_crc32(body) ^ 1)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "crc32 not match"
        assert (await route(client, ns, "Orders")).code == ResponseCode.TOPIC_NOT_EXIST, "nothing registered"
        r = await register(client, ns, body=body)  # the masked CRC is the one Java sends
        assert r.code == ResponseCode.SUCCESS
        assert (await route(client, ns, "Orders")).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    "body, compressed, message",
    [
        (b"{not json", False, "not JSON"),
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":"x"}}}}', False,
         "topicConfigTable['T']"),
        (b"\x00garbage", True, "does not inflate"),
        (zlib.compress(struct.pack(">i", 500) + b"{}"), True, "DataVersion length 500"),
        (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 3) + b"T 1"), True,
         "fewer than 5 fields"),
    ],
)
@async_test
async def test_bad_register_bodies_get_a_clear_error(body, compressed, message):
    async with namesrv() as (ns, client):
        r = await register(client, ns, body=body, compressed=compressed)
        assert r.code == ResponseCode.SYSTEM_ERROR and message in r.remark
        # the server keeps serving, and the same connection still works
        assert (await register(client, ns, body=plain_body({"T": topic_json("T")}))).code == ResponseCode.SUCCESS


@async_test
async def test_missing_header_field_is_reported():
    async with namesrv() as (ns, client):
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, ext={"brokerAddr": "a:1", "clusterName": "c"})
        r = await client.invoke(ns.address, cmd)
        assert r.code == ResponseCode.SYSTEM_ERROR and "the custom field <brokerName> is null" in r.remark


@async_test
async def test_slave_gets_master_address_and_route_lists_both():
    async with namesrv() as (ns, client):
        await register(client, ns, body=plain_body({"Orders": topic_json("Orders")}))
        r = await register(client, ns, addr="127.0.0.1:20911", broker_id=1, ha="127.0.0.1:20912",
                           body=plain_body({"Orders": topic_json("Orders", 99)}))
        assert r.code == ResponseCode.SUCCESS
        assert r.ext_fields == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}
        data = json.loads((await route(client, ns, "Orders")).body)
        assert data["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911", "1": "127.0.0.1:20911"}
        assert data["queueDatas"][0]["readQueueNums"] == 4, "only the master's topic config counts"


@async_test
async def test_cluster_info_and_topic_list():
    async with namesrv() as (ns, client):
        await register(client, ns, body=plain_body({"A": topic_json("A"), "TBW102": topic_json("TBW102")}))
        await register(client, ns, name="broker-b", addr="127.0.0.1:30911",
                       body=plain_body({"A": topic_json("A"), "B": topic_json("B")}))
        r = await client.invoke(ns.address, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        info = json.loads(r.body)
        assert info["clusterAddrTable"] == {CLUSTER: ["broker-a", "broker-b"]}
        assert info["brokerAddrTable"]["broker-b"] == {
            "brokerAddrs": {"0": "127.0.0.1:30911"}, "brokerName": "broker-b", "cluster": CLUSTER,
            "enableActingMaster": False,
        }
        assert b'"brokerAddrs":{"0":' in r.body  # standard JSON: quoted keys
        r = await client.invoke(ns.address, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        assert json.loads(r.body) == {"topicList": ["A", "B", "TBW102"]}
        a = json.loads((await route(client, ns, "A")).body)
        assert [b["brokerName"] for b in a["brokerDatas"]] == ["broker-a", "broker-b"]
        assert [q["brokerName"] for q in a["queueDatas"]] == ["broker-a", "broker-b"]


@async_test
async def test_reregistration_with_new_version_replaces_the_topic_table():
    async with namesrv() as (ns, client):
        await register(client, ns, body=plain_body({"A": topic_json("A"), "B": topic_json("B")}))
        # same data version: the name server keeps what it has (the broker's table did not change)
        await register(client, ns, body=plain_body({"A": topic_json("A")}))
        assert (await route(client, ns, "B")).code == ResponseCode.SUCCESS
        await register(client, ns, body=plain_body({"A": topic_json("A", 2)}, {"counter": 2, "timestamp": 2}))
        assert (await route(client, ns, "B")).code == ResponseCode.TOPIC_NOT_EXIST
        assert json.loads((await route(client, ns, "A")).body)["queueDatas"][0]["readQueueNums"] == 2


# A failover in controller mode as the NameServer sees it: (brokerId, address, stateVersion = the master epoch the
# broker last took) of each registration. ``A`` is master in epoch 1; ``B`` is elected in epoch 2; ``A``, cut off from
# the controllers but not from the NameServer, still registers as master; then it learns of epoch 2 and steps down.
OLD, NEW = "127.0.0.1:10911", "127.0.0.1:20911"
FAILOVER = [(0, OLD, 1), (0, NEW, 2), (0, OLD, 1), (1, OLD, 2)]


async def _failover(address: str) -> list[tuple[int, dict[str, str] | None, dict[str, str]]]:
    """Each FAILOVER registration's answer (code, ext fields) and the route's brokerAddrs after it."""
    ns, seen = types.SimpleNamespace(address=address), []
    client = RemotingClient()
    try:
        for i, (broker_id, addr, state) in enumerate(FAILOVER):
            version = {"counter": i + 1, "timestamp": DATA_VERSION["timestamp"] + i, "stateVersion": state}
            body = plain_body({"A": topic_json("A"), "B": topic_json("B")}, version)
            r = await register(client, ns, addr=addr, broker_id=broker_id, ha=addr[:-1] + "2", body=body)
            routed = json.loads((await route(client, ns, "A", standard_only=True)).body)
            seen.append((r.code, r.ext_fields, routed["brokerDatas"][0]["brokerAddrs"]))
    finally:
        await client.close()
    return seen


def test_a_master_replaced_by_a_newer_epoch_keeps_no_route_as_on_apache_rocketmqs_nameserver(tmp_path: Path) -> None:
    """The same registrations to RocketMQ 5's NameServer and to ours: the same answers and routes. A registration
    for a broker id held by a live broker with a greater stateVersion is ignored, so clients never follow a master
    the controllers have replaced back to it."""
    conf = write_conf(tmp_path / "namesrv.conf", {"listenPort": 0})  # its own pick, read back
    with JavaServer("namesrv", "rocketmq-5", tmp_path / "java", "-c", str(conf)) as java_namesrv:
        theirs = run(_failover(f"127.0.0.1:{java_namesrv.listen_port()}"))

    async def ours() -> list[tuple[int, dict[str, str] | None, dict[str, str]]]:
        async with namesrv() as (ns, _):
            return await _failover(ns.address)

    assert run(ours()) == theirs
    assert [addrs for _, _, addrs in theirs] == [{"0": OLD}, {"0": NEW}, {"0": NEW}, {"0": NEW, "1": OLD}]


@async_test
async def test_query_data_version():
    async with namesrv() as (ns, client):
        hdr = h.QueryDataVersionRequestHeader(broker_name="broker-a", broker_addr="127.0.0.1:10911",
                                              cluster_name=CLUSTER, broker_id=0)

        async def query(version: dict):
            cmd = RemotingCommand.request(RequestCode.QUERY_DATA_VERSION, hdr, json.dumps(version).encode())
            return await client.invoke(ns.address, cmd)

        r = await query(DATA_VERSION)
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["changed"] == "true" and r.body == b""
        await register(client, ns, body=plain_body({"A": topic_json("A")}))
        r = await query(DATA_VERSION)
        assert r.ext_fields["changed"] == "false" and json.loads(r.body) == DATA_VERSION
        r = await query({"counter": 2, "timestamp": DATA_VERSION["timestamp"]})
        assert r.ext_fields["changed"] == "true"


@async_test
async def test_silent_broker_expires_and_a_live_one_stays():
    # The table's clock is the test's, and the scans are the test's calls (the periodic one never comes): expiry
    # is judged on registration times alone, not on how fast this machine runs.
    now = [1000.0]
    async with namesrv(broker_expired_seconds=120, scan_interval=3600) as (ns, client):
        ns.table._clock = lambda: now[0]
        await register(client, ns, body=plain_body({"Quiet": topic_json("Quiet")}))
        quiet_channel = await client.connection(ns.address)
        busy = RemotingClient()  # each broker has its own channel, as in a real deployment
        await register(busy, ns, name="broker-b", addr="127.0.0.1:30911", body=plain_body({"Busy": topic_json("Busy")}))
        hdr = h.QueryDataVersionRequestHeader(broker_name="broker-b", broker_addr="127.0.0.1:30911",
                                              cluster_name=CLUSTER, broker_id=0)

        async def busy_keeps_alive() -> None:
            # an unchanged-data-version query keeps a broker alive, as a RocketMQ broker's does
            r = await busy.invoke(ns.address, RemotingCommand.request(
                RequestCode.QUERY_DATA_VERSION, hdr, json.dumps(DATA_VERSION).encode()))
            assert r.ext_fields["changed"] == "false"

        now[0] += 100
        await busy_keeps_alive()
        assert ns.scan_not_active_brokers() == 0 and set(ns.table.brokers) == {"broker-a", "broker-b"}
        now[0] += 20.001  # broker-a: silent for just over 120 s; broker-b for 20 s
        assert ns.scan_not_active_brokers() == 1 and set(ns.table.brokers) == {"broker-b"}
        await poll(lambda: quiet_channel.closed, what="the expired broker's channel closed by the name server")
        assert (await route(client, ns, "Quiet")).code == ResponseCode.TOPIC_NOT_EXIST
        assert (await route(client, ns, "Busy")).code == ResponseCode.SUCCESS
        r = await client.invoke(ns.address, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert json.loads(r.body)["clusterAddrTable"] == {CLUSTER: ["broker-b"]}
        await busy.close()


@async_test
async def test_unregister_and_channel_close_remove_a_broker():
    async with namesrv() as (ns, client):
        await register(client, ns, body=plain_body({"A": topic_json("A")}))
        other = RemotingClient()
        await register(other, ns, name="broker-b", addr="127.0.0.1:30911", body=plain_body({"A": topic_json("A")}))

        cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, h.UnRegisterBrokerRequestHeader(
            broker_name="broker-a", broker_addr="127.0.0.1:10911", cluster_name=CLUSTER, broker_id=0))
        assert (await client.invoke(ns.address, cmd)).code == ResponseCode.SUCCESS
        data = json.loads((await route(client, ns, "A")).body)
        assert [b["brokerName"] for b in data["brokerDatas"]] == ["broker-b"]

        await other.close()  # broker-b's channel closes: the name server drops it at once
        await poll(lambda: "broker-b" not in ns.table.brokers, what="broker-b dropped on channel close")
        assert (await route(client, ns, "A")).code == ResponseCode.TOPIC_NOT_EXIST
        r = await client.invoke(ns.address, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        assert json.loads(r.body) == {"brokerAddrTable": {}, "clusterAddrTable": {}}


@async_test
async def test_kv_config():
    async with namesrv() as (ns, client):
        put = h.PutKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="Orders", value="broker-a:4")
        assert (await client.invoke(ns.address, RemotingCommand.request(RequestCode.PUT_KV_CONFIG, put))).code == 0
        get = RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                      h.GetKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="Orders"))
        assert (await client.invoke(ns.address, get)).ext_fields == {"value": "broker-a:4"}
        r = await register(client, ns, body=plain_body({"Orders": topic_json("Orders")}))
        assert json.loads(r.body) == {"table": {"Orders": "broker-a:4"}}
        missing = RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                          h.GetKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="x"))
        assert (await client.invoke(ns.address, missing)).code == ResponseCode.QUERY_NOT_FOUND


def test_mqlake_namesrv_command(tmp_path):
    log_path = tmp_path / "namesrv.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import main; main()", "namesrv", "--port", "0"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        line = wait_until(
            lambda: next((ln for ln in log_path.read_text().splitlines() if "NameServer ready at" in ln), None)
            or (proc.poll() is not None and pytest.fail(f"namesrv exited early:\n{log_path.read_text()}")),
            timeout=30, what="NameServer ready line",
        )
        addr = line.rsplit(" ", 1)[1]

        async def ask():
            client = RemotingClient()
            try:
                cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
                return await client.invoke(addr, cmd)
            finally:
                await client.close()

        r = run(ask())
        assert r.code == ResponseCode.SUCCESS and json.loads(r.body) == {"topicList": []}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@async_test
async def test_real_rocketmq_client_resolves_route_and_sends():
    """The PyPI ``rocketmq`` (C++) client reads our route (it sends an old version: legacy JSON dialect) and its
    SEND_MESSAGE frame decodes on a RemotingServer standing in for the broker; our response satisfies it."""
    from rocketmq.client import Message, Producer

    seen: list[RemotingCommand] = []

    async def send(cmd, conn):
        seen.append(cmd)
        header = h.SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000000000", queue_id=1, queue_offset=5)
        ext = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return cmd.response(ResponseCode.SUCCESS, header=header, ext=ext)

    broker = RemotingServer("127.0.0.1", 0, name="stand-in broker")
    for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
        broker.register(code, send)
    await broker.start()
    async with namesrv() as (ns, client):
        body = plain_body({"CppTopic": topic_json("CppTopic")})
        await register(client, ns, addr=f"127.0.0.1:{broker.port}", body=body)
        producer = Producer("PG_cpp_interop")
        producer.set_namesrv_addr(ns.address)
        producer.start()
        try:
            msg = Message("CppTopic")
            msg.set_body("hello from C++")
            msg.set_tags("TagA")
            result = await asyncio.to_thread(producer.send_sync, msg)
        finally:
            await asyncio.to_thread(producer.shutdown)
    await broker.stop()
    assert result.status.name == "OK" and result.offset == 5
    assert len(seen) == 1
    cmd = seen[0]
    assert cmd.language == "CPP" and cmd.version < 401 and cmd.body == b"hello from C++"
    hdr = cmd.read_header(h.SendMessageRequestHeader) if cmd.code == RequestCode.SEND_MESSAGE else \
        cmd.read_header(h.SendMessageRequestHeaderV2).to_v1()
    assert (hdr.topic, hdr.producer_group, hdr.default_topic) == ("CppTopic", "PG_cpp_interop", "TBW102")
    assert "TAGS\x01TagA\x02" in hdr.properties
