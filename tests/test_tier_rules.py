"""A record rule broken on purpose fails the tier run's check of its segment, as evaluated while staging.

The ``messages`` rules run inside the staging tasks over Arrow (pipelines/compaction/staging.py).  A planted
bad byte that keeps the record framed and its body CRC right (so the scan and the CRC rule pass) must still be
caught by the rules it breaks: the segment is quarantined and kept, nothing of it is committed, and the
quality results name the rule with a sample of the breaking row.
"""

from __future__ import annotations

import json

import pytest

from lake import delta as lk
from lake import tables
from pipelines.compaction.job import tier
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_spark import write_store
from tests.helpers import flip_byte

pytestmark = pytest.mark.spark


@pytest.mark.expected_errors("quarantining segment")
def test_a_property_that_is_not_utf8_quarantines_its_segment(spark, tmp_path):
    written = write_store(tmp_path / "s", count=700)
    lake = tmp_path / "lake"
    segments = sorted(e.file_name for e in SegmentManifest(written.root).entries() if e.state == SegmentState.SEALED)
    bad_segment = segments[1]
    row = next(r for r in written.rows_in(bad_segment) if r["tags"])
    path = written.commitlog / bad_segment
    record = path.read_bytes()[row["position"] : row["position"] + row["msg_size"]]
    # the first byte of the TAGS value, in the properties (which the body CRC does not cover): not UTF-8 any more
    flip_byte(path, row["position"] + record.rindex(b"TAGS\x01") + len(b"TAGS\x01"))

    report = tier(written.root, lake, spark=spark, file_reserved_time=0)

    quarantined = {s.segment: s.reason for s in report.by_state("quarantined")}
    assert set(quarantined) == {bad_segment}, report.to_json()
    assert "properties_parse" in quarantined[bad_segment]
    assert [s.segment for s in report.by_state("tiered")] == [s for s in segments if s != bad_segment]
    assert (written.commitlog / bad_segment).exists()
    assert report.deleted == [int(segments[0])]  # deletion stops at the quarantined segment, oldest first

    committed = lk.to_arrow(tables.table_uri(lake, tables.MESSAGES), ).column("segment")
    assert bad_segment not in set(committed.to_pylist())
    results = lk.to_arrow(tables.table_uri(lake, tables.QUALITY_RESULTS)).to_pylist()
    failed = {(r["segment"], r["expectation"]): r for r in results if not r["success"]}
    # the decoded value holds U+FFFD (3 bytes in UTF-8) where the byte was: the fields no longer add up to TOTALSIZE
    assert set(failed) == {(bad_segment, "properties_parse"), (bad_segment, "size_matches_fields")}
    assert failed[(bad_segment, "properties_parse")]["unexpected_count"] == 1
    assert json.loads(failed[(bad_segment, "properties_parse")]["details"])["sample"][0]["position"] == row["position"]
