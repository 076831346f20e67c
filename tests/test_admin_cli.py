"""``mqlake admin`` against a running ``mqlake up``: every command's ``--json`` output checked against what was
sent, the table output smoke-checked, and bad input answered with a clear error and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from broker.client import Admin, Message, MessageQueue, Producer, PullConsumer
from broker.remoting.loop import run
from cli.main import app
from tests.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "AdminCliTopic"
GROUP = "cg_admin_cli"
runner = CliRunner()


def admin(server, *args: str, as_json: bool = True):
    argv = ["admin", *args, "-n", server.namesrv_addr] + (["--json"] if as_json else [])
    return runner.invoke(app, argv)


def admin_json(server, *args: str):
    result = admin(server, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _route_queues(server, topic: str) -> int:
    async def go() -> int:
        async with Admin(server.namesrv_addr) as a:
            route = await a.topic_route(topic)
            return len(route.subscribe_queues(topic)) if route else 0

    return run(go())


@pytest.fixture(scope="module")
def sent(mqlake_server):
    """AdminCliTopic created through the CLI with 4 queues, then 12 messages sent (keys: own + a shared one)."""
    broker = mqlake_server.broker_addr
    created = admin_json(mqlake_server, "updateTopic", "-t", TOPIC, "-b", broker, "-r", "4", "-w", "4")
    assert created["brokers"] == [mqlake_server.broker_addr] and created["writeQueueNums"] == 4
    wait_until(lambda: _route_queues(mqlake_server, TOPIC) == 4, 20, what="route with 4 queues")

    async def go():
        async with Producer("pg_admin_cli", mqlake_server.namesrv_addr) as p:
            msgs = [Message(TOPIC, f"msg-{i}", tags="T", keys=[f"key-{i}", "shared"]) for i in range(12)]
            results = [await p.send(m) for m in msgs]
        async with PullConsumer(GROUP, mqlake_server.namesrv_addr) as c:
            # the group has read 2 messages of queue 0
            await c.update_offset(MessageQueue(TOPIC, "broker-a", 0), 2)
        return results

    results = run(go())

    def dispatched() -> bool:
        rows = admin_json(mqlake_server, "topicStatus", "-t", TOPIC)
        return sum(r["maxOffset"] for r in rows) == 12

    wait_until(dispatched, 20, what="12 messages dispatched")
    return results


def test_topic_list_and_status(mqlake_server, sent):
    assert TOPIC in admin_json(mqlake_server, "topicList")
    rows = admin_json(mqlake_server, "topicStatus", "-t", TOPIC)
    assert [r["queueId"] for r in rows] == [0, 1, 2, 3]
    per_queue = {q: sum(1 for r in sent if r.queue.queue_id == q) for q in range(4)}
    for r in rows:
        assert (r["minOffset"], r["maxOffset"]) == (0, per_queue[r["queueId"]])
        assert r["lastUpdateTimestamp"] > 0 if per_queue[r["queueId"]] else r["lastUpdateTimestamp"] == 0


def test_query_by_key_and_by_both_kinds_of_id(mqlake_server, sent):
    found = admin_json(mqlake_server, "queryMsgByKey", "-t", TOPIC, "-k", "key-5")
    assert [(m["body"], m["msgId"], m["offsetMsgId"]) for m in found] == [
        ("msg-5", sent[5].msg_id, sent[5].offset_msg_id)
    ]
    shared = admin_json(mqlake_server, "queryMsgByKey", "-t", TOPIC, "-k", "shared")
    assert sorted(m["body"] for m in shared) == sorted(f"msg-{i}" for i in range(12))
    assert admin_json(mqlake_server, "queryMsgByKey", "-t", TOPIC, "-k", "no-such-key") == []

    [by_offset_id] = admin_json(mqlake_server, "queryMsgById", "-i", sent[7].offset_msg_id)
    assert by_offset_id["body"] == "msg-7" and by_offset_id["keys"] == "key-7 shared"
    assert by_offset_id["queueOffset"] == sent[7].queue_offset and by_offset_id["brokerName"] == "broker-a"
    [by_uniq] = admin_json(mqlake_server, "queryMsgById", "-i", sent[3].msg_id, "-t", TOPIC)
    assert by_uniq["body"] == "msg-3" and by_uniq["offsetMsgId"] == sent[3].offset_msg_id
    [by_uniq_any_topic] = admin_json(mqlake_server, "queryMsgById", "-i", sent[4].msg_id)
    assert by_uniq_any_topic["body"] == "msg-4"


def test_consumer_progress(mqlake_server, sent):
    progress = admin_json(mqlake_server, "consumerProgress", "-g", GROUP)
    q0 = sum(1 for r in sent if r.queue.queue_id == 0)
    [row] = [r for r in progress["queues"] if r["topic"] == TOPIC and r["queueId"] == 0]
    assert (row["brokerOffset"], row["consumerOffset"], row["lag"]) == (q0, 2, q0 - 2)
    assert progress["diffTotal"] == sum(r["lag"] for r in progress["queues"]) >= q0 - 2


def test_cluster_list(mqlake_server):
    [broker] = [b for b in admin_json(mqlake_server, "clusterList") if b["addr"] == mqlake_server.broker_addr]
    assert (broker["cluster"], broker["brokerName"], broker["brokerId"]) == ("DefaultCluster", "broker-a", 0)
    assert broker["runtime"]  # GET_BROKER_RUNTIME_INFO answered


def test_tables_render(mqlake_server, sent):
    for args, expect in (
        (("topicList",), TOPIC),
        (("topicStatus", "-t", TOPIC), "#Max Offset"),
        (("queryMsgByKey", "-t", TOPIC, "-k", "key-1"), sent[1].msg_id),
        (("queryMsgById", "-i", sent[2].offset_msg_id), "msg-2"),
        (("consumerProgress", "-g", GROUP), "Diff Total"),
        (("clusterList",), mqlake_server.broker_addr),
    ):
        result = admin(mqlake_server, *args, as_json=False)
        assert result.exit_code == 0 and expect in result.stdout, (args, result.output)


def test_errors_are_clear(mqlake_server):
    missing = admin(mqlake_server, "topicStatus", "-t", "NoSuchAdminTopic")
    assert missing.exit_code == 1 and "NoSuchAdminTopic" in missing.output and "does not exist" in missing.output
    both = admin(mqlake_server, "updateTopic", "-t", "X1")
    assert both.exit_code == 2 and "exactly one of" in both.output
    bad_name = admin(mqlake_server, "updateTopic", "-t", "bad name", "-b", mqlake_server.broker_addr)
    assert bad_name.exit_code == 1 and "invalid topic" in bad_name.output
    no_id = admin(mqlake_server, "queryMsgById", "-i", "00" * 16, "-t", TOPIC)
    assert no_id.exit_code == 1 and "no message with id" in no_id.output
    unreachable = runner.invoke(app, ["admin", "topicList", "-n", "127.0.0.1:1", "--json"])
    assert unreachable.exit_code == 1 and "127.0.0.1:1" in unreachable.output


def test_console_script_and_namesrv_env(mqlake_server, sent):
    exe = os.path.join(os.path.dirname(sys.executable), "mqlake")
    env = {**os.environ, "NAMESRV_ADDR": mqlake_server.namesrv_addr}
    out = subprocess.run([exe, "admin", "topicList", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert TOPIC in json.loads(out.stdout)


def test_update_topic_on_every_master_of_a_cluster(mqlake_server):
    created = admin_json(mqlake_server, "updateTopic", "-t", "AdminCliClusterTopic", "-c", "DefaultCluster", "-w", "2",
                         "-r", "2")  # fmt: skip
    assert created["brokers"] == [mqlake_server.broker_addr]
    wait_until(lambda: _route_queues(mqlake_server, "AdminCliClusterTopic") == 2, 20, what="route with 2 queues")
    unknown = admin(mqlake_server, "updateTopic", "-t", "AdminCliClusterTopic", "-c", "NoSuchCluster")
    assert unknown.exit_code == 1 and "NoSuchCluster" in unknown.output and "DefaultCluster" in unknown.output


def test_piped_output_prints_long_topic_names_keys_and_ids_whole(mqlake_server):
    """Run as in a pipe or a log (stdout not a terminal, COLUMNS narrow): every value whole, each row one line."""
    exe = os.path.join(os.path.dirname(sys.executable), "mqlake")
    env = {**os.environ, "NAMESRV_ADDR": mqlake_server.namesrv_addr, "COLUMNS": "50"}
    topic = "AdminPiped" + "T" * 110  # 120 characters (a topic may have 127)
    key = "order-" + "k" * 100
    group = "cg_admin_piped_" + "g" * 80

    def mqlake(*args: str) -> list[str]:
        out = subprocess.run([exe, "admin", *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "…" not in out.stdout
        return out.stdout.splitlines()

    created = mqlake("updateTopic", "-t", topic, "-b", mqlake_server.broker_addr, "-r", "2", "-w", "2")
    assert f"TopicConfig [topicName={topic}, readQueueNums=2, writeQueueNums=2, perm=6]" in created
    wait_until(lambda: _route_queues(mqlake_server, topic) == 2, 20, what="route with 2 queues")

    async def go():
        async with Producer("pg_admin_piped", mqlake_server.namesrv_addr) as p:
            result = await p.send(Message(topic, "piped", keys=key), queue=MessageQueue(topic, "broker-a", 1))
        async with PullConsumer(group, mqlake_server.namesrv_addr) as c:
            await c.update_offset(MessageQueue(topic, "broker-a", 1), 0)
        return result

    sent = run(go())
    wait_until(lambda: admin_json(mqlake_server, "queryMsgByKey", "-t", topic, "-k", key), 20, what="key indexed")

    [row] = [line for line in mqlake("queryMsgByKey", "-t", topic, "-k", key) if key in line]
    assert sent.msg_id in row and sent.offset_msg_id in row and "piped" in row
    # mqadmin's plain columns, whitespace-separated, as awk reads them
    rows = [line.split()[:6] for line in mqlake("consumerProgress", "-g", group) if topic in line]
    assert [topic, "broker-a", "1", "1", "0", "1"] in rows  # topic, broker, queue, broker/consumer offset, lag
