"""A lake on S3 (moto's server): a tier run SIGKILLed between its upload and its commit leaves files under the
table that no Delta version names; the next run on the host deletes them and the dead run's local staging,
and leaves alone a live run's uploads and every file a version references."""

from __future__ import annotations

from pathlib import Path

import pytest

from lake import delta as lk
from lake import objectstore, tables
from pipelines.compaction.job import tier
from pipelines.compaction.leftovers import RunLease
from tests.fixtures_spark import write_store
from tests.s3_server import BUCKET, running_s3
from tests.test_tier import _run_tier_process, assert_rows_are, sealed, sealed_expected, table_rows


def _files(s3, prefix: str) -> set[str]:
    """The data files under ``prefix``: no log entries, no empty "directory" markers of S3 clients."""
    return {k for k in s3.keys(BUCKET, prefix) if "_delta_log" not in k and not k.endswith("/")}


def _in_log(messages: str) -> set[str]:
    """The keys every version of the table names (adds and removes), relative to the table."""
    dt = lk.open_table(messages)
    return {a for v in range(dt.version() + 1) for a in lk.open_table(messages, version=v).file_uris()}


@pytest.mark.spark
@pytest.mark.timeout(900)  # a cold Spark subprocess: minutes when the shared machine is busy
def test_a_run_killed_after_its_upload_leaves_files_the_next_run_deletes(spark, tmp_path, monkeypatch):
    staging = tmp_path / "staging"
    monkeypatch.setenv(objectstore.STAGING_ENV, str(staging))  # the subprocess inherits it
    written = write_store(tmp_path / "s", count=1100)
    segments = sealed(written.root)
    assert len(segments) > 3
    with running_s3(tmp_path) as s3:
        lake = f"s3://{BUCKET}/lake"
        messages = tables.table_uri(lake, tables.MESSAGES)
        prefix = "lake/messages/"

        first = tier(written.root, lake, spark=spark, file_reserved_time=0, max_segments=1)
        assert [s.segment for s in first.by_state("tiered")] == segments[:1]
        committed = _files(s3, prefix)
        assert committed

        proc = _run_tier_process(written.root, lake, "after_upload", 2)  # type: ignore[arg-type]
        assert proc.returncode == -9, proc.stderr[-3000:]
        killed = _files(s3, prefix) - committed
        assert killed and all(k.removeprefix(prefix).startswith("tier-") for k in killed)
        [killed_run] = {k.removeprefix(prefix).split("/", 1)[0] for k in killed}
        killed_staging = [d for d in staging.glob(f"*/messages/{killed_run}")]
        assert killed_staging  # its lease, released by the kernel

        # a live run of this host, between its upload and its commit: its lease held, its file on S3
        live_root = staging / "other-live" / tables.MESSAGES
        live = RunLease(live_root, "live", table=messages)
        live_file = live.acquire() / "part-live.parquet"
        live_file.write_bytes(b"PAR1 not committed yet")
        objectstore.upload([live_file], live_root, messages)
        try:
            report = tier(written.root, lake, spark=spark, file_reserved_time=0)
            remaining = _files(s3, prefix)
        finally:
            live.release()

        assert [s.segment for s in report.by_state("tiered")] == segments[1:], report.to_json()
        assert_rows_are(table_rows(spark, lake), sealed_expected(written, segments))
        assert report.leftovers_removed == len(killed)
        assert not killed & remaining
        assert not s3.keys(BUCKET, f"{prefix}{killed_run}")  # nor its empty "directories"
        assert f"{prefix}tier-live/part-live.parquet" in remaining
        assert not any(d.exists() for d in killed_staging)
        assert live_root.exists()
        # every file a version of the log names is still there (time travel), and nothing else but the live one
        named = {uri.removeprefix(f"s3://{BUCKET}/") for uri in _in_log(messages)}
        assert remaining - named == {f"{prefix}tier-live/part-live.parquet"}
        assert named <= remaining
        assert lk.to_arrow(messages, version=0).num_rows == first.segments[0].rows
        # the finished runs' local staging is gone too; only the live run's is left
        assert sorted(p.name for p in staging.iterdir() if p.name != "_reports") == [Path(live_root).parent.name]
