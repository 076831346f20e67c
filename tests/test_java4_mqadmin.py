"""Apache RocketMQ's own mqadmin (``MQAdminStartup`` from the 4.9.8 tools jar) against ``mqlake up``: each command's
printed values checked against what the broker holds (clusterList, topicList, updateTopic, topicStatus,
consumerProgress, queryMsgById, queryMsgByKey, resetOffsetByTime, brokerStatus).

The commands of one step run in one JVM (tests/java/clients4/Admin.java); a Java producer and push consumer
(Push.java) put the messages and the committed offsets the commands report on."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.clients4 import clients4, committed_offset, expected, run
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.peers import _LOGBACK, java_json

pytestmark = pytest.mark.integration
__all__ = ["clients4"]  # the fixture, used by name

TOPIC, GROUP, N = "J4AdminTopic", "J4AdminGroup", 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = MqlakeServer(tmp_path_factory.mktemp("mqlake-mqadmin")).start()
    yield s
    stop_servers([s])


def mqadmin(classes: Path, home: Path, *commands: list[str]) -> list[str]:
    """What each command printed, in order (one JVM; ROCKETMQ_HOME is ``home``, with mqadmin's logback file; the
    program's one argument is the JSON list of command lines)."""
    (home / "conf").mkdir(parents=True, exist_ok=True)
    (home / "conf" / "logback_tools.xml").write_text(_LOGBACK.format(log=home / "tools.log"))
    doc = java_json("clients4.Admin", "rocketmq-4", json.dumps([list(c) for c in commands]), classes=classes,
                    home=home)  # fmt: skip
    failed = [(r["command"][0], r["errors"]) for r in doc["runs"] if r["errors"]]
    assert not failed, failed  # a command that fails prints its exception on stderr
    return [r["output"] for r in doc["runs"]]


def rows(output: str) -> list[list[str]]:
    """A printed table's rows (after its '#' header line), split on runs of spaces."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    return [cells for cells in lines if not cells[0].startswith("#")]


def test_mqadmin_commands_report_what_mqlake_holds(server, clients4, tmp_path) -> None:
    home, ns = tmp_path / "home", server.namesrv_addr
    (created,) = mqadmin(clients4, home, ["updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", TOPIC, "-r", "4",
                                          "-w", "4"])  # fmt: skip
    assert f"create topic to {server.broker_addr} success." in created
    assert f"TopicConfig [topicName={TOPIC}, readQueueNums=4, writeQueueNums=4, perm=RW-" in created

    before = int(time.time() * 1000)
    doc = run("Push", clients4, home, namesrv=ns, topic=TOPIC, group=GROUP, mode="admin", n=N, expect=N)
    assert doc["caughtUp"]
    sent = {s["body"]: s for s in doc["sent"]}
    per_queue = {q: sum(1 for s in doc["sent"] if s["queueId"] == q) for q in range(4)}
    first = sent["admin-0"]

    out = dict(zip(
        ("clusterList", "topicList", "topicStatus", "consumerProgress", "queryMsgById", "queryMsgByKey",
         "brokerStatus", "resetOffsetByTime", "progressAfterReset"),
        mqadmin(clients4, home, ["clusterList", "-n", ns], ["topicList", "-n", ns],
                ["topicStatus", "-n", ns, "-t", TOPIC],
                ["consumerProgress", "-n", ns, "-g", GROUP], ["queryMsgById", "-n", ns, "-i", first["offsetMsgId"]],
                ["queryMsgByKey", "-n", ns, "-t", TOPIC, "-k", expected("admin-0")["keys"]],
                ["brokerStatus", "-n", ns, "-b", server.broker_addr],
                ["resetOffsetByTime", "-n", ns, "-g", GROUP, "-t", TOPIC, "-s", str(before)],
                ["consumerProgress", "-n", ns, "-g", GROUP]),
        strict=True,
    ))  # fmt: skip

    # clusterList: the cluster, its one master, the version it reports, the load columns filled
    (broker,) = rows(out["clusterList"])
    assert broker[:5] == ["DefaultCluster", "broker-a", "0", server.broker_addr, "V4_9_8"]
    assert "null" not in out["clusterList"], out["clusterList"]
    # topicList: the topic made above and the retry topic of the consumer's group
    topics = out["topicList"].split()
    assert TOPIC in topics and f"%RETRY%{GROUP}" in topics
    # topicStatus: the four queues, each from 0 to what was sent to it
    status = {int(r[1]): r for r in rows(out["topicStatus"])}
    assert {q: (r[0], int(r[2]), int(r[3])) for q, r in status.items()} == {
        q: ("broker-a", 0, per_queue[q]) for q in range(4)}
    # consumerProgress: every queue consumed to its end
    progress = [r for r in rows(out["consumerProgress"]) if r[0] == TOPIC]
    assert sorted((int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in progress) == [
        (q, per_queue[q], per_queue[q], 0) for q in range(4)]
    assert "Diff Total: 0" in out["consumerProgress"]
    # queryMsgById: the message the offset id names, field by field
    fields = dict(re.findall(r"^([A-Za-z ]+):\s+(.*)$", out["queryMsgById"], re.M))
    want = expected("admin-0")
    assert (fields["OffsetID"], fields["Topic"], fields["Tags"], fields["Keys"]) == (
        first["offsetMsgId"], TOPIC, f"[{want['tags']}]", f"[{want['keys']}]")
    assert (int(fields["Queue ID"]), int(fields["Queue Offset"])) == (first["queueId"], first["queueOffset"])
    assert f"UNIQ_KEY={first['msgId']}" in fields["Properties"] and "idx=0" in fields["Properties"]
    # queryMsgByKey: the one message with that key, by its msgId, queue and offset
    assert rows(out["queryMsgByKey"]) == [[first["msgId"], str(first["queueId"]), str(first["queueOffset"])]]
    # brokerStatus: the broker's figures under Java's names
    stats = dict(re.findall(r"^(\w+)\s+:\s?(.*)$", out["brokerStatus"], re.M))
    assert stats["brokerVersionDesc"] == "V4_9_8" and stats["brokerRole"] == "ASYNC_MASTER"
    assert int(stats["msgPutTotalTodayNow"]) >= N and int(stats["commitLogMaxOffset"]) > 0
    assert before - 1000 <= int(stats["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    # resetOffsetByTime: to a time before the sends, so every queue goes back to 0, on the broker too
    reset = rows(out["resetOffsetByTime"])
    assert sorted((r[0], int(r[1]), int(r[2])) for r in reset if r[0] == "broker-a") == [
        ("broker-a", q, 0) for q in range(4)]
    assert [committed_offset(server.broker_addr, GROUP, TOPIC, q) for q in range(4)] == [0, 0, 0, 0]
    after = [r for r in rows(out["progressAfterReset"]) if r[0] == TOPIC]
    assert sorted((int(r[2]), int(r[4])) for r in after) == [(q, 0) for q in range(4)]
