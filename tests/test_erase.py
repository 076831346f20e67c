"""``mqlake lake erase`` (pipelines/erase.py): messages erased by topic and key leave the tiered history — the
broker's fall-through reads and queries by key, Spark SQL, and every data file on disk — an audit row records
it, and the copies still in the live CommitLog are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lake import delta as lake
from lake.reader import LakeReader
from pipelines import spark_tables
from pipelines.erase import ERASURES, erase

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # a DELETE and a VACUUM on a busy machine

TOPIC, KEY = "Payments", "g3"


def _holds_key(row: dict) -> bool:
    return row["topic"] == TOPIC and KEY in (row["keys"] or "").split(" ")


def test_erase_by_key_leaves_no_trace_in_the_tier_and_names_the_live_copies(spark, spark_lake, spark_store, tmp_path):
    root = tmp_path / "lake"
    shutil.copytree(spark_lake, root)
    tiered = spark_store.sealed_rows()
    erased = sorted(o for o, r in tiered.items() if _holds_key(r))
    kept = sorted(o for o, r in tiered.items() if not _holds_key(r))[::9]
    assert erased
    before = LakeReader(root)
    assert all(before.message_at(o) for o in erased)
    assert len(before.query_key(TOPIC, KEY, 1000, 0, 2**62)) == len(erased)
    kept_records = {o: before.message_at(o) for o in kept}

    report = erase(spark, root, TOPIC, key=KEY, retain_hours=0, store_dir=spark_store.root, operator="dpo")

    assert report.rows == len(erased)
    live = sorted(o for o, r in spark_store.expected.items() if _holds_key(r))  # the store still has every segment
    assert sorted(m["commitlog_offset"] for m in report.live) == live
    # the broker's fall-through reads and queries by key: the erased are gone, the others served as before
    after = LakeReader(root)
    assert [after.message_at(o) for o in erased] == [None] * len(erased)
    assert after.query_key(TOPIC, KEY, 1000, 0, 2**62) == []
    assert {o: after.message_at(o) for o in kept} == kept_records
    # Spark SQL over the lake's tables
    spark_tables.register(spark, root)
    assert spark.sql(
        f"SELECT count(*) FROM messages WHERE topic = '{TOPIC}' AND array_contains(split(keys, ' '), '{KEY}')"
    ).first()[0] == 0
    assert spark.table("messages").count() == len(tiered) - len(erased)
    # and no data file left on disk holds an erased row (VACUUM after a retention of 0 hours)
    for f in (root / "messages").rglob("*.parquet"):
        offsets = set(pq.read_table(f, columns=["commitlog_offset"]).column(0).to_pylist())
        assert not offsets & set(erased), f
    # the audit row
    audit = lake.to_arrow(root / ERASURES).to_pylist()
    assert [(a["operator"], a["topic"], a["key"], a["rows"]) for a in audit] == [("dpo", TOPIC, KEY, len(erased))]
    assert audit[0]["live_commitlog_offsets"] == live and audit[0]["erased_at"] is not None


@pytest.mark.timeout(1800)  # a tier run, two erases and a replay, each Spark jobs, on a busy machine
def test_erase_by_msg_id_through_the_cli_and_a_replay_after_it_sends_every_other_message(
    spark, tmp_path, mqlake_server
):
    """``mqlake lake erase --msg-id`` on a lake the tier job wrote: by the msgId a producer is given (UNIQ_KEY) and
    by the offset msgId, one message each; a replay afterwards sends every other message of the topic, tiered and
    live, and not the erased two."""
    import json

    from typer.testing import CliRunner

    from cli.main import app
    from pipelines.compaction.job import tier
    from pipelines.replay.job import replay
    from pipelines.replay.sender import ORIGIN_MESSAGE_ID, REPLAY_SOURCE_OFFSET, REPLAY_SOURCE_QUEUE
    from pipelines.replay.spec import ReplaySpec
    from tests.fixtures_broker import read_topic
    from tests.fixtures_spark import write_store

    topic = "Orders"
    written = write_store(tmp_path / "store", 300)
    root = tmp_path / "lake"
    report = tier(written.root, root, spark=spark, file_reserved_time=0)
    tiered = {s.segment for s in report.by_state("tiered")}
    rows = sorted((r for r in written.expected.values() if r["topic"] == topic), key=lambda r: r["commitlog_offset"])
    in_lake = [r for r in rows if r["segment"] in tiered]
    assert tiered and len(in_lake) < len(rows), "the topic is both tiered and live"
    by_uniq = next(r for r in in_lake if r["uniq_key"])
    by_offset_id = next(r for r in reversed(in_lake) if r["uniq_key"] is None)  # its msgId is the offset msgId
    erased = {by_uniq["commitlog_offset"], by_offset_id["commitlog_offset"]}
    assert by_offset_id["msg_id"] != by_uniq["uniq_key"] and len(erased) == 2

    for msg_id in (by_uniq["uniq_key"], by_offset_id["msg_id"]):
        result = CliRunner().invoke(app, ["lake", "erase", "--lake", str(root), "--topic", topic, "--msg-id", msg_id,
                                          "--retain-hours", "0", "--operator", "dpo"])  # fmt: skip
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout.splitlines()[-1])
        assert (out["rows"], out["msg_id"], out["key"]) == (1, msg_id, None)

    reader = LakeReader(root)
    assert [reader.message_at(o) for o in sorted(erased)] == [None, None]
    kept = [r for r in in_lake if r["commitlog_offset"] not in erased]
    assert all(reader.message_at(r["commitlog_offset"]) for r in kept[::7])
    audit = lake.to_arrow(root / ERASURES).to_pylist()
    assert sorted((a["msg_id"], a["rows"]) for a in audit) == sorted(
        [(by_uniq["uniq_key"], 1), (by_offset_id["msg_id"], 1)])  # fmt: skip

    spec = ReplaySpec(lake=root, source_topics=(topic,), target_topic="ReplayAfterErase", store_dir=written.root,
                      namesrv=mqlake_server.namesrv_addr, replay_id="after-erase-1", batch_size=32)  # fmt: skip
    want = [r for r in rows if r["commitlog_offset"] not in erased]
    assert replay(spec, spark=spark).sent == len(want)
    got = [m for msgs in read_topic(mqlake_server.namesrv_addr, "ReplayAfterErase", len(want)).values() for m in msgs]
    source = {(int(m.properties[REPLAY_SOURCE_QUEUE]), int(m.properties[REPLAY_SOURCE_OFFSET])): m for m in got}
    assert len(source) == len(got) == len(want)
    assert sorted(source) == sorted((r["queue_id"], r["queue_offset"]) for r in want)
    assert all(source[(r["queue_id"], r["queue_offset"])].body == r["body"] for r in want)
    gone = {(r["queue_id"], r["queue_offset"]) for r in (by_uniq, by_offset_id)}
    assert not gone & set(source)
    assert by_uniq["uniq_key"] not in {m.properties.get(ORIGIN_MESSAGE_ID) for m in got}


@pytest.mark.timeout(1800)  # a tier run and three erases, each Spark jobs, on a busy machine
def test_erase_takes_the_messages_out_of_the_typed_table_and_decode_errors_too(spark, tmp_path):
    """A topic with a declared body schema: an erase by key, by the msgId a producer is given (UNIQ_KEY, which the
    typed tables do not carry) and by the offset msgId removes the messages from ``messages``, from the topic's
    typed table and from ``decode_errors`` (no data file on disk keeps them), counts each in the output and the
    audit row, and leaves every other message's rows, and another topic's with the same key, where they were."""
    import json

    from typer.testing import CliRunner

    from cli.main import app
    from lake import tables, typed
    from pipelines.compaction.job import tier
    from store.message_store import MessageStore
    from tests.helpers import make_config, make_message
    from tests.test_typed_tables import ORDERS_V1

    topic, other = "Orders", "Undeclared"
    with MessageStore(make_config(tmp_path / "s")) as store:
        for i in range(600):  # about three 64 KiB segments sealed
            value = {"id": i, "item": f"item{i}", "pad": "x" * 200}
            body = b"not json %d" % i if i % 7 == 0 else json.dumps(value).encode()
            record = make_message(other if i % 9 == 0 else topic, i % 2, body, keys=f"cust{i % 10}", uniq_key=f"U{i}")
            assert store.put_message(record).ok
    root = tmp_path / "lake"
    typed.declare(root, topic, typed.JSON, json.dumps(ORDERS_V1).encode())
    report = tier(tmp_path / "s" / "store", root, spark=spark, file_reserved_time=0)
    assert report.by_state("tiered") and not report.by_state("quarantined"), report.to_json()

    typed_uri, errors_uri = tables.typed_table_uri(root, topic), tables.table_uri(root, tables.DECODE_ERRORS)
    columns = ["topic", "queue_id", "queue_offset", "keys", "msg_id", "uniq_key", "body"]
    messages = {(r["topic"], r["queue_id"], r["queue_offset"]): r
                for r in lake.to_arrow(root / "messages").select(columns).to_pylist()}  # fmt: skip

    def ids(uri: str) -> set[tuple[str, int, int]]:
        t = lake.to_arrow(uri)
        return set(zip(t["topic"].to_pylist(), t["queue_id"].to_pylist(), t["queue_offset"].to_pylist(), strict=True))

    def bad(k: tuple[str, int, int]) -> bool:
        return messages[k]["body"].startswith(b"not json")

    before_typed, before_errors = ids(typed_uri), ids(errors_uri)
    ours = {k for k in messages if k[0] == topic}
    assert before_typed == {k for k in ours if not bad(k)} and before_errors == {k for k in ours if bad(k)}
    by_key = {k for k in ours if messages[k]["keys"] == "cust3"}
    assert any(bad(k) for k in by_key) and any(not bad(k) for k in by_key)
    assert any(k[0] == other and messages[k]["keys"] == "cust3" for k in messages)  # same key, another topic
    by_uniq = next(k for k in sorted(ours - by_key) if not bad(k))  # typed row: matched through messages
    by_offset_id = next(k for k in sorted(ours - by_key) if bad(k))  # decode_errors row: by its own msg_id
    erased = by_key | {by_uniq, by_offset_id}

    first = erase(spark, root, topic, key="cust3", retain_hours=0, operator="dpo")
    assert (first.rows, first.typed_rows, first.decode_error_rows) == (
        len(by_key), len({k for k in by_key if not bad(k)}), len({k for k in by_key if bad(k)}))  # fmt: skip
    outputs = []
    for msg_id in (messages[by_uniq]["uniq_key"], messages[by_offset_id]["msg_id"]):
        result = CliRunner().invoke(app, ["lake", "erase", "--lake", str(root), "--topic", topic, "--msg-id", msg_id,
                                          "--retain-hours", "0", "--operator", "dpo"])  # fmt: skip
        assert result.exit_code == 0, result.output
        outputs.append(json.loads(result.stdout.splitlines()[-1]))
    assert [(o["rows"], o["typed_rows"], o["decode_error_rows"]) for o in outputs] == [(1, 1, 0), (1, 0, 1)]

    assert set(messages) - ids(str(root / "messages")) == erased
    assert ids(typed_uri) == before_typed - erased and ids(errors_uri) == before_errors - erased
    # no data file on disk holds an erased message's fields or body (VACUUM after a retention of 0 hours)
    for uri in (typed_uri, errors_uri):
        for f in Path(uri).rglob("*.parquet"):
            t = pq.read_table(f, columns=["topic", "queue_id", "queue_offset"])
            on_disk = zip(t["topic"].to_pylist(), t["queue_id"].to_pylist(), t["queue_offset"].to_pylist(), strict=True)
            assert not set(on_disk) & erased, f
    audit = sorted(lake.to_arrow(root / ERASURES).to_pylist(), key=lambda a: (a["key"] is None, a["msg_id"] or ""))
    assert [(a["key"], a["msg_id"], a["rows"], a["typed_rows"], a["decode_error_rows"]) for a in audit] == [
        ("cust3", None, first.rows, first.typed_rows, first.decode_error_rows),
        *sorted([(None, messages[by_uniq]["uniq_key"], 1, 1, 0), (None, messages[by_offset_id]["msg_id"], 1, 0, 1)],
                key=lambda a: a[1]),
    ]  # fmt: skip
