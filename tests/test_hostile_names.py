"""Names from the wire that must not stop the broker or leave the store: groups and topics with a NUL, too long, or
holding ``../``; REAL_TOPIC smuggled through the timer topic; deleteTopic of a path; clients creating or sending to
system topics; and a record already in the CommitLog whose topic cannot name a directory."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.protocol.body import SubscriptionGroupConfig
from broker.remoting.protocol.topic import TopicConfig
from broker.server import half_messages
from broker.server.slave_sync import SlaveSynchronize
from pipelines.index_rebuild import adopt
from pipelines.index_rebuild import consume_queue as cq_rebuild
from pipelines.index_rebuild.job import REPAIR_MANIFEST
from store import names, schedule
from store.format import delay, records
from store.message_store import MessageStore
from tests.helpers import make_config, make_message, read_queue, wait_dispatched, wait_until
from tests.live_broker import LiveBroker


def _landing(store_dir: Path, topic: str) -> Path:
    """Where ``consumequeue/<topic>`` leads, ``..`` taken as the file system takes it."""
    return Path(os.path.normpath(store_dir / "consumequeue" / topic))


def _send_back(b: LiveBroker, offset: int, group: str, delay_level: int = -1):
    """CONSUMER_SEND_MSG_BACK of the message at CommitLog ``offset``; level -1 sends it to the DLQ at once."""
    hdr = h.ConsumerSendMsgBackRequestHeader(offset=offset, group=group, delay_level=delay_level,
                                             origin_topic="Victim", max_reconsume_times=16)  # fmt: skip
    return b.call(RequestCode.CONSUMER_SEND_MSG_BACK, hdr)


def _consumable(b: LiveBroker, topic: str, body: bytes) -> bool:
    """Send ``body`` to ``topic`` and pull it back through its queue (dispatched: a ConsumeQueue unit exists)."""
    assert b.send(topic, body, queue_id=0).code == ResponseCode.SUCCESS
    b.dispatched()
    r = b.pull(topic, 0, 0)
    return r.code == ResponseCode.SUCCESS and body in r.body


@pytest.mark.integration
def test_send_back_with_a_nul_or_overlong_or_path_group_is_refused_and_dispatch_goes_on(fresh_broker):
    b = fresh_broker()
    store = b.controller.store
    offset = store.commitlog.max_offset
    assert b.send("Victim", b"failed once").code == ResponseCode.SUCCESS
    escape = f"escaped_dlq_{uuid.uuid4().hex}"
    for group in ("g\x00x", "g" * 300, "g" * 121, f"../../../../{escape}", "../../" + "x" * 250):
        r = _send_back(b, offset, group)
        assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, (group[:20], r.code, r.remark)
        assert group not in b.controller.groups.table
    assert not any(t.startswith(("%DLQ%", "%RETRY%")) for t in b.controller.topics.table)
    assert not _landing(b.store_dir, f"%DLQ%../../../../{escape}").exists()
    assert not _landing(b.store_dir, f"%RETRY%../../../../{escape}").exists()
    # a legal group still gets its DLQ, and later sends are dispatched and consumable
    assert _send_back(b, offset, "LegalGroup").code == ResponseCode.SUCCESS
    b.dispatched()
    dlq = b.pull("%DLQ%LegalGroup", 0, 0, group="LegalGroup")
    assert dlq.code == ResponseCode.SUCCESS and b"failed once" in dlq.body
    assert _consumable(b, "AfterBadGroups", b"still dispatched")


@pytest.mark.integration
def test_a_group_refused_on_send_back_is_refused_on_pull_and_update_too(fresh_broker):
    b = fresh_broker()
    pull = b.pull("Victim", 0, 0, group="bad/group")
    assert pull.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    body = b'{"groupName":"../../sub","consumeEnable":true}'
    r = b.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert r.code == ResponseCode.INVALID_PARAMETER and "illegal characters" in r.remark
    assert "../../sub" not in b.controller.groups.table


@pytest.mark.integration
def test_clients_cannot_send_to_or_create_system_topics(fresh_broker):
    b = fresh_broker()
    for topic in ("rmq_sys_mine", "rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                  "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TBW102"):  # fmt: skip
        for v2 in (True, False):
            r = b.send(topic, b"not mine", v2=v2)
            forbidden = f"Sending message to topic[{topic}] is forbidden."
            assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, forbidden)
    assert "rmq_sys_mine" not in b.controller.topics.table
    hdr = h.CreateTopicRequestHeader(topic="rmq_sys_created", default_topic="TBW102", read_queue_nums=1,
                                     write_queue_nums=1, perm=6, topic_filter_type="SINGLE_TAG")  # fmt: skip
    r = b.call(RequestCode.UPDATE_AND_CREATE_TOPIC, hdr)
    assert r.code == ResponseCode.SYSTEM_ERROR and "conflict with system topic" in r.remark
    assert "rmq_sys_created" not in b.controller.topics.table
    assert _consumable(b, "PlainAfterSystem", b"fine")


@pytest.mark.integration
def test_real_topic_cannot_escape_through_the_timer_topic(fresh_broker):
    b = fresh_broker(timerWheelEnable="true")
    escape = f"timer_escape_{uuid.uuid4().hex}"
    due = str(int(time.time() * 1000))
    r = b.send("rmq_sys_wheel_timer", b"smuggled", REAL_TOPIC=f"../../../../{escape}", REAL_QID="0",
               TIMER_OUT_MS=due)  # fmt: skip
    assert r.code == ResponseCode.NO_PERMISSION
    # on a normal topic a client's REAL_TOPIC is overwritten by the park: the timer delivers to the topic sent to
    assert b.send("Timed", b"first", queue_id=0).code == ResponseCode.SUCCESS
    r = b.send("Timed", b"parked", queue_id=0, REAL_TOPIC=f"../../../../{escape}", TIMER_DELAY_MS="1000")
    assert r.code == ResponseCode.SUCCESS
    def delivered() -> bool:
        b.dispatched()
        got = b.pull("Timed", 0, 1)
        return got.code == ResponseCode.SUCCESS and b"parked" in got.body

    wait_until(delivered, 30, what="the timer to deliver the parked message to its own topic")
    assert not _landing(b.store_dir, f"../../../../{escape}").exists()


@pytest.mark.integration
def test_delete_topic_of_a_path_touches_nothing_outside_the_store(fresh_broker, tmp_path):
    b = fresh_broker()
    victim = tmp_path / f"victim_empty_{uuid.uuid4().hex}"
    victim.mkdir()  # store0/consumequeue/../../<victim> is this directory
    r = b.call(RequestCode.DELETE_TOPIC_IN_BROKER, h.DeleteTopicRequestHeader(topic=f"../../{victim.name}"))
    assert r.code == ResponseCode.INVALID_PARAMETER and "illegal characters" in r.remark
    assert victim.is_dir()
    assert _consumable(b, "AfterDelete", b"fine")


@pytest.mark.expected_errors("quarantined, not dispatched")
@pytest.mark.unit
@pytest.mark.parametrize("crash", [False, True])
def test_a_bad_record_in_the_commitlog_is_quarantined_and_dispatch_and_restart_go_on(tmp_path, caplog, crash):
    """Records written straight into the CommitLog (not through a broker) whose topics cannot name a directory:
    each is left out with an ERROR naming its offset, the records after them are dispatched, and the store starts
    again over them, after a clean stop and after a crash (when recovery dispatches them again)."""
    cfg = make_config(tmp_path)
    escape = f"cl_escape_{uuid.uuid4().hex}"
    bad_topics = [f"../../../../{escape}", "bad\x00topic", "t" * 300, ".."]
    store = MessageStore(cfg).start()
    try:
        bad_offsets = []
        for i, topic in enumerate(bad_topics):
            assert store.put_message(make_message("Good", 0, f"good-{i}")).ok
            res = store.put_message(make_message(topic, 0, b"bad"))
            assert res.ok
            assert res.append is not None
            bad_offsets.append(res.append.wrote_offset)
        with caplog.at_level(logging.ERROR, logger="store.dispatch"):
            assert store.put_message(make_message("Good", 0, "good-last")).ok
            wait_dispatched(store)
        assert [r.body for _, r in read_queue(store, "Good", 0)] == [
            *(f"good-{i}".encode() for i in range(len(bad_topics))), b"good-last"]  # fmt: skip
        logged = caplog.text
        for off in bad_offsets:
            assert f"record at CommitLog offset {off} " in logged and "quarantined" in logged
        assert store.reput.quarantined == len(bad_topics)
    finally:
        store.shutdown()
    if crash:  # no ConsumeQueue and an abort file: recovery dispatches every record again, the bad ones too
        shutil.rmtree(cfg.store_path_root_dir / "consumequeue")
        (cfg.store_path_root_dir / "abort").touch()
    landing = _landing(cfg.store_path_root_dir, bad_topics[0])
    assert not landing.exists()
    assert not list(Path(cfg.store_path_root_dir, "consumequeue").glob("*bad*"))
    again = MessageStore(cfg).start()
    try:
        wait_dispatched(again)
        assert again.put_message(make_message("Good", 0, "after-restart")).ok
        wait_dispatched(again)
        bodies = [r.body for _, r in read_queue(again, "Good", 0)]
        assert bodies[-2:] == [b"good-last", b"after-restart"] and len(bodies) == len(bad_topics) + 2
    finally:
        again.shutdown()
    assert not landing.exists()


@pytest.mark.expected_errors("slave sync: the master's .* left out")
@pytest.mark.integration
def test_configs_copied_from_a_master_leave_out_names_a_client_could_not_use(fresh_broker, caplog):
    """A master (another program, or a tampered one) serving a topic or group a client could not create: the slave
    copies the rest and leaves those out, logged."""
    master, slave = fresh_broker(), fresh_broker()
    mc = master.controller
    bad_topic, bad_group = "../../../../ha_escape", "grp\x00nul"

    async def tamper() -> None:  # on the master's loop: a change schedules its write there
        for topic in (bad_topic, "FromMaster"):
            mc.topics.update(TopicConfig(topic_name=topic, read_queue_nums=1, write_queue_nums=1))
        for group in (bad_group, "GroupFromMaster"):
            mc.groups.update(SubscriptionGroupConfig(group_name=group))

    master.run(tamper())
    sc = slave.controller

    async def build() -> SlaveSynchronize:  # on the slave's loop, as its controller builds it
        return SlaveSynchronize(sc.config, sc.topics, sc.offsets, sc.groups, slave.client, lambda segments: [])

    sync = slave.run(build())
    sync.master_addr = master.addr
    with caplog.at_level(logging.ERROR, logger="broker.server.slave_sync"):
        slave.run(sync.sync_all())
    assert "FromMaster" in sc.topics.table and bad_topic not in sc.topics.table
    assert "GroupFromMaster" in sc.groups.table and bad_group not in sc.groups.table
    logged = "\n".join(r.getMessage() for r in caplog.records)  # the records, whatever formatter the run installed
    assert "topic '../../../../ha_escape' left out" in logged and "group 'grp\\x00nul' left out" in logged


@pytest.mark.unit
def test_topic_and_group_rules_are_rocketmqs():
    assert names.topic_error("Good_topic-1|%") is None
    assert names.topic_error("") == names.topic_error("  ") == "The specified topic is blank."
    assert names.topic_error("a.b") == (
        "The specified topic: a.b, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$")
    assert "illegal characters" in names.topic_error("x" * 200 + "/")  # characters first, as TopicValidator
    assert "illegal characters" in names.topic_error("abc\n")  # a full match, not a line's
    assert names.topic_error("x" * 127) is None
    assert names.topic_error("x" * 128) == f"The specified topic: {'x' * 128}, is longer than topic max length: 127"
    assert names.group_error("g" * 120) is None  # its %RETRY% topic is 127 characters: a legal topic
    assert names.group_error("g" * 121) == f"The specified group: {'g' * 121}, is longer than group max length: 120"
    assert "illegal characters" in names.group_error("g\x00")
    assert names.stored_group_error("g" * 248) is None and names.stored_group_error("g" * 249) is not None
    # topics past 127 (retry topics of groups older than 5.x's 120-character limit) are stored (RocketMQ 5's
    # 2-byte topic length), never past a file name
    assert names.stored_topic_error("%RETRY%" + "g" * 248) is None
    assert names.stored_topic_error("%DLQ%" + "g" * 251) is not None
    assert names.stored_topic_error("x" * 200) is None and names.stored_topic_error("x" * 256) is not None
    assert names.stored_topic_error("../x") is not None
    for topic in ("rmq_sys_anything", "rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                  "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "TBW102"):  # fmt: skip
        assert names.is_system_topic(topic) and names.send_forbidden(topic), topic
    assert names.is_system_topic("RMQ_SYS_TRACE_TOPIC") and not names.send_forbidden("RMQ_SYS_TRACE_TOPIC")
    assert not names.is_system_topic("%RETRY%g") and not names.send_forbidden("%DLQ%g")


@pytest.mark.unit
def test_path_under_keeps_every_name_inside_the_root(tmp_path):
    root = tmp_path / "store" / "consumequeue"
    root.mkdir(parents=True)
    assert names.path_under(root, "Topic", "3") == root / "Topic" / "3"
    assert names.path_under(root, "T\u00f6pic", "0") == root / "T\u00f6pic" / "0"  # the store takes any file name
    for bad in ("..", ".", "", "../x", "a/b", "a\x00b", "x" * 256, "\u00e9" * 128):
        with pytest.raises(names.IllegalName):
            names.path_under(root, bad, "0")
    (root / "link").symlink_to(tmp_path)  # a directory inside that leads outside
    with pytest.raises(names.IllegalName, match="leads outside"):
        names.path_under(root, "link", "0")
    assert names.path_under(root, "%DLQ%..", "0") == root / "%DLQ%.." / "0"  # a name, not a step up


@pytest.mark.unit
def test_a_parked_message_with_a_bad_real_topic_is_not_delivered():
    def parked(real_topic: str) -> bytes:
        rec = make_message(delay.TIMER_TOPIC, 0, b"x", REAL_TOPIC=real_topic, REAL_QID="0", TIMER_OUT_MS="1")
        rec.store_host = ("127.0.0.1", 10911)
        return records.encode_record(rec)

    assert schedule._delivered_copy(parked("Fine"))[:2] == ("Fine", 0)
    assert schedule._delivered_copy(parked("%RETRY%" + "g" * 200))[0].startswith("%RETRY%")
    for bad in ("../../../../timer_escape", "a\x00b", "x" * 300):
        with pytest.raises(records.RecordError, match="REAL_TOPIC"):
            schedule._delivered_copy(parked(bad))


@pytest.mark.unit
def test_verify_index_names_queues_whose_topic_cannot_name_a_directory():
    rows = {
        "topic": ["Good", "../../../../rebuild_escape", "t" * 300, "Good"],
        "queue_id": [0, 0, 0, 0], "queue_offset": [0, 0, 0, 1], "commitlog_offset": [0, 100, 200, 300],
        "msg_size": [100, 100, 100, 100], "tags_code": [0, 0, 0, 0], "sys_flag": [0, 0, 0, 0],
    }  # fmt: skip
    rebuilt = cq_rebuild.rebuild_queues(pa.table(rows))
    assert list(rebuilt[("Good", 0)].queue_offsets) == [0, 1]
    assert [topic for topic, _ in rebuilt if cq_rebuild.unnamable(topic) is not None] == [
        "../../../../rebuild_escape", "t" * 300
    ]


@pytest.mark.expected_errors("consumequeue/Linked/0 left out")
@pytest.mark.unit
def test_a_queue_directory_leading_out_of_the_store_is_left_out_at_start(tmp_path, caplog):
    cfg = make_config(tmp_path)
    outside = tmp_path / "outside"
    (outside / "0").mkdir(parents=True)
    store = MessageStore(cfg).start()
    try:
        assert store.put_message(make_message("Good", 0, "before")).ok
        wait_dispatched(store)
    finally:
        store.shutdown()
    (cfg.store_path_root_dir / "consumequeue" / "Linked").symlink_to(outside)
    with caplog.at_level(logging.ERROR, logger="store.consume_queue"):
        again = MessageStore(cfg).start()
    try:
        assert [r.body for _, r in read_queue(again, "Good", 0)] == [b"before"]
        assert again.find_consume_queue("Linked", 0, create=False) is None
        assert "leads outside" in caplog.text
    finally:
        again.shutdown()
    assert list((outside / "0").iterdir()) == []


@pytest.mark.unit
def test_a_half_message_naming_a_bad_real_topic_is_never_committed_there():
    def half(real_topic: str) -> records.MessageRecord:
        raw = records.encode_record(make_message(half_messages.HALF_TOPIC, 0, b"x", REAL_TOPIC=real_topic,
                                                 REAL_QID="2"))  # fmt: skip
        return records.decode_record(raw)

    assert half_messages.real_target(half("Orders")) == ("Orders", 2)
    for bad in ("../../../../tx_escape", "a\x00b", "x" * 300):
        assert half_messages.real_target(half(bad)) is None, bad


@pytest.mark.unit
def test_adopting_rebuilt_files_refuses_a_manifest_naming_a_path(tmp_path):
    store_dir, out = tmp_path / "store", tmp_path / "out"
    (store_dir / "commitlog").mkdir(parents=True)
    out.mkdir()
    manifest = {"consume_queues": [{"topic": "../../../adopt_escape", "queue_id": 0, "files": []}], "index_files": [],
                "commitlog_min_offset": 0, "commitlog_end_offset": 0}  # fmt: skip
    (out / REPAIR_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(adopt.AdoptError, match="nothing adopted"):
        adopt.adopt_index(store_dir, out)
    assert sorted(p.name for p in store_dir.iterdir()) == ["commitlog"]


@pytest.mark.integration
def test_offsets_are_kept_only_for_names_a_client_could_create(fresh_broker):
    """UPDATE_CONSUMER_OFFSET's names become a key of consumerOffset.json (``topic@group``)."""
    b = fresh_broker()

    def commit(topic: str, group: str):
        hdr = h.UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=0, commit_offset=7)
        return b.call(RequestCode.UPDATE_CONSUMER_OFFSET, hdr)

    assert commit("a@b", "g").code == ResponseCode.TOPIC_NOT_EXIST
    assert commit("../t", "g").code == ResponseCode.TOPIC_NOT_EXIST
    assert commit("T", "g\x00").code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert commit("T", "x" * 300).code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert commit("T", "x" * 249).code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert commit("T", "g").code == ResponseCode.SUCCESS
    old = "g" * 200  # a group created before RocketMQ 5 limited groups to 120 characters, and its retry topic
    assert commit(f"%RETRY%{old}", old).code == ResponseCode.SUCCESS
    assert set(b.controller.offsets.encode()) == {"T@g", f"%RETRY%{old}@{old}"}


ROCKETMQ_5_LIB = Path(__file__).parent.parent / ".peers" / "rocketmq-5" / "lib"
_ORACLE = """
import java.io.*;
import java.nio.charset.StandardCharsets;
import org.apache.rocketmq.common.topic.TopicValidator;

public class NameOracle {
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String hex; (hex = in.readLine()) != null; ) {
            String name = new String(java.util.HexFormat.of().parseHex(hex), StandardCharsets.UTF_8);
            TopicValidator.ValidateResult t = TopicValidator.validateTopic(name);
            TopicValidator.ValidateResult g = TopicValidator.validateGroup(name);
            System.out.println(hex(t.isValid() ? "" : t.getRemark()) + " " + hex(g.isValid() ? "" : g.getRemark()) + " "
                + TopicValidator.isSystemTopic(name) + " " + TopicValidator.isNotAllowedSendTopic(name));
        }
    }

    static String hex(String s) {
        return s.isEmpty() ? "-" : java.util.HexFormat.of().formatHex(s.getBytes(StandardCharsets.UTF_8));
    }
}
"""


@pytest.mark.integration
def test_the_rules_are_apache_rocketmqs_own(tmp_path):
    """RocketMQ 5.4.0's TopicValidator (its jar, run by the JDK) judges the same names: the same verdicts and remarks
    for topics and groups, the same system topics; sends are refused for its not-allowed topics and, beyond it, for
    TBW102 and every rmq_sys_ topic (docs/names.md)."""
    jars = sorted(ROCKETMQ_5_LIB.glob("*.jar"))
    if not jars or not shutil.which("javac"):
        pytest.skip("no JDK or no RocketMQ 5 jars (make peers)")
    cp = os.pathsep.join(map(str, jars))
    (tmp_path / "NameOracle.java").write_text(_ORACLE)
    subprocess.run(["javac", "-cp", cp, "-d", str(tmp_path), str(tmp_path / "NameOracle.java")], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    samples = ["Orders", "", "  ", "a.b", "a b", "a\x00b", "abc\n", "caf\u00e9", "../../x", "%RETRY%g", "%DLQ%g",
               "x" * 120, "x" * 121, "x" * 127, "x" * 128, "g" * 300, "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest",
               "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
               "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "RMQ_SYS_TRACE_TOPIC", "CHECKPOINT_TOPIC",
               "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC", "rmq_sys_wheel_timer",
               "rmq_sys_anything", "Rmq_sys_x"]  # fmt: skip
    stdin = "".join(n.encode().hex() + "\n" for n in samples)
    out = subprocess.run(["java", "-Xms32m", "-Xmx128m", "-cp", f"{cp}{os.pathsep}{tmp_path}", "NameOracle"],
                         input=stdin, check=True, capture_output=True, text=True, timeout=300).stdout  # fmt: skip

    def remark(field: str) -> str | None:
        return None if field == "-" else bytes.fromhex(field).decode()

    lines = out.splitlines()
    assert len(lines) == len(samples)
    for name, line in zip(samples, lines, strict=True):
        topic, group, system, not_allowed = line.split(" ")
        assert names.topic_error(name) == remark(topic), name
        assert names.group_error(name) == remark(group), name
        assert names.is_system_topic(name) == (system == "true"), name
        ours = names.send_forbidden(name)
        assert ours == (not_allowed == "true" or name == "TBW102" or name.startswith("rmq_sys_")), name
