"""``mqlake lake erase`` (pipelines/erase.py): messages erased by topic and key leave the tiered history — the
broker's fall-through reads and queries by key, Spark SQL, and every data file on disk — an audit row records
it, and the copies still in the live CommitLog are named."""

from __future__ import annotations

import shutil

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
