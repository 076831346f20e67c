"""RocketMQ 5's topic message types and subscription-group options set and read through the admin tools on a real
``mqlake up``: Apache RocketMQ's own mqadmin 5.4.0 (``MQAdminStartup`` on the pinned rocketmq-5 jars) and
``mqlake admin``.  mqadmin's ``updateTopic -a +message.type=...`` lands in topics.json as RocketMQ 5 writes it and
its ``exportMetadata`` reads it back; ``updateSubGroup -o/-r/-s/-m/-d`` likewise; a bad attribute is refused with
RocketMQ's message; with ``enableTopicMessageTypeCheck`` the official 5.x Python client's FIFO messages go to a FIFO
topic and its normal ones are refused before they are sent (the route names the topic's type)."""

from __future__ import annotations

import json
import uuid

import pytest

from tests import rmq5
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.peers import java
from tests.test_admin_cli import admin_json

pytestmark = pytest.mark.integration

MQADMIN = "org.apache.rocketmq.tools.command.MQAdminStartup"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("types")
    s = MqlakeServer(tmp / "up", enableProxy="true", enableTopicMessageTypeCheck="true")
    s.start()
    s.home = tmp / "home"
    yield s
    stop_servers([s])


def mqadmin(server, *args: str) -> str:
    """One mqadmin 5.4.0 command against the server; its output (it exits 0 even when the broker refused)."""
    out = java(MQADMIN, "rocketmq-5", *args, "-n", server.namesrv_addr, home=server.home)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def exported(server, what: str) -> dict:
    """mqadmin exportMetadata's file for ``what`` (-t: topics, -g: subscription groups)."""
    path = server.home / f"export-{uuid.uuid4().hex}"
    text = mqadmin(server, "exportMetadata", "-b", server.broker_addr, what, "-f", str(path))
    files = list(path.glob("*.json"))
    assert files, text
    return json.loads(files[0].read_text())


def topics_json(server) -> dict:
    return json.loads((server.store_dir / "config" / "topics.json").read_text())["topicConfigTable"]


def test_mqadmin_5_sets_and_reads_message_types(server) -> None:
    out = mqadmin(server, "updateTopic", "-b", server.broker_addr, "-t", "Orders", "-a", "+message.type=FIFO")
    assert "success" in out, out
    assert topics_json(server)["Orders"]["attributes"] == {"message.type": "FIFO"}
    table = exported(server, "-t")["topicConfigTable"]
    assert table["Orders"]["attributes"] == {"message.type": "FIFO"}

    out = mqadmin(server, "updateTopic", "-b", server.broker_addr, "-t", "Orders", "-a", "+message.type=DELAY")
    assert topics_json(server)["Orders"]["attributes"] == {"message.type": "DELAY"}, out
    for change, why in [("+message.type=BATCH", "value is not in set"), ("+no.such=1", "unsupported key: no.such"),
                        ("+message.type=MIXED", "MIXED message type is not supported.")]:  # fmt: skip
        out = mqadmin(server, "updateTopic", "-b", server.broker_addr, "-t", "Orders", "-a", change)
        assert why in out, out
    assert topics_json(server)["Orders"]["attributes"] == {"message.type": "DELAY"}


def test_mqadmin_5_sets_and_reads_subscription_group_options(server) -> None:
    out = mqadmin(server, "updateSubGroup", "-b", server.broker_addr, "-g", "OrderedGroup", "-o", "true", "-r", "5",
                  "-s", "false", "-m", "true", "-d", "true")  # fmt: skip
    assert "success" in out, out
    group = exported(server, "-g")["subscriptionGroupTable"]["OrderedGroup"]
    assert {k: group[k] for k in ("consumeMessageOrderly", "retryMaxTimes", "consumeEnable", "consumeFromMinEnable",
                                  "consumeBroadcastEnable")} == {
        "consumeMessageOrderly": True, "retryMaxTimes": 5, "consumeEnable": False, "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True}  # fmt: skip


def test_mqlake_admin_sets_what_mqadmin_reads(server) -> None:
    created = admin_json(server, "updateTopic", "-t", "Payments", "-b", server.broker_addr, "-r", "2", "-w", "2",
                         "-a", "+message.type=TRANSACTION")  # fmt: skip
    assert created["attributes"] == "+message.type=TRANSACTION"
    assert exported(server, "-t")["topicConfigTable"]["Payments"]["attributes"] == {"message.type": "TRANSACTION"}
    admin_json(server, "updateSubGroup", "-g", "Fifo5", "-b", server.broker_addr, "-o", "true", "-r", "2")
    group = exported(server, "-g")["subscriptionGroupTable"]["Fifo5"]
    assert (group["consumeMessageOrderly"], group["retryMaxTimes"]) == (True, 2)


def test_the_5x_client_sends_what_the_topic_takes(server) -> None:
    admin_json(server, "updateTopic", "-t", "Fifo5x", "-b", server.broker_addr, "-a", "+message.type=FIFO")
    home = server.home / "client"
    sent = rmq5.client("produce", server.grpc_endpoint, home, "--topic", "Fifo5x", "--group", "g1", "--count", "2")
    assert len(sent["sent"]) == 2
    refused = rmq5.client("produce", server.grpc_endpoint, home / "normal", "--topic", "Fifo5x", "--report-error")
    assert "sent" not in refused and "NORMAL" in refused["error"]["message"], refused
