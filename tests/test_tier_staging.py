"""The tiering job's staging pass: what it computes while it writes, and what verify still catches after it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from expectations.sequence import Previous
from pipelines.compaction import checks
from pipelines.compaction.job import TierJob
from pipelines.segment_reader import read_segment
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_spark import write_store

pytestmark = pytest.mark.spark


def test_previous_columns_and_digest_match_spark_over_the_same_rows(spark, spark_store):
    """The staging pass's two computations, each against an independent Spark SQL one over the decoded rows."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [e.file_name for e in SegmentManifest(spark_store.root).entries() if e.state == SegmentState.SEALED][:2]
    parts = checks.DigestParts()
    got = {}
    for name in names:
        previous = Previous()
        for batch in read_segment(spark_store.commitlog / name):
            parts.add(batch)
            b = previous.extend(batch)
            columns = (b.column(c).to_pylist() for c in ("position", "prev_end", "prev_queue_offset"))
            for pos, end, q in zip(*columns, strict=True):
                got[(name, pos)] = (end, q)

    df = spark.read.format("commitlog").option("segments", ",".join(str(int(n)) for n in names)).load(
        str(spark_store.root)
    )
    consumable = F.expr("(sys_flag & 12) IN (0, 8)")  # independent of the constants the code uses
    by_position = Window.partitionBy("segment").orderBy("position")
    by_queue = Window.partitionBy("segment", "topic", "queue_id", consumable).orderBy("position")
    want = {
        (r["segment"], r["position"]): (r["pe"], r["pq"])
        for r in df.select(
            "segment", "position",
            F.lag(F.col("position") + F.col("msg_size")).over(by_position).alias("pe"),
            F.lag("queue_offset").over(by_queue).alias("pq"),
        ).collect()
    }  # fmt: skip
    assert got == want and len(got) > 100
    assert any(q is None for _, q in got.values()) and any(q is not None for _, q in got.values())

    digests = parts.digests()
    for name in names:
        rows = spark_store.rows_in(name)
        d = digests[name]
        assert (d.count, d.bytes, d.crc_sum) == (len(rows), sum(r["msg_size"] for r in rows),
                                                 sum(r["body_crc"] for r in rows))  # fmt: skip
        assert d.body_bytes == sum(len(r["body"]) for r in rows)
        first, last = min(rows, key=lambda r: r["position"]), max(rows, key=lambda r: r["position"])
        assert (d.first_store_time, d.last_store_time) == (first["store_timestamp"], last["store_timestamp"])
        queues: dict = {}
        for r in rows:
            if r["sys_flag"] & 12 in (0, 8):
                queues.setdefault((r["topic"], r["queue_id"]), []).append(r["queue_offset"])
        assert d.queues == {k: checks.QueueRange(min(v), max(v), len(v)) for k, v in queues.items()}
    # the same digest over a Spark frame of the same rows (what verify takes of the committed files)
    assert checks.rows_digest(df) == digests


class BodyChangedAfterStaging(TierJob):
    """Flips one body byte in a staged file of ``victim`` after the staging pass checked it: what a disk or a
    writer could do between the rules and the commit."""

    victim = ""

    def _stage(self, batch, bases, entries):
        staged = super()._stage(batch, bases, entries)
        path = Path(staged.files[self.victim][0])
        table = pq.read_table(path)
        bodies = table.column("body").to_pylist()
        i = next(i for i, b in enumerate(bodies) if b)
        bodies[i] = bytes([bodies[i][0] ^ 0x01]) + bodies[i][1:]
        pq.write_table(table.set_column(table.schema.get_field_index("body"), "body", pa.array(bodies)), path)
        # Hadoop's local file system would refuse the file by its .crc side file; object stores keep none
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
        return staged


@pytest.mark.expected_errors("quarantining segment", "took the unverified rows of")
def test_a_body_changed_after_staging_is_caught_before_deletion(spark, tmp_path):
    written = write_store(tmp_path / "s", count=900)
    segments = [e.file_name for e in SegmentManifest(written.root).entries() if e.state == SegmentState.SEALED]
    assert len(segments) >= 2
    job = BodyChangedAfterStaging(written.root, tmp_path / "lake", spark=spark, file_reserved_time=0)
    job.victim = segments[-1]

    report = job.run()

    quarantined = {s.segment: s.reason for s in report.by_state("quarantined")}
    assert list(quarantined) == [job.victim], report.to_json()
    assert "committed rows do not match" in quarantined[job.victim]
    assert "1 committed row(s) whose body does not match its stored CRC" in quarantined[job.victim]
    # the staging pass saw the rows intact: every rule passed; only the committed copy differs
    assert report.quality is not None and report.quality.failures() == {}
    assert [s.segment for s in report.by_state("tiered")] == segments[:-1]
    assert sorted(report.deleted or []) == [int(s) for s in segments[:-1]]
    assert (written.commitlog / job.victim).exists()
    assert {e.file_name: e.state for e in SegmentManifest(written.root).entries()}[job.victim] == (
        SegmentState.QUARANTINED
    )
    from lake import delta as lk
    from lake import tables

    # the victim's committed rows were taken out again; the verified segments' rows stay
    messages = tables.table_uri(tmp_path / "lake", tables.MESSAGES)
    assert not lk.to_arrow(messages, [("segment", "=", job.victim)]).num_rows
    assert set(lk.to_arrow(messages).column("segment").to_pylist()) == set(segments[:-1])


def _data_files(messages: str, version: int | None = None) -> set[str]:
    from urllib.parse import unquote

    from lake import delta as lk

    paths = lk.snapshot_files(messages, version).column("path").to_pylist()
    return {str(Path(unquote(p.removeprefix("file://"))).resolve()) for p in paths}


@pytest.mark.expected_errors("quarantining segment", "took the unverified rows of")
def test_a_failed_verify_takes_the_commit_out_again_leaving_the_table_as_it_was(spark, tmp_path):
    from lake import delta as lk
    from lake import tables

    written = write_store(tmp_path / "s", count=900)
    segments = [e.file_name for e in SegmentManifest(written.root).entries() if e.state == SegmentState.SEALED]
    lake = tmp_path / "lake"
    messages = tables.table_uri(lake, tables.MESSAGES)
    first = TierJob(written.root, lake, spark=spark, file_reserved_time=0, max_segments=1).run()
    assert [s.segment for s in first.by_state("tiered")] == segments[:1]
    prior = lk.open_table(messages).version()
    prior_files = _data_files(messages)
    prior_rows = lk.to_arrow(messages).num_rows

    job = BodyChangedAfterStaging(written.root, lake, spark=spark, file_reserved_time=0, max_segments=1)
    job.victim = segments[1]
    report = job.run()

    assert [(s.segment, s.state) for s in report.by_state("quarantined")] == [(job.victim, "quarantined")]
    dt = lk.open_table(messages)
    # committed (prior + 1), verified, found wrong, taken out again (prior + 2): the prior snapshot's files
    assert dt.version() == prior + 2 and report.messages_version == prior + 1
    assert _data_files(messages) == prior_files
    assert lk.to_arrow(messages).num_rows == prior_rows
    assert not lk.to_arrow(messages, [("segment", "=", job.victim)]).num_rows
    revert = dt.history(1)[0]
    assert revert["operation"] == "DELETE" and revert["mqlake.tier.reverted"] == job.victim
    assert (written.commitlog / job.victim).exists()
