"""Apache RocketMQ's 4.9.8 Java clients against mqlake: the programs of tests/java/clients4, compiled once per test
session against the ``rocketmq-4`` jars, run with ``key=value`` arguments, each printing one JSON document; and
what every message they send looks like (``Common.message`` in Java), so a test checks each one it gets back."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from tests.fixtures_broker import remoting_call
from tests.peers import JAVA_SOURCES, compile_java, java_json

PEER = "rocketmq-4"
SOURCES = JAVA_SOURCES / "clients4"


@pytest.fixture(scope="session")
def clients4(tmp_path_factory) -> Path:
    """The compiled programs (the class directory); compiled once per session, whichever module asks first."""
    return compile_java(sorted(SOURCES.glob("*.java")), PEER, tmp_path_factory.getbasetemp() / "java-classes")


def run(program: str, classes: Path, home: Path, **args: object) -> dict:
    """``clients4.<program>`` with ``key=value`` arguments; its JSON document."""
    return java_json(f"clients4.{program}", PEER, *(f"{k}={v}" for k, v in args.items()), classes=classes,
                     home=home)  # fmt: skip


def expected(body: str) -> dict[str, object]:
    """The message of body ``<mode>-<i>`` as ``Common.message`` builds it: tags, keys and user properties."""
    mode, i = body.rsplit("-", 1)[0], int(body.rsplit("-", 1)[1])
    return {"body": f"{mode}-{i}", "tags": f"Tag{i % 3}", "keys": f"k-{mode}-{i}",
            "properties": {"idx": str(i), "mode": mode}}  # fmt: skip


def check_received(got: dict, sent: dict, topic: str) -> None:
    """A message a Java consumer got is the one the Java producer sent: body, tags, keys, user properties, the
    broker's CLUSTER, the msgId (UNIQ_KEY) and the queue and offset the send was acknowledged with."""
    want = expected(got["body"])
    assert got["topic"] == topic
    assert (got["body"], got["tags"], got["keys"]) == (want["body"], want["tags"], want["keys"])
    assert got["properties"].items() >= {**want["properties"], "CLUSTER": "DefaultCluster"}.items(), got
    assert got["msgId"] == sent["msgId"] == got["properties"]["UNIQ_KEY"]
    assert (got["queueId"], got["queueOffset"]) == (sent["queueId"], sent["queueOffset"])


def committed_offset(broker_addr: str, group: str, topic: str, queue_id: int) -> int:
    """The consumer offset the broker holds for ``group`` (-1 for none)."""
    q = h.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                           set_zero_if_not_found=False)  # fmt: skip
    r = remoting_call(broker_addr, RequestCode.QUERY_CONSUMER_OFFSET, q)
    return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1
