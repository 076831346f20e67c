"""Delay levels, 5.x timer messages, retry back-off / DLQ and LITE_PULL_MESSAGE, as RocketMQ serves them.

Brokers here use RocketMQ's own ``messageDelayLevel`` setting with short levels so nothing waits 10 s, and poll
with deadlines; deliveries are checked by what the store holds (store timestamps, properties, ConsumeQueue
tagsCodes), never by how long a test took."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace

import pytest
from rocketmq.client import Message

from broker.config import BrokerConfigError, load_broker_conf
from broker.remoting import headers as h
from broker.remoting.batch_body import BatchItem, encode_batch_body
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.protocol.body import MessageQueueKey
from store.config_files import load_delay_offsets
from store.format import properties as P
from store.format import records as R
from store.format.delay import SCHEDULE_TOPIC, TIMER_TOPIC
from store.format.msgid import decode_offset_msg_id
from store.message_store import MessageStore
from store.schedule import ParkRefused, park
from tests.aio import async_test, poll
from tests.fixtures_broker import remoting_call as broker_call
from tests.helpers import make_config, read_queue, wait_dispatched, wait_until
from tests.live_broker import LiveBroker, records
from tests.test_acl_broker import ADMIN as ACL_ADMIN
from tests.test_acl_broker import PRODUCER as ACL_PRODUCER
from tests.test_acl_broker import acl_broker, call, send_cmd
from tests.test_conformance_cpp_client import Collector, producer, push_consumer, unique

# =====================================================================================================
# parking (unit)
# =====================================================================================================


def _msg(**props: str) -> R.MessageRecord:
    return R.MessageRecord(topic="T", queue_id=3, body=b"x", properties=P.encode_properties(props))


@pytest.mark.unit
def test_a_delay_level_is_clamped_and_parked_in_its_schedule_queue() -> None:
    m = _msg(TAGS="a", DELAY="40", TIMER_DELAY_MS="5")
    park(m, max_level=18)
    assert (m.topic, m.queue_id) == (SCHEDULE_TOPIC, 17)  # level 18 (the highest) -> queue 17
    # the level wins over a timer, whose properties go (checkIfTimerMessage); REAL_* say where it is due
    assert m.property_map == {"TAGS": "a", "DELAY": "18", "REAL_TOPIC": "T", "REAL_QID": "3"}
    for untouched in (_msg(DELAY="0"), _msg(DELAY="-1"), _msg(TAGS="plain")):
        before = untouched.properties
        park(untouched, max_level=18)
        assert (untouched.topic, untouched.properties) == ("T", before)
    prepared = _msg(DELAY="2")
    prepared.sys_flag = R.TRANSACTION_PREPARED_TYPE  # a half message is not a delayed one
    park(prepared, max_level=18)
    assert prepared.topic == "T"
    half = R.MessageRecord(topic="RMQ_SYS_TRANS_HALF_TOPIC", queue_id=0, body=b"x", properties=b"DELAY\x012\x02")
    park(half, max_level=18)  # stored as NOT_TYPE in the half topic: its commit is what waits
    assert half.topic == "RMQ_SYS_TRANS_HALF_TOPIC"
    committed = _msg(DELAY="2")
    committed.sys_flag = R.TRANSACTION_COMMIT_TYPE
    park(committed, max_level=18)
    assert (committed.topic, committed.queue_id) == (SCHEDULE_TOPIC, 1)


@pytest.mark.unit
def test_a_timer_is_rounded_into_its_slot_as_java_and_a_past_time_stays_in_its_topic() -> None:
    now = 1_700_000_000_250
    m = _msg(TIMER_DELAY_MS="1500")  # due 1_700_000_001_750 -> slot ...001_000, dequeued one precision later
    park(m, 18, timer_precision_ms=1000, now_ms=now)
    assert (m.topic, m.queue_id) == (TIMER_TOPIC, 0)
    assert m.property_map["TIMER_OUT_MS"] == "1700000001000" and m.property_map["REAL_QID"] == "3"
    whole = _msg(TIMER_DELIVER_MS="1700000005000")  # a whole slot: Java takes the slot before it
    park(whole, 18, timer_precision_ms=1000, now_ms=now)
    assert whole.property_map["TIMER_OUT_MS"] == "1700000004000"
    seconds = _msg(TIMER_DELAY_SEC="3")
    park(seconds, 18, timer_precision_ms=100, now_ms=now)
    assert seconds.property_map["TIMER_OUT_MS"] == "1700000003200"
    past = _msg(TIMER_DELIVER_MS=str(now - 1))
    park(past, 18, now_ms=now)
    assert past.topic == "T" and "TIMER_OUT_MS" not in past.property_map  # deliverable at once


@pytest.mark.unit
def test_bad_delay_and_timer_values_are_refused() -> None:
    now = 1_700_000_000_000
    for bad, needle in [
        (_msg(DELAY="soon"), "not a delay level"),
        (_msg(TIMER_DELAY_MS="1e3"), "not an integer"),
        (_msg(TIMER_DELAY_SEC=str(3 * 86400 + 1)), "max delay 259200000ms"),
        (_msg(TIMER_DELIVER_MS=str(now - 5000), TIMER_DEL_UNIQKEY="k"), "in the future"),
    ]:
        with pytest.raises(ParkRefused, match=needle):
            park(bad, 18, now_ms=now)
    with pytest.raises(ParkRefused) as off:
        park(_msg(TIMER_DELAY_MS="10"), 18, timer_enable=False, now_ms=now)
    assert off.value.not_enabled


@pytest.mark.unit
def test_a_record_re_addressed_to_its_real_topic_equals_one_encoded_there() -> None:
    """retarget_record patches bytes; encode_record builds a record from fields: both must give the same record."""
    rec = R.MessageRecord(
        topic=SCHEDULE_TOPIC, queue_id=2, body=b"payload", properties=b"DELAY\x013\x02REAL_TOPIC\x01T\x02",
        flag=7, sys_flag=R.MULTI_TAGS_FLAG, born_timestamp=1_700_000_000_123, born_host=("10.0.0.1", 4321),
        store_timestamp=1_700_000_000_456, store_host=("::1", 10911), reconsume_times=4,
    )  # fmt: skip
    raw = R.encode_record(rec)
    extra = b"TIMER_DEQUEUE_MS\x019\x02"
    for topic in ("T", "L" * 200):  # a topic over 127 bytes switches the record to the V2 format
        got = R.retarget_record(raw, topic, 5, extra)
        expected = replace(rec, topic=topic, queue_id=5, properties=rec.properties + extra, magic=None)
        assert got == R.encode_record(expected)
        assert R.decode_record(got, check_crc=True).topic == topic
    assert R.record_properties(raw) == rec.properties
    with pytest.raises(R.RecordError):
        R.record_sections(raw[:-3])  # a torn record
    props = b"XDELAY\x019\x02DELAY\x011\x02EMPTY\x01\x02DELAY\x012\x02"
    assert P.property_value(props, "DELAY") == "2"  # the last wins, as Java's map fill
    assert P.property_value(props, "EMPTY") is None and P.property_value(b"XDELAY\x019\x02", "DELAY") is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("line", "key"),
    [("messageDelayLevel=1s 5x", "messageDelayLevel"), ("messageDelayLevel=", "messageDelayLevel"),
     ("timerPrecisionMs=0", "timerPrecisionMs"), ("litePullMessageEnable=maybe", "litePullMessageEnable")],
)  # fmt: skip
def test_a_bad_delay_setting_stops_start_up_naming_the_key(tmp_path, line: str, key: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(line + "\n")
    with pytest.raises(BrokerConfigError) as err:
        load_broker_conf(conf)
    assert key in str(err.value) and str(conf) in str(err.value)


# =====================================================================================================
# the store's schedule service
# =====================================================================================================


@pytest.mark.integration
def test_levels_deliver_in_order_and_a_restart_resumes_from_delay_offset_json(tmp_path) -> None:
    cfg = make_config(tmp_path, message_delay_level="1s 2s", flush_delay_offset_interval=50)
    with MessageStore(cfg) as store:
        sent = []
        for i in range(6):
            level = 1 + i % 2
            r = store.put_message(_msg(UNIQ_KEY=f"u{i}", DELAY=str(level), TAGS=f"t{i}"))
            assert r.ok
            sent.append((level, r.append.store_timestamp))
        wait_dispatched(store)
        # parked: tagsCode = store time + the level's delay
        for q, ms in ((0, 1000), (1, 2000)):
            units = [store.find_consume_queue(SCHEDULE_TOPIC, q).get_unit(i) for i in range(3)]
            assert [u[2] for u in units] == [ts + ms for lv, ts in sent if lv == q + 1]
        wait_until(lambda: store.get_max_offset_in_queue("T", 3) == 6, 15, what="six deliveries")
        wait_dispatched(store)
        got = [rec for _, rec in read_queue(store, "T", 3)]
        by_key = {g.uniq_key: g for g in got}
        for i, (level, parked_at) in enumerate(sent):
            g = by_key[f"u{i}"]
            assert g.store_timestamp >= parked_at + level * 1000  # never early
            assert g.property_map["DELAY"] == str(level) and g.property_map["REAL_TOPIC"] == "T"
        # each level in its own order
        assert [g.uniq_key for g in got if g.property_map["DELAY"] == "1"] == ["u0", "u2", "u4"]
        cq = store.find_consume_queue("T", 3)
        assert cq.get_unit(0)[2] != 0  # tagsCode is the tag hash again, not a time
        wait_until(lambda: load_delay_offsets(cfg.config_dir) == {1: 3, 2: 3}, 5, what="delayOffset.json")
    with MessageStore(cfg) as store:  # reopened: nothing delivered twice after a clean shutdown
        assert store.schedule.offset_table() == {1: 3, 2: 3}
        assert store.get_max_offset_in_queue("T", 3) == 6


@pytest.mark.expected_errors("delay level 1 offset")
@pytest.mark.integration
def test_a_parked_record_that_cannot_be_delivered_is_skipped_and_delivery_goes_on(tmp_path, caplog) -> None:
    cfg = make_config(tmp_path, message_delay_level="1s")
    with MessageStore(cfg) as store:
        # written straight into SCHEDULE_TOPIC_XXXX (a batch is never parked): one without REAL_TOPIC/REAL_QID,
        # one whose real topic is the schedule topic itself (delivering it would park it forever)
        bad = [R.MessageRecord(topic=SCHEDULE_TOPIC, queue_id=0, body=b"no real topic", properties=b"DELAY\x011\x02"),
               R.MessageRecord(topic=SCHEDULE_TOPIC, queue_id=0, body=b"loop", properties=P.encode_properties(
                   {"DELAY": "1", "REAL_TOPIC": SCHEDULE_TOPIC, "REAL_QID": "0"}))]  # fmt: skip
        assert store.put_nowait(bad)[0].ok
        assert store.put_message(_msg(UNIQ_KEY="good", DELAY="1")).ok
        wait_until(lambda: store.get_max_offset_in_queue("T", 3) == 1, 10, what="the good message")
        wait_until(lambda: store.schedule.offset_table() == {1: 3}, 5, what="the cursor past all three")
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 0) == 3  # nothing re-parked
    assert "without REAL_TOPIC/REAL_QID" in caplog.text and "real topic is SCHEDULE_TOPIC_XXXX" in caplog.text


@pytest.mark.integration
def test_timer_progress_survives_restart_and_nothing_due_is_lost(tmp_path) -> None:
    cfg = make_config(tmp_path, timer_precision_ms=100, flush_delay_offset_interval=50)
    with MessageStore(cfg) as store:
        now = int(time.time() * 1000)
        soon = store.put_message(_msg(UNIQ_KEY="soon", TIMER_DELAY_MS="300"))
        later = store.put_message(_msg(UNIQ_KEY="later", TIMER_DELIVER_MS=str(now + 60_000)))
        assert soon.ok and later.ok
        wait_until(lambda: store.get_max_offset_in_queue("T", 3) == 1, 10, what="the 300 ms timer")
        wait_until(lambda: store.timers.pending == 1, 5, what="the 60 s timer indexed")
    with MessageStore(cfg) as store:
        # re-indexed from the lowest pending unit; the one already delivered is skipped, the 60 s one kept
        assert store.timers.pending == 1
        wait_dispatched(store)
        [(_, rec)] = read_queue(store, "T", 3)
        assert rec.uniq_key == "soon" and rec.store_timestamp >= now + 300
        assert int(rec.property_map["TIMER_DEQUEUE_MS"]) >= int(rec.property_map["TIMER_OUT_MS"]) + 100


@pytest.mark.integration
def test_a_delete_mark_drops_its_message_and_itself_also_across_a_restart(tmp_path) -> None:
    cfg = make_config(tmp_path, timer_precision_ms=100)
    with MessageStore(cfg) as store:
        deliver = str(int(time.time() * 1000) + 3000)
        assert store.put_message(_msg(UNIQ_KEY="recalled", TIMER_DELIVER_MS=deliver)).ok
        assert store.put_message(_msg(UNIQ_KEY="kept", TIMER_DELIVER_MS=deliver)).ok
        wait_dispatched(store)
        [(_, parked), _] = read_queue(store, TIMER_TOPIC, 0)
        # what RECALL_MESSAGE writes: the handle's time is the parked TIMER_OUT_MS + 1, the same slot
        mark = _msg(UNIQ_KEY="recalled", TIMER_DEL_UNIQKEY="recalled",
                    TIMER_DELIVER_MS=str(int(parked.property_map["TIMER_OUT_MS"]) + 1))  # fmt: skip
        assert store.put_message(mark).ok
        wait_until(lambda: store.timers.pending == 3, 5, what="the two timers and the mark indexed")
    with MessageStore(cfg) as store:
        assert store.timers.pending == 3  # re-indexed from the CommitLog, the mark with them
        wait_until(lambda: store.timers.pending == 0, 15, what="the slot delivered")
        wait_dispatched(store)
        assert [rec.uniq_key for _, rec in read_queue(store, "T", 3)] == ["kept"]


# =====================================================================================================
# on the wire
# =====================================================================================================


@pytest.fixture
def live(fresh_broker):
    return fresh_broker


def _pull_all(b: LiveBroker, topic: str, queue_id: int = 0, expr: str = "*", group: str = "g") -> list:
    r = b.pull(topic, queue_id, 0, expr=expr, group=group)
    return records(r.body) if r.code == ResponseCode.SUCCESS else []


@pytest.mark.integration
def test_delay_level_send_waits_in_schedule_topic_then_arrives_with_its_tags(live) -> None:
    b = live(messageDelayLevel="1s 2s")
    r = b.send("Later", b"in two seconds", tags="TagA", DELAY="2")
    assert r.code == ResponseCode.SUCCESS
    [parked] = _pull_all(b, SCHEDULE_TOPIC, 1, group="g")
    unit = b.controller.store.find_consume_queue(SCHEDULE_TOPIC, 1).get_unit(0)
    assert unit[2] == parked.store_timestamp + 2000
    clamped = b.send("Later", b"clamped", tags="TagB", DELAY="99")
    assert clamped.code == ResponseCode.SUCCESS
    assert [m.property_map["DELAY"] for m in _pull_all(b, SCHEDULE_TOPIC, 1)] == ["2", "2"]
    got = wait_until(lambda: len(_pull_all(b, "Later", expr="TagA")) == 1 and _pull_all(b, "Later", expr="TagA"),
                     10, what="the delayed message")  # fmt: skip
    [m] = got
    assert m.body == b"in two seconds" and m.store_timestamp >= parked.store_timestamp + 2000
    assert (m.property_map["REAL_TOPIC"], m.property_map["REAL_QID"]) == ("Later", "0")
    wait_until(lambda: len(_pull_all(b, "Later")) == 2, 10, what="the clamped message")
    off = b.call(RequestCode.GET_ALL_DELAY_OFFSET)
    assert off.code == ResponseCode.SUCCESS and off.body == b'{"offsetTable":{2:2}}'
    info = json.loads(b.call(RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert info["scheduleMessageOffset_2"] == "2,2" and info["timerOffsetBehind"] == "0"
    bad = b.send("Later", b"x", DELAY="soon")
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "not a delay level" in bad.remark


@pytest.mark.integration
def test_a_batch_is_never_delayed(live) -> None:
    b = live(messageDelayLevel="1s")
    items = [BatchItem(body=f"b{i}".encode(), properties=P.encode_properties({"DELAY": "1"}), flag=0) for i in range(2)]
    hdr = h.SendMessageRequestHeaderV2(a="pg", b="Batched", c="TBW102", d=4, e=0, f=0, g=0, h=0, i="", m=True)
    ok = b.call(RequestCode.SEND_BATCH_MESSAGE, hdr, encode_batch_body(items))
    assert ok.code == ResponseCode.SUCCESS  # the inner messages' DELAY is not looked at: stored at once
    b.dispatched()
    assert [m.body for m in _pull_all(b, "Batched")] == [b"b0", b"b1"]
    hdr.i = P.encode_properties({"DELAY": "1"}).decode()
    refused = b.call(RequestCode.SEND_BATCH_MESSAGE, hdr, encode_batch_body(items))
    assert refused.code == ResponseCode.MESSAGE_ILLEGAL and "cannot be delayed" in refused.remark


@pytest.mark.integration
def test_timer_messages_on_the_wire(live) -> None:
    b = live(timerPrecisionMs="100")
    asked = int(time.time() * 1000) + 700
    assert b.send("Timed", b"at a time", TIMER_DELIVER_MS=str(asked)).code == ResponseCode.SUCCESS
    assert b.send("Timed", b"past", TIMER_DELIVER_MS="1000").code == ResponseCode.SUCCESS
    got = wait_until(lambda: len(_pull_all(b, "Timed")) == 2 and _pull_all(b, "Timed"), 10, what="both messages")
    past, timed = sorted(got, key=lambda m: m.body != b"past")
    assert "TIMER_OUT_MS" not in past.property_map  # a past time: stored in its topic at once, never parked
    assert timed.body == b"at a time" and timed.store_timestamp >= asked
    assert timed.property_map["REAL_TOPIC"] == "Timed" and int(timed.property_map["TIMER_OUT_MS"]) < asked
    too_far = b.send("Timed", b"x", TIMER_DELAY_SEC=str(4 * 86400))
    assert too_far.code == ResponseCode.MESSAGE_ILLEGAL and "max delay" in too_far.remark
    assert b.send("Timed", b"x", TIMER_DELAY_MS="soon").code == ResponseCode.MESSAGE_ILLEGAL
    off = live(timerWheelEnable="false")
    refused = off.send("Timed", b"x", TIMER_DELAY_MS="500")
    assert refused.code == ResponseCode.SYSTEM_ERROR and "timerWheelEnable" in refused.remark


@pytest.mark.integration
def test_recall_message_on_the_wire(live) -> None:
    b = live(timerPrecisionMs="100", recallMessageEnable="true")
    deliver = str(int(time.time() * 1000) + 2000)
    gone = b.send("Timed", b"gone", TIMER_DELIVER_MS=deliver, UNIQ_KEY="7F0000010000000000000000000000AA")
    kept = b.send("Timed", b"kept", TIMER_DELIVER_MS=deliver)
    assert "recallHandle" not in b.send("Timed", b"now").ext_fields  # only a parked timer message has one

    def recall(topic: str, handle: str) -> RemotingCommand:
        return b.call(RequestCode.RECALL_MESSAGE, h.RecallMessageRequestHeader(topic=topic, recall_handle=handle))

    bad = recall("Timed", "@@@")
    assert (bad.code, bad.remark) == (ResponseCode.ILLEGAL_OPERATION, "recall handle is invalid")
    assert recall("Other", gone.ext_fields["recallHandle"]).code == ResponseCode.TOPIC_NOT_EXIST
    ok = recall("Timed", gone.ext_fields["recallHandle"])
    assert ok.code == ResponseCode.SUCCESS
    assert ok.ext_fields["msgId"] == "7F0000010000000000000000000000AA"
    wait_until(lambda: len(_pull_all(b, "Timed")) == 2, 10, what="the kept timer message")
    wait_until(lambda: b.controller.store.timers.pending == 0, 10, what="the slot done")
    assert [m.body for m in _pull_all(b, "Timed")] == [b"now", b"kept"]
    late = recall("Timed", kept.ext_fields["recallHandle"])
    assert (late.code, late.remark) == (ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")


@pytest.mark.integration
def test_send_back_backs_off_through_level_3_plus_reconsume_times_then_dead_letters(live) -> None:
    b = live(messageDelayLevel="1s 1s 1s 1s 1s")
    r = b.send("Work", b"fails", tags="T")
    _, offset = decode_offset_msg_id(r.ext_fields["msgId"])
    back = h.ConsumerSendMsgBackRequestHeader(offset=offset, group="bg", delay_level=0, max_reconsume_times=2)
    assert b.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    b.dispatched()
    assert [m.property_map["DELAY"] for m in _pull_all(b, SCHEDULE_TOPIC, 2)] == ["3"]  # level 3 + 0
    [first] = wait_until(lambda: _pull_all(b, "%RETRY%bg", group="bg"), 10, what="the first retry")
    assert first.reconsume_times == 1 and first.property_map["RETRY_TOPIC"] == "Work"
    back.offset = first.physical_offset
    assert b.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    b.dispatched()
    assert [m.property_map["DELAY"] for m in _pull_all(b, SCHEDULE_TOPIC, 3)] == ["4"]  # level 3 + 1
    second = wait_until(lambda: _pull_all(b, "%RETRY%bg", group="bg")[1:], 10, what="the second retry")
    # reconsumeTimes 2 >= maxReconsumeTimes 2: the DLQ, at once (DELAY 0), as Java's consumerSendMsgBack
    back.offset = second[0].physical_offset
    assert b.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    b.dispatched()
    [dead] = _pull_all(b, "%DLQ%bg", group="bg")
    assert dead.reconsume_times == 3 and dead.property_map["DELAY"] == "0"
    assert b.controller.topics.get("%DLQ%bg").perm == 6  # PermName.PERM_WRITE | PERM_READ
    # a consumer may also ask for the DLQ outright (delayLevel < 0)
    back = h.ConsumerSendMsgBackRequestHeader(offset=offset, group="bg2", delay_level=-1)
    assert b.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    b.dispatched()
    assert [m.body for m in _pull_all(b, "%DLQ%bg2", group="bg2")] == [b"fails"]


@pytest.mark.integration
def test_an_orderly_groups_client_retry_goes_straight_to_the_dlq_undelayed(live) -> None:
    b = live()
    mq: MessageQueueKey = ("Ordered", b.controller.config.broker_name, 0)
    assert b.controller.locks.try_lock_batch("og", [mq], "client-1")
    v1 = h.SendMessageRequestHeader(
        producer_group="og", topic="%RETRY%og", default_topic="TBW102", default_topic_queue_nums=4, queue_id=0,
        sys_flag=0, born_timestamp=0, flag=0, reconsume_times=1, max_reconsume_times=16,
        properties=P.encode_properties({"RETRY_TOPIC": "Ordered", "DELAY": "4"}).decode(),
    )  # fmt: skip
    assert b.call(RequestCode.SEND_MESSAGE, v1, b"locked").code == ResponseCode.SUCCESS
    b.dispatched()
    [dead] = _pull_all(b, "%DLQ%og", group="og")
    assert dead.body == b"locked" and dead.property_map["DELAY"] == "-1"
    assert _pull_all(b, SCHEDULE_TOPIC, 3) == []


@pytest.mark.integration
def test_lite_pull_message_is_served_as_a_pull(live) -> None:
    b = live()
    b.send("Lite", b"one", tags="A")
    b.send("Lite", b"two", tags="B")
    hdr = h.PullMessageRequestHeader(
        consumer_group="lite", topic="Lite", queue_id=0, queue_offset=0, max_msg_nums=32, sys_flag=0x4 | 0x10,
        commit_offset=0, suspend_timeout_millis=0, subscription="B", sub_version=0, expression_type="TAG",
    )  # fmt: skip
    r = b.call(RequestCode.LITE_PULL_MESSAGE, hdr)
    assert r.code == ResponseCode.SUCCESS and [m.body for m in records(r.body)] == [b"two"]
    assert r.ext_fields["nextBeginOffset"] == "2"
    hdr.queue_offset = 2
    assert b.call(RequestCode.LITE_PULL_MESSAGE, hdr).code == ResponseCode.PULL_NOT_FOUND
    # long polling as for PULL_MESSAGE: parked at the end of the queue, answered by the next arrival
    hdr.sys_flag |= 0x2
    hdr.suspend_timeout_millis = 20_000
    parked = asyncio.run_coroutine_threadsafe(
        b.client.invoke(b.addr, RemotingCommand.request(RequestCode.LITE_PULL_MESSAGE, hdr), 30), b.loop
    )
    wait_until(lambda: b.controller.hold.parked_count > 0, 10, what="the parked lite pull")
    b.send("Lite", b"three", tags="B")
    woken = parked.result(25)
    assert woken.code == ResponseCode.SUCCESS and [m.body for m in records(woken.body)] == [b"three"]
    off = live(litePullMessageEnable="false")
    refused = off.call(RequestCode.LITE_PULL_MESSAGE, hdr)
    assert refused.code == ResponseCode.NO_PERMISSION and "lite pull" in refused.remark


@pytest.mark.integration
@async_test
async def test_a_lite_pull_needs_the_permissions_a_pull_needs_under_acl(tmp_path) -> None:
    hdr = h.PullMessageRequestHeader(
        consumer_group="lite", topic="Orders", queue_id=0, queue_offset=0, max_msg_nums=32, sys_flag=0x4 | 0x10,
        commit_offset=0, suspend_timeout_millis=0, subscription="*", sub_version=0, expression_type="TAG",
    )  # fmt: skip
    async with acl_broker(tmp_path) as broker:
        assert (await call(broker.addr, send_cmd("Orders"), ACL_ADMIN)).code == ResponseCode.SUCCESS
        for code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
            refused = await call(broker.addr, RemotingCommand.request(code, hdr), ACL_PRODUCER)  # PUB only
            assert refused.code == ResponseCode.NO_PERMISSION
            assert refused.remark == "No default permission for topic:Orders"
        await poll(lambda: broker.store.get_max_offset_in_queue("Orders", 0) == 1, what="the send dispatched")
        ok = await call(broker.addr, RemotingCommand.request(RequestCode.LITE_PULL_MESSAGE, hdr), ACL_ADMIN)
        assert ok.code == ResponseCode.SUCCESS and [m.body for m in records(ok.body)] == [b"hello"]


# =====================================================================================================
# the PyPI C++ client, and SIGKILL
# =====================================================================================================


def _delayed(topic: str, body: str, level: int = 0, **props: str) -> Message:
    m = Message(topic)
    m.set_body(body)
    m.set_tags("TagD")
    if level:
        m.set_delay_time_level(level)
    for k, v in props.items():
        m.set_property(k, v)
    return m


class Stamped(Collector):
    """Also keeps (store timestamp, born timestamp) by body."""

    def __init__(self) -> None:
        super().__init__(prop="REAL_TOPIC")
        self.times: dict[bytes, tuple[int, int]] = {}
        self._tlock = threading.Lock()

    def __call__(self, msg) -> None:
        with self._tlock:
            self.times[msg.body] = (msg.store_timestamp, msg.born_timestamp)
        super().__call__(msg)


@pytest.mark.integration
def test_cpp_client_delay_level_is_delivered_when_due(mqlake_server) -> None:
    topic, group = unique("DelayT"), unique("CG")
    p = producer(mqlake_server)
    got = Stamped()
    c = None
    try:
        assert p.send_sync(_delayed(topic, "now")).status == 0
        c = push_consumer(mqlake_server, group, topic, got)
        assert p.send_sync(_delayed(topic, "later", level=1)).status == 0  # TEST_CONF: level 1 is 1 s
        got.wait_bodies({b"now", b"later"})
        stored, born = got.times[b"later"]
        assert stored - born >= 1000  # delivered copy stored no earlier than its level's delay
        [later] = [g for g in got.snapshot() if g.body == b"later"]
        assert later.prop == topic.encode() and later.tags == b"TagD"  # went through SCHEDULE_TOPIC_XXXX
    finally:
        if c is not None:
            c.shutdown()
        p.shutdown()


@pytest.mark.integration
# the C++ wrapper re-raises the callback's exception (after answering RECONSUME_LATER) into ctypes, which reports it
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_cpp_client_retry_comes_back_after_its_delay_level(mqlake_server) -> None:
    """A C++ push consumer's failure goes back through CONSUMER_SEND_MSG_BACK and returns one delay level later."""
    topic, group = unique("RetryT"), unique("CG")
    seen: list[tuple[int, int, bytes | None]] = []  # (reconsume times, store time, RETRY_TOPIC)
    lock = threading.Lock()

    def flaky(msg) -> None:
        with lock:
            seen.append((msg.reconsume_times, msg.store_timestamp, msg.get_property("RETRY_TOPIC")))
            first = len(seen) == 1
        if first:
            raise RuntimeError("fail the first delivery")  # the C++ client answers RECONSUME_LATER

    p = producer(mqlake_server)
    c = None
    try:
        assert p.send_sync(_delayed(topic, "create")).status == 0
        c = push_consumer(mqlake_server, group, topic, flaky)
        wait_until(lambda: len(seen) >= 2, 30, what="the retried delivery")
        (_, first_stored, _), (times, retry_stored, retry_topic) = seen[:2]
        assert times == 1 and retry_topic == topic.encode()
        assert retry_stored >= first_stored + 1000  # TEST_CONF: level 3 + 0 clamps to level 1, 1 s
    finally:
        if c is not None:
            c.shutdown()
        p.shutdown()


@pytest.mark.integration
def test_sigkill_loses_no_delayed_or_timer_message(mqlake_server_factory) -> None:
    server = mqlake_server_factory(messageDelayLevel="2s", flushDelayOffsetInterval="100")
    topic = unique("KillDelay")
    p = producer(server)
    assert p.send_sync(_delayed(topic, "create")).status == 0
    # the auto-created topic must be in topics.json before the kill, or the restarted broker does not know it
    topics_json = server.store_dir / "config" / "topics.json"
    wait_until(lambda: topics_json.exists() and topic in topics_json.read_text(), 20, what="topics.json")
    bodies = set()
    for i in range(10):
        assert p.send_sync(_delayed(topic, f"level-{i}", level=1)).status == 0
        assert p.send_sync(_delayed(topic, f"timer-{i}", TIMER_DELAY_MS="1500")).status == 0
        bodies |= {f"level-{i}".encode(), f"timer-{i}".encode()}
    p.shutdown()
    server.kill()  # SIGKILL right after the last acknowledgement, with (nearly) all of them still parked
    server.start()
    got = Collector()
    c = push_consumer(server, unique("CG"), topic, got)
    try:
        got.wait_bodies(bodies, what="every parked message after the crash")
    finally:
        c.shutdown()
    # delivered cursors reach delayOffset.json; a SIGKILL after that does not rewind them
    path = server.store_dir / "config" / "delayOffset.json"
    wait_until(lambda: path.exists() and load_delay_offsets(path.parent) == {1: 10}, 10, what="delayOffset.json")
    server.kill()
    server.start()
    r = broker_call(server.broker_addr, RequestCode.GET_ALL_DELAY_OFFSET)
    assert json.loads(r.body.replace(b"{1:", b'{"1":')) == {"offsetTable": {"1": 10}}
