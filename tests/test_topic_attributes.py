"""RocketMQ 5's topic attributes (``broker.server.attributes``): the ``+k=v,-k`` form mqadmin sends, how a change
applies to a topic's attributes (``AttributeUtil.alterCurrentAttributes``' rules and messages), and the message type
a send's properties give (``TopicMessageType.parseFromMessageProperty``) against its topic's."""

from __future__ import annotations

import pytest

from broker.remoting.protocol.topic import TopicConfig, TopicConfigSerializeWrapper
from broker.server import attributes as attr

pytestmark = pytest.mark.unit


def test_parse_the_mqadmin_form() -> None:
    assert attr.parse("+message.type=FIFO,-reserve.time") == {"+message.type": "FIFO", "-reserve.time": ""}
    assert attr.parse("") == {} and attr.parse(None) == {}
    for bad, why in [("message.type=FIFO", "format is wrong"), ("+message.type", "format is wrong"),
                     ("+a=b=c", "format is wrong"), ("-a=b", "delete attribute format is wrong"),
                     ("+a=1,+a=2", r"key duplication: \+a")]:  # fmt: skip
        with pytest.raises(attr.AttributeError_, match=why):
            attr.parse(bad)


def test_alter_follows_rocketmq_5s_rules() -> None:
    created = attr.alter(True, {}, attr.parse("+message.type=FIFO"))
    assert created == {"message.type": "FIFO"}
    assert attr.alter(False, created, {}) == created  # an update without -a keeps the type
    assert attr.alter(False, created, attr.parse("+message.type=DELAY")) == {"message.type": "DELAY"}
    assert attr.alter(False, created, attr.parse("-message.type")) == {}
    refused = [
        (True, {}, "-message.type", "only add attribute is supported while creating topic. key: message.type"),
        (True, {}, "+no.such=1", "unsupported key: no.such"),
        (True, {}, "+message.type=BATCH", "value is not in set"),
        (False, {}, "-message.type", "attempt to delete a nonexistent key: message.type"),
        (False, {"queue.type": "SimpleCQ"}, "+queue.type=SimpleCQ", "unchangeable attribute. key: queue.type"),
        # valid in RocketMQ 5.4 but not done by mqlake: refused rather than claimed
        (True, {}, "+queue.type=BatchCQ", "queue.type=BatchCQ is not supported by this broker"),
        (True, {}, "+cleanup.policy=COMPACTION", "cleanup.policy=COMPACTION is not supported"),
        (True, {}, "+message.type=PRIORITY", "message.type=PRIORITY is not supported"),
        (True, {}, "+reserve.time=-2", r"value is not in range\(-1, "),
    ]
    for create, current, change, why in refused:
        with pytest.raises(attr.AttributeError_, match=why):
            attr.alter(create, current, attr.parse(change))
    assert attr.alter(True, {}, attr.parse("+queue.type=SimpleCQ,+cleanup.policy=DELETE")) == {
        "queue.type": "SimpleCQ", "cleanup.policy": "DELETE"}  # fmt: skip


def test_message_types_and_the_check() -> None:
    normal = {"KEYS": "k"}
    fifo = {"__SHARDINGKEY": "g1"}
    delay = {"TIMER_DELIVER_MS": "1"}
    level = {"DELAY": "3", "__SHARDINGKEY": "g1"}  # a delay wins over a message group
    half = {"TRAN_MSG": "true", "DELAY": "3"}  # a transaction wins over both
    assert [attr.message_type(p) for p in (normal, fifo, delay, level, half)] == [
        "NORMAL", "FIFO", "DELAY", "DELAY", "TRANSACTION"]  # fmt: skip
    assert attr.check("FIFO", fifo) is None and attr.check("MIXED", half) is None
    assert attr.check("FIFO", normal) == (
        "TopicMessageType validate failed, the expected type is FIFO, but actual type is NORMAL")
    assert attr.topic_type(None) == "NORMAL" and attr.topic_type({"message.type": "DELAY"}) == "DELAY"
    fifo_topic = TopicConfig(topic_name="F", attributes={"message.type": "FIFO"})
    assert attr.send_refusal("F", fifo_topic, normal) is not None
    assert attr.send_refusal("F", None, normal) is not None  # a missing topic has no type: UNSPECIFIED
    assert attr.send_refusal("%RETRY%g", fifo_topic, normal) is None  # retry and DLQ topics are not checked
    assert attr.send_refusal("F", fifo_topic, {**normal, "TRANSFER_FLAG": "true"}) is None


def test_topics_json_holds_attributes_as_rocketmq_5_writes_them() -> None:
    typed = TopicConfig(topic_name="F", attributes={"message.type": "FIFO"})
    plain = TopicConfig(topic_name="P", attributes={})
    assert typed.to_json()["attributes"] == {"message.type": "FIFO"}
    assert "attributes" not in plain.to_json()  # a 4.x-shaped entry stays as it was
    written = TopicConfigSerializeWrapper(topic_config_table={"F": typed, "P": plain}).encode()
    read = TopicConfigSerializeWrapper.decode(written).topic_config_table
    assert read["F"].attributes == {"message.type": "FIFO"} and read["P"].attributes is None
    # as RocketMQ 5.4 writes an entry (fastjson, every field)
    java = ('{"topicConfigTable":{"F":{"attributes":{"message.type":"FIFO"},"order":false,"perm":6,'
            '"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"F","topicSysFlag":0,"writeQueueNums":4}}}')
    assert TopicConfigSerializeWrapper.decode(java).topic_config_table["F"].attributes == {"message.type": "FIFO"}
