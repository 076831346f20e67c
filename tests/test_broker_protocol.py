"""The broker's request processors over real loopback connections (an in-process BrokerController, a real
RemotingClient and raw sockets): send, pull, long polling, offsets, heartbeat, locks, admin, query, retry/DLQ,
robustness against bad bytes, and graceful shutdown."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from broker.remoting import batch_body
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server.clients import now_ms
from broker.server.queue_locks import RebalanceLockManager
from broker.server.send import SendProcessor
from store.checkpoint import abort_file
from store.config_files import ConfigFileError
from store.format import msgid, properties
from tests.helpers import wait_until
from tests.live_broker import SUB, LiveBroker, _new_client, records

SUSPEND = 0x2
COMMIT = 0x1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # one 1 s delay level: a retry (level 3 + reconsumeTimes, clamped to the highest) comes back after 1 s
    b = LiveBroker(tmp_path_factory.mktemp("broker") / "store", messageDelayLevel="1s").start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def arrival_broker(tmp_path_factory):
    """A broker whose parked pulls are answered only by a matching message's arrival, their suspend timeout or
    shutdown: the periodic re-check is pushed past every test, so it cannot stand in for the arrival path."""
    b = LiveBroker(tmp_path_factory.mktemp("arrival") / "store").start(pull_recheck_s=3600)
    yield b
    b.close()


# =====================================================================================================
# send and pull
# =====================================================================================================


@pytest.mark.integration
def test_send_v1_and_v2_then_pull_the_raw_records(broker: LiveBroker) -> None:
    r1 = broker.send("SendPull", b"one", queue_id=1, tags="A", keys="k1 k2", v2=False, color="red")
    r2 = broker.send("SendPull", b"two", queue_id=1, tags="B")
    for r, offset in ((r1, 0), (r2, 1)):
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["queueId"] == "1" and r.ext_fields["queueOffset"] == str(offset)
        assert r.ext_fields["MSG_REGION"] == "DefaultRegion" and r.ext_fields["TRACE_ON"] == "true"
        assert msgid.decode_offset_msg_id(r.ext_fields["msgId"])[0] == ("127.0.0.1", broker.controller.port)
    resp = broker.pull("SendPull", 1, 0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.ext_fields["nextBeginOffset"] == "2" and resp.ext_fields["maxOffset"] == "2"
    assert resp.ext_fields["minOffset"] == "0" and resp.ext_fields["suggestWhichBrokerId"] == "0"
    got = records(resp.body)
    assert [g.body for g in got] == [b"one", b"two"]
    assert got[0].tags == "A" and got[0].keys == "k1 k2" and got[0].property_map["color"] == "red"
    assert got[0].property_map["CLUSTER"] == "DefaultCluster"
    assert [g.queue_offset for g in got] == [0, 1]
    assert got[0].offset_msg_id == r1.ext_fields["msgId"]


@pytest.mark.integration
@pytest.mark.expected_errors("disk maybe full soon")
def test_a_full_disk_answers_sends_with_service_not_available(fresh_broker, monkeypatch) -> None:
    # The disk measurement is replaced (no test can fill the machine's disk); the store's own clean pass, on
    # its housekeeping thread, marks the disk full and writable again, as CleanCommitLogService does.
    used = {"ratio": 0.5}
    monkeypatch.setattr("store.message_store.disk_used_ratio", lambda _path: used["ratio"])
    b = fresh_broker(cleanResourceInterval="100")
    store = b.controller.store
    assert b.send("DiskFull", b"before").code == ResponseCode.SUCCESS
    used["ratio"] = 0.93
    wait_until(lambda: store.disk_full, 30, what="the clean pass to mark the disk full")
    resp = b.send("DiskFull", b"refused")
    assert resp.code == 14  # ResponseCode.SERVICE_NOT_AVAILABLE, as a Java broker answers on a full disk
    assert "the broker's disk is full [CL:  0.93 CQ:  0.93 INDEX:  0.93]" in resp.remark
    pulled = b.pull("DiskFull", 0, 0)  # reads go on
    assert pulled.code == ResponseCode.SUCCESS and [r.body for r in records(pulled.body)] == [b"before"]
    used["ratio"] = 0.6
    wait_until(lambda: not store.disk_full, 30, what="the clean pass to mark the disk writable")
    assert b.send("DiskFull", b"after").code == ResponseCode.SUCCESS
    assert [r.body for r in records(b.pull("DiskFull", 0, 0).body)] == [b"before", b"after"]


@pytest.mark.integration
@pytest.mark.parametrize("code", [RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_MESSAGE])
def test_send_batch_stores_each_message_with_its_own_properties(broker: LiveBroker, code: int) -> None:
    """Code 320 as Java clients send batches, or code 10 with ``batch=1`` as the C++ client does."""
    topic = f"Batch{int(code)}"
    gen = msgid.UniqKeyGenerator()
    ids = [gen.next() for _ in range(3)]
    items = [
        batch_body.BatchItem(
            0, f"b{i}".encode(), properties.encode_properties({"UNIQ_KEY": ids[i], "TAGS": "T", "KEYS": f"bk{i}"})
        )
        for i in range(3)
    ]
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=2,
        sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0, batch=True,
        properties=properties.encode_properties({"UNIQ_KEY": gen.next(), "WAIT": "true"}).decode(),
    )  # fmt: skip
    header = h.SendMessageRequestHeaderV2.from_v1(v1) if code == RequestCode.SEND_BATCH_MESSAGE else v1
    ext = {} if code == RequestCode.SEND_BATCH_MESSAGE else {"batch": "1"}  # the C++ client's boolean
    r = broker.call(code, header, batch_body.encode_batch_body(items), **ext)
    assert r.code == ResponseCode.SUCCESS, r.remark
    broker.dispatched()
    assert len(r.ext_fields["msgId"].split(",")) == 3 and r.ext_fields["queueOffset"] == "0"
    got = records(broker.pull(topic, 2, 0).body)
    assert [g.body for g in got] == [b"b0", b"b1", b"b2"]
    assert [g.uniq_key for g in got] == ids
    assert [g.keys for g in got] == ["bk0", "bk1", "bk2"]
    assert [g.queue_offset for g in got] == [0, 1, 2]


@pytest.mark.unit
def test_batch_body_codec_round_trip_and_errors() -> None:
    items = [
        batch_body.BatchItem(7, b"body-a", b"TAGS\x01A\x02"),
        batch_body.BatchItem(0, b"", b""),
        batch_body.BatchItem(1, b"z" * 300, b""),
    ]
    body = batch_body.encode_batch_body(items)
    assert batch_body.decode_batch_body(body) == items
    first = len(batch_body.encode_batch_body(items[:1]))
    with pytest.raises(ValueError, match=f"offset {first}"):
        batch_body.decode_batch_body(body[: first + 10])  # the second message cut short
    bad_size = bytearray(body)
    bad_size[3] += 1  # TOTALSIZE of the first message no longer matches its fields
    with pytest.raises(ValueError, match="offset 0: size"):
        batch_body.decode_batch_body(bytes(bad_size))


@pytest.mark.integration
def test_pull_filters_by_tags(broker: LiveBroker) -> None:
    for tag in ("A", "B", "A", "C"):
        assert broker.send("Tagged", tag.encode(), tags=tag).code == ResponseCode.SUCCESS
    assert [g.body for g in records(broker.pull("Tagged", 0, 0, "A").body)] == [b"A", b"A"]
    assert [g.body for g in records(broker.pull("Tagged", 0, 0, "A || C").body)] == [b"A", b"A", b"C"]
    none = broker.pull("Tagged", 0, 0, "Z")
    assert none.code == ResponseCode.PULL_RETRY_IMMEDIATELY and none.ext_fields["nextBeginOffset"] == "4"


@pytest.mark.integration
def test_pull_status_codes(broker: LiveBroker) -> None:
    broker.send("Codes", b"x")
    moved = broker.pull("Codes", 0, 5)
    assert moved.code == ResponseCode.PULL_OFFSET_MOVED and moved.ext_fields["nextBeginOffset"] == "1"
    assert broker.pull("Codes", 0, 1).code == ResponseCode.PULL_NOT_FOUND
    assert broker.pull("Codes", 3, 0).code == ResponseCode.PULL_NOT_FOUND  # a queue never written, from 0
    assert broker.pull("NoSuchTopic", 0, 0).code == ResponseCode.TOPIC_NOT_EXIST
    bad_queue = broker.pull("Codes", 99, 0)
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "99" in bad_queue.remark
    # Without the subscription flag the heartbeat's subscription is needed; there is none for this group.
    assert broker.pull("Codes", 0, 0, group="nobody", flags=0).code == ResponseCode.SUBSCRIPTION_NOT_EXIST


LONG_SUSPEND_MS = 60_000  # longer than any wait below: a pull answered within them was not answered by its timeout


def _park(b: LiveBroker, topic: str, offset: int, expr: str = "*", suspend_ms: int = LONG_SUSPEND_MS):
    """A suspended pull from ``offset`` on ``b``'s loop (its response future), once the broker has parked it."""
    before = b.controller.hold.parked_count
    fut = asyncio.run_coroutine_threadsafe(
        asyncio.to_thread(b.pull, topic, 0, offset, expr, "g", SUB | SUSPEND, suspend_ms, 0, suspend_ms / 1000 + 30),
        b.loop,
    )
    wait_until(lambda: fut.done() or b.controller.hold.parked_count > before, 10, what="the pull to park")
    assert not fut.done(), fut.result()  # nothing to read: it parked instead of answering
    return fut


@pytest.mark.integration
def test_long_poll_is_answered_when_a_message_arrives(arrival_broker: LiveBroker) -> None:
    b = arrival_broker
    b.send("Parked", b"first")
    fut = _park(b, "Parked", 1)
    b.send("Parked", b"second")
    # Answered long before its 60 s suspend ran out: only the message's arrival can have woken it.
    resp = fut.result(LONG_SUSPEND_MS / 1000 / 2)
    assert resp.code == ResponseCode.SUCCESS
    assert [g.body for g in records(resp.body)] == [b"second"]


@pytest.mark.integration
def test_long_poll_without_a_message_answers_not_found_after_the_timeout(arrival_broker: LiveBroker) -> None:
    b = arrival_broker
    b.send("ParkedEmpty", b"only")
    fut = _park(b, "ParkedEmpty", 1, suspend_ms=1200)
    # No message, no shutdown, no re-check: the suspend timeout is all that can answer it.
    resp = fut.result(30)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and resp.ext_fields["nextBeginOffset"] == "1"
    assert b.controller.hold.parked_count == 0  # the timed-out pull left the hold


@pytest.mark.integration
def test_long_poll_ignores_messages_with_other_tags(arrival_broker: LiveBroker) -> None:
    b = arrival_broker
    arrived: list[tuple[str, int]] = []

    def listener(topic: str, _q: int, end: int, _tags: tuple[int, ...], _ts: int) -> None:
        arrived.append((topic, end))

    b.controller.store.add_arrival_listener(listener)
    try:
        b.send("ParkedTags", b"a0", tags="A")
        fut = _park(b, "ParkedTags", 1, "A")
        b.send("ParkedTags", b"b1", tags="B")
        # The hold service heard of b1 before this listener did; one turn of the loop runs what it decided.
        wait_until(lambda: ("ParkedTags", 2) in arrived, 10, what="b1's arrival notification")
        b.run(asyncio.sleep(0))
        assert not fut.done() and b.controller.hold.parked_count == 1, "a message with another tag woke the pull"
        b.send("ParkedTags", b"a2", tags="A")
        resp = fut.result(LONG_SUSPEND_MS / 1000 / 2)  # woken by a2, past b1
        assert resp.code == ResponseCode.SUCCESS and [g.body for g in records(resp.body)] == [b"a2"]
    finally:
        b.controller.store.remove_arrival_listener(listener)  # the broker outlives this test


# =====================================================================================================
# offsets
# =====================================================================================================


@pytest.mark.integration
def test_consumer_offsets_and_queue_offsets(broker: LiveBroker) -> None:
    for i in range(3):
        broker.send("Offsets", f"m{i}".encode())
    q = h.QueryConsumerOffsetRequestHeader(consumer_group="og", topic="Offsets", queue_id=0)
    first = broker.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert first.code == ResponseCode.SUCCESS and first.ext_fields["offset"] == "0"  # hot data: from the start
    q_strict = h.QueryConsumerOffsetRequestHeader(consumer_group="og", topic="Offsets", queue_id=0,
                                                  set_zero_if_not_found=False)  # fmt: skip
    assert broker.call(RequestCode.QUERY_CONSUMER_OFFSET, q_strict).code == ResponseCode.QUERY_NOT_FOUND
    # The push consumer's periodic commit is oneway: no response, then the value is visible.
    upd = h.UpdateConsumerOffsetRequestHeader(consumer_group="og", topic="Offsets", queue_id=0, commit_offset=2)
    oneway = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, upd)
    broker.run(broker.client.invoke_oneway(broker.addr, oneway))
    wait_until(lambda: broker.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields.get("offset") == "2", 5,
               what="the oneway commit")  # fmt: skip
    # The pull's commit-offset flag commits too.
    broker.pull("Offsets", 0, 2, group="og", flags=SUB | COMMIT, commit_offset=3)
    assert broker.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "3"
    mx = broker.call(RequestCode.GET_MAX_OFFSET, h.GetMaxOffsetRequestHeader(topic="Offsets", queue_id=0))
    mn = broker.call(RequestCode.GET_MIN_OFFSET, h.GetMinOffsetRequestHeader(topic="Offsets", queue_id=0))
    assert (mx.ext_fields["offset"], mn.ext_fields["offset"]) == ("3", "0")
    earliest = broker.call(
        RequestCode.GET_EARLIEST_MSG_STORETIME, h.GetEarliestMsgStoretimeRequestHeader(topic="Offsets", queue_id=0)
    )
    ts = int(earliest.ext_fields["timestamp"])
    assert ts == records(broker.pull("Offsets", 0, 0).body)[0].store_timestamp
    search = broker.call(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, h.SearchOffsetRequestHeader(topic="Offsets", queue_id=0, timestamp=ts)
    )
    assert search.ext_fields["offset"] == "0"


# =====================================================================================================
# clients: heartbeat, membership notifications, locks
# =====================================================================================================


def _heartbeat(client_id: str, group: str, topic: str) -> bytes:
    # As the C++ client writes it: enums as ordinals.
    return json.dumps({
        "clientID": client_id,
        "producerDataSet": [{"groupName": "pg"}],
        "consumerDataSet": [{
            "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0, "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [],
                                     "subVersion": 1, "classFilterMode": False}],
        }],
    }).encode()  # fmt: skip


@pytest.mark.integration
def test_heartbeat_registers_consumers_and_notifies_membership_changes(broker: LiveBroker) -> None:
    notified: list[str] = []

    async def on_request(cmd: RemotingCommand, conn) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            notified.append(cmd.ext_fields["consumerGroup"])

    other = broker.run(_new_client(request_handler=on_request))
    try:
        hb1 = broker.run(other.invoke(broker.addr, RemotingCommand.request(
            RequestCode.HEART_BEAT, body=_heartbeat("10.0.0.1@a", "hbg", "HbTopic")), 5))  # fmt: skip
        assert hb1.code == ResponseCode.SUCCESS
        assert broker.call(RequestCode.HEART_BEAT, body=_heartbeat("10.0.0.2@b", "hbg", "HbTopic")).code == 0
        ids = broker.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                          h.GetConsumerListByGroupRequestHeader(consumer_group="hbg"))  # fmt: skip
        assert sorted(json.loads(ids.body)["consumerIdList"]) == ["10.0.0.1@a", "10.0.0.2@b"]
        wait_until(lambda: "hbg" in notified, 5, what="NOTIFY_CONSUMER_IDS_CHANGED to the first consumer")
        conn_req = h.GetConsumerConnectionListRequestHeader(consumer_group="hbg")
        conns = json.loads(broker.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, conn_req).body)
        assert sorted(c["clientId"] for c in conns["connectionSet"]) == ["10.0.0.1@a", "10.0.0.2@b"]
        assert conns["messageModel"] == "CLUSTERING" and conns["consumeType"] == "CONSUME_PASSIVELY"
        assert conns["subscriptionTable"]["HbTopic"]["subString"] == "*"
        prod_req = h.GetProducerConnectionListRequestHeader(producer_group="pg")
        producers = json.loads(broker.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, prod_req).body)
        assert {c["clientId"] for c in producers["connectionSet"]} == {"10.0.0.1@a", "10.0.0.2@b"}
        groups = json.loads(broker.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)["subscriptionGroupTable"]
        assert groups["hbg"]["retryMaxTimes"] == 16
        topics = json.loads(broker.call(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
        assert topics["%RETRY%hbg"]["readQueueNums"] == 1
        # The heartbeat's subscription serves pulls that carry none.
        broker.send("HbTopic", b"x")
        assert broker.pull("HbTopic", 0, 0, group="hbg", flags=0).code == ResponseCode.SUCCESS
        # A consumer leaving: unregistering, or its connection closing.
        unreg = h.UnregisterClientRequestHeader(client_id="10.0.0.2@b", consumer_group="hbg")
        assert broker.call(RequestCode.UNREGISTER_CLIENT, unreg).code == ResponseCode.SUCCESS
        ids = broker.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                          h.GetConsumerListByGroupRequestHeader(consumer_group="hbg"))  # fmt: skip
        assert json.loads(ids.body)["consumerIdList"] == ["10.0.0.1@a"]
    finally:
        broker.run(other.close())
    wait_until(lambda: "hbg" not in broker.controller.consumers.groups, 5, what="the closed channel to be dropped")
    list_req = h.GetConsumerListByGroupRequestHeader(consumer_group="hbg")
    gone = broker.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, list_req)
    assert gone.code == ResponseCode.SYSTEM_ERROR
    offline = broker.call(RequestCode.GET_CONSUMER_CONNECTION_LIST,
                          h.GetConsumerConnectionListRequestHeader(consumer_group="hbg"))  # fmt: skip
    assert offline.code == ResponseCode.CONSUMER_NOT_ONLINE


@pytest.mark.integration
def test_bad_heartbeat_is_refused_and_the_connection_keeps_working(broker: LiveBroker) -> None:
    assert broker.call(RequestCode.HEART_BEAT, body=b"{not json").code == ResponseCode.SYSTEM_ERROR
    assert broker.call(RequestCode.HEART_BEAT, body=b'{"consumerDataSet":[]}').code == ResponseCode.SYSTEM_ERROR
    assert broker.send("AfterBadHb", b"x").code == ResponseCode.SUCCESS


@pytest.mark.integration
def test_queue_locks_are_exclusive_per_group(broker: LiveBroker) -> None:
    def body(client: str, queues: list[int]) -> bytes:
        mqs = [{"topic": "Locked", "brokerName": "broker-a", "queueId": q} for q in queues]
        return json.dumps({"consumerGroup": "lg", "clientId": client, "onlyThisBroker": False, "mqSet": mqs}).encode()

    def locked(resp: RemotingCommand) -> list[int]:
        return sorted(m["queueId"] for m in json.loads(resp.body)["lockOKMQSet"])

    assert locked(broker.call(RequestCode.LOCK_BATCH_MQ, body=body("A", [0, 1]))) == [0, 1]
    assert locked(broker.call(RequestCode.LOCK_BATCH_MQ, body=body("B", [1, 2]))) == [2]
    assert locked(broker.call(RequestCode.LOCK_BATCH_MQ, body=body("A", [0, 1]))) == [0, 1]  # renewal
    assert broker.call(RequestCode.UNLOCK_BATCH_MQ, body=body("A", [1])).code == ResponseCode.SUCCESS
    assert locked(broker.call(RequestCode.LOCK_BATCH_MQ, body=body("B", [1]))) == [1]


@pytest.mark.unit
def test_queue_locks_lapse_when_not_renewed() -> None:
    clock = [1000.0]  # seconds, advanced by the test: a lease's end is a state of the clock, not a wait
    locks = RebalanceLockManager(max_live_ms=60_000, clock=lambda: clock[0])
    mq = ("T", "broker-a", 0)
    assert locks.try_lock_batch("g", [mq], "A") == [mq]
    assert locks.try_lock_batch("g", [mq], "B") == [] and locks.is_locked("g", "T", 0)
    assert locks.try_lock_batch("other-group", [mq], "B") == [mq]  # locks are per group
    clock[0] += 59.999
    assert locks.try_lock_batch("g", [mq], "B") == [] and locks.is_locked("g", "T", 0)  # still A's
    clock[0] += 0.001
    assert not locks.is_locked("g", "T", 0)
    assert locks.try_lock_batch("g", [mq], "B") == [mq]


@pytest.mark.integration
def test_a_silent_client_is_dropped_after_channel_expired_timeout(fresh_broker) -> None:
    timeout = 120_000
    b = fresh_broker(channelExpiredTimeout=str(timeout))
    silent, alive = b.run(_new_client()), b.run(_new_client())
    try:
        hb = RemotingCommand.request(RequestCode.HEART_BEAT, body=_heartbeat("10.0.0.9@silent", "eg", "ExpT"))
        assert b.run(silent.invoke(b.addr, hb, 5)).code == ResponseCode.SUCCESS
        (silent_seen,) = [ch.last_update for ch in b.controller.consumers.groups["eg"].channels.values()]
        wait_until(lambda: now_ms() > silent_seen, 5, what="the clock to pass the silent client's heartbeat")
        hb = RemotingCommand.request(RequestCode.HEART_BEAT, body=_heartbeat("10.0.0.8@alive", "lg", "ExpT"))
        assert b.run(alive.invoke(b.addr, hb, 5)).code == ResponseCode.SUCCESS
        (alive_seen,) = [ch.last_update for ch in b.controller.consumers.groups["lg"].channels.values()]
        assert {"eg", "lg"} <= set(b.controller.consumers.groups)
        connected = set(b.controller.server.connections)

        async def scan(now: int) -> None:  # the broker's periodic scan, at a chosen time
            b.controller._scan_clients(now)

        b.run(scan(silent_seen + timeout))  # silent for exactly the timeout: not yet
        assert {"eg", "lg"} <= set(b.controller.consumers.groups)
        b.run(scan(alive_seen + timeout))  # the silent one has been silent longer than the timeout, the other not
        assert "eg" not in b.controller.consumers.groups and "lg" in b.controller.consumers.groups
        wait_until(lambda: len(connected - set(b.controller.server.connections)) == 1, 10,
                   what="the silent client's channel to close")  # fmt: skip
        assert len(connected - set(b.controller.server.connections)) == 1, "only the silent client's channel closes"
        req = h.GetConsumerListByGroupRequestHeader(consumer_group="eg")
        listed = b.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, req)
        assert listed.code == ResponseCode.SYSTEM_ERROR
    finally:
        b.run(silent.close())
        b.run(alive.close())


# =====================================================================================================
# admin and queries
# =====================================================================================================


def _create(broker: LiveBroker, topic: str, **kw) -> RemotingCommand:
    hdr = h.CreateTopicRequestHeader(topic=topic, default_topic="TBW102", read_queue_nums=kw.get("q", 2),
                                     write_queue_nums=kw.get("q", 2), perm=kw.get("perm", 6),
                                     topic_filter_type="SINGLE_TAG")  # fmt: skip
    return broker.call(RequestCode.UPDATE_AND_CREATE_TOPIC, hdr)


@pytest.mark.integration
def test_create_topic_validates_and_persists(broker: LiveBroker) -> None:
    assert _create(broker, "Created_topic-1|%").code == ResponseCode.SUCCESS
    on_disk = json.loads((broker.store_dir / "config" / "topics.json").read_text())
    assert on_disk["topicConfigTable"]["Created_topic-1|%"]["writeQueueNums"] == 2
    for bad in ("has space", "x" * 128, "semi;colon", ""):
        r = _create(broker, bad)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark, bad
    r = _create(broker, "DefaultCluster")
    assert r.code == ResponseCode.SYSTEM_ERROR and "cluster" in r.remark
    # A read-only topic refuses sends.
    assert _create(broker, "ReadOnly", perm=4).code == ResponseCode.SUCCESS
    assert broker.send("ReadOnly", b"x").code == ResponseCode.NO_PERMISSION


@pytest.mark.integration
def test_stats_and_runtime_info(broker: LiveBroker) -> None:
    for _ in range(3):
        broker.send("Stats", b"x", queue_id=1)
    broker.pull("Stats", 1, 0, group="sg", flags=SUB | COMMIT, commit_offset=2)
    stats = broker.call(RequestCode.GET_TOPIC_STATS_INFO, h.GetTopicStatsInfoRequestHeader(topic="Stats")).body.decode()
    # fastjson's Map<MessageQueue, ...>: JSON objects as keys.
    assert '{"brokerName":"broker-a","queueId":1,"topic":"Stats"}:{"lastUpdateTimestamp":' in stats
    assert '"maxOffset":3,"minOffset":0' in stats
    consume = broker.call(RequestCode.GET_CONSUME_STATS, h.GetConsumeStatsRequestHeader(consumer_group="sg")).body
    mq = '{"brokerName":"broker-a","queueId":1,"topic":"Stats"}'
    assert mq + ':{"brokerOffset":3,"consumerOffset":2' in consume.decode()
    all_offsets = json.loads(broker.call(RequestCode.GET_ALL_CONSUMER_OFFSET).body)["offsetTable"]
    assert all_offsets["Stats@sg"] == {"1": 2}
    info = json.loads(broker.call(RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert int(info["msgPutTotalTodayNow"]) >= 3 and int(info["commitLogMaxOffset"]) > 0
    missing = broker.call(RequestCode.GET_TOPIC_STATS_INFO, h.GetTopicStatsInfoRequestHeader(topic="Nope"))
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.integration
def test_query_by_key_and_view_by_offset(broker: LiveBroker) -> None:
    r = broker.send("Queried", b"find me", keys="order-77")
    now = int(time.time() * 1000)
    wait_until(lambda: broker.controller.store.dispatch_behind_bytes <= 0, 5)
    hdr = h.QueryMessageRequestHeader(topic="Queried", key="order-77", max_num=32, begin_timestamp=now - 60_000,
                                      end_timestamp=now + 60_000)  # fmt: skip
    found = broker.call(RequestCode.QUERY_MESSAGE, hdr)
    assert found.code == ResponseCode.SUCCESS
    (rec,) = records(found.body)
    assert rec.body == b"find me"
    # the index's last update is at least this message (indexed last, unless a delayed retry came after it)
    assert int(found.ext_fields["indexLastUpdatePhyoffset"]) >= rec.physical_offset
    assert int(found.ext_fields["indexLastUpdateTimestamp"]) >= rec.store_timestamp
    hdr.key = "order-78"
    assert broker.call(RequestCode.QUERY_MESSAGE, hdr).code == ResponseCode.QUERY_NOT_FOUND
    _, offset = msgid.decode_offset_msg_id(r.ext_fields["msgId"])
    view = broker.call(RequestCode.VIEW_MESSAGE_BY_ID, h.ViewMessageRequestHeader(offset=offset))
    assert records(view.body)[0].body == b"find me"
    assert broker.call(RequestCode.VIEW_MESSAGE_BY_ID, h.ViewMessageRequestHeader(offset=offset + 3)).code == 1


@pytest.mark.integration
def test_consumer_send_back_goes_to_retry_then_dlq(broker: LiveBroker) -> None:
    r = broker.send("Failing", b"bad news", tags="T")
    _, offset = msgid.decode_offset_msg_id(r.ext_fields["msgId"])
    back = h.ConsumerSendMsgBackRequestHeader(offset=offset, group="rg", delay_level=0, origin_topic="Failing")
    assert broker.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    # it waits out its delay level in SCHEDULE_TOPIC_XXXX, then comes back through %RETRY%<group>
    retried = wait_until(lambda: records(broker.pull("%RETRY%rg", 0, 0, group="rg").body), 10, what="the retry")
    assert [g.body for g in retried] == [b"bad news"] and retried[0].reconsume_times == 1
    assert retried[0].property_map["RETRY_TOPIC"] == "Failing"
    assert retried[0].property_map["ORIGIN_MESSAGE_ID"] == r.ext_fields["msgId"]  # Java: the offset msg id
    assert retried[0].property_map["REAL_TOPIC"] == "%RETRY%rg" and retried[0].property_map["DELAY"] == "1"
    # Past the retry limit: the dead-letter queue.
    back = h.ConsumerSendMsgBackRequestHeader(offset=retried[0].physical_offset, group="rg", delay_level=0,
                                              max_reconsume_times=1)  # fmt: skip
    assert broker.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    broker.dispatched()
    dead = records(broker.pull("%DLQ%rg", 0, 0, group="rg").body)
    assert [g.body for g in dead] == [b"bad news"] and dead[0].reconsume_times == 2
    gone = h.ConsumerSendMsgBackRequestHeader(offset=10**12, group="rg", delay_level=0)
    assert broker.call(RequestCode.CONSUMER_SEND_MSG_BACK, gone).code == ResponseCode.SYSTEM_ERROR


@pytest.mark.integration
def test_client_side_retry_past_the_limit_lands_in_the_dlq(broker: LiveBroker) -> None:
    """A client that cannot send back re-sends to %RETRY%<group> itself; past the limit the broker dead-letters."""
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic="%RETRY%xg", default_topic="TBW102", default_topic_queue_nums=4, queue_id=0,
        sys_flag=0, born_timestamp=0, flag=0, reconsume_times=17, max_reconsume_times=16,
        properties=properties.encode_properties({"RETRY_TOPIC": "Orig"}).decode(),
    )  # fmt: skip
    r = broker.call(RequestCode.SEND_MESSAGE, v1, b"too many tries")
    assert r.code == ResponseCode.SUCCESS
    broker.dispatched()
    assert [g.body for g in records(broker.pull("%DLQ%xg", 0, 0, group="xg").body)] == [b"too many tries"]
    v1.reconsume_times = 3
    assert broker.call(RequestCode.SEND_MESSAGE, v1, b"retry me").code == ResponseCode.SUCCESS
    broker.dispatched()
    assert [g.body for g in records(broker.pull("%RETRY%xg", 0, 0, group="xg").body)] == [b"retry me"]


# =====================================================================================================
# bad input
# =====================================================================================================


@pytest.mark.integration
def test_send_validation_codes(broker: LiveBroker) -> None:
    bad_name = broker.send("bad topic!", b"x")
    # a bad topic name is answered as RocketMQ's msgCheck answers it (TopicValidator.validateTopic): SYSTEM_ERROR
    assert bad_name.code == ResponseCode.SYSTEM_ERROR and "illegal" in bad_name.remark
    too_long = broker.send("x" * 128, b"x")
    assert too_long.code == ResponseCode.SYSTEM_ERROR and "max length: 127" in too_long.remark
    big = broker.send("Big", b"x" * (64 * 1024 + 1))
    assert big.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in big.remark
    assert broker.send("TBW102", b"x").code == ResponseCode.NO_PERMISSION
    assert broker.send("Range", b"x", queue_id=50).code == ResponseCode.SYSTEM_ERROR
    assert broker.send("Tx", b"x", TRAN_MSG="true").code == ResponseCode.SUCCESS  # a half message: test_transactions
    hdr = h.SendMessageRequestHeaderV2(a="pg", b="BadBatch", c="TBW102", d=4, e=0, f=0, g=0, h=0)
    bad_batch = broker.call(RequestCode.SEND_BATCH_MESSAGE, hdr, b"\x00\x00\x00\x30junk")
    assert bad_batch.code == ResponseCode.MESSAGE_ILLEGAL
    missing = broker.call(RequestCode.SEND_MESSAGE_V2, body=b"x")  # no header fields at all
    assert missing.code == ResponseCode.SYSTEM_ERROR and "null" in missing.remark
    assert broker.call(4242).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert broker.send("AfterBad", b"fine").code == ResponseCode.SUCCESS


@pytest.mark.integration
def test_auto_create_disabled_refuses_unknown_topics(fresh_broker) -> None:
    b = fresh_broker(autoCreateTopicEnable="false")
    r = b.send("NotThere", b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NotThere" in r.remark
    topics = json.loads(b.call(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert topics["TBW102"]["perm"] & 1 == 0  # not inheritable
    assert _create(b, "NowThere").code == ResponseCode.SUCCESS
    assert b.send("NowThere", b"x").code == ResponseCode.SUCCESS


def _raw(addr: str, payload: bytes, read: bool = True) -> bytes:
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(payload)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


@pytest.mark.integration
def test_garbage_on_the_wire_closes_only_that_connection(broker: LiveBroker) -> None:
    acked = broker.send("Survivor", b"before the garbage")
    assert acked.code == ResponseCode.SUCCESS
    assert _raw(broker.addr, os.urandom(4096)) == b""  # closed without an answer
    assert _raw(broker.addr, struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 64) == b""  # a 2 GiB frame
    assert _raw(broker.addr, struct.pack(">i", -5)) == b""
    assert _raw(broker.addr, struct.pack(">iI", 100, 20) + b"{\"code\":") == b""  # truncated frame, then EOF
    bad_json = b"{not a header}"
    assert _raw(broker.addr, struct.pack(">iI", 4 + len(bad_json), len(bad_json)) + bad_json) == b""
    unknown = RemotingCommand.request(777).encode()
    reply = _raw(broker.addr, unknown)
    assert RemotingCommand.decode(reply[4:]).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    # The broker still serves, and what it acknowledged before is intact.
    assert broker.send("Survivor", b"after the garbage").code == ResponseCode.SUCCESS
    bodies = [g.body for g in records(broker.pull("Survivor", 0, 0).body)]
    assert bodies == [b"before the garbage", b"after the garbage"]


# =====================================================================================================
# lifecycle
# =====================================================================================================


@pytest.mark.integration
def test_graceful_shutdown_answers_parked_pulls_and_persists_offsets(fresh_broker) -> None:
    b = fresh_broker()
    b.send("Lifecycle", b"m0")
    b.pull("Lifecycle", 0, 1, group="lc", flags=SUB | COMMIT, commit_offset=1)
    parked = asyncio.run_coroutine_threadsafe(asyncio.to_thread(b.pull, "Lifecycle", 0, 1, "*", "lc", SUB | SUSPEND,
                                                                 LONG_SUSPEND_MS, 0, 90), b.loop)  # fmt: skip
    wait_until(lambda: b.controller.hold.parked_count > 0, 10, what="the pull to park")
    b.run(b.controller.shutdown())
    # released by the shutdown, long before its 60 s suspend would have answered it
    assert parked.result(LONG_SUSPEND_MS / 1000 / 2).code == ResponseCode.PULL_NOT_FOUND
    assert not abort_file(b.store_dir).exists()
    offsets = json.loads((b.store_dir / "config" / "consumerOffset.json").read_text())
    assert offsets["offsetTable"]["Lifecycle@lc"] == {"0": 1}
    b.run(b.client.close())
    b.client = None
    b.controller = None
    b.start()  # same store: offsets and messages are back
    q = h.QueryConsumerOffsetRequestHeader(consumer_group="lc", topic="Lifecycle", queue_id=0)
    assert b.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "1"
    assert [g.body for g in records(b.pull("Lifecycle", 0, 0).body)] == [b"m0"]


@pytest.mark.integration
def test_sync_flush_send_is_durable_before_the_answer(fresh_broker) -> None:
    b = fresh_broker(flushDiskType="SYNC_FLUSH")
    # The send handler, observed: the CommitLog's flushed offset at the moment the answer is made.
    proc, flushed_at_answer = SendProcessor(b.controller), []

    async def answer(pending) -> RemotingCommand:
        resp = await pending if inspect.isawaitable(pending) else pending
        flushed_at_answer.append(b.controller.store.commitlog.queue.flushed_offset)
        return resp

    b.controller.server.register(RequestCode.SEND_MESSAGE_V2, lambda cmd, conn: answer(proc.send_inline(cmd, conn)))
    r = b.send("Durable", b"on disk")
    assert r.code == ResponseCode.SUCCESS
    offset = msgid.decode_offset_msg_id(r.ext_fields["msgId"])[1]
    (stored,) = records(b.pull("Durable", 0, 0).body)
    assert stored.body == b"on disk" and stored.physical_offset == offset
    assert len(flushed_at_answer) == 1
    assert flushed_at_answer[0] >= offset + stored.total_size, "answered before the record was on disk"


@pytest.mark.integration
def test_config_files_on_disk_survive_restarts_and_bad_ones_stop_start_up(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    config = store_dir / "config"
    config.mkdir(parents=True)
    # A topics.json written while auto-create was on; today it is off.
    (config / "topics.json").write_text(json.dumps({
        "dataVersion": {"counter": 3, "timestamp": 1},
        "topicConfigTable": {
            "TBW102": {"perm": 7, "readQueueNums": 8, "topicName": "TBW102", "writeQueueNums": 8},
            "Kept": {"perm": 6, "readQueueNums": 3, "topicName": "Kept", "writeQueueNums": 3},
        },
    }))  # fmt: skip
    b = LiveBroker(store_dir, autoCreateTopicEnable="false").start()
    try:
        topics = json.loads(b.call(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
        assert topics["Kept"]["writeQueueNums"] == 3 and topics["TBW102"]["perm"] == 6
        assert b.send("Kept", b"x", queue_id=2).code == ResponseCode.SUCCESS
    finally:
        b.close()
    # A corrupt consumerOffset.json with no usable backup: start-up refuses, naming the file, and frees the store.
    (config / "consumerOffset.json").write_text('{"offsetTable": {"t@g": {0: oops}}}')
    (config / "consumerOffset.json.bak").unlink(missing_ok=True)
    broken = LiveBroker(store_dir)
    try:
        with pytest.raises(ConfigFileError, match="consumerOffset.json"):
            broken.start()
    finally:
        broken.close()
    (config / "consumerOffset.json").write_text('{"offsetTable": {"Kept@g": {2: 1}}}')
    again = LiveBroker(store_dir).start()
    try:
        q = h.QueryConsumerOffsetRequestHeader(consumer_group="g", topic="Kept", queue_id=2)
        assert again.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "1"
    finally:
        again.close()

