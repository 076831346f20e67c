"""The Airflow DAGs over several broker stores (``MQLAKE_BROKER_STORES``): one task group per store for tier and
verify-index, every store into the one lake, and every store's live CommitLog read by the replay, with
``dag.test()`` in a child process as tests/test_airflow_dags.py runs them (the ``airflow_home`` fixture of
tests/fixtures_airflow.py and ``run_dag``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lake import tables
from tests.fixtures_spark import write_store
from tests.test_airflow_dags import child, delta_rows, run_dag, sealed_segments

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]  # two dag.test() runs, each a cold Spark session

BROKERS = ("broker-a", "broker-b")


def test_tier_and_verify_dags_run_one_task_group_per_broker_store_into_one_lake(airflow_home, tmp_path):
    stores = {b: write_store(tmp_path / b, 300) for b in BROKERS}
    lake = tmp_path / "lake"
    sealed = {b: sealed_segments(w.root) for b, w in stores.items()}
    env = airflow_home | {
        "MQLAKE_BROKER_STORES": json.dumps([{"broker_name": b, "store_dir": str(w.root)} for b, w in stores.items()])
    }

    bag = child(env, ["dagbag"], tmp_path)
    assert not bag["import_errors"], bag["import_errors"]
    tier_tasks = bag["dags"]["mqlake_tier"]["tasks"]
    assert tier_tasks["compaction_day"]["upstream"] == [f"check_integrity_{b}" for b in BROKERS]
    verify_tasks = bag["dags"]["mqlake_verify_index"]["tasks"]
    assert {f"verify_{b}.local" for b in BROKERS} <= set(verify_tasks)

    result = run_dag(env, tmp_path, "mqlake_tier", {"file_reserved_time": 0, "compact": "never"},
                     spark_submit=False, lake=lake)  # fmt: skip
    assert result["state"] == "success", result["log"][-6000:]
    for b in BROKERS:
        assert result["tasks"][f"tier_{b}.local"] == "success"
        assert result["xcoms"][f"check_integrity_{b}"]["return_value"]["tiered"] == len(sealed[b])
    # the two stores' rows, each under its broker (their segment names and CommitLog offsets are the same)
    rows = Counter((r["broker_name"], r["segment"], r["commitlog_offset"]) for r in delta_rows(lake, tables.MESSAGES))
    want = Counter((b, r["segment"], o) for b, w in stores.items() for o, r in w.expected.items()
                   if r["segment"] in sealed[b])  # fmt: skip
    assert rows == want
    assert {(r["broker_name"], r["segment"]) for r in delta_rows(lake, tables.SEGMENTS)} == {
        (b, s) for b in BROKERS for s in sealed[b]
    }

    verified = run_dag(env, tmp_path, "mqlake_verify_index", spark_submit=False, lake=lake)
    assert verified["state"] == "success", verified["log"][-6000:]
    run_ids = set()
    for b in BROKERS:
        summary = verified["xcoms"][f"check_indexes_{b}"]["return_value"]
        assert summary["ok"] and summary["queues"] == summary["queues_ok"] > 0
        assert summary["run_id"].endswith(f"-{b}")
        run_ids.add(summary["run_id"])
    # each store's rows under its own run id: neither replaced the other's
    stored = {(r["run_id"], r["store_dir"]) for r in delta_rows(lake, "index_verification")}
    assert {s for r, s in stored if r in run_ids} == {str(w.root) for w in stores.values()}


def test_replay_dag_reads_every_broker_stores_live_log(airflow_home, tmp_path, mqlake_server):
    stores = {b: write_store(tmp_path / b, 300) for b in BROKERS}
    lake = tmp_path / "lake"
    lake.mkdir()
    env = airflow_home | {
        "MQLAKE_BROKER_STORES": json.dumps([{"broker_name": b, "store_dir": str(w.root)} for b, w in stores.items()])
    }
    dry = run_dag(env, tmp_path, "mqlake_replay", {"source_topics": ["Orders"], "target_topic": "OrdersAgain",
                  "dry_run": True}, spark_submit=False, lake=lake, namesrv=mqlake_server.namesrv_addr)  # fmt: skip

    assert dry["state"] == "success", dry["log"][-6000:]
    report = dry["xcoms"]["final_report"]["return_value"]
    # both stores' records of the topic, each store's under its broker (their queue ids and offsets are the same)
    want = Counter((b, r["queue_id"]) for b, w in stores.items() for r in w.expected.values() if r["topic"] == "Orders")
    assert {(q["source_broker"], q["source_queue"]): q["selected"] for q in report["queues"]} == dict(want)
    assert "--broker-store" in dry["log"] and f"broker-b={stores['broker-b'].root}" in dry["log"]
