"""Replay end to end: a real broker (``mqlake up``), 50,000 messages half tiered into Delta by the tiering job
and half still in the live CommitLog, real Spark tasks publishing through our asyncio Producer, and the target
read back with our PullConsumer and with the PyPI ``rocketmq`` (C++) client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker.client import Admin, Message, MessageExt, MessageQueue, Producer
from broker.client.errors import MQBrokerError, MQClientError
from broker.client.route import PERM_READ, PERM_WRITE
from broker.remoting.loop import run
from lake import delta as lk
from lake import tables
from pipelines.compaction.job import tier
from pipelines.replay import progress as prog
from pipelines.replay.job import replay
from pipelines.replay.sender import ORIGIN_MESSAGE_ID, REPLAY_ID, REPLAY_SOURCE_OFFSET, REPLAY_SOURCE_QUEUE, ReplayError
from pipelines.replay.spec import ReplaySpec, ReplaySpecError
from store.retention import SegmentManifest, SegmentState
from tests.aio import poll
from tests.fixtures_broker import MqlakeServer, count_topic, read_topic, stop_servers
from tests.helpers import kill_process_tree, signal_process_tree, wait_until

SOURCE = "ReplaySrc"
OTHER = "ReplayOther"
QUEUES = 4
TOTAL = 50_000
BATCH = 100
TAGS = ("TagA", "TagB", "TagC")
COLORS = ("red", "green", "blue", "white", "black")


@dataclass
class Sent:
    seq: int
    queue: int
    offset: int
    uniq_key: str
    body: bytes
    tags: str
    keys: str
    color: str
    phase: int


@dataclass
class History:
    server: MqlakeServer
    lake: Path
    messages: list[Sent]
    t_mid: int  # every phase-1 message is stored before it, every phase-2 message at or after it
    tiered_rows: int
    live_segments: int
    by_queue: dict[int, list[Sent]] = field(default_factory=dict)

    def spec(self, target: str, **kw) -> ReplaySpec:
        return ReplaySpec(lake=self.lake, source_topics=(SOURCE,), target_topic=target,
                          namesrv=self.server.namesrv_addr, store_dir=self.server.store_dir, **kw)  # fmt: skip


def _message(i: int) -> Message:
    # printable: the C++ client hands bodies over as C strings, which would end at a NUL byte
    body = f"replay body {i} ".encode() + bytes([97 + i % 26]) * (40 + i % 60)
    return Message(SOURCE, body, tags=TAGS[i % 3], keys=f"k{i} g{i % 100}",
                   properties={"color": COLORS[i % 5], "seq": str(i)})  # fmt: skip


async def _produce(namesrv: str, broker_addr: str, first: int, count: int, phase: int) -> list[Sent]:
    out: list[Sent] = []
    async with Admin(namesrv) as admin:
        await admin.create_topic(SOURCE, broker_addr=broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        await admin.create_topic(OTHER, broker_addr=broker_addr, read_queue_nums=2, write_queue_nums=2)
    async with Producer("replay_test_source", namesrv) as producer:
        queues = await _wait_queues(producer, SOURCE, QUEUES)
        for b in range(first // BATCH, (first + count) // BATCH):
            msgs = [_message(i) for i in range(b * BATCH, (b + 1) * BATCH)]
            mq = queues[b % QUEUES]
            res = await producer.send_batch(msgs, queue=mq)
            for n, (m, uniq) in enumerate(zip(msgs, res.msg_id.split(","), strict=True)):
                out.append(Sent(b * BATCH + n, mq.queue_id, res.queue_offset + n, uniq, m.body_bytes(), m.tags,
                                m.keys, m.properties["color"], phase))  # fmt: skip
        other = await _wait_queues(producer, OTHER, 2)
        for n in range(5):  # another topic in the same store: never replayed
            await producer.send_batch([Message(OTHER, f"other {n} {i}", tags="TagA", keys=f"k{i}")
                                       for i in range(BATCH)], queue=other[n % 2])  # fmt: skip
    return out


async def _wait_queues(producer: Producer, topic: str, n: int) -> list[MessageQueue]:
    """The topic's ``n`` queues once its route is on the NameServer (the broker registers a topic created on it
    with its next registration); any other error is raised at once."""

    async def routed() -> list[MessageQueue] | None:
        try:
            queues = await producer.publish_queues(topic, refresh=True)
        except MQBrokerError:
            raise
        except MQClientError:  # no route yet
            return None
        return queues if len(queues) >= n else None

    return await poll(routed, 30, what=f"a route to {n} queues of {topic}", interval=0.1)


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory) -> History:
    server = MqlakeServer(tmp_path_factory.mktemp("replay"), mappedFileSizeCommitLog=str(2 * 1024 * 1024)).start()
    try:
        sent = run(_produce(server.namesrv_addr, server.broker_addr, 0, TOTAL // 2, 1))
        t_mid = int(time.time() * 1000) + 1
        wait_until(lambda: time.time() * 1000 > t_mid, 1, what="the clock to pass the phase boundary")
        sent += run(_produce(server.namesrv_addr, server.broker_addr, TOTAL // 2, TOTAL // 2, 2))
        lake = server.work_dir / "lake"
        manifest = SegmentManifest(server.store_dir)
        # the broker lists sealed segments in its manifest on its own schedule (its 10 s clean pass, which also
        # expires them at once on a disk over 75 % full); the tiering job claims from the manifest
        closed = (SegmentState.SEALED, SegmentState.EXPIRED)
        wait_until(lambda: sum(e.state in closed for e in manifest.entries()) >= 6, 60,
                   what="the broker's segment manifest to list the sealed segments")  # fmt: skip
        report = tier(server.store_dir, lake, spark=spark, file_reserved_time=0, max_segments=4)
        assert len(report.by_state("tiered")) == 4, report.to_json()
        tiered = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).to_pyarrow_table(
            columns=["topic"], filters=[("topic", "=", SOURCE)]).num_rows  # fmt: skip
        live = [p for p in (server.store_dir / "commitlog").iterdir() if p.name not in
                {s.segment for s in report.by_state("tiered")}]  # fmt: skip
        # the history really spans both sources
        assert 0 < tiered < TOTAL and live
        h = History(server, lake, sent, t_mid, tiered, len(live))
        for s in sent:
            h.by_queue.setdefault(s.queue, []).append(s)
        for q in h.by_queue.values():
            q.sort(key=lambda s: s.offset)
    except BaseException:
        server.kill()  # the set-up's own error is the one to report
        raise
    yield h
    stop_servers([server])


def assert_replayed(got: dict[int, list[MessageExt]], want: dict[int, list[Sent]], replay_id: str) -> None:
    """Target queue q holds exactly ``want[q]``, in source order, with equal body/keys/tags and provenance."""
    assert sorted(q for q, msgs in got.items() if msgs) == sorted(q for q, s in want.items() if s)
    for q, expected in want.items():
        msgs = got.get(q, [])
        offsets = [int(m.properties[REPLAY_SOURCE_OFFSET]) for m in msgs]
        missing = sorted({s.offset for s in expected} - set(offsets))
        assert len(msgs) == len(expected), (f"target queue {q}: {len(msgs)} messages, expected {len(expected)}; "
                                            f"missing source offsets {missing[:10]}..{missing[-3:]}, target offsets "
                                            f"{msgs[0].queue_offset if msgs else None}..")  # fmt: skip
        for m, s in zip(msgs, expected, strict=True):
            assert (m.body, m.keys, m.tags) == (s.body, s.keys, s.tags), f"queue {q} offset {m.queue_offset}"
            p = m.properties
            assert p[REPLAY_SOURCE_OFFSET] == str(s.offset) and p[REPLAY_SOURCE_QUEUE] == str(s.queue)
            assert p[ORIGIN_MESSAGE_ID] == s.uniq_key and p[REPLAY_ID] == replay_id
            assert p["REPLAY_SOURCE_TOPIC"] == SOURCE and p["color"] == s.color and p["seq"] == str(s.seq)
            assert m.uniq_key and m.uniq_key != s.uniq_key  # a new message id; the origin is in ORIGIN_MESSAGE_ID


def expected_by_queue(history: History, pick) -> dict[int, list[Sent]]:
    return {q: [s for s in msgs if pick(s)] for q, msgs in history.by_queue.items()}


# Both engines: the Spark engine on the test session's executors, the local one in this process.
ENGINES = ("spark", "local")


def replay_with(engine: str, spark, spec: ReplaySpec):
    return replay(spec, spark=spark) if engine == "spark" else replay(spec, engine="local")


# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_replay_everything_tiered_and_live_then_rerun_sends_nothing(spark, history, engine):
    target, rid = f"ReplayAll_{engine}", f"all-{engine}"
    spec = history.spec(target, replay_id=rid)
    report = replay_with(engine, spark, spec)
    assert report.engine == engine and report.to_json()["engine"] == engine
    assert report.sent == TOTAL
    assert {(q["source_queue"], q["selected"], q["sent"]) for q in report.queues} == {
        (q, TOTAL // QUEUES, TOTAL // QUEUES) for q in range(QUEUES)
    }
    assert all(q["first_offset"] == 0 and q["last_offset"] == TOTAL // QUEUES - 1 for q in report.queues)
    assert all(q["source_topic"] == SOURCE for q in report.queues)  # the other topic is not replayed
    assert report.rate > 0 and report.send_seconds > 0
    assert_replayed(read_topic(history.server.namesrv_addr, target, TOTAL), history.by_queue, rid)

    stored = json.loads(Path(report.report_path).read_text())
    assert stored["sent"] == TOTAL and len(stored["queues"]) == QUEUES
    runs = lk.to_arrow(prog.table_uri(history.lake, prog.RUNS)).to_pylist()
    assert [(r["replay_id"], r["sent"]) for r in runs if r["run_id"] == report.run_id] == [(rid, TOTAL)]
    done = prog.read_progress(history.lake, rid)
    # a source queue is (broker, topic, queue id): the store's broker is broker-a (tests/fixtures_broker.py)
    assert {k: p.last_offset for k, p in done.items()} == {
        ("broker-a", SOURCE, q): TOTAL // QUEUES - 1 for q in range(QUEUES)
    }

    again = replay_with(engine, spark, spec)  # the same replay id: everything is recorded as done
    assert again.sent == 0 and again.total("already_done") == TOTAL
    assert sum(len(v) for v in read_topic(history.server.namesrv_addr, target, TOTAL).values()) == TOTAL


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_time_range_and_tag_filter_read_back_with_the_cpp_client(spark, history, engine):
    from rocketmq.client import PullConsumer as CppPullConsumer

    target = f"ReplayTags_{engine}"
    spec = history.spec(target, replay_id=f"tags-{engine}", from_ms=history.t_mid, tags=("TagA", "TagC"))
    report = replay_with(engine, spark, spec)
    want = expected_by_queue(history, lambda s: s.phase == 2 and s.tags in ("TagA", "TagC"))
    assert report.sent == sum(len(v) for v in want.values()) > 0

    wait_until(lambda: count_topic(history.server.namesrv_addr, target) >= report.sent, 30,
               what="the replayed messages dispatched")  # the C++ pull below stops at the queue's current end
    consumer = CppPullConsumer(f"replay_cpp_{os.getpid()}")
    consumer.set_namesrv_addr(history.server.namesrv_addr)
    consumer.start()
    try:
        got: dict[int, list] = {}
        for m in consumer.pull(target):
            got.setdefault(m.queue_id, []).append((m.queue_offset, m.body, m.keys.decode(), m.tags.decode(),
                                                    m.get_property(REPLAY_SOURCE_OFFSET).decode()))  # fmt: skip
    finally:
        consumer.shutdown()
    for q, expected in want.items():
        rows = [r[1:] for r in sorted(got.get(q, []))]  # in target queue order
        want_rows = [(s.body, s.keys, s.tags, str(s.offset)) for s in expected]
        diff = next((i for i, (a, b) in enumerate(zip(rows, want_rows, strict=False)) if a != b), None)
        assert rows == want_rows, f"queue {q}: {len(rows)} vs {len(want_rows)}, first difference at {diff}"


@pytest.mark.spark
def test_to_time_key_and_where_filters_select_exactly(spark, history):
    # Each filter removes rows the others keep: --keys all but these, --to the phase-2 ones (k49995 and half of
    # g5/g10), --where the ones that are not red (k3).  g5: the second key of every message with seq % 100 == 5.
    keys = ("g5", "g10", "k49995", "k3", "no-such-key")
    spec = history.spec("ReplayKeys", replay_id="keys-1", keys=keys, to_ms=history.t_mid,
                        where="properties['color'] = 'red'")  # fmt: skip
    report = replay(spec, spark=spark)
    want = expected_by_queue(history, lambda s: s.phase == 1 and s.seq % 100 in (5, 10))
    assert report.sent == sum(len(v) for v in want.values()) == TOTAL // 2 // 100 * 2
    assert_replayed(read_topic(history.server.namesrv_addr, "ReplayKeys", report.sent), want, "keys-1")


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_hash_queue_map_and_preserved_born_timestamps(spark, history, engine):
    keys = tuple(f"k{i}" for i in range(TOTAL - 400, TOTAL))  # the last 4 batches: one per source queue
    target = f"ReplayHash_{engine}"
    spec = history.spec(target, replay_id=f"hash-{engine}", queue_map="hash", keys=keys, preserve_timestamps=True)
    report = replay_with(engine, spark, spec)
    assert report.sent == 400
    by_queue = read_topic(history.server.namesrv_addr, target, 400)
    queues = [MessageQueue(target, "broker-a", q) for q in sorted(by_queue)]
    assert sum(len(v) for v in by_queue.values()) == 400 and len([q for q in by_queue.values() if q]) > 1
    for q, msgs in by_queue.items():
        # each key on the queue its hash picks (SelectMessageQueueByHash); each source queue's messages in order
        assert all(Producer.select_by_key(queues, m.key_list[0]).queue_id == q for m in msgs)
        for source_queue in range(QUEUES):
            offsets = [int(m.properties[REPLAY_SOURCE_OFFSET]) for m in msgs
                       if m.properties[REPLAY_SOURCE_QUEUE] == str(source_queue)]  # fmt: skip
            assert offsets == sorted(offsets)
    got = [m for msgs in by_queue.values() for m in msgs if m.key_list[0] in keys[-40:]]
    assert len(got) == 40

    async def source_born() -> dict[str, int]:
        async with Admin(history.server.namesrv_addr) as admin:
            return {k: (await admin.query_msg_by_key(SOURCE, k))[0].born_timestamp for k in keys[-40:]}

    born = run(source_born())
    assert {m.key_list[0]: m.born_timestamp for m in got} == born  # the source's, not the replay's send time
    assert all(m.store_timestamp > m.born_timestamp for m in got)


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_rate_limit_is_never_exceeded(spark, history, engine):
    rate = 2500.0
    target = f"ReplayRate_{engine}"
    if engine == "spark":  # two tasks, each at half the rate
        spec = history.spec(target, replay_id="rate-spark", rate=rate, where="cast(properties['seq'] as int) % 5 = 0")
        want, tasks = TOTAL // 5, 2
    else:  # one sender at the whole rate
        spec = history.spec(target, replay_id="rate-local", rate=rate, from_ms=history.t_mid, tags=("TagA",))
        want, tasks = sum(len(v) for v in expected_by_queue(history, lambda s: s.phase == 2 and s.tags == "TagA")
                          .values()), 1  # fmt: skip
    report = replay_with(engine, spark, spec)
    assert report.sent == want  # 3-4 s at the rate
    assert report.tasks == tasks and len(report.task_spans) == tasks
    # Counted against the broker's own store times, no window of the replay holds more messages than the budget
    # allows for its length: each task takes rate / tasks tokens a second from a bucket that starts empty and
    # holds at most one chunk (at most 1/20 s of its budget), and each source queue has at most one chunk in
    # flight, taken before the window but stored in it; store times are whole milliseconds. A slow or loaded
    # machine only spreads the sends further apart, so this bound cannot fail where the limit holds.
    chunk = rate / report.tasks / 20
    burst = (report.tasks + QUEUES) * chunk + rate / 1000
    got = read_topic(history.server.namesrv_addr, target, report.sent)
    stamps = sorted(m.store_timestamp for msgs in got.values() for m in msgs)
    assert len(stamps) == report.sent
    # max over windows [stamps[i], stamps[j]] of (j - i + 1) - rate * (stamps[j] - stamps[i]) / 1000, in one pass
    worst, best_start = float("-inf"), float("-inf")
    for j, t in enumerate(stamps):
        best_start = max(best_start, rate * t / 1000 - j)
        worst = max(worst, j + 1 - rate * t / 1000 + best_start)
    assert worst <= burst, f"{worst:.0f} messages above the budget in one window (allowed: {burst:.0f})"


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_dry_run_counts_and_maps_without_sending(spark, history, engine):
    spec = history.spec("ReplayDry", replay_id=f"dry-{engine}", dry_run=True, tags=("TagB",))
    report = replay_with(engine, spark, spec)
    per_queue = {q: sum(1 for s in msgs if s.tags == "TagB") for q, msgs in history.by_queue.items()}
    assert {q["source_queue"]: q["selected"] for q in report.queues} == per_queue
    assert {q["source_queue"]: q["target_queues"] for q in report.queues} == {q: str(q) for q in range(QUEUES)}
    assert report.sent == 0

    async def route():
        async with Admin(history.server.namesrv_addr) as admin:
            return await admin.topic_route("ReplayDry")

    assert run(route()) is None  # nothing created
    assert prog.read_progress(history.lake, f"dry-{engine}") == {}


@pytest.mark.spark
def test_bad_input_is_refused_clearly(spark, history):
    with pytest.raises(ReplaySpecError, match="--where"):
        replay(history.spec("ReplayBad", replay_id="bad-1", where="no_such_column = 1"), spark=spark)
    # a Spark SQL predicate: the local engine is refused it, and the default takes the Spark engine for it
    with pytest.raises(ReplaySpecError, match="--where .* needs --engine spark"):
        replay(history.spec("ReplayBad", replay_id="bad-2", where="queue_id = 1"), engine="local")
    with pytest.raises(ReplaySpecError, match="--engine 'java'"):
        replay(history.spec("ReplayBad", replay_id="bad-3"), engine="java")
    with pytest.raises(ReplaySpecError, match="before --to"):
        history.spec("ReplayBad", from_ms=2, to_ms=1)
    with pytest.raises(ReplaySpecError, match="replay itself"):
        history.spec(SOURCE)
    # an existing target the broker will not write to: refused before any send, and a rerun once it is
    # writable delivers everything once
    async def create(perm: int) -> None:
        async with Admin(history.server.namesrv_addr) as admin:
            await admin.create_topic("ReplayRO", broker_addr=history.server.broker_addr, perm=perm,
                                     read_queue_nums=QUEUES, write_queue_nums=QUEUES)  # fmt: skip

    run(create(PERM_READ))
    wait_until(lambda: route_perm_read_only(history), 30, what="the read-only route")
    spec = history.spec("ReplayRO", replay_id="ro-1", keys=("k5", "k6"))
    with pytest.raises(ReplayError, match="no writable queue"):
        replay(spec, spark=spark)
    run(create(PERM_READ | PERM_WRITE))
    wait_until(lambda: not route_perm_read_only(history), 30, what="the writable route")
    assert replay(spec, spark=spark).sent == 2
    assert sorted(m.keys for v in read_topic(history.server.namesrv_addr, "ReplayRO", 2).values() for m in v) == [
        "k5 g5", "k6 g6"]
    # a replay id resumed with another selection would skip by offsets that meant something else
    replay(history.spec("ReplaySpecA", replay_id="spec-1", keys=("k5",)), spark=spark)
    with pytest.raises(ReplaySpecError, match="other selection"):
        replay(history.spec("ReplaySpecA", replay_id="spec-1", keys=("k6",)), spark=spark)


@pytest.mark.unit
def test_cli_rejects_bad_options_before_spark(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    (tmp_path / "messages").mkdir()
    base = ["replay", "--lake", str(tmp_path), "--source-topic", "A", "--target-topic", "B", "--namesrv", "x:1"]
    for extra, message in ((["--from", "yesterday"], "--from"), (["--queue-map", "random"], "--queue-map"),
                           (["--replay-id", "bad id!"], "--replay-id"), (["--rate", "0"], "--rate"),
                           (["--engine", "java"], "--engine"),
                           (["--engine", "local", "--where", "queue_id = 1"], "needs --engine spark")):  # fmt: skip
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2, result.output
        assert message in result.output


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_sigkill_mid_replay_then_resume_loses_and_duplicates_nothing(spark, history, tmp_path, engine):
    target, rid = f"ReplayKill_{engine}", f"kill-{engine}"
    if engine == "spark":  # half the messages, by a Spark SQL predicate
        select = {"where": "cast(properties['seq'] as int) % 2 = 0"}
        want = expected_by_queue(history, lambda s: s.seq % 2 == 0)
        args = ["--where", select["where"], "--master", "local[2]", "--conf", "spark.driver.memory=1g"]
    else:  # two thirds of them, by tag
        select = {"tags": ("TagA", "TagB")}
        want = expected_by_queue(history, lambda s: s.tags in ("TagA", "TagB"))
        args = ["--tags", "TagA||TagB", "--engine", "local"]
    total = sum(len(v) for v in want.values())
    cmd = [
        sys.executable, "-m", "pipelines.replay", "--lake", str(history.lake), "--store-dir",
        str(history.server.store_dir), "--source-topic", SOURCE, "--target-topic", target, "--namesrv",
        history.server.namesrv_addr, "--replay-id", rid, "--rate", "3000", "--commit-every", "3000",
        "--commit-seconds", "60", *args,
    ]  # fmt: skip
    log = tmp_path / "replay.log"
    # C1-only JIT: the JVM starts seconds faster (as the spark fixture does); the job is small
    env = {**os.environ, "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
    try:

        def mid_way() -> bool:
            assert proc.poll() is None, log.read_text()
            recorded = prog.read_progress(history.lake, rid)
            done = sum(1 for (_, _, q), p in recorded.items() for s in want[q] if s.offset <= p.last_offset)
            # part-way, with sends acknowledged after the last progress commit: the window a restart must close
            return done > 0 and count_topic(history.server.namesrv_addr, target) >= done + 500

        def frozen_mid_way() -> bool:
            # the job is frozen while its state is read: part-way when seen is part-way when the kill lands, however
            # slow the check (the rate only keeps the part-way window wide enough to be seen between two checks)
            signal_process_tree(proc.pid, signal.SIGSTOP)
            if mid_way():
                return True
            signal_process_tree(proc.pid, signal.SIGCONT)
            return False

        try:
            # a new Spark session plus a scan of the history: allow for a machine busy with other suites
            wait_until(frozen_mid_way, 300, what="the replay to be part-way with progress recorded")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-3000:]}") from None
    finally:
        # SIGKILL the whole job: the driver, its Spark JVM and the Python workers sending for it
        kill_process_tree(proc.pid)
        proc.wait()
    # requests the killed job had already written may still be stored by the broker after the kill
    assert 0 < count_topic(history.server.namesrv_addr, target) < total

    report = replay_with(engine, spark, history.spec(target, replay_id=rid, **select))
    assert report.total("found_in_target") > 0  # the unrecorded window was found in the target, not resent
    assert report.sent + report.total("already_done") + report.total("found_in_target") == total
    # each exactly once, in order
    assert_replayed(read_topic(history.server.namesrv_addr, target, total), want, rid)


@pytest.mark.spark
def test_progress_committed_after_the_plan_is_honoured_and_counted(spark, history, monkeypatch):
    # A killed run's Python worker can finish its last progress commit after a rerun's driver has read the
    # progress (PySpark keeps its workers out of the job's process group). The driver then ships rows that
    # the tasks, reading the progress again, find done: they must neither resend them nor leave them out of
    # the report. Here the driver is handed the progress as it was before the first run's sends.
    target, rid = "ReplayLate", "late-1"
    spec = history.spec(target, replay_id=rid, keys=("g7",))
    first = replay(spec, spark=spark)
    want = expected_by_queue(history, lambda s: s.seq % 100 == 7)
    assert first.sent == sum(len(v) for v in want.values()) > 0
    real = prog.read_progress
    monkeypatch.setattr(prog, "read_progress", lambda lake, replay_id: {
        k: prog.QueueProgress(-1, {}, p.spec_hash) for k, p in real(lake, replay_id).items()})  # fmt: skip
    again = replay(spec, spark=spark)
    assert again.tasks > 0  # the driver planned sends...
    assert (again.sent, again.total("found_in_target")) == (0, 0)  # ...the tasks knew better
    assert again.total("already_done") == again.total("selected") == first.sent
    assert_replayed(read_topic(history.server.namesrv_addr, target, first.sent), want, rid)


def route_perm_read_only(history: History) -> bool:
    async def go() -> bool:
        async with Admin(history.server.namesrv_addr) as admin:
            route = await admin.topic_route("ReplayRO")
            return route is not None and not route.publish_queues("ReplayRO")

    return run(go())


@pytest.mark.spark
def test_partition_keys_land_where_spark_places_them(spark):
    """The placement keys are found without a Spark job: Spark's own hash and repartition must agree."""
    from pyspark.sql import functions as F

    from pipelines.replay.job import _partition_keys, spark_hash_long

    ids = [*range(-300, 300), 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]
    got = spark.createDataFrame([(i,) for i in ids], "id bigint").select("id", F.hash("id").alias("h")).collect()
    assert {r["id"]: r["h"] for r in got} == {i: spark_hash_long(i) for i in ids}
    for tasks in (1, 2, 5, 8):
        keys = _partition_keys(tasks)
        df = spark.createDataFrame([(k,) for k in keys], "k bigint").repartition(tasks, "k")
        placed = df.rdd.mapPartitionsWithIndex(lambda i, rows: [(i, r["k"]) for r in rows]).collect()
        assert sorted(placed) == [(i, keys[i]) for i in range(tasks)]
