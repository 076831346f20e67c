"""Two broker groups in one cluster, one lake: ``broker-a`` and ``broker-b`` (each ``mqlake broker`` with its own
store and ports) under one ``mqlake namesrv``, on loopback, with 64 KiB CommitLog segments and the same
``lakePath``.

The module's fixture creates a topic on every master of the cluster (``mqlake admin updateTopic -c``),
produces to it with the stock C++ client (PyPI ``rocketmq``) through the NameServer's merged route, reads each
broker's queues back as the truth, then tiers both stores into the one lake with the shared Spark session:
broker-a's with one run, broker-b's with two runs started at once (one claims, the other finds nothing to do),
and waits for both brokers' clean passes to delete the tiered segments.  No run names the broker: each takes
the name its broker recorded in the store (``mqlake.json``).  The tests then query, read through
the brokers and replay, and assert against that truth.  Both brokers' queue ids, queue offsets, segment names
and CommitLog offsets overlap, so any read that mixes the brokers up returns the other broker's bodies.
"""

from __future__ import annotations

import io
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.client import Admin, PullConsumer
from broker.remoting.loop import run
from tests.fixtures_broker import MqlakeServer, read_queue, stop_servers
from tests.helpers import wait_until
from tests.tiering_broker import tiering_conf, wait_deleted, wait_sealed

# the module's fixture (three servers, the sends, two stores tiered) runs within its first test's time limit
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

TOPIC = "TwoBrokersT"
BROKERS = ("broker-a", "broker-b")
QUEUES = 4
COUNT = 800

Truth = dict[tuple[str, int], list[bytes]]  # (broker, queue id) -> bodies in queue-offset order


@dataclass
class Cluster:
    namesrv: MqlakeServer
    brokers: dict[str, MqlakeServer]
    lake: Path
    truth: Truth
    reports: dict[str, list]  # broker -> its tier runs' reports


def _body(i: int) -> bytes:
    return f"two-{i:04d}-".encode() + bytes([65 + i % 26]) * 300  # no NUL: the C++ binding reads C strings


def _sent(producer, message) -> bool:
    """One ``send_sync``; False when the C++ client failed every attempt at once because its heartbeat thread held
    its connection table, connecting to brokers it has just learnt of (its log: "GetTransport of ... get
    timed_mutex timeout", then "No route info"): nothing reached a broker, so the send may be made again."""
    from rocketmq.exceptions import ProducerSendSyncFailed

    try:
        producer.send_sync(message)
    except ProducerSendSyncFailed as e:
        assert "No route info" in str(e), e  # the route is on the NameServer (waited for): any other is a failure
        return False
    return True


def _send_with_cpp_client(namesrv: str) -> None:
    from rocketmq.client import Message, Producer

    p = Producer("pg_two_brokers")
    p.set_namesrv_addr(namesrv)
    p.start()
    try:
        for i in range(COUNT):
            m = Message(TOPIC)
            m.set_keys(f"key-{i}")
            m.set_tags(f"T{i % 3}")
            m.set_body(_body(i))
            wait_until(lambda m=m: _sent(p, m), 30, what=f"the C++ client to send message {i}")
    finally:
        p.shutdown()


def read_all(namesrv: str, topic: str, start: int | None = None) -> dict[tuple[str, int], list]:
    """(broker, queue id) -> the messages of every queue of ``topic``, through the brokers."""

    async def go():
        async with PullConsumer("cg_two_brokers_reader", namesrv) as c:
            queues = await c.fetch_queues(topic)
            return {(mq.broker_name, mq.queue_id): await read_queue(c, mq, start) for mq in queues}

    return run(go())


def _brokers_in_route(namesrv: str, topic: str) -> set[str]:
    async def go() -> set[str]:
        async with Admin(namesrv) as admin:
            route = await admin.topic_route(topic)
            return {q.broker_name for q in route.publish_queues(topic)} if route else set()

    return run(go())


def _tier_at_once(store_dir: Path, lake: Path, spark) -> list:
    """Two tier runs of one store started together (a barrier), each in its own thread on the shared session."""
    from pipelines.compaction.job import TierJob

    jobs = [TierJob(store_dir, lake, spark=spark, file_reserved_time=0) for _ in range(2)]
    barrier = threading.Barrier(len(jobs))
    reports: list = [None] * len(jobs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait(30)
            reports[i] = jobs[i].run()
        except BaseException as e:  # re-raised by the fixture
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if errors:
        raise errors[0]
    return reports


@pytest.fixture(scope="module")
def cluster(spark, tmp_path_factory) -> Cluster:
    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.compaction.job import tier

    work = tmp_path_factory.mktemp("two_brokers")
    lake = work / "lake"
    servers: list[MqlakeServer] = []
    try:
        ns = MqlakeServer(work / "namesrv", command="namesrv")
        servers.append(ns)
        ns.start()
        brokers = {}
        for name in BROKERS:
            b = MqlakeServer(work / name, command="broker", namesrvAddr=ns.namesrv_addr, brokerName=name,
                             autoCreateTopicEnable="false", **tiering_conf(lake))  # fmt: skip
            servers.append(b)
            brokers[name] = b.start()
        # mqadmin updateTopic -c: the topic on every master of the cluster, as RocketMQ creates it
        created = CliRunner().invoke(app, ["admin", "updateTopic", "-t", TOPIC, "-c", "DefaultCluster", "-n",
                                           ns.namesrv_addr, "-r", str(QUEUES), "-w", str(QUEUES)])  # fmt: skip
        assert created.exit_code == 0, created.output
        wait_until(lambda: _brokers_in_route(ns.namesrv_addr, TOPIC) == set(BROKERS), 30,
                   what="the NameServer's route to list both brokers' queues")  # fmt: skip
        _send_with_cpp_client(ns.namesrv_addr)
        wait_until(lambda: sum(len(v) for v in read_all(ns.namesrv_addr, TOPIC).values()) == COUNT, 30,
                   what="every message sent to be consumable")  # fmt: skip
        truth = {k: [m.body for m in v] for k, v in read_all(ns.namesrv_addr, TOPIC).items()}
        for name in BROKERS:
            wait_sealed(brokers[name].store_dir, 2, who=name)
        reports = {
            "broker-a": [tier(brokers["broker-a"].store_dir, lake, spark=spark, file_reserved_time=0)],
            "broker-b": _tier_at_once(brokers["broker-b"].store_dir, lake, spark),
        }
        for name in BROKERS:
            bases = [s.base_offset for r in reports[name] for s in r.segments if s.state == "tiered"]
            wait_deleted(brokers[name].store_dir, bases, who=name)
        yield Cluster(ns, brokers, lake, truth, reports)
    finally:
        stop_servers(list(reversed(servers)))


def _tiered_counts(lake: Path) -> dict[tuple[str, int], int]:
    """(broker, queue) -> rows of the topic in the lake, through ``mqlake sql``'s entry point."""
    from pipelines.sql_cli import run_sql

    out, err = io.StringIO(), io.StringIO()
    query = f"SELECT broker_name, queue_id, count(*) AS n FROM messages WHERE topic = '{TOPIC}' GROUP BY 1, 2"
    assert run_sql(lake, query, output="json", out=out, err=err) == 0, err.getvalue()
    return {(r["broker_name"], r["queue_id"]): r["n"] for r in map(json.loads, out.getvalue().splitlines())}


def test_the_stock_client_spread_its_sends_over_both_brokers(cluster) -> None:
    per_broker = Counter({b: 0 for b in BROKERS})
    for (broker, _), bodies in cluster.truth.items():
        per_broker[broker] += len(bodies)
    assert sum(per_broker.values()) == COUNT and min(per_broker.values()) > COUNT // 4, per_broker
    assert sorted(b for v in cluster.truth.values() for b in v) == sorted(_body(i) for i in range(COUNT))


def test_two_tier_runs_at_once_on_one_store_one_claims_the_other_finds_nothing(cluster) -> None:
    first, second = sorted(cluster.reports["broker-b"], key=lambda r: len(r.segments))
    assert second.segments and all(s.state == "tiered" for s in second.segments), second.segments
    assert first.segments == [] and first.messages_version is None
    assert first.broker_name == second.broker_name == "broker-b"


def test_sql_counts_each_brokers_history_in_the_one_lake(cluster, spark) -> None:
    from lake import delta as lk
    from lake import tables
    from pipelines import spark_tables

    counts = _tiered_counts(cluster.lake)
    for name in BROKERS:
        tiered_rows = sum(s.rows for r in cluster.reports[name] for s in r.segments if s.state == "tiered")
        assert sum(n for (b, _), n in counts.items() if b == name) == tiered_rows > 0
    # every row is its broker's record at its queue offset: the tiered prefix of each of that broker's queues
    rows = (
        spark_tables.read_table(spark, tables.table_uri(cluster.lake, tables.MESSAGES))
        .where(f"topic = '{TOPIC}'")
        .select("broker_name", "queue_id", "queue_offset", "body")
        .collect()
    )
    assert len(rows) == sum(counts.values())
    for r in rows:
        assert bytes(r["body"]) == cluster.truth[(r["broker_name"], r["queue_id"])][r["queue_offset"]]
    segments = lk.to_arrow(tables.table_uri(cluster.lake, tables.SEGMENTS)).to_pylist()
    assert {s["broker_name"] for s in segments} == set(BROKERS)
    # the same 20-digit segment names on both brokers, told apart by the broker
    names = {b: {s["segment"] for s in segments if s["broker_name"] == b} for b in BROKERS}
    assert names["broker-a"] & names["broker-b"]


def test_a_store_cannot_be_tiered_under_another_brokers_name(cluster) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.compaction.job import TierJob

    store = cluster.brokers["broker-a"].store_dir
    refused = CliRunner().invoke(app, ["tier", "--store-dir", str(store), "--lake", str(cluster.lake),
                                       "--broker-name", "broker-b"])  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert f"{store / 'mqlake.json'} says brokerName=broker-a, the flags say broker-b" in refused.output
    # a flag that agrees with the store is no contradiction; none at all: the store's own name
    assert TierJob(store, cluster.lake, broker_name="broker-a").broker_name == "broker-a"
    assert TierJob(cluster.brokers["broker-b"].store_dir, cluster.lake).broker_name == "broker-b"


def test_each_row_is_in_the_lake_once_under_its_own_broker(cluster) -> None:
    from lake import delta as lk
    from lake import tables

    rows = lk.to_arrow(tables.table_uri(cluster.lake, tables.MESSAGES), [("topic", "=", TOPIC)])
    keys = Counter(zip(*(rows.column(c).to_pylist() for c in ("broker_name", "queue_id", "queue_offset")),
                       strict=True))  # fmt: skip
    assert keys and max(keys.values()) == 1
    # the same queue ids and offsets on both brokers, each in its own partition
    per_broker = {b: {(q, o) for (name, q, o) in keys if name == b} for b in BROKERS}
    assert per_broker["broker-a"] & per_broker["broker-b"]
    commits = lk.open_table(tables.table_uri(cluster.lake, tables.MESSAGES)).history()
    stores = {c["mqlake.tier.broker"]: c["mqlake.tier.store"] for c in commits if "mqlake.tier.segments" in c}
    assert set(stores) == set(BROKERS) and len(set(stores.values())) == 2
    # the names came from the stores (no run was given one)
    assert {(r.broker_name, r.broker_cluster_name) for b in BROKERS for r in cluster.reports[b]} == {
        ("broker-a", "DefaultCluster"), ("broker-b", "DefaultCluster")}  # fmt: skip


def test_a_second_store_under_a_brokers_name_is_refused_before_its_commit(cluster, tmp_path) -> None:
    """A new broker-a (its own store, its own NameServer) writes the same topic's queues from offset 0; tiering
    its store into the lake, with no flag, is refused before anything is committed."""
    from typer.testing import CliRunner

    from cli.main import app
    from lake import delta as lk
    from lake import tables
    from store.retention import SegmentManifest, SegmentState
    from tests.tiering_broker import produce

    conf = {k: v for k, v in tiering_conf(cluster.lake).items() if k != "lakePath"}  # no schedule of its own
    second = MqlakeServer(tmp_path / "second-a", brokerName="broker-a", defaultTopicQueueNums=str(QUEUES), **conf)
    try:
        second.start()
        run(produce(second.namesrv_addr, TOPIC, 450, "second"))
        wait_sealed(second.store_dir, 1, who="the second broker-a")
        messages = tables.table_uri(cluster.lake, tables.MESSAGES)
        before = lk.open_table(messages).version()
        refused = CliRunner().invoke(app, ["tier", "--store-dir", str(second.store_dir), "--lake", str(cluster.lake),
                                           "--file-reserved-time", "0"])  # fmt: skip
        assert refused.exit_code == 2, refused.output
        assert "under broker_name=broker-a from another store" in refused.output
        assert "a second store under one broker name: nothing was committed" in refused.output
        assert lk.open_table(messages).version() == before
        states = {e.file_name: e.state for e in SegmentManifest(second.store_dir).entries()}
        assert SegmentState.SEALED in states.values() or SegmentState.EXPIRED in states.values()
        assert not {SegmentState.TIERED, SegmentState.QUARANTINED, SegmentState.TIERING} & set(states.values())
        assert all((second.store_dir / "commitlog" / name).exists() for name in states)
    finally:
        stop_servers([second])


def test_each_broker_serves_only_its_own_tiered_history(cluster) -> None:
    from lake.reader import LakeReader
    from store.format.records import decode_record

    counts = _tiered_counts(cluster.lake)
    for name in BROKERS:
        reader = LakeReader(cluster.lake, broker_name=name)
        for q in range(QUEUES):
            n = counts.get((name, q), 0)
            pulled = reader.pull(TOPIC, q, 0, n, n, 1 << 30) if n else None
            got = [decode_record(bytes(m), check_crc=True).body for m in pulled.messages] if pulled else []
            assert got == cluster.truth[(name, q)][:n]
    # through the wire: both brokers' queues read from offset 0, their tiered prefix deleted locally
    through = read_all(cluster.namesrv.namesrv_addr, TOPIC, start=0)
    assert {k: [m.body for m in v] for k, v in through.items()} == cluster.truth
    assert all(counts.get((name, 0), 0) > 0 for name in BROKERS)  # queue 0 of each came from the tier


def test_the_stock_cpp_client_consumes_every_message_once_across_both_brokers(cluster) -> None:
    from rocketmq.client import PullConsumer as CppPullConsumer

    class PerBrokerOffsets(CppPullConsumer):
        # The Python binding keeps each queue's next offset under "topic@queueId" (its own bookkeeping, in Python),
        # so broker-b's queue 0 would start where broker-a's queue 0 ended: key it by broker too, as the C++
        # and Java clients' MessageQueue does.
        def _get_mq_key(self, mq) -> str:
            return f"{mq.topic}@{mq.brokerName}@{mq.queueId}"

    c = PerBrokerOffsets("cg_cpp_two_brokers")
    c.offset_table = {}  # the binding shares one offset table between consumers: this one starts at 0
    c.set_namesrv_addr(cluster.namesrv.namesrv_addr)
    c.start()
    got: Counter[bytes] = Counter()
    try:

        def pull_all() -> bool:
            for msg in c.pull(TOPIC):
                got[msg.body] += 1
            return sum(got.values()) >= COUNT

        wait_until(pull_all, 60, what="the C++ pull consumer to read the topic from both brokers")
    finally:
        c.shutdown()
    assert got == Counter(_body(i) for i in range(COUNT))


def test_replay_sends_both_brokers_history_into_a_topic_spread_over_both(cluster, spark) -> None:
    from pipelines.replay.job import replay
    from pipelines.replay.sender import REPLAY_SOURCE_BROKER, REPLAY_SOURCE_QUEUE
    from pipelines.replay.spec import ReplaySpec

    target = "TwoBrokersReplayed"
    counts = _tiered_counts(cluster.lake)
    # batch_size: a batch request is one message to the broker, and must fit its 64 KiB segments
    spec = ReplaySpec(lake=cluster.lake, source_topics=(TOPIC,), target_topic=target,
                      namesrv=cluster.namesrv.namesrv_addr, replay_id="two-brokers-1", batch_size=32)  # fmt: skip
    report = replay(spec, spark=spark)
    assert report.sent == sum(counts.values())
    assert {(q["source_broker"], q["source_queue"]): q["sent"] for q in report.queues} == counts

    def landed() -> dict:
        got = read_all(cluster.namesrv.namesrv_addr, target)
        return got if sum(len(v) for v in got.values()) == report.sent else {}

    got = wait_until(landed, 30, what="the replayed messages to be consumable")
    assert {b for (b, _), msgs in got.items() if msgs} == set(BROKERS)  # spread over both brokers
    for (broker, queue), msgs in got.items():
        # --queue-map preserve: a source queue lands in the queue of the same id on its own broker, in order
        assert {(m.properties[REPLAY_SOURCE_BROKER], m.properties[REPLAY_SOURCE_QUEUE]) for m in msgs} <= {
            (broker, str(queue))
        }
        assert [m.body for m in msgs] == cluster.truth[(broker, queue)][: counts.get((broker, queue), 0)]


def test_replay_reads_each_brokers_tier_and_live_store_into_a_topic_exactly_once(cluster) -> None:
    """``mqlake replay --broker-store NAME=PATH`` per broker: every broker's tiered rows (their segments deleted
    from the stores) and each store's live, untiered records, joined at each broker's tier boundary."""
    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.replay.sender import REPLAY_SOURCE_BROKER, REPLAY_SOURCE_OFFSET, REPLAY_SOURCE_QUEUE

    target = "TwoBrokersAllHistory"
    tiered = _tiered_counts(cluster.lake)
    for name in BROKERS:  # each broker's history is split: a tiered prefix, and a live rest
        live = sum(len(v) for (b, _), v in cluster.truth.items() if b == name)
        assert 0 < sum(n for (b, _), n in tiered.items() if b == name) < live
    stores = [arg for name in BROKERS for arg in ("--broker-store", f"{name}={cluster.brokers[name].store_dir}")]
    result = CliRunner().invoke(app, [
        "replay", "--lake", str(cluster.lake), "--source-topic", TOPIC, "--target-topic", target,
        "--namesrv", cluster.namesrv.namesrv_addr, "--replay-id", "two-brokers-live", "--batch-size", "32",
        "--json", *stores,
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sent"] == COUNT
    assert {(q["source_broker"], q["source_queue"]): q["sent"] for q in report["queues"]} == {
        k: len(v) for k, v in cluster.truth.items()
    }

    def landed() -> dict:
        got = read_all(cluster.namesrv.namesrv_addr, target)
        return got if sum(len(v) for v in got.values()) == COUNT else {}

    got = wait_until(landed, 30, what="the replayed messages to be consumable")
    assert Counter(m.body for msgs in got.values() for m in msgs) == Counter(_body(i) for i in range(COUNT))
    assert {b for (b, _), msgs in got.items() if msgs} == set(BROKERS)
    for (broker, queue), msgs in got.items():
        # each source queue whole, in its order, in the queue of the same id on its own broker
        assert [(m.properties[REPLAY_SOURCE_BROKER], m.properties[REPLAY_SOURCE_QUEUE]) for m in msgs] == [
            (broker, str(queue))
        ] * len(msgs)
        assert [int(m.properties[REPLAY_SOURCE_OFFSET]) for m in msgs] == list(range(len(msgs)))
        assert [m.body for m in msgs] == cluster.truth[(broker, queue)]


FRESH_TOPIC = "TwoBrokersFresh"


def test_messages_all_holds_each_brokers_history_once_and_a_shell_sees_a_later_send(cluster) -> None:
    """``mqlake sql --shell`` with both brokers' stores: ``messages_all`` holds both brokers' tiered prefix (their
    segments deleted from the stores) and live rest of every queue, each record once; a message sent to each broker
    after the session started is in a later statement of the same session (the shell on the suite's Spark session,
    its statements read one by one as a terminal would give them)."""
    from typer.testing import CliRunner

    from broker.client import Message, MessageQueue, Producer
    from cli.main import app
    from pipelines.sql_cli import live_stores, run_shell

    created = CliRunner().invoke(app, ["admin", "updateTopic", "-t", FRESH_TOPIC, "-c", "DefaultCluster", "-n",
                                       cluster.namesrv.namesrv_addr, "-r", "1", "-w", "1"])  # fmt: skip
    assert created.exit_code == 0, created.output
    wait_until(lambda: _brokers_in_route(cluster.namesrv.namesrv_addr, FRESH_TOPIC) == set(BROKERS), 30,
               what="the NameServer's route to list both brokers' queues")  # fmt: skip
    tiered = _tiered_counts(cluster.lake)
    for name in BROKERS:  # each broker's history is split: a tiered prefix, and a live rest
        assert 0 < sum(n for (b, _), n in tiered.items() if b == name) < COUNT
    stores = live_stores(cluster.lake, [cluster.brokers[name].store_dir for name in BROKERS])
    assert [b for b, _ in stores] == list(BROKERS)  # each store named by the broker that wrote it

    async def send_to_each_broker() -> None:
        async with Producer("pg_two_brokers_fresh", cluster.namesrv.namesrv_addr) as p:
            for name in BROKERS:
                await p.send(Message(FRESH_TOPIC, f"fresh-{name}".encode()), MessageQueue(FRESH_TOPIC, name, 0))

    fresh = f"CAST(body AS STRING) AS body, broker_name FROM messages_all WHERE topic = '{FRESH_TOPIC}'"

    def typed_in() -> Iterator[str]:
        yield (f"SELECT 'all' AS s, broker_name, queue_id, queue_offset, CAST(body AS STRING) AS body\n"
               f"  FROM messages_all WHERE topic = '{TOPIC}';")  # fmt: skip
        yield f"SELECT 'before' AS s, {fresh};"
        run(send_to_each_broker())  # the shell asks for its next line once 'before' has answered
        yield f"SELECT 'after' AS s, {fresh};"

    out, err = io.StringIO(), io.StringIO()
    assert run_shell(cluster.lake, output="json", stores=stores, lines=typed_in(), out=out, err=err) == 0, (
        err.getvalue())  # fmt: skip
    rows: dict[str, list[dict]] = {}
    for r in map(json.loads, out.getvalue().splitlines()):
        rows.setdefault(r.pop("s"), []).append(r)
    got: dict[tuple[str, int], list] = {}
    for r in sorted(rows["all"], key=lambda r: (r["broker_name"], r["queue_id"], r["queue_offset"])):
        got.setdefault((r["broker_name"], r["queue_id"]), []).append((r["queue_offset"], r["body"].encode()))
    assert got == {k: list(enumerate(v)) for k, v in cluster.truth.items()}  # every offset once, no gap
    assert "before" not in rows  # no row yet
    assert sorted((r["broker_name"], r["body"]) for r in rows["after"]) == [(b, f"fresh-{b}") for b in BROKERS]
    stats = [line.split(",")[0] for line in err.getvalue().splitlines() if line.startswith("(")]
    assert stats == [f"({COUNT} rows", "(0 rows", "(2 rows"]
