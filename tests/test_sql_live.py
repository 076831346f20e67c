"""``mqlake sql --store-dir``: the view ``messages_all`` (the lake's rows UNION the live CommitLog's records not yet
tiered, each record once) over two stores tiered into one lake, one of them caught at its tier boundary (its tiered
segments still live by its manifest); and the store options refused before Spark.  Running brokers, and a message
produced while a ``--shell`` session is open, are in tests/test_two_brokers.py; a typed topic's ``<topic>_all`` in
tests/test_typed_tables.py."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

# the module's fixture (two stores written, each tiered) runs within its first test's time limit
pytestmark = pytest.mark.timeout(600)
runner = CliRunner()
KEY = ("broker_name", "topic", "queue_id", "queue_offset")


def _json_rows(lake: Path, query: str, stores) -> list[dict]:
    from pipelines.sql_cli import run_sql

    out, err = io.StringIO(), io.StringIO()
    assert run_sql(lake, query, output="json", stores=stores, out=out, err=err) == 0, err.getvalue()
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture(scope="module")
def two_stores(spark, tmp_path_factory):
    """Two stores tiered into one lake under broker-a and broker-b; broker-b's live store as it was before its
    tier run (a query starting while the tier commits): its tiered segments are in the lake AND live."""
    from pipelines.compaction.job import tier
    from pipelines.history import live_segments
    from tests.fixtures_spark import write_store

    work = tmp_path_factory.mktemp("sql_live")
    stores = {b: write_store(work / b, 300) for b in ("broker-a", "broker-b")}
    before_tier = work / "broker-b-before-tier"
    shutil.copytree(stores["broker-b"].root, before_tier)
    lake = work / "lake"
    tiered = {}
    for name, written in stores.items():
        report = tier(written.root, lake, spark=spark, file_reserved_time=0, broker_name=name)
        tiered[name] = {s.base_offset for s in report.segments if s.state == "tiered"}
        assert tiered[name]
    assert tiered["broker-b"] <= set(live_segments(before_tier))  # in both sources
    assert not tiered["broker-a"] & set(live_segments(stores["broker-a"].root))
    return lake, stores, (stores["broker-a"].root, before_tier)


@pytest.mark.spark
def test_messages_all_holds_each_record_of_both_stores_once_with_the_tables_columns(spark, two_stores):
    from pipelines.sql_cli import live_stores

    lake, stores, (root_a, before_b) = two_stores
    # broker-a's store is named by what the lake recorded for it; the copy of broker-b's by the flag
    live = live_stores(lake, [root_a], [f"broker-b={before_b}"])
    assert live == (("broker-a", root_a), ("broker-b", before_b))
    rows = _json_rows(lake, "SELECT * FROM messages_all", live)
    keys = Counter(tuple(r[k] for k in KEY) for r in rows)
    assert max(keys.values()) == 1  # counted once, at both tier boundaries
    want = {(b, r["topic"], r["queue_id"], r["queue_offset"]): r
            for b, w in stores.items() for r in w.expected.values()}  # fmt: skip
    assert set(keys) == set(want)  # the tiered prefix and the live rest of every queue
    for r in rows:
        w = want[tuple(r[k] for k in KEY)]
        assert base64.b64decode(r["body"]) == w["body"]
        assert (r["commitlog_offset"], r["msg_id"], r["properties"]) == (w["commitlog_offset"], w["msg_id"],
                                                                           w["properties"])  # fmt: skip
    # exactly the messages table's columns and types, the live rows' store_date the tier's
    table = _json_rows(lake, "DESCRIBE messages", live)
    view = _json_rows(lake, "DESCRIBE messages_all", live)
    assert [(c["col_name"], c["data_type"]) for c in view] == [
        (c["col_name"], c["data_type"]) for c in table if c["col_name"] and not c["col_name"].startswith("#")
    ][: len(view)]
    dates = _json_rows(lake, "SELECT count(*) AS n FROM messages_all "
                             "WHERE store_date <> to_date(timestamp_millis(store_timestamp))", live)  # fmt: skip
    assert dates == [{"n": 0}]


@pytest.mark.spark
def test_a_broker_without_its_store_is_its_tiered_rows_alone(two_stores):
    lake, stores, (root_a, _) = two_stores
    # broker-a alone: its whole history (lake + live) and broker-b's tiered rows, nothing of b's live rest
    rows = _json_rows(lake, "SELECT broker_name, count(*) AS n FROM messages_all GROUP BY 1 ORDER BY 1",
                      (("broker-a", root_a),))  # fmt: skip
    tiered_b = _json_rows(lake, "SELECT count(*) AS n FROM messages WHERE broker_name = 'broker-b'", ())
    assert rows == [{"broker_name": "broker-a", "n": len(stores["broker-a"].expected)},
                    {"broker_name": "broker-b", "n": tiered_b[0]["n"]}]  # fmt: skip
    assert 0 < tiered_b[0]["n"] < len(stores["broker-b"].expected)


@pytest.mark.unit
def test_store_options_are_refused_before_spark(tmp_path):
    from store import identity

    lake = tmp_path / "lake"
    lake.mkdir()
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    identity.record_broker(store, "DefaultCluster", "broker-a")
    base = ["sql", "--lake", str(lake), "SELECT 1"]
    cases = (
        (["--store-dir", str(tmp_path / "missing")], "has no commitlog directory"),
        (["--store-dir", str(store), "--store-dir", str(store)], "broker broker-a is given two live stores"),
        (["--broker-store", str(store)], "BROKER_NAME=STORE_DIR"),
        (["--broker-store", f"broker-b={store}"], "says brokerName=broker-a, the flags say broker-b"),
    )
    for extra, message in cases:
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.replace("│", " ").split()), result.output
