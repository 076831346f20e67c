"""The same store files, both ways: Apache RocketMQ's broker (4.9.7 and 5.4.0) serves a store mqlake wrote, and
mqlake serves, verifies and tiers a store Apache RocketMQ's broker wrote.

Both directions write the same messages (``message(i)``, mirrored by tests/java/store/StoreWriter.java): single
sends spread over 4 queues, then one batch into queue 0, with keys, tags and a user property, into 4 KiB
CommitLog segments so that the files hold several segments ending in BLANK records. Each direction reads every
message back through the other implementation and checks it against what the producer was told: the msgId
(UNIQ_KEY), the offset msgId (store host + CommitLog offset, as the record holds them), queue, queue offset,
body, keys, tags and property. Exact counts, no duplicates; then a lookup by key.

The writing broker is always stopped cleanly first (SIGTERM), so the reader starts on a store that was shut down
normally, as after a migration from one implementation to the other.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from broker.client import Admin, Message, Producer, PullConsumer
from broker.remoting.loop import run
from cli.main import app
from expectations import rules
from lake import tables
from store.format import properties, records, units
from tests.fixtures_broker import TEST_CONF, MqlakeServer, count_topic, read_queue, stop_servers
from tests.helpers import wait_until
from tests.peers import JAVA_SOURCES, JavaCluster, compile_java, java

TOPIC = "PeerStore"
SINGLES, BATCH = 36, 8  # 44 messages: every key lookup fits one answer (RocketMQ's maxMsgsNumBatch is 64)
QUEUES = 4
JAVA_BROKERS = ("rocketmq-4-broker", "rocketmq-5")
CLIENT = "rocketmq-4"  # the Java programs run on the 4.9.8 client, which speaks to both brokers
# The store settings both implementations must share to open each other's files (a CommitLog or ConsumeQueue file
# of another size is refused at load): small CommitLog segments, the rest as the test brokers use them.
STORE_CONF = {
    "mappedFileSizeCommitLog": str(4096),
    **{k: TEST_CONF[k] for k in ("mappedFileSizeConsumeQueue", "maxHashSlotNum", "maxIndexNum", "brokerName")},
}
LOOKUPS = ("key-5", f"key-{SINGLES + 3}", "shared")  # one single send, one batch member, every message


def message(i: int) -> Message:
    """Message ``i`` as StoreWriter.message(i) builds it."""
    body = f"body-{i};" * (i % 7 + 1)
    return Message(TOPIC, body, tags=f"tag-{i % 3}", keys=[f"key-{i}", "shared"], properties={"seq": str(i)})


def expected(sent: list[dict]) -> dict[str, dict]:
    """msgId -> what reading it back must give, from the producer's send results."""
    out = {}
    for s in sent:
        m = message(s["seq"])
        out[s["msgId"]] = {
            "offsetMsgId": s["offsetMsgId"], "queueId": s["queueId"], "queueOffset": s["queueOffset"],
            "body": m.body_bytes(), "tags": m.tags, "keys": " ".join(m.keys or []), "seq": str(s["seq"]),
        }  # fmt: skip
    assert len(out) == SINGLES + BATCH, "every send got its own msgId"
    return out


def by_key(sent: list[dict], key: str) -> list[str]:
    keyed = [s["msgId"] for s in sent if key in " ".join(message(s["seq"]).keys or []).split()]
    assert keyed
    return sorted(keyed)


def assert_read_back(read: list[dict], sent: list[dict]) -> None:
    """``read`` (one dict per message received, in queue order) is exactly what ``sent`` acknowledged."""
    want = expected(sent)
    ids = [r["msgId"] for r in read]
    assert len(ids) == len(set(ids)) == len(want), f"{len(ids)} read ({len(set(ids))} distinct), {len(want)} sent"
    assert {r["msgId"]: {k: v for k, v in r.items() if k != "msgId"} for r in read} == want
    for q in range(QUEUES):  # each queue from offset 0 without a gap, as sent
        offsets = [r["queueOffset"] for r in read if r["queueId"] == q]
        assert offsets == list(range(len(offsets))), (q, offsets)


# -- mqlake writes, Apache RocketMQ reads --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory) -> Path:
    return compile_java(sorted((JAVA_SOURCES / "store").glob("*.java")), CLIENT, tmp_path_factory.mktemp("javac"))


@pytest.fixture(scope="module")
def mqlake_written(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A store mqlake wrote and shut down cleanly, and the send results its producer got."""
    server = MqlakeServer(tmp_path_factory.mktemp("mqlake-writes"), **STORE_CONF)
    try:
        server.start()

        async def send() -> list[dict]:
            sent = []
            async with Producer("peer_store_writer", server.namesrv_addr) as producer:
                queues = sorted(await producer.publish_queues(TOPIC), key=lambda mq: mq.queue_id)
                assert len(queues) == QUEUES
                for i in range(SINGLES):
                    r = await producer.send(message(i), queue=queues[i % QUEUES])
                    sent.append({"seq": i, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
                                 "queueId": r.queue.queue_id, "queueOffset": r.queue_offset})  # fmt: skip
                r = await producer.send_batch([message(i) for i in range(SINGLES, SINGLES + BATCH)], queues[0])
                for j, (mid, oid) in enumerate(zip(r.msg_id.split(","), r.offset_msg_id.split(","), strict=True)):
                    sent.append({"seq": SINGLES + j, "msgId": mid, "offsetMsgId": oid, "queueId": 0,
                                 "queueOffset": r.queue_offset + j})  # fmt: skip
            return sent

        sent = run(send())
        # the topic's queues as the producer creates them (defaultTopicQueueNums), and every send dispatched
        wait_until(lambda: count_topic(server.namesrv_addr, TOPIC) == len(sent), 30, what="every send dispatched")
    finally:
        stop_servers([server])
    assert len(segments(server.store_dir)) >= 2, "the messages span several CommitLog segments"
    return server.store_dir, sent


def segments(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "commitlog").iterdir())


@pytest.mark.integration
@pytest.mark.parametrize("peer", JAVA_BROKERS)
def test_java_broker_serves_a_store_mqlake_wrote(peer, mqlake_written, java_classes, tmp_path):
    written, sent = mqlake_written
    store = tmp_path / "store"
    shutil.copytree(written, store)
    with JavaCluster(peer, tmp_path / "java", store, **STORE_CONF) as cluster:
        proc = java("StoreReader", CLIENT, cluster.namesrv_addr, TOPIC, *LOOKUPS, classes=java_classes,
                    home=tmp_path / "client")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    read = [
        {
            "msgId": m["msgId"], "offsetMsgId": m["offsetMsgId"], "queueId": m["queueId"],
            "queueOffset": m["queueOffset"], "body": base64.b64decode(m["body"]), "tags": m["properties"]["TAGS"],
            "keys": m["properties"]["KEYS"], "seq": m["properties"]["seq"],
        }
        for m in out["messages"]
    ]  # fmt: skip
    assert_read_back(read, sent)
    for m in out["messages"]:  # the UNIQ_KEY property is the msgId, and the offset id names the record's offset
        assert m["properties"]["UNIQ_KEY"] == m["msgId"]
        assert int(m["offsetMsgId"][-16:], 16) == m["commitLogOffset"]
    assert {k: sorted(v) for k, v in out["byKey"].items()} == {k: by_key(sent, k) for k in LOOKUPS}


# -- Apache RocketMQ writes, mqlake reads -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=JAVA_BROKERS)
def java_written(request, java_classes, tmp_path_factory) -> tuple[str, Path, list[dict]]:
    """A store Apache RocketMQ's broker wrote (fed by its 4.9.8 producer) and shut down cleanly: (peer, store,
    the send results its producer got)."""
    peer = request.param
    work = tmp_path_factory.mktemp(f"{peer}-writes")
    store = work / "store"
    with JavaCluster(peer, work / "java", store, **STORE_CONF) as cluster:
        proc = java("StoreWriter", CLIENT, cluster.namesrv_addr, TOPIC, STORE_CONF["brokerName"], str(SINGLES),
                    str(BATCH), classes=java_classes, home=work / "client")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (store / "abort").exists(), "the Java broker shut down cleanly"
    assert len(segments(store)) >= 2, "the messages span several CommitLog segments"
    return peer, store, json.loads(proc.stdout)["sent"]


@pytest.mark.integration
def test_mqlake_serves_a_store_the_java_broker_wrote(java_written, tmp_path):
    _, written, sent = java_written
    server = MqlakeServer(tmp_path, **STORE_CONF)
    shutil.copytree(written, server.store_dir)
    try:
        server.start()

        async def read() -> tuple[list, dict[str, list[str]]]:
            async with PullConsumer("peer_store_reader", server.namesrv_addr) as consumer:
                queues = sorted(await consumer.fetch_queues(TOPIC), key=lambda mq: mq.queue_id)
                got = [m for mq in queues for m in await read_queue(consumer, mq)]
            async with Admin(server.namesrv_addr) as admin:
                keyed = {k: sorted(m.msg_id for m in await admin.query_msg_by_key(TOPIC, k)) for k in LOOKUPS}
            return got, keyed

        got, keyed = run(read())
    finally:
        stop_servers([server])
    read_back = [
        {
            "msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "queueId": m.queue_id, "queueOffset": m.queue_offset,
            "body": m.body, "tags": m.tags, "keys": m.keys, "seq": m.properties["seq"],
        }
        for m in got
    ]  # fmt: skip
    assert_read_back(read_back, sent)
    assert all(m.properties[properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == m.msg_id for m in got)
    assert keyed == {k: by_key(sent, k) for k in LOOKUPS}


@pytest.mark.spark
def test_java_written_store_verifies_and_tiers(java_written, spark, tmp_path):
    """``mqlake verify-index`` rebuilds the Java broker's ConsumeQueues and IndexFile from its CommitLog and finds
    them identical; ``mqlake tier`` then moves its sealed segments into Delta, every message once, as sent."""
    peer, written, sent = java_written
    store, lake = tmp_path / "store", tmp_path / "lake"
    shutil.copytree(written, store)
    verify = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store), "--json"])
    report = json.loads(verify.stdout)
    [index] = report["index_files"]
    # 5.x's IndexService also indexes each message's tag (key "topic#T#tags", docs/compatibility.md): one more
    # entry per message (each has a tag), and verify-index judges the store by that rule.
    per_message, rule = (4, "5.x") if peer == "rocketmq-5" else (3, "4.x")
    counts = (index["matched"], index["missing"], index["extra"], index["mismatched"])
    assert counts == (per_message * len(sent), 0, 0, 0), index
    assert verify.exit_code == 0, verify.output
    assert report["summary"]["ok"] and index["identical"], report["summary"]
    assert report["summary"]["index_rule"] == rule
    matched = {q["queue_id"]: q["matched"] for q in report["consume_queues"] if q["topic"] == TOPIC}
    assert matched == {q: sum(s["queueId"] == q for s in sent) for q in range(QUEUES)}
    assert all(q["files_identical"] for q in report["consume_queues"]), report["consume_queues"]

    sealed = segments(store)[:-1]  # the last one is the Java broker's active segment
    tier = CliRunner().invoke(app, ["tier", "--store-dir", str(store), "--lake", str(lake), "--file-reserved-time",
                                    "0", "--json"])  # fmt: skip
    assert tier.exit_code == 0, tier.output
    tiered = json.loads(tier.stdout.strip().splitlines()[-1])
    assert sorted(s["segment"] for s in tiered["segments"] if s["state"] == "tiered") == sealed, tiered

    size = int(STORE_CONF["mappedFileSizeCommitLog"])
    in_sealed = [s for s in sent if int(s["offsetMsgId"][-16:], 16) // size < len(sealed)]
    assert in_sealed, "the sealed segments hold messages"
    rows = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).to_pyarrow_table(
        columns=["topic", "uniq_key", "msg_id", "queue_id", "queue_offset", "body", "tags", "keys", "properties"]
    ).to_pylist()
    assert all(r["topic"] == TOPIC for r in rows)
    read = [
        {
            "msgId": r["uniq_key"], "offsetMsgId": r["msg_id"], "queueId": r["queue_id"],
            "queueOffset": r["queue_offset"], "body": r["body"], "tags": r["tags"], "keys": r["keys"],
            "seq": dict(r["properties"])["seq"],
        }
        for r in rows
    ]  # fmt: skip
    want = expected(sent)
    assert len(read) == len({r["msgId"] for r in read}) == len(in_sealed)
    assert {r["msgId"]: {k: v for k, v in r.items() if k != "msgId"} for r in read} == {
        s["msgId"]: want[s["msgId"]] for s in in_sealed
    }


@pytest.mark.unit
def test_size_rule_takes_properties_with_or_without_the_last_separator():
    """The tier's size rule accepts a record whose properties end without the separator after the last entry
    (Apache RocketMQ 4.9.x's broker writes them so) and still flags any other size."""
    props = {"KEYS": "k1", "TAGS": "t"}
    terminated = properties.encode_properties(props)
    size = records.record_length(0, 4, len(TOPIC), len(terminated))
    sizes = [size, size - 1, size - 2, size + 1, records.record_length(0, 4, len(TOPIC), 0) - 1]
    batch = pa.RecordBatch.from_pydict(
        {
            "msg_size": pa.array(sizes, pa.int32()), "sys_flag": pa.array([0] * 5, pa.int32()),
            "magic": pa.array([records.MESSAGE_MAGIC_V1] * 5, pa.int32()), "body_len": pa.array([4] * 5, pa.int32()),
            "topic": [TOPIC] * 5,
            "properties": pa.array([list(props.items())] * 4 + [[]], pa.map_(pa.string(), pa.string())),
        }
    )  # fmt: skip
    assert rules.size_mismatch(batch).to_pylist() == [False, False, True, True, True]


@pytest.mark.spark
def test_damaged_java_written_index_file_is_reported_against_its_rule(java_written, spark, tmp_path):
    """A slot of the Java broker's IndexFile that forgets its chain is reported against the rule that broker
    follows: the entries of the newest entry's key (5.x: the last message's tag key; 4.x: its last key, "shared")
    become unreachable, named by that key."""
    from pipelines.index_rebuild.live import LiveIndexFile

    peer, written, sent = java_written
    store = tmp_path / "store"
    shutil.copytree(written, store)
    slots, index_num = int(STORE_CONF["maxHashSlotNum"]), int(STORE_CONF["maxIndexNum"])
    [path] = sorted((store / "index").iterdir())
    live = LiveIndexFile(path, slots, index_num)
    last = live.entry(live.count - 1)
    data = bytearray(path.read_bytes())
    units.write_index_slot(data, last[0] % slots, 0)
    path.write_bytes(bytes(data))
    verify = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store), "--json"])
    assert verify.exit_code == 1, verify.output
    report = json.loads(verify.stdout)
    assert report["summary"]["index_rule"] == ("5.x" if peer == "rocketmq-5" else "4.x")
    [index] = report["index_files"]
    assert index["status"] == "mismatch" and index["unreachable"] >= 1 and index["missing"] == index["extra"] == 0
    slot = last[0] % slots
    assert all(p["kind"] == "unreachable" and p["slot"] == slot for p in index["problems"]), index["problems"]
    # Problems list the slot's entries oldest first: the newest entry's key is indexed from the first messages on.
    [seq] = [s["seq"] for s in sent if int(s["offsetMsgId"][-16:], 16) == last[1]]
    key = f"{records.TAG_INDEX_TYPE}#{message(seq).tags}" if peer == "rocketmq-5" else "shared"
    assert (TOPIC, key) in {(p["topic"], p["key"]) for p in index["problems"]}, index["problems"]
