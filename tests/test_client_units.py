"""The Python client's pure parts: queue allocation, route parsing (both JSON dialects), message decoding,
subscription expressions, fastjson object-keyed maps and the admin tables.  No network."""

from __future__ import annotations

import itertools
import re

import pytest
from rich.console import Console

from broker.client import instance
from broker.client.admin import QueueProgress, QueueStatus
from broker.client.allocate import allocate_averagely
from broker.client.errors import MessageError
from broker.client.message import Message, MessageExt, MessageModel, MessageQueue, decode_messages
from broker.client.pull_consumer import Subscription
from broker.client.push_consumer import PushConsumer
from broker.client.route import RouteError, parse_route
from broker.remoting.protocol.body import ConsumeStats, TopicStatsTable
from broker.remoting.protocol.heartbeat import HeartbeatData
from broker.remoting.protocol.wire import BodyError
from cli.admin import consumer_progress_table, messages_table, topic_status_table
from store.errors import MQLakeError
from store.format import hashing, msgid, records
from tests.helpers import make_message

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n_queues,n_cids", list(itertools.product(range(0, 10), range(1, 6))))
def test_allocation_covers_every_queue_once(n_queues, n_cids):
    queues = [MessageQueue("T", "b", i) for i in range(n_queues)]
    cids = [f"10.0.0.{i}@{i}" for i in range(n_cids)]
    parts = [allocate_averagely(c, list(reversed(cids)), list(reversed(queues))) for c in cids]
    flat = [q for p in parts for q in p]
    assert sorted(flat) == queues  # each exactly once
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for p in parts:  # contiguous slices of the sorted queues, as AllocateMessageQueueAveragely gives
        ids = [q.queue_id for q in p]
        assert ids == list(range(ids[0], ids[0] + len(ids)) if ids else [])


def test_allocation_matches_java_examples():
    qs = [MessageQueue("T", "b", i) for i in range(8)]
    # 8 queues over 3 consumers: 3, 3, 2 — the first `8 % 3` consumers get one more
    assert [q.queue_id for q in allocate_averagely("a", ["c", "b", "a"], qs)] == [0, 1, 2]
    assert [q.queue_id for q in allocate_averagely("b", ["a", "b", "c"], qs)] == [3, 4, 5]
    assert [q.queue_id for q in allocate_averagely("c", ["a", "b", "c"], qs)] == [6, 7]
    assert allocate_averagely("z", ["a", "b"], qs) == []  # not yet known to the broker: nothing


OLD_ROUTE = (
    '{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},"brokerName":"b1","cluster":"C"},'
    '{"brokerAddrs":{1:"127.0.0.1:10931"},"brokerName":"b2","cluster":"C"}],"filterServerTable":{},'
    '"queueDatas":[{"brokerName":"b1","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":3},'
    '{"brokerName":"b2","perm":6,"readQueueNums":2,"topicSynFlag":0,"writeQueueNums":2}]}'
)


def test_route_both_dialects_parse_the_same():
    new = OLD_ROUTE.replace("{0:", '{"0":').replace(",1:", ',"1":').replace("{1:", '{"1":')
    new = new.replace("topicSynFlag", "topicSysFlag")
    a, b = parse_route(OLD_ROUTE.encode()), parse_route(new.encode())
    assert a.queue_datas == b.queue_datas and a.broker_datas == b.broker_datas
    assert a.master_addr("b1") == "127.0.0.1:10911"
    assert a.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
    # b2 has no master: not writable; readable queues come from both brokers, sorted
    assert a.publish_queues("T") == [MessageQueue("T", "b1", i) for i in range(3)]
    assert a.publish_queues("T", max_write_queues=2) == [MessageQueue("T", "b1", i) for i in range(2)]
    assert a.subscribe_queues("T") == [MessageQueue("T", "b1", i) for i in range(4)] + [
        MessageQueue("T", "b2", i) for i in range(2)
    ]


def test_route_rejects_garbage_with_a_clear_error():
    with pytest.raises(RouteError, match="malformed TopicRouteData"):
        parse_route(b'{"queueDatas":[{"perm":6}],"brokerDatas":[]}')
    with pytest.raises(ValueError, match="route"):
        parse_route(b"{not json")


def test_message_properties_as_the_java_client_sets_them():
    m = Message("T", "hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"})
    props = m.wire_properties("UNIQ")
    assert props == {"color": "red", "TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true", "UNIQ_KEY": "UNIQ"}
    with pytest.raises(MessageError, match="set by the client") as e:
        Message("T", b"x", properties={"TAGS": "x"}).wire_properties(None)
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, ValueError)
    with pytest.raises(MessageError, match="separators"):
        Message("T", b"x", properties={"a": "b\x01c"}).wire_properties(None)


def test_decode_messages_reads_raw_records_back_to_back():
    recs = [make_message("T", 1, f"body-{i}", tags="A", keys=f"k{i}", color="red") for i in range(3)]
    for i, r in enumerate(recs):
        r.queue_offset, r.physical_offset, r.store_host = i, 1000 * i, ("10.1.2.3", 10911)
    body = b"".join(records.encode_record(r) for r in recs)
    msgs = decode_messages(body, "b1")
    assert [m.body for m in msgs] == [b"body-0", b"body-1", b"body-2"]
    m = msgs[2]
    assert (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.broker_name) == ("T", 1, 2, 2000, "b1")
    assert m.tags == "A" and m.keys == "k2" and m.user_properties == {"color": "red"}
    assert m.msg_id == recs[2].uniq_key and m.offset_msg_id == msgid.create_offset_msg_id(("10.1.2.3", 10911), 2000)
    with pytest.raises(records.RecordError, match="pull body at offset"):
        decode_messages(body[:-3], source="pull body")


def test_message_ext_json_marks_binary_bodies():
    rec = make_message("T", 0, b"\xff\x00")
    rec.store_host = ("127.0.0.1", 1)
    j = MessageExt.from_record(records.decode_record(records.encode_record(rec))).to_json()
    assert j["bodyEncoding"] == "hex" and j["body"] == "ff00"


def test_subscription_expressions():
    s = Subscription.parse("T", "TagA || TagB")
    assert s.tags == {"TagA", "TagB"} and s.matches("TagB") and not s.matches("TagC") and not s.matches(None)
    j = s.to_json()
    assert j["tagsSet"] == ["TagA", "TagB"]
    assert j["codeSet"] == [hashing.java_string_hash("TagA"), hashing.java_string_hash("TagB")]
    assert Subscription.parse("T", "*").tags is None and Subscription.parse("T", None).matches(None)


@pytest.mark.parametrize("expression,tags_set,code_set", [
    (b"*", b"[]", b"[]"),  # FilterAPI.buildSubscriptionData leaves both sets empty for "*"
    (b"a || b", b'["a","b"]', b"[97,98]"),  # String.hashCode("a") = 97, "b" = 98
])  # fmt: skip
def test_our_push_consumers_heartbeat_is_what_a_java_client_sends(expression, tags_set, code_set, monkeypatch):
    monkeypatch.setattr(instance, "local_ip", lambda: "10.0.0.7")  # not the host's: no socket asks for it
    consumer = PushConsumer("cg", "127.0.0.1:9876", MessageModel.BROADCASTING)
    consumer.subscribe("T", expression.decode(), lambda msg: None)
    body = consumer.heartbeat_body()
    body = re.sub(rb'"subVersion":\d+', b'"subVersion":0', body)  # the subscription's time in ms
    assert body == (
        b'{"clientID":"' + consumer.client_id.encode() + b'","consumerDataSet":[{"consumeFromWhere":'
        b'"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"cg","messageModel":"BROADCASTING",'
        b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":' + code_set + b',"expressionType":"TAG",'
        b'"subString":"' + expression + b'","subVersion":0,"tagsSet":' + tags_set + b',"topic":"T"}],'
        b'"unitMode":false}],"producerDataSet":[]}'
    )
    # and the broker reads it back as the same subscription: "*" matches every message
    sub = HeartbeatData.decode(body).consumer_data_set[0].subscription_data_set[0]
    assert sub.tag_codes == (None if expression == b"*" else {97, 98})


def test_stats_bodies_keyed_by_queue_objects_decode_as_the_admin_reads_them():
    # fastjson writes a Map<MessageQueue, V> with the key objects themselves as keys, and Map<Integer, V> bare.
    text = (
        '{"consumeTps":0.0,"offsetTable":{{"brokerName":"b,{x}","queueId":0,"topic":"T"}:{"brokerOffset":5},'
        '{"brokerName":"b","queueId":1,"topic":"T"}:{"brokerOffset":7}},"other":{0:1}}'
    )
    stats = ConsumeStats.decode(text, "stats")
    keys = sorted((q.topic, q.broker_name, q.queue_id) for q in stats.offset_table)
    assert keys == [("T", "b", 1), ("T", "b,{x}", 0)]
    assert sorted(v.broker_offset for v in stats.offset_table.values()) == [5, 7]
    assert ConsumeStats.load_json(text, "stats")["other"] == {"0": 1}  # the JSON decode() reads

    table = TopicStatsTable.decode(
        '{"offsetTable":{{"brokerName":"b","queueId":2,"topic":"T"}:'
        '{"lastUpdateTimestamp":9,"maxOffset":7,"minOffset":1}}}', "topic stats")  # fmt: skip
    [(q, v)] = table.offset_table.items()
    assert (q.topic, q.broker_name, q.queue_id, v.min_offset, v.max_offset, v.last_update_timestamp) == (
        "T", "b", 2, 1, 7, 9)  # fmt: skip
    with pytest.raises(BodyError, match="topic stats"):
        TopicStatsTable.decode('{"offsetTable":{{"brokerName":"b","queueId":"x","topic":"T"}:{}}}', "topic stats")


def test_admin_tables_render():
    console = Console(width=200, record=True)
    console.print(topic_status_table([QueueStatus("T", "b1", 0, 0, 12, 1_700_000_000_000)]))
    console.print(consumer_progress_table([QueueProgress("T", "b1", 0, 12, 5, 0)]))
    rec = make_message("T", 0, "payload", tags="A", keys="K")
    rec.store_host = ("127.0.0.1", 1)
    console.print(messages_table([MessageExt.from_record(records.decode_record(records.encode_record(rec)))]))
    out = console.export_text()
    assert "b1" in out and "12" in out and "Diff Total: 7" in out and "payload" in out
