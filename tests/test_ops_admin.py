"""mqadmin's operator commands through ``mqlake admin`` against a real ``mqlake up``, with the stock C++
client (PyPI ``rocketmq``) producing and consuming: real TPS and day counters, offset resets (online and offline,
before the first message), topic and group deletion, broker settings at run time, draining a broker, stats."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from broker.client import MessageQueue, PullConsumer
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.loop import run
from broker.remoting.protocol.body import SubscriptionGroupWrapper
from broker.remoting.protocol.topic import TopicConfigSerializeWrapper
from cli.main import app
from tests.fixtures_broker import remoting_call
from tests.helpers import wait_until
from tests.test_conformance_cpp_client import (
    Collector,
    committed,
    max_offset,
    message,
    producer,
    push_consumer,
    unique,
    wait_routed,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
runner = CliRunner()


def admin(server, *args: str):
    return runner.invoke(app, ["admin", *args, "-n", server.namesrv_addr, "--json"])


def admin_json(server, *args: str):
    result = admin(server, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def admin_error(server, *args: str) -> str:
    result = admin(server, *args)
    assert result.exit_code == 1, result.output
    return result.output


def send(server, topic: str, n: int, group: str | None = None) -> None:
    p = producer(server, group)
    try:
        for i in range(n):
            assert p.send_sync(message(topic, f"{topic}-{i}")).status == 0
    finally:
        p.shutdown()


def test_runtime_figures_and_stats_count_real_traffic(mqlake_server) -> None:
    topic, group = unique("StatsT"), unique("StatsCG")
    send(mqlake_server, topic, 20)
    got = Collector()
    c = push_consumer(mqlake_server, group, topic, got)
    try:
        got.wait_bodies({f"{topic}-{i}".encode() for i in range(20)})

        def status() -> dict[str, str]:
            return admin_json(mqlake_server, "brokerStatus", "-b", mqlake_server.broker_addr)

        # the store samples once a second: within a few seconds the 10 s/60 s/600 s put rates are not zero
        def rated() -> dict[str, str] | None:
            s = status()
            return s if float(s["putTps"].split(" ")[1]) > 0 else None

        info = wait_until(rated, 20, what="putTps over 60 s above zero")
        assert len(info["putTps"].split(" ")) == 3 and len(info["getTransferedTps"].split(" ")) == 3
        assert int(info["msgPutTotalTodayNow"]) >= 20 and int(info["msgGetTotalTodayNow"]) >= 20
        assert int(info["msgPutTotalTodayMorning"]) <= int(info["msgPutTotalTodayNow"])
        cluster = admin_json(mqlake_server, "clusterList")
        assert cluster[0]["runtime"]["putTps"].split(" ")[0] != ""

        # stats items sample every 10 s: statsAll then sees the 20 in and the 20 out of this topic and group
        def row() -> dict | None:
            rows = admin_json(mqlake_server, "statsAll", "-t", topic)
            mine = [r for r in rows if r["consumerGroup"] == group]
            return mine[0] if mine and mine[0]["outMsg24Hour"] == 20 else None

        r = wait_until(row, 40, what="statsAll to count the group's 20 messages")
        assert r["inMsg24Hour"] == 20 and r["inTps"] > 0 and r["outTps"] > 0

        async def consume_tps() -> float:
            from broker.client.ops import OpsAdmin

            async with OpsAdmin(mqlake_server.namesrv_addr) as a:
                return await a.consume_tps(group)

        assert run(consume_tps()) > 0
    finally:
        c.shutdown()


def test_reset_offset_by_time_offline_group_and_before_the_first_message(mqlake_server) -> None:
    topic, group = unique("ResetT"), unique("ResetCG")
    send(mqlake_server, topic, 12)
    wait_routed(mqlake_server, topic)

    async def commit_some() -> None:  # an offline group that has read 1 message of each queue
        async with PullConsumer(group, mqlake_server.namesrv_addr) as pc:
            for q in range(4):
                await pc.update_offset(MessageQueue(topic, "broker-a", q), 1)

    run(commit_some())
    wait_until(lambda: committed(mqlake_server, group, topic, 0) == 1, 20, what="offsets committed")
    wait_until(lambda: sum(max_offset(mqlake_server, topic, q) for q in range(4)) == 12, 20, what="dispatch")
    # "now" is after every message: the offset SEARCH_OFFSET_BY_TIMESTAMP gives, the queue's last message
    ends = {q: max_offset(mqlake_server, topic, q) - 1 for q in range(4)}
    out = admin_json(mqlake_server, "resetOffsetByTime", "-g", group, "-t", topic, "-s", "now")
    assert {r["queueId"]: r["offset"] for r in out["offsets"]} == ends
    assert {q: committed(mqlake_server, group, topic, q) for q in range(4)} == ends
    # a time before the earliest message: the earliest offset, as RocketMQ
    out = admin_json(mqlake_server, "resetOffsetByTime", "-g", group, "-t", topic, "-s", "1000")
    assert {r["offset"] for r in out["offsets"]} == {0}
    assert {committed(mqlake_server, group, topic, q) for q in range(4)} == {0}
    err = admin_error(mqlake_server, "resetOffsetByTime", "-g", group, "-t", unique("NoSuchTopic"), "-s", "now")
    assert "NoSuchTopic" in err


def test_reset_offset_of_an_online_cpp_consumer_redelivers(mqlake_server) -> None:
    topic, group = unique("ResetOnT"), unique("ResetOnCG")
    send(mqlake_server, topic, 8)
    got = Collector()
    c = push_consumer(mqlake_server, group, topic, got)
    try:
        bodies = {f"{topic}-{i}".encode() for i in range(8)}
        got.wait_bodies(bodies)
        wait_until(lambda: all(committed(mqlake_server, group, topic, q) == max_offset(mqlake_server, topic, q)
                               for q in range(4)), 30, what="the consumer to commit")  # fmt: skip
        out = admin_json(mqlake_server, "resetOffsetByTime", "-g", group, "-t", topic, "-s", "0")
        assert {r["offset"] for r in out["offsets"]} == {0}
        # the client was told (RESET_CONSUMER_CLIENT_OFFSET): it consumes everything again
        wait_until(lambda: len(got.snapshot()) >= 16, 40, what="the 8 messages a second time")
        assert sorted(g.body for g in got.snapshot()) == sorted(list(bodies) * 2)

        status = admin_json(mqlake_server, "consumerStatus", "-g", group)
        conn = admin_json(mqlake_server, "consumerConnection", "-g", group)
        assert set(status) == {c["clientId"] for c in conn["connectionSet"]} and len(status) == 1
        assert topic in conn["subscriptionTable"]
    finally:
        c.shutdown()


def test_delete_topic_in_broker_and_namesrv(mqlake_server) -> None:
    topic, group = unique("DelT"), unique("DelCG")
    send(mqlake_server, topic, 3)
    got = Collector()
    c = push_consumer(mqlake_server, group, topic, got)  # a live consumer does not stop the deletion, as in Java
    try:
        got.wait_bodies({f"{topic}-{i}".encode() for i in range(3)})
        out = admin_json(mqlake_server, "deleteTopic", "-t", topic, "-c", "DefaultCluster")
        assert out["brokers"] == [mqlake_server.broker_addr]
        assert topic not in admin_json(mqlake_server, "topicList")
        resp = remoting_call(mqlake_server.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        assert topic not in TopicConfigSerializeWrapper.decode(resp.body).topic_config_table
        # the broker's next registration (another topic's creation) does not bring it back
        other = unique("DelOther")
        admin_json(mqlake_server, "updateTopic", "-t", other, "-b", mqlake_server.broker_addr)
        wait_until(lambda: other in admin_json(mqlake_server, "topicList"), 20, what="the next registration")
        assert topic not in admin_json(mqlake_server, "topicList")
    finally:
        c.shutdown()
    err = admin_error(mqlake_server, "deleteTopic", "-t", "SCHEDULE_TOPIC_XXXX", "-c", "DefaultCluster")
    assert "conflict with system topic" in err and "code 29" in err
    assert "TBW102" in admin_json(mqlake_server, "topicList")
    err = admin_error(mqlake_server, "deleteTopic", "-t", "TBW102", "-c", "DefaultCluster")
    assert "TBW102" in err


def _groups(server) -> dict:
    resp = remoting_call(server.broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    return SubscriptionGroupWrapper.decode(resp.body).subscription_group_table


def test_sub_groups_clone_and_query_by_offset(mqlake_server) -> None:
    topic, group, clone = unique("SubT"), unique("SubCG"), unique("CloneCG")
    out = admin_json(mqlake_server, "updateSubGroup", "-g", group, "-b", mqlake_server.broker_addr, "-r", "3",
                     "-s", "false")  # fmt: skip
    assert out["brokers"] == [mqlake_server.broker_addr]
    cfg = _groups(mqlake_server)[group]
    assert (cfg.retry_max_times, cfg.consume_enable) == (3, False)

    send(mqlake_server, topic, 4)
    wait_routed(mqlake_server, topic)

    async def commit() -> None:
        async with PullConsumer(group, mqlake_server.namesrv_addr) as pc:
            await pc.update_offset(MessageQueue(topic, "broker-a", 0), 1)

    run(commit())
    wait_until(lambda: committed(mqlake_server, group, topic, 0) == 1, 20, what="offset committed")
    admin_json(mqlake_server, "cloneGroupOffset", "-s", group, "-d", clone, "-t", topic)
    assert committed(mqlake_server, clone, topic, 0) == 1

    m = admin_json(mqlake_server, "queryMsgByOffset", "-t", topic, "-b", "broker-a", "-i", "0", "-o", "0")
    assert m["topic"] == topic and m["queueId"] == 0 and m["queueOffset"] == 0
    assert admin_error(mqlake_server, "queryMsgByOffset", "-t", topic, "-b", "broker-a", "-i", "0", "-o", "999")

    admin_json(mqlake_server, "deleteSubGroup", "-g", group, "-c", "DefaultCluster", "-r")
    assert group not in _groups(mqlake_server)
    assert committed(mqlake_server, group, topic, 0) == -1  # -r: its offsets went too
    assert committed(mqlake_server, clone, topic, 0) == 1


def test_broker_config_at_run_time_and_draining(mqlake_server_factory) -> None:
    server = mqlake_server_factory()
    cfg = admin_json(server, "getBrokerConfig", "-b", server.broker_addr)
    assert cfg["brokerName"] == "broker-a" and cfg["brokerPermission"] == "6"
    for key, needle in (("noSuchKey", "unknown broker config key noSuchKey"),
                        ("brokerName", "broker config key brokerName cannot change at run time"),
                        ("brokerPermission", "brokerPermission='x'")):  # fmt: skip
        assert needle in admin_error(server, "updateBrokerConfig", "-b", server.broker_addr, "-k", key, "-v", "x")
    assert "black list" in admin_error(server, "updateBrokerConfig", "-b", server.broker_addr, "-k",
                                       "brokerConfigPath", "-v", "/tmp/x")  # fmt: skip
    assert admin_json(server, "getBrokerConfig", "-b", server.broker_addr)["brokerName"] == "broker-a"

    topic = unique("PermT")
    send(server, topic, 1)
    wait_routed(server, topic)

    def queue_perm() -> int:
        return admin_json(server, "topicRoute", "-t", topic)["queueDatas"][0]["perm"]

    # wipeWritePerm in the NameServer: the route loses PERM_WRITE until addWritePerm
    counts = admin_json(server, "wipeWritePerm", "-b", "broker-a")
    assert counts[server.namesrv_addr] > 0 and queue_perm() == 4
    admin_json(server, "addWritePerm", "-b", "broker-a")
    assert queue_perm() == 6

    # brokerPermission=4 on the broker: sends are refused and the route follows at once
    admin_json(server, "updateBrokerConfig", "-b", server.broker_addr, "-k", "brokerPermission", "-v", "4")
    assert admin_json(server, "getBrokerConfig", "-b", server.broker_addr)["brokerPermission"] == "4"
    assert queue_perm() == 4
    hdr = h.SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=0,
        flag=0,
    )
    assert remoting_call(server.broker_addr, RequestCode.SEND_MESSAGE, hdr, b"x").code == ResponseCode.NO_PERMISSION
    admin_json(server, "updateBrokerConfig", "-c", "DefaultCluster", "-k", "brokerPermission", "-v", "6")
    assert queue_perm() == 6
    assert remoting_call(server.broker_addr, RequestCode.SEND_MESSAGE, hdr, b"x").code == ResponseCode.SUCCESS

    out = admin_json(server, "deleteExpiredCommitLog", "-b", server.broker_addr)
    assert out["brokers"] == [server.broker_addr]
    assert max_offset(server, topic, 0) >= 1  # nothing expired: nothing lost


def test_namesrv_kv_config_survives_a_restart_and_log_dir_files(mqlake_server_factory, tmp_path) -> None:
    logs = tmp_path / "rocketmqlogs"
    server = mqlake_server_factory(logDir=str(logs))
    assert "Broker ready at" in (logs / "broker.log").read_text()
    assert "NameServer started on" in (logs / "namesrv.log").read_text()
    assert "NameServer started on" not in (logs / "broker.log").read_text()
    put = h.PutKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="OrderT", value="broker-a:4")
    assert remoting_call(server.namesrv_addr, RequestCode.PUT_KV_CONFIG, put).code == ResponseCode.SUCCESS
    path = server.store_dir.parent / "namesrv" / "kvConfig.json"
    assert json.loads(path.read_text()) == {"configTable": {"ORDER_TOPIC_CONFIG": {"OrderT": "broker-a:4"}}}
    server.restart()
    get = h.GetKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="OrderT")
    resp = remoting_call(server.namesrv_addr, RequestCode.GET_KV_CONFIG, get)
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["value"] == "broker-a:4"
    delete = h.DeleteKVConfigRequestHeader(namespace="ORDER_TOPIC_CONFIG", key="OrderT")
    assert remoting_call(server.namesrv_addr, RequestCode.DELETE_KV_CONFIG, delete).code == ResponseCode.SUCCESS
    assert json.loads(path.read_text()) == {"configTable": {}}


def test_producer_connection_lists_a_live_cpp_producer(mqlake_server) -> None:
    topic, group = unique("ProdT"), unique("PG")
    p = producer(mqlake_server, group)
    try:
        assert p.send_sync(message(topic, "x")).status == 0
        wait_routed(mqlake_server, topic)
        # the client announces its group with its next heartbeat (at start and every 30 s)
        wait_until(
            lambda: admin(mqlake_server, "producerConnection", "-g", group, "-t", topic).exit_code == 0,
            40,
            what="the producer's heartbeat",
        )
        pc = admin_json(mqlake_server, "producerConnection", "-g", group, "-t", topic)
        assert len(pc["connectionSet"]) == 1 and pc["connectionSet"][0]["language"] == "CPP"
    finally:
        p.shutdown()
    err = admin_error(mqlake_server, "producerConnection", "-g", unique("NoPG"), "-t", topic)
    assert "has no connection" in err
