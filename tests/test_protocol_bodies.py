"""The JSON bodies as models (broker/remoting/protocol/): read as leniently as fastjson writes, written as fastjson
writes (fields sorted by name, nulls left out), and a body that does not fit named down to the field.  No network;
the topic and group managers load and persist through the same models."""

from __future__ import annotations

import json
import threading

import pytest

from broker.remoting.protocol.body import (
    ConsumeStats,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    SubscriptionGroupConfig,
)
from broker.remoting.protocol.fastjson import dumps_legacy, dumps_standard
from broker.remoting.protocol.heartbeat import HeartbeatData, SubscriptionData, expression_tag_codes
from broker.remoting.protocol.route import BrokerData, ClusterInfo, QueueData, RouteForm, TopicRouteData
from broker.remoting.protocol.topic import DataVersion, RegisterBrokerBody, TopicConfig
from broker.remoting.protocol.wire import BodyError
from broker.server.groups import SubscriptionGroupManager
from broker.server.topics import TableBody, TopicConfigManager
from store.config_files import ConfigFileError
from tests.aio import async_test

pytestmark = pytest.mark.unit

# Java's "TagA".hashCode() and "TagB".hashCode(), worked out by hand: ((84*31 + 97)*31 + 103)*31 + 65.
TAG_A, TAG_B = 2598919, 2598920


def test_topic_config_is_written_as_fastjson_writes_it():
    tc = TopicConfig(topic_name="Orders", read_queue_nums=4, write_queue_nums=4, order=True)
    assert tc.encode() == (b'{"order":true,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
                           b'"topicName":"Orders","topicSysFlag":0,"writeQueueNums":4}')  # fmt: skip
    assert TopicConfig.decode(tc.encode()) == tc
    assert tc.encode_line() == "Orders 4 4 6 SINGLE_TAG"
    assert TopicConfig.decode_line('Ro 2 2 4 SINGLE_TAG {"+message.type":"NORMAL"}').read_queue_nums == 2


def test_register_body_of_an_old_broker_and_entries_named_by_their_key():
    # Brokers before 3.0.11 sent the wrapper itself; an entry may leave topicName out; nulls keep the defaults.
    body = RegisterBrokerBody.decode(
        b'{"dataVersion":{"counter":{"value":3},"timestamp":5},"topicConfigTable":{"A":{"perm":4,"order":null}}}'
    )
    wrapper = body.topic_config_serialize_wrapper
    assert wrapper.data_version.same_as(DataVersion(counter=3, timestamp=5))
    assert not wrapper.data_version.same_as(DataVersion(counter=3, timestamp=5, state_version=1))
    assert wrapper.topics() == {"A": TopicConfig(topic_name="A", perm=4)}
    assert body.filter_server_list == []


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":"x"}}}}',
         "topicConfigSerializeWrapper.topicConfigTable['T'].readQueueNums: "),
        (b'{"filterServerList":{"a":1}}', "filterServerList: "),
        (b"[1, 2]", "RegisterBrokerBody: Input should be"),
        (b"{not json", "RegisterBrokerBody is not JSON"),
        (b"  ", "RegisterBrokerBody is empty"),
    ],
)  # fmt: skip
def test_a_body_that_does_not_fit_is_named_down_to_the_field(body: bytes, where: str):
    with pytest.raises(BodyError) as e:
        RegisterBrokerBody.decode(body)
    assert where in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_body_in_any_buffer_decodes_and_a_bad_one_is_a_body_error():
    # the remoting layer may hand a body over as a memoryview of the frame
    good = b'{"filterServerList":["a"]}'
    for buf in (good, bytearray(good), memoryview(b"xx" + good)[2:]):
        assert RegisterBrokerBody.decode(buf).filter_server_list == ["a"]
    for bad, where in ((b"\xff{}", "RegisterBrokerBody is not JSON: 'utf-8' codec"),
                       (b"{not json", "RegisterBrokerBody is not JSON"), (b" ", "RegisterBrokerBody is empty")):
        for buf in (memoryview(bad), bytearray(bad)):
            with pytest.raises(BodyError, match=where):
                RegisterBrokerBody.decode(buf)


def test_heartbeat_from_the_cpp_client_enum_ordinals_and_bare_expressions():
    hb = HeartbeatData.decode(json.dumps({
        "clientID": "10.0.0.1@1", "producerDataSet": [{"groupName": "pg"}, {"groupName": None}],
        "consumerDataSet": [{
            "groupName": "cg", "consumeType": 0, "messageModel": 0, "consumeFromWhere": 4, "unitMode": None,
            "subscriptionDataSet": [
                {"topic": "T", "subString": " TagA || TagB ", "tagsSet": [], "codeSet": None, "subVersion": 7},
                {"topic": "U", "subString": "TagA", "tagsSet": ["TagA"]},  # tags without their codes
                {"topic": "V", "subString": "*"},
            ],
        }],
    }))  # fmt: skip
    c = hb.consumer_data_set[0]
    assert (c.consume_type, c.message_model, c.consume_from_where) == (
        "CONSUME_ACTIVELY", "BROADCASTING", "CONSUME_FROM_FIRST_OFFSET")  # fmt: skip
    t, u, v = c.subscription_data_set
    assert (t.sub_string, t.tags_set, t.code_set) == ("TagA || TagB", ["TagA", "TagB"], {TAG_A, TAG_B})
    assert t.sub_version == 7
    assert u.tag_codes == {TAG_A} and v.tag_codes is None
    assert [p.group_name for p in hb.producer_data_set] == ["pg", ""]
    # Java clients write the names; an unknown name is kept as given.
    assert HeartbeatData.decode(b'{"clientID":"x","consumerDataSet":[{"groupName":"g","consumeType":"CONSUME_POP"}]}'
                                ).consumer_data_set[0].consume_type == "CONSUME_POP"  # fmt: skip
    # Anything else -- empty, null, an ordinal out of range, another type -- is the field's default.
    for bad in ("", None, 9, -1, True, []):
        consumer = {"groupName": "g", "consumeType": bad, "messageModel": bad, "consumeFromWhere": bad}
        c = HeartbeatData.decode(json.dumps({"clientID": "x", "consumerDataSet": [consumer]})).consumer_data_set[0]
        assert (c.consume_type, c.message_model, c.consume_from_where) == (
            "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET"), bad  # fmt: skip
    with pytest.raises(BodyError, match=r"consumerDataSet\[0\]\.groupName: Field required"):
        HeartbeatData.decode(b'{"clientID":"x","consumerDataSet":[{"consumeType":1}]}')
    with pytest.raises(BodyError, match="clientID"):
        HeartbeatData.decode(b'{"clientID":"","consumerDataSet":[]}')


def test_a_pulls_own_expression_matches_as_the_registered_subscription_does():
    for expr in (None, "", "*", " TagA ", "TagA || TagB", "||"):
        assert expression_tag_codes(expr) == SubscriptionData.from_expression("T", expr).tag_codes, expr
    assert expression_tag_codes("TagA||TagB") == {TAG_A, TAG_B}
    assert SubscriptionData.from_expression("T", "TagB || TagA").encode() == (
        b'{"classFilterMode":false,"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagB || TagA",'
        b'"subVersion":0,"tagsSet":["TagB","TagA"],"topic":"T"}')  # fmt: skip


def test_queue_keyed_stats_are_written_with_object_keys_and_read_back():
    stats = ConsumeStats()
    stats.offset_table[MessageQueue(topic="T", broker_name="b,{x}", queue_id=1)] = OffsetWrapper(
        broker_offset=5, consumer_offset=2, last_timestamp=9)  # fmt: skip
    text = stats.encode()
    assert text == (b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"b,{x}","queueId":1,"topic":"T"}:'
                    b'{"brokerOffset":5,"consumerOffset":2,"lastTimestamp":9}}}')  # fmt: skip
    assert ConsumeStats.decode(text) == stats


def test_lock_bodies_use_javas_field_names():
    req = LockBatchRequestBody.decode(
        b'{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":"3"}]}'
    )
    assert [mq.key for mq in req.mq_set] == [("T", "b", 3)] and req.only_this_broker is False
    resp = LockBatchResponseBody(lock_ok_mq_set=[MessageQueue.of(("T", "b", 3))])
    assert resp.encode() == b'{"lockOKMQSet":[{"brokerName":"b","queueId":3,"topic":"T"}]}'


def test_broker_addresses_keep_integer_ids_for_either_dialect():
    info = ClusterInfo.decode('{"brokerAddrTable":{"b":{"brokerName":"b","cluster":"C","brokerAddrs":{1:"s",0:"m"}}},'
                              '"clusterAddrTable":{"C":["b"]}}')  # fmt: skip
    assert info.broker_addr_table["b"].broker_addrs == {0: "m", 1: "s"}
    assert info.master_addrs("C") == ["m"] and info.master_addrs("Other") == []
    b = BrokerData(cluster="C", broker_name="b", broker_addrs={1: "s", 0: "m"})
    assert dumps_standard(b.to_json()) == (
        b'{"brokerAddrs":{"0":"m","1":"s"},"brokerName":"b","cluster":"C","enableActingMaster":false}')
    assert dumps_legacy(b.to_json()).startswith(b'{"brokerAddrs":{0:"m",1:"s"}')


def test_a_route_is_written_with_the_fields_of_the_version_it_imitates_and_read_in_either():
    route = TopicRouteData(
        queue_datas=[QueueData(broker_name="b", read_queue_nums=2, write_queue_nums=2, perm=6, topic_sys_flag=1)],
        broker_datas=[BrokerData(cluster="C", broker_name="b", broker_addrs={0: "m"})],
    )
    v5, v49, v48 = route.to_json(), route.to_json(RouteForm.V4_9), route.to_json(RouteForm.V4_8)
    assert v5["queueDatas"][0]["topicSysFlag"] == 1 and "topicSynFlag" not in v5["queueDatas"][0]
    assert v5["brokerDatas"][0]["enableActingMaster"] is False
    assert v49["queueDatas"][0]["topicSysFlag"] == 1 and "topicSynFlag" not in v49["queueDatas"][0]
    assert "enableActingMaster" not in v49["brokerDatas"][0]
    assert v48["queueDatas"][0]["topicSynFlag"] == 1 and "topicSysFlag" not in v48["queueDatas"][0]
    assert "enableActingMaster" not in v48["brokerDatas"][0]
    bodies = [route.encode_as(form) for form in RouteForm]
    assert [b'"0":"m"' in b for b in bodies] == [form is RouteForm.V5 for form in RouteForm]
    assert bodies[-1] == dumps_standard(v5) and bodies[0] == dumps_legacy(v48)
    assert all(TopicRouteData.decode(b) == route for b in bodies)


def test_a_clients_version_picks_its_generations_route_form():
    # MQVersion ordinals: V4_0_0 213, V4_8_9 391, V4_9_0 393, V4_9_3 399, V4_9_4_SNAPSHOT 400, V4_9_4 401
    assert [RouteForm.for_client(v) for v in (0, 213, 391, 393, 399, 400, 401, 413)] == (
        [RouteForm.V4_8] * 3 + [RouteForm.V4_9] * 3 + [RouteForm.V5] * 2)
    assert RouteForm.for_client(213, accept_standard_json_only=True) is RouteForm.V5
    assert RouteForm.for_client(399, accept_standard_json_only=True) is RouteForm.V5


def test_a_new_subscription_group_has_rocketmqs_defaults():
    # RocketMQ 4.9.8 SubscriptionGroupConfig's field initialisers (brokerId: MixAll.MASTER_ID)
    assert SubscriptionGroupConfig(group_name="g").encode() == (
        b'{"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,"consumeFromMinEnable":true,'
        b'"groupName":"g","notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,"retryQueueNums":1,'
        b'"whichBrokerWhenConsumeSlowly":1}')  # fmt: skip


def test_subscription_group_fields_of_other_versions_are_kept(tmp_path):
    cfg = SubscriptionGroupConfig.from_json({"groupName": "g", "retryMaxTimes": 3, "groupRetryPolicy": {"type": "X"}})
    assert cfg.retry_max_times == 3 and cfg.consume_enable is True
    out = cfg.to_json()
    assert list(out) == sorted(out) and out["groupRetryPolicy"] == {"type": "X"}

    (tmp_path / "subscriptionGroup.json").write_text(json.dumps({
        "dataVersion": {"counter": 4, "timestamp": 1}, "subscriptionGroupTable": {"g": {"groupRetryPolicy": 1}},
    }))  # fmt: skip
    groups = SubscriptionGroupManager(tmp_path)
    groups.load()  # adds the system groups: a change, persisted at once (no on_change set)
    on_disk = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert on_disk["dataVersion"]["counter"] == 5
    assert on_disk["subscriptionGroupTable"]["g"]["groupRetryPolicy"] == 1
    assert on_disk["subscriptionGroupTable"]["g"]["groupName"] == "g"  # named by its key
    assert "TOOLS_CONSUMER" in on_disk["subscriptionGroupTable"]


def test_a_topic_entry_that_does_not_fit_stops_the_load_naming_file_and_field(tmp_path):
    (tmp_path / "topics.json").write_text(json.dumps({
        "dataVersion": {"counter": 1, "timestamp": 1}, "topicConfigTable": {"T": {"topicName": "T", "perm": "rw"}},
    }))  # fmt: skip
    topics = TopicConfigManager(tmp_path, cluster_name="C", broker_name="b", auto_create_topic_enable=True,
                                default_topic_queue_nums=8)  # fmt: skip
    with pytest.raises(ConfigFileError, match=r"topics\.json: topic config 'T': perm: Input should be a valid integer"):
        topics.load()


@async_test
async def test_the_topic_table_body_is_encoded_off_the_loop_once_per_data_version(tmp_path):
    topics = TopicConfigManager(tmp_path, cluster_name="C", broker_name="b", auto_create_topic_enable=True,
                                default_topic_queue_nums=8)  # fmt: skip
    topics.load()
    threads = []

    def register_body(wrapper):
        threads.append(threading.current_thread())
        return RegisterBrokerBody(topic_config_serialize_wrapper=wrapper)

    body = TableBody(topics, register_body)
    first = await body.encode()
    assert first == RegisterBrokerBody(topic_config_serialize_wrapper=topics.wrapper()).encode()
    assert threads and threading.main_thread() not in threads  # the loop runs on the main thread
    assert await body.encode() == first and len(threads) == 1  # unchanged table: the same bytes, not re-encoded

    topics.update(TopicConfig(topic_name="Orders", read_queue_nums=2, write_queue_nums=2))
    second = await body.encode()
    assert len(threads) == 2 and b'"Orders":{' in second and b'"Orders":{' not in first
    assert second == RegisterBrokerBody(topic_config_serialize_wrapper=topics.wrapper()).encode()
