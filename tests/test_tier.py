"""The tiering job end to end: real store files, real Spark, real Delta tables, real deletion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from lake import delta as lk
from lake import tables
from pipelines import spark_tables
from pipelines.compaction.job import CRASH_ENV, tier
from pipelines.compaction.upkeep import compact
from store.checkpoint import abort_file
from store.format import records
from store.message_store import MessageStore
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_spark import spark_row, write_store
from tests.helpers import Worker, cli_env, flip_byte, make_config, make_message, wait_until

MESSAGE_CHECK = [
    "topic", "queue_id", "queue_offset", "commitlog_offset", "msg_size", "body", "body_crc", "keys", "tags",
    "uniq_key", "properties", "store_timestamp", "born_timestamp", "msg_id", "segment", "position",
]  # fmt: skip


def states(store_root: Path) -> dict[str, SegmentState]:
    return {e.file_name: e.state for e in SegmentManifest(store_root).entries()}


def table_rows(spark, lake: Path) -> list[dict]:
    return [spark_row(r) for r in spark_tables.read_table(spark, tables.table_uri(lake, tables.MESSAGES)).collect()]


def assert_rows_are(rows: list[dict], expected: dict[int, dict]) -> None:
    """Exactly the expected records, each once, field for field."""
    by_offset = {r["commitlog_offset"]: r for r in rows}
    assert len(by_offset) == len(rows), "a record was committed twice"
    assert sorted(by_offset) == sorted(expected)
    for off, want in expected.items():
        got = by_offset[off]
        assert {k: got[k] for k in MESSAGE_CHECK} == {k: want[k] for k in MESSAGE_CHECK}, f"record at {off}"
    assert len({(r["topic"], r["queue_id"], r["queue_offset"]) for r in rows}) == len(rows)


def sealed(store_root: Path) -> list[str]:
    return sorted(name for name, st in states(store_root).items() if st == SegmentState.SEALED)


def sealed_expected(written, names: list[str]) -> dict[int, dict]:
    return {off: r for off, r in written.expected.items() if r["segment"] in names}


@pytest.mark.spark
def test_tier_store_then_rerun_is_idempotent(spark, tmp_path):
    written = write_store(tmp_path / "s")
    lake = tmp_path / "lake"
    segments = sealed(written.root)
    assert len(segments) >= 3

    report = tier(written.root, lake, spark=spark, file_reserved_time=0)

    assert [s.segment for s in report.by_state("tiered")] == segments, report.to_json()
    # no broker holds the store, so the job deleted them through the store, CQ and index included
    assert sorted(report.deleted) == [int(s) for s in segments]
    remaining = written.segment_names()
    assert remaining and not set(remaining) & set(segments) and min(remaining) > max(segments)
    assert all(states(written.root)[s] == SegmentState.DELETED for s in segments)
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, segments))

    segs = lk.to_arrow(tables.table_uri(lake, tables.SEGMENTS)).to_pylist()
    assert sorted(r["segment"] for r in segs) == segments
    for r in segs:
        rows = written.rows_in(r["segment"])
        assert r["record_count"] == len(rows)
        assert r["min_commitlog_offset"] == min(x["commitlog_offset"] for x in rows)
        assert r["body_crc_sum"] == sum(x["body_crc"] for x in rows)
        assert r["messages_version"] == report.messages_version
        per_queue = {(q["topic"], q["queue_id"]): (q["first_offset"], q["last_offset"]) for q in r["queue_ranges"]}
        for (t, q), (lo, hi) in per_queue.items():
            offs = [x["queue_offset"] for x in rows if (x["topic"], x["queue_id"]) == (t, q)]
            assert (lo, hi) == (min(offs), max(offs))

    quality = lk.to_arrow(tables.table_uri(lake, tables.QUALITY_RESULTS)).to_pylist()
    assert quality and all(q["success"] for q in quality)
    assert {q["segment"] for q in quality} == set(segments)
    saved = json.loads(Path(report.report_path).read_text())
    assert saved["run_id"] == report.run_id and Path(report.report_path).parent == lake / tables.REPORTS_DIR

    # Spark SQL over the tier answers with exactly what was sent
    spark_tables.register(spark, lake)
    got = {
        (r["topic"], r["keys"], bytes(r["body"]))
        for r in spark.sql("SELECT topic, keys, body FROM messages WHERE tags = 'tag1'").collect()
    }
    sent = sealed_expected(written, segments).values()
    want = {(r["topic"], r["keys"], r["body"]) for r in sent if r["tags"] == "tag1"}
    assert got == want and got
    per_day = spark.sql("SELECT store_date, count(*) AS n FROM messages GROUP BY store_date").collect()
    assert sum(r["n"] for r in per_day) == len(sealed_expected(written, segments))

    version = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).version()
    again = tier(written.root, lake, spark=spark, file_reserved_time=0)
    assert again.segments == [] and again.messages_version is None
    assert DeltaTable(tables.table_uri(lake, tables.MESSAGES)).version() == version
    assert len(table_rows(spark, lake)) == len(sealed_expected(written, segments))

    # upkeep: today's partitions are open (a run may still add to them) and are left alone ...
    messages = tables.table_uri(lake, tables.MESSAGES)
    files_before = lk.file_count(messages)
    today = max(r["store_date"] for r in table_rows(spark, lake))
    assert compact(lake, today=today)[tables.MESSAGES]["files_removed"] == 0
    assert lk.file_count(messages) == files_before
    # ... closed ones are compacted to one file per partition, rows unchanged, txn ids kept
    done = compact(lake, today=today + timedelta(days=1))
    partitions = {(r["topic"], r["store_date"]) for r in table_rows(spark, lake)}
    assert files_before > len(partitions) == lk.file_count(messages)
    assert done[tables.MESSAGES]["files_removed"] > 0
    footers = [pq.read_metadata(unquote(u.removeprefix("file://"))) for u in DeltaTable(messages).file_uris()]
    codecs = {md.row_group(0).column(c).compression for md in footers for c in range(md.num_columns)}
    assert codecs == {"SNAPPY"}  # compacted files stay compressed
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, segments))
    assert tier(written.root, lake, spark=spark, file_reserved_time=0).segments == []


@pytest.mark.spark
def test_tier_while_the_store_appends(spark, tmp_path):
    # the store's housekeeping records sealed segments in the manifest, as a running broker's does
    # Bounded, larger files: every mapped file holds a descriptor, and Spark's py4j sockets use select().
    config = make_config(
        tmp_path, cleanResourceInterval=100, mappedFileSizeCommitLog=128 * 1024, mappedFileSizeConsumeQueue=20 * 20_000,
    )  # fmt: skip
    lake = tmp_path / "lake"
    sent: dict[int, tuple[str, int, int, bytes]] = {}
    stop = threading.Event()
    with MessageStore(config) as store:

        def writer() -> None:
            i = 0
            while not stop.is_set() and i < 8_000:
                body = f"live-{i}".encode() * 20
                res = store.put_message(make_message(f"Live{i % 2}", i % 3, body, tags="L", keys=f"live-{i}"))
                assert res.ok
                sent[res.append.wrote_offset] = (f"Live{i % 2}", i % 3, res.append.queue_offset, body)
                i += 1

        t = Worker(writer)
        t.start()
        try:
            wait_until(lambda: t.check() or len(sealed(config.store_path_root_dir)) >= 3, 30, "three sealed segments")
            report = tier(config.store_path_root_dir, lake, spark=spark, file_reserved_time=0)
        finally:
            stop.set()
            t.finish()
        tiered = [s.segment for s in report.by_state("tiered")]
        assert len(tiered) >= 3 and not report.by_state("quarantined"), report.to_json()
        assert report.deleted is None  # the store is held: deletion is the store's own clean pass
        active = f"{store.commitlog.queue.files[-1].file_from_offset:020d}"
        assert active not in tiered
        rows = table_rows(spark, lake)
        want = {off: v for off, v in sent.items() if f"{off - off % config.mapped_file_size_commit_log:020d}" in tiered}
        assert {r["commitlog_offset"]: (r["topic"], r["queue_id"], r["queue_offset"], r["body"]) for r in rows} == want
        assert len(rows) == len(want)

        # the store's own clean pass (deleteWhen hour, disk pressure or a manual request) deletes them,
        # at most 10 per pass as RocketMQ does
        wait_until(lambda: store.delete_expired_files_manually() or store.commitlog.min_offset > int(max(tiered)), 30)
        left = {f"{mf.file_from_offset:020d}" for mf in store.commitlog.queue.files}
        assert not left & set(tiered)
        assert store.commitlog.min_offset == int(max(tiered)) + config.mapped_file_size_commit_log
        assert store.get_min_offset_in_queue("Live0", 0) > 0  # ConsumeQueue below the new minimum went too


def _run_tier_process(store: Path, lake: Path, crash_at: str, max_segments: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{CRASH_ENV: crash_at, "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"})
    cmd = [
        sys.executable, "-m", "pipelines.compaction", "--store-dir", str(store), "--lake", str(lake),
        "--file-reserved-time", "0", "--master", "local[1]", "--max-segments", str(max_segments),
        "--conf", "spark.sql.shuffle.partitions=1",
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.spark
@pytest.mark.timeout(900)  # three cold Spark subprocesses: minutes when the shared machine is busy
def test_sigkill_at_each_step_then_rerun_loses_and_duplicates_nothing(spark, tmp_path):
    written = write_store(tmp_path / "s", count=1100)
    lake = tmp_path / "lake"
    messages = tables.table_uri(lake, tables.MESSAGES)
    segments = sealed(written.root)
    first, second = segments[:2], segments[2:4]
    assert len(segments) > 4

    # killed after staging, before the commit: nothing visible, claims left to be taken over
    proc = _run_tier_process(written.root, lake, "before_commit", 2)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert not lk.is_table(messages) or not table_rows(spark, lake)
    assert [states(written.root)[s] for s in first] == [SegmentState.TIERING] * 2
    killed = [p for p in Path(messages).glob("tier-*/**/*.parquet")]
    assert killed  # its staged files, in no commit

    # killed right after the commit: rows visible once, nothing verified or deleted yet
    proc = _run_tier_process(written.root, lake, "after_commit", 2)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, first))
    assert all(states(written.root)[s] == SegmentState.TIERING for s in first)

    # killed after verifying (segments table written) but before marking tiered and deleting
    proc = _run_tier_process(written.root, lake, "after_verify", 4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, first + second))
    assert all(states(written.root)[s] == SegmentState.TIERING for s in first + second)
    assert all((written.commitlog / s).exists() for s in segments)

    report = tier(written.root, lake, spark=spark, file_reserved_time=0)
    assert [s.segment for s in report.by_state("tiered")] == segments, report.to_json()
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, segments))
    segs = lk.to_arrow(tables.table_uri(lake, tables.SEGMENTS)).to_pylist()
    assert sorted(r["segment"] for r in segs) == segments  # each segment's row once
    commits = {r["segment"]: r["messages_version"] for r in segs}
    assert commits[first[0]] == commits[first[1]] < commits[second[0]] == commits[second[1]]
    assert sorted(report.deleted) == [int(s) for s in segments]
    # the killed runs' staged files that no commit took are gone; every file left is in the table
    assert not any(p.exists() for p in killed)
    assert report.leftovers_removed >= len(killed)
    on_disk = {str(p.resolve()) for p in Path(messages).rglob("*.parquet") if "_delta_log" not in p.parts}
    in_log = lk.snapshot_files(messages).column("path").to_pylist()
    assert on_disk == {str(Path(unquote(p.removeprefix("file://"))).resolve()) for p in in_log}


@pytest.mark.expected_errors("quarantining segment", "deleting tiered segments failed")
@pytest.mark.spark
def test_corrupt_segments_are_quarantined_and_kept(spark, tmp_path):
    written = write_store(tmp_path / "s", count=1100)
    lake = tmp_path / "lake"
    segments = sealed(written.root)
    crc_bad, frame_bad = segments[1], segments[3]
    rec = next(r for r in written.rows_in(crc_bad) if r["body"] and r["magic"] == records.MESSAGE_MAGIC_V1)
    # IPv4 hosts, V1: the body starts after the fixed header, i.e. a record's length minus the two length fields
    flip_byte(written.commitlog / crc_bad, rec["position"] + records.record_length(0, 0, 0, 0) - 3)
    bad = written.rows_in(frame_bad)[3]
    flip_byte(written.commitlog / frame_bad, bad["position"] + 4)  # MAGICCODE

    report = tier(written.root, lake, spark=spark, file_reserved_time=0)

    quarantined = {s.segment: s.reason for s in report.by_state("quarantined")}
    assert set(quarantined) == {crc_bad, frame_bad}, report.to_json()
    assert "crc_matches" in quarantined[crc_bad]
    assert "file_scans_clean" in quarantined[frame_bad]
    assert [s.segment for s in report.by_state("tiered")] == [s for s in segments if s not in quarantined]
    st = states(written.root)
    assert st[crc_bad] == st[frame_bad] == SegmentState.QUARANTINED
    assert (written.commitlog / crc_bad).exists() and (written.commitlog / frame_bad).exists()
    assert report.deleted == [int(segments[0])]  # deletion stops at the quarantined segment, oldest first
    good = [s for s in segments if s not in quarantined]
    assert_rows_are(table_rows(spark, lake), sealed_expected(written, good))

    results = lk.to_arrow(tables.table_uri(lake, tables.QUALITY_RESULTS)).to_pylist()
    failed = {(r["segment"], r["expectation"]): r for r in results if not r["success"]}
    assert failed[(crc_bad, "crc_matches")]["unexpected_count"] == 1
    sample = json.loads(failed[(crc_bad, "crc_matches")]["details"])["sample"]
    assert sample[0]["position"] == rec["position"]
    assert (frame_bad, "file_scans_clean") in failed
    assert all(seg in quarantined for seg, _ in failed)

    # a later run does not pick quarantined segments up again, and deletes nothing past the quarantined one (the
    # store, shut down cleanly, is not opened to delete: it would refuse to, with a bad record followed by valid
    # segments)
    again = tier(written.root, lake, spark=spark, file_reserved_time=0)
    assert again.segments == []
    assert again.deleted == [] and again.delete_error is None
    # after a crash (abort marker) the job opens the store to delete, which now refuses to open: the job reports it
    # instead of failing the run
    abort_file(written.root).touch()
    crashed = tier(written.root, lake, spark=spark, file_reserved_time=0)
    assert frame_bad in crashed.delete_error and "StoreCorruptError" in crashed.delete_error
    assert (written.commitlog / crc_bad).exists() and (written.commitlog / frame_bad).exists()


@pytest.mark.integration
def test_cli_reports_and_rejects_bad_input(tmp_path):
    # The console script as a user runs it, its stderr a pipe: each usage error is one whole line.
    def tier_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).with_name("mqlake")), "tier", "--lake", str(tmp_path), *args],
                              env=cli_env(), capture_output=True, text=True, timeout=120)  # fmt: skip

    result = tier_cli("--store-dir", str(tmp_path / "none"))
    assert result.returncode == 2 and f"{tmp_path / 'none'} has no commitlog directory" in result.stderr, result.stderr
    (tmp_path / "commitlog").mkdir()
    result = tier_cli("--store-dir", str(tmp_path), "--conf", "x")
    assert result.returncode == 2 and "Spark conf 'x' is not k=v" in result.stderr, result.stderr


@pytest.mark.spark
@pytest.mark.parametrize("hours", [1.0])
def test_file_reserved_time_hours_claims_only_old_segments(spark, tmp_path, hours):
    written = write_store(tmp_path / "s")
    lake = tmp_path / "lake"
    report = tier(written.root, lake, spark=spark, file_reserved_time=hours)
    assert report.segments == []  # everything was stored seconds ago
    assert all(s in (SegmentState.SEALED, SegmentState.ACTIVE) for s in states(written.root).values())
