"""The segment-integrity expectations: clean segments pass every rule; each rule catches its own violation."""

from __future__ import annotations

import dataclasses

import pytest

from expectations.rules import MESSAGES, QUEUES, RULES, SEGMENTS, checked_messages, rules_for
from expectations.runner import QUALITY_RESULTS_SCHEMA, validate
from pipelines.compaction import checks
from pipelines.segment_reader import scan_segment
from store.format import records
from store.retention import SegmentManifest, SegmentState

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def clean(spark, spark_store):
    entries = {e.base_offset: e for e in SegmentManifest(spark_store.root).entries()}
    names = [e.file_name for e in entries.values() if e.state == SegmentState.SEALED]
    assert len(names) >= 3
    facts = [scan_segment(spark_store.commitlog / n) for n in names]
    df = (
        spark.read.format("commitlog")
        .option("segments", ",".join(str(int(n)) for n in names))
        .load(str(spark_store.root))
        .cache()
    )
    return names, facts, entries, df


def frames_for(spark, df, facts, entries, tiered=()):
    digests = checks.rows_digest(df)
    return checks.expectation_frames(
        checked_messages(df),
        checks.segment_check_table(facts, entries, digests),
        checks.queue_check_table(facts, digests, tiered),
    )


def failed(report) -> dict[tuple[str, str], object]:
    return {(r.segment, r.expectation): r for r in report.results if not r.success}


def test_clean_segments_pass_every_rule_and_results_are_rows(spark, clean):
    names, facts, entries, df = clean
    report = validate(spark, frames_for(spark, df, facts, entries), names, "clean-run")
    assert failed(report) == {}
    assert {(r.segment, r.expectation) for r in report.results} == {(n, rule.name) for n in names for rule in RULES}
    table = report.to_arrow()
    assert table.schema == QUALITY_RESULTS_SCHEMA and table.num_rows == len(names) * len(RULES)
    assert set(table.column("run_id").to_pylist()) == {"clean-run"}


def test_each_record_and_segment_rule_detects_its_violation(spark, clean):
    from pyspark.sql import functions as F

    names, facts, entries, df = clean
    a, b, c = names[:3]
    rows_a = sorted(r["position"] for r in df.where(F.col("segment") == a).select("position").collect())
    magic_at, crc_at, size_at, offset_at, gone_at, dup_at, time_at, tags_at = rows_a[3:27:3]
    last_time = entries[int(a)].last_store_time

    def at(pos):
        return (F.col("segment") == a) & (F.col("position") == pos)

    def mutate(col, pos, value):
        return F.when(at(pos), value).otherwise(F.col(col))

    broken = (
        df.where(~at(gone_at))
        .withColumn("magic", mutate("magic", magic_at, F.lit(0x12345678)))
        .withColumn("body_crc", mutate("body_crc", crc_at, (F.col("body_crc") + 1) % 2147483647))
        .withColumn("msg_size", mutate("msg_size", size_at, F.col("msg_size") + 7))
        .withColumn("commitlog_offset", mutate("commitlog_offset", offset_at, F.col("commitlog_offset") + 1))
        .withColumn("queue_offset", mutate("queue_offset", dup_at, F.col("queue_offset") - 1))
        .withColumn("store_timestamp", mutate("store_timestamp", time_at, F.lit(last_time + 60_000)))
        .withColumn("tags", mutate("tags", tags_at, F.lit("tampered")))
    )
    # segment-level facts: b does not end in BLANK, c has a decode error, the manifest disagrees about b
    bad_facts = [
        dataclasses.replace(f, ends_with_blank=False) if f.segment == b
        else dataclasses.replace(f, error=f"{c}: invalid record at offset 99") if f.segment == c
        else f
        for f in facts
    ]  # fmt: skip
    bad_entries = dict(entries)
    bad_entries[int(b)] = entries[int(b)].model_copy(update={"message_count": entries[int(b)].message_count + 1})

    report = validate(spark, frames_for(spark, broken, bad_facts, bad_entries), names, "broken-run")
    f = failed(report)

    def sample_positions(rule):
        return [s["position"] for s in f[(a, rule)].details["sample"]]

    assert sample_positions("magic_valid") == [magic_at]
    assert sample_positions("crc_matches") == [crc_at]
    assert size_at in sample_positions("size_matches_fields")
    assert offset_at in sample_positions("offset_is_base_plus_position")
    assert (a, "records_contiguous") in f  # the dropped row and the longer one both break the chain
    assert (a, "queue_offsets_contiguous_in_segment") in f
    assert sample_positions("store_time_in_segment_range") == [time_at]
    assert sample_positions("properties_parse") == [tags_at]
    assert f[(a, "rows_cover_file")].unexpected_count == 1  # one row fewer than records
    assert (b, "ends_with_blank") in f and (b, "matches_manifest") in f
    assert (c, "file_scans_clean") in f
    # the violations stay with their segments: b and c have clean rows
    assert {rule for seg, rule in f if seg in (b, c)} == {"ends_with_blank", "matches_manifest", "file_scans_clean"}
    assert f[(a, "magic_valid")].unexpected_count == 1


def test_flipped_byte_in_a_segment_copy_is_caught(spark, clean, spark_store, tmp_path):
    import shutil

    names, _facts, entries, _df = clean
    a = names[0]
    store = tmp_path / "store"
    shutil.copytree(spark_store.root, store)
    row = next(r for r in spark_store.rows_in(a) if r["body"] and r["magic"] == records.MESSAGE_MAGIC_V1)
    path = store / "commitlog" / a
    data = bytearray(path.read_bytes())
    data[row["position"] + records.record_length(0, 0, 0, 0) - 3] ^= 0x01  # first body byte
    path.write_bytes(data)
    df = spark.read.format("commitlog").option("segments", str(int(a))).load(str(store))
    facts = [scan_segment(path)]
    report = validate(spark, frames_for(spark, df, facts, entries), [a], "flip-run", rules=tuple(rules_for(MESSAGES)))
    f = failed(report)
    assert set(f) == {(a, "crc_matches")}
    assert f[(a, "crc_matches")].details["sample"][0]["position"] == row["position"]


def test_queue_continuity_across_the_tier(spark, clean):
    names, facts, entries, df = clean
    digests = checks.rows_digest(df)
    first = facts[0]
    later = facts[1:]
    queue_rules = tuple(rules_for(QUEUES))

    def run(tiered):
        q = checks.queue_check_table(later, digests, tiered)
        frames = {
            MESSAGES: checked_messages(df),
            SEGMENTS: checks.segment_check_table(later, entries, digests),
            QUEUES: q,
        }
        return failed(validate(spark, frames, [f.segment for f in later], "q", rules=queue_rules))

    true_ranges = digests[first.segment].queues
    tiered = checks.TieredSegment(first.base_offset, first.file_size, true_ranges)
    assert run([tiered]) == {}

    # the tier lost the last offset of each queue: the next segment no longer follows it
    short = {k: dataclasses.replace(r, last_offset=r.last_offset - 1) for k, r in true_ranges.items()}
    f = run([dataclasses.replace(tiered, queues=short)])
    assert (later[0].segment, "queue_offsets_continue_tier") in f
    assert (later[0].segment, "queue_offsets_not_in_tier") not in f

    # the tier already holds offsets of the next segment: duplicates
    long = {k: dataclasses.replace(r, last_offset=r.last_offset + 1) for k, r in true_ranges.items()}
    f = run([dataclasses.replace(tiered, queues=long)])
    assert (later[0].segment, "queue_offsets_not_in_tier") in f

    # a hole in the tier (segments deleted before tiering was enabled) allows a gap, but not from offset 0
    gap = dataclasses.replace(tiered, queues=short, file_size=first.file_size - 4096)
    assert run([gap]) == {}
    assert run([]) == {}  # nothing tiered: the batch's first segment starts the run, its offsets are checked


def test_validate_without_every_dataset_is_an_mqlake_error():
    from expectations.runner import MissingDatasetError
    from store.errors import MQLakeError

    with pytest.raises(MissingDatasetError, match="missing datasets") as e:
        validate(None, {MESSAGES: None}, [], "no-run")  # refused before Spark is touched
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, ValueError)
