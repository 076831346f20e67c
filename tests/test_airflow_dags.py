"""The Airflow DAGs (airflow_dags/) run with ``dag.test()`` on a temporary AIRFLOW_HOME (SQLite, ``airflow db
migrate``) against real stores, lakes, Spark (spark-submit and in-process) and, for replays, a real broker.

Each DAG run happens in a child process (tests/airflow_run.py): Airflow's configuration and state are
process-wide (this module does not import airflow itself).  The Variables and the Spark connection go in
through the child's environment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker.client import Admin, Message, MessageQueue, Producer
from broker.remoting.loop import run
from lake import tables
from store.format import records
from store.retention import SegmentManifest, SegmentState
from tests.aio import poll
from tests.fixtures_broker import read_topic
from tests.fixtures_spark import write_store
from tests.helpers import flip_byte, make_config

pytestmark = pytest.mark.airflow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SPARK_CONN = json.dumps({"conn_type": "spark", "host": "local[2]"})
RUN_TIMEOUT = 600


def child(env: dict[str, str], args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / f"airflow-{uuid.uuid4().hex[:6]}.json"
    log = out.with_suffix(".log")
    with open(log, "wb") as f:
        proc = subprocess.run([sys.executable, "-m", "tests.airflow_run", *args, str(out)], env=env, cwd=ROOT,
                              stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT)  # fmt: skip
    text = log.read_text(errors="replace")
    assert proc.returncode == 0 and out.exists(), text[-8000:]
    result = json.loads(out.read_text())
    result["log"] = text
    return result


def run_dag(env: dict[str, str], tmp_path: Path, dag_id: str, conf: dict | None = None, *, spark_submit: bool,
            **variables: str) -> dict:  # fmt: skip
    """One ``dag.test()`` run; ``variables`` are the mqlake_* Airflow Variables without the prefix."""
    env = env | {f"AIRFLOW_VAR_MQLAKE_{k.upper()}": str(v) for k, v in variables.items()}
    env["AIRFLOW_VAR_MQLAKE_SPARK_MASTER"] = "local[2]"
    env["AIRFLOW_VAR_MQLAKE_SPARK_CONF"] = "spark.sql.shuffle.partitions=2,spark.driver.memory=1g"
    if spark_submit:
        env["AIRFLOW_CONN_MQLAKE_SPARK"] = SPARK_CONN
    return child(env, ["test", dag_id, json.dumps(conf or {})], tmp_path)


def delta_rows(lake: Path, name: str) -> list[dict]:
    return DeltaTable(str(tables.table_uri(lake, name))).to_pyarrow_table().to_pylist()


def sealed_segments(root: Path) -> list[str]:
    """The segments the store's manifest calls sealed: what a run with file_reserved_time 0 tiers."""
    return [e.file_name for e in SegmentManifest(root).entries() if e.state == SegmentState.SEALED]


def rows_of(written, segments: list[str]) -> dict[int, dict]:
    return {o: r for o, r in written.expected.items() if r["segment"] in segments}


# --- DagBag ----------------------------------------------------------------------------------------------------
def test_dag_folder_imports_cleanly_with_schedules_params_and_limits(airflow_home, tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("deleteWhen=03;15\nfileReservedTime=48\n")
    bag = child(airflow_home | {"MQLAKE_BROKER_CONF": str(conf)}, ["dagbag"], tmp_path)

    assert bag["import_errors"] == {}
    dags = bag["dags"]
    assert set(dags) == {"mqlake_tier", "mqlake_verify_index", "mqlake_replay"}
    # tiering at the broker's deletion hours; verification twelve hours after the first; replay by hand
    assert dags["mqlake_tier"]["cron"] == "0 3,15 * * *"
    assert dags["mqlake_verify_index"]["cron"] == "0 15 * * *"
    assert dags["mqlake_replay"]["cron"] is None
    for dag_id in ("mqlake_tier", "mqlake_verify_index"):
        assert dags[dag_id]["max_active_runs"] == 1 and dags[dag_id]["catchup"] is False

    tier = dags["mqlake_tier"]["tasks"]
    assert tier["tier.spark_submit"]["type"] == "SparkSubmitOperator" and tier["tier.local"]["type"] == "PythonOperator"
    assert tier["tier.spark_submit"]["retries"] == tier["tier.local"]["retries"] == 2
    assert tier["tier.spark_submit"]["timeout_s"] == 4 * 3600
    assert tier["check_integrity"]["upstream"] == ["tier.local", "tier.spark_submit", "tier_args"]
    # compaction_day waits for the check, so a failed check reaches the only leaf (compact) on any weekday
    assert tier["compaction_day"]["upstream"] == ["check_integrity"]
    assert tier["compact"]["upstream"] == ["compaction_day"]
    assert all(t["timeout_s"] for t in tier.values()), "every task has a time limit"

    replay = dags["mqlake_replay"]
    assert {"source_topics", "target_topic", "from", "to", "where", "tags", "keys", "rate", "replay_id",
            "dry_run"} <= set(replay["params"])  # fmt: skip
    assert replay["params"]["source_topics"]["type"] == "array"
    assert replay["params"]["rate"]["type"] == ["null", "number"]
    assert replay["params"]["dry_run"]["type"] == "boolean"
    assert replay["tasks"]["replay.local"]["upstream"] == ["replay.choose_runner", "replay_args"]
    assert replay["tasks"]["replay.choose_runner"]["upstream"] == ["show_counts"]


# --- mqlake_tier -----------------------------------------------------------------------------------------------
def test_tier_dag_moves_sealed_segments_into_delta_then_a_rerun_commits_nothing(airflow_home, tmp_path):
    written = write_store(tmp_path / "store")
    lake = tmp_path / "lake"
    segments = sealed_segments(written.root)
    assert len(segments) >= 3
    want = rows_of(written, segments)
    active = [n for n in written.segment_names() if n not in segments][0]

    # spark-submit on the mqlake_spark connection; every sealed segment due (file_reserved_time 0)
    first = run_dag(airflow_home, tmp_path, "mqlake_tier", {"file_reserved_time": 0, "compact": "always"},
                    spark_submit=True, store_dir=written.root, lake=lake)  # fmt: skip

    assert first["state"] == "success", first["log"][-6000:]
    t = first["tasks"]
    assert (t["find_expired"], t["tier.spark_submit"], t["tier.local"]) == ("success", "success", "skipped")
    assert (t["check_integrity"], t["compact"]) == ("success", "success")
    summary = first["xcoms"]["check_integrity"]["return_value"]
    assert summary["tiered"] == len(segments) and "quarantined" not in summary
    rows = delta_rows(lake, tables.MESSAGES)
    assert sorted(r["commitlog_offset"] for r in rows) == sorted(want)
    assert all(bytes(r["body"]) == want[r["commitlog_offset"]]["body"] for r in rows)
    assert [e.file_name for e in SegmentManifest(written.root).entries() if e.state == SegmentState.DELETED] == segments
    assert written.segment_names()[0] == active  # the tiered files are gone, the active one stays
    assert Path(summary["report"]).is_file()
    version = DeltaTable(str(tables.table_uri(lake, tables.MESSAGES))).version()

    # the in-process runner this time (no connection): nothing is due, so nothing runs and nothing commits
    again = run_dag(airflow_home, tmp_path, "mqlake_tier", {"file_reserved_time": 0, "compact": "never"},
                    spark_submit=False, store_dir=written.root, lake=lake)  # fmt: skip

    assert again["state"] == "success", again["log"][-6000:]
    t = again["tasks"]
    assert t["find_expired"] == "success" and "0 segment(s) due for tiering" in again["log"]
    assert {t[k] for k in ("tier_args", "tier.choose_runner", "tier.local", "tier.spark_submit", "check_integrity",
                           "compact")} == {"skipped"}  # fmt: skip
    assert DeltaTable(str(tables.table_uri(lake, tables.MESSAGES))).version() == version
    assert len(delta_rows(lake, tables.MESSAGES)) == len(want)


def test_tier_dag_fails_with_the_report_when_a_segment_is_quarantined(airflow_home, tmp_path):
    written = write_store(tmp_path / "store")
    lake = tmp_path / "lake"
    segments = sealed_segments(written.root)
    bad = segments[1]
    good = set(rows_of(written, [s for s in segments if s != bad]))
    rec = next(r for r in written.rows_in(bad) if r["body"] and r["magic"] == records.MESSAGE_MAGIC_V1)
    # a body byte: CRC fails
    flip_byte(written.commitlog / bad, rec["position"] + records.record_length(0, 0, 0, 0) - 3)

    # "never": compaction_day would skip compact, the run's only leaf, as on every day but the compaction
    # weekday; the failed check must fail the run all the same (the run's state must not depend on the date)
    # no mqlake_lake Variable: the DAG tiers into the lakePath of the broker's broker.conf
    conf = tmp_path / "broker.conf"
    sizes = make_config(tmp_path).model_dump(by_alias=True)
    conf.write_text("".join(f"{k}={sizes[k]}\n" for k in ("mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue",
                                                          "maxHashSlotNum", "maxIndexNum")) + f"lakePath={lake}\n")
    result = run_dag(airflow_home, tmp_path, "mqlake_tier", {"file_reserved_time": 0, "compact": "never"},
                     spark_submit=False, store_dir=written.root, broker_conf=conf)  # fmt: skip

    assert result["state"] == "failed", result["log"][-6000:]
    t = result["tasks"]
    assert (t["tier.local"], t["check_integrity"]) == ("success", "failed")
    assert (t["compaction_day"], t["compact"]) == ("upstream_failed", "upstream_failed")  # not after a failed run
    report = result["xcoms"]["check_integrity"]["report"]
    states = {s["segment"]: s["state"] for s in report["segments"]}
    assert states == {s: "quarantined" if s == bad else "tiered" for s in segments}
    assert f"1 segment(s) quarantined (kept in the store, not tiered): {bad}" in result["log"]
    assert "crc_matches" in result["log"]
    assert (written.commitlog / bad).exists()
    assert {r["commitlog_offset"] for r in delta_rows(lake, tables.MESSAGES)} == good


# --- mqlake_verify_index ---------------------------------------------------------------------------------------
def test_verify_dag_passes_on_a_clean_store_and_fails_on_a_corrupted_consume_queue(airflow_home, tmp_path):
    written = write_store(tmp_path / "store")
    lake = tmp_path / "lake"

    clean = run_dag(airflow_home, tmp_path, "mqlake_verify_index", spark_submit=False, store_dir=written.root,
                    lake=lake)  # fmt: skip

    assert clean["state"] == "success", clean["log"][-6000:]
    t = clean["tasks"]
    assert (t["verify.local"], t["verify.spark_submit"], t["check_indexes"]) == ("success", "skipped", "success")
    summary = clean["xcoms"]["check_indexes"]["return_value"]
    assert summary["ok"] and summary["queues"] == summary["queues_ok"] > 0 and summary["cq_units_matched"] > 0
    # the Airflow run id, as a name the job accepts ("manual__2026-11-22T08:00:00.123+00:00" -> "manual__2026-...")
    assert summary["run_id"] == re.sub(r"[^A-Za-z0-9_-]", "-", clean["run_id"])
    rows = [r for r in delta_rows(lake, "index_verification") if r["run_id"] == summary["run_id"]]
    assert rows and all(r["ok"] for r in rows)

    # point the first unit of Orders/0 at another CommitLog offset
    cq = sorted((written.root / "consumequeue" / "Orders" / "0").iterdir())[0]
    with open(cq, "r+b") as f:
        f.write((12345).to_bytes(8, "big"))

    broken = run_dag(airflow_home, tmp_path, "mqlake_verify_index", spark_submit=True, store_dir=written.root,
                     lake=lake)  # fmt: skip

    assert broken["state"] == "failed"
    t = broken["tasks"]
    # the job itself succeeded (it found what it was asked to find); the check fails the run
    assert (t["verify.spark_submit"], t["verify.local"], t["check_indexes"]) == ("success", "skipped", "failed")
    summary = broken["xcoms"]["check_indexes"]["summary"]
    assert not summary["ok"] and summary["queues_ok"] == summary["queues"] - 1
    assert "ConsumeQueue Orders/0: mismatch" in broken["log"] and "index mismatch: 1 of" in broken["log"]
    assert str(cq) in broken["log"]  # the first problem names the file
    rows = {(r["topic"], r["queue_id"]): r for r in delta_rows(lake, "index_verification")
            if r["run_id"] == summary["run_id"] and r["kind"] == "consume_queue"}  # fmt: skip
    assert not rows["Orders", 0]["ok"] and rows["Orders", 0]["first_bad_queue_offset"] == 0
    assert all(r["ok"] for k, r in rows.items() if k != ("Orders", 0))


# --- mqlake_replay ---------------------------------------------------------------------------------------------
QUEUES = 3
PER_QUEUE = 80


async def _produce(namesrv: str, broker_addr: str, topic: str) -> dict[int, list[bytes]]:
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, broker_addr=broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    sent: dict[int, list[bytes]] = {}
    async with Producer("af_replay_source", namesrv) as producer:

        async def routed() -> list[MessageQueue]:
            queues = await producer.publish_queues(topic, refresh=True)
            return queues if len(queues) == QUEUES else []

        queues = await poll(routed, timeout=30, interval=0.1, what=f"the route of {topic}")
        for mq in queues:
            msgs = [Message(topic, f"{topic} q{mq.queue_id} #{i}", tags="A" if i % 2 else "B", keys=f"k{i}")
                    for i in range(PER_QUEUE)]  # fmt: skip
            await producer.send_batch(msgs, queue=mq)
            sent[mq.queue_id] = [m.body_bytes() for m in msgs]
    return sent


def test_replay_dag_dry_run_shows_counts_then_copies_a_topic(airflow_home, tmp_path, mqlake_server):
    source, target = f"AfSrc{uuid.uuid4().hex[:8]}", f"AfDst{uuid.uuid4().hex[:8]}"
    sent = run(_produce(mqlake_server.namesrv_addr, mqlake_server.broker_addr, source))
    where = {"store_dir": mqlake_server.store_dir, "lake": tmp_path / "lake", "namesrv": mqlake_server.namesrv_addr}
    total = QUEUES * PER_QUEUE

    dry = run_dag(airflow_home, tmp_path, "mqlake_replay",
                  {"source_topics": [source], "target_topic": target, "dry_run": True}, spark_submit=False, **where)

    assert dry["state"] == "success", dry["log"][-6000:]
    t = dry["tasks"]
    assert (t["dry_run.local"], t["show_counts"], t["final_report"]) == ("success", "success", "success")
    assert {t["replay.choose_runner"], t["replay.local"], t["replay.spark_submit"]} == {"skipped"}
    assert dry["xcoms"]["show_counts"]["counts"]["selected"] == total
    report = dry["xcoms"]["final_report"]["return_value"]
    assert report["dry_run"] and report["selected"] == total and report["sent"] == 0
    assert sorted(q["selected"] for q in report["queues"]) == [PER_QUEUE] * QUEUES

    replay_id = f"af-{uuid.uuid4().hex[:8]}"
    copied = run_dag(airflow_home, tmp_path, "mqlake_replay",
                     {"source_topics": [source], "target_topic": target, "replay_id": replay_id, "rate": 2000},
                     spark_submit=False, **where)  # fmt: skip

    assert copied["state"] == "success", copied["log"][-6000:]
    t = copied["tasks"]
    assert (t["dry_run.local"], t["show_counts"], t["replay.local"], t["final_report"]) == ("success",) * 4
    report = copied["xcoms"]["final_report"]["return_value"]
    assert (report["replay_id"], report["dry_run"], report["sent"]) == (replay_id, False, total)
    got = read_topic(mqlake_server.namesrv_addr, target, total)
    assert {q: [m.body for m in msgs] for q, msgs in got.items()} == sent  # same queues, same order


def test_replay_dag_refuses_bad_parameters_before_spark(airflow_home, tmp_path):
    lake = tmp_path / "lake"
    lake.mkdir()
    result = run_dag(airflow_home, tmp_path, "mqlake_replay", {"source_topics": ["A"], "target_topic": "A"},
                     spark_submit=False, lake=lake)  # fmt: skip
    assert result["state"] == "failed"
    assert result["tasks"]["replay_args"] == "failed"
    assert result["tasks"]["dry_run.local"] == "upstream_failed"
    assert "is also a source topic" in result["log"]
